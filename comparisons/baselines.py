"""The baselines of DelTA's Table 1 and its Q2 selection ablation, as pure tensor functions (no model, no loss).

Spec: docs/specs/baselines.md ("spec §N"); DelTA: Zhang, Wu, Lin, arXiv 2605.21467, App. J (baseline settings).
Each rule is what one row of Table 1 changes in the DAPO loop; the loss itself (verl's dual-clip token loss with
ε_low = 0.2, ε_high = 0.28, c = 10, spec §1) stays the trainer's.  Names: Â ``adv`` (GRPO advantage, [B]),
r ``ratio`` = exp(clamp(logπ_θ − logπ_old, ±20)), Δ ``log_ratio``, m ``loss_mask`` ([B, T] bool or 0/1).

* Forking Tokens (``dapo_ft``, spec §3): Wang et al., "Beyond the 80/20 Rule", arXiv 2506.01939; official code
  Shenzhi-Wang/Beyond-the-80-20-Rule-RLVR @6f5dda6 (core_algos L53–88 ``get_global_entropy_top_mask``, dp_actor
  L439–461).  DAPO on the top ρ = 20% of valid tokens by the policy entropy H = −Σ p log p of softmax(z/T),
  loss = mean over the kept tokens.  H from the forward (``chunked_head.entropy_from_logits``), ``top_ratio_mask``
  (the official k = max(1, int(n·ρ + 0.9999)) rule), ``quantile_mask`` (TRL's ``top_entropy_quantile``:
  H >= quantile 1 − ρ, ties all kept; TRL keeps the all-token normaliser, spec §3 (c)).
* SAPO (``sapo``, spec §4): Gao et al. (Qwen), arXiv 2511.20347; verl ``compute_policy_loss_sapo`` (volcengine/verl
  @b178a3c core_algos L1329–1411), TRL ``loss_type="sapo"``.  The clip is replaced by a soft gate
  f(r) = (4/τ)·σ(τ(r − 1)), τ = τ_pos (1.0) if Â > 0 else τ_neg (1.05); loss −f·Â, seq-mean-token-mean.
  ``sapo_gate``; its gradient w.r.t. logπ_θ is −Â·4s(1 − s)·r, s = σ(τ(r − 1)), = −Â at r = 1.
* FIPO (``fipo``, spec §5): Ma et al., arXiv 2603.19835; official code qwenpilot/FIPO read through the fork
  vukrosic/FIPO @ee25452 (core_algos L941–1120, ``compute_policy_loss_future_kl``).  Ã = Â·f with a detached
  future-KL weight f_t = clip(exp Σ_{k≥t} γ^{k−t} M_k Δ_k, 1, 1.2), γ = 2^(−1/32), M = m·1[Δ ≤ log 10], a safety
  clip for Â < 0 and r > 10, and the sequence drop of responses with more than one dual-clipped token.
  ``future_kl_weights``, ``fipo_dropped_rows``.  At θ = θ_old (Δ ≡ 0) f ≡ 1: FIPO acts from the 2nd mini-batch on.
* DelTA Q2 (spec §6 "Q2 token selection", DelTA Sec. 5.2): plain DAPO on the top / bottom / a random 50% of the
  valid tokens ranked by DelTA's λ, with FT's top-k-ceil rule and the mean over kept tokens.  ``select_tokens``.

Inferred or different from the official code: ties in ``top_ratio_mask`` are broken by index order (a stable sort;
``torch.topk`` leaves them unspecified); the entropy is computed without gradient (the mask is not differentiable;
FT computes it with grad); FIPO's F is a chunked reverse scan, not the official B·T² block matmul (the same sum).
Left out on purpose: OPSD (spec §7: a teacher forward and full-vocabulary divergences, not a token rule); DelTA's
ℓ2 (non-squared) centroid ablation (spec §6: underspecified, not a faithful reproduction); the losses, the
aggregations and where each rule runs (the pool, the micro-batch: spec §1 "hook points") are the trainer's.

How a trainer calls each, in one line (``logits`` [B, T, V] of the current forward, ``lam`` DelTA's λ [B, T])::

    keep = baselines.top_ratio_mask(chunked_head.entropy_from_logits(logits, temp), mask, 0.2)  # FT: loss over keep
    f = baselines.sapo_gate(ratio, adv)                                      # SAPO: loss = −f·Â, seq-mean-token-mean
    token_adv = adv[:, None] * baselines.future_kl_weights(logp - old_logp, adv, mask)        # FIPO: Ã = Â·f
    mask = mask & ~baselines.fipo_dropped_rows(logp - old_logp, adv, mask)[:, None]           # FIPO: sequence drop
    keep = baselines.select_tokens(lam, mask, 0.5, "top")                                     # Q2: loss over keep

Conventions: responses right-padded; [B, T] outputs; nothing here keeps a tensor across micro-batches (at the
papers' scale, 2048 × 20,480 tokens, each [B, T] fp32 output is 160 MiB if the caller keeps one for the batch).
Imports only torch and math.
"""

