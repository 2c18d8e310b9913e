"""DelTA: discriminative token credit assignment for RLVR (token coefficients λ̄).

Source: Kaiyi Zhang, Wei Wu, Yankai Lin, "DelTA: Discriminative Token Credit Assignment for Reinforcement Learning from
Verifiable Rewards", arXiv 2605.21467 (2026); official code RUCBM/DelTA (verl-DelTA/verl/workers/actor/dp_actor.py,
``compute_log_prob_h``). Spec: docs/specs/delta.md ("spec §x"). Names as docs/glossary.md: Â ``adv``, Ã ``token_adv``,
Δ ``margin``, γ ``gamma``, α ``assign``, λ ``lam``, λ̄ ``lam_bar``.

Why (Sec. 3.1, App. C): at θ_old the DAPO update Δθ ∝ Σ Â_i v_{i,t} (v = ∇_θ log π(o_{i,t})) splits by the sign of Â
into M₊μ̄₊ − M₋μ̄₋ (Eq. 2–3: advantage masses M± = Σ|Â|, μ̄± the |Â|-weighted centroids of v), a linear discriminator
(Eq. 4) blurred by tokens common to both sides. DelTA re-weights tokens so that the centroids become contrastive;
``delta_coefficients_chunked`` runs the spec's steps (§2.3) in this order:
  App. F  proxy v_t = (1 − p(y_t))·h_t, h_t the LM head's input [``proxy_vectors``]
  step 0  centroids μ± = Σ|Â|·v / M± of side P (Â > 0) and side Nn (Â < 0); Â = 0 responses are on neither
  step 1  own-side margins Δ⁺ = ‖v − μ₋‖² − ‖v − μ₊‖² on P, Δ⁻ = −Δ⁺ on Nn [``contrastive_margins``]
  step 2  temperatures γ± = population std of each side's margins [``adaptive_temperature``]
  step 3  K refinements: α = σ(Δ/γ) [``soft_assignment``; App. G], centroids re-weighted by |Â|·α, γ lagged (App. H)
  step 4  final α* = σ(Δ/γ) at μ⁽ᴷ⁾;  step 5: λ = λ_min + (λ_max − λ_min)·α* [``bounded_coefficients``]
  step 6  λ̄ = λ·N/Z, N the valid tokens (``n_valid``), Z = Σλ [``self_normalization``; Eq. 8]; Ã = Â·λ̄ for the
          unchanged token-mean loss [``delta_token_advantages``]. The ablations are whole functions beside it.
The batch comes as chunks (v, Â, mask), a list or a callable yielding them afresh (h recomputed a micro-batch at a
time): every statistic is a float64 sum of the chunks' sums (spec §2.5). ``delta_coefficients(v, adv, mask)`` -> λ̄ is
the one-chunk call; ``delta_coefficients_chunked(chunks)`` -> ``DeltaResult``; ``delta_stats(result)`` -> the logs.

Inferred or different from the official code (spec §2.4, §6): (1) centroids, γ, N and Z are pooled over everything
passed in, as the code does per data-parallel rank (``pool``: over ranks). (2) One side empty: λ̄ ≡ 1 on
valid tokens (plain DAPO; the code has no guard). (3) Per-token maths in float32 (float64 for float64 v), statistics
summed in float64; 1 − p = −expm1(log p). (4) ‖v − μ‖² a block of rows at a time (the code's "Normal"). (5) T ≠ 1:
the proxy omits the exact gradient's 1/T, like the code (λ̄ is scale-invariant in v). (6) A side whose refinement
weights sum to 0 keeps its centroid. Left out: the forward pass and the PPO loss (the caller's, see the example); the
ℓ2-centroid variant (undefined, spec §6); the release's dead code ("LDA" variance overwritten by ones, ``pred``,
``calculate_rhoed_adv``); the ablations (delta_ablations.py). Read next: spec §2.3–2.5, §7.

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
    v = delta.proxy_vectors(hidden, old_logp, response_mask)  # App. F: v = (1 − p)·h, [B, T, H]
    lam_bar = delta.delta_coefficients(v, adv, response_mask)  # λ̄ [B, T], mean 1 over valid tokens
    token_adv = delta.delta_token_advantages(adv, lam_bar, response_mask)  # Ã = Â·λ̄ [B, T] -> your PPO loss
"""

