"""DelTA: discriminative token credit assignment for RLVR (token coefficients λ̄).

Source: Kaiyi Zhang, Wei Wu, Yankai Lin, "DelTA: Discriminative Token Credit Assignment for Reinforcement Learning from
Verifiable Rewards", arXiv 2605.21467 (2026); official code RUCBM/DelTA (verl-DelTA/verl/workers/actor/dp_actor.py,
``compute_log_prob_h``). Spec: docs/specs/delta.md ("spec §x"). Names as docs/glossary.md: Â ``adv``, Ã ``token_adv``,
Δ ``margin``, γ ``gamma``, α ``assign``, λ ``lam``, λ̄ ``lam_bar``.

Why (Sec. 3.1, App. C): at θ_old the DAPO update Δθ ∝ Σ Â_i v_{i,t} (v = ∇_θ log π(o_{i,t})) splits by the sign of Â
into M₊μ̄₊ − M₋μ̄₋ (Eq. 2–3: advantage masses M± = Σ|Â|, μ̄± the |Â|-weighted centroids of v), a linear discriminator
(Eq. 4) blurred by tokens common to both sides. DelTA re-weights tokens so that the centroids become contrastive;
``delta_coefficients`` runs the spec's steps (§2.3) in this order:
  App. F  proxy v_t = (1 − p(y_t))·h_t, h_t the LM head's input [``proxy_vectors``]
  step 0  centroids μ± = Σ|Â|·v / M± of side P (Â > 0) and side Nn (Â < 0); Â = 0 responses are on neither
  step 1  own-side margins Δ⁺ = ‖v − μ₋‖² − ‖v − μ₊‖² on P, Δ⁻ = −Δ⁺ on Nn [``contrastive_margins``]
  step 2  temperatures γ± = population std of each side's margins [``adaptive_temperature``, ``lagged_temperature``]
  step 3  K refinements: α = σ(Δ/γ) [``soft_assignment``; App. G], centroids re-weighted by |Â|·α, γ lagged (App. H)
  step 4  final α* = σ(Δ/γ) at μ⁽ᴷ⁾;  step 5: λ = λ_min + (λ_max − λ_min)·α* [``bounded_coefficients``]
  step 6  λ̄ = λ·N/Z, N the valid tokens (``n_valid``), Z = Σλ [``self_normalization``; Eq. 8]; Ã = Â·λ̄ for the
          unchanged token-mean loss [``delta_token_advantages``]. A variant swaps the steps ``DeltaSteps`` names.
The batch comes as chunks: ``delta_coefficients(v, adv, mask)`` is the one-chunk call; a list of (v, Â, mask) chunks,
or a callable yielding them afresh (h recomputed a micro-batch at a time), gives the same λ̄: every statistic is a
float64 sum of the chunks' sums (spec §2.5); on one chunk the arithmetic is the in-memory one, bit for bit.

Inferred or different from the official code (spec §2.4, §6): (1) centroids, γ, N and Z are pooled over everything
passed in, as the code does per data-parallel rank (``DeltaSteps.pool``: over ranks). (2) One side empty: λ̄ ≡ 1 on
valid tokens (plain DAPO; the code has no guard). (3) Per-token maths in float32 (float64 for float64 v), statistics
summed in float64; 1 − p = −expm1(log p). (4) ‖v − μ‖² a block of rows at a time (the code's "Normal"). (5) T ≠ 1:
the proxy omits the exact gradient's 1/T, like the code (λ̄ is scale-invariant in v). (6) A side whose refinement
weights sum to 0 keeps its centroid. Left out on purpose: the forward pass and the PPO loss (the caller's, see the
example); the ℓ2-centroid variant (undefined, spec §6); the release's dead code ("LDA" variance overwritten by ones,
``pred`` / top-20% mask, ``calculate_rhoed_adv``); the ablations (delta_ablations.py). Read next: spec §2.3–2.5, §7.

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

__all__ = ["proxy_vectors", "delta_coefficients", "DeltaSteps", "delta_token_advantages", "contrastive_margins",
           "adaptive_temperature", "lagged_temperature", "soft_assignment", "bounded_coefficients",
           "self_normalization"]

_NAN, SIDES = float("nan"), ("pos", "neg")  # the sides P (Â > 0) and Nn (Â < 0), in every statistic's name
EPS = 1e-8  # spec §2.3: ε of the centroid denominators, of γ's variance and of Z
# Bytes of v − μ formed at a time (a block of rows, at least one): at the papers' 4,096 × 4,096 × 4 B a row is 67 MB
ROW_BLOCK_BYTES = 16 * 2**20
# ``return_stats``' keys (floats): λ̄ on each side (min, max: this process's); cosine and norms of μ±⁽ᴷ⁾; the γ± used
# last; γ±⁽⁰⁾ measured; valid tokens with Â > 0, < 0, = 0; scale = N/Z (λ = λ̄/scale); fallback = 1.0: the guard fired.
STAT_KEYS = ("delta/lam_pos_mean", "delta/lam_pos_std", "delta/lam_pos_min", "delta/lam_pos_max", "delta/lam_neg_mean",
             "delta/lam_neg_std", "delta/lam_neg_min", "delta/lam_neg_max", "delta/cos_mu", "delta/mu_pos_norm",
             "delta/mu_neg_norm", "delta/gamma_pos", "delta/gamma_neg", "delta/gamma0_pos", "delta/gamma0_neg",
             "delta/n_pos", "delta/n_neg", "delta/n_zero", "delta/scale", "delta/fallback")


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


# The steps of the method that ``DeltaSteps`` names (each takes and returns tensors) ---------------------------
def contrastive_margins(dist_pos: Tensor, dist_neg: Tensor, adv: Tensor) -> Tensor:
    """Step 1 (Sec. 3.2): each token's own-side margin Δ [b, T] from its squared distances ‖v − μ₊‖², ‖v − μ₋‖² [b, T]
    and Â [b]: Δ⁺ = ‖v − μ₋‖² − ‖v − μ₊‖² where Â > 0, Δ⁻ = −Δ⁺ elsewhere. Δ⁺ = 2vᵀ(μ₊ − μ₋) + ‖μ₋‖² − ‖μ₊‖² is
    Eq. 4's linear discriminator plus an offset. Units of v²."""
    return torch.where((adv > 0)[:, None], dist_neg - dist_pos, dist_pos - dist_neg)


