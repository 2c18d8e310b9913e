"""The comparison rules of grpo.py's loss stage, each chosen once from its flag when the run starts
(docs/specs/baselines.md; their maths are baselines.py's pure functions)::

    rule             flag                                         what it changes on the loss stage
    ForkingTokens    --entropy_top_ratio / --top_entropy_quantile the tokens: top entropies, ranked over a pool (§3)
    FIPO             --credit fipo                                the weight: future-KL f from the current θ (§5)
    Q2Selection      --delta_select                               the tokens: a share ranked by DelTA's λ̄ (§6, Q2)

A rule is a ``TokenRule``: it declares what it needs from the training forward (``needs_entropy``) and how it
normalises (``own_count``: each micro-batch's kept tokens, Forking Tokens' code), and the loss stage calls its hooks,
each the paper's default (nothing changed) unless the rule overrides it: ``settings`` (the surrogate's settings),
``select`` (once per step, from the credit), ``pool`` (once per mini-batch, at the current θ), ``weigh`` (per
micro-batch, from its forward) and ``finish`` (after the backward). ``choose(cfg)`` makes the run's ``Rules`` (none:
DAPO's loss on every valid token). A rule that replaces the surrogate itself (SAPO) is a policy loss instead:
``grpo.register_policy_loss``. Left out: a rule of the credit (DelTA's ablations: delta_ablations.py).
"""

from __future__ import annotations

import dataclasses
import math

import torch

from comparisons import baselines
from trainer import distributed
from trainer import policy


class TokenRule:
    """The default of every hook: every valid token, weight 1, the loss's own normaliser."""
    needs_entropy = False  # the training forward's entropies (policy.Passes(entropy=True)), per micro-batch
    own_count = False  # the normaliser: each micro-batch's kept tokens × micro-batches (else the mini-batch's)
    stat_names: tuple[str, ...] = ()

    def __init__(self, cfg):
        self.cfg = cfg

    def settings(self, settings):  # the surrogate's settings (grpo.LossSettings)
        return settings

    def select(self, adv, token_adv, token_weights, mask, step):  # once per step: (Ã [N, T], kept [N, T] or None, stats)
        return token_adv, None, {}

    def pool(self, model, batch, rows, keep):  # once per mini-batch: the tokens of the loss [N, T] bool (or None)
        return keep

    def weigh(self, mb, old_logp, valid, adv, weight, mask):  # per micro-batch (its [b, t] parts; adv: Ã):
        # (the factor of Ã, the loss's tokens, stats)
        return weight, mask, {}

    def finish(self, model, per_token: bool, n: float, own_count: bool) -> float:  # the loss's factor after backward
        return 1.0


class ForkingTokens(TokenRule):
    """Forking Tokens (spec §3): the loss on the top ⌈ρn⌉ valid tokens by the current policy's entropy
    (--entropy_top_ratio, its code: the kept tokens' mean) or on those at or above the quantile 1 − ρ
    (--top_entropy_quantile, TRL: ℓ × the mask, every valid token in the normaliser). The pool (--entropy_pool):
    the mini-batch (one no-grad entropy pass before the first backward) or each micro-batch (its own forward)."""
    stat_names = ("forking/kept_frac",)

    def __init__(self, cfg):
        super().__init__(cfg)
        self.minibatch, self.quantile = cfg.entropy_pool == "minibatch", cfg.top_entropy_quantile < 1
        self.needs_entropy = not self.minibatch
        self.own_count = not self.minibatch and not self.quantile
        self.picked = None  # the mini-batch pool's picks [N, T] bool (N·T bytes: 8.4 MB at 2,048 × 4,096)

    def mask(self, entropy, valid):
        return baselines.forking_mask(entropy, valid, self.cfg.entropy_top_ratio, self.cfg.top_entropy_quantile)

    def pool(self, model, batch, rows, keep):
        self.picked = forking_tokens(model, batch, rows, self) if self.minibatch else None
        return self.picked if self.picked is not None and not self.quantile else keep

    def weigh(self, mb, old_logp, valid, adv, weight, mask):
        picked = mb.take(self.picked).to(valid.device) if self.picked is not None else \
            self.mask(mb.entropy.to(valid.device), valid)
        if self.quantile:  # TRL: ℓ × the mask; on Ã: each surrogate here is 0 at Ã = 0, so ℓ(m·Ã) = m·ℓ(Ã)
            weight = picked.to(adv.dtype)
        elif self.picked is None:
            mask = valid * picked
        return weight, mask, {"forking/kept_frac": float((valid * picked).sum() / valid.sum().clamp(min=1.0))}