from __future__ import annotations

import math
from typing import Callable, NamedTuple, Optional

import torch
from torch import Tensor

SIDES = ("pos", "neg")  # the sides P (Â > 0) and Nn (Â < 0), in every statistic's name
EPS = 1e-8  # spec §2.3: ε of the centroid denominators, of γ's variance and of Z
# Bytes of v − μ formed at a time (a block of rows, at least one): at the papers' 4,096 × 4,096 × 4 B a row is 67 MB
ROW_BLOCK_BYTES = 16 * 2**20
STAT_KEYS = (
    ("delta/lam_pos_mean", "delta/lam_pos_std", "delta/lam_pos_min", "delta/lam_pos_max", "delta/lam_neg_mean")
    + ("delta/lam_neg_std", "delta/lam_neg_min", "delta/lam_neg_max", "delta/cos_mu", "delta/mu_pos_norm")
    + ("delta/mu_neg_norm", "delta/gamma_pos", "delta/gamma_neg", "delta/gamma0_pos", "delta/gamma0_neg")
    + ("delta/n_pos", "delta/n_neg", "delta/n_zero", "delta/scale", "delta/fallback")
)


def proxy_vectors(hidden: Tensor, old_logp: Tensor, response_mask: Tensor) -> Tensor:
    """App. F's token-gradient proxy v_t = (1 − p(y_t))·h_t = ∂ log p(y_t) / ∂ W_lm_head[y_t] (the sampled token's row
    of the LM head only). hidden: [B, T, H] input of ``lm_head`` (after the final norm) at the positions that predict
    the response tokens; old_logp: [B, T] θ_old's log-probs (nats); response_mask: [B, T] bool or 0/1. Returns v
    [B, T, H] float32 (float64 if an input is), detached, +0.0 on padding. Raises ValueError on bad shapes or mask."""
    _check_shapes(hidden, "hidden", {"old_logp": old_logp, "response_mask": response_mask})
    dtype = torch.float64 if torch.float64 in (hidden.dtype, old_logp.dtype) else torch.float32
    with torch.no_grad():
        valid = _mask01(response_mask).to(hidden.device)
        one_minus_p = -torch.expm1(old_logp.detach().to(device=hidden.device, dtype=dtype))  # 1 − p(y_t), [B, T]
        v = one_minus_p[..., None] * hidden.detach().to(dtype)  # [B, T, H], the one this allocates
        return v.masked_fill_(~valid[..., None], 0.0)  # in place: +0.0 on padding (NaN there cannot leak)


# The steps of the method, in the spec's order (each takes and returns tensors) ---------------------------------
def contrastive_margins(dist_pos: Tensor, dist_neg: Tensor, adv: Tensor) -> Tensor:
    """Step 1 (Sec. 3.2): each token's own-side margin Δ [b, T] from its squared distances ‖v − μ₊‖², ‖v − μ₋‖² [b, T]
    and Â [b]: Δ⁺ = ‖v − μ₋‖² − ‖v − μ₊‖² where Â > 0, Δ⁻ = −Δ⁺ elsewhere. Δ⁺ = 2vᵀ(μ₊ − μ₋) + ‖μ₋‖² − ‖μ₊‖² is
    Eq. 4's linear discriminator plus an offset. Units of v²."""
    return torch.where((adv > 0)[:, None], dist_neg - dist_pos, dist_pos - dist_neg)


def adaptive_temperature(sum_margin: Tensor, sum_margin2: Tensor, count: Tensor, eps: float = EPS) -> Tensor:
    """Steps 2–3 (Sec. 3.2, App. H): γ = sqrt(max(E[Δ²] − E[Δ]², ε)), the population std of a side's margins, from the
    float64 sums Σ Δ, Σ Δ² over its ``count`` tokens (clamped at 1); elementwise: P's and Nn's [2] give (γ₊, γ₋). Units
    of Δ. Lagged (paper = code): refinement k uses the std of Δ⁽ᵏ⁾, before its update (γ⁽¹⁾ = γ⁽⁰⁾, at μ⁽⁰⁾)."""
    mean = sum_margin / (n := count.clamp(min=1.0))
    return torch.sqrt(torch.clamp(sum_margin2 / n - mean * mean, min=eps))


