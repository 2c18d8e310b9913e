"""DelTA: discriminative token credit assignment for RLVR (token coefficients λ̄).

Source: Kaiyi Zhang, Wei Wu, Yankai Lin, "DelTA: Discriminative Token Credit Assignment for
Reinforcement Learning from Verifiable Rewards", arXiv 2605.21467 (2026); official code RUCBM/DelTA
(verl-DelTA/verl/workers/actor/dp_actor.py, ``compute_log_prob_h``). Implementation spec:
shared/specs/delta.md (section numbers "spec §x" below refer to it).

What DelTA does, in one page
----------------------------
* Sec. 3.1 / App. C (discriminator view). At θ_old every PPO ratio is 1, so the DAPO token-mean update
  is Δθ ∝ Σ_{i,t} Â_i v_{i,t} with v_{i,t} = ∇_θ log π(o_{i,t}). Split by the sign of the advantage
  (Eq. 2–3): Δθ ∝ M₊ μ̄₊ − M₋ μ̄₋, where μ̄± are |Â|-weighted centroids of the token-gradient vectors of
  the positive / negative responses. To first order a token x moves by Δ log π(x) ∝ M₊ g_xᵀμ̄₊ − M₋ g_xᵀμ̄₋
  (Eq. 4): the update is an implicit *linear discriminator* between the two centroids. Tokens shared by
  both sides (formatting, problem entities) pull both centroids towards a common background, which
  blurs that discriminator.
* Remedy: re-weight tokens so the effective centroids are more contrastive. Each token gets a score
  from its own-side squared-distance margin
      Δ⁺ = ‖v − μ₋‖² − ‖v − μ₊‖²   (positive responses),   Δ⁻ = ‖v − μ₊‖² − ‖v − μ₋‖²   (negative),
  a soft assignment α = σ(Δ / γ) (Sec. 3.2; App. G: α is the closed-form maximiser of α·Δ + γ·H(α),
  H the binary entropy), with an adaptive temperature γ = population std of that side's margins.
  The centroids are refined K times with α-weighted (|Â|·α) centroids; the temperature is *lagged*
  (App. H): the temperature used at iteration k+1 is the std of the margins measured at the centroids
  of iteration k, so γ⁽¹⁾ ≡ γ⁽⁰⁾ and with K = 1 the final scores divide margins at μ⁽¹⁾ by a
  temperature measured at μ⁽⁰⁾. This matches paper and code exactly and is kept on purpose.
* Final coefficient: λ = λ_min + (λ_max − λ_min)·α* (responses with Â = 0 get λ_min), then one global
  self-normalisation λ̄ = λ · N / Z with N = #valid tokens and Z = Σλ, so mean(λ̄) = 1 over valid
  tokens. The token advantage Ã = Â·λ̄ goes into the unchanged DAPO/PPO token-mean loss; since λ̄ > 0
  every clip branch is the DAPO one and (1/N) Σ λ̄ ℓ = (1/Z) Σ λ ℓ, the self-normalised surrogate Eq. 8.
* App. F (last-layer proxy): v is not the full-parameter gradient but the gradient of log p(y_t) with
  respect to the sampled token's row of the LM head, v_t = (1 − p(y_t))·h_t, h_t = input of lm_head
  (post final norm) at the position that predicts token t. Stop-gradient everywhere.

API
---
proxy_vectors                  App. F proxy v = (1 − p)·h                              [B, T, H]
delta_coefficients             whole-batch λ̄ (spec §2.3 steps 0–6), optional stats      [B, T]
delta_coefficients_streaming   same λ̄ from micro-batches + sufficient statistics
                               (spec §2.5), optional data-parallel ``reduce_fn``        list of [b, T]
delta_token_advantages         Ã = Â·λ̄·mask (spec §2.3 step 7)                          [B, T]

Inferred / different from the official code (all deliberate, see spec §2.4, §6)
-------------------------------------------------------------------------------
1. Scope of the statistics. Centroids, γ, N and Z are pooled over *everything passed in* (all prompts
   of the rollout batch, not per group), as the code does. The official multi-GPU run keeps them per
   data-parallel rank (no all-reduce). ``delta_coefficients_streaming`` reproduces that without
   ``reduce_fn`` and gives the single-process statistics over the union of all ranks with
   ``reduce_fn`` = all-reduce(SUM).
2. One side empty (no valid token with Â > 0, or none with Â < 0): we return λ̄ ≡ 1 on valid tokens
   (plain DAPO), the guard suggested in spec §6. The official code has no guard: it scores the present
   side against a zero-vector centroid with γ = 1e-4. An all-zero-advantage batch gives λ̄ ≡ 1 either way.
3. Precision. v and the per-token maths run in float32 (float64 if v is float64); scalar statistics
   (margin moments for γ, N, Z) and all streaming accumulators are float64, which removes the
   cancellation of E[Δ²] − E[Δ]² over ~10⁷ tokens. The official code accumulates in v's dtype.
   1 − p is computed as −expm1(log p) (same value, exact near p → 1).
4. Distances. The whole-batch path uses ‖v − μ‖² directly (official "Normal"); the streaming path
   uses ‖v‖² − 2v·μ + ‖μ‖² clamped at 0 (official "Memory_efficient"). They agree to rounding.
5. Passes. The streaming path stores one float per token (the margins of pass 2, then λ), never v, so
   K = 0 needs 2 passes over the data and K ≥ 1 needs K + 3 (initial centroids; γ⁽⁰⁾; K refinements;
   final scores), the same count as the official Normal path (whose first pass also yields the old
   log-probs). Fewer is impossible for K ≥ 1: α⁽⁰⁾ needs γ⁽⁰⁾, a global statistic of margins at the
   global μ⁽⁰⁾, and μ⁽¹⁾ then needs v once more.
6. Dead code of the release (diagonal "LDA" variance overwritten by ones, ``pred``/top-20% mask,
   ``calculate_rhoed_adv``) is not reproduced; it does not affect training.
7. Temperature T ≠ 1: the exact row gradient is (1 − p)·h / T; the proxy omits 1/T like the code.
   λ̄ is invariant to a global scale of v (margins and γ scale alike) unless the 1e-8 floors bind.
"""

