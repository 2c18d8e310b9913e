"""sampler_mismatch.py: TRL 1.16's vLLM importance weights against hand values, and the weight folded into the token
advantages against TRL's per-token-loss × weight."""

import math

import pytest
import torch

import grpo
import sampler_mismatch as sm

# two responses of 3 and 2 tokens (the last position of row 1 is padding, its log-probs garbage)
OLD = torch.tensor([[-1.0, -2.0, -0.5], [-0.3, -0.7, -9.0]], dtype=torch.float64)
SAMPLER = torch.tensor([[-1.5, -1.0, -0.5], [-0.3, -2.0, 5.0]], dtype=torch.float64)
MASK = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]], dtype=torch.float64)
# d = old − sampler on the response: row 0 (0.5, −1.0, 0.0), row 1 (0.0, 1.3); sums −0.5 and 1.3


def test_token_modes_by_hand():
    e = math.exp
    w = sm.importance_weights(OLD, SAMPLER, MASK, "token_truncate", clip_max=1.5)
    assert torch.allclose(w, torch.tensor([[1.5, e(-1.0), 1.0], [1.0, 1.5, 1.0]], dtype=torch.float64))
    w = sm.importance_weights(OLD, SAMPLER, MASK, "token_truncate", clip_max=3.0, clip_min=0.5)
    assert torch.allclose(w, torch.tensor([[e(0.5), 0.5, 1.0], [1.0, 3.0, 1.0]], dtype=torch.float64))
    w = sm.importance_weights(OLD, SAMPLER, MASK, "token_mask", clip_max=3.0, clip_min=0.5)
    assert torch.allclose(w, torch.tensor([[e(0.5), 0.0, 1.0], [1.0, 0.0, 1.0]], dtype=torch.float64))
    w = sm.importance_weights(OLD, SAMPLER, MASK, "token_mask", clip_max=2.0)
    assert torch.allclose(w, torch.tensor([[e(0.5), e(-1.0), 1.0], [1.0, 0.0, 1.0]], dtype=torch.float64))


def test_sequence_modes_by_hand():
    e = math.exp
    w = sm.importance_weights(OLD, SAMPLER, MASK, "sequence_truncate", clip_max=3.0)
    assert torch.allclose(w, torch.tensor([[e(-0.5)] * 3, [3.0] * 3], dtype=torch.float64))
    w = sm.importance_weights(OLD, SAMPLER, MASK, "sequence_mask", clip_max=3.0)
    assert torch.allclose(w, torch.tensor([[e(-0.5)] * 3, [0.0] * 3], dtype=torch.float64))
    w = sm.importance_weights(OLD, SAMPLER, MASK, "sequence_mask", clip_max=None, clip_min=0.7)
    assert torch.allclose(w, torch.tensor([[0.0] * 3, [e(1.3)] * 3], dtype=torch.float64))
    with pytest.raises(ValueError, match="token_truncate, token_mask"):
        sm.importance_weights(OLD, SAMPLER, MASK, "tis")


def test_trls_metrics_by_hand():
    w = sm.importance_weights(OLD, SAMPLER, MASK, "token_truncate", clip_max=3.0)
    stats = sm.mismatch_stats(OLD, SAMPLER, w, MASK, "token_truncate")
    assert stats["sampling/sampling_logp_difference/mean"] == pytest.approx((0.5 + 1.0 + 0.0 + 0.0 + 1.3) / 5)
    assert stats["sampling/sampling_logp_difference/max"] == pytest.approx(1.3)
    assert stats["sampling/importance_sampling_ratio/min"] == pytest.approx(math.exp(-1.0))
    assert stats["sampling/importance_sampling_ratio/max"] == pytest.approx(3.0)
    assert stats["sampling/importance_sampling_ratio/mean"] == pytest.approx(
        (math.exp(0.5) + math.exp(-1.0) + 1.0 + 1.0 + 3.0) / 5)
    seq = sm.mismatch_stats(OLD, SAMPLER, sm.importance_weights(OLD, SAMPLER, MASK, "sequence_mask"), MASK,
                            "sequence_mask")  # one value per response: e^−0.5 and 0 (e^1.3 > 3)
    assert seq["sampling/importance_sampling_ratio/mean"] == pytest.approx(math.exp(-0.5) / 2)