def soft_assignment(margin: Tensor, gamma_pos: Tensor, gamma_neg: Tensor, adv: Tensor) -> Tensor:
    """α = σ(Δ/γ) (App. G: the maximiser of α·Δ + γ·H(α)) with the token's own side's temperature, γ₊ where Â > 0,
    γ₋ elsewhere. margin Δ [b, T], γ± 0-dim, adv Â [b] -> α [b, T] in (0, 1) (the caller masks)."""
    return torch.where((adv > 0)[:, None], torch.sigmoid(margin / gamma_pos), torch.sigmoid(margin / gamma_neg))


def bounded_coefficients(assign: Tensor, adv: Tensor, mask: Tensor, lam_min: float, lam_max: float) -> Tensor:
    """Step 5: λ = λ_min + (λ_max − λ_min)·α (Sec. 3.2): ``assign`` α [b, T], ``adv`` Â [b], float 0/1 ``mask``
    [b, T]; responses with Â = 0 get λ_min, padding 0. Returns λ [b, T] (before step 6's normalisation)."""
    return torch.where((adv == 0)[:, None], lam_min, lam_min + (lam_max - lam_min) * assign) * mask


def self_normalization(n_valid: Tensor, Z: Tensor) -> Tensor:
    """Step 6 (Eq. 8): the one scale of λ̄ = λ·N/max(Z, ε), N = ``n_valid`` the valid tokens (Â = 0 ones included),
    Z = Σλ, both float64 0-dim over the whole batch: then (1/N) Σ λ̄ℓ = (1/Z) Σ λℓ."""
    return n_valid / Z.clamp(min=EPS)


class DeltaResult(NamedTuple):
    """``delta_coefficients_chunked``'s λ̄ [b, t] of each chunk (``lam_bar``) and what ``delta_stats`` reads: each
    chunk's (Â, float mask) ``kept``, float64 ``sums`` (step 0's; step 2's ``margins`` at μ⁽⁰⁾), the ``pool``,
    (μ₊, μ₋)⁽ᴷ⁾ ``mu`` [H] each (None: the guard fired), the γ± used last ``gamma`` and ``scale`` = N/Z."""

    lam_bar: list
    kept: list
    sums: dict
    pool: Optional[Callable]
    mu: Optional[tuple] = None
    gamma: tuple = (math.nan, math.nan)
    scale: float = 1.0


def delta_coefficients(v: Tensor, adv: Tensor, response_mask: Tensor, K=1, lam_min=0.8, lam_max=1.2, *, pool=None):
    """``delta_coefficients_chunked`` on one chunk: v [B, T, H] (``proxy_vectors``), adv Â [B], response_mask [B, T]
    -> λ̄ [B, T]. Statistics: ``delta_stats(delta_coefficients_chunked([(v, adv, response_mask)]))``."""
    return delta_coefficients_chunked([(v, adv, response_mask)], K, lam_min, lam_max, pool).lam_bar[0]


