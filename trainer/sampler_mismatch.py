"""The sampler–trainer mismatch: TRL's truncated importance sampling for vLLM rollouts (--vllm_importance_sampling_*).

vLLM samples o_t from its own kernels' distribution π_vLLM (other matmul and attention kernels, bf16 sampling), while
the trainer scores o_t with its own θ_old; on a GPU the samples are therefore slightly off-policy. TRL 1.16
(``GRPOTrainer._generate_and_score_completions``) reweights each token's loss by the importance weight

    ratio_t = π_θold(o_t) / π_vLLM(o_t) = exp(old_logp_t − sampler_logp_t)

truncated or masked (``importance_weights``, its four modes). Folded into the token advantages (``correct``):
TRL multiplies the per-token loss ℓ_t (clip, dual clip or SAPO's gate included; the KL term added after, not
multiplied) by w_t ≥ 0. Each of our surrogates is positively homogeneous in the advantage, ℓ(w·Ã) = w·ℓ(Ã) for w ≥ 0:
max(−wÃ·r, −wÃ·clip(r)) = w·max(−Ã·r, −Ã·clip(r)); the dual clip min(ℓ, −wÃ·c) likewise; SAPO's −wÃ·g_τ(r) with τ
chosen by the sign of wÃ (that of Ã for w > 0; w = 0 gives 0 either way); and the token-mean, sequence-mean and Dr.
GRPO normalisers do not depend on Ã. So ``policy_loss(logp, old, Ã·w, ...)`` is TRL's ``per_token_loss · w`` exactly,
with β > 0 too (grpo.policy_loss adds β·k3 outside the Ã term, as TRL adds it after the IS product). Tested against
the explicit product (tests/test_sampler_mismatch.py).

The sampler's log-probs are vLLM's ``processed_logprobs`` (trainer/vllm_engine.create_engine: the log-softmax after the
temperature and top-p, the distribution it sampled from). With top-p < 1 they are renormalised over the nucleus, log
(p_t / S) with S the nucleus mass, while the trainer scores the full distribution, log p_t: the ratio is then S ≤ 1 for
every sampled token even with identical numerics (trl#6789), i.e. the correction also scales each token's loss by its
step's nucleus mass. The default recipes sample at top-p 1.0 (S = 1); with top-p < 1 read
``sampling/importance_sampling_ratio/mean`` with that in mind.

Default mode ``token_truncate`` (TRL 1.16's default is ``sequence_mask``): a sequence mode multiplies the ratios of a
response's tokens (TRL 1.16 sums the log-ratios), so at a mean |log-ratio| of 0.012 per token a 100-token response
already has a ratio of e^1.2 ≈ 3.3 and is masked at C_max = 3 (trl#4772); a 20,480-token response of the DelTA
recipe would be masked or truncated almost always, leaving no gradient. Token modes bound each token's weight alone.

A NaN sampler log-prob (vLLM returns one for a token it could not score) is treated as TRL 1.16 treats it: that
token's d_t is 0 (weight 1, no correction; a sequence mode's sum leaves it out) and the logp-difference statistics
leave it out, instead of a NaN weight that would skip the whole update (``importance_weights``, ``mismatch_stats``).
Line numbers below are those of trl 1.16.0's ``trl/trainer/grpo_trainer.py``.

Left out: TRL's ``tool_mask`` (no tool calls here) and verl's rejection sampling of mismatched responses
(``rollout_rs``), which drops responses instead of re-weighting their tokens.
"""

from __future__ import annotations

import math

import torch

MODES = ("token_truncate", "token_mask", "sequence_truncate", "sequence_mask")


