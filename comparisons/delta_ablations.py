"""DelTA's ablations (docs/specs/baselines.md §6, "spec §6"; DelTA Sec. 5, App. F), beside delta.py, which holds the
paper's method alone. Each is a short function with the signature of the one part of DelTA's λ̄ it replaces (a field
of ``delta.DeltaFunctions``), passed through the ``functions`` argument of delta.py's ``delta_coefficients`` and
``delta_coefficients_chunked`` (delta.py names no ablation), so every ablation runs on the whole batch and on the
streamed one alike; a trainer chooses them once when the run starts (``functions_from_flags``, ``proxy_from_flags``:
the flags of ``python -m comparisons``, ``Flags``; ``DeltaAblationCredit``). Usage:

    functions = delta.DeltaFunctions(assignment=delta_ablations.hard_assignment)  # hard 0/1 α, the rest the paper's
    lam_bar = delta.delta_coefficients(v, adv, loss_mask, functions=functions).lam_bar

  field (DeltaFunctions)  the paper's (delta.py)   the ablation (here)
  score                   contrastive_margins      within_side_scores: Δ := −‖v − μ_own‖² (DelTA Q1)
  gamma                   adaptive_temperature     FrozenTemperature: γ± of the first batch (γ⁽⁰⁾), or given, kept
  assignment              soft_assignment          hard_assignment: α = 1[Δ > 0]
  coefficients            bounded_coefficients     raw_coefficients: λ = α*
  normalize               self_normalization       no_normalization: λ̄ := λ
  (the proxy)             proxy_vectors            topk_proxy_vectors: W_y − Σ_{top-K} p̃_j W_j (TopKProxy, a trainer's)
  (λ̄ itself)              delta_coefficients       random_coefficients: λ uniform in [λ_min, λ_max] (App. F's control)
"w/o refinement" is ``K=0`` and the λ range ``lam_min``/``lam_max``: arguments of ``delta.delta_coefficients``.
Left out: Q2's token selection (Sec. 5.2), a mask of the loss, not of λ̄: baselines.select_tokens.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from dataclasses import dataclass
from typing import Optional

import torch
from torch import Tensor

import delta
from trainer import credit_methods, distributed, policy
from trainer.grpo_config import flag


def within_side_scores(dist_pos: Tensor, dist_neg: Tensor, adv: Tensor) -> Tensor:
    """``score`` of the within-side ablation (spec §6 within_side): Δ := −‖v − μ_own‖², the own side's centroid only
    (μ₊ where Â > 0, μ₋ elsewhere), [b, T]; γ is that score's std on its side, lagged alike, K refinements kept."""
    return torch.where((adv > 0)[:, None], -dist_pos, -dist_neg)


def hard_assignment(margin: Tensor, gamma_pos: Tensor, gamma_neg: Tensor, adv: Tensor) -> Tensor:
    """``assign`` of the hard ablation (spec §6 hard; "removes the entropy regularizer"): α = 1[Δ > 0] (Δ = 0 -> 0) in
    the refinements and the final score, γ unused. A side with no token of Δ > 0 has weight 0 and keeps its centroid
    (delta.py's rule for a side of weight 0)."""
    return (margin > 0).to(margin.dtype)


class FrozenTemperature:
    """``gamma`` of "w/o adaptive γ" (spec §6 fixed_gamma, frozen_first_batch): ``gamma`` = (γ₊, γ₋) floats > 0
    used at every refinement of every batch; None: the first γ± measured (the first batch with both sides, its γ⁽⁰⁾)
    is kept from then on. A trainer keeps one per run (in its ``functions``) and saves ``gamma`` in its checkpoints."""

    def __init__(self, gamma: Optional[tuple] = None):
        try:
            ok = gamma is None or (len(gamma) == 2 and all(math.isfinite(float(g)) and float(g) > 0 for g in gamma))
        except (TypeError, ValueError):
            ok = False
        if not ok:
            raise ValueError(f"gamma must be None or a pair (gamma_pos, gamma_neg) of finite floats > 0, got {gamma!r}")
        self.gamma = None if gamma is None else tuple(float(g) for g in gamma)

    def __call__(self, margins_pos: delta.MarginSums, margins_neg: delta.MarginSums) -> tuple:
        # the sums of P's and Nn's margins -> (γ₊, γ₋) used, float64 0-dim: the kept ones (the first: measured)
        if self.gamma is None:
            self.gamma = tuple(float(g) for g in delta.adaptive_temperature(margins_pos, margins_neg))
        device = margins_pos.total.device
        return tuple(torch.tensor(g, dtype=torch.float64, device=device) for g in self.gamma)