from __future__ import annotations

import math

import torch

__all__ = [
    "sapo_gate",
    "sapo_surrogate",
    "top_ratio_mask",
    "quantile_mask",
    "forking_mask",
    "select_tokens",
    "future_kl_weights",
    "fipo_dropped_rows",
    "fipo_weights",
]

_SCAN_CHUNK = 128  # FIPO scan block: a [128, 128] decay matrix, T / 128 sequential steps


def _as_mask(loss_mask, shape=None, name="scores"):
    """[B, T] bool view of a bool/float 0-1 response mask (shape-checked against ``shape``)."""
    if not torch.is_tensor(loss_mask):
        raise ValueError("baselines.py: loss_mask must be a torch.Tensor")
    m = loss_mask if loss_mask.dtype == torch.bool else loss_mask != 0
    if shape is not None and m.shape != shape:
        raise ValueError(f"baselines.py: loss_mask shape {tuple(m.shape)} != {name} shape {tuple(shape)}")
    return m


def _row_values(adv, shape, name="adv"):
    """Â broadcast to ``shape`` [B, T] from [B] or [B, T] (detached)."""
    if not torch.is_tensor(adv) or adv.shape not in (shape[:1], shape):
        raise ValueError(
            f"baselines.py: {name} must be a [B] or [B, T] tensor for shape {tuple(shape)}, got "
            f"{tuple(adv.shape) if torch.is_tensor(adv) else type(adv).__name__}"
        )
    adv = adv.detach()
    return (adv[:, None] if adv.dim() == 1 else adv).expand(shape)


# ---- spec §4: SAPO soft gate -------------------------------------------------------------------------------------


def sapo_gate(ratio, adv, tau_pos=1.0, tau_neg=1.05):
    """SAPO's soft gate f(r) = (4/τ)·σ(τ(r − 1)), τ = ``tau_pos`` where Â > 0 else ``tau_neg`` (spec §4).

    Source: SAPO (arXiv 2511.20347, via [T] transcriptions); verl ``compute_policy_loss_sapo`` (VU L1329–1411), TRL
    ``sapo_temperature_pos/neg``; τ_pos = 1.0, τ_neg = 1.05 (DelTA's SAPO table).  The per-token loss is −f·Â, no
    clip; verl and TRL aggregate it seq-mean-token-mean.  d(−f·Â)/d logπ_θ = −Â·4s(1 − s)·r, s = σ(τ(r − 1)): at
    r = 1 f = 2/τ and the gradient is −Â, that of the unclipped policy gradient.

    Args: ratio r [B, T] (with grad: f is differentiable in it); adv Â [B] or [B, T] (only its sign is used, as in
    verl: Â = 0 takes τ_neg); tau_pos, tau_neg > 0.  Returns f [B, T], dtype of ``ratio``.
    Raises ValueError: a τ <= 0, ``adv`` not [B] / [B, T].
    """
    if not (tau_pos > 0 and tau_neg > 0):
        raise ValueError(f"baselines.sapo_gate: tau_pos and tau_neg must be > 0, got {tau_pos}, {tau_neg}")
    if not torch.is_tensor(ratio) or ratio.dim() != 2:
        raise ValueError("baselines.sapo_gate: ratio must be a [B, T] tensor")
    a = _row_values(adv, ratio.shape).to(ratio.device)
    tau = torch.where(
        a > 0,
        torch.tensor(float(tau_pos), dtype=ratio.dtype, device=ratio.device),
        torch.tensor(float(tau_neg), dtype=ratio.dtype, device=ratio.device),
    )
    return (4.0 / tau) * torch.sigmoid(tau * (ratio - 1.0))