def importance_weights(
    old_logp: torch.Tensor,
    sampler_logp: torch.Tensor,
    mask: torch.Tensor,
    mode: str = "token_truncate",
    clip_max: float | None = 3.0,
    clip_min: float | None = None,
) -> torch.Tensor:
    """TRL 1.16's vLLM importance weights ``[B, T]`` (``vllm_importance_sampling_mode``), float as ``old_logp``.

    d_t = (old_logp_t − sampler_logp_t)·mask_t (nats; 0 on padding), then NaN → 0 (l.2662–2665: the masked
    difference, then ``torch.nan_to_num(·, nan=0.0)``, which also maps ±inf to the dtype's extremes): a valid token
    whose sampler log-prob is NaN gets d_t = 0. ``token_*``: ratio_t = exp(d_t) (l.2674), so 1 at such a token;
    ``sequence_*``: one ratio per response, exp(Σ_t d_t) (l.2668–2670), on each of its positions, such a token
    adding 0 and a response with no valid token getting exp(0) = 1. ``*_truncate``: clamp(ratio, C_min, C_max)
    (l.2680); ``*_mask``: ratio where C_min ≤ ratio ≤ C_max, else 0, a bound of None absent (l.2686–2703).
    ``old_logp``, ``sampler_logp``, ``mask`` ``[B, T]`` (θ_old's and vLLM's processed log-probs of the sampled
    tokens, the response mask). Raises ValueError: an unknown mode or mismatched shapes."""
    if mode not in MODES:
        raise ValueError(f"vllm_importance_sampling_mode must be one of {', '.join(MODES)}, got {mode!r}")
    if old_logp.shape != sampler_logp.shape or old_logp.shape != mask.shape:
        raise ValueError(
            f"old_logp {tuple(old_logp.shape)}, sampler_logp {tuple(sampler_logp.shape)} and mask "
            f"{tuple(mask.shape)} must have the same [B, T] shape"
        )
    gap = torch.where(mask > 0, old_logp - sampler_logp.to(old_logp.dtype), torch.zeros_like(old_logp))  # [B, T]
    diff = torch.nan_to_num(gap, nan=0.0)  # [B, T] d_t: a NaN sampler log-prob gives 0 (TRL l.2665)
    # [B, T] log-ratio: d_t, or (sequence modes) Σ_t d_t, the log of the product of the token ratios, on every position
    log_ratio = diff.sum(-1, keepdim=True).expand_as(old_logp) if mode.startswith("sequence") else diff
    ratio = torch.exp(log_ratio)
    if mode.endswith("truncate"):
        return ratio.clamp(min=clip_min, max=clip_max) if clip_min is not None or clip_max is not None else ratio
    low = -math.inf if clip_min is None else clip_min
    high = math.inf if clip_max is None else clip_max
    return ratio.masked_fill((ratio < low) | (ratio > high), 0.0)


def mismatch_stats(old_logp, sampler_logp, weights, mask, mode: str) -> dict:
    """TRL's metrics of one batch (l.2860–2893), floats; 0.0 over an empty set, as there.

    ``sampling/sampling_logp_difference/mean|max``: |old − sampler| over the response tokens whose difference is not
    NaN (l.2865: a token vLLM could not score is left out). ``sampling/importance_sampling_ratio/min|mean|max``:
    token modes over the response tokens (l.2877: ``ratio[mask]``, a NaN-scored token's weight 1 included);
    sequence modes over one value per response, every response of the batch (l.2875: the ``[B, 1]`` ratios
    flattened), so a response with no valid token (e.g. masked by ``--mask_truncated_completions``) counts with its
    weight exp(0) = 1 clamped or masked by C_min, C_max. ``old_logp``, ``sampler_logp``, ``weights``
    (``importance_weights``), ``mask`` ``[B, T]``."""
    valid = mask > 0
    abs_diff = (old_logp - sampler_logp.to(old_logp.dtype)).abs()  # [B, T]
    delta = abs_diff[valid & ~torch.isnan(abs_diff)]
    w = weights[:, 0] if mode.startswith("sequence") else weights[valid]
    out = {
        "sampling/sampling_logp_difference/mean": delta.mean() if delta.numel() else 0.0,
        "sampling/sampling_logp_difference/max": delta.max() if delta.numel() else 0.0,
        "sampling/importance_sampling_ratio/min": w.min() if w.numel() else 0.0,
        "sampling/importance_sampling_ratio/mean": w.mean() if w.numel() else 0.0,
        "sampling/importance_sampling_ratio/max": w.max() if w.numel() else 0.0,
    }
    return {k: float(v) for k, v in out.items()}


# --- The rule, chosen once from --vllm_importance_sampling_correction (run_setup.sampler_correction) ---------------
def correction(cfg):
    """--vllm_importance_sampling_correction's update token advantages from stage 5's: a function ``(Ã [N, T],
    old_logp [N, T], batch, loss_mask [N, T]) -> (Ã·w, TRL's statistics)`` with w = ``importance_weights`` of θ_old
    over ``batch.sampler_logprobs`` on the loss mask's tokens (the module header: Ã·w is TRL's ℓ·w)."""
    mode, high, low = (
        cfg.vllm_importance_sampling_mode,
        cfg.vllm_importance_sampling_clip_max,
        cfg.vllm_importance_sampling_clip_min,
    )

    def corrected(token_adv, old_logp, batch, loss_mask):
        from trainer import distributed

        if batch.sampler_logprobs is None:
            raise RuntimeError(
                "--vllm_importance_sampling_correction: the rollout has no sampler log-probs (the "
                "vLLM engine was built without logprobs_mode='processed_logprobs')"
            )
        w = importance_weights(old_logp, batch.sampler_logprobs, loss_mask, mode, high, low)  # [N, T]
        stats = mismatch_stats(old_logp, batch.sampler_logprobs, w, loss_mask, mode)
        if distributed.is_distributed():  # TRL: the mean of the processes' means, the extremes of their extremes
            parts = distributed.all_gather_objects(stats)
            stats = {
                k: (max if k.endswith("max") else min if k.endswith("min") else (lambda v: sum(v) / len(v)))(
                    [p[k] for p in parts]
                )
                for k in stats
            }
        return token_adv * w.to(token_adv.dtype), stats

    return corrected