from __future__ import annotations

import math
from typing import Callable, Iterable, Optional, Sequence, Tuple, Union

import torch
from torch import Tensor

__all__ = [
    "proxy_vectors",
    "delta_coefficients",
    "delta_coefficients_streaming",
    "delta_token_advantages",
    "STAT_KEYS",
]

# Keys of the diagnostics dict returned with ``return_stats=True`` (all values are Python floats).
STAT_KEYS = (
    "delta/lam_pos_mean", "delta/lam_pos_std", "delta/lam_pos_min", "delta/lam_pos_max",
    "delta/lam_neg_mean", "delta/lam_neg_std", "delta/lam_neg_min", "delta/lam_neg_max",
    "delta/cos_mu",  # cos(μ₊⁽ᴷ⁾, μ₋⁽ᴷ⁾) of the final centroids
    "delta/mu_pos_norm", "delta/mu_neg_norm",  # ‖μ₊⁽ᴷ⁾‖, ‖μ₋⁽ᴷ⁾‖
    "delta/gamma_pos", "delta/gamma_neg",  # final (lagged) temperatures γ±⁽ᴷ⁾
    "delta/n_pos", "delta/n_neg", "delta/n_zero",  # valid tokens with Â > 0, Â < 0, Â = 0
    "delta/scale",  # N / Z, so that λ = λ̄ / scale (pre-normalisation λ in [λ_min, λ_max])
    "delta/fallback",  # 1.0 when the one-side-empty guard returned λ̄ ≡ 1, else 0.0
)

_NAN = float("nan")


# ----------------------------------------------------------------------------------------------------
# Small shared helpers
# ----------------------------------------------------------------------------------------------------
def _work_dtype(*tensors: Tensor) -> torch.dtype:
    """float64 if any input is float64 (unit tests), else float32 (bf16 hidden states are upcast)."""
    return torch.float64 if any(t.dtype == torch.float64 for t in tensors) else torch.float32


def _check_hparams(K, lam_min, lam_max, eps) -> None:
    if isinstance(K, bool) or not isinstance(K, int):
        raise ValueError(f"K must be an int >= 0, got {K!r}")
    if K < 0:
        raise ValueError(f"K must be >= 0, got {K}")
    lam_min, lam_max = float(lam_min), float(lam_max)
    if not (math.isfinite(lam_min) and math.isfinite(lam_max)):
        raise ValueError(f"lam_min/lam_max must be finite, got {lam_min}, {lam_max}")
    if lam_min < 0:
        raise ValueError(f"lam_min must be >= 0 (λ̄ > 0 keeps the sign of Â), got {lam_min}")
    if lam_min > lam_max:
        raise ValueError(f"lam_min must be <= lam_max, got lam_min={lam_min} > lam_max={lam_max}")
    if lam_max <= 0:
        raise ValueError(f"lam_max must be > 0, got {lam_max}")
    if not (float(eps) > 0):
        raise ValueError(f"eps must be > 0, got {eps!r}")


def _mask01(response_mask: Tensor, name: str = "response_mask") -> Tensor:
    """Bool or 0/1 float mask -> bool mask; anything else is a ValueError."""
    if response_mask.dtype == torch.bool:
        return response_mask
    if not bool(((response_mask == 0) | (response_mask == 1)).all()):
        raise ValueError(f"{name} must contain only 0/1 (or be bool)")
    return response_mask != 0


def _prepare(v: Tensor, advantages: Tensor, response_mask: Tensor, dtype: Optional[torch.dtype] = None,
             where: str = "") -> Tuple[Tensor, Tensor, Tensor]:
    """Validate one batch (or micro-batch) and return (v, Â, m) detached in the working dtype.

    v is zeroed on padding with ``where`` (not a multiply), so garbage / NaN in padded slots cannot leak
    into any sum. m is the float 0/1 response mask [B, T]; Â is [B].
    """
    if not isinstance(v, Tensor) or v.dim() != 3:
        raise ValueError(f"v{where} must be a [B, T, H] tensor, got shape {tuple(getattr(v, 'shape', ()))}")
    B, T, _ = v.shape
    if not isinstance(advantages, Tensor) or tuple(advantages.shape) != (B,):
        raise ValueError(f"advantages{where} must be a [B] = [{B}] tensor of sequence advantages, "
                         f"got shape {tuple(getattr(advantages, 'shape', ()))}")
    if not isinstance(response_mask, Tensor) or tuple(response_mask.shape) != (B, T):
        raise ValueError(f"response_mask{where} must be [B, T] = [{B}, {T}], "
                         f"got shape {tuple(getattr(response_mask, 'shape', ()))}")
    if not bool(torch.isfinite(advantages).all()):
        raise ValueError(f"advantages{where} must be finite")
    dtype = dtype or _work_dtype(v)
    mb = _mask01(response_mask, f"response_mask{where}").to(v.device)
    v = torch.where(mb[..., None], v.detach().to(dtype), torch.zeros((), dtype=dtype, device=v.device))
    return v, advantages.detach().to(device=v.device, dtype=dtype), mb.to(dtype)


