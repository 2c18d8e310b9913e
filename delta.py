"""DelTA: discriminative token credit assignment for RLVR (token coefficients λ̄).

Source: Kaiyi Zhang, Wei Wu, Yankai Lin, "DelTA: Discriminative Token Credit Assignment for Reinforcement Learning from
Verifiable Rewards", arXiv 2605.21467 (2026); official code RUCBM/DelTA (verl-DelTA/verl/workers/actor/dp_actor.py,
``compute_log_prob_h``). Spec: docs/specs/delta.md ("spec §x"). Names as docs/glossary.md: Â ``adv``, Ã ``token_adv``,
Δ ``margin``, γ ``gamma``, α ``assign``, λ ``lam``, λ̄ ``lam_bar``, the count of valid tokens ``n_valid``.

Why (Sec. 3.1, App. C): at θ_old the DAPO update Σ Â_i v_{i,t} (v = ∇_θ log π(o_{i,t})) is M₊μ̄₊ − M₋μ̄₋ (Eq. 2–3:
masses M± = Σ|Â|, μ̄± the |Â|-weighted centroids of v), a linear discriminator (Eq. 4) blurred by tokens common to
both sides; DelTA re-weights the tokens. ``delta_coefficients`` runs spec §2.3's steps, one tensor per quantity:
  App. F  proxy v_t = (1 − p(y_t))·h_t, h_t the LM head's input [``proxy_vectors``]
  step 0  centroids μ± = Σ|Â|·v / M± of side P (Â > 0) and side Nn (Â < 0); Â = 0 responses are on neither
  step 1  own-side margins Δ⁺ = ‖v − μ₋‖² − ‖v − μ₊‖² on P, Δ⁻ = −Δ⁺ on Nn [``contrastive_margins``]
  step 2  temperatures γ± = population std of each side's margins [``adaptive_temperature``]
  step 3  K refinements: α = σ(Δ/γ) [``soft_assignment``; App. G], centroids re-weighted by |Â|·α, γ lagged (App. H)
  step 4  final α* = σ(Δ/γ) at μ⁽ᴷ⁾;  step 5: λ = λ_min + (λ_max − λ_min)·α* [``bounded_coefficients``]
  step 6  λ̄ = λ·n_valid/Z, Z = Σλ [``self_normalization``; Eq. 8];  step 7: Ã = Â·λ̄ [``delta_token_advantages``].
Steps 1–6's functions are ``DeltaFunctions``' fields, one argument ``functions`` (None: the paper's; an ablation's:
comparisons/delta_ablations.py). ``delta_coefficients_chunked`` is the 8B run's form: chunks, a list or a callable
yielding them afresh (h recomputed a micro-batch at a time), each statistic a float64 sum over the chunks and, with
``pool``, the processes (spec §2.4–2.5). ``delta_stats``: what a trainer logs.

Inferred or different from the official code (spec §2.4, §6): statistics pooled over all passed in (the code: per
data-parallel rank); one side empty: λ̄ ≡ 1 on valid tokens (the code has no guard); per-token maths in float32
(float64 for float64 v), sums in float64, 1 − p = −expm1(log p); ‖v − μ‖² a block of rows at a time ("Normal"); a
side of refinement weights 0 keeps its centroid; T ≠ 1: the proxy omits 1/T, as the code (λ̄ is scale-invariant in
v). Left out: the forward pass and the PPO loss (the caller's, see the example), the ℓ2-centroid variant (undefined),
the release's dead code (spec §6), the ablations. Read next: spec §2.3–2.5, §7.

Example: input_ids, attention_mask [B, P + T] left-padded prompts + sampled responses, loss_mask [B, T], adv Â [B],
``import torch, delta``, any HF causal LM ``model`` (``python delta.py`` runs it on a tiny random Qwen3):
    T = loss_mask.shape[1]
    positions = (attention_mask.cumsum(-1) - 1).clamp(min=0)  # real tokens only, as generate() counts them
    with torch.no_grad():  # θ_old's forward
        out = model(input_ids, attention_mask=attention_mask, position_ids=positions, output_hidden_states=True)
    logits = out.logits[:, -T - 1 : -1].float()  # [B, T, V]: the positions that predict the response tokens
    old_logp = logits.log_softmax(-1).gather(-1, input_ids[:, -T:, None]).squeeze(-1)  # ℓ0 [B, T] (temperature 1)
    hidden = out.hidden_states[-1][:, -T - 1 : -1]  # [B, T, H] lm_head input (post-norm; or a pre-hook on lm_head)
    v = delta.proxy_vectors(hidden, old_logp, loss_mask)  # App. F: v = (1 − p)·h, [B, T, H]
    result = delta.delta_coefficients(v, adv, loss_mask)  # result.lam_bar: λ̄ [B, T], mean 1 over valid tokens
    token_adv = delta.delta_token_advantages(adv, result.lam_bar, loss_mask)  # Ã = Â·λ̄ [B, T] -> your PPO loss
    stats = delta.delta_stats(result, adv, loss_mask)  # what to log: {delta.STAT_KEYS: float}
"""