def sapo_surrogate(ratio, token_adv, settings):
    """SAPO's per-token loss ℓ = −Ã·f(r) in place of the clipped surrogate (spec §4; no dual clip), with the
    signature of ``grpo.clipped_surrogate``: ``settings`` gives τ_pos, τ_neg. Returns (ℓ [B, T], no token
    dual-clipped [B, T] bool)."""
    gate = sapo_gate(ratio, token_adv, settings.sapo_temperature_pos, settings.sapo_temperature_neg)
    return -token_adv * gate, torch.zeros_like(ratio, dtype=torch.bool)


# ---- spec §3: Forking Tokens (entropy, top-ρ masks) --------------------------------------------------------------


def _valid_scores(scores, loss_mask, fn):
    """(flat valid scores, flat mask) after the checks shared by the mask rules."""
    if not torch.is_tensor(scores) or scores.dim() != 2:
        raise ValueError(f"baselines.{fn}: scores must be a [B, T] tensor")
    m = _as_mask(loss_mask, scores.shape).to(scores.device)
    flat_m = m.reshape(-1)
    v = scores.detach().reshape(-1)[flat_m]
    if torch.isnan(v).any():
        raise ValueError(f"baselines.{fn}: scores must not be NaN on valid (loss_mask) tokens")
    return v, flat_m


def _keep_count(n, ratio):
    """The official FT count k = max(1, int(n·ρ + 0.9999)) (≈ ceil(n·ρ)); 0 for an empty pool."""
    return 0 if n == 0 else max(1, int(n * ratio + 0.9999))


def _mask_from_ranks(order, k, flat_m, shape):
    """Bool [B, T]: the first ``k`` valid tokens of ``order`` (indices into the flat valid tokens)."""
    keep_valid = torch.zeros(int(flat_m.sum()), dtype=torch.bool, device=flat_m.device)
    keep_valid[order[:k].to(flat_m.device)] = True
    out = torch.zeros_like(flat_m)
    out[flat_m] = keep_valid
    return out.reshape(shape)


def top_ratio_mask(scores, loss_mask, ratio):
    """The official Forking-Tokens mask: the k highest-scoring valid tokens of the pool (spec §3 "Exact rule").

    Source: FT core_algos L53–88 (``get_global_entropy_top_mask``): flatten the valid tokens of everything given (the
    pool; FT passes one micro-batch), keep k = max(1, int(n·ρ + 0.9999)) of them by top-k (n valid tokens; n = 0
    keeps none).  Ties are broken by index order in the row-major flattening (a stable descending sort; ``topk``
    leaves ties unspecified) [I].  Padding is never kept.

    Args: scores [B, T] (e.g. the entropy H; padding values ignored); loss_mask [B, T]; ratio ρ in (0, 1].
    Returns bool [B, T] with exactly k True.  Raises ValueError: ρ outside (0, 1], shapes, NaN on valid tokens.
    """
    if not (isinstance(ratio, (int, float)) and 0.0 < ratio <= 1.0):
        raise ValueError(f"baselines.top_ratio_mask: ratio must be in (0, 1], got {ratio!r}")
    v, flat_m = _valid_scores(scores, loss_mask, "top_ratio_mask")
    order = torch.sort(v, descending=True, stable=True).indices
    return _mask_from_ranks(order, _keep_count(v.numel(), ratio), flat_m, scores.shape)