def delta_coefficients_chunked(chunks, K=1, lam_min=0.8, lam_max=1.2, pool=None) -> DeltaResult:
    """λ̄, DelTA's normalised token coefficients over a whole rollout batch (spec §2.3 steps 0–6), no gradient.
    ``chunks``: the batch's rows as (v [b, t, H], Â [b], mask [b, t] bool or 0/1) tuples (Â > 0: side P, < 0: Nn,
    = 0: neither, yet counted in N and Z), a list or a zero-arg callable returning them afresh, in the same order, at
    each of its K + 3 calls (2 for K = 0): e.g. re-running θ_old's forward a micro-batch at a time. K: refinements
    (paper 1); λ in [lam_min, lam_max]; pool: None (the chunks' own statistics: per rank, as the official code) or an
    all-reduce(SUM) of a flat float64 tensor, in place or returning the sum (spec §2.4). Returns a ``DeltaResult``: λ̄
    [b, t] per chunk, float32 (float64 for float64 v), 0 on padding, mean 1 over valid tokens (≡ 1 when a side is
    empty: spec §6 guard). Memory beside v (copied once unless +0.0 on padding): a ROW_BLOCK_BYTES block of v − μ, a
    margin and the mask per token. Raises ValueError on bad shapes, masks, Â, K or λ range, or changing chunks."""
    if isinstance(K, bool) or not isinstance(K, int) or K < 0 or not 0 <= lam_min <= lam_max < math.inf or lam_max <= 0:
        raise ValueError(f"need an int K >= 0 and 0 <= lam_min <= lam_max < inf; got {K!r}, {lam_min!r}, {lam_max!r}")
    batch = Chunks(chunks)
    with torch.no_grad():
        # Step 0 (Eq. 2–3): per side Σ|Â|·v and the advantage mass M± = Σ|Â|; the valid tokens on P, on Nn, in all.
        sums = pooled_sums((centroid_sums(v, adv, mask) for _, v, adv, mask in batch.read()), pool)
        if not (sums["n_pos"] > 0 and sums["n_neg"] > 0):  # guard (spec §6): no discriminator without both sides
            return DeltaResult([mask.clone() for _, mask in batch.kept], batch.kept, sums, pool)
        mu = centroids(sums, batch.dtype)  # (μ₊⁽⁰⁾, μ₋⁽⁰⁾), [H] each
        # Step 1: the margins Δ⁽⁰⁾ at μ⁽⁰⁾, [b, t] per chunk (kept to the end: one float per token).
        margin = [contrastive_margins(*squared_distances(v, mu), adv) for _, v, adv, _ in batch.read()]
        # Step 2: γ±⁽⁰⁾ from the sums of each side's margins (the paper's: their std).
        parts = [margin_moments(margin_j, adv, mask) for margin_j, (adv, mask) in zip(margin, batch.kept)]
        moments = pooled_sums(parts, pool)
        gamma = adaptive_temperature(*moments["margins"])  # (γ₊, γ₋) [2]
        for k in range(K):  # Step 3: the K refinements, one pass over the chunks each
            parts = []
            for j, v, adv, mask in batch.read():
                if k > 0:  # Δ⁽ᵏ⁾ at μ⁽ᵏ⁾ (Δ⁽⁰⁾ is step 1's)
                    margin[j] = contrastive_margins(*squared_distances(v, mu), adv)
                assign = soft_assignment(margin[j], *gamma, adv)  # α⁽ᵏ⁾ = σ(Δ⁽ᵏ⁾/γ⁽ᵏ⁾)
                parts.append({**centroid_sums(v, adv, mask, assign), **margin_moments(margin[j], adv, mask)})
            sums_k = pooled_sums(parts, pool)
            mu = centroids(sums_k, batch.dtype, mu)  # μ±⁽ᵏ⁺¹⁾ with weights |Â|·α⁽ᵏ⁾
            gamma = adaptive_temperature(*sums_k["margins"])  # lagged (App. H): γ⁽ᵏ⁺¹⁾ of Δ⁽ᵏ⁾, at μ⁽ᵏ⁾
        if K > 0:  # the final margins, at μ⁽ᴷ⁾ (K = 0: step 1's, at μ⁽⁰⁾)
            margin = [contrastive_margins(*squared_distances(v, mu), adv) for _, v, adv, _ in batch.read()]
        # Steps 4–5: α* = σ(Δ/γ⁽ᴷ⁾), λ = λ_min + (λ_max − λ_min)·α*; Â = 0 responses λ_min, padding 0.
        lam = [
            bounded_coefficients(soft_assignment(margin_j, *gamma, adv), adv, mask, lam_min, lam_max)
            for margin_j, (adv, mask) in zip(margin, batch.kept)
        ]
        # Step 6 (Eq. 8): λ̄ = λ·N/max(Z, ε), one scale over every chunk (and process); N counts Â = 0 tokens too.
        Z = pooled_sums(({"Z": lam_j.sum(dtype=torch.float64)} for lam_j in lam), pool)["Z"]
        scale = self_normalization(sums["n_valid"], Z)
        lam_bar = [lam_j * scale.to(lam_j.dtype) for lam_j in lam]
        return DeltaResult(lam_bar, batch.kept, {**sums, **moments}, pool, mu, gamma, scale)


