"""The comparison rules' losses against verl 0.9.1's own functions (issue #38): ``compute_policy_loss_vanilla``
(the clipped surrogate with its dual clip), ``compute_policy_loss_sapo`` and ``agg_loss``.

Marker ``verl`` (needs tools/requirements-verl.txt; left out of the default run; ``.ci/run`` runs ``pytest -m verl`` in
its own virtual environment). verl's functions take log π and θ_old's log π [B, T], Ã [B, T] and the mask, as grpo.py's
``policy_loss`` and the run's loss stage (its method's, ``comparisons.method``: conftest ``loss_stage``) do: value and
gradient w.r.t. log π agree to 1e-12 in float64 (verl computes in its inputs' dtype; its seq-mean-token-mean divides by
|o_i| + 1e-8, so there the mean is composed from verl's per-response token-means and the 1e-8 checked against its bound,
1e-8/|o_i| relative). verl's names beside ours: ``loss_agg_mode`` token-mean = ``dapo``, seq-mean-token-mean = ``grpo``
(and SAPO, which verl forces to it), seq-mean-token-sum-norm = ``dr_grpo`` (``loss_scale_factor`` =
``max_completion_length``); ``clip_ratio_low/high`` = ``--epsilon`` / ``--epsilon_high``; ``clip_ratio_c`` =
``--dual_clip`` (verl always applies it, default 3; off here without the flag); ``tau_pos/neg`` =
``--sapo_temperature_pos/neg``. tests/test_verl_credit.py runs the actor's ``ppo_loss`` on a whole batch from its
driver.
"""

import math

import pytest
import torch

pytestmark = pytest.mark.verl
D = torch.float64
MODES = {"dapo": "token-mean", "grpo": "seq-mean-token-mean", "dr_grpo": "seq-mean-token-sum-norm"}


@pytest.fixture(scope="module")
def verl():
    """(core_algos, actor config maker ``config(c=..., **global_batch_info)``)."""
    pytest.importorskip("verl")  # in a fixture: the default run collects this file without a skip
    from verl.trainer.ppo import core_algos
    from verl.workers.config.actor import FSDPActorConfig

    def config(c=10.0, tau_neg=1.05, **global_batch_info):
        cfg = FSDPActorConfig(
            strategy="fsdp",
            rollout_n=1,
            ppo_mini_batch_size=1,
            ppo_micro_batch_size_per_gpu=1,
            clip_ratio_low=0.2,
            clip_ratio_high=0.28,
            clip_ratio_c=c,
            tau_pos=1.0,
            tau_neg=tau_neg,
        )
        cfg.global_batch_info.update(global_batch_info)
        return cfg

    return core_algos, config


def _batch(seed=0, B=4, T=6):
    """log π, Δ with a wide spread (every clip binds somewhere, and the dual clip at c = 3), Ã [B, T] of both
    signs, unequal lengths."""
    g = torch.Generator().manual_seed(seed)
    logp = -torch.rand(B, T, generator=g, dtype=D) - 0.1
    delta = 1.2 * torch.randn(B, T, generator=g, dtype=D)
    delta[1, 0] = delta[3, 1] = 1.5  # r = 4.5 on two tokens of the Â < 0 responses: the dual clip at c = 3 binds
    token_adv = torch.tensor([1.0, -0.5, 0.75, -1.25], dtype=D)[:B, None] * (
        1 + 0.3 * torch.rand(B, T, generator=g, dtype=D)
    )
    mask = (torch.arange(T)[None] < torch.tensor([6, 3, 5, 4])[:B, None]).to(D)
    return logp, delta, token_adv, mask


def _verl(fn, logp, delta, token_adv, mask, mode, config):
    """verl's ``fn`` on the batch: (loss, ∂loss/∂log π). Its seq-mean-token-mean divides each response by
    |o_i| + 1e-8 (``agg_loss``), a relative 1e-8/|o_i| from the mean: for that mode ``_verl_by_rows`` composes the
    same mean without it, from verl's token-mean of each response, and the 1e-8 is checked against its bound."""
    leaf = logp.clone().requires_grad_(True)
    loss, _ = fn(logp - delta, leaf, token_adv, mask, loss_agg_mode=mode, config=config)
    loss.backward()
    if mode == "seq-mean-token-mean" or fn.__name__ == "compute_policy_loss_sapo":
        exact, _, scale = _verl_by_rows(fn, logp, delta, token_adv, mask, config)
        n_min = float(mask.sum(-1)[mask.sum(-1) > 0].min())
        assert abs(loss.item() - exact) <= 1e-8 / n_min * scale + 1e-15  # verl's 1e-8, and nothing more
        return _verl_by_rows(fn, logp, delta, token_adv, mask, config)[:2]
    return loss.item(), leaf.grad