def adaptive_temperature(sum_margin: Tensor, sum_margin2: Tensor, count: Tensor, eps: float = EPS) -> Tensor:
    """γ of one side (Sec. 3.2, App. H): the population std of its margins, sqrt(max(E[Δ²] − E[Δ]², ε)), from the
    sums Σ Δ, Σ Δ² over its ``count`` valid tokens (0-dim tensors; count clamped at 1). Same units as Δ."""
    mean = sum_margin / (n := count.clamp(min=1.0))
    return torch.sqrt(torch.clamp(sum_margin2 / n - mean * mean, min=eps))


def lagged_temperature(gamma: tuple) -> tuple:
    """Steps 2–3 (App. H): the (γ₊, γ₋) used are the ones just measured (``adaptive_temperature``): γ⁽⁰⁾ at μ⁽⁰⁾, and
    γ⁽ᵏ⁺¹⁾ the std of Δ⁽ᵏ⁾, at the centroids before the update (lagged: γ⁽¹⁾ = γ⁽⁰⁾; paper = code)."""
    return gamma


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


class DeltaSteps(NamedTuple):
    """The steps of ``delta_coefficients`` a variant may swap, each a function with the signature shown (DelTA's
    ablations: delta_ablations.py); the defaults are the paper's. ``pool``: None (the statistics of the chunks given:
    per rank, as the official code) or an all-reduce(SUM) of a flat float64 tensor, in place or returning the sum."""
    score: Callable = contrastive_margins  # (dist_pos, dist_neg, adv) -> margin Δ [b, T]
    temperature: Callable = lagged_temperature  # (γ₊, γ₋) measured -> (γ₊, γ₋) used
    assign: Callable = soft_assignment  # (margin, gamma_pos, gamma_neg, adv) -> α [b, T]
    coefficients: Callable = bounded_coefficients  # (assign, adv, mask, lam_min, lam_max) -> λ [b, T]
    normalize: Callable = self_normalization  # (n_valid, Z) -> the float64 scale of λ̄ = λ·scale
    pool: Optional[Callable] = None  # e.g. torch.distributed.all_reduce: λ̄ over the rows of every rank