def delta_stats(result: DeltaResult) -> dict:
    """The ``STAT_KEYS`` of a ``DeltaResult``, floats (NaN where undefined): λ̄ per side (mean, std; min, max: this
    process's), cos and norms of μ±⁽ᴷ⁾, the γ± used last, γ±⁽⁰⁾ measured (``adaptive_temperature`` at μ⁽⁰⁾), valid
    tokens with Â > 0, < 0, = 0, scale = N/Z (λ = λ̄/scale), fallback = 1.0 where the guard fired."""
    sums = result.sums
    lam_bar = result.lam_bar
    counts = (sums["n_pos"], sums["n_neg"], sums["n_valid"] - sums["n_pos"] - sums["n_neg"])
    stats = []
    for sign, n in ((1, float(counts[0])), (-1, float(counts[1]))):  # λ̄ on P, then on Nn: mean, std, min, max
        on_side = [(adv * sign > 0).to(mask.dtype)[:, None] * mask for adv, mask in result.kept]
        parts = [{"1": (lb.double() * w).sum(), "2": (lb.double() ** 2 * w).sum()} for lb, w in zip(lam_bar, on_side)]
        moments = pooled_sums(parts, result.pool)
        mean = float(moments["1"]) / max(n, 1.0)
        variance = float(moments["2"]) / max(n, 1.0) - mean * mean
        here = torch.cat([lb[w > 0] for lb, w in zip(lam_bar, on_side)])
        extremes = [float(here.min()), float(here.max())] if here.numel() else [math.nan] * 2
        stats += [mean, math.sqrt(max(variance, 0.0)), *extremes] if n > 0 else [math.nan] * 4
    mu = result.mu  # None: the guard fired (no centroids, no margins)
    norms = [float(centroid.double().norm()) for centroid in mu] if mu else [math.nan] * 2
    cos = float(mu[0].double() @ mu[1].double()) / (norms[0] * norms[1]) if mu and min(norms) > 0 else math.nan
    gamma0 = adaptive_temperature(*sums["margins"]) if mu else [math.nan] * 2  # measured at μ⁽⁰⁾
    stats += [cos, *norms, *result.gamma, *gamma0, *counts, result.scale, mu is None]
    return {key: float(value) for key, value in zip(STAT_KEYS, stats)}


def delta_token_advantages(adv: Tensor, lam_bar: Tensor, response_mask: Tensor) -> Tensor:
    """Ã_{i,t} = Â_i·λ̄_{i,t}·mask_{i,t} (spec §2.3 step 7; λ̄ > 0 keeps sign(Â) and every clip branch DAPO's): adv Â
    [B], lam_bar λ̄ [B, T], response_mask [B, T] -> Ã [B, T] (promoted dtype), detached, 0 on padding."""
    _check_shapes(lam_bar, "lam_bar", {"adv": adv, "response_mask": response_mask})
    dtype = torch.promote_types(adv.dtype, lam_bar.dtype)
    mask = _mask01(response_mask).to(device=lam_bar.device, dtype=dtype)
    return adv.detach().to(device=lam_bar.device, dtype=dtype)[:, None] * lam_bar.detach().to(dtype) * mask


