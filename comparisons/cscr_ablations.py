"""CSCR's ablations (spec §9): each a whole function in the place of one step of cscr.py's credit.

cscr.py holds the paper's method; a run that compares against it replaces one of its replaceable steps (the fields of
``cscr.CscrFunctions``), chosen once when the run starts (``choose``, from ``--cscr_weight`` and ``--cscr_scope``,
through plain dicts), and passes them as the ``functions`` argument of cscr.py's ``cscr_token_advantages``,
``credit_log_weights`` and ``cscr_stats``::

    weights       (s, shift_pos, adv, threshold, settings) -> log w     the paper's: cscr.sensitivity_weights
        upweight      §9.3: the sensitive tokens get MORE credit
        sign_aware    §9.1: RLSD's direction weight
    renormalise   (log_w, credited) -> w̃                                the paper's: cscr.per_sequence
        per_group     §5 "scope", §9.3: one w̄ per group of rows
        per_batch     §9.3: one w̄ for the whole batch

Every one keeps the floor w = max(w_min, w) (after the step, as cscr.credit_log_weights) and the renormalisation, so
sign(Ã_i,t) = sign(Â_i); per_group and per_batch keep the group's / the batch's credit budget, not each sequence's.
The strength ablation (§9.2) is the α / λ sweep of the paper's map (no code here); the spec §5 alternative maps
``exp_abs`` and ``inverse`` are cscr.py's options (``Settings.weight``).  Usage (λ = 0.2)::

    ablation = cscr_ablations.choose("upweight")
    token_adv = cscr.cscr_token_advantages(
        adv, old_logp, lp_pos, lp_neg, loss_mask, 0.2, ablation.settings, functions=ablation.functions
    )

Imports torch, cscr.py and trainer/credit_methods.py (``CscrAblationCredit``).
"""

import functools
import math
from dataclasses import dataclass
from typing import NamedTuple

import torch

import cscr
from trainer import credit_methods
from trainer.grpo_config import flag


def upweight(s, shift_pos, adv, threshold, settings):
    """Spec §9.3 [I] (SC-GRPO/RLSD-like), in place of ``cscr.sensitivity_weights``: log w = +α·max(0, s - λ) [B, T]
    (α = ``settings.alpha``, λ = ``threshold``, nats), so w >= 1 and w_min has no effect; w itself may overflow to inf,
    the log-space renormalisation stays finite.  Δ+ and Â unread.  α = 0 gives GRPO."""
    return settings.alpha * (s - threshold).clamp(min=0.0)


def sign_aware(s, shift_pos, adv, threshold, settings, eps=0.2, mix=0.5):
    """Spec §9.1, the direction ablation, in place of ``cscr.sensitivity_weights``, in RLSD's form (arXiv 2604.03128;
    ε_w = 0.2, mix = 0.5 as in the RLCSD repo's RLSD config): log w [B, T] of w = (1 - mix) + mix·clip(exp(sign(Â_i)·
    Δ+_t), 1 - ε_w, 1 + ε_w), trusting the direction of the c+ shift Δ+ [B, T] (nats) under Â [B] (s, λ, α unread).
    The clip is taken on the exponent (exp is monotone), so w >= 1 - mix·ε_w > 0; mix = 0 or ε_w = 0 gives GRPO.
    ``eps`` and ``mix`` are bound by ``choose`` (functools.partial)."""
    exponent = (torch.sign(adv)[:, None] * shift_pos).clamp(math.log1p(-eps), math.log1p(eps))  # sign(Â)·Δ+, clipped
    return torch.log((1.0 - mix) + mix * torch.exp(exponent))


def per_group(log_w, credited, num_generations):
    """One w̄ per group of ``num_generations`` contiguous rows (spec §5 "scope", §9.3 [I]), over the group's ``credited``
    tokens: ``cscr.per_sequence`` with each group's rows laid end to end.  Raises ValueError: num_generations does not
    divide B."""
    B = credited.shape[0]
    if not (isinstance(num_generations, int) and num_generations >= 1 and B % num_generations == 0):
        raise ValueError(f"the group scope needs num_generations, a positive int dividing B = {B}: {num_generations!r}")
    n = B // num_generations  # groups; reshape(n, -1) puts the tokens of one group in one row
    return cscr.per_sequence(log_w.reshape(n, -1), credited.reshape(n, -1)).reshape(credited.shape)


def per_batch(log_w, credited):
    """One w̄ for the whole batch (spec §9.3 [I]): ``per_group`` with one group."""
    return per_group(log_w, credited, credited.shape[0])


class Ablation(NamedTuple):
    """What ``choose`` picks once for a run: cscr.py's options and its functions, one step in an ablation's place."""

    settings: cscr.Settings  # α, w_min, the aggregation of Δ±, the map (the paper's weight step reads it)
    functions: cscr.CscrFunctions  # the weight step and the renormalisation