import math
from typing import Callable, NamedTuple, Optional

import torch
from torch import Tensor

EPS = 1e-8  # spec §2.3: ε of the centroid denominators, of γ's variance and of Z
ROW_BLOCK_BYTES = 16 * 2**20  # bytes of v − μ formed at a time (a block of rows, at least one; a papers' row: 67 MB)
STAT_KEYS = (
    ("delta/lam_pos_mean", "delta/lam_pos_std", "delta/lam_pos_min", "delta/lam_pos_max", "delta/lam_neg_mean")
    + ("delta/lam_neg_std", "delta/lam_neg_min", "delta/lam_neg_max", "delta/cos_mu", "delta/mu_pos_norm")
    + ("delta/mu_neg_norm", "delta/gamma_pos", "delta/gamma_neg", "delta/gamma0_pos", "delta/gamma0_neg")
    + ("delta/n_pos", "delta/n_neg", "delta/n_zero", "delta/scale", "delta/fallback")
)


def proxy_vectors(hidden: Tensor, old_logp: Tensor, loss_mask: Tensor) -> Tensor:
    """App. F's proxy v_t = (1 − p(y_t))·h_t = ∂ log p(y_t) / ∂ W_lm_head[y_t] (the sampled token's row only). hidden:
    [B, T, H] ``lm_head``'s input at the positions that predict the response; old_logp: [B, T] θ_old's log-probs;
    loss_mask: [B, T] bool or 0/1. Returns v [B, T, H] float32 (float64 if an input is), detached, +0.0 on padding."""
    _check_shapes(hidden, "hidden", {"old_logp": old_logp, "loss_mask": loss_mask})
    dtype = torch.float64 if torch.float64 in (hidden.dtype, old_logp.dtype) else torch.float32
    with torch.no_grad():
        one_minus_p = -torch.expm1(old_logp.detach().to(device=hidden.device, dtype=dtype))  # 1 − p(y_t), [B, T]
        v = one_minus_p[..., None] * hidden.detach().to(dtype)  # [B, T, H], the one this allocates
        return v.masked_fill_(~_mask01(loss_mask).to(hidden.device)[..., None], 0.0)  # in place: +0.0 on padding


# The replaceable parts of the method, in the spec's order (``DeltaFunctions``) ---------------------------------------
class MarginSums(NamedTuple):  # App. H's float64 sums of one side's margins over its valid tokens
    total: Tensor  # Σ Δ
    total_sq: Tensor  # Σ Δ²
    count: Tensor  # its tokens


def contrastive_margins(dist_pos: Tensor, dist_neg: Tensor, adv: Tensor) -> Tensor:
    """Step 1 (Sec. 3.2): own-side margins Δ [b, T] of ‖v − μ₊‖², ‖v − μ₋‖² [b, T] and Â [b]: Δ⁺ = ‖v − μ₋‖² − ‖v − μ₊‖²
    where Â > 0, Δ⁻ = −Δ⁺ elsewhere (Δ⁺ = 2vᵀ(μ₊ − μ₋) + ‖μ₋‖² − ‖μ₊‖²: Eq. 4's discriminator + an offset). Units v²."""
    return torch.where((adv > 0)[:, None], dist_neg - dist_pos, dist_pos - dist_neg)


def adaptive_temperature(margins_pos: MarginSums, margins_neg: MarginSums) -> tuple:
    """Steps 2–3 (Sec. 3.2, App. H): (γ₊, γ₋), γ = sqrt(max(E[Δ²] − E[Δ]², ε)) of a side's ``MarginSums`` (count clamped
    at 1), float64 0-dim, units of Δ. Lagged (paper = code): refinement k uses Δ⁽ᵏ⁾'s, at μ⁽ᵏ⁾ (γ⁽¹⁾ = γ⁽⁰⁾)."""
    gammas = []
    for sums in (margins_pos, margins_neg):
        n = sums.count.clamp(min=1.0)
        mean = sums.total / n
        gammas.append(torch.sqrt(torch.clamp(sums.total_sq / n - mean * mean, min=EPS)))
    return tuple(gammas)