@torch.no_grad()
def forking_tokens(model, batch, rows, rule: ForkingTokens):
    """``rule.mask`` over the mini-batch ``rows`` at the current θ: a no-grad pass for the entropies (the micro-batches'
    own forwards come too late: the first one's backward needs the whole pool's ranking). Returns ``[N, T]`` bool,
    False outside ``rows``; the entropies are [N, T] floats (N·T·4 bytes: 34 MB at 2,048 × 4,096)."""
    dt = torch.promote_types(next(model.parameters()).dtype, torch.float32)  # float32 (float64 for a float64 model)
    valid, entropy = batch.response_mask, torch.zeros(batch.response_mask.shape, dtype=dt)
    for mb in policy.Passes(model, batch, rows, rule.cfg, grad=False, entropy=True):
        entropy[mb.rows, :mb.t] = mb.entropy.to(dt).cpu()
    picked = torch.zeros(valid.shape, dtype=torch.bool)
    picked[rows] = rule.mask(entropy[rows], valid[rows])
    model.train()
    return picked


class FIPO(TokenRule):
    """FIPO (spec §5): Ã = Â·f, f the future-KL weight of the current log-ratio; a response with more than one
    dual-clipped token leaves the numerator here and the denominator in ``finish``, as in FIPO's code, which always
    applies its dual clip c (clip_ratio_c = 10; log c is its filter's bound too). Not with --beta > 0 (check_config):
    ``finish`` rescales the whole gradient, and the k3 term over every valid token must not be rescaled."""
    stat_names = ("fipo/f_mean", "fipo/dropped_frac")

    def __init__(self, cfg):
        super().__init__(cfg)
        self.dual_clip = cfg.dual_clip or 10.0
        self.dropped = torch.zeros(2, dtype=torch.float64)

    def settings(self, settings):
        return dataclasses.replace(settings, dual_clip=self.dual_clip)

    def pool(self, model, batch, rows, keep):
        self.dropped = torch.zeros(2, dtype=torch.float64)  # the mini-batch's dropped tokens and responses
        return keep

    def weigh(self, mb, old_logp, valid, adv, weight, mask):
        c = self.cfg
        f, kept = baselines.fipo_weights(mb.logp.detach() - old_logp, adv, mask, c.fipo_decay_rate,
                                         c.fipo_clip, c.fipo_safety_threshold, math.log(self.dual_clip))
        stats = {"fipo/f_mean": float((f * kept).sum() / kept.sum().clamp(min=1.0)),
                 "fipo/dropped_frac": float((mask - kept).sum() / mask.sum().clamp(min=1.0))}
        self.dropped += torch.tensor([float((mask - kept).sum()),  # its tokens, and the responses
                                      float(((mask.sum(-1) > 0) & (kept.sum(-1) == 0)).sum())], dtype=torch.float64)
        return weight * f, kept, stats

    def finish(self, model, per_token, n, own_count):
        if own_count:
            return 1.0
        return fipo_rescale(model, per_token, n, distributed.all_reduce_sum(self.dropped))


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