# The batch as chunks, and the sums each pass takes of a chunk (public: delta_ablations.py's loop reads them) -------
class Chunks:
    """The batch's chunks (v, Â, float mask), read once per pass (``read``: j, v, Â, mask); ``kept`` holds each
    chunk's (Â, mask) from the first pass, which the later ones must repeat. A list is validated once, here."""

    def __init__(self, chunks):
        if not callable(chunks) and iter(chunks) is chunks:
            raise ValueError("chunks must be a list or a callable returning a fresh iterable, not a one-shot iterator")
        self.kept = []
        self.dtype = None  # the first chunk's working dtype
        self.single = not callable(chunks) and len(chunks) == 1  # errors name no chunk
        self.source = chunks
        self.given = None if callable(chunks) else [self._prepare(j, chunk) for j, chunk in enumerate(chunks)]

    def _prepare(self, j: int, chunk):  # validated (v, Â, float mask) in the first chunk's working dtype
        if not (isinstance(chunk, (tuple, list)) and len(chunk) == 3):
            raise ValueError(f"chunks[{j}] must be a (v, adv, response_mask) tuple")
        if self.dtype is None:
            self.dtype = torch.float64 if getattr(chunk[0], "dtype", None) == torch.float64 else torch.float32
        return _prepare(*chunk, dtype=self.dtype, where="" if self.single else f" in chunks[{j}]")

    def read(self):
        n = len(self.kept)
        j = -1
        for j, chunk in enumerate(self.source() if self.given is None else self.given):
            v, adv, mask = self._prepare(j, chunk) if self.given is None else chunk
            if n == 0:  # the first pass keeps Â and the mask (a float per token), the later ones check them
                self.kept.append((adv, mask))
            elif j >= n or not (torch.equal(adv, self.kept[j][0]) and torch.equal(mask, self.kept[j][1])):
                raise ValueError(f"chunks changed between passes (chunk {j}): adv, response_mask or their number")
            yield j, v, adv, mask
        if j + 1 != len(self.kept) or not self.kept:  # a later pass yielded fewer chunks, or none came
            raise ValueError(f"chunks yielded {j + 1} chunks, expected {len(self.kept) or 'at least one'}")


def pooled_sums(parts, pool: Optional[Callable]) -> dict:
    """Named float64 statistics summed over the chunks (one chunk: its own, bit for bit), then over the ranks
    (``pool``)."""
    sums = {}
    for part in parts:
        sums.update({key: sums[key] + value if key in sums else value for key, value in part.items()})
    if pool is None:
        return sums
    flat = torch.cat([value.reshape(-1) for value in sums.values()])
    out = pool(flat)
    pieces = (flat if out is None else out).split([value.numel() for value in sums.values()])
    return {key: piece.view_as(sums[key]) for key, piece in zip(sums, pieces)}


def centroid_sums(v: Tensor, adv: Tensor, mask: Tensor, assign: Optional[Tensor] = None) -> dict:
    """Eq. 2–3's Σw·v [H] and Σw of μ±, w = |Â|·α (step 0: α = 1, Σw = M±, tokens counted); the chunk's dtype, then
    float64."""
    out = {}
    for side, adv_side in zip(SIDES, (adv.clamp(min=0), (-adv).clamp(min=0))):
        w = adv_side[:, None] * mask if assign is None else assign * (adv_side[:, None] * mask)  # [b, t]
        out[f"wv_{side}"] = torch.einsum("bt,bth->h", w, v).double()
        out[f"w_{side}"] = w.sum().double()
    if assign is None:
        out["n_valid"] = mask.sum(dtype=torch.float64)
        out["n_pos"] = ((adv > 0)[:, None] * mask).sum(dtype=torch.float64)
        out["n_neg"] = ((adv < 0)[:, None] * mask).sum(dtype=torch.float64)
    return out


def centroids(sums: dict, dtype: torch.dtype, mu: tuple = (None, None)) -> tuple:
    """(μ₊, μ₋) = Σw·v / max(Σw, ε) [H], ε as in the working dtype (a float32 quotient's bits); weight 0: μ kept"""
    eps = float(torch.tensor(EPS, dtype=dtype))
    mu_new = [(sums[f"wv_{side}"] / sums[f"w_{side}"].clamp(min=eps)).to(dtype) for side in SIDES]
    keep = [mu_j is not None and not sums[f"w_{side}"] > 0 for side, mu_j in zip(SIDES, mu)]  # weight 0: μ kept
    return tuple(mu_j if keep_j else new_j for mu_j, new_j, keep_j in zip(mu, mu_new, keep))