def quantile_mask(scores, loss_mask, quantile):
    """TRL's ``top_entropy_quantile`` mask: valid tokens with score >= the (1 − ρ) quantile of the pool (spec §3 (a)).

    Source: TRL grpo_trainer L1396–1432 (``get_high_entropy_mask``): threshold = torch.quantile(valid scores, 1 − ρ)
    with linear interpolation, rule score >= threshold, so all ties at the threshold are kept (constant H keeps
    every token).  The quantile is computed here with a sort in float64 (the same value as torch.quantile, without
    its input-size limit).  The pool is everything given; TRL gathers it over processes.  Padding is never kept.

    Args: scores [B, T]; loss_mask [B, T]; quantile ρ in [0, 1] (ρ = 1 keeps all valid tokens).
    Returns bool [B, T] (all False without valid tokens).  Raises ValueError: ρ outside [0, 1], shapes, NaN.
    """
    if not (isinstance(quantile, (int, float)) and 0.0 <= quantile <= 1.0):
        raise ValueError(f"baselines.quantile_mask: quantile must be in [0, 1], got {quantile!r}")
    v, flat_m = _valid_scores(scores, loss_mask, "quantile_mask")
    if v.numel() == 0:
        return torch.zeros_like(flat_m).reshape(scores.shape)
    s = torch.sort(v.double()).values
    pos = (1.0 - quantile) * (s.numel() - 1)  # linear interpolation between order statistics, as torch.quantile
    lo = int(math.floor(pos))
    hi = min(lo + 1, s.numel() - 1)
    threshold = s[lo] + (pos - lo) * (s[hi] - s[lo])
    out = torch.zeros_like(flat_m)
    out[flat_m] = v.double() >= threshold
    return out.reshape(scores.shape)


_WHICH = ("top", "bottom", "random")


def forking_mask(entropy, loss_mask, top_ratio=0.0, quantile=1.0):
    """Forking Tokens' mask bool [B, T] over the pool given (spec §3): the top ⌈ρn⌉ valid tokens by entropy
    (``top_ratio`` ρ > 0: its code's rule, ``top_ratio_mask``), else those at or above the ``quantile`` 1 − ρ
    (TRL's ``top_entropy_quantile``, ``quantile_mask``)."""
    if top_ratio > 0:
        return top_ratio_mask(entropy, loss_mask, top_ratio)
    return quantile_mask(entropy, loss_mask, quantile)


def select_tokens(scores, loss_mask, fraction=0.5, which="top", generator=None):
    """DelTA's Q2 selection: plain DAPO on a ``fraction`` of the valid tokens ranked by λ (spec §6 "Q2").

    Source: DelTA Sec. 5.2 (top / random / bottom 50% by the coefficient; results only in figures); the count and
    the ranking are FT's top-k-ceil rule [I, spec §6]: ``"top"`` = ``top_ratio_mask(scores, ...)``, ``"bottom"`` =
    ``top_ratio_mask(−scores, ...)`` (the lowest, ties by index order), ``"random"`` = the same count k drawn
    uniformly without replacement among the valid tokens (``torch.randperm`` with ``generator``; scores unused).
    The loss is then the mean over the kept tokens.

    Args: scores [B, T] (λ or λ̄); loss_mask [B, T]; fraction in (0, 1]; which; generator: torch.Generator or
    None.  Returns bool [B, T] with k = max(1, int(n·fraction + 0.9999)) True (none if n = 0).
    Raises ValueError: unknown ``which``, fraction outside (0, 1], shapes, NaN on valid tokens.
    """
    if which not in _WHICH:
        raise ValueError(f"baselines.select_tokens: which must be one of {_WHICH}, got {which!r}")
    if not torch.is_tensor(scores):
        raise ValueError("baselines.select_tokens: scores must be a [B, T] tensor")
    if which != "random":
        return top_ratio_mask(scores if which == "top" else -scores, loss_mask, fraction)
    if not (isinstance(fraction, (int, float)) and 0.0 < fraction <= 1.0):
        raise ValueError(f"baselines.select_tokens: fraction must be in (0, 1], got {fraction!r}")
    v, flat_m = _valid_scores(scores, loss_mask, "select_tokens")
    n = v.numel()
    order = torch.randperm(n, generator=generator, device=generator.device if generator is not None else "cpu")
    return _mask_from_ranks(order, _keep_count(n, fraction), flat_m, scores.shape)