def _verl_by_rows(fn, logp, delta, token_adv, mask, config):
    """verl's seq-mean-token-mean without its 1e-8: verl's ``fn`` on each response alone (token-mean, which divides
    by |o_i| exactly; SAPO's function forces seq-mean-token-mean, so its one-response value is multiplied back by
    (|o_i| + 1e-8) / |o_i|), averaged over the responses with a token (``agg_loss``'s seq_mask) or over
    ``global_batch_size`` when the config gives it. Returns (loss, gradient, Σ |per-response loss| / count)."""
    leaf = logp.clone().requires_grad_(True)
    total, absolute = 0.0, 0.0
    rows = [i for i in range(len(mask)) if mask[i].sum() > 0]
    count = config.global_batch_info.get("global_batch_size") or len(rows)
    for i in rows:
        n, one = float(mask[i].sum()), slice(i, i + 1)
        loss, _ = fn(
            (logp - delta)[one], leaf[one], token_adv[one], mask[one], loss_agg_mode="token-mean", config=config
        )
        if fn.__name__ == "compute_policy_loss_sapo":
            loss = loss * ((n + 1e-8) / n)
        (loss / count).backward()
        total, absolute = total + loss.item() / count, absolute + abs(loss.item()) / count
    return total, leaf.grad, absolute