@pytest.mark.parametrize("loss", [dict(loss_type="dapo"), dict(loss_type="dapo", dual_clip=3.0),
                                  dict(loss_type="grpo", beta=0.1), dict(loss_type="sapo"),
                                  dict(loss_type="dr_grpo", max_completion_length=5, beta=0.05)])
def test_folding_the_weight_into_the_advantages_is_trls_loss_times_the_weight(loss):
    """policy_loss(Ã·w) = the aggregation of w_t·ℓ_t(Ã) + β·k3_t (TRL multiplies the per-token loss, clip included,
    by w and adds the KL after), each ℓ_t from a one-token call of policy_loss: value and gradient, float64."""
    g = torch.Generator().manual_seed(0)
    B, T = 3, 5
    logp = (-torch.rand(B, T, generator=g, dtype=torch.float64) * 2).requires_grad_()
    old = logp.detach() + 0.4 * torch.randn(B, T, generator=g, dtype=torch.float64)  # ratios well past the clips
    ref = logp.detach() + 0.2 * torch.randn(B, T, generator=g, dtype=torch.float64)
    adv = torch.randn(B, T, generator=g, dtype=torch.float64)
    mask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 0, 0, 0], [1, 1, 1, 1, 0]], dtype=torch.float64)
    sampler = old + 0.5 * torch.randn(B, T, generator=g, dtype=torch.float64)
    w = sm.importance_weights(old, sampler, mask, "token_mask", clip_max=1.5)  # zeros included
    assert (w[mask > 0] == 0).any() and (w[mask > 0] > 1).any()
    settings = grpo.LossSettings(**loss)
    ours, _ = grpo.policy_loss(logp, old, adv * w, mask, settings, ref_logp=ref)
    beta = settings.beta
    plain = grpo.LossSettings(**{**loss, "beta": 0.0})
    per_token = torch.zeros(B, T, dtype=torch.float64)
    for i in range(B):
        for t in range(T):
            one = lambda x: x[i:i + 1, t:t + 1]  # noqa: E731
            ell, _ = grpo.policy_loss(one(logp), one(old), one(adv), torch.ones(1, 1, dtype=torch.float64), plain,
                                      num_tokens=1, num_sequences=1)
            d = one(ref) - one(logp)
            per_token[i, t] = ell * (1 if plain.loss_type != "dr_grpo" else plain.max_completion_length) * one(w) \
                + beta * (torch.exp(d) - d - 1)  # TRL: ℓ·w, then + β·k3
    per_token = per_token * mask
    if settings.aggregation == "dapo":
        trl = per_token.sum() / mask.sum()
    elif settings.aggregation == "grpo":
        trl = (per_token.sum(-1) / mask.sum(-1)).mean()
    else:
        trl = per_token.sum() / (B * settings.max_completion_length)
    assert ours.item() == pytest.approx(trl.item(), rel=1e-12, abs=1e-14)
    (g_ours,) = torch.autograd.grad(ours, logp, retain_graph=True)
    (g_trl,) = torch.autograd.grad(trl, logp)
    assert torch.allclose(g_ours, g_trl, rtol=1e-10, atol=1e-14)


def test_the_rule_is_chosen_once_and_the_flag_needs_vllm():
    assert sm.correction(grpo.GRPOConfig()) is sm.uncorrected  # the default: Ã unchanged, no statistics
    adv = torch.ones(2, 3)
    assert sm.uncorrected(adv, None, None) == (adv, {})
    with pytest.raises(SystemExit, match="--vllm_importance_sampling_correction needs --use_vllm"):
        grpo.check_config(grpo.GRPOConfig(vllm_importance_sampling_correction=True))

    class Batch:
        response_mask, sampler_logprobs = MASK, SAMPLER

    cfg = grpo.GRPOConfig(use_vllm=True, vllm_importance_sampling_correction=True)
    token_adv = torch.full((2, 3), 2.0, dtype=torch.float64)
    out, stats = sm.correction(cfg)(token_adv, OLD, Batch)
    assert torch.allclose(out, 2.0 * sm.importance_weights(OLD, SAMPLER, MASK, "token_truncate", 3.0))
    assert sorted(stats) == sorted(f"sampling/{k}" for k in (
        "sampling_logp_difference/mean", "sampling_logp_difference/max", "importance_sampling_ratio/min",
        "importance_sampling_ratio/mean", "importance_sampling_ratio/max"))