class Q2Selection(TokenRule):
    """DelTA's Q2 (Sec. 5.2, spec §6): plain DAPO (Ã = Â) on a share of the tokens ranked by λ̄, chosen once per step
    from the credit's λ̄ (top, bottom, or random with a generator seeded by the step)."""
    stat_names = ()

    def select(self, adv, token_adv, token_weights, mask, step):
        c = self.cfg
        draw = torch.Generator().manual_seed(c.seed * 1_000_003 + step * 101 + distributed.rank())
        kept = baselines.select_tokens(token_weights["lambda_bar"], mask, c.delta_select_fraction, c.delta_select, draw)
        return adv[:, None] * mask, kept, {"delta/selected_frac": float(kept.sum() / mask.sum())}


class Rules:
    """The run's loss-side rules, in order (each hook of each, composed); none: DAPO's loss on every valid token.
    Per step: ``kept``, the tokens ``select`` chose ([N, T] bool, N·T bytes: 8.4 MB at 2,048 × 4,096; None: all);
    ``loss_weights``, where the loss stage writes each token's own factor for samples/ ([N, T] float, 34 MB; None:
    not written)."""

    def __init__(self, rules, kept=None, loss_weights=None):
        self.rules, self.kept, self.loss_weights = tuple(rules), kept, loss_weights
        self.needs_entropy = any(r.needs_entropy for r in self.rules)
        self.own_count = any(r.own_count for r in self.rules)
        self.stat_names = [n for r in self.rules for n in r.stat_names]

    def __bool__(self):  # whether the loss masks or weights tokens itself (samples/ then logs its factor)
        return bool(self.rules)

    def settings(self, settings):
        for r in self.rules:
            settings = r.settings(settings)
        return settings

    def select(self, adv, token_adv, token_weights, mask, step):  # once per step: (Ã, ``kept``, stats)
        kept, stats = None, {}
        for r in self.rules:
            token_adv, picked, more = r.select(adv, token_adv, token_weights, mask, step)
            kept, stats = picked if picked is not None else kept, {**stats, **more}
        self.kept = kept
        return token_adv, kept, stats

    def pool(self, model, batch, rows, keep):
        for r in self.rules:
            keep = r.pool(model, batch, rows, keep)
        return keep

    def weigh(self, mb, old_logp, valid, adv, mask):
        weight, stats = 1.0, {}
        for r in self.rules:
            weight, mask, more = r.weigh(mb, old_logp, valid, adv, weight, mask)
            stats.update(more)
        return weight, mask, stats

    def finish(self, model, per_token: bool, n: float) -> float:
        factor = 1.0
        for r in self.rules:
            factor *= r.finish(model, per_token, n, self.own_count)
        return factor


def choose(cfg, kept=None, loss_weights=None) -> Rules:
    """The run's rules from its flags, chosen once (check_config has refused the combinations that conflict);
    ``kept``, ``loss_weights``: see ``Rules``."""
    chosen = [(cfg.entropy_top_ratio > 0 or cfg.top_entropy_quantile < 1, ForkingTokens),
              (cfg.credit == "fipo", FIPO), (cfg.delta_select != "none", Q2Selection)]
    return Rules((rule(cfg) for wanted, rule in chosen if wanted), kept, loss_weights)


def rule_label(cfg) -> str:
    """The run's rule for the progress bar, from its flags: the loss-side rules (SAPO's gate, Forking Tokens' mask),
    then the credit (DelTA's Q2 selection as ``delta Q2``), e.g. ``grpo``, ``sapo``, ``forking``, ``sapo+delta``.
    (report.py's ``rule_name`` spells a finished run's config out in words.)"""
    loss = (["sapo"] if cfg.loss_type == "sapo" else []) + \
        (["forking"] if cfg.entropy_top_ratio > 0 or cfg.top_entropy_quantile < 1 else [])
    credit = "delta Q2" if cfg.credit == "delta" and cfg.delta_select != "none" else cfg.credit
    return "+".join(loss + ([credit] if credit != "grpo" or not loss else []))