def _gamma(s1: Tensor, s2: Tensor, count: Tensor, eps: float) -> Tensor:
    """Adaptive temperature (Sec. 3.2, App. H): population std of one side's margins.

    γ = sqrt(max(E[Δ²] − E[Δ]², ε)) with the token count clamped to >= 1 (official code). float64 in/out.
    """
    c = count.clamp(min=1.0)
    mean = s1 / c
    return torch.sqrt(torch.clamp(s2 / c - mean * mean, min=eps))


def _lam_range(alpha: Tensor, lam_min: float, lam_max: float) -> Tensor:
    # spec §2.3 step 5: bounded map λ = λ_min + (λ_max − λ_min)·α*
    return lam_min + (lam_max - lam_min) * alpha


def _cos_and_norms(mu_p: Tensor, mu_n: Tensor) -> Tuple[float, float, float]:
    a, b = mu_p.double(), mu_n.double()
    na, nb = float(a.norm()), float(b.norm())
    cos = float(a @ b) / (na * nb) if na > 0 and nb > 0 else _NAN
    return cos, na, nb


def _side_summary(s1: float, s2: float, n: float, lo: float, hi: float) -> Tuple[float, float, float, float]:
    """mean, population std, min, max from sums; NaN for an empty side."""
    if n <= 0:
        return _NAN, _NAN, _NAN, _NAN
    mean = s1 / n
    return mean, math.sqrt(max(s2 / n - mean * mean, 0.0)), lo, hi


def _stats(lam_sums, lam_minmax, cos_mu, mu_norms, gammas, counts, scale, fallback) -> dict:
    """Assemble the diagnostics dict (Python floats). lam_sums = (Σλ̄₊, Σλ̄₊², Σλ̄₋, Σλ̄₋²)."""
    n_pos, n_neg, n_zero = counts
    pos = _side_summary(lam_sums[0], lam_sums[1], n_pos, *lam_minmax[0])
    neg = _side_summary(lam_sums[2], lam_sums[3], n_neg, *lam_minmax[1])
    out = {}
    for side, vals in (("pos", pos), ("neg", neg)):
        for name, val in zip(("mean", "std", "min", "max"), vals):
            out[f"delta/lam_{side}_{name}"] = float(val)
    out["delta/cos_mu"] = float(cos_mu)
    out["delta/mu_pos_norm"], out["delta/mu_neg_norm"] = float(mu_norms[0]), float(mu_norms[1])
    out["delta/gamma_pos"], out["delta/gamma_neg"] = float(gammas[0]), float(gammas[1])
    out["delta/n_pos"], out["delta/n_neg"], out["delta/n_zero"] = float(n_pos), float(n_neg), float(n_zero)
    out["delta/scale"] = float(scale)
    out["delta/fallback"] = 1.0 if fallback else 0.0
    return out


def _local_minmax(lam_bar: Tensor, sel: Tensor) -> Tuple[float, float]:
    if not bool(sel.any()):
        return _NAN, _NAN
    x = lam_bar[sel]
    return float(x.min()), float(x.max())


# ----------------------------------------------------------------------------------------------------
# App. F: last-layer token-gradient proxy
# ----------------------------------------------------------------------------------------------------
def proxy_vectors(hidden: Tensor, token_logprobs: Tensor, response_mask: Tensor) -> Tensor:
    """Last-layer token-gradient proxy v_t = (1 − p(y_t)) · h_t (DelTA App. F; spec §2.2).

    v_t is ∂ log p(y_t) / ∂ W_lm_head[y_t], the gradient with respect to the *sampled* token's row of the
    LM-head matrix only (not the full (e_y − p) ⊗ h outer product); it needs only log p(y_t).

    Args:
        hidden: [B, T, H] input of ``lm_head`` (output of the final norm) at the position that *predicts*
            response token t, i.e. sequence positions [-T-1 : -1] of the full sequence.
        token_logprobs: [B, T] old log-probs (nats) of the sampled tokens, from the temperature-scaled
            logits. With temperature τ the exact row gradient is (1 − p)·h/τ; the 1/τ factor is omitted
            as in the paper's code (λ̄ is invariant to a global scale of v).
        response_mask: [B, T] bool or 0/1 float; padding positions get v = 0.

    Returns:
        [B, T, H] float32 (float64 if ``hidden`` or ``token_logprobs`` is float64), detached, zero on
        padding (garbage or NaN in padded slots is discarded, not multiplied).

    Raises:
        ValueError: on shape mismatch or a mask that is not 0/1.
    """
    if not isinstance(hidden, Tensor) or hidden.dim() != 3:
        raise ValueError(f"hidden must be a [B, T, H] tensor, got shape {tuple(getattr(hidden, 'shape', ()))}")
    B, T, _ = hidden.shape
    if not isinstance(token_logprobs, Tensor) or tuple(token_logprobs.shape) != (B, T):
        raise ValueError(f"token_logprobs must be [B, T] = [{B}, {T}], "
                         f"got shape {tuple(getattr(token_logprobs, 'shape', ()))}")
    if not isinstance(response_mask, Tensor) or tuple(response_mask.shape) != (B, T):
        raise ValueError(f"response_mask must be [B, T] = [{B}, {T}], "
                         f"got shape {tuple(getattr(response_mask, 'shape', ()))}")
    dtype = _work_dtype(hidden, token_logprobs)
    with torch.no_grad():
        mb = _mask01(response_mask).to(hidden.device)
        # App. F: 1 − p(y_t) = −expm1(log p(y_t)); exact even when p(y_t) → 1.
        one_minus_p = -torch.expm1(token_logprobs.detach().to(device=hidden.device, dtype=dtype))
        v = one_minus_p[..., None] * hidden.detach().to(dtype)
        return torch.where(mb[..., None], v, torch.zeros((), dtype=dtype, device=v.device))


