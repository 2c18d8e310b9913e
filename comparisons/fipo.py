"""FIPO (docs/specs/baselines.md §5): grpo.py's loss stage with Ã = Â·f, f the future-KL weight of the current
log-ratio (``baselines.fipo_weights``), under ``--fipo`` (python -m comparisons; ``--credit fipo`` is its old
spelling). FIPO is a token credit, Â·f, but f reads the current θ's log-ratio, which only the update's own training
forward has: so it lives in the loss stage, and stage 5's credit is GRPO's Â on every token. A response
with more than one dual-clipped token leaves the numerator here and the denominator in ``fipo_rescale``, as in FIPO's
code, which always applies its dual clip c (clip_ratio_c = 10; log c is its filter's bound too). Only with --loss_type
dapo, the token-mean the rescale counts in, and not with --beta > 0 (check_config): the rescale scales the whole
gradient, and the k3 term over every valid token must not be rescaled."""

from __future__ import annotations

import dataclasses
import functools
import math
from dataclasses import dataclass

import torch

import grpo
from comparisons import baselines
from trainer import credit_methods, distributed, policy
from trainer.grpo_config import flag

STATS = ("fipo/f_mean", "fipo/dropped_frac")
MORE_CHOICES = {"credit": {"fipo": "the old spelling of --fipo (GRPO's Â, FIPO's weight in the loss)"}}


@dataclass
class Flags:
    fipo: bool = flag(False, "FIPO: each token's loss weighted by its future-KL weight f (its credit: GRPO's Â)")
    fipo_decay_rate: float = flag(32.0, "FIPO: half-life of the future-KL sum in tokens")
    fipo_clip: float = flag(0.2, "FIPO: the weight is clipped to [1, 1 + this]")
    fipo_safety_threshold: float = flag(10.0, "FIPO: Â < 0 tokens with ratio above this keep a weight in [0.8, 1]")


def on(cfg) -> bool:  # --fipo, or its old spelling --credit fipo
    return cfg.fipo or cfg.credit == "fipo"


def checks(cfg) -> list[tuple[bool, str]]:
    return [
        (
            on(cfg) and cfg.loss_type != "dapo",
            "--fipo weights DAPO's clipped surrogate: use it with --loss_type dapo",
        ),
        (
            on(cfg) and cfg.beta > 0,
            "--fipo with --beta > 0: FIPO's sequence drop is known only after the mini-batch's last backward and "
            "rescales its whole gradient (comparisons/fipo.py), the k3 term's too, which must stay over every valid "
            "token; use --beta 0 (DelTA's runs) or another credit",
        ),
        (
            on(cfg) and cfg.credit not in ("grpo", "fipo"),
            f"--fipo is FIPO with GRPO's credit: not with --credit {cfg.credit}",
        ),
        (
            cfg.fipo_decay_rate <= 0 or cfg.fipo_clip < 0 or cfg.fipo_safety_threshold <= 0,
            "--fipo_decay_rate and --fipo_safety_threshold must be > 0, --fipo_clip >= 0",
        ),
    ]


def replace(cfg, method: grpo.Method) -> grpo.Method:
    """``method`` with FIPO's loss stage (and GRPO's credit) under --fipo."""
    if not on(cfg):
        return method
    return method._replace(
        credit=credit_methods.GRPOCredit, loss_stage=grpo.LossStage(fipo_backward, STATS), label="fipo"
    )


def fipo_backward(model, update, rows, cfg):
    """``grpo.minibatch_backward`` with ``fipo_loss`` (FIPO's weight f and its kept tokens per micro-batch, from its
    training forward), then ``fipo_rescale`` for the dropped ones. Returns (loss, statistic sums)."""
    settings = dataclasses.replace(update.parts.loss_settings, dual_clip=cfg.dual_clip or 10.0)
    dropped = torch.zeros(1, dtype=torch.float64)  # the mini-batch's dropped tokens
    scope = grpo.minibatch_scope(update.loss_mask, rows)  # its valid tokens: the loss's normaliser (token-mean)
    micro_loss = functools.partial(fipo_loss, cfg=cfg, settings=settings, dropped=dropped)
    loss_total, sums = grpo.minibatch_backward(model, update, rows, cfg, micro_loss, scope)
    return loss_total * fipo_rescale(model, scope.num_tokens, float(distributed.all_reduce_sum(dropped))), sums


def fipo_loss(mb, update, scope, cfg, settings, dropped):
    """FIPO's loss of micro-batch ``mb``: the surrogate on Â·f over its kept tokens (``baselines.fipo_weights`` of
    its log-ratio), normalised by the mini-batch's valid tokens (``scope``), its dropped tokens added to ``dropped``.
    Returns (loss, statistics)."""
    adv_t = mb.part(update.update_adv)
    old_t = mb.part(update.old.logp)
    valid_t = mb.part(update.loss_mask)
    log_c = math.log(settings.dual_clip)
    f, kept = baselines.fipo_weights(
        mb.logp.detach() - old_t, adv_t, valid_t, cfg.fipo_decay_rate, cfg.fipo_clip, cfg.fipo_safety_threshold, log_c
    )
    num_dropped = float((valid_t - kept).sum())
    num_valid = float(valid_t.sum())
    own = {
        "fipo/f_mean": float((f * kept).sum() / kept.sum().clamp(min=1.0)),
        "fipo/dropped_frac": num_dropped / max(num_valid, 1.0),  # counts: exact
        "n:fipo/dropped_frac": num_valid,  # a share of the valid tokens (f_mean: of the loss's, kept)
    }
    dropped.add_(num_dropped)
    policy.keep_loss_factor(update, mb, kept * f)
    loss, stats = grpo.policy_loss(mb.logp, old_t, adv_t * f, kept, settings, scope=scope)
    return loss, {**stats, **own}


def fipo_rescale(model, n: float, dropped: float) -> float:
    """FIPO's sequence drop in the denominator (spec §5: its code masks a dropped response out of both): the
    mini-batch's loss was divided by its ``n`` valid tokens (DAPO's token-mean, the one --loss_type --fipo takes), so
    every accumulated gradient is scaled by n / (n − ``dropped``), the dropped tokens summed over the processes.

    Rescaling, not counting: the drop is known only from the current θ's log-ratio, which each micro-batch's own
    training forward gives; counting it before the first backward would take a no-grad forward of the mini-batch
    more (the update's largest cost) and a second, possibly differently rounded, decision. Gradient accumulation is
    linear, so the scaled sum equals dividing each micro-batch by n − dropped, at every micro-batch size (tested in
    float64). Returns the factor (1.0: nothing dropped).
    """
    if dropped == 0:
        return 1.0
    factor = max(n, 1.0) / max(n - dropped, 1.0)  # a mini-batch all dropped has no loss left: nothing to divide
    with torch.no_grad():
        for param in model.parameters():
            if param.grad is not None:
                param.grad.mul_(factor)
    return factor