def delta_coefficients(v, adv: Optional[Tensor] = None, response_mask: Optional[Tensor] = None, K: int = 1,
                       lam_min: float = 0.8, lam_max: float = 1.2, *, steps: DeltaSteps = DeltaSteps(),
                       return_stats: bool = False):
    """λ̄, DelTA's normalised token coefficients over a whole rollout batch (spec §2.3 steps 0–6), no gradient.
    The batch: v [B, T, H] proxies (``proxy_vectors``; padding ignored), adv Â [B] (> 0: side P, < 0: side Nn, = 0:
    neither, yet counted in N and Z), response_mask [B, T] bool or 0/1; or chunks in ``v`` (adv, response_mask None),
    (v [b, t, H], Â [b], mask [b, t]) tuples: a list, or a zero-arg callable returning a fresh iterable of the same
    rows in the same order at each of its K + 3 calls (2 for K = 0), e.g. one that re-runs θ_old's forward and yields
    ``(delta.proxy_vectors(h, old_logp, mask), adv, mask)`` a micro-batch at a time. K: refinements (paper 1); λ in
    [lam_min, lam_max]; steps: ``DeltaSteps``. Returns λ̄ [B, T] (for chunks a list of λ̄ [b, t]), float32 (float64 for
    float64 v), 0 on padding, mean 1 over valid tokens; ≡ 1 on valid tokens when a side is empty (spec §6 guard).
    With ``return_stats``: (λ̄, ``STAT_KEYS`` dict). Memory: beside v (copied once, masked, unless +0.0 on padding), a
    ROW_BLOCK_BYTES block of v − μ and per token a margin and the mask (8 B: 0.34 GB at 2,048 × 20,480 tokens).
    Raises ValueError: bad shapes, a non-0/1 mask, non-finite Â, K not an int >= 0, not 0 <= lam_min <= lam_max > 0,
    chunks that change between passes or a one-shot iterator."""
    if isinstance(K, bool) or not isinstance(K, int) or K < 0 or not 0 <= lam_min <= lam_max < math.inf or lam_max <= 0:
        raise ValueError(f"need an int K >= 0 and 0 <= lam_min <= lam_max < inf; got {K!r}, {lam_min!r}, {lam_max!r}")
    batch = _Chunks(v, adv, response_mask, steps.pool)
    with torch.no_grad():
        # Step 0 (Eq. 2–3): per side Σ|Â|·v and the advantage mass M± = Σ|Â|; the valid tokens on P, on Nn, in all.
        sums = batch.total(_centroid_sums(v, adv, mask) for _, v, adv, mask in batch.read())
        if not (sums["n_pos"] > 0 and sums["n_neg"] > 0):  # guard (spec §6): no discriminator without both sides
            return _result(batch, [mask.clone() for _, mask in batch.kept], sums, return_stats)
        mu = _centroids(sums, batch.dtype)  # (μ₊⁽⁰⁾, μ₋⁽⁰⁾), [H] each
        # Step 1: the margins Δ⁽⁰⁾ at μ⁽⁰⁾, [b, t] per chunk (kept to the end: one float per token).
        margin = [steps.score(*_squared_distances(v, mu), adv) for _, v, adv, _ in batch.read()]
        # Step 2: γ±⁽⁰⁾ = the std of each side's margins (measured; reported), then the γ± the steps use.
        gamma0 = _temperatures(batch.total(_moments(margin_j, adv, mask) for margin_j, (adv, mask) in
                                           zip(margin, batch.kept)))
        gamma = steps.temperature(gamma0)
        for k in range(K):  # Step 3: the K refinements, one pass over the chunks each
            parts = []
            for j, v, adv, mask in batch.read():
                if k > 0:  # Δ⁽ᵏ⁾ at μ⁽ᵏ⁾ (Δ⁽⁰⁾ is step 1's)
                    margin[j] = steps.score(*_squared_distances(v, mu), adv)
                assign = steps.assign(margin[j], *gamma, adv)  # α⁽ᵏ⁾ = σ(Δ⁽ᵏ⁾/γ⁽ᵏ⁾)
                parts.append({**_centroid_sums(v, adv, mask, assign), **_moments(margin[j], adv, mask)})
            sums_k = batch.total(parts)
            mu = _centroids(sums_k, batch.dtype, mu)  # μ±⁽ᵏ⁺¹⁾ with weights |Â|·α⁽ᵏ⁾
            gamma = steps.temperature(_temperatures(sums_k))  # lagged (App. H): the std of Δ⁽ᵏ⁾, at μ⁽ᵏ⁾
        if K > 0:  # Step 4: the margins at μ⁽ᴷ⁾ (K = 0: step 1's, at μ⁽⁰⁾)
            margin = [steps.score(*_squared_distances(v, mu), adv) for _, v, adv, _ in batch.read()]
        # Steps 4–5: α* = σ(Δ/γ⁽ᴷ⁾), λ = λ_min + (λ_max − λ_min)·α*; Â = 0 responses λ_min, padding 0.
        lam = [steps.coefficients(steps.assign(margin_j, *gamma, adv), adv, mask, lam_min, lam_max)
               for margin_j, (adv, mask) in zip(margin, batch.kept)]
        # Step 6 (Eq. 8): λ̄ = λ·N/max(Z, ε), one scale over every chunk (and process); N counts Â = 0 tokens too.
        Z = batch.total({"Z": lam_j.sum(dtype=torch.float64)} for lam_j in lam)["Z"]
        scale = steps.normalize(sums["n_valid"], Z)
        lam_bar = [lam_j * scale.to(lam_j.dtype) for lam_j in lam]
        return _result(batch, lam_bar, sums, return_stats, mu, gamma, gamma0, scale)