def soft_assignment(margin: Tensor, gamma_pos: Tensor, gamma_neg: Tensor, adv: Tensor) -> Tensor:
    """α = σ(Δ/γ) (App. G: the maximiser of α·Δ + γ·H(α)) with the token's own side's temperature, γ₊ where Â > 0,
    γ₋ elsewhere. margin Δ [b, T], γ± 0-dim, adv Â [b] -> α [b, T] in (0, 1) (the caller masks)."""
    return torch.where((adv > 0)[:, None], torch.sigmoid(margin / gamma_pos), torch.sigmoid(margin / gamma_neg))


def bounded_coefficients(assign: Tensor, adv: Tensor, mask: Tensor, lam_min: float, lam_max: float) -> Tensor:
    """Step 5: λ = λ_min + (λ_max − λ_min)·α (Sec. 3.2): ``assign`` α [b, T], ``adv`` Â [b], float 0/1 ``mask``
    [b, T]; responses with Â = 0 get λ_min, padding 0. Returns λ [b, T] (before step 6's normalisation)."""
    return torch.where((adv == 0)[:, None], lam_min, lam_min + (lam_max - lam_min) * assign) * mask


def self_normalization(n_valid: Tensor, Z: Tensor) -> Tensor:
    """Step 6 (Eq. 8): the one scale of λ̄ = λ·n_valid/max(Z, ε), n_valid the valid tokens (Â = 0 ones included),
    Z = Σλ, both float64 0-dim over the whole batch: then (1/n_valid) Σ λ̄ℓ = (1/Z) Σ λℓ."""
    return n_valid / Z.clamp(min=EPS)


class DeltaFunctions(NamedTuple):  # the replaceable parts of λ̄ (defaults: the paper's, above): ``functions``
    score: Callable = contrastive_margins  # (dist_pos, dist_neg, adv) -> margin Δ [b, T]
    gamma: Callable = adaptive_temperature  # (MarginSums of P, of Nn) -> (γ₊, γ₋), float64 0-dim
    assignment: Callable = soft_assignment  # (margin, gamma_pos, gamma_neg, adv) -> α [b, T]
    coefficients: Callable = bounded_coefficients  # (assign, adv, mask, lam_min, lam_max) -> λ [b, T]
    normalize: Callable = self_normalization  # (n_valid, Z) -> the float64 scale of λ̄ = λ·scale


class DeltaResult(NamedTuple):  # λ̄ and what ``delta_stats`` reads; the defaults are the guard's (spec §6)
    lam_bar: Tensor  # λ̄ [B, T] (``delta_coefficients_chunked``: a list, each chunk's [b, t])
    mu_pos: Optional[Tensor] = None  # μ₊⁽ᴷ⁾ [H]
    mu_neg: Optional[Tensor] = None  # μ₋⁽ᴷ⁾ [H]
    gamma_pos: Tensor = math.nan  # the γ₊ used last, float64 0-dim (the guard: a float, as below)
    gamma_neg: Tensor = math.nan
    gamma0_pos: Tensor = math.nan  # γ₊⁽⁰⁾ measured at μ⁽⁰⁾ (``adaptive_temperature``)
    gamma0_neg: Tensor = math.nan
    scale: Tensor = 1.0  # n_valid/Z: λ = λ̄/scale
    guard: bool = True  # a side was empty: λ̄ ≡ 1 on valid tokens, no centroid, no margin


