"""DelTA: discriminative token credit assignment for RLVR (token coefficients λ̄).

Source: Kaiyi Zhang, Wei Wu, Yankai Lin, "DelTA: Discriminative Token Credit Assignment for Reinforcement Learning from
Verifiable Rewards", arXiv 2605.21467 (2026); official code RUCBM/DelTA (verl-DelTA/verl/workers/actor/dp_actor.py,
``compute_log_prob_h``). Spec: docs/specs/delta.md ("spec §x").

What DelTA does, in the order of the method (each formula's function in brackets; names as docs/glossary.md: Â ``adv``,
Ã ``token_adv``, α ``assign``, λ ``lam``, λ̄ ``lam_bar``)
* Discriminator view (Sec. 3.1, App. C). At θ_old every ratio is 1, so the DAPO token-mean update Δθ ∝ Σ Â_i v_{i,t}
  (v = ∇_θ log π(o_{i,t})) splits by the sign of Â into M₊μ̄₊ − M₋μ̄₋ (Eq. 2–3: advantage masses M± = Σ|Â|, μ̄± the
  |Â|-weighted centroids of v); a token x moves by M₊g_xᵀμ̄₊ − M₋g_xᵀμ̄₋ (Eq. 4), a linear discriminator blurred by
  tokens common to both sides (formatting, problem entities).
* Proxy (App. F) [``proxy_vectors``]: v_t = (1 − p(y_t))·h_t = ∂ log p(y_t)/∂(sampled token's LM-head row), h_t =
  lm_head input; the ablation's top-K hidden gradient v_t = W_{y_t} − Σ_{top-K} p̃_j W_j [``topk_proxy_vectors``].
* Remedy (Sec. 3.2) [``delta_coefficients``]: re-weight tokens so that the centroids become contrastive. Each token
  gets its own-side squared-distance margin Δ⁺ = ‖v − μ₋‖² − ‖v − μ₊‖² (positive responses) or Δ⁻ = −Δ⁺ (negative) and
  a soft assignment α = σ(Δ/γ) [``soft_assignment``] (App. G: the maximiser of α·Δ + γ·H(α)), γ = population std of
  that side's margins [``adaptive_temperature``]; the centroids are refined K times with weights |Â|·α, the temperature
  *lagged* (App. H: γ⁽ᵏ⁺¹⁾ is measured at μ⁽ᵏ⁾, so with K = 1 margins at μ⁽¹⁾ are divided by γ⁽⁰⁾; paper = code).
* Coefficient [``bounded_coefficients``, spec §2.3 step 5]: λ = λ_min + (λ_max − λ_min)·α* (λ_min for Â = 0), then
  λ̄ = λ·N/Z (N valid tokens, Z = Σλ). Ã = Â·λ̄ [``delta_token_advantages``] goes into the unchanged token-mean loss;
  (1/N) Σ λ̄ℓ = (1/Z) Σ λℓ (Eq. 8) holds exactly over the rollout batch where N and Z were computed, approximately
  over each of several mini-batches (as in the official code).

Inferred or different from the official code (spec §2.4, §6): (1) centroids, γ, N and Z are pooled over everything
passed in, as the code does per data-parallel rank; ``reduce_fn`` = all-reduce(SUM) pools the ranks instead. (2) One
side empty: λ̄ ≡ 1 on valid tokens (plain DAPO; the code has no guard, its λ̄ then lies in about [0.78, 1.24]).
(3) Per-token maths in float32 (float64 for float64 v), moments and streaming sums in float64; 1 − p = −expm1(log p).
(4) Distances ‖v − μ‖² a block of rows at a time (the code's "Normal"); streamed ‖v‖² − 2v·μ + ‖μ‖² clamped at 0
(its "Memory_efficient"), h of one micro-batch at a time over K + 3 passes (2 for K = 0): α⁽⁰⁾ needs γ⁽⁰⁾, a global
statistic at μ⁽⁰⁾, and μ⁽ᴷ⁾ is known only after the last refinement. (5) T ≠ 1: the proxy omits the exact gradient's
1/T, like the code (λ̄ is scale-invariant in v).
Ablations (baselines spec §6; the defaults are the paper's method): keywords of ``delta_coefficients`` and
``delta_coefficients_streaming`` (K, lam_min/lam_max, scores, assignment, gamma, coefficients, normalize; described
there), ``random_coefficients`` and ``topk_proxy_vectors``.
Left out on purpose: the forward pass and the PPO loss (the caller's, see the example); the ℓ2-centroid variant
(undefined, spec §6); the release's dead code (diagonal "LDA" variance overwritten by ones, ``pred`` / top-20% mask,
``calculate_rhoed_adv``). Read next: spec §2.3, §2.5, §6, §7 (worked example: tests/test_delta.py); grpo.py
``Credit._delta``. A batch whose h does not fit in memory: ``delta_coefficients_streaming``.

Example (any HF causal LM; tests/test_delta.py runs it on a tiny random Qwen3):
    import torch, delta
    # input_ids, attention_mask [B, P + T]: left-padded prompt + sampled response; response_mask [B, T]; adv Â [B]
    T = response_mask.shape[1]
    with torch.no_grad():  # θ_old's forward; positions count real tokens only, as generate() does
        out = model(input_ids=input_ids, attention_mask=attention_mask, output_hidden_states=True,
                    position_ids=(attention_mask.cumsum(-1) - 1).clamp(min=0))
    logits = out.logits[:, -T - 1:-1].float()  # [B, T, V]: the positions that predict the response tokens
    old_logp = logits.log_softmax(-1).gather(-1, input_ids[:, -T:, None]).squeeze(-1)  # ℓ0 [B, T] (temperature 1)
    hidden = out.hidden_states[-1][:, -T - 1:-1]  # [B, T, H] lm_head input (post-norm; or a pre-hook on lm_head)
    v = delta.proxy_vectors(hidden, old_logp, response_mask)  # App. F: v = (1 − p(y_t))·h_t, [B, T, H]
    lam_bar = delta.delta_coefficients(v, adv, response_mask)  # λ̄ [B, T], mean 1 over valid tokens
    token_adv = delta.delta_token_advantages(adv, lam_bar, response_mask)  # Ã = Â·λ̄ [B, T] -> your PPO loss
"""

from __future__ import annotations

import math
from collections import namedtuple
from typing import Callable, Iterable, Optional, Sequence, Tuple, Union

import torch
from torch import Tensor

__all__ = ["proxy_vectors", "topk_proxy_vectors", "delta_coefficients", "delta_coefficients_streaming",
           "random_coefficients", "delta_token_advantages", "adaptive_temperature", "soft_assignment",
           "bounded_coefficients", "STAT_KEYS"]