def delta_token_advantages(adv: Tensor, lam_bar: Tensor, response_mask: Tensor) -> Tensor:
    """Ã_{i,t} = Â_i·λ̄_{i,t}·mask_{i,t} (spec §2.3 step 7; λ̄ > 0 keeps sign(Â) and every clip branch DAPO's): adv Â
    [B], lam_bar λ̄ [B, T], response_mask [B, T] -> Ã [B, T] (promoted dtype), detached, 0 on padding."""
    _check_shapes(lam_bar, "lam_bar", {"adv": adv, "response_mask": response_mask})
    dtype = torch.promote_types(adv.dtype, lam_bar.dtype)
    mask = _mask01(response_mask).to(device=lam_bar.device, dtype=dtype)
    return adv.detach().to(device=lam_bar.device, dtype=dtype)[:, None] * lam_bar.detach().to(dtype) * mask


# The batch as chunks, and the sums each pass takes of a chunk -----------------------------------------------
class _Chunks:
    """The batch's chunks (v, Â, float mask), read once per pass (``read``: j, v, Â, mask); ``kept`` holds each
    chunk's (Â, mask); ``total`` sums named float64 statistics over the chunks, then ``pool`` sums them over ranks."""

    def __init__(self, v, adv, response_mask, pool):
        self.single, self.pool, self.dtype, self.kept = isinstance(v, Tensor), pool, None, []
        if self.single:
            v = [(v, adv, response_mask)]
        elif adv is not None or response_mask is not None:
            raise ValueError("adv and response_mask go with a [B, T, H] tensor v; chunks carry their own")
        elif not callable(v) and iter(v) is v:
            raise ValueError("chunks must be a list or a callable returning a fresh iterable, not a one-shot iterator")
        given = None if callable(v) else [self._prepare(j, chunk) for j, chunk in enumerate(v)]  # in memory: once
        self.source, self.prepared = (v, False) if given is None else ((lambda: given), True)

    def _prepare(self, j: int, chunk):  # validated (v, Â, float mask) in the first chunk's working dtype
        if not (isinstance(chunk, (tuple, list)) and len(chunk) == 3):
            raise ValueError(f"chunks[{j}] must be a (v, adv, response_mask) tuple")
        if self.dtype is None:
            self.dtype = torch.float64 if getattr(chunk[0], "dtype", None) == torch.float64 else torch.float32
        return _prepare(*chunk, dtype=self.dtype, where="" if self.single else f" in chunks[{j}]")

    def read(self):
        n, j = len(self.kept), -1
        for j, chunk in enumerate(self.source()):
            v, adv, mask = chunk if self.prepared else self._prepare(j, chunk)
            if n == 0:  # the first pass keeps Â and the mask (a float per token), the later ones check them
                self.kept.append((adv, mask))
            elif j >= n or not (torch.equal(adv, self.kept[j][0]) and torch.equal(mask, self.kept[j][1])):
                raise ValueError(f"chunks changed between passes (chunk {j}): adv, response_mask or their number")
            yield j, v, adv, mask
        if j + 1 != len(self.kept) or not self.kept:
            raise ValueError("chunks is empty: need at least one (v, adv, response_mask) chunk" if not self.kept else
                             f"chunks yielded {j + 1} chunks in a later pass, expected {len(self.kept)}")

    def total(self, parts) -> dict:
        sums = {}
        for part in parts:  # the first chunk's sums as they are (one chunk: bit for bit), the others added
            sums.update({key: sums[key] + value if key in sums else value for key, value in part.items()})
        if self.pool is None:
            return sums
        out = self.pool(flat := torch.cat([value.reshape(-1) for value in sums.values()]))
        pieces = (flat if out is None else out).split([value.numel() for value in sums.values()])  # in place or not
        return {key: piece.view_as(sums[key]) for key, piece in zip(sums, pieces)}