def raw_coefficients(assign: Tensor, adv: Tensor, mask: Tensor, lam_min: float, lam_max: float) -> Tensor:
    """``coefficients`` of raw α (spec §6 raw_alpha): λ = α* in [0, 1], Â = 0 responses 0; lam_min, lam_max unused."""
    return delta.bounded_coefficients(assign, adv, mask, 0.0, 1.0)


def no_normalization(n_valid: Tensor, Z: Tensor) -> Tensor:
    """``normalize`` of no_lamnorm (spec §6): λ̄ := λ, scale 1 (DAPO's 1/N over the raw λ; Eq. 8 dropped)."""
    return torch.ones((), dtype=torch.float64, device=Z.device)


def random_coefficients(
    adv: Tensor,
    loss_mask: Tensor,
    lam_min: float = 0.8,
    lam_max: float = 1.2,
    u: Optional[Tensor] = None,
    generator: Optional[torch.Generator] = None,
    normalize: bool = True,
) -> Tensor:
    """The random-coefficient control (App. F "sampled randomly from the same bounded range … same coefficient
    normalization"; spec §6 random), in place of ``delta.delta_coefficients``' λ̄ (it needs no v): λ = λ_min + (λ_max −
    λ_min)·u, u ~ U(0, 1) per token, λ_min where Â = 0, 0 on padding, then λ̄ = λ·N/Z (``normalize``) and the one-side
    guard, as DelTA's. adv Â [B]; loss_mask [B, T]; u [B, T] in [0, 1] (tests), else drawn with ``generator``
    at every call. Returns λ̄ [B, T], float32 (float64 if Â or u is). Raises ValueError on bad shapes, a non-0/1
    mask, non-finite Â, u outside [0, 1], not 0 <= lam_min <= lam_max."""
    B, T = loss_mask.shape if loss_mask.dim() == 2 else (-1, -1)
    if B < 0 or tuple(adv.shape) != (B,):
        raise ValueError(f"adv must be [B] and loss_mask [B, T], got {tuple(adv.shape)}, {tuple(loss_mask.shape)}")
    if u is not None and tuple(u.shape) != (B, T):
        raise ValueError(f"u must be [B, T] = [{B}, {T}], got {tuple(u.shape)}")
    if not 0 <= lam_min <= lam_max < math.inf or lam_max <= 0:
        raise ValueError(f"need 0 <= lam_min <= lam_max (finite, > 0), got lam_min={lam_min}, lam_max={lam_max}")
    if not bool(torch.isfinite(adv).all()) or not bool(((loss_mask == 0) | (loss_mask == 1)).all()):
        raise ValueError("adv must be finite and loss_mask 0/1")
    dtype = torch.float64 if torch.float64 in (adv.dtype, getattr(u, "dtype", None)) else torch.float32
    with torch.no_grad():
        dev = loss_mask.device
        mask = (loss_mask != 0).to(dtype)  # [B, T]
        if u is None:
            u = torch.rand(mask.shape, generator=generator, dtype=dtype, device=generator.device if generator else dev)
        u = u.detach().to(device=dev, dtype=dtype)
        adv = adv.detach().to(device=dev, dtype=dtype)
        if not bool(((u >= 0) & (u <= 1))[mask > 0].all()):
            raise ValueError("u must lie in [0, 1] on valid tokens")
        if not (bool((mask * (adv > 0)[:, None]).any()) and bool((mask * (adv < 0)[:, None]).any())):
            return mask.clone()  # the guard (spec §6), as DelTA's
        lam = delta.bounded_coefficients(torch.where(mask > 0, u, 0.0), adv, mask, lam_min, lam_max)  # [B, T]
        if not normalize:
            return lam
        return lam * delta.self_normalization(mask.sum(dtype=torch.float64), lam.sum(dtype=torch.float64)).to(dtype)


