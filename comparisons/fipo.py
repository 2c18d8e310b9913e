"""FIPO (docs/specs/baselines.md §5): grpo.py's loss stage with Ã = Â·f, f the future-KL weight of the current
log-ratio (``baselines.fipo_weights``), under ``--credit fipo`` (its credit: GRPO's Â on every token). A response
with more than one dual-clipped token leaves the numerator here and the denominator in ``fipo_rescale``, as in FIPO's
code, which always applies its dual clip c (clip_ratio_c = 10; log c is its filter's bound too). Not with --beta > 0
(check_config): the rescale scales the whole gradient, and the k3 term over every valid token must not be rescaled."""

from __future__ import annotations

import dataclasses
import math

import torch

import grpo
from comparisons import baselines
from trainer import credit_methods, distributed, policy

STATS = ("fipo/f_mean", "fipo/dropped_frac")


def register(credit_functions: dict, loss_stages: dict, policy_losses: dict) -> None:
    credit_functions["fipo"] = credit_methods.GRPOCredit  # FIPO's weight is in its loss stage; its credit is GRPO's
    loss_stages["fipo"] = grpo.LossStage(fipo_backward, STATS)


def fipo_backward(model, update, rows, cfg):
    """``grpo.minibatch_backward`` with FIPO's weight f and its kept tokens per micro-batch (from its training
    forward), then ``fipo_rescale`` for the dropped ones. Returns (loss, statistic sums)."""
    device = next(model.parameters()).device
    dual_clip = cfg.dual_clip or 10.0
    settings = dataclasses.replace(grpo.POLICY_LOSSES[cfg.loss_type].settings.from_config(cfg), dual_clip=dual_clip)
    valid, old = update.loss_mask, update.old
    counts = distributed.all_reduce_sum(
        torch.tensor([valid[rows].sum().item(), valid[rows].sum().item(), float(len(rows))], dtype=torch.float64)
    )
    scope = grpo.LossScope(counts[0].item(), int(counts[2].item()), None, counts[1].item())
    dropped = torch.zeros(2, dtype=torch.float64)  # the mini-batch's dropped tokens and responses
    if update.loss_factor is None:
        update.loss_factor = torch.zeros_like(update.update_adv)
    passes = old.update_passes or policy.Passes(model, update.batch, rows, cfg, grad=True)
    loss_total, sums = 0.0, {}
    for mb in passes:
        at = lambda x: mb.take(x).to(device) if x is not None else None  # noqa: E731  (this micro-batch's part)
        adv_t, old_t, valid_t = at(update.update_adv), at(old.logp), at(valid)
        f, kept = baselines.fipo_weights(
            mb.logp.detach() - old_t,
            adv_t,
            valid_t,
            cfg.fipo_decay_rate,
            cfg.fipo_clip,
            cfg.fipo_safety_threshold,
            math.log(dual_clip),
        )
        own = {
            "fipo/f_mean": float((f * kept).sum() / kept.sum().clamp(min=1.0)),
            "fipo/dropped_frac": float((valid_t - kept).sum() / valid_t.sum().clamp(min=1.0)),
        }
        dropped += torch.tensor(
            [
                float((valid_t - kept).sum()),  # its tokens, and the responses
                float(((valid_t.sum(-1) > 0) & (kept.sum(-1) == 0)).sum()),
            ],
            dtype=torch.float64,
        )
        update.loss_factor[mb.rows, : mb.t] = (kept * f).cpu().to(update.loss_factor.dtype)
        loss, stats = grpo.policy_loss(
            mb.logp,
            old_t,
            adv_t * f,
            kept,
            settings,
            ref_logp=at(old.ref_logp),
            scope=scope._replace(valid_mask=valid_t),
        )
        loss.backward()
        loss_total += loss.item()
        for key, v in {**stats, **own}.items():  # token-weighted: Σ / Σ num_tokens is the step's token-mean
            sums[key] = sums.get(key, 0.0) + (v * stats["num_tokens"] if key != "num_tokens" else v)
    passes.backward_prompts()
    per_token = settings.aggregation == "dapo"
    n = scope.num_tokens if per_token else float(scope.num_sequences)
    return loss_total * fipo_rescale(model, per_token, n, distributed.all_reduce_sum(dropped)), sums


def fipo_rescale(model, per_token: bool, n: float, dropped: torch.Tensor) -> float:
    """FIPO's sequence drop in the denominator (spec §5: its code masks a dropped response out of both): the
    mini-batch's loss was divided by its whole count ``n`` (tokens when ``per_token``, else responses), so every
    accumulated gradient is scaled by n / (n − dropped) of that unit.

    Rescaling, not counting: the drop is known only from the current θ's log-ratio, which each micro-batch's own
    training forward gives; counting it before the first backward would take a no-grad forward of the mini-batch
    more (the update's largest cost) and a second, possibly differently rounded, decision. Gradient accumulation is
    linear, so the scaled sum equals dividing each micro-batch by n − dropped, at every micro-batch size (tested in
    float64). ``dropped`` [2]: tokens, responses (summed over processes). Returns the factor (1.0: nothing dropped).
    """
    d = float(dropped[0]) if per_token else float(dropped[1])
    if d == 0:
        return 1.0
    factor = max(n, 1.0) / max(n - d, 1.0)  # a mini-batch all dropped has no loss left: nothing to divide
    with torch.no_grad():
        for param in model.parameters():
            if param.grad is not None:
                param.grad.mul_(factor)
    return factor