# The whole batch: spec §2.3, one tensor per quantity -------------------------------------------------------------
def delta_coefficients(v, adv, loss_mask, K=1, lam_min=0.8, lam_max=1.2, *, functions=None) -> DeltaResult:
    """λ̄, DelTA's normalised token coefficients of one rollout batch (spec §2.3 steps 0–6), no gradient. v: [B, T, H]
    proxies (``proxy_vectors``); adv: Â [B] (> 0: side P, < 0: Nn, = 0: neither, yet counted in n_valid and Z);
    loss_mask: [B, T] bool or 0/1; K refinements (paper 1); λ in [lam_min, lam_max]; functions: ``DeltaFunctions``
    (None: the paper's). Returns a ``DeltaResult``: λ̄ [B, T] float32 (float64 for float64 v), 0 on padding, mean 1
    over valid tokens. Memory beside v (copied once unless +0.0 on padding): a ROW_BLOCK_BYTES block of v − μ."""
    functions = _checked(functions, K, lam_min, lam_max)
    v, adv, mask = _prepare(v, adv, loss_mask)
    with torch.no_grad():
        # Step 0 (Eq. 2–3): each side's Σ|Â|·v and mass M± = Σ|Â|; μ± = Σ|Â|·v / max(M±, ε) [H]
        sums_pos, sums_neg = centroid_sums(v, adv, mask)
        if not (sums_pos.weight > 0 and sums_neg.weight > 0):  # guard (spec §6): no discriminator without both
            return DeltaResult(mask.clone())  # the guard's result (its defaults)
        mu_pos = centroid(sums_pos, v.dtype)
        mu_neg = centroid(sums_neg, v.dtype)
        margin = functions.score(squared_distance(v, mu_pos), squared_distance(v, mu_neg), adv)  # Step 1: Δ⁽⁰⁾ [B, T]
        moments_pos, moments_neg = margin_sums(margin, adv, mask)  # Step 2: γ±⁽⁰⁾ of each side's margins
        gamma0_pos, gamma0_neg = adaptive_temperature(moments_pos, moments_neg)
        gamma_pos, gamma_neg = functions.gamma(moments_pos, moments_neg)
        for k in range(K):  # Step 3: the K refinements
            if k > 0:  # Δ⁽ᵏ⁾ at μ⁽ᵏ⁾ (Δ⁽⁰⁾ is step 1's)
                margin = functions.score(squared_distance(v, mu_pos), squared_distance(v, mu_neg), adv)
            assign = functions.assignment(margin, gamma_pos, gamma_neg, adv)  # α⁽ᵏ⁾ = σ(Δ⁽ᵏ⁾/γ⁽ᵏ⁾)
            sums_pos, sums_neg = centroid_sums(v, adv, mask, assign)  # weights |Â|·α⁽ᵏ⁾
            mu_pos = centroid(sums_pos, v.dtype, mu_pos)  # μ±⁽ᵏ⁺¹⁾
            mu_neg = centroid(sums_neg, v.dtype, mu_neg)
            moments_pos, moments_neg = margin_sums(margin, adv, mask)
            gamma_pos, gamma_neg = functions.gamma(moments_pos, moments_neg)  # lagged: of Δ⁽ᵏ⁾, at μ⁽ᵏ⁾
        if K > 0:  # Step 4: the final margins, at μ⁽ᴷ⁾ (K = 0: step 1's, at μ⁽⁰⁾)
            margin = functions.score(squared_distance(v, mu_pos), squared_distance(v, mu_neg), adv)
        assign = functions.assignment(margin, gamma_pos, gamma_neg, adv)  # α* = σ(Δ/γ⁽ᴷ⁾)
        lam = functions.coefficients(assign, adv, mask, lam_min, lam_max)  # Step 5: λ = λ_min + (λ_max − λ_min)·α*
        # Step 6 (Eq. 8): λ̄ = λ·n_valid/max(Z, ε), n_valid counting the Â = 0 tokens too
        scale = functions.normalize(mask.sum(dtype=torch.float64), lam.sum(dtype=torch.float64))
        lam_bar = lam * scale.to(lam.dtype)
        return DeltaResult(lam_bar, mu_pos, mu_neg, gamma_pos, gamma_neg, gamma0_pos, gamma0_neg, scale, False)


def delta_stats(result: DeltaResult, adv: Tensor, loss_mask: Tensor, pool: Optional[Callable] = None) -> dict:
    """The ``STAT_KEYS`` of ``result`` (its λ̄ [B, T], of the batch's Â [B] ``adv`` and ``loss_mask`` [B, T]; ``pool``
    as the coefficients'), floats, NaN where undefined: λ̄ per side (mean, std; min, max: this process's), cos and
    norms of μ±⁽ᴷ⁾, the γ± used last, γ±⁽⁰⁾, valid tokens with Â > 0, < 0, = 0, the scale, fallback = the guard."""
    lam_bar = result.lam_bar
    mask = _mask01(loss_mask).to(device=lam_bar.device, dtype=lam_bar.dtype)
    on_side = [(adv.to(lam_bar.device) * sign > 0).to(mask.dtype)[:, None] * mask for sign in (1, -1)]  # P, Nn
    sums = [mask.sum(dtype=torch.float64)] + [w.sum(dtype=torch.float64) for w in on_side]
    sums += [(lam_bar.double() ** power * w).sum() for w in on_side for power in (1, 2)]
    pooled = _pooled(torch.stack(sums), pool).tolist()  # n_valid, n_pos, n_neg, then Σλ̄, Σλ̄² on P, on Nn
    stats = []
    for side, w in enumerate(on_side):  # λ̄ on P, then on Nn: mean, std, min, max
        n = pooled[1 + side]
        mean = pooled[3 + 2 * side] / max(n, 1.0)
        variance = pooled[4 + 2 * side] / max(n, 1.0) - mean * mean
        here = lam_bar[w > 0]
        extremes = [float(here.min()), float(here.max())] if here.numel() else [math.nan] * 2
        stats += [mean, math.sqrt(max(variance, 0.0)), *extremes] if n > 0 else [math.nan] * 4
    mu = None if result.guard else (result.mu_pos.double(), result.mu_neg.double())
    norms = [float(centroid.norm()) for centroid in mu] if mu else [math.nan] * 2
    cos = float(mu[0] @ mu[1]) / (norms[0] * norms[1]) if mu and min(norms) > 0 else math.nan
    stats += [cos, *norms, result.gamma_pos, result.gamma_neg, result.gamma0_pos, result.gamma0_neg]
    stats += [pooled[1], pooled[2], pooled[0] - pooled[1] - pooled[2], result.scale, result.guard]
    return {key: float(value) for key, value in zip(STAT_KEYS, stats)}