def choose(weight="exp", scope="sequence", num_generations=None, sign_eps=0.2, sign_mix=0.5, **settings) -> Ablation:
    """The ``Ablation`` of the names ``--cscr_weight`` and ``--cscr_scope`` take, with ``settings`` (alpha, w_min,
    mode): one of the spec's maps (``cscr.WEIGHT_MAPS``) in the paper's weight step, or an ablation above in that
    step's place, its parameters bound; the paper's renormalisation (``cscr.per_sequence``) or one above.  Called
    once, when a run starts.  Raises ValueError: an unknown name, sign_eps outside [0, 1) or sign_mix outside [0, 1]."""
    weights = {  # --cscr_weight: (the map of cscr.Settings, the weight step)
        "exp": ("exp", cscr.sensitivity_weights),
        "exp_abs": ("exp_abs", cscr.sensitivity_weights),
        "inverse": ("inverse", cscr.sensitivity_weights),
        "upweight": ("exp", upweight),
        "sign_aware": ("exp", functools.partial(sign_aware, eps=sign_eps, mix=sign_mix)),
    }
    scopes = {
        "sequence": cscr.per_sequence,
        "group": functools.partial(per_group, num_generations=num_generations),
        "batch": per_batch,
    }
    if weight not in weights or scope not in scopes:
        raise ValueError(
            f"weight must be one of {sorted(weights)} and scope one of {sorted(scopes)}, got {weight!r} and {scope!r}"
        )
    if not (0.0 <= sign_eps < 1.0 and 0.0 <= sign_mix <= 1.0):
        raise ValueError(f"sign_eps must be in [0, 1) and sign_mix in [0, 1], got {sign_eps!r} and {sign_mix!r}")
    weight_map, weight_step = weights[weight]
    functions = cscr.CscrFunctions(weights=weight_step, renormalise=scopes[scope])
    return Ablation(cscr.Settings(**settings, weight=weight_map), functions)


def ablation_from_flags(cfg) -> Ablation:
    """The CSCR options (grpo.py's and ``Flags``') as an ``Ablation``: α, w_min, the aggregation, and the weight
    step and renormalisation that ``--cscr_weight`` / ``--cscr_scope`` name (``choose``), once per run."""
    return choose(
        cfg.cscr_weight,
        cfg.cscr_scope,
        cfg.num_generations,
        cfg.cscr_sign_eps,
        cfg.cscr_sign_mix,
        alpha=cfg.cscr_alpha,
        w_min=cfg.cscr_w_min,
        mode=cfg.cscr_mode,
    )


class CscrAblationCredit(credit_methods.CscrCredit):
    """credit_methods.CscrCredit with the weight step and renormalisation that --cscr_weight / --cscr_scope name."""

    def __init__(self, cfg, tokenizer=None):
        super().__init__(cfg, tokenizer)
        self.ablation = ablation_from_flags(cfg)
        self.settings = self.ablation.settings  # α, w_min, the aggregation and the map the ablation runs with
        self.functions = self.ablation.functions  # CscrCredit passes them to cscr.py


# --- The flags, their checks and the choice (python -m comparisons) ----------------------------------------------
MORE_CHOICES = {
    "cscr_weight": {
        "upweight": "spec §9's ablation, the sensitive tokens up (comparisons/cscr_ablations.py)",
        "sign_aware": "spec §9's ablation, RLSD's direction weight (comparisons/cscr_ablations.py)",
    }
}


@dataclass
class Flags:
    cscr_scope: str = flag(
        "sequence", "CSCR renormalisation: per sequence (spec §5), group or batch (§9)", ["sequence", "group", "batch"]
    )
    cscr_sign_eps: float = flag(0.2, "--cscr_weight sign_aware: clip(exp(sign(Â)·Δ+), 1 ± ε)")
    cscr_sign_mix: float = flag(0.5, "--cscr_weight sign_aware: w = (1 − mix) + mix·clip(...)")


def checks(cfg) -> list[tuple[bool, str]]:
    ablation = cfg.cscr_weight in MORE_CHOICES["cscr_weight"] or cfg.cscr_scope != "sequence"
    return [
        (
            not 0 < cfg.cscr_sign_mix <= 1 or not 0 <= cfg.cscr_sign_eps < 1,
            "--cscr_sign_mix must be in (0, 1] and --cscr_sign_eps in [0, 1)",
        ),
        (ablation and cfg.credit != "cscr", "--cscr_weight upweight|sign_aware and --cscr_scope need --credit cscr"),
    ]


def replace(cfg, method):
    """``method`` with ``CscrAblationCredit`` under --credit cscr with an ablation's --cscr_weight or --cscr_scope."""
    if cfg.credit != "cscr" or (cfg.cscr_weight not in MORE_CHOICES["cscr_weight"] and cfg.cscr_scope == "sequence"):
        return method
    return method._replace(credit=CscrAblationCredit, label="cscr-ablation")