# ``return_stats``' keys (floats): λ̄ on each side; cosine and norms of μ±⁽ᴷ⁾; final temperatures γ±⁽ᴷ⁾ (``gamma=``'s
# if given); this batch's γ±⁽⁰⁾ (at μ⁽⁰⁾ always: what the fixed-γ ablation freezes); valid tokens with Â > 0, < 0, = 0;
# scale = N/Z (λ = λ̄/scale; 1 with ``normalize=False``); fallback = 1.0 when the one-side guard gave λ̄ ≡ 1.
STAT_KEYS = ("delta/lam_pos_mean", "delta/lam_pos_std", "delta/lam_pos_min", "delta/lam_pos_max",
             "delta/lam_neg_mean", "delta/lam_neg_std", "delta/lam_neg_min", "delta/lam_neg_max",
             "delta/cos_mu", "delta/mu_pos_norm", "delta/mu_neg_norm", "delta/gamma_pos", "delta/gamma_neg",
             "delta/gamma0_pos", "delta/gamma0_neg", "delta/n_pos", "delta/n_neg", "delta/n_zero", "delta/scale",
             "delta/fallback")
# The ablations' keyword values (baselines spec §6); the first of each is the paper's method.
SCORES, ASSIGNMENTS, COEFFICIENTS = ("contrastive", "within_side"), ("soft", "hard"), ("bounded", "raw")
_NAN = float("nan")


def proxy_vectors(hidden: Tensor, old_logp: Tensor, response_mask: Tensor) -> Tensor:
    """Last-layer token-gradient proxy v_t = (1 − p(y_t))·h_t = ∂ log p(y_t) / ∂ W_lm_head[y_t] (App. F): only the
    *sampled* token's row of the LM head (not the (e_y − p) ⊗ h outer product), so only log p(y_t) is needed.
    hidden: [B, T, H] input of ``lm_head`` (after the final norm) at the positions that *predict* the response
    tokens ([-T-1 : -1]); old_logp: [B, T] θ_old's log-probs (nats; the exact gradient's 1/τ omitted, as in the
    paper's code); response_mask: [B, T] bool or 0/1, padding gets v = 0. Returns [B, T, H] float32 (float64 if
    ``hidden`` or ``old_logp`` is), detached. Raises ValueError on bad shapes or a non-0/1 mask."""
    _check_shapes(hidden, "hidden", 3, None, old_logp, "old_logp", response_mask)
    dtype = _work_dtype(hidden, old_logp)
    with torch.no_grad():
        valid = _mask01(response_mask).to(hidden.device)
        # App. F: 1 − p(y_t) = −expm1(log p(y_t)); exact even when p(y_t) → 1.
        one_minus_p = -torch.expm1(old_logp.detach().to(device=hidden.device, dtype=dtype))  # [B, T]
        v = one_minus_p[..., None] * hidden.detach().to(dtype)  # [B, T, H], the one this allocates
        return v.masked_fill_(~valid[..., None], 0.0)  # in place: +0.0 on padding (NaN there cannot leak)