# ---- spec §5: FIPO future-KL weights -----------------------------------------------------------------------------


def _discounted_future_sum(x, gamma, chunk=_SCAN_CHUNK):
    """F_t = Σ_{k≥t} γ^{k−t} x_k over the last dim of x [B, T]: the reverse scan F_t = x_t + γ F_{t+1}, a block of
    ``chunk`` positions at a time (inside a block a [c, c] matmul, between blocks the carried F), O(T·chunk)."""
    B, T = x.shape
    F = torch.empty_like(x)
    idx = torch.arange(min(chunk, T) if T else 1, device=x.device, dtype=x.dtype)
    lag = idx[:, None] - idx[None, :]  # lag[k, t] = k − t
    decay = torch.where(
        lag >= 0, torch.exp(lag.clamp(min=0) * math.log(gamma)), torch.zeros((), dtype=x.dtype, device=x.device)
    )
    carry = torch.zeros(B, dtype=x.dtype, device=x.device)  # F at the first position after the block
    for e in range(T, 0, -chunk):
        s = max(0, e - chunk)
        c = e - s
        # F_t = Σ_{t≤k<e} γ^{k−t} x_k + γ^{e−t} F_e for t in [s, e)
        F[:, s:e] = x[:, s:e] @ decay[:c, :c] + carry[:, None] * torch.exp((c - idx[:c]) * math.log(gamma))
        carry = F[:, s]
    return F


def future_kl_weights(
    log_ratio,
    adv,
    loss_mask,
    decay_rate=32.0,
    clip=0.2,
    clip_high_only=True,
    safety_threshold=10.0,
    log_c=math.log(10.0),
):
    """FIPO's future-KL token weight f [B, T] (detached); the loss uses Ã = Â·f in the dual-clip loss (spec §5).

    Source: FIPO (arXiv 2603.19835) README "Core Change"; official ``compute_policy_loss_future_kl`` (vukrosic/FIPO
    @ee25452 core_algos L1009–1059); hyper-parameters = DelTA's FIPO table = the FIPO 32B launcher::

        Δ_t = clamp(log_ratio_t, ±20)             (logπ_θ − logπ_old at the current θ)
        M_t = m_t · 1[Δ_t ≤ log c]                 (tokens that the dual clip would cap are left out)
        F_t = Σ_{k≥t} γ^{k−t} M_k Δ_k,  γ = 2^(−1/decay_rate)    (includes the current token)
        f_t = clip(exp F_t, 1, 1 + clip)  if clip_high_only else  clip(exp F_t, 1 − clip, 1 + clip);
              clip = 0: min(exp F_t, 10)
        safety: where Â < 0 and r_t = exp Δ_t > safety_threshold,  f_t := clip(f_t, 0.8, 1.0)
        f = 1 on padding

    F is a chunked reverse scan (O(T·128), no [T, T] matrix; the official code's block matmul is B·T² MAC and
    gives the same sum).  At Δ ≡ 0 (θ = θ_old, the first mini-batch) f ≡ 1 and FIPO is DAPO.

    Args: log_ratio Δ [B, T] (nats; gradient ignored); adv Â [B] or [B, T]; loss_mask [B, T]; decay_rate > 0
    (tokens of half-life); clip ε_f >= 0; clip_high_only; safety_threshold (a ratio); log_c = log of verl's
    clip_ratio_c.  Returns f [B, T], float32 (float64 for float64 log_ratio), no gradient.
    Raises ValueError: decay_rate <= 0, clip < 0 (or >= 1 two-sided), shapes.
    """
    if not (isinstance(decay_rate, (int, float)) and math.isfinite(decay_rate) and decay_rate > 0):
        raise ValueError(f"baselines.future_kl_weights: decay_rate must be a finite number > 0, got {decay_rate!r}")
    if not (isinstance(clip, (int, float)) and clip >= 0 and (clip_high_only or clip < 1)):
        raise ValueError(f"baselines.future_kl_weights: clip must be >= 0 (< 1 when two-sided), got {clip!r}")
    if not torch.is_tensor(log_ratio) or log_ratio.dim() != 2:
        raise ValueError("baselines.future_kl_weights: log_ratio must be a [B, T] tensor")
    m = _as_mask(loss_mask, log_ratio.shape, "log_ratio").to(log_ratio.device)
    dt = torch.promote_types(log_ratio.dtype, torch.float32)
    with torch.no_grad():
        a = _row_values(adv, log_ratio.shape).to(log_ratio.device)
        d = log_ratio.detach().to(dt).clamp(-20.0, 20.0)
        x = torch.where(m & (d <= log_c), d, torch.zeros((), dtype=dt, device=d.device))  # M_t Δ_t
        F = _discounted_future_sum(x, 2.0 ** (-1.0 / decay_rate))
        e = torch.exp(F)
        if clip == 0:
            f = e.clamp(max=10.0)
        else:
            f = e.clamp(1.0 if clip_high_only else 1.0 - clip, 1.0 + clip)
        unsafe = (a < 0) & (torch.exp(d) > safety_threshold)  # a large ratio on a negative response: no up-weight
        f = torch.where(unsafe, f.clamp(0.8, 1.0), f)
        return torch.where(m, f, torch.ones((), dtype=dt, device=d.device))


