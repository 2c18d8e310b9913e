"""sampler_mismatch.py: TRL 1.16's vLLM importance weights against hand values, and the weight folded into the token
advantages against TRL's per-token-loss × weight."""

import dataclasses
import math

import pytest
import torch
from conftest import comparison_config

import comparisons
import grpo
from trainer import grpo_config, run_setup
from trainer import sampler_mismatch as sm

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
        (math.exp(0.5) + math.exp(-1.0) + 1.0 + 1.0 + 3.0) / 5
    )
    seq = sm.mismatch_stats(
        OLD, SAMPLER, sm.importance_weights(OLD, SAMPLER, MASK, "sequence_mask"), MASK, "sequence_mask"
    )  # one value per response: e^−0.5 and 0 (e^1.3 > 3)
    assert seq["sampling/importance_sampling_ratio/mean"] == pytest.approx(math.exp(-0.5) / 2)


@pytest.mark.parametrize(
    "loss",
    [
        dict(loss_type="dapo"),
        dict(loss_type="dapo", dual_clip=3.0),
        dict(loss_type="grpo", beta=0.1),
        dict(loss_type="sapo"),
        dict(loss_type="dr_grpo", max_completion_length=5, beta=0.05),
    ],
)
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
    settings = comparisons.method(comparison_config(**loss)).loss_settings(**loss)  # SAPO: its own settings
    ours, _ = grpo.policy_loss(logp, old, adv * w, mask, settings, ref_logp=ref)
    beta = settings.beta
    plain = dataclasses.replace(settings, beta=0.0)
    per_token = torch.zeros(B, T, dtype=torch.float64)
    for i in range(B):
        for t in range(T):
            one = lambda x: x[i : i + 1, t : t + 1]  # noqa: E731
            ell, _ = grpo.policy_loss(
                one(logp), one(old), one(adv), torch.ones(1, 1, dtype=torch.float64), plain, scope=grpo.LossScope(1, 1)
            )
            d = one(ref) - one(logp)
            per_token[i, t] = ell * (1 if plain.loss_type != "dr_grpo" else plain.max_completion_length) * one(
                w
            ) + beta * (torch.exp(d) - d - 1)  # TRL: ℓ·w, then + β·k3
    per_token = per_token * mask
    if settings.aggregation == "token-mean":
        trl = per_token.sum() / mask.sum()
    elif settings.aggregation == "seq-mean-token-mean":
        trl = (per_token.sum(-1) / mask.sum(-1)).mean()
    else:
        trl = per_token.sum() / (B * settings.max_completion_length)
    assert ours.item() == pytest.approx(trl.item(), rel=1e-12, abs=1e-14)
    (g_ours,) = torch.autograd.grad(ours, logp, retain_graph=True)
    (g_trl,) = torch.autograd.grad(trl, logp)
    assert torch.allclose(g_ours, g_trl, rtol=1e-10, atol=1e-14)


def test_the_rule_is_chosen_once_and_the_flag_needs_vllm():
    assert run_setup.sampler_correction(grpo.GRPOConfig()) is run_setup.uncorrected  # the default: Ã unchanged
    adv = torch.ones(2, 3)
    assert run_setup.uncorrected(adv, None, None, None) == (adv, {})
    with pytest.raises(SystemExit, match="--vllm_importance_sampling_correction needs --use_vllm"):
        grpo_config.check_config(grpo.GRPOConfig(vllm_importance_sampling_correction=True))

    class Batch:
        response_mask, sampler_logprobs = MASK, SAMPLER

    cfg = grpo.GRPOConfig(use_vllm=True, vllm_importance_sampling_correction=True)
    token_adv = torch.full((2, 3), 2.0, dtype=torch.float64)
    out, stats = sm.correction(cfg)(token_adv, OLD, Batch, MASK)
    assert torch.allclose(out, 2.0 * sm.importance_weights(OLD, SAMPLER, MASK, "token_truncate", 3.0))
    assert sorted(stats) == sorted(
        f"sampling/{k}"
        for k in (
            "sampling_logp_difference/mean",
            "sampling_logp_difference/max",
            "importance_sampling_ratio/min",
            "importance_sampling_ratio/mean",
            "importance_sampling_ratio/max",
        )
    )