def topk_proxy_vectors(hidden: Tensor, token_ids: Tensor, response_mask: Tensor, lm_head_weight: Tensor, K: int,
                       temperature: float = 1.0) -> Tensor:
    """Top-K hidden-gradient proxy v_t = W_{y_t} − Σ_{j ∈ top-K(z_t/T)} p̃_t(j)·W_j (App. F; baselines spec §6
    ``delta_topk_proxy``), an approximation of ∇_h log p(y_t) = W_{y_t} − Σ_j p_t(j)·W_j.

    z_t = h_t Wᵀ are the logits, p̃_t the softmax of z_t/T renormalised over the K largest (y_t need not be among
    them). K = V gives the exact ∇_h log p(y_t) (without T ≠ 1's 1/T, as ``proxy_vectors``). hidden: [B, T, H]
    LM-head inputs; token_ids: [B, T] sampled y_t; response_mask: [B, T] bool or 0/1; lm_head_weight: W [V, H] (no
    bias); K in [1, V]; temperature T > 0 (the rollout's). Returns v [B, T, H], float32 (float64 if ``hidden`` or W
    is), detached, 0 on padding. Memory: W in the working dtype (V·H·4 B: 2.5 GB for Qwen3-8B), the output, and one
    block of valid tokens' logits and K gathered rows of W (``ROW_BLOCK_BYTES``), never [B, T, V]. Raises
    ValueError on bad shapes, a non-0/1 mask, K not in [1, V], T not > 0, a token id outside [0, V).
    """
    _check_shapes(hidden, "hidden", 3, None, token_ids, "token_ids", response_mask)
    if not isinstance(lm_head_weight, Tensor) or lm_head_weight.shape[1:] != hidden.shape[-1:]:  # W [V, H]
        raise ValueError(f"lm_head_weight must be a [V, H] tensor with H = {hidden.shape[-1]}, got shape "
                         f"{tuple(getattr(lm_head_weight, 'shape', ()))}")
    V = lm_head_weight.shape[0]
    if isinstance(K, bool) or not isinstance(K, int) or not 1 <= K <= V:
        raise ValueError(f"K must be an int in [1, V] = [1, {V}], got {K!r}")
    if not (math.isfinite(float(temperature)) and float(temperature) > 0):
        raise ValueError(f"temperature must be finite and > 0, got {temperature!r}")
    if token_ids.dtype.is_floating_point or token_ids.dtype == torch.bool:
        raise ValueError(f"token_ids must be an integer tensor, got {token_ids.dtype}")
    dtype = _work_dtype(hidden, lm_head_weight)
    with torch.no_grad():
        b_idx, t_idx = _mask01(response_mask).to(hidden.device).nonzero(as_tuple=True)  # the valid tokens, [n] each
        ids = token_ids.to(hidden.device)[b_idx, t_idx]
        if ids.numel() and not bool(((ids >= 0) & (ids < V)).all()):
            raise ValueError(f"token_ids must lie in [0, V) = [0, {V}) on valid tokens")
        W = lm_head_weight.detach().to(device=hidden.device, dtype=dtype)  # [V, H]
        v = torch.zeros(hidden.shape, dtype=dtype, device=hidden.device)  # [B, T, H], +0.0 on padding
        # Tokens per block: their logits [n, V] and gathered rows [n, K, H] within ROW_BLOCK_BYTES.
        n_blk = max(1, ROW_BLOCK_BYTES // ((V + (K + 2) * W.shape[1]) * W.element_size()))
        for a in range(0, ids.numel(), n_blk):
            b, t, y = b_idx[a:a + n_blk], t_idx[a:a + n_blk], ids[a:a + n_blk]
            z = hidden[b, t].detach().to(dtype) @ W.T  # [n, V] logits z_t = h_t Wᵀ
            top, j = (z / float(temperature)).topk(K, dim=-1)  # [n, K]: the K largest of z_t/T, their indices
            p = torch.softmax(top, dim=-1)  # [n, K] p̃_t, renormalised over the top K
            v[b, t] = W[y] - torch.bmm(p[:, None, :], W[j]).squeeze(1)  # W_y − Σ_j p̃_j W_j, [n, H]
        return v


# Maths shared by both paths ------------------------------------------------------------------------------
def adaptive_temperature(sum_margin: Tensor, sum_margin2: Tensor, count: Tensor, eps: float) -> Tensor:
    """γ of one side (Sec. 3.2, App. H): the population std of its margins, sqrt(max(E[Δ²] − E[Δ]², ε)), from the
    sums Σ Δ, Σ Δ² over its ``count`` valid tokens (0-dim tensors; count clamped at 1). Same units as Δ."""
    n = count.clamp(min=1.0)
    mean = sum_margin / n
    return torch.sqrt(torch.clamp(sum_margin2 / n - mean * mean, min=eps))


def soft_assignment(margin_pos, margin_neg, gamma_pos, gamma_neg, adv: Tensor) -> Tensor:
    """α = σ(Δ/γ) (App. G; Eq. 7's soft assignment) with each token's own side's margin and temperature: Δ⁺/γ₊ on
    responses with Â > 0, Δ⁻/γ₋ otherwise. margins ``[b, T]``, γ 0-dim, ``adv`` Â ``[b]``; returns ``[b, T]`` in
    (0, 1) (the caller masks Â = 0 rows and padding)."""
    return torch.where((adv > 0)[:, None], torch.sigmoid(margin_pos / gamma_pos),
                       torch.sigmoid(margin_neg / gamma_neg))


def bounded_coefficients(assign: Tensor, adv: Tensor, mask: Tensor, lam_min: float, lam_max: float) -> Tensor:
    """λ = λ_min + (λ_max − λ_min)·α (spec §2.3 step 5; Sec. 3.2): ``assign`` α ``[b, T]``, ``adv`` Â ``[b]``,
    float 0/1 ``mask`` ``[b, T]``; responses with Â = 0 get λ_min, padding 0. Returns λ ``[b, T]`` (before the
    normalisation λ̄ = λ·N/Σλ)."""
    return torch.where((adv == 0)[:, None], lam_min, lam_min + (lam_max - lam_min) * assign) * mask


def _assign(margin_pos: Tensor, margin_neg: Tensor, gamma_pos, gamma_neg, adv: Tensor, assignment: str) -> Tensor:
    # α [b, T] from each token's own side's score: σ(Δ/γ) (App. G) or the hard ablation 1[Δ > 0] (baselines spec §6).
    if assignment == "hard":
        return torch.where((adv > 0)[:, None], margin_pos > 0, margin_neg > 0).to(margin_pos.dtype)
    return soft_assignment(margin_pos, margin_neg, gamma_pos, gamma_neg, adv)


def random_coefficients(adv: Tensor, response_mask: Tensor, lam_min: float = 0.8, lam_max: float = 1.2,
                        u: Optional[Tensor] = None, generator: Optional[torch.Generator] = None,
                        normalize: bool = True) -> Tensor:
    """The random-coefficient control (App. F "sampled randomly from the same bounded range … same coefficient
    normalization"; baselines spec §6 ``random``): λ = λ_min + (λ_max − λ_min)·u, u ~ U(0, 1) per token, λ_min
    where Â = 0, 0 on padding, then λ̄ = λ·N/Z, the guard and ``normalize`` as in ``delta_coefficients``. Needs no v.
    adv: Â [B]; response_mask: [B, T]; u: [B, T] in [0, 1] (tests), else ``torch.rand(B, T, generator=generator)``
    (drawn at every call, guard or not). Returns λ̄ [B, T], float32 (float64 if Â or u is), 0 on padding. Raises
    ValueError on bad shapes, a non-0/1 mask, non-finite Â, u outside [0, 1], or bad lam_min/lam_max.
    """
    lam_min, lam_max, _ = _check_args(0, lam_min, lam_max, 1e-8)
    _check_shapes(response_mask, "response_mask", 2, adv, u, "u" if u is not None else None, response_mask)
    if not bool(torch.isfinite(adv).all()):
        raise ValueError("adv must be finite")
    dtype = _work_dtype(adv, *([u] if u is not None else []))
    with torch.no_grad():
        dev = response_mask.device
        mask = _mask01(response_mask).to(dtype)  # [B, T]
        u = torch.rand(mask.shape, generator=generator, dtype=dtype, device=generator.device if generator else dev) \
            if u is None else u  # [B, T]
        u = u.detach().to(device=dev, dtype=dtype)
        if not bool(((u >= 0) & (u <= 1))[mask > 0].all()):
            raise ValueError("u must lie in [0, 1] on valid tokens")
        adv = adv.detach().to(device=dev, dtype=dtype)  # [B]
        if not (bool((mask * (adv > 0)[:, None]).any()) and bool((mask * (adv < 0)[:, None]).any())):
            return mask.clone()  # guard (spec §6), as delta_coefficients
        lam = bounded_coefficients(torch.where(mask > 0, u, 0.0), adv, mask, lam_min, lam_max)  # [B, T]
        if not normalize:
            return lam
        return lam * (mask.sum(dtype=torch.float64) / lam.sum(dtype=torch.float64).clamp(min=1e-8)).to(dtype)


def delta_coefficients(v: Tensor, adv: Tensor, response_mask: Tensor, K: int = 1,
                       lam_min: float = 0.8, lam_max: float = 1.2, eps: float = 1e-8,
                       return_stats: bool = False, *, scores: str = "contrastive", assignment: str = "soft",
                       gamma: Optional[Tuple[float, float]] = None, coefficients: str = "bounded",
                       normalize: bool = True) -> Union[Tensor, Tuple[Tensor, dict]]:
    """Normalised DelTA token coefficients λ̄ over a whole rollout batch (spec §2.3 steps 0–6), no gradient; the
    statistics (centroids, γ, N, Z) are pooled over all valid tokens given (prompts pooled, not per group).
    Args (``delta_coefficients_streaming`` takes the same from K on, for the same λ̄):
        v: [B, T, H] token-gradient proxies (``proxy_vectors`` or ``topk_proxy_vectors``); padding ignored.
        adv: [B] sequence advantages Â_i. Â > 0: positive side P, Â < 0: negative side Nn, Â = 0:
            neither (weight 0 in centroids and γ, λ = λ_min, but counted in N and Z).
        response_mask: [B, T] bool or 0/1 float. K: refinement iterations (paper default 1; K = 0 is the
            "w/o refinement" ablation). lam_min, lam_max: range of λ. eps: floor of centroid denominators,
            γ variance and Z. return_stats: also return the diagnostics dict (``STAT_KEYS``).
        Ablations (baselines spec §6; keyword-only, each changes one step; the defaults are the paper's method):
        scores: "contrastive" (Sec. 3.2 margin Δ⁺ = ‖v − μ₋‖² − ‖v − μ₊‖², Δ⁻ = −Δ⁺) or "within_side"
            (Δ := −‖v − μ_own‖², the own side's centroid only; γ the std of that score on its side, lagged
            alike; the K refinements kept). Units: squared units of v.
        assignment: "soft" (α = σ(Δ/γ), App. G) or "hard" (α = 1[Δ > 0], Δ = 0 -> 0, in the refinements and
            the final score; γ unused; a side with no token of Δ > 0 keeps its centroid μ⁽ᵏ⁾).
        gamma: None (adaptive, lagged γ±, App. H) or a pair (γ₊, γ₋) of floats > 0 used at every k instead
            (the fixed-γ ablation: a trainer passes the first batch's ``delta/gamma0_*`` on later steps; this
            batch's own γ⁽⁰⁾ at K = 1 gives the default λ̄ bit for bit, since the lag makes γ⁽¹⁾ = γ⁽⁰⁾).
        coefficients: "bounded" (λ = λ_min + (λ_max − λ_min)·α*) or "raw" (λ = α*, Â = 0 tokens 0; lam_min and
            lam_max unused). normalize: True (λ̄ = λ·N/Z, Eq. 8) or False (λ̄ := λ, DAPO's 1/N: "no_lamnorm").
    Returns: λ̄ [B, T], float32 (float64 for float64 v), 0 on padding, mean 1 over valid tokens (unless
        ``normalize=False``); ≡ 1 on valid tokens if a side has no valid token (spec §6 guard, every variant,
        ``delta/fallback`` = 1). Or (λ̄, stats).
    Raises: ValueError: bad shapes, non-0/1 mask, non-finite Â, K not an int >= 0, lam_min > lam_max or < 0,
        eps <= 0, an unknown ablation value, gamma not a pair of finite floats > 0. Memory: beside v, one row block
        of v − μ (``ROW_BLOCK_BYTES``) and [B, T] tensors; v is copied once, masked, unless +0.0 on padding.
    """
    lam_min, lam_max, fixed_gamma = _check_args(K, lam_min, lam_max, eps, scores, assignment, gamma, coefficients,
                                                normalize)
    with torch.no_grad():
        v, adv, mask = _prepare(v, adv, response_mask)  # v itself, or a masked copy (padding not +0.0)
        # Sides (spec §2.3): P = {Â > 0, valid}, Nn = {Â < 0, valid}; Â = 0 responses belong to neither.
        pos, neg = (adv > 0).to(v.dtype)[:, None] * mask, (adv < 0).to(v.dtype)[:, None] * mask  # [B, T]
        if not (pos.any() and neg.any()):  # guard (spec §6): no discriminator without both sides
            lam_bar = mask.clone()
            return (lam_bar, _batch_stats(lam_bar, pos, neg, mask, 1.0)) if return_stats else lam_bar
        # Eq. 2–3 token weights |Â| on each side; summed, they are the advantage masses M₊, M₋.
        w_pos, w_neg = adv.clamp(min=0)[:, None] * mask, (-adv).clamp(min=0)[:, None] * mask  # [B, T]

        def centroid(w: Tensor, mu_old: Optional[Tensor] = None) -> Tensor:  # Eq. 2–3 / App. D: Σ w·v / max(Σ w, ε)
            if assignment == "hard" and mu_old is not None and not bool(w.sum() > 0):
                return mu_old  # hard guard (baselines spec §6): no token with Δ > 0 on this side keeps μ⁽ᵏ⁾
            return torch.einsum("bt,bth->h", w, v) / w.sum().clamp(min=eps)  # [H]

        block = _row_block(v)  # [rows, T, H]: v − μ of one block of rows (16 MiB), for every margin below

        def margins(mu_pos: Tensor, mu_neg: Tensor) -> Tuple[Tensor, Tensor]:
            # Sec. 3.2: own-side squared-distance margins, [B, T] each. Δ⁺ = 2vᵀ(μ₊ − μ₋) + ‖μ₋‖² − ‖μ₊‖²: the
            # Eq. 4 linear discriminator plus an offset. ‖v − μ‖² a block of rows at a time (_squared_distances).
            d_pos, d_neg = _squared_distances(v, mu_pos, block), _squared_distances(v, mu_neg, block)
            # (read on P, read on Nn): Δ⁺, Δ⁻; the within_side ablation −‖v − μ_own‖² on each side
            return (-d_pos, -d_neg) if scores == "within_side" else (d_neg - d_pos, d_pos - d_neg)

        def temperature(margin: Tensor, side: Tensor) -> Tensor:  # γ of one side from float64 moments
            m64, s64 = margin.double(), side.double()
            return adaptive_temperature((m64 * s64).sum(), (m64 * m64 * s64).sum(), s64.sum(), eps)

        mu_pos, mu_neg = centroid(w_pos), centroid(w_neg)  # step 0: μ±⁽⁰⁾ = Σ |Â|·v / M±, [H] each
        margin_pos, margin_neg = margins(mu_pos, mu_neg)  # step 1: Δ±⁽⁰⁾ at μ⁽⁰⁾, [B, T] each
        # Step 2: adaptive temperatures γ±⁽⁰⁾ = std of each side's margins (reported; replaced by ``gamma``).
        gamma0 = temperature(margin_pos, pos), temperature(margin_neg, neg)
        gamma_pos, gamma_neg = gamma0 if fixed_gamma is None else fixed_gamma
        for _ in range(K):  # step 3: K refinements (k = 0 … K−1)
            assign = _assign(margin_pos, margin_neg, gamma_pos, gamma_neg, adv, assignment)  # α⁽ᵏ⁾ = σ(Δ⁽ᵏ⁾/γ⁽ᵏ⁾)
            mu_pos, mu_neg = centroid(assign * w_pos, mu_pos), centroid(assign * w_neg, mu_neg)  # weights |Â|·α⁽ᵏ⁾
            if fixed_gamma is None:  # lagged (App. H): γ⁽ᵏ⁺¹⁾ = std of the same Δ⁽ᵏ⁾; γ⁽¹⁾ = γ⁽⁰⁾
                gamma_pos, gamma_neg = temperature(margin_pos, pos), temperature(margin_neg, neg)
            margin_pos, margin_neg = margins(mu_pos, mu_neg)  # Δ⁽ᵏ⁺¹⁾ at μ⁽ᵏ⁺¹⁾
        # Step 4: final scores α* = σ(Δ/γ⁽ᴷ⁾), margins at μ⁽ᴷ⁾ and the latest (lagged) temperatures, [B, T].
        assign = _assign(margin_pos, margin_neg, gamma_pos, gamma_neg, adv, assignment)
        # Step 5: λ = λ_min + (λ_max − λ_min)·α*; Â = 0 responses get λ_min; padding 0 ("raw": [0, 1], so λ = α*).
        lam = bounded_coefficients(assign, adv, mask, *((0.0, 1.0) if coefficients == "raw" else (lam_min, lam_max)))
        # Step 6 / Eq. 8: one global self-normalisation λ̄ = λ·N/max(Z, ε); N counts Â = 0 tokens too.
        N, Z = mask.sum(dtype=torch.float64), lam.sum(dtype=torch.float64)
        scale = N / Z.clamp(min=eps) if normalize else torch.ones((), dtype=torch.float64)  # "no_lamnorm": λ̄ := λ
        lam_bar = lam * scale.to(lam.dtype) if normalize else lam
        return (lam_bar, _batch_stats(lam_bar, pos, neg, mask, float(scale), (mu_pos, mu_neg), (gamma_pos, gamma_neg),
                                      gamma0)) if return_stats else lam_bar


Chunk = Tuple[Tensor, Optional[Tensor], Tensor, Tensor]  # hidden or v [b, T, H], old_logp [b, T] or None, mask, Â
Chunks = Union[Sequence[Chunk], Callable[[], Iterable[Chunk]]]


def delta_coefficients_streaming(chunks: Chunks, K: int = 1, lam_min: float = 0.8, lam_max: float = 1.2,
                                 eps: float = 1e-8, reduce_fn: Optional[Callable[[Tensor], Optional[Tensor]]] = None,
                                 return_stats: bool = False, *, scores: str = "contrastive", assignment: str = "soft",
                                 gamma: Optional[Tuple[float, float]] = None, coefficients: str = "bounded",
                                 normalize: bool = True) -> Union[list, Tuple[list, dict]]:
    """The λ̄ of ``delta_coefficients(proxy_vectors(h, log p, mask), Â, mask)`` on the concatenated chunks (to
    rounding) from micro-batches of LM-head inputs (spec §2.5; the header's inferred choice 4), holding one chunk's
    h and v at a time and otherwise float64 sums ([H] vectors) and per token Â's side, the margin and λ: at the
    papers' 2,048 responses × 4,096 tokens about 0.1 GB, where the batch's h in float32 is 137 GB (H = 4,096).
    ``chunks``: a list of ``Chunk`` (hidden [b, T, H], old_logp [b, T], response_mask [b, T], adv [b]), or a
    zero-arg callable returning a fresh iterable of them, e.g. re-running θ_old's eval-mode forward::

        def micro_batches():  # called K + 3 times (2 for K = 0); the same rows in the same order every time
            for ids, att, mask, adv, old_logp in my_micro_batches:  # old_logp: stored with the rollout
                yield lm_head_inputs(model, ids, att), old_logp, mask, adv  # h [b, T, H], ℓ0 [b, T], [b, T], Â [b]
        lam_bars = delta.delta_coefficients_streaming(micro_batches)  # one λ̄ [b, T_j] per micro-batch, in order

    T may differ between chunks, h by rounding, not more; old_logp = None in every chunk: ``hidden`` is v itself
    (e.g. ``topk_proxy_vectors`` of the chunk).
    Args:
        K, lam_min, lam_max, eps, return_stats, and the ablations: as in ``delta_coefficients``; with
            ``reduce_fn`` the stats are global except ``lam_*_min`` / ``lam_*_max`` (this process's tokens).
        reduce_fn: applied to each pass's statistics (one flat float64 tensor: sums and counts), e.g.
            ``torch.distributed.all_reduce`` (in place, may return None): the single-process λ̄ over the union of
            the ranks' data; all ranks make the same calls. Without it: per process (official code).
    Returns: list of λ̄ [b, T], one per chunk, float32 (float64 if the first chunk's v is); or (list, stats). Raises
        ValueError for empty chunks, a one-shot iterator, chunks changed between passes, some old_logp None only.
    """
    lam_min, lam_max, fixed_gamma = _check_args(K, lam_min, lam_max, eps, scores, assignment, gamma, coefficients,
                                                normalize)
    data = _StatisticPasses(chunks, reduce_fn)
    # Each token keeps one score: contrastive Δ⁺ (Δ⁻ = −Δ⁺ is read on Nn), within_side its own side's −‖v − μ‖².
    pair = (lambda m: (m, m)) if scores == "within_side" else (lambda m: (m, -m))  # (read on P, read on Nn)
    with torch.no_grad():
        # Pass 1 (step 0): Σ|Â|·v and Σ|Â| (the masses M±) per side, token counts; Â and masks are kept (a float
        # mask and two bool sides per token: 2,048 × 4,096 tokens at the papers' scale, 8.4 M × 6 B = 0.05 GB).
        sums = data.total(_centroid_sums(ch, v) for _, ch, v in data.again())
        n_pos, n_neg, n_valid = sums["n_pos"], sums["n_neg"], sums["n_valid"]
        counts = (float(n_pos), float(n_neg), float(n_valid - n_pos - n_neg))
        sides = [(ch.pos, ch.neg) for ch in data.kept]
        if counts[0] == 0 or counts[1] == 0:  # guard (spec §6), on reduced counts: every rank agrees
            lam_bar = [ch.mask.clone() for ch in data.kept]
            lam_bar_sums = (counts[0], counts[0], counts[1], counts[1])  # Σλ̄ = Σλ̄² = n per side
            return (lam_bar, _stats(lam_bar_sums, lam_bar, sides, counts, 1.0)) if return_stats else lam_bar
        mu_pos, mu_neg = _centroids(sums, eps, data.dtype)
        # Pass 2 (steps 1–2): scores at μ⁽⁰⁾ (kept, one float per token: 8.4 M × 4 B = 34 MB at the papers'
        # scale) and γ⁽⁰⁾ from their moments (reported; replaced by ``gamma``).
        margin = [_score(v, mu_pos, mu_neg, ch, scores) for _, ch, v in data.again("pass 2: gamma(0)")]
        sums = data.total(_moments(ch, "margin", *pair(m)) for ch, m in zip(data.kept, margin))
        gamma0 = _temperatures(sums, n_pos, n_neg, eps)
        gamma_pos, gamma_neg = gamma0 if fixed_gamma is None else fixed_gamma
        # Step 3: one pass per refinement: α⁽ᵏ⁾ = σ(Δ⁽ᵏ⁾/γ⁽ᵏ⁾) -> μ⁽ᵏ⁺¹⁾, and lagged γ⁽ᵏ⁺¹⁾ = std of Δ⁽ᵏ⁾.
        for k in range(K):
            parts = []
            for j, ch, v in data.again(f"pass {k + 3}: refinement {k}"):
                if k > 0:  # Δ⁽ᵏ⁾ at μ⁽ᵏ⁾ (for k = 0 the kept pass-2 margins)
                    margin[j] = _score(v, mu_pos, mu_neg, ch, scores)
                assign = _assign(*pair(margin[j]), gamma_pos, gamma_neg, ch.adv, assignment)
                parts.append({**_centroid_sums(ch, v, assign), **_moments(ch, "margin", *pair(margin[j]))})
            sums = data.total(parts)
            new_pos, new_neg = _centroids(sums, eps, data.dtype)
            if assignment == "hard":  # hard guard (baselines spec §6): a side with no token of Δ > 0 keeps μ⁽ᵏ⁾
                new_pos = new_pos if bool(sums["sum_w_pos"] > 0) else mu_pos
                new_neg = new_neg if bool(sums["sum_w_neg"] > 0) else mu_neg
            mu_pos, mu_neg = new_pos, new_neg
            if fixed_gamma is None:
                gamma_pos, gamma_neg = _temperatures(sums, n_pos, n_neg, eps)
        # Step 4: scores at μ⁽ᴷ⁾ (for K = 0 the kept pass-2 ones), α*; step 5: λ ("raw": range [0, 1], λ = α*).
        if K > 0:
            margin = [_score(v, mu_pos, mu_neg, ch, scores) for _, ch, v in data.again(f"pass {K + 3}: final scores")]
        lo, hi = (0.0, 1.0) if coefficients == "raw" else (lam_min, lam_max)
        lam = [bounded_coefficients(_assign(*pair(m), gamma_pos, gamma_neg, ch.adv, assignment), ch.adv, ch.mask, lo,
                                    hi) for ch, m in zip(data.kept, margin)]
        # Step 6 / Eq. 8: Z = Σλ over all chunks (and ranks); λ̄ = λ·N/max(Z, ε) (λ̄ := λ with normalize=False).
        if not (normalize or return_stats):
            return lam
        sums = data.total({"Z": x.double().sum(), **_moments(ch, "lam", x, x)} for ch, x in zip(data.kept, lam))
        scale = n_valid / sums["Z"].clamp(min=eps) if normalize else torch.ones((), dtype=torch.float64)
        lam_bar = [x * scale.to(data.dtype) for x in lam] if normalize else lam
        if not return_stats:
            return lam_bar
        sc = float(scale)  # Σλ̄ = sc·Σλ and Σλ̄² = sc²·Σλ² per side
        lam_bar_sums = (float(sums["sum_lam_pos"]) * sc, float(sums["sum_lam2_pos"]) * sc * sc,
                        float(sums["sum_lam_neg"]) * sc, float(sums["sum_lam2_neg"]) * sc * sc)
        return lam_bar, _stats(lam_bar_sums, lam_bar, sides, counts, sc, (mu_pos, mu_neg), (gamma_pos, gamma_neg),
                               gamma0)


def delta_token_advantages(adv: Tensor, lam_bar: Tensor, response_mask: Tensor) -> Tensor:
    """Token advantages Ã_{i,t} = Â_i · λ̄_{i,t} · mask_{i,t} (spec §2.3 step 7) for the unchanged DAPO/PPO
    token-mean loss (λ̄ > 0 keeps sign(Ã) = sign(Â) and every clip branch DAPO's). adv Â [B], lam_bar λ̄ [B, T],
    response_mask [B, T] (bool or 0/1) -> Ã [B, T] in the promoted dtype of adv and lam_bar, detached, 0 on
    padding. Raises ValueError on bad shapes or mask."""
    _check_shapes(lam_bar, "lam_bar", 2, adv, None, None, response_mask)
    dtype = torch.promote_types(adv.dtype, lam_bar.dtype)
    m = _mask01(response_mask).to(device=lam_bar.device, dtype=dtype)
    return adv.detach().to(device=lam_bar.device, dtype=dtype)[:, None] * lam_bar.detach().to(dtype) * m


# The whole batch, row block by row block (delta_coefficients' working memory) ----------------------------
# Bytes of v [B, T, H] at a time (at least one row): beside v one block, not further [B, T, H] tensors (at the
# papers' scale v is 137 GB and a block one response of 4,096 × 4,096 × 4 B = 67 MB).
ROW_BLOCK_BYTES = 16 * 2**20


def _block_rows(v: Tensor) -> int:  # rows of v [B, T, H] per block: ROW_BLOCK_BYTES of it, at least one
    return max(1, ROW_BLOCK_BYTES // max(math.prod(v.shape[1:]) * v.element_size(), 1))


def _zero_at_padding(v: Tensor, valid: Tensor) -> bool:  # v is +0.0 (all bits 0; not −0.0) at every padded position
    rows, bits = _block_rows(v), {torch.float32: torch.int32, torch.float64: torch.int64}[v.dtype]
    return not any(v[r:r + rows][~valid[r:r + rows]].view(bits).any()  # [n, H], n ≤ the block's padded tokens
                   for r in range(0, v.shape[0], rows))


def _row_block(v: Tensor, rows: Optional[int] = None) -> Tensor:  # a [rows, T, H] buffer (default _block_rows)
    return torch.empty((min(rows or _block_rows(v), v.shape[0]),) + v.shape[1:], dtype=v.dtype, device=v.device)


def _squared_distances(v: Tensor, mu: Tensor, block: Tensor) -> Tensor:
    """‖v − μ‖² ``[B, T]`` of v ``[B, T, H]`` and μ ``[H]``, ``block`` ``[rows, T, H]`` (``_row_block``, reused) holding
    v − μ of ``rows`` rows at a time: each token's sum over H is the same reduction whatever the block, so the
    result equals ``(v - mu).pow(2).sum(-1)`` (tests/test_delta.py, float64)."""
    out, rows = torch.empty(v.shape[:2], dtype=v.dtype, device=v.device), max(block.shape[0], 1)
    for r in range(0, v.shape[0], rows):
        d = torch.sub(v[r:r + rows], mu, out=block[:min(rows, v.shape[0] - r)])  # [rows, T, H]
        torch.sum(d.pow_(2), -1, out=out[r:r + rows])
    return out


# Streaming: what pass 1 keeps of a chunk, and one helper per pass statistic (named float64 sums) ---------
_Chunk = namedtuple("_Chunk", "adv mask pos neg")  # Â [b]; float 0/1 mask [b, T]; sides P, Nn (bool [b, T])


def _centroid_sums(ch: _Chunk, v: Tensor, assign: Optional[Tensor] = None) -> dict:
    # Numerators Σw·v [H] and denominators Σw of μ± (Eq. 2–3), weights w = |Â|·α on each side. Pass 1 has
    # α = 1 (Σw are then the advantage masses M±) and also counts the valid tokens on P, on Nn and in all.
    w_pos, w_neg = ch.adv.clamp(min=0)[:, None] * ch.mask, (-ch.adv).clamp(min=0)[:, None] * ch.mask  # [b, T]
    if assign is not None:
        w_pos, w_neg = assign * w_pos, assign * w_neg
    vf, w_pos, w_neg = v.flatten(0, 1), w_pos.flatten(), w_neg.flatten()  # [b·T, H], [b·T], [b·T]
    out = {"sum_wv_pos": (w_pos @ vf).double(), "sum_wv_neg": (w_neg @ vf).double(),
           "sum_w_pos": w_pos.sum(dtype=torch.float64), "sum_w_neg": w_neg.sum(dtype=torch.float64)}
    if assign is None:  # pass 1: also the valid-token counts
        out.update(n_pos=ch.pos.sum(dtype=torch.float64), n_neg=ch.neg.sum(dtype=torch.float64),
                   n_valid=ch.mask.sum(dtype=torch.float64))
    return out


def _score(v: Tensor, mu_pos: Tensor, mu_neg: Tensor, ch: _Chunk, scores: str) -> Tensor:
    # ‖v − μ‖² = ‖v‖² − 2v·μ + ‖μ‖² clamped at 0 (spec §2.5), [b, T]; the token's one kept score: contrastive
    # Δ⁺ = ‖v − μ₋‖² − ‖v − μ₊‖² (Δ⁻ = −Δ⁺), within_side −‖v − μ_own‖² (μ₊ on P, μ₋ elsewhere).
    sq = (v * v).sum(-1)  # [b, T]
    d_pos = (sq - 2.0 * (v @ mu_pos) + mu_pos @ mu_pos).clamp(min=0)
    d_neg = (sq - 2.0 * (v @ mu_neg) + mu_neg @ mu_neg).clamp(min=0)
    return torch.where(ch.pos, -d_pos, -d_neg) if scores == "within_side" else d_neg - d_pos


def _moments(ch: _Chunk, name: str, x_pos: Tensor, x_neg: Tensor) -> dict:  # Σx, Σx² on P and on Nn, float64
    xp, xn = x_pos.double()[ch.pos], x_neg.double()[ch.neg]
    return {f"sum_{name}_pos": xp.sum(), f"sum_{name}2_pos": (xp * xp).sum(),
            f"sum_{name}_neg": xn.sum(), f"sum_{name}2_neg": (xn * xn).sum()}


def _centroids(sums: dict, eps: float, dtype: torch.dtype) -> tuple:  # μ₊, μ₋ [H] (Eq. 2–3) from the sums
    return tuple((sums[f"sum_wv_{x}"] / sums[f"sum_w_{x}"].clamp(min=eps)).to(dtype) for x in ("pos", "neg"))


def _temperatures(sums: dict, n_pos: Tensor, n_neg: Tensor, eps: float) -> tuple:  # γ₊, γ₋ from the sums
    return (adaptive_temperature(sums["sum_margin_pos"], sums["sum_margin2_pos"], n_pos, eps),
            adaptive_temperature(sums["sum_margin_neg"], sums["sum_margin2_neg"], n_neg, eps))


class _StatisticPasses:
    """The chunks of ``delta_coefficients_streaming``, read once per pass (``again``: the first validates and keeps
    them, the later ones check them), and ``total``: named statistics summed over chunks, then one ``reduce_fn``
    call on all of them, flattened."""

    def __init__(self, chunks: Chunks, reduce_fn):
        if not callable(chunks) and iter(chunks) is chunks:
            raise ValueError("chunks must be a list/tuple or a zero-arg callable returning a fresh iterable; "
                             "a one-shot iterator cannot be read K + 3 times")
        self.read = chunks if callable(chunks) else (lambda: chunks)
        self.reduce_fn, self.kept = reduce_fn, []

    def _proxies(self, j: int, raw, where: str):  # (v, Â, float mask) of chunk j: App. F's v = (1 − p)·h
        if not (isinstance(raw, (tuple, list)) and len(raw) == 4):
            raise ValueError(f"chunks[{j}] must be a (hidden, old_logp, response_mask, adv) tuple")
        hidden, logp, mask, adv = raw
        _check_shapes(hidden, "hidden", 3, adv, logp, None if logp is None else "old_logp", mask, where,
                      " of sequence advantages")
        if j == 0 and not self.kept:  # given_v: the chunks carry v itself (e.g. top-K proxies), not h and log p
            self.given_v, self.H = logp is None, hidden.shape[-1]
            self.dtype = _work_dtype(hidden, *([] if logp is None else [logp]))
        if (logp is None) != self.given_v:
            raise ValueError(f"old_logp{where} is {'None' if logp is None else 'a tensor'}, but "
                             f"{'a tensor' if logp is None else 'None'} in chunks[0]: all or none must be None")
        if hidden.shape[-1] != self.H:
            raise ValueError(f"hidden{where} has hidden size {hidden.shape[-1]}, expected {self.H}")
        v = hidden if logp is None else proxy_vectors(hidden, logp, mask)
        return _prepare(v, adv, mask, dtype=self.dtype, where=where)

    def again(self, name: Optional[str] = None):  # yields (j, _Chunk, v); pass 1 (no name) keeps the _Chunks
        j, n = -1, len(self.kept)
        for j, raw in enumerate(self.read()):
            if name and j >= n:
                break
            v, adv, m = self._proxies(j, raw, f" in chunks[{j}]" + (f" ({name})" if name else ""))
            if not name:
                self.kept.append(_Chunk(adv, m, (adv > 0)[:, None] & (m > 0), (adv < 0)[:, None] & (m > 0)))
            elif not (torch.equal(adv, self.kept[j].adv) and torch.equal(m, self.kept[j].mask)):  # (H: _proxies)
                raise ValueError(f"chunks[{j}] changed between passes ({name}): adv, "
                                 "response_mask and shapes must be identical in every pass")
            yield j, self.kept[j], v
        if not self.kept:
            raise ValueError("chunks is empty: need at least one (hidden, old_logp, response_mask, adv) micro-batch")
        if name and j + 1 != n:
            raise ValueError(f"chunks yielded {j + 1} micro-batches in {name}, expected {n}")

    def total(self, parts: Iterable[dict]) -> dict:
        sums = {}
        for part in parts:
            for key, x in part.items():
                sums[key] = (sums[key] if key in sums else torch.zeros_like(x)) + x
        if self.reduce_fn is None:
            return sums
        out = self.reduce_fn(flat := torch.cat([x.reshape(-1) for x in sums.values()]))
        flat = flat if out is None else out  # in place (torch.distributed.all_reduce) or returned
        return {key: x.view_as(sums[key]) for key, x in zip(sums, flat.split([x.numel() for x in sums.values()]))}


# Validation ----------------------------------------------------------------------------------------------
def _check_args(K, lam_min, lam_max, eps, scores="contrastive", assignment="soft", gamma=None,
                coefficients="bounded", normalize=True) -> Tuple[float, float, Optional[Tuple[Tensor, Tensor]]]:
    # The hyper-parameters and ablation keywords (baselines spec §6): lam_min, lam_max as floats, gamma as 0-dim
    # float64 tensors (as adaptive_temperature's γ).
    if isinstance(K, bool) or not isinstance(K, int):
        raise ValueError(f"K must be an int >= 0, got {K!r}")
    lo, hi = float(lam_min), float(lam_max)
    for bad, msg in ((K < 0, f"K must be >= 0, got {K}"),
                     (not (math.isfinite(lo) and math.isfinite(hi)), f"lam_min/lam_max must be finite, got {lo}, {hi}"),
                     (lo < 0, f"lam_min must be >= 0 (λ̄ > 0 keeps the sign of Â), got {lo}"),
                     (lo > hi, f"lam_min must be <= lam_max, got lam_min={lo} > lam_max={hi}"),
                     (hi <= 0, f"lam_max must be > 0, got {hi}"), (not float(eps) > 0, f"eps must be > 0, got {eps!r}"),
                     (not isinstance(normalize, bool), f"normalize must be True or False, got {normalize!r}")):
        if bad:
            raise ValueError(msg)
    for name, value, allowed in (("scores", scores, SCORES), ("assignment", assignment, ASSIGNMENTS),
                                 ("coefficients", coefficients, COEFFICIENTS)):
        if value not in allowed:
            raise ValueError(f"{name} must be one of {', '.join(map(repr, allowed))}, got {value!r}")
    if gamma is None:
        return lo, hi, None
    try:
        g = tuple(torch.tensor(float(x), dtype=torch.float64) for x in gamma)
    except (TypeError, ValueError):
        g = ()
    if len(g) == 2 and all(math.isfinite(x) and x > 0 for x in g):
        return lo, hi, g
    raise ValueError(f"gamma must be None or a pair (gamma_pos, gamma_neg) of finite floats > 0, got {gamma!r}")


def _check_shapes(x, x_name, dims, adv, bt, bt_name, mask, where="", adv_what="") -> None:
    shape = lambda t: tuple(getattr(t, "shape", ()))  # noqa: E731
    if not isinstance(x, Tensor) or x.dim() != dims:
        raise ValueError(f"{x_name}{where} must be a {'[B, T, H]' if dims == 3 else '[B, T]'} tensor, got shape "
                         f"{shape(x)}")
    B, T = x.shape[:2]
    if adv is not None and (not isinstance(adv, Tensor) or shape(adv) != (B,)):
        raise ValueError(f"adv{where} must be a [B] = [{B}] tensor{adv_what}, got shape {shape(adv)}")
    for t, name in ((bt, bt_name), (mask, "response_mask")):
        if name is not None and (not isinstance(t, Tensor) or shape(t) != (B, T)):
            raise ValueError(f"{name}{where} must be [B, T] = [{B}, {T}], got shape {shape(t)}")


def _mask01(response_mask: Tensor, name: str = "response_mask") -> Tensor:  # bool or 0/1 mask -> bool mask
    if response_mask.dtype != torch.bool and not bool(((response_mask == 0) | (response_mask == 1)).all()):
        raise ValueError(f"{name} must contain only 0/1 (or be bool)")
    return response_mask != 0


def _work_dtype(*tensors: Tensor) -> torch.dtype:  # float64 if any input is (unit tests), else float32
    return torch.float64 if any(t.dtype == torch.float64 for t in tensors) else torch.float32


def _prepare(v: Tensor, adv: Tensor, response_mask: Tensor, dtype: Optional[torch.dtype] = None,
             where: str = "") -> Tuple[Tensor, Tensor, Tensor]:
    """Validated, detached v (0 on padding by ``where``: NaN cannot leak), Â, float 0/1 mask; working dtype."""
    _check_shapes(v, "v", 3, adv, None, None, response_mask, where, " of sequence advantages")
    if not bool(torch.isfinite(adv).all()):
        raise ValueError(f"adv{where} must be finite")
    dtype = dtype or _work_dtype(v)
    valid = _mask01(response_mask, f"response_mask{where}").to(v.device)
    v = v.detach()
    if v.dtype != dtype:  # a converted copy anyway: masked in place
        v = v.to(dtype).masked_fill_(~valid[..., None], 0.0)
    elif not _zero_at_padding(v, valid):  # anything but +0.0 on padding: a masked copy (0 there)
        v = torch.where(valid[..., None], v, torch.zeros((), dtype=dtype, device=v.device))
    # else v itself (proxy_vectors' output): the masked copy would equal it bit for bit, and it is [B, T, H]
    return v, adv.detach().to(device=v.device, dtype=dtype), valid.to(dtype)


# Diagnostics (``return_stats``) ----------------------------------------------------------------------------
def _batch_stats(lam_bar, pos, neg, mask, scale, mus=None, gammas=None, gamma0=None) -> dict:
    """``_stats`` of ``delta_coefficients`` from λ̄ and the float side masks P, Nn ([B, T] each)."""
    lb64 = lam_bar.double()
    lam_bar_sums = (float((lb64 * pos).sum()), float((lb64 * lb64 * pos).sum()),
                    float((lb64 * neg).sum()), float((lb64 * lb64 * neg).sum()))
    n_valid, n_pos, n_neg = (x.sum(dtype=torch.float64) for x in (mask, pos, neg))
    counts = (float(n_pos), float(n_neg), float(n_valid - n_pos - n_neg))
    return _stats(lam_bar_sums, [lam_bar], [(pos > 0, neg > 0)], counts, scale, mus, gammas, gamma0)


def _stats(lam_bar_sums, lam_bar: list, sides: list, counts, scale, mus=None, gammas=None, gamma0=None) -> dict:
    """The ``STAT_KEYS`` dict from lam_bar_sums = (Σλ̄, Σλ̄²) on P, then on Nn, this process's λ̄ chunks and their
    bool sides (P, Nn) (min, max), the final γ± (gammas), the measured γ±⁽⁰⁾; ``mus`` None: the guard fired."""
    out = []
    for i in range(2):  # λ̄ on P, then on Nn: mean, std, min, max
        s1, s2, n = lam_bar_sums[2 * i], lam_bar_sums[2 * i + 1], counts[i]
        x = torch.cat([lb[sd[i]] for lb, sd in zip(lam_bar, sides)])
        mean = s1 / n if n > 0 else _NAN
        lo, hi = (float(x.min()), float(x.max())) if x.numel() else (_NAN, _NAN)
        out += (mean, math.sqrt(max(s2 / n - mean * mean, 0.0)), lo, hi) if n > 0 else (_NAN,) * 4
    na, nb = (float(mu.double().norm()) for mu in mus) if mus is not None else (_NAN, _NAN)
    cos = float(mus[0].double() @ mus[1].double()) / (na * nb) if mus is not None and na > 0 and nb > 0 else _NAN
    out += [cos, na, nb, *(gammas or (_NAN, _NAN)), *(gamma0 or (_NAN, _NAN)), *counts, scale, float(mus is None)]
    return {key: float(x) for key, x in zip(STAT_KEYS, out)}  # in the order of STAT_KEYS
