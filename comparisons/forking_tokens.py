"""Forking Tokens (docs/specs/baselines.md §3): grpo.py's loss stage on the top ⌈ρn⌉ valid tokens by the current
policy's entropy (--entropy_top_ratio, its code: the kept tokens' mean) or on those at or above the quantile 1 − ρ
(--top_entropy_quantile, TRL: ℓ × the mask, every valid token in the normaliser). The pool (--entropy_pool): the
mini-batch (one no-grad entropy pass before the first backward: ``forking_backward``) or each micro-batch (its own
forward's entropies: ``forking_micro_backward``). Each is ``grpo.minibatch_backward`` with its change; the k3 term
(--beta > 0) stays over every valid token (Forking Tokens' code adds verl's kl_loss = agg_loss(k3, response_mask)).
Its flags (``Flags``) and loss stages are chosen once, by ``replace`` (python -m comparisons)."""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

import grpo
from comparisons import baselines
from trainer import distributed, policy
from trainer.grpo_config import flag

STATS = ("forking/kept_frac",)


@dataclass
class Flags:
    entropy_top_ratio: float = flag(
        0.0,
        "Forking Tokens (its code): train on the top ⌈ρn⌉ tokens by entropy, the loss their mean (DelTA's row: 0.2; "
        "0 = off)",
    )
    top_entropy_quantile: float = flag(
        1.0, "Forking Tokens as TRL: tokens with entropy ≥ the (1 − ρ) quantile, the normaliser unchanged (1 = off)"
    )
    entropy_pool: str = flag(
        "minibatch",
        "the tokens ranked by entropy: the mini-batch (exact under micro-batching; one no-grad forward more) or each "
        "micro-batch (Forking Tokens' code)",
        ["minibatch", "micro"],
    )


def checks(cfg) -> list[tuple[bool, str]]:
    return [
        (
            not 0 <= cfg.entropy_top_ratio <= 1 or not 0 < cfg.top_entropy_quantile <= 1,
            "--entropy_top_ratio must be in [0, 1] (0 = off) and --top_entropy_quantile in (0, 1] (1 = off)",
        ),
        (
            cfg.entropy_top_ratio > 0 and cfg.top_entropy_quantile < 1,
            "--entropy_top_ratio (Forking Tokens' rule) and --top_entropy_quantile (TRL's) are two readings of one "
            "baseline: give one",
        ),
    ]


def replace(cfg, method: grpo.Method) -> grpo.Method:
    """``method`` with Forking Tokens' loss stage when --entropy_top_ratio or --top_entropy_quantile is on: the
    mini-batch pool's (``forking_backward``) or, with --entropy_pool micro, each micro-batch's (it needs its own
    training forward: stage 4's is not reused)."""
    if not (cfg.entropy_top_ratio > 0 or cfg.top_entropy_quantile < 1):
        return method
    if cfg.entropy_pool == "micro":
        stage = grpo.LossStage(forking_micro_backward, STATS, reuses_old_forward=False)
    else:
        stage = grpo.LossStage(forking_backward, STATS)
    label = "forking" if method.label == "grpo" else f"forking+{method.label}"
    return method._replace(loss_stage=stage, label=label)


def picked_tokens(entropy, valid, cfg):  # the tokens of the rule among ``valid`` [b, t] bool
    return baselines.forking_mask(entropy, valid, cfg.entropy_top_ratio, cfg.top_entropy_quantile)


@torch.no_grad()
def minibatch_pool(model, batch, valid, rows, cfg, forward: policy.Forward):
    """The rule over the mini-batch ``rows`` at the current θ: a no-grad pass for the entropies (the micro-batches'
    own forwards come too late: the first one's backward needs the whole pool's ranking). Returns ``[N, T]`` bool,
    False outside ``rows`` and ``valid`` (the loss mask [N, T]); the entropies are [N, T] floats (N·T·4 bytes: 34 MB at
    2,048 × 4,096)."""
    dt = torch.promote_types(next(model.parameters()).dtype, torch.float32)  # float32 (float64 for a float64 model)
    entropy = torch.zeros(valid.shape, dtype=dt)
    for mb in forward.micro_batches(model, batch, rows, cfg, grad=False, asked=policy.Asked(entropy=True)):
        entropy[mb.rows, : mb.t] = mb.entropy.to(dt).cpu()
    picked = torch.zeros(valid.shape, dtype=torch.bool)
    picked[rows] = picked_tokens(entropy[rows], valid[rows], cfg)
    model.train()
    return picked