def fipo_dropped_rows(log_ratio, adv, loss_mask, log_c=math.log(10.0)):
    """FIPO's sequence drop: bool [B], True for a response with more than one dual-clipped token (spec §5).

    Source: official ``compute_policy_loss_future_kl`` (core_algos L1105–1120): a token is dual-clipped when Â < 0
    and r > c, i.e. Δ = clamp(log_ratio, ±20) > log c on a valid token; a row with two or more such tokens is
    removed from the loss and from its token-mean denominator (``mask & ~dropped[:, None]``).

    Args: log_ratio Δ [B, T]; adv Â [B] or [B, T]; loss_mask [B, T]; log_c = log clip_ratio_c.
    Returns bool [B].  Raises ValueError: shapes.
    """
    if not torch.is_tensor(log_ratio) or log_ratio.dim() != 2:
        raise ValueError("baselines.fipo_dropped_rows: log_ratio must be a [B, T] tensor")
    m = _as_mask(loss_mask, log_ratio.shape, "log_ratio").to(log_ratio.device)
    a = _row_values(adv, log_ratio.shape).to(log_ratio.device)
    dual = m & (a < 0) & (log_ratio.detach().clamp(-20.0, 20.0) > log_c)
    return dual.sum(1) > 1


def fipo_weights(log_ratio, adv, loss_mask, decay_rate=32.0, clip=0.2, safety_threshold=10.0, log_c=math.log(10.0)):
    """Both FIPO factors of one (micro-)batch as a trainer applies them (spec §5): ``(f, kept)``, f [B, T] from
    ``future_kl_weights`` (clip-high only) and ``kept`` = ``loss_mask`` (its dtype) without the responses
    ``fipo_dropped_rows`` drops. The loss takes Ã = Â·f over ``kept``, and a dropped response leaves its
    denominator too (FIPO's code: ``loss_mask & ~dropped`` into agg_loss, per micro-batch; grpo.py divides the
    mini-batch by its kept tokens, ``fipo.fipo_rescale``). ``log_ratio`` on padding is ignored (may be -inf).
    ``adv``: Â or Ã (only its sign is read), [B] or [B, T]."""
    m = _as_mask(loss_mask, log_ratio.shape, "log_ratio").to(log_ratio.device)
    log_ratio = torch.where(m, log_ratio, torch.zeros((), dtype=log_ratio.dtype, device=log_ratio.device))
    f = future_kl_weights(log_ratio, adv, m, decay_rate, clip, True, safety_threshold, log_c)
    dropped = fipo_dropped_rows(log_ratio, adv, m, log_c)
    return f, loss_mask * (~dropped)[:, None].to(loss_mask.dtype)