def test_a_nan_sampler_logprob_gets_weight_one_as_in_trl():
    """TRL 1.16 (grpo_trainer.py l.2665, ``nan_to_num(d, nan=0.0)``): a NaN sampler log-prob on a valid token gives
    d_t = 0 there, so weight 1 in the token modes and no term in a sequence's sum; every other weight is unchanged, and
    the logp-difference statistics leave that token out (l.2865). Hand values, float64."""
    e = math.exp
    sampler = SAMPLER.clone()
    sampler[0, 1] = math.nan  # a valid token (d was −1.0)
    sampler[1, 2] = math.nan  # padding
    w = sm.importance_weights(OLD, sampler, MASK, "token_truncate", clip_max=1.5)
    assert torch.equal(w, torch.tensor([[1.5, 1.0, 1.0], [1.0, 1.5, 1.0]], dtype=torch.float64))
    clean = sm.importance_weights(OLD, SAMPLER, MASK, "token_truncate", clip_max=1.5)
    unchanged = torch.ones_like(MASK, dtype=torch.bool)
    unchanged[0, 1] = False
    assert torch.equal(w[unchanged], clean[unchanged])
    w = sm.importance_weights(OLD, sampler, MASK, "token_mask", clip_max=1.5)
    assert torch.equal(w, torch.tensor([[0.0, 1.0, 1.0], [1.0, 0.0, 1.0]], dtype=torch.float64))
    w = sm.importance_weights(OLD, sampler, MASK, "sequence_truncate", clip_max=3.0)  # row 0: d sums to 0.5
    assert torch.allclose(w, torch.tensor([[e(0.5)] * 3, [3.0] * 3], dtype=torch.float64), rtol=1e-15, atol=0)
    stats = sm.mismatch_stats(
        OLD, sampler, sm.importance_weights(OLD, sampler, MASK, "token_truncate", 3.0), MASK, "token_truncate"
    )
    assert all(math.isfinite(v) for v in stats.values())
    assert stats["sampling/sampling_logp_difference/mean"] == pytest.approx((0.5 + 0.0 + 0.0 + 1.3) / 4, rel=1e-14)
    assert stats["sampling/sampling_logp_difference/max"] == pytest.approx(1.3, rel=1e-14)
    # the ratio statistics over the 5 response tokens, the NaN-scored one's weight 1 included (l.2877)
    assert stats["sampling/importance_sampling_ratio/mean"] == pytest.approx(
        (e(0.5) + 1.0 + 1.0 + 1.0 + 3.0) / 5, rel=1e-14
    )
    assert stats["sampling/importance_sampling_ratio/min"] == 1.0


@pytest.mark.parametrize(
    "mode, clip_min, clip_max, ratios",
    [
        # row ratios before the bounds: e^−0.5, e^1.3, and 1 for the empty row (exp of an empty sum)
        ("sequence_truncate", 0.5, 3.0, [math.exp(-0.5), 3.0, 1.0]),
        ("sequence_mask", None, 3.0, [math.exp(-0.5), 0.0, 1.0]),
        (
            "sequence_mask",
            1.2,
            None,
            [0.0, math.exp(1.3), 0.0],
        ),  # the empty row's 1 < C_min: masked to 0, still counted
    ],
)
def test_an_empty_response_counts_in_the_sequence_ratio_stats_as_in_trl(mode, clip_min, clip_max, ratios):
    """TRL 1.16 (l.2874–2886): the sequence modes' ratio statistics are min/mean/max of the flattened [B, 1] ratios,
    every response included; one with no valid token (--mask_truncated_completions) has ratio exp(0) = 1, then
    clamped or masked. Hand values of that formula, float64."""
    old = torch.cat([OLD, torch.tensor([[-0.2, -0.4, -0.6]], dtype=torch.float64)])
    sampler = torch.cat([SAMPLER, torch.tensor([[-3.0, 0.5, -0.1]], dtype=torch.float64)])  # garbage: masked out
    mask = torch.cat([MASK, torch.zeros(1, 3, dtype=torch.float64)])
    w = sm.importance_weights(old, sampler, mask, mode, clip_max=clip_max, clip_min=clip_min)
    assert torch.allclose(w, torch.tensor(ratios, dtype=torch.float64)[:, None].expand(3, 3), rtol=1e-15, atol=0)
    stats = sm.mismatch_stats(old, sampler, w, mask, mode)
    assert stats["sampling/importance_sampling_ratio/min"] == pytest.approx(min(ratios), rel=1e-15)
    assert stats["sampling/importance_sampling_ratio/mean"] == pytest.approx(sum(ratios) / 3, rel=1e-15)
    assert stats["sampling/importance_sampling_ratio/max"] == pytest.approx(max(ratios), rel=1e-15)
    # the logp difference is over the 5 response tokens only (l.2862–2865): the empty row adds none
    assert stats["sampling/sampling_logp_difference/mean"] == pytest.approx(
        (0.5 + 1.0 + 0.0 + 0.0 + 1.3) / 5, rel=1e-14
    )


def test_a_nan_sampler_logprob_no_longer_skips_the_update():
    """The rule as grpo.py calls it: with a NaN sampler log-prob on a valid token the corrected advantages and every
    statistic are finite (before, the NaN weight made the update's loss NaN and the step was skipped)."""

    class Batch:
        response_mask = MASK
        sampler_logprobs = torch.tensor([[-1.5, math.nan, -0.5], [-0.3, -2.0, 0.0]], dtype=torch.float64)

    cfg = grpo.GRPOConfig(
        use_vllm=True, vllm_importance_sampling_correction=True, vllm_importance_sampling_mode="sequence_mask"
    )
    out, stats = sm.correction(cfg)(torch.full((2, 3), 2.0, dtype=torch.float64), OLD, Batch, MASK)
    assert torch.isfinite(out).all()
    assert torch.allclose(
        out, torch.tensor([[2 * math.exp(0.5)] * 3, [0.0] * 3], dtype=torch.float64), rtol=1e-15, atol=0
    )
    assert all(math.isfinite(v) for v in stats.values())
