"""GRPO with token-level credit assignment (GRPO, DelTA, CSCR): the trainer, read top to bottom as the method.

One training step (``train_step``) is seven stages, in the order of the papers::

    1. rollout      G responses o_i for each prompt q             rollout.sample: HF generate or vLLM (--use_vllm)
    2. verify       binary reward r_i ∈ {0, 1} (+ overlong shaping) verify.grade_batch; overlong_penalty DAPO §3.4
    3. advantages   Â_i = (r_i − mean_g r) / (std_g r + 1e-6)       group_advantages   GRPO (Shao et al. 2024)
    4. θ_old        log π_θold(o_{i,t}) per token, detached: a      old_logprobs       (+ h_t for DelTA, same pass)
                    no-grad pass, or the training forward (one update: can_update_on_policy, stage 6 reuses it)
    5. credit       token advantages Ã_{i,t} (--credit)             Credit: grpo broadcasts Â_i; delta Â_i·λ̄_{i,t}
                                                                    (delta.py); cscr Â_i·w̃_{i,t} (cscr.py); fipo Â_i
    6. update       clipped surrogate, token-mean, AdamW            policy_loss        DAPO (Yu et al. 2025) §3.1, §3.3
                    (the current policy's masks/weights: FIPO,      backward_minibatch (baselines.py)
                    Forking Tokens; SAPO's gate)
    7. log          metrics.jsonl, samples/                         checkpoint.RunFolder

The file follows that order (its flags and their checks: grpo_config.py): the maths (``group_advantages``,
``policy_loss``; log π is ``policy.token_logprobs``); the credit hook (``Credit``); one step (``train_step``,
``old_logprobs``, ``policy_update``); the loop (``train``).

* θ_old's log-probs come from this trainer's own forward pass, never from the sampler, so the ratio is exactly 1 at
  the first update. When the batch is used for one update only, stage 4 takes them from the training forward itself
  (``can_update_on_policy``); each such optimisation turns itself off where the model would make it inexact
  (``policy.exact_optimisations``).
* The loss is PPO's clipped surrogate with DAPO's asymmetric clip, an optional dual clip for negative advantages
  and an optional k3 KL penalty to a frozen reference (off by default, as in TRL, verl's DAPO recipe and DelTA).
  ``--loss_type dapo`` (default) is the token-mean over the mini-batch; with DelTA's normalised λ̄ (mean 1 over the
  rollout batch) it is the paper's self-normalised surrogate Σλℓ / Σλ (DelTA Eq. 8) over the rollout batch; with
  several mini-batches each one is only approximately self-normalised, as in DelTA's official code.
* The papers' comparisons are flag values of the same step (docs/reproduce.md; the maths in baselines.py and
  delta.py): a token weight computed once at θ_old goes through ``Credit`` (DelTA's ablations, its Q2 selection);
  one that needs the current policy is a branch of the loss stage, ``backward_minibatch`` (FIPO's future-KL
  weight, ``--credit fipo``; Forking Tokens' entropy mask, ``--entropy_top_ratio`` / ``--top_entropy_quantile``);
  a surrogate is a branch of ``policy_loss`` (SAPO's soft gate, ``--loss_type sapo``).
* Left out on purpose: entropy bonus, reward shaping beyond DAPO's overlong penalty, dynamic sampling, learning-rate
  schedules. The loss value is no progress signal (≈ 0 at θ_old): watch the reward and the held-out accuracy.
* Infrastructure sits behind one-line calls: recipes and the checks before any weights load (recipes.py,
  memory_plan.py), the data (problems.py), the policy model (policy.py), torchrun + FSDP2 (distributed.py), the run
  folder (checkpoint.py), held-out evaluation (evaluate.py). Read next: delta.py and cscr.py, rollout.py, verify.py.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import math
import random
import sys
import time
from collections import namedtuple
from dataclasses import dataclass

import torch

import baselines
import checkpoint
import distributed
import evaluate
import memory_plan
import policy
import problems
import recipes
import report
import rollout
import sampler_mismatch
import verify
from grpo_config import GRPOConfig, build_parser, check_config  # every flag and its check (grpo_config.py)

# --- The maths: pure functions on tensors ---------------------------------------------------------------------
def group_advantages(rewards: torch.Tensor, group_size: int, scale_rewards: str = "group",
                     eps: float = 1e-6) -> torch.Tensor:
    """GRPO group-normalised advantages Â_i = (r_i − mean_g) / (std_g + eps) (GRPO §4.1.2; DelTA spec §1).

    ``rewards`` ``[N]`` group by group (N = groups × G). ``scale_rewards="group"`` (``--scale_rewards``) divides by
    the unbiased group std (DelTA's code, verl, TRL); ``"none"`` gives r − mean (Dr. GRPO, Liu et al. 2025).
    Returns ``[N]`` float32 (float64 for float64 rewards); a group whose rewards are all equal (or of one member)
    gets exactly 0, no float residue (NeMo-RL #4161).
    Raises ValueError: N not a multiple of ``group_size``, or an unknown ``scale_rewards``.
    """
    if group_size < 1 or rewards.dim() != 1 or rewards.numel() % group_size:
        raise ValueError(f"rewards must be 1-D with a length divisible by group_size={group_size}, "
                         f"got shape {tuple(rewards.shape)}")
    if scale_rewards not in ("group", "none"):
        raise ValueError(f"scale_rewards must be 'group' or 'none', got {scale_rewards!r}")
    r = rewards.to(torch.promote_types(rewards.dtype, torch.float32)).view(-1, group_size)
    centred = r - r.mean(-1, keepdim=True)
    if scale_rewards == "group" and group_size > 1:
        centred = centred / (r.std(-1, keepdim=True, unbiased=True) + eps)
    # exact zeros where the group has no spread (or only one member)
    flat = (r.max(-1, keepdim=True).values - r.min(-1, keepdim=True).values) == 0
    return torch.where(flat, torch.zeros_like(centred), centred).view(-1)


def overlong_penalty(lengths: torch.Tensor, max_completion_length: int, buffer_len: int, factor=1.0) -> torch.Tensor:
    """DAPO's soft overlong punishment (Yu et al. 2025, §3.4; verl's ``overlong_buffer``), added to the
    reward: R_length(o) = min(0, ((L_max − L_cache) − |o|) / L_cache · factor), 0 up to L_max − L_cache tokens, then
    a ramp to −factor at L_max = ``max_completion_length`` (DAPO's −1 beyond L_max cannot occur: responses are cut
    there). ``lengths`` ``[N]``: response tokens, EOS included (verl's valid response length); ``buffer_len``
    L_cache tokens, 0 < L_cache < L_max. Returns ``[N]`` float32 (≤ 0)."""
    expected = max_completion_length - buffer_len  # L_max − L_cache
    return torch.clamp((expected - lengths.to(torch.float32)) / buffer_len * factor, max=0.0)


@dataclass(frozen=True)
class LossSettings:
    """The surrogate's settings (``policy_loss``), as the flags of the same names give them
    (``LossSettings.from_config``)."""
    epsilon: float = 0.2
    epsilon_high: float = 0.28
    dual_clip: float | None = None
    loss_type: str = "dapo"
    max_completion_length: int | None = None
    beta: float = 0.0
    sapo_temperature_pos: float = 1.0
    sapo_temperature_neg: float = 1.05
    sapo_aggregation: str = "sequence"

    @classmethod
    def from_config(cls, cfg: GRPOConfig) -> LossSettings:
        return cls(**{f.name: getattr(cfg, f.name) for f in dataclasses.fields(cls)})

    @property
    def aggregation(self) -> str:
        """How ``loss_type`` reduces the per-token loss: ``dapo`` (token-mean), ``grpo`` (per-sequence) or
        ``dr_grpo``; SAPO takes ``grpo``'s or ``dapo``'s (``sapo_aggregation``)."""
        if self.loss_type == "sapo":
            return "grpo" if self.sapo_aggregation == "sequence" else "dapo"
        return self.loss_type


def policy_loss(logp, old_logp, adv, response_mask, settings: LossSettings | None = None, *, ref_logp=None,
                num_tokens=None, num_sequences=None, **keywords):
    """Clipped surrogate loss (to minimise) and its statistics.

    Per token (PPO, Schulman et al. 2017, Eq. 7, with DAPO's asymmetric clip, Yu et al. 2025, §3.1 Clip-Higher)::

        ratio  = exp(clamp(logp − old_logp, −20, 20))
        ℓ      = max(−Â·ratio, −Â·clip(ratio, 1−ε, 1+ε_high))
        ℓ      = min(ℓ, −Â·c)     where Â < 0, if dual_clip=c (Ye et al. 2020; verl's clip_ratio_c)
        ℓ     += β·k3,  k3 = exp(ref − logp) − (ref − logp) − 1   (Schulman's k3 KL estimator, if β > 0)

    ``loss_type="sapo"`` (SAPO, Gao et al. 2025; docs/specs/baselines.md §4) puts a soft gate in place of the clip
    and the dual clip: ℓ = −Â·(4/τ)·σ(τ(ratio − 1)), τ = τ_pos for Â > 0, else τ_neg; its gradient at ratio 1 is the
    unclipped policy gradient's, its value 2/τ times DAPO's there.

    Aggregation (``loss_type``):
        ``dapo``: Σ ℓ·mask / Σ mask over the whole batch (token-mean; DelTA and TRL's default);
        ``grpo``: mean over sequences of the per-sequence token-mean (the original GRPO 1/|o_i|);
        ``dr_grpo``: Σ ℓ·mask / (B · max_completion_length) (Dr. GRPO's constant normaliser);
        ``sapo``: ``grpo``'s (``sapo_aggregation="sequence"``: verl forces it, TRL uses it) or ``dapo``'s ("token").

    Args: ``logp``, ``old_logp`` ``[B, T]`` (nats, policy and θ_old); ``adv``: Â_i ``[B]`` (broadcast) or the
    token advantages Ã_{i,t} ``[B, T]`` (e.g. Â·λ̄); ``response_mask`` (EOS included), ``ref_logp`` (β > 0) ``[B, T]``;
    ``settings``: a ``LossSettings``, or its fields as keywords (``epsilon=0.2``, ...); ``num_tokens`` /
    ``num_sequences``: the normaliser's counts over the whole mini-batch when this call sees a micro-batch (the
    gradient then does not depend on the micro-batch size).
    Returns (loss, stats): token-means over this call of ``clip_ratio/low_mean`` (ratio < 1−ε, Â < 0),
    ``clip_ratio/high_mean`` (ratio > 1+ε_high, Â > 0), ``clip_ratio/region_mean``, ``clip_ratio/dual_mean``, ``kl``;
    and ``num_tokens``. Raises ValueError: shapes, ``loss_type``, ``dr_grpo`` without ``max_completion_length``,
    β > 0 without ``ref_logp``.
    """
    if settings is not None and keywords:
        raise ValueError(f"give policy_loss a LossSettings or its fields as keywords, not both: {sorted(keywords)}")
    s = settings or LossSettings(**keywords)  # an unknown keyword: TypeError, naming it
    epsilon, epsilon_high, dual_clip, beta = s.epsilon, s.epsilon_high, s.dual_clip, s.beta
    aggregation = s.aggregation
    mask = response_mask.to(logp.dtype)
    adv = adv[:, None] if adv.dim() == 1 else adv
    for bad, message in [
            (logp.shape != old_logp.shape or logp.shape != mask.shape, f"logp {tuple(logp.shape)}, old_logp "
             f"{tuple(old_logp.shape)} and response_mask {tuple(mask.shape)} must have the same [B, T] shape"),
            (adv.shape[0] != logp.shape[0] or adv.shape[1] not in (1, logp.shape[-1]),
             f"adv must be [B] or [B, T], got {tuple(adv.shape)} for logp {tuple(logp.shape)}"),
            (s.loss_type not in ("dapo", "grpo", "dr_grpo", "sapo"),
             f"loss_type must be dapo, grpo, dr_grpo or sapo, got {s.loss_type!r}"),
            (s.sapo_aggregation not in ("sequence", "token"), "sapo_aggregation must be 'sequence' or 'token'"),
            (s.loss_type == "dr_grpo" and not s.max_completion_length,
             "loss_type='dr_grpo' needs max_completion_length"),
            (beta > 0 and ref_logp is None, "beta > 0 needs ref_logp")]:
        if bad:
            raise ValueError(message)
    adv = adv.to(logp.dtype).expand_as(logp)  # [B, T]
    # padded positions may hold anything (e.g. -inf): zero them before exp so no NaN reaches the gradient
    log_ratio = torch.where(mask > 0, logp - old_logp, torch.zeros_like(logp)).clamp(-20.0, 20.0)  # [B, T]
    ratio = torch.exp(log_ratio)  # [B, T]
    dual_active = torch.zeros_like(mask, dtype=torch.bool)  # [B, T]
    if s.loss_type == "sapo":  # SAPO (spec §4): the soft gate f(ratio) in place of the clip; no dual clip
        per_token = -adv * baselines.sapo_gate(ratio, adv, s.sapo_temperature_pos, s.sapo_temperature_neg)  # [B, T]
    else:
        loss_unclipped = -adv * ratio  # [B, T]
        loss_clipped = -adv * ratio.clamp(1.0 - epsilon, 1.0 + epsilon_high)  # [B, T]
        per_token = torch.maximum(loss_unclipped, loss_clipped)  # [B, T]
    if dual_clip is not None and s.loss_type != "sapo":
        # Dual clip bounds the loss of a negative-advantage token whose ratio exploded: ℓ ≤ −Â·c
        dual_bound = -adv * dual_clip  # [B, T]
        dual_active = (adv < 0) & (per_token > dual_bound)  # [B, T] bool
        per_token = torch.where(adv < 0, torch.minimum(per_token, dual_bound), per_token)  # [B, T]
    kl = None
    if beta > 0:
        d = torch.where(mask > 0, ref_logp - logp, torch.zeros_like(logp)).clamp(-20.0, 20.0)  # [B, T]
        kl = torch.exp(d) - d - 1.0  # [B, T]: k3 ≥ 0, unbiased for KL(π‖π_ref) under samples from π
        per_token = per_token + beta * kl  # [B, T]
    per_token = per_token * mask  # [B, T], 0 on padding
    if aggregation == "dapo":
        denom = mask.sum() if num_tokens is None else num_tokens
        loss = per_token.sum() / max(float(denom), 1.0)  # scalar
    elif aggregation == "grpo":
        per_seq = per_token.sum(-1) / mask.sum(-1).clamp(min=1.0)  # [B]
        loss = per_seq.sum() / float(logp.shape[0] if num_sequences is None else num_sequences)
    else:
        loss = per_token.sum() / (float(logp.shape[0] if num_sequences is None else num_sequences)
                                  * s.max_completion_length)
    with torch.no_grad():
        n = mask.sum().clamp(min=1.0)
        low = ((ratio < 1.0 - epsilon) & (adv < 0)).to(mask.dtype) * mask
        high = ((ratio > 1.0 + epsilon_high) & (adv > 0)).to(mask.dtype) * mask
        stats = {"clip_ratio/low_mean": (low.sum() / n).item(), "clip_ratio/high_mean": (high.sum() / n).item(),
                 "clip_ratio/region_mean": ((low + high).sum() / n).item(),
                 "clip_ratio/dual_mean": ((dual_active.to(mask.dtype) * mask).sum() / n).item(),
                 "kl": ((kl * mask).sum() / n).item() if kl is not None else 0.0,
                 "num_tokens": mask.sum().item()}
    return loss, stats


# --- Credit assignment: sequence advantages Â_i -> token advantages Ã_{i,t} (the --credit hook) ---------------
class Credit:
    """Sequence advantages ``[N]`` -> token advantages ``[N, T]``, once per rollout batch, without gradient, from
    θ_old; fixed for every mini-batch and epoch of the step (DelTA spec §2.4; CSCR spec §4). ``token_weights``: the
    last call's per-token weights by name, for the samples log: ``{"lambda_bar": λ̄}`` (DelTA), ``{"sensitivity":
    s}`` (CSCR), ``{}`` (GRPO)."""

    def __init__(self, cfg: GRPOConfig, tokenizer):
        import delta_ablations

        self.cfg, self.tokenizer, self.token_weights = cfg, tokenizer, {}
        self.cscr_threshold, self.cscr_calibrated = cfg.cscr_threshold, False
        if cfg.credit == "cscr":  # CSCR's options; its ablations (cscr_ablations.py) chosen once, by their flags
            import cscr
            import cscr_ablations

            weight, renormalise = cscr_ablations.choose(cfg.cscr_weight, cfg.cscr_scope, cfg.num_generations,
                                                        cfg.cscr_sign_eps, cfg.cscr_sign_mix)
            self.cscr_settings = cscr.Settings(cfg.cscr_alpha, cfg.cscr_w_min, cfg.cscr_mode, weight, renormalise)
        # DelTA's steps and proxy: the paper's, or an ablation's (delta_ablations.py), chosen once from the flags; under
        # torchrun --delta_scope global sums its statistics over the processes (spec §2.4)
        pool = distributed.all_reduce_sum if distributed.is_distributed() and cfg.delta_scope == "global" else None
        self.delta_steps = delta_ablations.steps_from_flags(cfg, pool)
        self.delta_proxy = delta_ablations.proxy_from_flags(cfg)
        self.delta_lam_bar = self._random_lam_bar if cfg.delta_coefficients == "random" else self._delta_lam_bar
        # --delta_select: the tokens the loss trains on, [N, T] bool, N·T bytes (8.4 MB at 2,048 × 4,096; None: all)
        self.keep = None

    @property
    def delta_gamma(self):  # --delta_gamma frozen's kept (γ₊, γ₋), which checkpoints save; else None
        return getattr(self.delta_steps.temperature, "gamma", None)

    @delta_gamma.setter
    def delta_gamma(self, gamma):  # --resume: the (γ₊, γ₋) the run had frozen
        if gamma is not None and hasattr(self.delta_steps.temperature, "gamma"):
            self.delta_steps.temperature.gamma = tuple(gamma)

    def needs_hidden(self) -> bool:  # stage 4 keeps the batch's h_t (else DelTA's memory_efficient recomputes them)
        return self.cfg.credit == "delta" and self.cfg.delta_impl == "normal" and self.cfg.delta_coefficients != \
            "random"

    @torch.no_grad()
    def __call__(self, model, batch: rollout.Rollout, adv, old: ThetaOld, answers, step: int = 0):
        """Args: batch (its response_mask ``[N, T]``), adv Â_i ``[N]``, old (stage 4: ``old.logp`` ``[N, T]``, DelTA's
        ``old.hidden`` ``[N, T, H]`` or None), answers (the reference of each row, CSCR), step (seeds DelTA's random
        λ). Returns (token advantages Ã_{i,t} ``[N, T]``, stats)."""
        if self.cfg.credit in ("grpo", "fipo"):  # FIPO weights Â in the loss, from the current policy
            return adv[:, None] * batch.response_mask, {}  # GRPO: every token of o_i gets Â_i
        if self.cfg.credit == "delta":
            return self._delta(model, batch, adv, old, step)
        return self._cscr(model, batch, adv, old.logp, answers)

    def token_credit(self, adv, token_adv):
        """The credit of each token, Ã_{i,t} / Â_i ``[N, T]`` (1 for GRPO, λ̄ for DelTA, w̃ for CSCR), for samples/;
        a row with Â_i = 0 has nothing to divide: λ̄ itself for DelTA (its weights multiply Â), else 1."""
        share = token_adv / torch.where(adv == 0, 1.0, adv).to(token_adv.dtype)[:, None]
        fill = self.token_weights.get("lambda_bar", torch.ones_like(share))
        return torch.where((adv == 0)[:, None], fill.to(share.dtype), share)

    def _delta(self, model, batch, adv, old, step):
        import delta

        cfg, mask = self.cfg, batch.response_mask
        lam_bar, stats = self.delta_lam_bar(model, batch, adv, old, step)  # λ̄ [N, T]: DelTA, or the random control
        self.token_weights = {"lambda_bar": lam_bar}
        if cfg.delta_select != "none":  # Q2 (Sec. 5.2): plain DAPO on a share of the tokens chosen by λ ([N, T])
            draw = torch.Generator().manual_seed(cfg.seed * 1_000_003 + step * 101 + distributed.rank())
            self.keep = baselines.select_tokens(lam_bar, mask, cfg.delta_select_fraction, cfg.delta_select, draw)
            return adv[:, None] * mask, {**stats, "delta/selected_frac": float(self.keep.sum() / mask.sum())}
        return delta.delta_token_advantages(adv, lam_bar, mask), stats  # Ã = Â·λ̄ (spec §2.3 step 7)

    def _delta_lam_bar(self, model, batch, adv, old, step):
        """DelTA's λ̄ ``[N, T]`` and its stats: ``delta.delta_coefficients`` with the steps chosen above, over chunks of
        θ_old's proxies v (App. F). --delta_impl normal: stage 4's kept h_t ``[N, T, H]``, one chunk; memory_efficient:
        the micro-batches of ``policy.Passes``, which re-runs θ_old's no-grad, eval-mode forward for h_t in each of
        DelTA's K + 3 passes (the log-probs are stage 4's), so memory stays flat in the batch (spec §2.5)."""
        import delta

        mask, ids = batch.response_mask, batch.response_ids
        # --delta_proxy topk reads the whole LM head (gathered under FSDP2): V·H·4 bytes, 2.5 GB for Qwen3-8B
        needs_head = getattr(self.delta_proxy, "needs_lm_head", False)
        head = distributed.full_weight(model.get_output_embeddings().weight) if needs_head else None
        if old.hidden is not None:  # (rows, length) of each chunk, and the chunks
            layout, chunks = [(slice(None), mask.shape[1])], [(self.delta_proxy(old.hidden, old.logp, mask, ids, head),
                                                               adv, mask)]
        else:
            passes = policy.Passes(model, batch, torch.arange(len(adv)), self.cfg, grad=False, hidden=True)
            layout = [(rows, t) for rows, _, t in passes.layout]

            def chunks():  # one pass: (v [b, t, H], Â [b], mask [b, t]) of each micro-batch, in order
                for mb in passes:
                    v = self.delta_proxy(mb.hidden, mb.take(old.logp), mb.take(mask), mb.take(ids), head)
                    yield v, adv[mb.rows], mb.take(mask)

        c = self.cfg
        parts, stats = delta.delta_coefficients(chunks, K=c.delta_k, lam_min=c.delta_lam_min, lam_max=c.delta_lam_max,
                                                steps=self.delta_steps, return_stats=True)
        lam_bar = torch.zeros(mask.shape, dtype=parts[0].dtype)
        for (rows, t), part in zip(layout, parts):
            lam_bar[rows, :t] = part.cpu()
        return lam_bar, distributed.pool_min_max(stats) if self.delta_steps.pool else stats  # extremes: per process

    def _random_lam_bar(self, model, batch, adv, old, step):  # App. F's control: λ uniform in [λ_min, λ_max], no v
        import delta_ablations

        c, draw = self.cfg, torch.Generator().manual_seed(self.cfg.seed * 1_000_003 + step * 101 + distributed.rank())
        return delta_ablations.random_coefficients(adv, batch.response_mask, c.delta_lam_min, c.delta_lam_max,
                                                   generator=draw, normalize=c.delta_normalize), {}

    def _cscr(self, model, batch, adv, old_logp, answers):
        import cscr

        cfg, mask = self.cfg, batch.response_mask
        scored = mask.bool() & (adv != 0)[:, None]  # the tokens that carry credit: those of the rows with Â ≠ 0
        # spec §3: the two privileged prompts x + c+, x + c− of every response
        pairs = [cscr.build_condition_prompts(prompt, reference=ref, response_answer=verify.extract_boxed(text) or "",
                                              template=cfg.cscr_template)
                 for prompt, ref, text in zip(batch.prompts, answers, batch.texts)]
        # spec §4: ℓ+, ℓ− of the responses with Â ≠ 0 (no grad, eval mode; prompts tokenised as the rollout's)
        lp_pos, lp_neg = cscr.condition_logprobs(
            model, self.tokenizer, pairs, batch.response_ids, scored, cfg.temperature,
            micro_batch_size=cfg.micro_batch_size or None, logprob_fn=self._scoring_logprobs)
        s = cscr.sensitivity(old_logp, lp_pos, lp_neg, mask, mode=cfg.cscr_mode)  # s_t = max(|Δ+|, |Δ−|)
        if cfg.cscr_threshold_quantile is not None and not self.cscr_calibrated:
            # spec §5: λ = a quantile of s over the scored tokens (every process's) of the first batch that has any
            # (a batch whose every group has equal rewards has none, and no token it would weight), then frozen
            s_all = torch.cat(distributed.all_gather_objects(s[scored].cpu()))[None]
            if s_all.numel():
                self.cscr_threshold = cscr.calibrate_threshold(s_all, torch.ones_like(s_all),
                                                               cfg.cscr_threshold_quantile)
                self.cscr_calibrated = True
        # spec §5: w_t = max(w_min, exp(−α·max(0, s_t − λ))), Ã_{i,t} = Â_i·w_t / mean_t(w) (sign and budget kept)
        token_adv, stats = cscr.cscr_token_advantages(adv, old_logp, lp_pos, lp_neg, mask, self.cscr_threshold,
                                                      self.cscr_settings, return_stats=True)
        self.token_weights = {"sensitivity": s}
        return token_adv, {**stats, "cscr/threshold": float(self.cscr_threshold)}

    def _scoring_logprobs(self, model, input_ids, attention_mask, response_mask, temperature):
        """CSCR's scoring passes: ``token_logprobs``, each distinct privileged prompt run once (--shared_prompt)."""
        rows = torch.arange(len(input_ids))
        shared = policy.SharedPrompts(model, input_ids, attention_mask, rows, response_mask.shape[1]) \
            if self.cfg.shared_prompt else None
        return policy.token_logprobs(model, input_ids, attention_mask, response_mask, temperature,
                                     shared=(shared, rows) if shared else None)


# --- One step: rollout -> verify -> advantages -> θ_old -> credit -> update -> log ----------------------------
# What a step works on beside its config (``train`` makes both once): the policy and what policy.build makes beside
# it (``llm``: --use_vllm's engine, None: HF generate); the training rows, their order, the template, its stop tokens
Actor = namedtuple("Actor", "model tokenizer optimizer ref_model llm", defaults=(None,))
PromptSource = namedtuple("PromptSource", "rows sampler template stop_ids")


def train_step(step, cfg: GRPOConfig, actor: Actor, source: PromptSource, credit, run: checkpoint.RunFolder) -> dict:
    """One step: the seven stages of the module header; returns its metrics record. Under torchrun each process
    runs it on its own whole groups."""
    model, tokenizer, optimizer, ref_model, llm = actor
    rows, sampler, template, stop_ids = source
    t0 = time.time()
    policy.reset_peak_memory()  # this step's peak host RSS (and GPU memory) go to metrics.jsonl
    G, rank, world = cfg.num_generations, distributed.rank(), distributed.world_size()
    # 1. rollout: G responses per prompt; every process takes its own whole groups of the same prompt order
    per_rank = cfg.num_prompts_per_step // world
    idx = sampler.take(cfg.num_prompts_per_step)[rank * per_rank:(rank + 1) * per_rank]
    prompts = [rollout.apply_template(rows[i]["problem"], template) for i in idx]
    answers = [rows[i]["answer"] for i in idx for _ in range(G)]
    batch = rollout.sample(model, tokenizer, prompts, G, cfg.max_completion_length, cfg.temperature, cfg.top_p,
                           seed=cfg.seed * 100_003 + step + 1_000_003 * rank, stop_ids=stop_ids,
                           stop_strings=rollout.template_stop_strings(template), llm=llm,
                           sleep_after=cfg.vllm_enable_sleep_mode)
    t_gen = time.time() - t0
    # 2. verify: binary reward, every grader failure counted; DAPO's overlong shaping adds R_length ≤ 0 (§3.4)
    graded = verify.grade_batch(batch.texts, answers)
    correct = torch.tensor([float(ok) for ok, _ in graded])
    rewards = (correct + overlong_penalty(batch.response_lengths, cfg.max_completion_length, cfg.overlong_buffer_len,
                                          cfg.overlong_penalty_factor)) if cfg.overlong_buffer_len else correct
    # 3. group advantages Â_i (GRPO)
    adv = group_advantages(rewards, G, cfg.scale_rewards)
    lengths = batch.response_lengths  # logged as sampled, masked or not
    if cfg.mask_truncated_completions:
        batch.response_mask = batch.response_mask * torch.tensor(
            [r == "stop" for r in batch.finish_reasons], dtype=batch.response_mask.dtype)[:, None]
    # 4. θ_old's log-probs, no grad (+ DelTA's h_t from the same forward, + the reference's for --beta > 0). The
    #    step's one optimisation, chosen here: for one update at θ_old = θ, the training forward, which 6 reuses
    old = old_logprobs(model, batch, cfg, credit.needs_hidden(), ref_model,
                       training_forward=can_update_on_policy(cfg, len(adv), ref_model is not None))
    # 5. token advantages Ã_{i,t} (CSCR scores only rows with Â ≠ 0, a different number on each process: its
    #    scoring passes need the gathered weights under FSDP2)
    with distributed.gathered_weights(model) if cfg.credit == "cscr" else contextlib.nullcontext():
        token_adv, credit_stats = credit(model, batch, adv, old, answers, step)
    # 6. policy update: num_iterations passes × num_mini_batches AdamW steps, micro-batched backward
    # the loss's own factor of each token (FIPO's f, an entropy or Q2 mask) for samples/: [N, T], N·T·4 bytes
    loss_weights = torch.zeros_like(token_adv) if uses_loss_side_rule(cfg) else None  # (34 MB at 2,048 × 4,096)
    # the sampler–trainer mismatch (--vllm_importance_sampling_correction, TRL's): Ã·w = TRL's ℓ·w (sampler_mismatch)
    update_adv, sampling_stats = sampler_mismatch.correction(cfg)(token_adv, old.logp, batch)
    loss_sum, grad_norms, agg, skipped = policy_update(model, optimizer, batch, old, update_adv, cfg, step, credit.keep,
                                                       loss_weights)
    no_signal = agg.pop("no_signal", 0.0)  # every advantage 0, no update: its statistics 0.0, so that every step's
    agg = {name: 0.0 for name in update_stat_names(cfg)} if no_signal else agg  # line has the same keys
    # 7. log: metrics.jsonl (pooled over processes) every step, samples/ every logging_steps
    peaks = distributed.all_gather_objects(policy.peak_memory())  # each process's; the largest is logged
    peak = {k: max(p[k] for p in peaks) for k in peaks[0]}
    record = run.log_step(step + 1, G, rewards, correct if cfg.overlong_buffer_len else None, lengths,
                          batch.finish_reasons, verify.summarize(graded),
                          agg, {"loss": loss_sum / (cfg.num_iterations * cfg.num_mini_batches),
                                "grad_norm": sum(grad_norms) / max(len(grad_norms), 1), "skipped_updates": skipped,
                                "no_signal": no_signal,
                                **credit_stats, **sampling_stats, **peak, "step_time": time.time() - t0, "generation_time": t_gen})
    if rank == 0 and cfg.logging_steps and (step + 1) % cfg.logging_steps == 0:
        token_credit = credit.token_credit(adv, token_adv)  # × the loss's own factor, where a rule has one
        run.write_samples(step + 1, tokenizer, batch, rewards, adv, token_adv,
                          token_credit if loss_weights is None else token_credit * loss_weights, credit.token_weights,
                          min(cfg.num_samples_to_log, per_rank))
    return record


def update_stat_names(cfg: GRPOConfig) -> list[str]:
    """The statistics ``policy_update`` logs for ``cfg`` (``policy_loss``'s, asked of a one-token call, and the
    loss-side rule's, ``backward_minibatch``): a step without signal logs each as 0.0."""
    one = torch.zeros(1, 1)
    names = list(policy_loss(one, one, one[:, 0], torch.ones(1, 1), LossSettings.from_config(cfg))[1])
    if cfg.entropy_top_ratio > 0 or cfg.top_entropy_quantile < 1:
        names.append("forking/kept_frac")
    return names + (["fipo/f_mean", "fipo/dropped_frac"] if cfg.credit == "fipo" else [])


# θ_old, as stage 4 leaves it for stages 5 and 6, float32 on the host (N responses × T tokens, hidden size H; at the
# papers' scale 2,048 × 4,096, H = 4,096): logp N·T·4 bytes (34 MB); ref_logp (--beta > 0, else None) N·T·4 (34 MB);
# hidden (DelTA's --delta_impl normal, else None) N·T·H·4 (137 GB), refused by memory_plan.check_delta_cache above a quarter
# of the host's memory (stage 5 adds v: memory_plan.DELTA_NORMAL_HOST_COPIES = 2 copies in HOST_MEMORY_SHARE = 1/2);
# update_passes: stage 4's training forward, which stage 6 reuses (can_update_on_policy; graphs on the device), or None.
ThetaOld = namedtuple("ThetaOld", "logp hidden ref_logp update_passes")


def old_logprobs(model, batch, cfg: GRPOConfig, need_hidden=False, ref_model=None, training_forward=False):
    """Stage 4: θ_old's log-probs ``[N, T]`` from a no-grad, eval-mode pass over the batch (``policy.Passes``); the
    LM-head inputs ``[N, T, H]`` from the same pass when ``need_hidden`` (DelTA, --delta_impl normal); the reference
    log-probs when ``ref_model`` is given. ``training_forward``: the training forward instead (train mode, with
    grad, TRL's choice when μ = 1; ``can_update_on_policy``), kept for stage 6 to reuse. Returns a ``ThetaOld``.
    Every process runs as many micro-batches (FSDP's gathers)."""
    N, T = batch.response_mask.shape
    dt = torch.promote_types(next(model.parameters()).dtype, torch.float32)  # float32 (float64 for a float64 model)
    old_logp, hidden = torch.zeros(N, T, dtype=dt), None
    passes = policy.Passes(model, batch, torch.arange(N), cfg, grad=training_forward, hidden=need_hidden,
                           keep_graphs=training_forward)
    for mb in passes:
        old_logp[mb.rows, :mb.t] = mb.logp.detach().cpu()
        if need_hidden:  # h_t on the host, bounded (the comment above ThetaOld)
            if hidden is None:
                memory_plan.check_delta_cache(N, T, mb.hidden.shape[-1])
                hidden = torch.zeros(N, T, mb.hidden.shape[-1], dtype=dt)
            hidden[mb.rows, :mb.t] = mb.hidden.to(dt).cpu()
    ref_logp = policy.reference_logprobs(ref_model, batch, passes.layout, cfg.temperature) if ref_model else None
    return ThetaOld(old_logp, hidden, ref_logp, passes if training_forward else None)


def can_update_on_policy(cfg: GRPOConfig, num_rows: int, has_reference: bool) -> bool:
    """Whether stage 4 may take θ_old's log-probs from the training forward: ``--fuse_old_logprobs`` (off by itself
    on models whose training forward is not the eval forward: ``policy.exact_optimisations``), ``num_iterations``
    1, one mini-batch, ``micro_batch_size`` 0 (or ≥ the batch) and no KL reference. Not for CSCR under FSDP (its
    scoring passes need gathered weights, not available inside a forward/backward), nor for an entropy mask ranked in
    each micro-batch (its entropies come from the update's own forward)."""
    return (cfg.fuse_old_logprobs and cfg.num_iterations == 1 and cfg.num_mini_batches == 1 and not has_reference
            and (cfg.micro_batch_size == 0 or cfg.micro_batch_size >= num_rows)
            and not (cfg.credit == "cscr" and distributed.is_distributed())
            and not ((cfg.entropy_top_ratio > 0 or cfg.top_entropy_quantile < 1) and cfg.entropy_pool == "micro"))


def policy_update(model, optimizer, batch, old: ThetaOld, token_adv, cfg: GRPOConfig, step: int, keep=None,
                  loss_weights=None):
    """Stage 6: ``num_iterations`` passes × ``num_mini_batches`` AdamW steps on one rollout batch. Each step
    accumulates the mini-batch's gradient (``backward_minibatch``), clips it and applies AdamW; one whose loss or
    gradient norm is not finite is skipped and counted. Pass ``e`` permutes the rows with a generator seeded by
    ``(seed, step, e)``, so a resumed run makes the same updates. ``token_adv`` Ã_{i,t} ``[N, T]``; ``keep``,
    ``loss_weights``: see ``backward_minibatch``. Returns (Σ mini-batch losses, applied pre-clip gradient norms,
    token-weighted statistic sums, skipped updates).
    """
    model.train()
    N = batch.response_mask.shape[0]
    mb_size = N // cfg.num_mini_batches
    loss_sum, grad_norms, agg, skipped = 0.0, [], {}, 0
    signal = distributed.all_reduce_sum(torch.tensor([float(token_adv.abs().sum())], dtype=torch.float64)).item()
    if signal == 0 and cfg.beta == 0:  # every advantage 0: no gradient, and an AdamW step would still move the
        return 0.0, [], {"no_signal": 1.0}, 0  # weights (decay, momentum): the weights and AdamW's state stay
    for epoch in range(cfg.num_iterations):
        perm = torch.randperm(N, generator=torch.Generator().manual_seed(cfg.seed + 7919 * step + epoch))
        for k in range(cfg.num_mini_batches):
            mb_idx = perm[k * mb_size:(k + 1) * mb_size] if cfg.num_mini_batches > 1 else torch.arange(N)
            optimizer.zero_grad(set_to_none=True)
            loss, stats = backward_minibatch(model, batch, old, token_adv, mb_idx, cfg, keep, loss_weights)
            loss = distributed.all_reduce_sum(torch.tensor(loss, dtype=torch.float64)).item()  # Σ of the parts
            loss_sum += loss
            for name, value in stats.items():
                agg[name] = agg.get(name, 0.0) + value
            grad_norm = policy.clip_and_step(model, optimizer, loss, cfg.max_grad_norm, step)
            if grad_norm is None:
                skipped += 1
            else:
                grad_norms.append(grad_norm)
    # free the gradients now: otherwise they stay allocated through the next rollout (16 GB for a full Qwen3-8B)
    optimizer.zero_grad(set_to_none=True)
    return loss_sum, grad_norms, agg, skipped


def backward_minibatch(model, batch, old: ThetaOld, token_adv, mb_idx, cfg: GRPOConfig, keep=None, loss_weights=None):
    """Accumulate the gradient of one mini-batch's loss (rows ``mb_idx``), ``cfg.micro_batch_size`` rows at a time.

    The normaliser of ``cfg.loss_type`` (tokens for ``dapo``, sequences otherwise) is counted once over the whole
    mini-batch (and over processes), so the summed gradient does not depend on the micro-batch size or the number of
    processes (trl#3021; FSDP sums the gradients). The rules that need the current policy are branches of this
    stage (docs/specs/baselines.md): Forking Tokens' entropy mask (§3) and FIPO's future-KL weight (§5).
    ``keep`` ``[N, T]`` bool: the tokens the loss trains on (--delta_select; None: all); ``loss_weights`` ``[N, T]``
    (optional, written): each token's loss-side factor (FIPO's f, the entropy mask) for samples/. FIPO rescales the
    gradients accumulated in the parameters when it drops responses (``fipo_rescale``): call it on zeroed gradients,
    as ``policy_update`` does. Returns (loss, token-weighted ``policy_loss`` statistic sums).
    """
    device, loss_total, agg = next(model.parameters()).device, 0.0, {}
    settings, ft_ratio, ft_quantile = LossSettings.from_config(cfg), cfg.entropy_top_ratio, cfg.top_entropy_quantile
    forking = ft_ratio > 0 or ft_quantile < 1
    if cfg.credit == "fipo":  # spec §5: FIPO's code always applies its dual clip c (clip_ratio_c = 10)
        settings = dataclasses.replace(settings, dual_clip=fipo_dual_clip(cfg))
    # H2 (spec §3): tokens ranked over the mini-batch at the current θ ([N, T] bool; None: each micro-batch's own)
    pool = forking_tokens(model, batch, mb_idx, cfg) if forking and cfg.entropy_pool == "minibatch" else None
    if pool is not None and ft_quantile == 1:  # Forking Tokens' code: the loss over the kept tokens, their mean
        keep = pool
    mask = batch.response_mask if keep is None else batch.response_mask * keep  # the tokens of the loss
    counts = distributed.all_reduce_sum(torch.tensor([mask[mb_idx].sum().item(), float(len(mb_idx))],
                                                     dtype=torch.float64))
    n_tok, n_seq = counts[0].item(), int(counts[1].item())
    own_count = forking and pool is None and ft_quantile == 1  # its code's micro pool: each micro-batch's own mean
    dropped = torch.zeros(2, dtype=torch.float64)  # FIPO: the tokens and responses dropped (spec §5)
    # the training forward over these rows: stage 4's, when it was this one (its only update), else a new one
    passes = old.update_passes or policy.Passes(model, batch, mb_idx, cfg, grad=True,
                                                   entropy=forking and cfg.entropy_pool == "micro")
    for mb in passes:
        at = lambda x: mb.take(x).to(device) if x is not None else None  # noqa: E731  (this micro-batch's part)
        adv_t, mask_t, n_mb, rule, weight = at(token_adv), at(mask), n_tok, {}, 1.0
        if forking:  # the tokens of this micro-batch the entropy rule keeps: ranked over the pool, or here
            valid_t = at(batch.response_mask)
            picked = at(pool) if pool is not None else forking_mask(mb.entropy.to(device), valid_t, cfg)
            if ft_quantile < 1:  # TRL: ℓ × the mask, every valid token still in the normaliser (tokens, |o_i|)
                weight = picked.to(adv_t.dtype)  # on Ã: each surrogate here is 0 at Ã = 0, so ℓ(m·Ã) = m·ℓ(Ã)
            elif pool is None:
                mask_t = valid_t * picked
            rule = {"forking/kept_frac": float((valid_t * picked).sum() / valid_t.sum().clamp(min=1.0))}
        if cfg.credit == "fipo":  # H2 (spec §5): Ã = Â·f, f from the current log-ratio; a dropped response leaves
            # the numerator here and the denominator after the loop (fipo_rescale), as in FIPO's code
            f, kept = baselines.fipo_weights(mb.logp.detach() - at(old.logp), adv_t, mask_t, cfg.fipo_decay_rate,
                                             cfg.fipo_clip, cfg.fipo_safety_threshold, math.log(fipo_dual_clip(cfg)))
            rule = {"fipo/f_mean": float((f * kept).sum() / kept.sum().clamp(min=1.0)),
                    "fipo/dropped_frac": float((mask_t - kept).sum() / mask_t.sum().clamp(min=1.0))}
            dropped += torch.tensor([float((mask_t - kept).sum()),  # its tokens, and the responses
                                     float(((mask_t.sum(-1) > 0) & (kept.sum(-1) == 0)).sum())], dtype=torch.float64)
            weight, mask_t = weight * f, kept
        if own_count:  # the kept tokens' mean of each micro-batch, divided by the micro-batches summed (accumulation)
            n_mb = max(float(mask_t.sum()), 1.0) * len(passes.layout) * distributed.world_size()
        if loss_weights is not None:  # what the loss made of each token's credit: its mask, times its factor
            loss_weights[mb.rows, :mb.t] = (mask_t * weight).cpu().to(loss_weights.dtype)
        loss, stats = policy_loss(mb.logp, at(old.logp), adv_t * weight, mask_t, settings, ref_logp=at(old.ref_logp),
                                  num_tokens=n_mb, num_sequences=n_seq)
        stats.update(rule)
        loss.backward()
        loss_total += loss.item()
        for key, v in stats.items():  # token-weighted, so that Σ / Σ num_tokens is the step's token-mean
            agg[key] = agg.get(key, 0.0) + (v * stats["num_tokens"] if key != "num_tokens" else v)
    passes.backward_prompts()  # --shared_prompt: the prompts' share, summed over the responses that read them
    if cfg.credit == "fipo" and not own_count:
        loss_total *= fipo_rescale(model, settings, n_tok, n_seq, distributed.all_reduce_sum(dropped))
    return loss_total, agg


def fipo_dual_clip(cfg: GRPOConfig) -> float:
    """FIPO's c (spec §5): --dual_clip, else its code's clip_ratio_c = 10; log c is its filter's bound too."""
    return cfg.dual_clip or 10.0


def fipo_rescale(model, settings: LossSettings, n_tok: float, n_seq: int, dropped: torch.Tensor) -> float:
    """FIPO's sequence drop in the denominator (spec §5: its code masks a dropped response out of both): the
    mini-batch's loss was divided by its whole count ``n_tok`` tokens (``n_seq`` responses under the per-sequence
    aggregations), so every accumulated gradient is scaled by n / (n − dropped) of the loss type's unit.

    Rescaling, not counting: the drop is known only from the current θ's log-ratio, which each micro-batch's own
    training forward gives; counting it before the first backward would take a no-grad forward of the mini-batch
    more (the update's largest cost) and a second, possibly differently rounded, decision. Gradient accumulation is
    linear, so the scaled sum equals dividing each micro-batch by n − dropped, at every micro-batch size (tested in
    float64). ``dropped`` [2]: tokens, responses (summed over processes). Returns the factor (1.0: nothing dropped).
    """
    n, d = (n_tok, float(dropped[0])) if settings.aggregation == "dapo" else (float(n_seq), float(dropped[1]))
    if d == 0:
        return 1.0
    factor = max(n, 1.0) / max(n - d, 1.0)  # a mini-batch all dropped has no loss left: nothing to divide
    with torch.no_grad():
        for p in model.parameters():
            if p.grad is not None:
                p.grad.mul_(factor)
    return factor


def uses_loss_side_rule(cfg: GRPOConfig) -> bool:
    """Whether the loss masks or weights tokens itself (Forking Tokens, FIPO, DelTA's Q2 selection)."""
    return cfg.entropy_top_ratio > 0 or cfg.top_entropy_quantile < 1 or cfg.credit == "fipo" or \
        cfg.delta_select != "none"


def forking_mask(entropy, mask, cfg: GRPOConfig):  # spec §3: --entropy_top_ratio (FT's code) or TRL's quantile
    return baselines.forking_mask(entropy, mask, cfg.entropy_top_ratio, cfg.top_entropy_quantile)


@torch.no_grad()
def forking_tokens(model, batch, mb_idx, cfg: GRPOConfig):
    """``forking_mask`` over one mini-batch at the current θ: a no-grad pass for the entropies (the micro-batches'
    own forwards come too late: the first one's backward needs the whole pool's ranking). Returns ``[N, T]`` bool,
    False outside ``mb_idx``; the entropies are [N, T] floats (N·T·4 bytes: 34 MB at 2,048 × 4,096)."""
    dt = torch.promote_types(next(model.parameters()).dtype, torch.float32)  # float32 (float64 for a float64 model)
    mask, entropy = batch.response_mask, torch.zeros(batch.response_mask.shape, dtype=dt)
    for mb in policy.Passes(model, batch, mb_idx, cfg, grad=False, entropy=True):
        entropy[mb.rows, :mb.t] = mb.entropy.to(dt).cpu()
    keep = torch.zeros(mask.shape, dtype=torch.bool)
    keep[mb_idx] = forking_mask(entropy[mb_idx], mask[mb_idx], cfg)
    model.train()
    return keep


# --- The loop -------------------------------------------------------------------------------------------------
def train(cfg: GRPOConfig, given: set[str] | None = None) -> dict | None:
    """Run GRPO training as configured, under its recipe (``recipes.apply``: every setting of the recipe not in
    ``given``, the flags given on the command line); returns the before/after evaluation and the last step's record
    (None for ``--dry_run``). --resume continues exactly (checkpoint.py: every random draw is seeded by the step);
    torchrun: see distributed.py."""
    from tqdm import tqdm

    rank, world = distributed.init_distributed()
    say = tqdm.write if rank == 0 else (lambda *a, **k: None)
    policy.model_path(cfg.model)  # a folder that does not exist: one line before anything else is said
    cfg = recipes.apply(cfg, given, say)
    notes = check_config(cfg, cfg.plan_processes or world if cfg.dry_run else world, given)
    random.seed(cfg.seed)
    torch.manual_seed(cfg.seed)
    # data first: a bad row stops the run before any model is loaded
    rows = problems.load_problems(cfg.data, split="train", problem_field=cfg.data_problem_field,
                                  answer_field=cfg.data_answer_field)
    eval_source = cfg.eval_data or ("toy" if cfg.data == "toy" else "")  # the toy's held-out split by default
    eval_rows = problems.load_problems(eval_source, split="test") if eval_source else []
    if not eval_rows or not cfg.eval_num_generations:  # said once: the closing line then names no accuracy
        why = "--eval_num_generations 0; pass K >= 1" if eval_rows else \
            "--data is not the toy and --eval_data is empty; pass --eval_data FILE (e.g. data/math500.jsonl)"
        say(f"[eval] off: {why} for a held-out accuracy before and after training")
    run = None if cfg.dry_run else checkpoint.RunFolder(  # an earlier run there: see RunFolder (nothing written yet)
        cfg.output_dir or checkpoint.default_run_folder(cfg.model, cfg.credit), dataclasses.asdict(cfg), rank == 0, say)
    if run is not None and run.finished(cfg.max_steps):  # --resume of a run that ran its --max_steps: nothing to do
        return run.summary()
    # before any weights: prompts over --max_prompt_length left out, DelTA's host cache checked, the memory plan
    rows = recipes.preflight(cfg, rows, world, notes, given, say)
    if rows is None:  # --dry_run: the resolved settings and the plan were printed
        return None
    # the policy (LoRA, checkpointing), the frozen reference (--beta > 0), --resume's weights, sharding, AdamW; then
    # --resume's AdamW and RNG states and its trainer state (None for a new run)
    model, tokenizer, ref_model, optimizer, compute_dtype = policy.build(cfg, say, load_weights=run.load_weights)
    state = run.load_optimizer(model, optimizer)
    optimisations = policy.exact_optimisations(model, cfg, say)  # each default one exact here, or off with a reason
    template = rollout.resolve_template(cfg.prompt_template, cfg.model, say, cfg.data)
    stop_ids = rollout.stop_token_ids(tokenizer, template, model)
    llm = rollout.create_vllm_engine(  # after the policy is on the GPU: vLLM's memory check counts it
        policy.model_path(cfg.model), gpu_memory_utilization=cfg.vllm_gpu_memory_utilization,
        enable_sleep_mode=cfg.vllm_enable_sleep_mode, seed=cfg.seed, trust_remote_code=cfg.trust_remote_code,
        kv_cache_dtype=cfg.vllm_kv_cache_dtype, sampler_logprobs=cfg.vllm_importance_sampling_correction,
        dtype=str(compute_dtype or next(model.parameters()).dtype).removeprefix("torch.")) if cfg.use_vllm else None
    credit, sampler = Credit(cfg, tokenizer), rollout.PromptSampler(len(rows), cfg.seed)
    actor, source = Actor(model, tokenizer, optimizer, ref_model, llm), PromptSource(rows, sampler, template, stop_ids)
    start_step = state["step"] if state else 0
    if state:  # --resume: where the data order and CSCR's calibration stood
        sampler.position, credit.cscr_threshold, credit.cscr_calibrated = (state[k] for k in (
            "sampler_position", "cscr_threshold", "cscr_calibrated"))
        credit.delta_gamma = tuple(state["delta_gamma"]) if state.get("delta_gamma") else None
    run.start(model, {"prompt_template": template, "num_processes": world, "optimisations": optimisations})

    def run_eval(step):  # held-out greedy, avg@k, pass@k
        if not eval_rows or not cfg.eval_num_generations:
            return {}
        t = cfg.temperature if cfg.eval_temperature is None else cfg.eval_temperature  # the paper: T 1.0, top-p 0.7
        p = cfg.top_p if cfg.eval_top_p is None else cfg.eval_top_p
        with policy.oom_guard(f"the evaluation at step {step}"):
            record = {"step": step, **evaluate.heldout(model, tokenizer, eval_rows, template,
                                                       cfg.eval_num_generations, t, p,
                                                       cfg.max_completion_length, seed=cfg.seed + 12345,
                                                       progress=f"eval step {step}")}
        return run.log(record, echo=f"[eval step {step}]")

    def trainer_state():  # what a checkpoint keeps beside the weights: where the data order and the credit stood
        return {"sampler_position": sampler.position, "cscr_threshold": float(credit.cscr_threshold),
                "cscr_calibrated": credit.cscr_calibrated, "delta_gamma": credit.delta_gamma}

    last, started, bar = {}, False, None
    try:
        first_eval = run_eval(0) if start_step == 0 else run.logged_eval(0)  # a resumed run logged it already
        bar = tqdm(range(start_step, cfg.max_steps), desc=f"GRPO[{rule_label(cfg)}]", dynamic_ncols=True,
                   initial=start_step, total=cfg.max_steps, **({} if rank == 0 else {"disable": True}))
        for step in bar:
            with policy.oom_guard(f"step {step + 1}"):
                last = train_step(step, cfg, actor, source, credit, run)
            started = True
            bar.set_postfix(reward=f"{last['reward']:.3f}", len=f"{last['completions/mean_length']:.1f}")
            if last["completions/clipped_ratio"] > 0.5 and step < 3:
                say(f"[warn] {last['completions/clipped_ratio']:.0%} of responses hit --max_completion_length "
                    f"{cfg.max_completion_length}: they rarely score; raise it")
            if cfg.eval_steps and (step + 1) % cfg.eval_steps == 0 and step + 1 < cfg.max_steps:
                run_eval(step + 1)
            if cfg.save_steps and (step + 1) % cfg.save_steps == 0 and step + 1 < cfg.max_steps:
                run.save_checkpoint(step + 1, model, tokenizer, optimizer, trainer_state())
        summary = {"before": first_eval, "after": run_eval(cfg.max_steps) if cfg.max_steps else first_eval,
                   "last_step": last}
    except BaseException as e:
        if not started and start_step == 0:  # stopped before its first step: leave nothing that blocks the rerun
            run.discard()
        if isinstance(e, KeyboardInterrupt):  # Ctrl-C: main prints one line, what the folder holds and what next
            if bar is not None:
                bar.close()
            raise KeyboardInterrupt(run.interrupted_note()) from None
        raise
    finally:
        run.close()
    try:  # final/ (save_pretrained, and resumable: AdamW's state and the trainer's) and summary.json
        run.finish(model, tokenizer, summary, optimizer, {"step": cfg.max_steps, **trainer_state()})
        if run.main:  # samples/summary.json: report.py's numbers of this run's logged samples
            report.write_samples_summary(run.path)
    except KeyboardInterrupt:
        raise KeyboardInterrupt(run.interrupted_note()) from None
    if llm is not None:  # free the engine before the process group goes (vLLM's shutdown touches it)
        del llm
        gc.collect()
    return summary


def rule_label(cfg: GRPOConfig) -> str:
    """The run's rule for the progress bar, from its flags: the loss-side rules (SAPO's gate, Forking Tokens' mask),
    then the credit (DelTA's Q2 selection as ``delta Q2``), e.g. ``grpo``, ``sapo``, ``forking``, ``sapo+delta``.
    (report.py's ``rule_name`` spells a finished run's config out in words.)"""
    loss = (["sapo"] if cfg.loss_type == "sapo" else []) + \
        (["forking"] if cfg.entropy_top_ratio > 0 or cfg.top_entropy_quantile < 1 else [])
    credit = "delta Q2" if cfg.credit == "delta" and cfg.delta_select != "none" else cfg.credit
    return "+".join(loss + ([credit] if credit != "grpo" or not loss else []))


def main(argv=None):
    cfg = GRPOConfig(**vars(build_parser().parse_args(argv)))
    given = set(vars(build_parser(defaults=False).parse_args(argv)))  # the flags given beat the recipe's values
    interrupted = None
    try:
        summary = train(cfg, given)
        cfg = recipes.apply(cfg, given)  # the settings it ran with, for the closing line
    except (ValueError, OSError) as e:  # bad data file / model name / folder: one clear line, no traceback
        raise SystemExit(f"grpo.py: error: {e}")
    except KeyboardInterrupt as e:  # Ctrl-C: train's note on the run folder (none: nothing written yet)
        interrupted = str(e) or "before training began; the same command starts again"
    finally:
        distributed.close()
    if interrupted is not None:  # (after the except block: the interrupted frames, and their bars, are gone)
        if distributed.rank_from_env() == 0:
            print(f"grpo.py: interrupted: {interrupted}", file=sys.stderr, flush=True)
        raise SystemExit(130)  # a shell's status for SIGINT
    if summary is None:  # --dry_run
        return
    b, a, k = summary["before"], summary["after"], cfg.eval_num_generations
    if distributed.rank_from_env() == 0:
        print(f"held-out avg@{k}: {b[f'eval/avg@{k}']:.3f} -> {a[f'eval/avg@{k}']:.3f}   "
              f"greedy: {b['eval/greedy']:.3f} -> {a['eval/greedy']:.3f}" if b and a else
              f"done: {cfg.max_steps} steps in {cfg.output_dir or checkpoint.default_run_folder(cfg.model, cfg.credit)}"
              " (held-out evaluation off)")


if __name__ == "__main__":
    main()