def _close(ours, theirs):
    (l1, g1), (l2, g2) = ours, theirs
    assert l1 == pytest.approx(l2, rel=1e-12, abs=1e-14)
    torch.testing.assert_close(g1, g2, rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("c", [3.0, 10.0, None])
@pytest.mark.parametrize("loss_type", ["dapo", "grpo", "dr_grpo"])
def test_vanilla_loss_and_agg_loss_equal_verl(verl, loss_stage, loss_type, c):
    """The clipped surrogate with verl's dual clip c (3: verl's default, 10: DelTA's; None: ours off, verl's c
    above every ratio here) under each aggregation, through ``policy_loss`` and through the loss stage at
    micro_batch_size 1 (its mini-batch normaliser; verl's function sees the whole batch at once)."""
    import grpo

    core_algos, config = verl
    logp, delta, token_adv, mask = _batch()
    ratio_max = float(torch.exp(delta[mask > 0]).max())
    theirs = _verl(
        core_algos.compute_policy_loss_vanilla,
        logp,
        delta,
        token_adv,
        mask,
        MODES[loss_type],
        config(c or 2 * ratio_max),
    )
    leaf = logp.clone().requires_grad_(True)
    loss, stats = grpo.policy_loss(
        leaf,
        logp - delta,
        token_adv,
        mask,
        grpo.LossSettings(
            epsilon=0.2, epsilon_high=0.28, dual_clip=c, loss_type=loss_type, max_completion_length=logp.shape[1]
        ),
    )
    loss.backward()
    _close((loss.item(), leaf.grad), theirs)
    assert stats["clip_ratio/low_mean"] > 0 and stats["clip_ratio/high_mean"] > 0
    assert (stats["clip_ratio/dual_mean"] > 0) == (c == 3.0)  # the dual clip binds at c = 3 in this batch
    loss, grad, _, _ = loss_stage(
        logp, delta, token_adv, mask=mask, loss_type=loss_type, dual_clip=c, micro_batch_size=1, padding_free=False
    )
    _close((loss, grad), theirs)


def test_sapo_equals_verl(verl, loss_stage):
    """``--loss_type sapo`` against ``compute_policy_loss_sapo`` (τ 1.0 / 1.05; verl forces seq-mean-token-mean
    whatever ``loss_agg_mode`` says), the ratios far from 1 so the gate's curvature shows."""
    core_algos, config = verl
    logp, delta, token_adv, mask = _batch(1)
    theirs = _verl(core_algos.compute_policy_loss_sapo, logp, delta, token_adv, mask, "token-mean", config())
    loss, grad, _, _ = loss_stage(
        logp, delta, token_adv, mask=mask, loss_type="sapo", micro_batch_size=1, padding_free=False
    )
    _close((loss, grad), theirs)


def test_the_log_ratio_clamp_equals_verl(verl, loss_stage):
    """One token with Δ = 21, Â = −1, the dual clip out of reach: verl and the loss stage both clamp Δ to ±20 before
    exp: value e^20, gradient 0 (TRL's: e^21 and 1.3e9, tests/test_trl_rules.py)."""
    core_algos, config = verl
    logp, delta = torch.zeros(1, 1, dtype=D), torch.full((1, 1), 21.0, dtype=D)
    adv, mask = torch.full((1, 1), -1.0, dtype=D), torch.ones(1, 1, dtype=D)
    theirs = _verl(core_algos.compute_policy_loss_vanilla, logp, delta, adv, mask, "token-mean", config(1e12))
    loss, grad, _, _ = loss_stage(logp, delta, adv)
    _close((loss, grad), theirs)
    assert loss == pytest.approx(math.exp(20), rel=1e-12) and float(grad) == 0.0


def test_a_fully_masked_response_and_the_sequence_mean(verl, loss_stage):
    """A response with no valid token (``--mask_truncated_completions``): ``grpo`` counts it in the mean over
    sequences (TRL's rule), as verl's ``agg_loss`` does when given ``global_batch_size`` (its engine passes the
    mini-batch's responses); without it ``agg_loss`` leaves the response out (seq_mask): B / (B − 1) times ours."""
    core_algos, config = verl
    logp, delta, token_adv, mask = _batch(2)
    mask[1] = 0
    B = len(mask)
    ours = loss_stage(logp, delta, token_adv, mask=mask, loss_type="grpo", dual_clip=10.0)[:2]
    fn = core_algos.compute_policy_loss_vanilla
    _close(ours, _verl(fn, logp, delta, token_adv, mask, "seq-mean-token-mean", config(global_batch_size=B)))
    loss, grad = _verl(fn, logp, delta, token_adv, mask, "seq-mean-token-mean", config())
    _close((ours[0] * B / (B - 1), ours[1] * B / (B - 1)), (loss, grad))


def test_micro_batch_normalisers(verl):
    """Four micro-batches of one response each (1, 1, 1 and 5 tokens; ℓ = 1 on the first three, 0 on the last): the
    loss stage divides each by the mini-batch's 8 tokens, as verl's ``agg_loss`` given ``batch_num_tokens`` (its
    engine): 3/8 = 0.375; DelTA's, Forking Tokens' and FIPO's verl code average each micro-batch by its own tokens
    and divide by the 4 micro-batches (gradient accumulation): (1 + 1 + 1 + 0) / 4 = 0.75."""
    import grpo

    core_algos, _ = verl
    lengths, T = [1, 1, 1, 5], 5
    ours = verl_global = own = 0.0
    for i, n in enumerate(lengths):
        mask = (torch.arange(T) < n).to(D)[None]
        adv = torch.full((1, T), -1.0 if i < 3 else 0.0, dtype=D)  # at r = 1: ℓ = −Ã
        zero = torch.zeros(1, T, dtype=D)
        ours += float(grpo.policy_loss(zero, zero, adv, mask, scope=grpo.LossScope(sum(lengths)))[0])
        ell = -adv * mask
        verl_global += float(core_algos.agg_loss(ell, mask, "token-mean", batch_num_tokens=sum(lengths)))
        own += float(core_algos.agg_loss(ell, mask, "token-mean")) / len(lengths)
    assert ours == pytest.approx(0.375, abs=1e-15) and verl_global == pytest.approx(0.375, abs=1e-15)
    assert own == pytest.approx(0.75, abs=1e-15)


def test_fipo_drop_equals_verl_agg_loss_on_the_kept_mask(verl, loss_stage, fipo_by_hand):
    """FIPO's code: the dual-clip loss (c = 10) on Ã = Â·f, aggregated by verl's ``agg_loss`` (token-mean: --fipo
    takes --loss_type dapo only, check_config) over ``response_mask & ~dropped``. The loss stage with --fipo (no
    --dual_clip) at micro_batch_size 1 gives verl's value and gradient on the whole mini-batch, issue #38 item 2's rows
    among others. verl's side takes f and the drop from spec §5 by hand (conftest ``fipo_by_hand``), not from
    baselines.py, which the stage uses."""
    loss_type = "dapo"
    core_algos, config = verl
    logp, delta, _, mask = _batch(3)
    delta = 0.1 * delta
    delta[1, :2] = math.log(12)  # response 1 (Â < 0): two dual-clipped tokens, dropped
    delta[3, 0] = math.log(12)  # response 3 (Â < 0): one, kept (its loss is dual-clipped at 10)
    adv = torch.tensor([1.0, -1.0, 0.5, -0.5], dtype=D)
    f, kept = fipo_by_hand(delta, adv, mask)
    assert kept[1].sum() == 0 and kept[3].sum() == mask[3].sum()
    theirs = _verl(
        core_algos.compute_policy_loss_vanilla, logp, delta, adv[:, None] * f, kept, MODES[loss_type], config(10.0)
    )
    loss, grad, _, _ = loss_stage(
        logp, delta, adv, mask=mask, fipo=True, loss_type=loss_type, micro_batch_size=1, padding_free=False
    )
    _close((loss, grad), theirs)