# ----------------------------------------------------------------------------------------------------
# Sec. 3.2 / App. H: whole-batch coefficients (official "Normal" maths on a cached v)
# ----------------------------------------------------------------------------------------------------
def delta_coefficients(v: Tensor, advantages: Tensor, response_mask: Tensor, K: int = 1,
                       lam_min: float = 0.8, lam_max: float = 1.2, eps: float = 1e-8,
                       return_stats: bool = False) -> Union[Tensor, Tuple[Tensor, dict]]:
    """Normalised DelTA token coefficients λ̄ over a whole rollout batch (spec §2.3 steps 0–6).

    Statistics (centroids, temperatures, N, Z) are pooled over *all* valid tokens of all responses
    given (prompts pooled, not per group). Runs under ``torch.no_grad()``: λ̄ never carries a gradient,
    even if ``v`` requires one.

    Args:
        v: [B, T, H] token-gradient proxies (``proxy_vectors``). Padding values are ignored.
        advantages: [B] sequence advantages Â_i (e.g. GRPO). Â > 0: positive side, Â < 0: negative side,
            Â = 0: neither side (weight 0 in centroids and γ, λ = λ_min, but counted in N and Z).
        response_mask: [B, T] bool or 0/1 float.
        K: refinement iterations (paper default 1; K = 0 is the "w/o refinement" ablation).
        lam_min, lam_max: range of the pre-normalisation coefficient λ (default [0.8, 1.2]).
        eps: floor for centroid denominators, the γ variance and Z (default 1e-8).
        return_stats: also return the diagnostics dict (keys ``STAT_KEYS``, Python floats).

    Returns:
        λ̄ [B, T] in v's working dtype (float32, or float64 for float64 v): 0 on padding, mean 1 over
        valid tokens. If either side has no valid token (one side empty, or all Â = 0) it returns
        λ̄ ≡ 1 on valid tokens and 0 on padding (plain DAPO; spec §6 suggested guard; stats then have
        ``delta/fallback`` = 1 and NaN temperatures / centroid cosine).
        With ``return_stats``: (λ̄, stats).

    Raises:
        ValueError: bad shapes, non-0/1 mask, non-finite advantages, K not an int >= 0,
            lam_min > lam_max, lam_min < 0, eps <= 0.
    """
    _check_hparams(K, lam_min, lam_max, eps)
    lam_min, lam_max = float(lam_min), float(lam_max)
    with torch.no_grad():
        v, adv, m = _prepare(v, advantages, response_mask)

        # Sides (spec §2.3): P = {Â > 0, valid}, Nn = {Â < 0, valid}; Â = 0 responses belong to neither.
        pos = (adv > 0).to(v.dtype)[:, None] * m  # [B, T]
        neg = (adv < 0).to(v.dtype)[:, None] * m  # [B, T]
        n_valid = m.sum(dtype=torch.float64)
        n_pos, n_neg = pos.sum(dtype=torch.float64), neg.sum(dtype=torch.float64)
        counts = (float(n_pos), float(n_neg), float(n_valid - n_pos - n_neg))

        if counts[0] == 0 or counts[1] == 0:
            # Guard (spec §6): without both sides there is no discriminator; fall back to DAPO, λ̄ ≡ 1.
            lam_bar = m.clone()
            if not return_stats:
                return lam_bar
            stats = _stats((counts[0], counts[0], counts[1], counts[1]),
                           ((1.0, 1.0), (1.0, 1.0)), _NAN, (_NAN, _NAN), (_NAN, _NAN), counts, 1.0, True)
            return lam_bar, stats

        # Eq. 2–3: |Â|-weighted token masses of each side (wp0 = Â·mask on P, wn0 = |Â|·mask on Nn).
        wp0 = adv.clamp(min=0)[:, None] * m  # [B, T]
        wn0 = (-adv).clamp(min=0)[:, None] * m  # [B, T]

        def centroid(w: Tensor) -> Tensor:
            # Eq. 2–3 / App. D: weighted centroid μ = Σ w v / max(Σ w, ε) (weighted least-squares minimiser)
            return torch.einsum("bt,bth->h", w, v) / w.sum().clamp(min=eps)

        def margins(mu_p: Tensor, mu_n: Tensor) -> Tuple[Tensor, Tensor]:
            # Sec. 3.2: own-side squared-distance margins (plain squared Euclidean distance).
            # Δ⁺ = ‖v−μ₋‖² − ‖v−μ₊‖² on P; Δ⁻ = ‖v−μ₊‖² − ‖v−μ₋‖² on Nn. Equivalently
            # Δ⁺ = 2vᵀ(μ₊−μ₋) + ‖μ₋‖² − ‖μ₊‖²: the Eq. 4 linear discriminator plus an offset.
            d_p = (v - mu_p).pow(2).sum(-1)  # [B, T]
            d_n = (v - mu_n).pow(2).sum(-1)  # [B, T]
            return d_n - d_p, d_p - d_n

        def side_gamma(M: Tensor, S: Tensor) -> Tensor:
            # Sec. 3.2 / App. H: γ = population std of one side's margins (float64 moments).
            M64, S64 = M.double(), S.double()
            return _gamma((M64 * S64).sum(), (M64 * M64 * S64).sum(), S64.sum(), eps)

        # Step 0: initial centroids μ±⁽⁰⁾ (Eq. 2–3).
        mu_p, mu_n = centroid(wp0), centroid(wn0)
        # Step 2: temperatures γ±⁽⁰⁾ from the margins at μ⁽⁰⁾.
        Mp, Mn = margins(mu_p, mu_n)
        g_p, g_n = side_gamma(Mp, pos), side_gamma(Mn, neg)

        # Step 3: K refinements with LAGGED temperatures (App. H).
        for _ in range(K):
            Mp, Mn = margins(mu_p, mu_n)  # Δ⁽ᵏ⁾ at the current centroids μ⁽ᵏ⁾
            a_p, a_n = torch.sigmoid(Mp / g_p), torch.sigmoid(Mn / g_n)  # App. G: α = σ(Δ/γ)
            new_p, new_n = centroid(a_p * wp0 * pos), centroid(a_n * wn0 * neg)  # μ⁽ᵏ⁺¹⁾: |Â|·α weights
            g_p, g_n = side_gamma(Mp, pos), side_gamma(Mn, neg)  # γ⁽ᵏ⁺¹⁾ = std of Δ⁽ᵏ⁾ (pre-update: lagged)
            mu_p, mu_n = new_p, new_n

        # Step 4: final scores α* = σ(Δ⁽*⁾/γ⁽ᴷ⁾), margins at μ⁽ᴷ⁾, latest cached (lagged) temperature.
        Mp, Mn = margins(mu_p, mu_n)
        is_pos = (adv > 0).to(v.dtype)[:, None]
        is_neg = (adv < 0).to(v.dtype)[:, None]
        is_zero = (adv == 0).to(v.dtype)[:, None]
        # Step 5: λ in [λ_min, λ_max]; Â = 0 responses get λ_min; padding 0.
        lam = (_lam_range(torch.sigmoid(Mp / g_p), lam_min, lam_max) * is_pos
               + _lam_range(torch.sigmoid(Mn / g_n), lam_min, lam_max) * is_neg
               + lam_min * is_zero) * m
        # Step 6 / Eq. 8: one global self-normalisation λ̄ = λ·N/max(Z, ε), N counts Â = 0 tokens too.
        Z = lam.sum(dtype=torch.float64)
        scale = n_valid / Z.clamp(min=eps)
        lam_bar = lam * scale.to(lam.dtype)

        if not return_stats:
            return lam_bar
        lb64 = lam_bar.double()
        sums = (float((lb64 * pos).sum()), float((lb64 * lb64 * pos).sum()),
                float((lb64 * neg).sum()), float((lb64 * lb64 * neg).sum()))
        minmax = (_local_minmax(lam_bar, pos > 0), _local_minmax(lam_bar, neg > 0))
        cos, na, nb = _cos_and_norms(mu_p, mu_n)
        stats = _stats(sums, minmax, cos, (na, nb), (float(g_p), float(g_n)), counts, float(scale), False)
        return lam_bar, stats