def delta_token_advantages(adv: Tensor, lam_bar: Tensor, loss_mask: Tensor) -> Tensor:
    """Ã_{i,t} = Â_i·λ̄_{i,t}·mask_{i,t} (spec §2.3 step 7; λ̄ > 0 keeps sign(Â) and every clip branch DAPO's): adv Â
    [B], lam_bar λ̄ [B, T], loss_mask [B, T] -> Ã [B, T] (promoted dtype), detached, 0 on padding."""
    _check_shapes(lam_bar, "lam_bar", {"adv": adv, "loss_mask": loss_mask})
    dtype = torch.promote_types(adv.dtype, lam_bar.dtype)
    mask = _mask01(loss_mask).to(device=lam_bar.device, dtype=dtype)
    return adv.detach().to(device=lam_bar.device, dtype=dtype)[:, None] * lam_bar.detach().to(dtype) * mask


class CentroidSums(NamedTuple):  # Eq. 2–3's float64 sums of one side's centroid (w = |Â|, or |Â|·α in step 3)
    weighted_v: Tensor  # Σ w·v [H]
    weight: Tensor  # Σ w


def centroid_sums(v: Tensor, adv: Tensor, mask: Tensor, assign: Optional[Tensor] = None) -> tuple:
    """(``CentroidSums`` of P, of Nn) of v [b, t, H], Â [b] and a float 0/1 mask [b, t]: weights |Â| on each side's
    valid tokens (step 0), times α [b, t] in the refinements; in v's dtype, then float64."""
    sums = []
    for adv_side in (adv.clamp(min=0), (-adv).clamp(min=0)):  # |Â| on P, on Nn (0 elsewhere)
        w = adv_side[:, None] * mask if assign is None else assign * (adv_side[:, None] * mask)  # [b, t]
        sums.append(CentroidSums(torch.einsum("bt,bth->h", w, v).double(), w.sum().double()))
    return tuple(sums)


def centroid(sums: CentroidSums, dtype: torch.dtype, previous: Optional[Tensor] = None) -> Tensor:
    """μ = Σ w·v / max(Σ w, ε) [H] in ``dtype`` (ε as ``dtype`` holds it); weights that sum to 0 keep ``previous``."""
    if previous is not None and not sums.weight > 0:
        return previous
    return (sums.weighted_v / sums.weight.clamp(min=float(torch.tensor(EPS, dtype=dtype)))).to(dtype)


def squared_distance(v: Tensor, mu: Tensor) -> Tensor:
    """‖v − μ‖² [b, t] of v [b, t, H] and μ [H], v − μ formed a block of rows at a time: a token's sum over H is the
    same reduction in any block, so the result is (v − μ).pow(2).sum(-1) (tests/test_delta.py, float64)."""
    blocks = _row_blocks(v)
    block = torch.empty_like(v[blocks[0]])
    dist = torch.empty(v.shape[:2], dtype=v.dtype, device=v.device)
    for rows in blocks:  # ‖v − μ‖² of a block of rows, in ``block``
        torch.sum(torch.sub(v[rows], mu, out=block[: len(v[rows])]).pow_(2), -1, out=dist[rows])
    return dist


def margin_sums(margin: Tensor, adv: Tensor, mask: Tensor) -> tuple:
    """(``MarginSums`` of P, of Nn) of the margins Δ [b, t], Â [b] and a float 0/1 mask [b, t]."""
    d64 = margin.double()
    sums = []
    for on_side in (adv > 0, adv < 0):
        w64 = (on_side[:, None] * mask).double()
        sums.append(MarginSums((d64 * w64).sum(), (d64 * d64 * w64).sum(), w64.sum()))
    return tuple(sums)


