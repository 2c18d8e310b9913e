"""The comparison rules' losses against TRL 1.16's own ``GRPOTrainer._compute_loss`` (issue #38).

Marker ``trl`` (needs tools/requirements-bench.txt; left out of the default run; ``.ci/run`` runs ``pytest -m trl`` in
its
own virtual environment). TRL's method runs unchanged on a stub trainer (the attributes it reads, TRL's own
``get_high_entropy_mask``, a one-process accelerator) whose ``_get_per_token_logps_and_entropies`` returns log π
[B, T] from one float64 leaf and entropies we set; the same log π go through the run's loss stage (its method's,
``comparisons.method``: conftest ``loss_stage``). Value and gradient w.r.t. log π agree to 1e-12 in float64:
TRL's loss is elementwise in its inputs' dtype. Where TRL computes in float32 (not exercised here): its log-probs and
entropies come from its fused LM head, which accumulates in float32 whatever the model's dtype
(``trl.kernels.chunked_logprob``), and its entropy threshold is a float32 quantile (``get_high_entropy_mask``'s
``.float()``); the entropies below are exact in float32, so the mask is the same. SAPO's τ: TRL builds it with
``torch.where(Â > 0, τ_pos, τ_neg)`` of two Python floats, a float32 tensor, so its τ_neg is float32(1.05) =
1.0499999523; our side is given that value (1.05 itself moves the loss by 4e-8 relative).

TRL's settings beside ours: ``epsilon_high`` defaults to ``epsilon`` (0.2; ours 0.28, DAPO's), so it is given;
TRL has no dual clip (its ``delta`` is a two-sided clip), so ``--dual_clip`` stays off; TRL's micro-batch is its
``per_device_train_batch_size`` and its entropy pool that micro-batch (gathered over processes): our
``--entropy_pool micro`` at the same ``--micro_batch_size``, or ``minibatch`` when it is the whole mini-batch.
"""

import math
from collections import defaultdict
from types import SimpleNamespace

import pytest
import torch

pytestmark = pytest.mark.trl
D = torch.float64
TAU_NEG = float(torch.tensor(1.05, dtype=torch.float32))  # TRL's τ_neg as its loss uses it (float32)


class _Accelerator:  # one process: TRL's collectives are the identity
    num_processes = 1

    def pad_across_processes(self, x, dim=0, pad_index=0):
        return x

    def gather(self, x):
        return x

    gather_for_metrics = gather

    def reduce(self, x, reduction="sum"):
        return x


@pytest.fixture(scope="module")
def trl_loss():
    """``trl_loss(logp, delta, adv, mask, entropy, parts=1, **settings)``: TRL's ``_compute_loss`` over the rows split
    into ``parts`` equal micro-batches (gradient accumulation ``parts``), summed as TRL's step sums them. Returns
    (loss, ∂loss/∂log π [B, T])."""
    trl = pytest.importorskip("trl")  # in a fixture: the default run collects this file without a skip

    def run(
        logp,
        delta,
        adv,
        mask,
        entropy=None,
        parts=1,
        loss_type="dapo",
        quantile=1.0,
        epsilon=0.2,
        epsilon_high=0.28,
        beta=0.0,
        ref_logp=None,
        tau_pos=1.0,
        tau_neg=1.05,
    ):
        leaf = logp.clone().requires_grad_(True)
        B, T = logp.shape
        entropy = torch.zeros(B, T, dtype=D) if entropy is None else entropy
        rows = torch.arange(B).tensor_split(parts)
        stub = SimpleNamespace(
            top_entropy_quantile=quantile,
            off_policy_mask_threshold=None,
            importance_sampling_level="token",
            beta=beta,
            loss_type=loss_type,
            epsilon_low=epsilon,
            epsilon_high=epsilon_high,
            use_vllm=False,
            model=SimpleNamespace(training=True),
            current_gradient_accumulation_steps=parts,
            max_completion_length=T,
            _entropy_bonus_enabled=False,
            aux_loss_enabled=False,
            _metrics=defaultdict(lambda: defaultdict(list)),
            accelerator=_Accelerator(),
            args=SimpleNamespace(
                delta=None,
                sapo_temperature_pos=tau_pos,
                sapo_temperature_neg=tau_neg,
                use_bias_correction_kl=False,
                steps_per_generation=parts,
            ),
        )
        stub.get_high_entropy_mask = trl.GRPOTrainer.get_high_entropy_mask.__get__(stub)
        total = 0.0
        for j in rows:
            stub._get_per_token_logps_and_entropies = lambda *a, j=j, **k: (leaf[j], entropy[j], None)
            inputs = {
                "prompt_ids": torch.ones(len(j), 1, dtype=torch.long),
                "prompt_mask": torch.ones(len(j), 1, dtype=torch.long),
                "completion_ids": torch.ones(len(j), T, dtype=torch.long),
                "completion_mask": mask[j].long(),
                "advantages": adv[j],
                "old_per_token_logps": (logp - delta)[j],
                # TRL's num_items_in_batch: the generation batch's tokens (here the mini-batch)
                "num_items_in_batch": mask.sum(),
            }
            if ref_logp is not None:
                inputs["ref_per_token_logps"] = ref_logp[j]
            loss = trl.GRPOTrainer._compute_loss(stub, None, inputs)
            loss.backward()
            total += loss.item()
        return total, leaf.grad

    return run