# ----------------------------------------------------------------------------------------------------
# Spec §2.5: streaming over micro-batches with sufficient statistics (official "Memory_efficient")
# ----------------------------------------------------------------------------------------------------
Chunk = Tuple[Tensor, Tensor, Tensor]
Chunks = Union[Sequence[Chunk], Callable[[], Iterable[Chunk]]]


def delta_coefficients_streaming(chunks: Chunks, K: int = 1, lam_min: float = 0.8, lam_max: float = 1.2,
                                 eps: float = 1e-8, reduce_fn: Optional[Callable[[Tensor], Optional[Tensor]]] = None,
                                 return_stats: bool = False) -> Union[list, Tuple[list, dict]]:
    """DelTA λ̄ computed from micro-batches while keeping only sufficient statistics (spec §2.5).

    Gives the same λ̄ as ``delta_coefficients`` on the concatenation of the chunks (to rounding), but
    never holds more than one chunk's v. Kept across passes: the float64 sums Σw·v [H] and Σw per side
    (centroids, Eq. 2–3), ΣΔ, ΣΔ² per side (γ, App. H), token counts per side, Σλ (Z, Eq. 8), and one
    float per token (the pass-2 margins, then λ). Distances use ‖v−μ‖² = ‖v‖² − 2v·μ + ‖μ‖², clamped ≥ 0.

    Passes over ``chunks``: K = 0 -> 2; K >= 1 -> K + 3 (μ⁽⁰⁾; γ⁽⁰⁾; μ⁽¹⁾; K − 1 passes each giving
    μ⁽ᵏ⁺¹⁾ and γ⁽ᵏ⁺¹⁾; final λ). If a side is empty after pass 1, it stops there (λ̄ ≡ 1 guard).

    Args:
        chunks: a list/tuple of micro-batches ``(v [b, T, H], advantages [b], response_mask [b, T])``, or a
            zero-arg callable returning a fresh iterable of them on every call (so v can be recomputed by
            re-running forward passes instead of being stored). Every pass must yield the same chunks in
            the same order (same shapes, advantages and masks; T may differ between chunks). A one-shot
            iterator/generator object is rejected (it cannot be re-read).
        K, lam_min, lam_max, eps: as in ``delta_coefficients``.
        reduce_fn: optional; applied to every accumulated statistic tensor (one flat float64 tensor per
            pass, plus one for Z) before it is used, e.g. ``torch.distributed.all_reduce`` (in-place, may
            return None) or ``lambda t: dist.all_reduce(t) or t``. Every accumulator is a sum or a count,
            so all-reduce(SUM) on each data-parallel rank makes λ̄ equal to the single-process λ̄ over the
            union of the ranks' data. All ranks make the same sequence of calls (the one-side guard is
            decided on reduced counts). Without it the statistics are per process (official code).
        return_stats: also return the diagnostics dict (``STAT_KEYS``). With ``reduce_fn`` everything in
            it is global except ``lam_*_min`` / ``lam_*_max``, which are over this process's tokens.

    Returns:
        list of λ̄ [b, T] tensors, one per chunk, in float32 (float64 if the first chunk's v is float64);
        with ``return_stats``: (list, stats).

    Raises:
        ValueError: empty chunks, a one-shot iterator, inconsistent chunks between passes, or any error
            of ``delta_coefficients``.
    """
    _check_hparams(K, lam_min, lam_max, eps)
    lam_min, lam_max = float(lam_min), float(lam_max)
    if callable(chunks):
        get_chunks = chunks
    else:
        if iter(chunks) is chunks:
            raise ValueError("chunks must be a list/tuple or a zero-arg callable returning a fresh iterable; "
                             "a one-shot iterator cannot be read K + 3 times")
        get_chunks = lambda: chunks  # noqa: E731

    def reduce(t: Tensor) -> Tensor:
        if reduce_fn is None:
            return t
        out = reduce_fn(t)
        return t if out is None else out

    with torch.no_grad():
        # ---- Pass 1 (step 0): validate, cache Â and masks, accumulate centroid sums and counts ----
        advs, masks = [], []
        first = None
        for j, ch in enumerate(get_chunks()):
            if not (isinstance(ch, (tuple, list)) and len(ch) == 3):
                raise ValueError(f"chunks[{j}] must be a (v, advantages, response_mask) tuple")
            if first is None:
                first = ch[0]
                if not isinstance(first, Tensor) or first.dim() != 3:
                    raise ValueError("chunks[0][0] (v) must be a [b, T, H] tensor")
                dtype, device, H = _work_dtype(first), first.device, first.shape[-1]
                # acc = [Σ Â v (P) | Σ |Â| v (Nn) | Σ Â (P) | Σ |Â| (Nn) | n_pos | n_neg | n_valid]
                acc = torch.zeros(2 * H + 5, dtype=torch.float64, device=device)
            v, adv, m = _prepare(*ch, dtype=dtype, where=f" in chunks[{j}]")
            if v.shape[-1] != H:
                raise ValueError(f"v in chunks[{j}] has hidden size {v.shape[-1]}, expected {H}")
            advs.append(adv)
            masks.append(m)
            wp0 = (adv.clamp(min=0)[:, None] * m).flatten()
            wn0 = ((-adv).clamp(min=0)[:, None] * m).flatten()
            vf = v.flatten(0, 1)
            acc[:H] += (wp0 @ vf).double()  # Eq. 2–3 numerators as a [b·T] @ [b·T, H] matmul
            acc[H:2 * H] += (wn0 @ vf).double()
            acc[2 * H] += wp0.sum(dtype=torch.float64)
            acc[2 * H + 1] += wn0.sum(dtype=torch.float64)
            acc[2 * H + 2] += ((adv > 0).to(dtype)[:, None] * m).sum(dtype=torch.float64)
            acc[2 * H + 3] += ((adv < 0).to(dtype)[:, None] * m).sum(dtype=torch.float64)
            acc[2 * H + 4] += m.sum(dtype=torch.float64)
        if first is None:
            raise ValueError("chunks is empty: need at least one (v, advantages, response_mask) micro-batch")
        n_chunks = len(advs)
        acc = reduce(acc)
        n_pos, n_neg, n_valid = acc[2 * H + 2], acc[2 * H + 3], acc[2 * H + 4]
        counts = (float(n_pos), float(n_neg), float(n_valid - n_pos - n_neg))
        sides = [((a > 0)[:, None] & (mk > 0), (a < 0)[:, None] & (mk > 0)) for a, mk in zip(advs, masks)]

        if counts[0] == 0 or counts[1] == 0:
            # Guard (spec §6), decided on the reduced counts so every rank takes the same branch.
            out = [mk.clone() for mk in masks]
            if not return_stats:
                return out
            local = [(1.0, 1.0) if any(bool(sd[i].any()) for sd in sides) else (_NAN, _NAN) for i in (0, 1)]
            stats = _stats((counts[0], counts[0], counts[1], counts[1]), local,
                           _NAN, (_NAN, _NAN), (_NAN, _NAN), counts, 1.0, True)
            return out, stats

        def centroids_from(a: Tensor) -> Tuple[Tensor, Tensor]:
            # Eq. 2–3: μ = Σ w v / max(Σ w, ε), from the reduced sums.
            mu_p = a[:H] / a[2 * H].clamp(min=eps)
            mu_n = a[H:2 * H] / a[2 * H + 1].clamp(min=eps)
            return mu_p.to(dtype), mu_n.to(dtype)

        mu_p, mu_n = centroids_from(acc)

        def chunk_iter(pass_name: str):
            """Yield (j, v) for one more pass, checking the chunks are the same as in pass 1."""
            j = -1
            for j, ch in enumerate(get_chunks()):
                if j >= n_chunks:
                    break
                v, adv, m = _prepare(*ch, dtype=dtype, where=f" in chunks[{j}] ({pass_name})")
                if v.shape[-1] != H or not torch.equal(adv, advs[j]) or not torch.equal(m, masks[j]):
                    raise ValueError(f"chunks[{j}] changed between passes ({pass_name}): advantages, "
                                     "response_mask and shapes must be identical in every pass")
                yield j, v
            if j + 1 != n_chunks:
                raise ValueError(f"chunks yielded {j + 1} micro-batches in {pass_name}, expected {n_chunks}")

        def margins_of(v: Tensor, mu_p: Tensor, mu_n: Tensor) -> Tuple[Tensor, Tensor]:
            # Spec §2.5: ‖v−μ‖² = ‖v‖² − 2 v·μ + ‖μ‖², clamped at 0 (rounding), then the own-side margins.
            sq = (v * v).sum(-1)
            d_p = (sq - 2.0 * (v @ mu_p) + mu_p @ mu_p).clamp(min=0)
            d_n = (sq - 2.0 * (v @ mu_n) + mu_n @ mu_n).clamp(min=0)
            return d_n - d_p, d_p - d_n  # Δ⁺ (for P), Δ⁻ (for Nn)

        def moments(Mp: Tensor, Mn: Tensor, j: int) -> Tensor:
            # [ΣΔ⁺, ΣΔ⁺², ΣΔ⁻, ΣΔ⁻²] over this chunk's own-side tokens, float64 (γ sufficient statistics).
            p, n = sides[j]
            Mp64, Mn64 = Mp.double()[p], Mn.double()[n]
            return torch.stack([Mp64.sum(), (Mp64 * Mp64).sum(), Mn64.sum(), (Mn64 * Mn64).sum()])

        def gammas_from(mom: Tensor) -> Tuple[Tensor, Tensor]:
            return _gamma(mom[0], mom[1], n_pos, eps), _gamma(mom[2], mom[3], n_neg, eps)

        def refine_sums(v: Tensor, a_p: Tensor, a_n: Tensor, j: int) -> Tensor:
            # Centroid sums with soft weights |Â|·α on each side (Sec. 3.2 refinement step).
            adv, m = advs[j], masks[j]
            p, n = sides[j]
            wp = (a_p * adv.clamp(min=0)[:, None] * m * p).flatten()
            wn = (a_n * (-adv).clamp(min=0)[:, None] * m * n).flatten()
            vf = v.flatten(0, 1)
            return torch.cat([(wp @ vf).double(), (wn @ vf).double(),
                              wp.sum(dtype=torch.float64)[None], wn.sum(dtype=torch.float64)[None]])

        # ---- Pass 2 (step 2): margins at μ⁽⁰⁾ (kept, one float per token) and γ⁽⁰⁾ ----
        margins0 = [None] * n_chunks
        mom = torch.zeros(4, dtype=torch.float64, device=device)
        for j, v in chunk_iter("pass 2: gamma(0)"):
            Mp, Mn = margins_of(v, mu_p, mu_n)
            margins0[j] = Mp  # Δ⁻ = −Δ⁺, so one tensor suffices
            mom += moments(Mp, Mn, j)
        g_p, g_n = gammas_from(reduce(mom))

        if K == 0:
            final_margins = margins0  # K = 0: final scores use μ⁽⁰⁾, γ⁽⁰⁾; no further pass needed
        else:
            # ---- Pass 3 (refinement k = 0): α⁽⁰⁾ = σ(Δ⁽⁰⁾/γ⁽⁰⁾) from the kept margins; μ⁽¹⁾ ----
            acc = torch.zeros(2 * H + 2, dtype=torch.float64, device=device)
            for j, v in chunk_iter("pass 3: refinement 0"):
                Mp = margins0[j]
                acc += refine_sums(v, torch.sigmoid(Mp / g_p), torch.sigmoid(-Mp / g_n), j)
            mu_p, mu_n = centroids_from(reduce(acc))
            # Lagged temperature (App. H): γ⁽¹⁾ = std of Δ⁽⁰⁾ = γ⁽⁰⁾, nothing to recompute.
            del margins0

            # ---- Passes 4 … K+2 (refinements k = 1 … K−1): Δ⁽ᵏ⁾ at μ⁽ᵏ⁾ with γ⁽ᵏ⁾ known ----
            for k in range(1, K):
                acc = torch.zeros(2 * H + 6, dtype=torch.float64, device=device)
                for j, v in chunk_iter(f"pass {k + 3}: refinement {k}"):
                    Mp, Mn = margins_of(v, mu_p, mu_n)
                    acc[:2 * H + 2] += refine_sums(v, torch.sigmoid(Mp / g_p), torch.sigmoid(Mn / g_n), j)
                    acc[2 * H + 2:] += moments(Mp, Mn, j)
                acc = reduce(acc)
                mu_p, mu_n = centroids_from(acc[:2 * H + 2])
                g_p, g_n = gammas_from(acc[2 * H + 2:])  # γ⁽ᵏ⁺¹⁾ = std of Δ⁽ᵏ⁾ (lagged)

            # ---- Final pass (step 4): margins at μ⁽ᴷ⁾ ----
            final_margins = [None] * n_chunks
            for j, v in chunk_iter(f"pass {K + 3}: final scores"):
                final_margins[j] = margins_of(v, mu_p, mu_n)[0]

        # ---- Steps 4–6 from the kept per-token margins: α*, λ, then global N/Z ----
        lams = []
        zacc = torch.zeros(5, dtype=torch.float64, device=device)  # [Z, Σλ₊, Σλ₊², Σλ₋, Σλ₋²]
        for j, Mp in enumerate(final_margins):
            adv, m = advs[j], masks[j]
            p, n = sides[j]
            lam = (_lam_range(torch.sigmoid(Mp / g_p), lam_min, lam_max) * (adv > 0).to(dtype)[:, None]
                   + _lam_range(torch.sigmoid(-Mp / g_n), lam_min, lam_max) * (adv < 0).to(dtype)[:, None]
                   + lam_min * (adv == 0).to(dtype)[:, None]) * m
            lams.append(lam)
            l64 = lam.double()
            zacc += torch.stack([l64.sum(), l64[p].sum(), (l64[p] ** 2).sum(), l64[n].sum(), (l64[n] ** 2).sum()])
        zacc = reduce(zacc)
        scale = n_valid / zacc[0].clamp(min=eps)  # Eq. 8: λ̄ = λ·N/max(Z, ε)
        out = [lam * scale.to(dtype) for lam in lams]

        if not return_stats:
            return out
        s = float(scale)
        sums = (float(zacc[1]) * s, float(zacc[2]) * s * s, float(zacc[3]) * s, float(zacc[4]) * s * s)

        def side_minmax(idx: int) -> Tuple[float, float]:
            vals = [lb[sd[idx]] for lb, sd in zip(out, sides) if bool(sd[idx].any())]
            if not vals:
                return _NAN, _NAN
            x = torch.cat(vals)
            return float(x.min()), float(x.max())

        cos, na, nb = _cos_and_norms(mu_p, mu_n)
        stats = _stats(sums, (side_minmax(0), side_minmax(1)), cos, (na, nb), (float(g_p), float(g_n)),
                       counts, s, False)
        return out, stats