def forking_backward(model, update, rows, cfg):
    """``grpo.minibatch_backward`` on the mini-batch pool's tokens (``picked_loss``): --entropy_top_ratio, the
    surrogate on the picked tokens and their count; --top_entropy_quantile, ℓ × the mask (on Ã: each surrogate here is
    0 at Ã = 0, so ℓ(m·Ã) = m·ℓ(Ã)) over every valid token's count. Returns (loss, statistic sums)."""
    picked = minibatch_pool(model, update.batch, update.loss_mask, rows, cfg, update.parts.forward)
    valid = update.loss_mask
    mask = valid if cfg.top_entropy_quantile < 1 else valid * picked  # the tokens of the surrogate (their count)
    scope = grpo.minibatch_scope(mask, rows)._replace(num_valid=grpo.minibatch_scope(valid, rows).num_tokens)
    micro_loss = functools.partial(pooled_loss, picked=picked, cfg=cfg)
    return grpo.minibatch_backward(model, update, rows, cfg, micro_loss, scope)


def pooled_loss(mb, update, scope, picked, cfg):
    """``picked_loss`` on micro-batch ``mb``'s part of the mini-batch pool's ``picked`` tokens ``[N, T]``."""
    return picked_loss(mb, update, scope, mb.part(picked), cfg)


def forking_micro_backward(model, update, rows, cfg):
    """``grpo.minibatch_backward`` with each micro-batch's own pool (``micro_pool_loss``: its training forward's
    entropies). Returns (loss, statistic sums)."""
    micro_loss = functools.partial(micro_pool_loss, cfg=cfg)
    return grpo.minibatch_backward(model, update, rows, cfg, micro_loss, asked=policy.Asked(entropy=True))


def micro_pool_loss(mb, update, scope, cfg):
    """``picked_loss`` on micro-batch ``mb``'s own pool: --entropy_top_ratio, the surrogate on its picked tokens, its
    mean over them divided by the number of micro-batches (Forking Tokens' code); --top_entropy_quantile, ℓ × the
    mask over every valid token's count (``scope``'s: the mini-batch's valid tokens and rows)."""
    valid_t = mb.part(update.loss_mask)
    picked = picked_tokens(mb.entropy.to(valid_t.device), valid_t, cfg)
    # its own count: this micro-batch's picked tokens, times the micro-batches summed (Forking Tokens' code)
    own_count = max(float((valid_t * picked).sum()), 1.0) * mb.num_micro_batches * distributed.world_size()
    n_tok = scope.num_tokens if cfg.top_entropy_quantile < 1 else own_count
    return picked_loss(mb, update, grpo.LossScope(n_tok, scope.num_sequences, None, scope.num_tokens), picked, cfg)


def picked_loss(mb, update, scope, picked, cfg):
    """The surrogate of micro-batch ``mb`` on its ``picked`` tokens ``[b, t]`` bool (--top_entropy_quantile: on every
    valid token, ℓ × the mask, TRL's), normalised by ``scope``; the k3 term over every valid token. Returns (loss,
    statistics)."""
    quantile = cfg.top_entropy_quantile < 1
    adv_t = mb.part(update.update_adv)
    valid_t = mb.part(update.loss_mask)
    weight = picked.to(adv_t.dtype) if quantile else 1.0  # TRL: ℓ × the mask
    mask_t = valid_t if quantile else valid_t * picked
    policy.keep_loss_factor(update, mb, mask_t * weight)
    old = update.old
    scope_t = scope._replace(valid_mask=valid_t)
    loss, stats = grpo.policy_loss(
        mb.logp,
        mb.part(old.logp),
        adv_t * weight,
        mask_t,
        update.parts.loss_settings,
        ref_logp=mb.part(old.ref_logp),
        scope=scope_t,
    )
    num_valid = float(valid_t.sum())
    own = {
        "forking/kept_frac": float((valid_t * picked).sum()) / max(num_valid, 1.0),  # counts: exact
        "n:forking/kept_frac": num_valid,  # a share of the valid tokens, not of the loss's
    }
    return loss, {**stats, **own}