def topk_proxy_vectors(
    hidden: Tensor, token_ids: Tensor, loss_mask: Tensor, lm_head_weight: Tensor, K: int, temperature: float = 1.0
) -> Tensor:
    """The top-K hidden-gradient proxy (App. F; spec §6 delta_topk_proxy) in place of ``delta.proxy_vectors``:
    v_t = W_{y_t} − Σ_{j ∈ top-K(z_t/T)} p̃_t(j)·W_j, an approximation of ∇_h log p(y_t) = W_{y_t} − Σ_j p_t(j)·W_j.

    z_t = h_t Wᵀ are the logits, p̃_t the softmax of z_t/T renormalised over the K largest (y_t need not be among
    them). K = V gives the exact ∇_h log p(y_t) (without T ≠ 1's 1/T, as ``proxy_vectors``). hidden: [B, T, H]
    LM-head inputs; token_ids: [B, T] sampled y_t; loss_mask: [B, T] bool or 0/1; lm_head_weight: W [V, H] (no
    bias); K in [1, V]; temperature T > 0 (the rollout's). Returns v [B, T, H], float32 (float64 if ``hidden`` or W
    is), detached, 0 on padding. Memory: W in the working dtype (V·H·4 B: 2.5 GB for Qwen3-8B), the output, and one
    block of valid tokens' logits and K gathered rows of W (``delta.ROW_BLOCK_BYTES``), never [B, T, V]. Raises
    ValueError on bad shapes, a non-0/1 mask, K not in [1, V], T not > 0, a token id outside [0, V)."""
    shape = tuple(getattr(hidden, "shape", ()))
    if len(shape) != 3 or tuple(token_ids.shape) != shape[:2] or tuple(loss_mask.shape) != shape[:2]:
        raise ValueError(
            f"hidden must be [B, T, H] and token_ids, loss_mask [B, T], got {shape}, "
            f"{tuple(token_ids.shape)}, {tuple(loss_mask.shape)}"
        )
    if not isinstance(lm_head_weight, Tensor) or lm_head_weight.dim() != 2 or lm_head_weight.shape[1] != shape[2]:
        raise ValueError(
            f"lm_head_weight must be a [V, H] tensor with H = {shape[2]}, got shape "
            f"{tuple(getattr(lm_head_weight, 'shape', ()))}"
        )
    V = lm_head_weight.shape[0]
    if isinstance(K, bool) or not isinstance(K, int) or not 1 <= K <= V:
        raise ValueError(f"K must be an int in [1, V] = [1, {V}], got {K!r}")
    if not (math.isfinite(float(temperature)) and float(temperature) > 0):
        raise ValueError(f"temperature must be finite and > 0, got {temperature!r}")
    if token_ids.dtype.is_floating_point or token_ids.dtype == torch.bool:
        raise ValueError(f"token_ids must be an integer tensor, got {token_ids.dtype}")
    if not bool(((loss_mask == 0) | (loss_mask == 1)).all()):
        raise ValueError("loss_mask must contain only 0/1 (or be bool)")
    dtype = torch.float64 if torch.float64 in (hidden.dtype, lm_head_weight.dtype) else torch.float32
    with torch.no_grad():
        b_idx, t_idx = (loss_mask != 0).to(hidden.device).nonzero(as_tuple=True)  # the valid tokens, [n] each
        ids = token_ids.to(hidden.device)[b_idx, t_idx]
        if ids.numel() and not bool(((ids >= 0) & (ids < V)).all()):
            raise ValueError(f"token_ids must lie in [0, V) = [0, {V}) on valid tokens")
        W = lm_head_weight.detach().to(device=hidden.device, dtype=dtype)  # [V, H]
        v = torch.zeros(hidden.shape, dtype=dtype, device=hidden.device)  # [B, T, H], +0.0 on padding
        # Tokens per block: their logits [n, V] and gathered rows [n, K, H] within delta.ROW_BLOCK_BYTES.
        n_blk = max(1, delta.ROW_BLOCK_BYTES // ((V + (K + 2) * W.shape[1]) * W.element_size()))
        for a in range(0, ids.numel(), n_blk):
            tokens = slice(a, a + n_blk)  # this block's valid tokens: rows b_idx, positions t_idx, ids y
            z = hidden[b_idx[tokens], t_idx[tokens]].detach().to(dtype) @ W.T  # [n, V] logits z_t = h_t Wᵀ
            top, j = (z / float(temperature)).topk(K, dim=-1)  # [n, K]: the K largest of z_t/T, their indices
            p = torch.softmax(top, dim=-1)  # [n, K] p̃_t, renormalised over the top K
            W_y = W[ids[tokens]]  # [n, H]
            v[b_idx[tokens], t_idx[tokens]] = W_y - torch.bmm(p[:, None, :], W[j]).squeeze(1)  # W_y − Σ_j p̃_j W_j
        return v


# A trainer's choice, once per run ----------------------------------------------------------------------------
class TopKProxy:
    """--delta_proxy topk as a trainer's proxy step: ``(hidden, old_logp, mask, token_ids, lm_head_weight) -> v``,
    computed where W lies, returned on ``hidden``'s device. Declares ``needs_lm_head`` (W [V, H], gathered)."""

    needs_lm_head = True

    def __init__(self, K: int, temperature: float):
        self.K = K
        self.temperature = temperature

    def __call__(self, hidden, old_logp, mask, token_ids, lm_head_weight):
        at = lm_head_weight.device
        return topk_proxy_vectors(
            hidden.to(at), token_ids.to(at), mask.to(at), lm_head_weight, self.K, self.temperature
        ).to(hidden.device)


def paper_proxy(hidden, old_logp, mask, token_ids=None, lm_head_weight=None):
    """DelTA's own proxy (``delta.proxy_vectors``, App. F) in a trainer's proxy-step signature; reads no LM head."""
    return delta.proxy_vectors(hidden, old_logp, mask)


# grpo.py's flag values -> (the DeltaFunctions field, the function in its place); any other value: the paper's
FLAG_FUNCTIONS = {
    ("delta_scores", "within_side"): ("score", within_side_scores),
    ("delta_assignment", "hard"): ("assignment", hard_assignment),
    ("delta_coefficients", "raw"): ("coefficients", raw_coefficients),
    ("delta_normalize", False): ("normalize", no_normalization),
}


def functions_from_flags(cfg) -> delta.DeltaFunctions:
    """DelTA's functions for the --delta_* ablation flags (``Flags``, ``python -m comparisons``), chosen once when
    the run starts: the paper's, each ablation flag's function in its place (``FLAG_FUNCTIONS``; --delta_gamma
    frozen: a fresh ``FrozenTemperature``)."""
    swaps = dict(field for (flag, value), field in FLAG_FUNCTIONS.items() if getattr(cfg, flag) == value)
    if cfg.delta_gamma == "frozen":
        swaps["gamma"] = FrozenTemperature()
    return delta.DeltaFunctions(**swaps)


def proxy_from_flags(cfg):
    """The proxy step for --delta_proxy (``python -m comparisons``): ``paper_proxy`` (hidden) or ``TopKProxy``
    (topk, with --delta_proxy_topk and the rollout's --temperature)."""
    return TopKProxy(cfg.delta_proxy_topk, cfg.temperature) if cfg.delta_proxy == "topk" else paper_proxy


def proxy_for(proxy, model, full_weight=lambda w: w):
    """``proxy`` (``proxy_from_flags``) bound to ``model``: ``(hidden, old_logp, mask, token_ids) -> v``. A proxy that
    declares ``needs_lm_head`` (--delta_proxy topk) gets the whole LM head W [V, H] once, via ``full_weight`` (the
    trainer's gather under FSDP2): V·H·4 bytes, 2.5 GB for Qwen3-8B."""
    if not getattr(proxy, "needs_lm_head", False):
        return proxy
    return functools.partial(proxy, lm_head_weight=full_weight(model.get_output_embeddings().weight))


def kept_gamma(functions: delta.DeltaFunctions):
    """--delta_gamma frozen's kept (γ₊, γ₋) of ``functions`` (``functions_from_flags``), which checkpoints save; else
    None."""
    return getattr(functions.gamma, "gamma", None)


def keep_gamma(functions: delta.DeltaFunctions, gamma) -> None:
    """--resume: give ``functions``' ``FrozenTemperature`` the (γ₊, γ₋) the run had frozen (None, or no such
    function: a no-op)."""
    if gamma and hasattr(functions.gamma, "gamma"):
        functions.gamma.gamma = tuple(gamma)


class DeltaAblationCredit(credit_methods.DeltaCredit):
    """credit_methods.DeltaCredit with the ablations of the --delta_* flags, chosen once (``functions_from_flags``,
    ``proxy_from_flags``; --delta_coefficients random: App. F's control, λ uniform in [λ_min, λ_max], no v, drawn
    from a generator seeded by (seed, step, process)). Its state: --delta_gamma frozen's γ±."""

    def __init__(self, cfg, tokenizer=None):
        super().__init__(cfg, tokenizer)
        self.functions = functions_from_flags(cfg)  # DeltaCredit passes them to delta.py
        self.chosen_proxy = proxy_from_flags(cfg)
        if cfg.delta_coefficients == "random":  # no v: no h_t
            self.asks = policy.Asked()

    def proxy(self, model):
        return proxy_for(self.chosen_proxy, model, distributed.full_weight)

    def lam_bar(self, model, x):
        cfg = self.cfg
        if cfg.delta_coefficients != "random":
            return super().lam_bar(model, x)
        draw = torch.Generator().manual_seed(cfg.seed * 1_000_003 + x.step * 101 + distributed.rank())
        lam_bar = random_coefficients(
            x.adv, x.loss_mask, cfg.delta_lam_min, cfg.delta_lam_max, generator=draw, normalize=cfg.delta_normalize
        )
        return lam_bar, {}

    def state_dict(self) -> dict:
        return {"delta_gamma": kept_gamma(self.functions)}

    def load_state_dict(self, state: dict) -> None:
        keep_gamma(self.functions, state.get("delta_gamma"))


# --- The flags, their checks and the choice (python -m comparisons) ----------------------------------------------
@dataclass
class Flags:
    delta_scores: str = flag(
        "contrastive",
        "DelTA margins: contrastive (Sec. 3.2) or within_side (−‖v − μ_own‖²)",
        ["contrastive", "within_side"],
    )
    delta_assignment: str = flag("soft", "DelTA assignment: soft α = σ(Δ/γ) or hard 1[Δ > 0]", ["soft", "hard"])
    delta_gamma: str = flag(
        "adaptive", "DelTA γ: adaptive (every batch) or frozen (the first batch's γ⁽⁰⁾, kept)", ["adaptive", "frozen"]
    )
    delta_coefficients: str = flag(
        "bounded",
        "DelTA λ: bounded λ_min + (λ_max − λ_min)·α, raw α, or random in the range",
        ["bounded", "raw", "random"],
    )
    delta_normalize: bool = flag(True, "DelTA λ̄ = λ·N/Σλ (--no-delta_normalize: λ̄ = λ)")
    delta_proxy: str = flag(
        "hidden",
        "DelTA proxy v: hidden ((1 − p)·h, App. F) or topk (W_y − Σ p̃ W_j over the old logits' top K)",
        ["hidden", "topk"],
    )
    delta_proxy_topk: int = flag(20, "K of --delta_proxy topk (K = vocabulary: the exact hidden-state gradient)")


def ablated(cfg) -> list[str]:
    """The DelTA ablation flags ``cfg`` sets away from the paper's (``Flags``' defaults)."""
    return [
        f.name for f in dataclasses.fields(Flags) if f.name != "delta_proxy_topk" and getattr(cfg, f.name) != f.default
    ]


def checks(cfg) -> list[tuple[bool, str]]:
    names = ", --".join(ablated(cfg))
    return [
        (cfg.delta_proxy_topk < 1, "--delta_proxy_topk must be >= 1"),
        (bool(names) and cfg.credit != "delta", f"--{names} change DelTA's steps: use them with --credit delta"),
    ]


def replace(cfg, method):
    """``method`` with ``DeltaAblationCredit`` where an ablation flag is set (and --credit delta)."""
    if cfg.credit != "delta" or not ablated(cfg):
        return method
    return method._replace(credit=DeltaAblationCredit, label="delta-ablation")