# The batch as chunks: the same steps, each statistic a float64 sum over the chunks (and processes) --------------
def delta_coefficients_chunked(chunks, K=1, lam_min=0.8, lam_max=1.2, *, pool=None, functions=None) -> DeltaResult:
    """``delta_coefficients`` of a batch as ``chunks`` of rows (v [b, t, H], Â [b], loss_mask [b, t]): a list, or a
    zero-arg callable returning them afresh, in order, at each of its K + 3 calls (2 for K = 0), e.g. re-running
    θ_old's forward a micro-batch at a time. ``pool``: None (per rank, as the official code) or an all-reduce(SUM)
    of a flat float64 tensor, in place or returning the sum (spec §2.4). Returns a ``DeltaResult`` whose ``lam_bar``
    lists each chunk's λ̄ [b, t] (one chunk, no pool: ``delta_coefficients``' bit for bit). Memory beside a chunk: a
    margin and the mask per token. Raises its ValueErrors, and on changed chunks."""
    functions = _checked(functions, K, lam_min, lam_max)
    batch = Chunks(chunks)
    with torch.no_grad():
        # Step 0 (Eq. 2–3): each side's Σ|Â|·v and mass M± = Σ|Â| over every chunk (and process)
        sums_pos, sums_neg = pooled_sums([centroid_sums(v, adv, mask) for _, v, adv, mask in batch.read()], pool)
        if not (sums_pos.weight > 0 and sums_neg.weight > 0):  # guard (spec §6): no discriminator without both
            return DeltaResult([mask.clone() for _, mask in batch.adv_masks])  # the guard's result
        mu_pos = centroid(sums_pos, batch.dtype)
        mu_neg = centroid(sums_neg, batch.dtype)
        # Step 1: the margins Δ⁽⁰⁾ at μ⁽⁰⁾, [b, t] per chunk (kept to the end: one float per token)
        margin = [_margins(v, adv, mu_pos, mu_neg, functions) for _, v, adv, _ in batch.read()]
        advs = [adv for adv, _ in batch.adv_masks]
        # Step 2: γ±⁽⁰⁾ from the sums of each side's margins
        chunk_sums = [margin_sums(margin_j, adv, mask) for margin_j, (adv, mask) in zip(margin, batch.adv_masks)]
        moments_pos, moments_neg = pooled_sums(chunk_sums, pool)
        gamma0_pos, gamma0_neg = adaptive_temperature(moments_pos, moments_neg)
        gamma_pos, gamma_neg = functions.gamma(moments_pos, moments_neg)
        for k in range(K):  # Step 3: the K refinements, one pass over the chunks each
            chunk_sums = []
            for j, v, adv, mask in batch.read():
                if k > 0:  # Δ⁽ᵏ⁾ at μ⁽ᵏ⁾ (Δ⁽⁰⁾ is step 1's)
                    margin[j] = _margins(v, adv, mu_pos, mu_neg, functions)
                assign = functions.assignment(margin[j], gamma_pos, gamma_neg, adv)  # α⁽ᵏ⁾
                chunk_sums.append(centroid_sums(v, adv, mask, assign) + margin_sums(margin[j], adv, mask))
            sums_pos, sums_neg, moments_pos, moments_neg = pooled_sums(chunk_sums, pool)
            mu_pos = centroid(sums_pos, batch.dtype, mu_pos)  # μ±⁽ᵏ⁺¹⁾ with weights |Â|·α⁽ᵏ⁾
            mu_neg = centroid(sums_neg, batch.dtype, mu_neg)
            gamma_pos, gamma_neg = functions.gamma(moments_pos, moments_neg)  # lagged: of Δ⁽ᵏ⁾, at μ⁽ᵏ⁾
        if K > 0:  # Step 4: the final margins, at μ⁽ᴷ⁾
            margin = [_margins(v, adv, mu_pos, mu_neg, functions) for _, v, adv, _ in batch.read()]
        # Steps 4–5: α* = σ(Δ/γ⁽ᴷ⁾), λ = λ_min + (λ_max − λ_min)·α*
        assign = [functions.assignment(margin_j, gamma_pos, gamma_neg, adv) for margin_j, adv in zip(margin, advs)]
        lam = [functions.coefficients(a, adv, m, lam_min, lam_max) for a, (adv, m) in zip(assign, batch.adv_masks)]
        # Step 6 (Eq. 8): λ̄ = λ·n_valid/max(Z, ε), one scale over every chunk (and process)
        n_valid = sum(mask.sum(dtype=torch.float64) for _, mask in batch.adv_masks)
        Z = sum(lam_j.sum(dtype=torch.float64) for lam_j in lam)
        totals = _pooled(torch.stack([n_valid, Z]), pool)  # (n_valid, Z) of every process
        scale = functions.normalize(totals[0], totals[1])
        lam_bar = [lam_j * scale.to(lam_j.dtype) for lam_j in lam]
        return DeltaResult(lam_bar, mu_pos, mu_neg, gamma_pos, gamma_neg, gamma0_pos, gamma0_neg, scale, False)