def _centroid_sums(v: Tensor, adv: Tensor, mask: Tensor, assign: Optional[Tensor] = None) -> dict:
    # Eq. 2–3's Σw·v [H] and Σw of μ±, w = |Â|·α (step 0: α = 1, Σw = M±, tokens counted); chunk's dtype, then float64
    w_pos, w_neg = adv.clamp(min=0)[:, None] * mask, (-adv).clamp(min=0)[:, None] * mask  # [b, t]
    if assign is not None:
        w_pos, w_neg = assign * w_pos, assign * w_neg
    out = {"wv_pos": torch.einsum("bt,bth->h", w_pos, v).double(), "w_pos": w_pos.sum().double(),
           "wv_neg": torch.einsum("bt,bth->h", w_neg, v).double(), "w_neg": w_neg.sum().double()}
    if assign is None:
        out.update(n_valid=mask.sum(dtype=torch.float64), n_pos=((adv > 0)[:, None] * mask).sum(dtype=torch.float64),
                   n_neg=((adv < 0)[:, None] * mask).sum(dtype=torch.float64))
    return out


def _centroids(sums: dict, dtype: torch.dtype, mu: tuple = (None, None)) -> tuple:
    # (μ₊, μ₋) = Σw·v / max(Σw, ε) [H], ε as in the working dtype (a float32 quotient's bits); weight 0: μ kept
    eps = float(torch.tensor(EPS, dtype=dtype))
    return tuple(mu_kept if mu_kept is not None and not sums[f"w_{side}"] > 0 else
                 (sums[f"wv_{side}"] / sums[f"w_{side}"].clamp(min=eps)).to(dtype) for side, mu_kept in zip(SIDES, mu))


def _squared_distances(v: Tensor, mu: tuple) -> tuple:
    # (‖v − μ₊‖², ‖v − μ₋‖²) [b, t] each, v − μ formed a block of rows at a time: a token's sum over H is the same
    # reduction in any block, so the result is (v − μ).pow(2).sum(-1) (tests/test_delta.py, float64).
    n_rows = _block_rows(v)
    block = torch.empty((min(n_rows, v.shape[0]),) + v.shape[1:], dtype=v.dtype, device=v.device)  # [n_rows, t, H]
    out = []
    for centroid in mu:
        dist = torch.empty(v.shape[:2], dtype=v.dtype, device=v.device)
        for a in range(0, v.shape[0], n_rows):
            torch.sum(torch.sub(v[a:a + n_rows], centroid, out=block[:min(n_rows, v.shape[0] - a)]).pow_(2), -1,
                      out=dist[a:a + n_rows])
        out.append(dist)
    return tuple(out)


def _moments(margin: Tensor, adv: Tensor, mask: Tensor) -> dict:  # Σ Δ, Σ Δ², count over each side, float64
    out = {}
    for side, on_side in zip(SIDES, (adv > 0, adv < 0)):
        d64, w64 = margin.double(), (on_side.to(mask.dtype)[:, None] * mask).double()
        out.update({f"margin_{side}": (d64 * w64).sum(), f"margin2_{side}": (d64 * d64 * w64).sum(),
                    f"count_{side}": w64.sum()})
    return out


def _temperatures(sums: dict) -> tuple:  # measured (γ₊, γ₋), float64 0-dim, from _moments' sums
    return tuple(adaptive_temperature(sums[f"margin_{side}"], sums[f"margin2_{side}"], sums[f"count_{side}"])
                 for side in SIDES)