def squared_distances(v: Tensor, mu: tuple) -> tuple:
    """(‖v − μ₊‖², ‖v − μ₋‖²) [b, t] each, v − μ formed a block of rows at a time: a token's sum over H is the same
    reduction in any block, so the result is (v − μ).pow(2).sum(-1) (tests/test_delta.py, float64)."""
    block = torch.empty((min(_block_rows(v), v.shape[0]),) + v.shape[1:], dtype=v.dtype, device=v.device)
    out = []
    for centroid in mu:
        dist = torch.empty(v.shape[:2], dtype=v.dtype, device=v.device)
        for rows in _row_blocks(v):  # ‖v − μ‖² of a block of rows, in ``block``
            torch.sum(torch.sub(v[rows], centroid, out=block[: len(v[rows])]).pow_(2), -1, out=dist[rows])
        out.append(dist)
    return tuple(out)


def margin_moments(margin: Tensor, adv: Tensor, mask: Tensor) -> dict:
    """the margins' Σ Δ, Σ Δ², count (rows) on P, Nn (columns), float64 [3, 2]: ``adaptive_temperature``'s arguments"""
    d64 = margin.double()
    w64 = [(on_side.to(mask.dtype)[:, None] * mask).double() for on_side in (adv > 0, adv < 0)]
    return {"margins": torch.stack([torch.stack([(d64 * w).sum(), (d64 * d64 * w).sum(), w.sum()]) for w in w64], 1)}


# Validation and masking at the boundary ----------------------------------------------------------------------
def _check_shapes(first, first_name: str, others: dict, where: str = "") -> None:  # first [B, T, H] (lam_bar [B, T])
    dims = 2 if first_name == "lam_bar" else 3
    if not isinstance(first, Tensor) or first.dim() != dims:
        raise ValueError(f"{first_name}{where} must be a {dims}-dim tensor, got shape {getattr(first, 'shape', ())}")
    for name, tensor in others.items():  # adv [B], the others [B, T]
        want = list(first.shape[:1] if name == "adv" else first.shape[:2])
        if not isinstance(tensor, Tensor) or list(tensor.shape) != want:
            raise ValueError(f"{name}{where} must be a tensor of shape {want}, got {getattr(tensor, 'shape', ())}")


def _mask01(response_mask: Tensor, name: str = "response_mask") -> Tensor:  # bool or 0/1 mask -> bool mask
    if response_mask.dtype != torch.bool and not bool(((response_mask == 0) | (response_mask == 1)).all()):
        raise ValueError(f"{name} must contain only 0/1 (or be bool)")
    return response_mask != 0


def _block_rows(v: Tensor) -> int:  # rows of v [b, t, H] per block: ROW_BLOCK_BYTES of it, at least one
    return max(1, ROW_BLOCK_BYTES // max(math.prod(v.shape[1:]) * v.element_size(), 1))


def _row_blocks(v: Tensor) -> list:  # v's rows as slices of ``_block_rows`` rows
    return [slice(a, a + _block_rows(v)) for a in range(0, v.shape[0], _block_rows(v))]


def _prepare(v, adv, response_mask, dtype: torch.dtype, where: str = "") -> tuple:
    # a chunk validated: v detached in the working dtype, +0.0 on padding (one masked copy unless it is), Â, 0/1 mask
    _check_shapes(v, "v", {"adv": adv, "response_mask": response_mask}, where)
    if not bool(torch.isfinite(adv).all()):
        raise ValueError(f"adv{where} must be finite")
    v = v.detach()
    valid = _mask01(response_mask, f"response_mask{where}").to(v.device)
    if v.dtype != dtype:  # a converted copy anyway: masked in place
        v = v.to(dtype).masked_fill_(~valid[..., None], 0.0)
    elif any(v[rows][~valid[rows]].view(torch.uint8).any() for rows in _row_blocks(v)):  # any bit set: NaN, −0.0
        v = torch.where(valid[..., None], v, torch.zeros((), dtype=dtype, device=v.device))  # the masked copy
    return v, adv.detach().to(device=v.device, dtype=dtype), valid.to(dtype)