class Chunks:
    """The chunks (v, Â, float mask), read per pass (``read``: j, v, Â, mask); ``adv_masks``: each chunk's (Â, mask)
    from the first pass, which the later ones must repeat. A list is validated once, here."""

    def __init__(self, chunks):
        if not callable(chunks) and iter(chunks) is chunks:
            raise ValueError("chunks must be a list or a callable returning a fresh iterable, not a one-shot iterator")
        self.adv_masks = []
        self.dtype = None  # the first chunk's working dtype, then every chunk's
        self.source = chunks
        self.given = None if callable(chunks) else [self._prepare(j, chunk) for j, chunk in enumerate(chunks)]

    def _prepare(self, j: int, chunk):  # validated (v, Â, float mask) in the first chunk's working dtype
        if not (isinstance(chunk, (tuple, list)) and len(chunk) == 3):
            raise ValueError(f"chunks[{j}] must be a (v, adv, loss_mask) tuple")
        prepared = _prepare(*chunk, dtype=self.dtype, where=f" in chunks[{j}]")
        self.dtype = prepared[0].dtype
        return prepared

    def read(self):
        n = len(self.adv_masks)
        j = -1
        for j, chunk in enumerate(self.source() if self.given is None else self.given):
            v, adv, mask = self._prepare(j, chunk) if self.given is None else chunk
            if n == 0:  # the first pass keeps Â and the mask (a float per token), the later ones check them
                self.adv_masks.append((adv, mask))
            elif j >= n or not (torch.equal(adv, self.adv_masks[j][0]) and torch.equal(mask, self.adv_masks[j][1])):
                raise ValueError(f"chunks changed between passes (chunk {j}): adv, loss_mask or their number")
            yield j, v, adv, mask
        if j + 1 != len(self.adv_masks) or not self.adv_masks:  # a later pass yielded fewer chunks, or none came
            raise ValueError(f"chunks yielded {j + 1} chunks, expected {len(self.adv_masks) or 'at least one'}")


def pooled_sums(chunk_sums: list, pool: Optional[Callable]) -> tuple:
    """The chunks' float64 sums added, then over the processes (``pool``; None: this process): ``chunk_sums``
    holds per chunk a tuple of NamedTuples of tensors, alike; returns one such tuple (one chunk: its own values)."""
    total = [tensor for group in chunk_sums[0] for tensor in group]
    for part in chunk_sums[1:]:
        total = [a + b for a, b in zip(total, (tensor for group in part for tensor in group))]
    flat = _pooled(torch.cat([tensor.reshape(-1) for tensor in total]), pool)  # the processes' sum
    rest = iter(flat.split([tensor.numel() for tensor in total]))
    return tuple(type(group)(*(next(rest).view_as(tensor) for tensor in group)) for group in chunk_sums[0])


def _margins(v: Tensor, adv: Tensor, mu_pos: Tensor, mu_neg: Tensor, functions: DeltaFunctions) -> Tensor:
    return functions.score(squared_distance(v, mu_pos), squared_distance(v, mu_neg), adv)  # Δ [b, t] at (μ₊, μ₋)


def _checked(functions, K, lam_min, lam_max) -> DeltaFunctions:  # the functions (None: the paper's) of valid settings
    if isinstance(K, bool) or not isinstance(K, int) or K < 0 or not 0 <= lam_min <= lam_max < math.inf or lam_max <= 0:
        raise ValueError(f"need an int K >= 0 and 0 <= lam_min <= lam_max < inf; got {K!r}, {lam_min!r}, {lam_max!r}")
    return functions or DeltaFunctions()


def _pooled(flat: Tensor, pool: Optional[Callable]) -> Tensor:  # a flat float64 tensor summed over the processes
    out = flat if pool is None else pool(flat)
    return flat if out is None else out