def _result(batch: _Chunks, lam_bar: list, sums: dict, return_stats: bool, mu=None, gamma=(_NAN,) * 2,
            gamma0=(_NAN,) * 2, scale=1.0):
    # λ̄ (a tensor for a tensor v, else the list) and, with return_stats, the STAT_KEYS dict (mu None: the guard)
    out = lam_bar[0] if batch.single else lam_bar
    if not return_stats:
        return out
    stats, counts = [], (sums["n_pos"], sums["n_neg"], sums["n_valid"] - sums["n_pos"] - sums["n_neg"])
    for sign, n in ((1, float(counts[0])), (-1, float(counts[1]))):  # λ̄ on P, then on Nn: mean, std, min, max
        on_side = [(adv * sign > 0).to(mask.dtype)[:, None] * mask for adv, mask in batch.kept]
        moments = batch.total({"1": (lb.double() * w).sum(), "2": (lb.double() * lb.double() * w).sum()}
                              for lb, w in zip(lam_bar, on_side))
        mean, here = float(moments["1"]) / max(n, 1.0), torch.cat([lb[w > 0] for lb, w in zip(lam_bar, on_side)])
        extremes = (float(here.min()), float(here.max())) if here.numel() else (_NAN, _NAN)
        stats += [mean, math.sqrt(max(float(moments["2"]) / n - mean * mean, 0.0)), *extremes] if n > 0 else [_NAN] * 4
    norms = tuple(float(centroid.double().norm()) for centroid in mu) if mu is not None else (_NAN, _NAN)
    cos = float(mu[0].double() @ mu[1].double()) / (norms[0] * norms[1]) if mu is not None and min(norms) > 0 else _NAN
    stats += [cos, *norms, *gamma, *gamma0, *counts, scale, mu is None]
    return out, {key: float(value) for key, value in zip(STAT_KEYS, stats)}


# Validation and masking at the boundary ----------------------------------------------------------------------
def _check_shapes(first, first_name: str, others: dict, where: str = "") -> None:  # first [B, T, H] (lam_bar [B, T])
    shape, dims = (lambda tensor: tuple(getattr(tensor, "shape", ()))), 2 if first_name == "lam_bar" else 3
    if not isinstance(first, Tensor) or first.dim() != dims:
        raise ValueError(f"{first_name}{where} must be a {['[B, T]', '[B, T, H]'][dims - 2]} tensor, got shape "
                         f"{shape(first)}")
    for name, tensor in others.items():  # adv [B], the others [B, T]
        want = list(first.shape[:1] if name == "adv" else first.shape[:2])
        if not isinstance(tensor, Tensor) or list(shape(tensor)) != want:
            raise ValueError(f"{name}{where} must be a {['[B, T]', '[B]'][name == 'adv']} = {want} tensor, got shape "
                             f"{shape(tensor)}")


def _mask01(response_mask: Tensor, name: str = "response_mask") -> Tensor:  # bool or 0/1 mask -> bool mask
    if response_mask.dtype != torch.bool and not bool(((response_mask == 0) | (response_mask == 1)).all()):
        raise ValueError(f"{name} must contain only 0/1 (or be bool)")
    return response_mask != 0


def _block_rows(v: Tensor) -> int:  # rows of v [b, t, H] per block: ROW_BLOCK_BYTES of it, at least one
    return max(1, ROW_BLOCK_BYTES // max(math.prod(v.shape[1:]) * v.element_size(), 1))


def _prepare(v, adv, response_mask, dtype: Optional[torch.dtype] = None, where: str = "") -> tuple:
    # a chunk validated: v detached in the working dtype, +0.0 on padding (one masked copy unless it is), Â, 0/1 mask
    _check_shapes(v, "v", {"adv": adv, "response_mask": response_mask}, where)
    if not bool(torch.isfinite(adv).all()):
        raise ValueError(f"adv{where} must be finite")
    dtype, v = dtype or (torch.float64 if v.dtype == torch.float64 else torch.float32), v.detach()
    valid = _mask01(response_mask, f"response_mask{where}").to(v.device)
    if v.dtype != dtype:  # a converted copy anyway: masked in place
        v = v.to(dtype).masked_fill_(~valid[..., None], 0.0)
    else:  # any bit set on padding (NaN, −0.0, garbage): the masked copy; a block of rows at a time
        bits, n_rows = {torch.float32: torch.int32, torch.float64: torch.int64}[dtype], _block_rows(v)
        if any(v[a:a + n_rows][~valid[a:a + n_rows]].view(bits).any() for a in range(0, v.shape[0], n_rows)):
            v = torch.where(valid[..., None], v, torch.zeros((), dtype=dtype, device=v.device))
    return v, adv.detach().to(device=v.device, dtype=dtype), valid.to(dtype)