def _batch(seed=0, B=4, T=5):
    """log π, Δ (a spread that clips), Â ±, a mask with unequal lengths, entropies exact in float32 (k/8)."""
    g = torch.Generator().manual_seed(seed)
    logp = -torch.rand(B, T, generator=g, dtype=D) - 0.1
    delta = 0.4 * torch.randn(B, T, generator=g, dtype=D)
    adv = torch.tensor([1.0, -0.5, 0.75, -1.25], dtype=D)[:B]
    lengths = torch.tensor([5, 2, 4, 3])[:B]
    mask = (torch.arange(T)[None] < lengths[:, None]).to(D)
    entropy = torch.randperm(B * T, generator=g).reshape(B, T).to(D) / 8
    return logp, delta, adv, mask, entropy


def _close(ours, theirs):
    (l1, g1), (l2, g2) = ours, theirs
    assert l1 == pytest.approx(l2, rel=1e-12, abs=1e-14)
    torch.testing.assert_close(g1, g2, rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("parts", [1, 2])
@pytest.mark.parametrize("loss_type", ["dapo", "grpo", "dr_grpo", "sapo"])
def test_losses_equal_trl(trl_loss, loss_stage, loss_type, parts):
    """The three aggregations (TRL's ``dapo``, ``grpo``, ``dr_grpo``) of the clipped surrogate and SAPO's gate,
    over the mini-batch and over two micro-batches (TRL's gradient accumulation), value and gradient."""
    logp, delta, adv, mask, _ = _batch()
    theirs = trl_loss(logp, delta, adv, mask, parts=parts, loss_type=loss_type)
    loss, grad, stats, _ = loss_stage(
        logp,
        delta,
        adv,
        mask=mask,
        loss_type=loss_type,
        sapo_temperature_neg=TAU_NEG,
        micro_batch_size=len(adv) // parts,
        padding_free=False,
    )
    if loss_type != "sapo":  # the clip binds somewhere, or the comparison would not see it
        assert stats["clip_ratio/region_mean"] > 0
    _close((loss, grad), theirs)


@pytest.mark.parametrize("parts,pool", [(1, "minibatch"), (1, "micro"), (2, "micro")])
@pytest.mark.parametrize("loss_type", ["dapo", "grpo", "dr_grpo", "sapo"])
def test_entropy_quantile_equals_trl(trl_loss, loss_stage, loss_type, parts, pool):
    """``--top_entropy_quantile 0.4`` against TRL's ``top_entropy_quantile=0.4``: TRL ranks its micro-batch (our
    micro pool at its size; the mini-batch pool when that is the whole mini-batch), multiplies ℓ by the mask and
    keeps its normalisers (issue #38 item 1: the per-sequence losses divided by the kept tokens before)."""
    logp, delta, adv, mask, entropy = _batch(1)
    theirs = trl_loss(logp, delta, adv, mask, entropy, parts=parts, loss_type=loss_type, quantile=0.4)
    loss, grad, _, w = loss_stage(
        logp,
        delta,
        adv,
        entropy,
        mask,
        loss_type=loss_type,
        top_entropy_quantile=0.4,
        entropy_pool=pool,
        micro_batch_size=len(adv) // parts,
        padding_free=False,
        sapo_temperature_neg=TAU_NEG,
    )
    assert 0 < w.sum() < mask.sum()  # the mask leaves tokens out
    _close((loss, grad), theirs)


def test_entropy_quantile_minimal_case_equals_trl(trl_loss, loss_stage):
    """Issue #38 item 1's case in TRL itself: one response of two tokens, Â = +1, entropies [1, 0], quantile 0.5,
    at θ_old: grpo −0.5, sapo −1.0, gradient [−0.5, 0] both."""
    logp, zero = torch.full((1, 2), math.log(0.5), dtype=D), torch.zeros(1, 2, dtype=D)
    adv, mask, entropy = torch.tensor([1.0], dtype=D), torch.ones(1, 2, dtype=D), torch.tensor([[1.0, 0.0]], dtype=D)
    for loss_type, value in (("grpo", -0.5), ("sapo", -1.0)):
        theirs = trl_loss(logp, zero, adv, mask, entropy, loss_type=loss_type, quantile=0.5)
        assert theirs[0] == pytest.approx(value, abs=1e-15)
        torch.testing.assert_close(theirs[1], torch.tensor([[-0.5, 0.0]], dtype=D), rtol=0, atol=1e-15)
        loss, grad, _, _ = loss_stage(logp, zero, adv, entropy, loss_type=loss_type, top_entropy_quantile=0.5)
        _close((loss, grad), theirs)


def test_kl_penalty_with_the_entropy_quantile_equals_trl(trl_loss, loss_stage):
    """β > 0: TRL adds β·k3 after the entropy mask, on every valid token; so does the loss stage (the mask is a
    factor of Ã)."""
    logp, delta, adv, mask, entropy = _batch(2)
    ref = logp + 0.3 * torch.randn(logp.shape, generator=torch.Generator().manual_seed(5), dtype=D)
    for loss_type in ("dapo", "grpo"):
        theirs = trl_loss(logp, delta, adv, mask, entropy, loss_type=loss_type, quantile=0.4, beta=0.04, ref_logp=ref)
        loss, grad, _, _ = loss_stage(
            logp, delta, adv, entropy, mask, ref, loss_type=loss_type, beta=0.04, top_entropy_quantile=0.4
        )
        _close((loss, grad), theirs)


def test_a_fully_masked_response_counts_in_the_sequence_mean_as_in_trl(trl_loss, loss_stage):
    """``--mask_truncated_completions`` leaves a response with no token: TRL's ``grpo`` mean is over every response
    of the micro-batch, it included, and so is ours (verl's ``agg_loss`` leaves it out: tests/test_verl_rules.py)."""
    logp, delta, adv, mask, _ = _batch(3)
    mask[1] = 0
    theirs = trl_loss(logp, delta, adv, mask, loss_type="grpo")
    loss, grad, _, _ = loss_stage(logp, delta, adv, mask=mask, loss_type="grpo")
    _close((loss, grad), theirs)
    rest = torch.tensor([0, 2, 3])  # the mean over the three others, had it been left out: 4/3 of the value
    three, _, _, _ = loss_stage(logp[rest], delta[rest], adv[rest], mask=mask[rest], loss_type="grpo")
    assert theirs[0] == pytest.approx(three * 3 / 4, rel=1e-12) and abs(three) > 1e-3


def test_the_log_ratio_clamp_is_a_difference(trl_loss, loss_stage):
    """One token with Δ = 21, Â = −1, no dual clip: TRL takes exp(21) unclamped, value and gradient 1.3e9; the loss
    stage clamps Δ to ±20 before exp (verl's rule): value e^20, gradient 0 (the clamp's)."""
    logp, delta = torch.zeros(1, 1, dtype=D), torch.full((1, 1), 21.0, dtype=D)
    adv, mask = torch.tensor([-1.0], dtype=D), torch.ones(1, 1, dtype=D)
    loss, grad = trl_loss(logp, delta, adv, mask)
    assert loss == pytest.approx(math.exp(21), rel=1e-12) and float(grad) == pytest.approx(math.exp(21), rel=1e-12)
    assert 1.3e9 < float(grad) < 1.4e9
    loss, grad, _, _ = loss_stage(logp, delta, adv)
    assert loss == pytest.approx(math.exp(20), rel=1e-12) and float(grad) == 0.0


def test_trl_epsilon_high_defaults_to_epsilon():
    """TRL's ``epsilon_high`` is ``epsilon`` unless given (ours: 0.28, DAPO's Clip-Higher), as the README says."""
    trl = pytest.importorskip("trl")
    import dataclasses
    import inspect

    import grpo

    defaults = {f.name: f.default for f in dataclasses.fields(trl.GRPOConfig)}
    assert defaults["epsilon"] == 0.2 and defaults["epsilon_high"] is None
    assert "args.epsilon_high if args.epsilon_high is not None else args.epsilon" in inspect.getsource(
        trl.GRPOTrainer.__init__
    )
    assert grpo.GRPOConfig().epsilon_high == 0.28