def _check_shapes(first, first_name: str, others: dict, where: str = "") -> None:  # first [B, T, H] (lam_bar [B, T])
    dims = 2 if first_name == "lam_bar" else 3
    if not isinstance(first, Tensor) or first.dim() != dims:
        raise ValueError(f"{first_name}{where} must be a {dims}-dim tensor, got shape {getattr(first, 'shape', ())}")
    for name, tensor in others.items():  # adv [B], the others [B, T]
        want = list(first.shape[:1] if name == "adv" else first.shape[:2])
        if not isinstance(tensor, Tensor) or list(tensor.shape) != want:
            raise ValueError(f"{name}{where} must be a tensor of shape {want}, got {getattr(tensor, 'shape', ())}")


def _mask01(loss_mask: Tensor, name: str = "loss_mask") -> Tensor:  # bool or 0/1 mask -> bool mask
    if loss_mask.dtype != torch.bool and not bool(((loss_mask == 0) | (loss_mask == 1)).all()):
        raise ValueError(f"{name} must contain only 0/1 (or be bool)")
    return loss_mask != 0


def _row_blocks(v: Tensor) -> list:  # v's rows [b, t, H] as slices of ROW_BLOCK_BYTES, at least one row each
    rows = max(1, ROW_BLOCK_BYTES // max(math.prod(v.shape[1:]) * v.element_size(), 1))
    return [slice(a, a + rows) for a in range(0, v.shape[0], rows)]


def _prepare(v, adv, loss_mask, dtype: Optional[torch.dtype] = None, where: str = "") -> tuple:
    # validated: v in the working dtype (None: v's if float64, else float32), +0.0 on padding (copied unless), Â, mask
    _check_shapes(v, "v", {"adv": adv, "loss_mask": loss_mask}, where)
    dtype = dtype or (torch.float64 if v.dtype == torch.float64 else torch.float32)
    if not bool(torch.isfinite(adv).all()):
        raise ValueError(f"adv{where} must be finite")
    v = v.detach()
    valid = _mask01(loss_mask, f"loss_mask{where}").to(v.device)
    if v.dtype != dtype:  # a converted copy anyway: masked in place
        v = v.to(dtype).masked_fill_(~valid[..., None], 0.0)
    elif any(v[rows][~valid[rows]].view(torch.uint8).any() for rows in _row_blocks(v)):  # any bit set: NaN, −0.0
        v = torch.where(valid[..., None], v, torch.zeros((), dtype=dtype, device=v.device))  # the masked copy
    return v, adv.detach().to(device=v.device, dtype=dtype), valid.to(dtype)


if __name__ == "__main__":  # the header's example on a tiny random Qwen3 (transformers: imported here only)
    from transformers import Qwen3Config, Qwen3ForCausalLM

    import delta

    torch.manual_seed(0)
    sizes = dict(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, head_dim=8)
    model = Qwen3ForCausalLM(Qwen3Config(**sizes, num_attention_heads=4, num_key_value_heads=2)).eval()
    input_ids = torch.randint(0, 64, (4, 3 + 5))  # B = 4 rows: a prompt of 3 tokens, a response of T = 5
    attention_mask = torch.ones_like(input_ids)
    loss_mask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [1, 1, 0, 0, 0]]).bool()
    adv = torch.tensor([0.9, -0.9, 0.5, 0.0])
    T = loss_mask.shape[1]
    positions = (attention_mask.cumsum(-1) - 1).clamp(min=0)  # real tokens only, as generate() counts them
    with torch.no_grad():  # θ_old's forward
        out = model(input_ids, attention_mask=attention_mask, position_ids=positions, output_hidden_states=True)
    logits = out.logits[:, -T - 1 : -1].float()  # [B, T, V]: the positions that predict the response tokens
    old_logp = logits.log_softmax(-1).gather(-1, input_ids[:, -T:, None]).squeeze(-1)  # ℓ0 [B, T] (temperature 1)
    hidden = out.hidden_states[-1][:, -T - 1 : -1]  # [B, T, H] lm_head input (post-norm; or a pre-hook on lm_head)
    v = delta.proxy_vectors(hidden, old_logp, loss_mask)  # App. F: v = (1 − p)·h, [B, T, H]
    result = delta.delta_coefficients(v, adv, loss_mask)  # result.lam_bar: λ̄ [B, T], mean 1 over valid tokens
    token_adv = delta.delta_token_advantages(adv, result.lam_bar, loss_mask)  # Ã = Â·λ̄ [B, T] -> your PPO loss
    stats = delta.delta_stats(result, adv, loss_mask)  # what to log: {delta.STAT_KEYS: float}
    print(f"lam_bar {result.lam_bar}\ntoken_adv {token_adv}\nstats {stats}")