# ----------------------------------------------------------------------------------------------------
# Spec §2.3 step 7: token advantages for the unchanged DAPO/PPO loss
# ----------------------------------------------------------------------------------------------------
def delta_token_advantages(advantages: Tensor, lam_bar: Tensor, response_mask: Tensor) -> Tensor:
    """Token advantages Ã_{i,t} = Â_i · λ̄_{i,t} · mask_{i,t} (spec §2.3 step 7).

    Fed to the unchanged DAPO/PPO token-mean loss; since λ̄ > 0, sign(Ã) = sign(Â) and every (dual-)clip
    branch is DAPO's, so the loss equals the self-normalised surrogate Eq. 8.

    Args:
        advantages: [B] sequence advantages.
        lam_bar: [B, T] normalised coefficients (``delta_coefficients``), stop-gradient.
        response_mask: [B, T] bool or 0/1 float.

    Returns:
        [B, T] detached, in the promoted dtype of advantages and lam_bar; 0 on padding.

    Raises:
        ValueError: on shape mismatch or a mask that is not 0/1.
    """
    if not isinstance(lam_bar, Tensor) or lam_bar.dim() != 2:
        raise ValueError(f"lam_bar must be a [B, T] tensor, got shape {tuple(getattr(lam_bar, 'shape', ()))}")
    B, T = lam_bar.shape
    if not isinstance(advantages, Tensor) or tuple(advantages.shape) != (B,):
        raise ValueError(f"advantages must be a [B] = [{B}] tensor, got shape {tuple(getattr(advantages, 'shape', ()))}")
    if not isinstance(response_mask, Tensor) or tuple(response_mask.shape) != (B, T):
        raise ValueError(f"response_mask must be [B, T] = [{B}, {T}], got shape {tuple(getattr(response_mask, 'shape', ()))}")
    dtype = torch.promote_types(advantages.dtype, lam_bar.dtype)
    m = _mask01(response_mask).to(device=lam_bar.device, dtype=dtype)
    return (advantages.detach().to(device=lam_bar.device, dtype=dtype)[:, None] * lam_bar.detach().to(dtype) * m)
