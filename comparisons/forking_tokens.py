"""Forking Tokens (docs/specs/baselines.md §3): grpo.py's loss stage on the top ⌈ρn⌉ valid tokens by the current
policy's entropy (--entropy_top_ratio, its code: the kept tokens' mean) or on those at or above the quantile 1 − ρ
(--top_entropy_quantile, TRL: ℓ × the mask, every valid token in the normaliser). The pool (--entropy_pool): the
mini-batch (one no-grad entropy pass before the first backward: ``forking_backward``) or each micro-batch (its own
forward's entropies: ``forking_micro_backward``). Each is ``grpo.minibatch_backward`` with its change; the k3 term
(--beta > 0) stays over every valid token (Forking Tokens' code adds verl's kl_loss = agg_loss(k3, response_mask)).
Its flags (``Flags``) and loss stages are chosen once, by ``replace`` (python -m comparisons)."""

from __future__ import annotations

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
    """``grpo.minibatch_backward`` on the mini-batch pool's tokens: --entropy_top_ratio, the surrogate on the picked
    tokens and their count; --top_entropy_quantile, ℓ × the mask (on Ã: each surrogate here is 0 at Ã = 0, so
    ℓ(m·Ã) = m·ℓ(Ã)) over every valid token's count. Returns (loss, statistic sums)."""
    device = next(model.parameters()).device
    settings = update.parts.loss_settings
    quantile = cfg.top_entropy_quantile < 1
    picked = minibatch_pool(model, update.batch, update.loss_mask, rows, cfg, update.parts.forward)
    valid = update.loss_mask
    old = update.old
    mask = valid if quantile else valid * picked  # the tokens of the surrogate
    counts = distributed.all_reduce_sum(
        torch.tensor([mask[rows].sum().item(), valid[rows].sum().item(), float(len(rows))], dtype=torch.float64)
    )
    scope = grpo.LossScope(counts[0].item(), int(counts[2].item()), None, counts[1].item())
    if update.loss_factor is None:
        update.loss_factor = torch.zeros_like(update.update_adv)
    passes = old.training_forward or update.parts.forward.micro_batches(model, update.batch, rows, cfg, grad=True)
    loss_total, sums = 0.0, {}
    for mb in passes:
        at = lambda x: mb.take(x).to(device) if x is not None else None  # noqa: E731  (this micro-batch's part)
        adv_t, valid_t, mask_t, picked_t = at(update.update_adv), at(valid), at(mask), at(picked)
        weight = picked_t.to(adv_t.dtype) if quantile else 1.0  # TRL: ℓ × the mask
        update.loss_factor[mb.rows, : mb.t] = (mask_t * weight).cpu().to(update.loss_factor.dtype)
        loss, stats = grpo.policy_loss(
            mb.logp,
            at(old.logp),
            adv_t * weight,
            mask_t,
            settings,
            ref_logp=at(old.ref_logp),
            scope=scope._replace(valid_mask=valid_t),
        )
        loss.backward()
        loss_total += loss.item()
        kept = {"forking/kept_frac": float((valid_t * picked_t).sum() / valid_t.sum().clamp(min=1.0))}
        for key, v in {**stats, **kept}.items():  # token-weighted: Σ / Σ num_tokens is the step's token-mean
            sums[key] = sums.get(key, 0.0) + (v * stats["num_tokens"] if key != "num_tokens" else v)
    return loss_total, sums


def forking_micro_backward(model, update, rows, cfg):
    """``grpo.minibatch_backward`` with each micro-batch's own pool (its training forward's entropies):
    --entropy_top_ratio, the surrogate on its picked tokens, each micro-batch's mean over its picked tokens divided
    by the number of micro-batches (Forking Tokens' code); --top_entropy_quantile, ℓ × the mask over every valid
    token's count. Returns (loss, statistic sums)."""
    device = next(model.parameters()).device
    settings = update.parts.loss_settings
    quantile = cfg.top_entropy_quantile < 1
    valid = update.loss_mask
    old = update.old
    counts = distributed.all_reduce_sum(torch.tensor([valid[rows].sum().item(), float(len(rows))], dtype=torch.float64))
    n_valid, n_seq = counts[0].item(), int(counts[1].item())
    if update.loss_factor is None:
        update.loss_factor = torch.zeros_like(update.update_adv)
    asked = policy.Asked(entropy=True)
    passes = update.parts.forward.micro_batches(model, update.batch, rows, cfg, grad=True, asked=asked)
    loss_total, sums = 0.0, {}
    for mb in passes:
        at = lambda x: mb.take(x).to(device) if x is not None else None  # noqa: E731  (this micro-batch's part)
        adv_t, valid_t = at(update.update_adv), at(valid)
        picked = picked_tokens(mb.entropy.to(valid_t.device), valid_t, cfg)
        weight = picked.to(adv_t.dtype) if quantile else 1.0
        mask_t = valid_t if quantile else valid_t * picked
        # its own count: this micro-batch's picked tokens, times the micro-batches summed (Forking Tokens' code)
        n_tok = n_valid if quantile else max(float(mask_t.sum()), 1.0) * mb.num_micro_batches * distributed.world_size()
        update.loss_factor[mb.rows, : mb.t] = (mask_t * weight).cpu().to(update.loss_factor.dtype)
        loss, stats = grpo.policy_loss(
            mb.logp,
            at(old.logp),
            adv_t * weight,
            mask_t,
            settings,
            ref_logp=at(old.ref_logp),
            scope=grpo.LossScope(n_tok, n_seq, valid_t, n_valid),
        )
        loss.backward()
        loss_total += loss.item()
        kept = {"forking/kept_frac": float((valid_t * picked).sum() / valid_t.sum().clamp(min=1.0))}
        for key, v in {**stats, **kept}.items():  # token-weighted: Σ / Σ num_tokens is the step's token-mean
            sums[key] = sums.get(key, 0.0) + (v * stats["num_tokens"] if key != "num_tokens" else v)
    return loss_total, sums
