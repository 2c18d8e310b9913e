"""GRPO with token-level credit assignment (GRPO, DelTA, CSCR): the trainer, read top to bottom as the method.

One training step (``train_step``) is seven stages, in the order of the papers::

    1. rollout      G responses o_i for each prompt q             rollout.sample: HF generate or vLLM (--use_vllm)
    2. verify       binary reward r_i ∈ {0, 1} (+ overlong shaping) verify.grade_batch; overlong_penalty DAPO §3.4
    3. advantages   Â_i = (r_i − mean_g r) / (std_g r + 1e-6)       group_advantages   GRPO (Shao et al. 2024)
    4. θ_old        log π_θold(o_{i,t}) per token, detached         old_logprobs       (+ h_t for DelTA, same pass)
    5. credit       Ã_{i,t} (--credit): Â_i, Â_i·λ̄ or Â_i·w̃       Credit             (delta.py, cscr.py)
    6. update       clipped surrogate, token-mean, AdamW            policy_loss        DAPO (Yu et al. 2025) §3.1, §3.3
    7. log          metrics.jsonl, samples/                         checkpoint.RunFolder

In that order: the maths, the credit hook (``Credit``), one step (``train_step``), the loop (``train``; run_setup.py).

* ``--loss_type dapo`` is the token-mean over the mini-batch; with DelTA's λ̄ (mean 1 over the batch) it is DelTA's
  Σλℓ / Σλ (Eq. 8), only approximately so per mini-batch, as in DelTA's code. KL to a frozen reference: off by default;
  with --beta > 0 its k3 term covers every valid token, whatever tokens a rule of the loss keeps (policy_loss).
* The papers' comparisons (docs/reproduce.md) are chosen once from their flags, never branches here: a surrogate is a
  registered policy loss (``register_policy_loss``, TRL's names, as verl's); a token mask or weight of the loss is
  a rule of loss_rules.py; DelTA's and CSCR's ablations sit beside them (delta_ablations.py, cscr_ablations.py).
* Left out: entropy bonus, reward shaping beyond DAPO's overlong penalty, dynamic sampling, learning-rate schedules.
  θ_old's log-probs are this trainer's own (ratio 1 at the first update), so the loss (≈ 0) shows no progress.
"""

from __future__ import annotations

import os
import signal
import sys


def _interrupted_while_importing(signum, frame):
    """Ctrl-C before ``main`` (the imports below take seconds: torch, transformers): run_setup.run_command's line for
    a run stopped before training began, from process 0 only, and a shell's status for SIGINT; no traceback. It
    leaves at once (``os._exit``): nothing was written, and a half-imported torch is not finalised."""
    if os.environ.get("RANK", "0") == "0":
        print("grpo.py: interrupted: before training began; the same command starts again", file=sys.stderr,
              flush=True)
    os._exit(130)


if __name__ == "__main__":  # until main: from then on run_setup.run_command turns Ctrl-C into its line
    signal.signal(signal.SIGINT, _interrupted_while_importing)

# (after the handler: these imports take seconds)
import contextlib
import dataclasses
import functools
import gc
import random
import time
from collections import namedtuple
from dataclasses import dataclass

import torch

from comparisons import baselines
from trainer import checkpoint
import cscr
from comparisons import cscr_ablations
import delta
from comparisons import delta_ablations
from trainer import distributed
from comparisons import loss_rules
from trainer import memory_plan
from trainer import policy
from trainer import preflight
from trainer import recipes
from trainer import grpo_config
import rollout
from trainer import run_setup
from trainer import sampler_mismatch
import toy
import verify
from trainer.grpo_config import GRPOConfig  # every flag (grpo_config.py); its parser and checks: build_parser, check_config
toy.register()  # --model toy, --data toy: the built-in toy in the generic modules (toy.py)

# --- The maths: pure functions on tensors ---------------------------------------------------------------------
def group_advantages(rewards: torch.Tensor, group_size: int, scale_rewards: str = "group",
                     eps: float = 1e-6) -> torch.Tensor:
    """GRPO's Â_i = (r_i − mean_g) / (std_g + eps) (GRPO §4.1.2; DelTA spec §1), ``rewards`` ``[N]`` group by group;
    ``scale_rewards="none"``: r − mean (Dr. GRPO). Returns ``[N]`` float32 (float64 for float64 rewards), exactly 0
    for a group whose rewards are all equal (NeMo-RL #4161)."""
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
    """DAPO's soft overlong punishment (§3.4; verl's ``overlong_buffer``), added to the reward: R_length(o) =
    min(0, ((L_max − L_cache) − |o|) / L_cache · factor), ``lengths`` ``[N]`` (EOS included), L_max =
    ``max_completion_length``, L_cache = ``buffer_len``. Returns ``[N]`` float32 (≤ 0)."""
    expected = max_completion_length - buffer_len  # L_max − L_cache
    return torch.clamp((expected - lengths.to(torch.float32)) / buffer_len * factor, max=0.0)


@dataclass(frozen=True)
class LossSettings:
    """The surrogate's settings (``policy_loss``), as the flags of the same names give them (``from_config``)."""
    epsilon: float = 0.2
    epsilon_high: float = 0.28
    dual_clip: float | None = None
    loss_type: str = "dapo"
    max_completion_length: int | None = None
    beta: float = 0.0
    extra: dict = dataclasses.field(default_factory=dict)  # the registered losses' own settings (register_policy_loss)

    @classmethod
    def of(cls, **keywords) -> LossSettings:  # fields and registered losses' settings by name; unknown: TypeError
        own = {k: keywords.pop(k) for k in list(keywords) if k in POLICY_LOSS_SETTINGS}
        return cls(**keywords, extra=own)

    @classmethod
    def from_config(cls, cfg: GRPOConfig) -> LossSettings:
        return cls.of(**{name: getattr(cfg, name) for name in [f.name for f in dataclasses.fields(cls)][:-1]
                         + list(POLICY_LOSS_SETTINGS)})

    def __getattr__(self, name):  # a registered loss's own setting, by its flag's name (its default if not given)
        if name == "extra" or name not in POLICY_LOSS_SETTINGS:
            raise AttributeError(name)
        return self.extra.get(name, POLICY_LOSS_SETTINGS[name])

    @property
    def aggregation(self) -> str:  # its policy loss's normaliser: one of AGGREGATIONS
        normaliser = POLICY_LOSSES[self.loss_type].aggregation(self)
        if normaliser not in AGGREGATIONS:
            raise ValueError(f"policy loss {self.loss_type!r}: its aggregation gave {normaliser!r}, not one of "
                             f"{AGGREGATIONS}")
        return normaliser


# The policy losses by TRL's loss_type (verl's @register_policy_loss): the per-token surrogate
# ``surrogate(ratio [B, T], token_adv [B, T], settings) -> (ℓ [B, T], dual-clipped [B, T] bool)`` and how the loss
# normalises, ``aggregation(settings)`` -> one of AGGREGATIONS (policy_loss).
PolicyLoss = namedtuple("PolicyLoss", "surrogate aggregation")
POLICY_LOSSES: dict[str, PolicyLoss] = {}
POLICY_LOSS_SETTINGS: dict[str, object] = {}  # the registered losses' own settings (flag name -> default)
AGGREGATIONS = ("dapo", "grpo", "dr_grpo")  # policy_loss's normalisers (TRL's loss_type names)


def register_policy_loss(name: str, aggregation, settings=None):
    """Register ``surrogate`` as ``--loss_type name`` (a decorator; the flag's choices are the names registered when
    ``build_parser`` is called). ``aggregation`` (required: there is no default normaliser): one of AGGREGATIONS, or
    a function settings -> one of them; ``settings``: its own settings {flag name: default}, read from the flags of
    those names (``LossSettings``). Left out: TypeError; None or another name: ValueError, naming the loss."""
    if not (callable(aggregation) or aggregation in AGGREGATIONS):
        raise ValueError(f"register_policy_loss({name!r}): aggregation must be one of {AGGREGATIONS} or a function "
                         f"of the settings returning one, not {aggregation!r}")
    normaliser = aggregation if callable(aggregation) else (lambda _settings: aggregation)

    def add(surrogate):
        POLICY_LOSSES[name] = PolicyLoss(surrogate, normaliser)
        POLICY_LOSS_SETTINGS.update(settings or {})
        return surrogate
    return add


@register_policy_loss("dr_grpo", "dr_grpo")  # (decorators apply bottom-up: --loss_type lists dapo, grpo, dr_grpo)
@register_policy_loss("grpo", "grpo")
@register_policy_loss("dapo", "dapo")
def clipped_surrogate(ratio, token_adv, settings: LossSettings):
    """PPO's clipped surrogate (Eq. 7) with DAPO's Clip-Higher (§3.1) and the dual clip c (Ye et al. 2020):
    ℓ = max(−Ã·ratio, −Ã·clip(ratio, 1−ε, 1+ε_high)); ℓ = min(ℓ, −Ã·c) where Ã < 0. Returns (ℓ, dual-clipped)."""
    clip = ratio.clamp(1.0 - settings.epsilon, 1.0 + settings.epsilon_high)  # [B, T]
    per_token = torch.maximum(-token_adv * ratio, -token_adv * clip)
    if settings.dual_clip is None:
        return per_token, torch.zeros_like(ratio, dtype=torch.bool)
    dual_bound = -token_adv * settings.dual_clip  # [B, T]
    dual_active = (token_adv < 0) & (per_token > dual_bound)  # [B, T] bool
    return torch.where(token_adv < 0, torch.minimum(per_token, dual_bound), per_token), dual_active


# SAPO: a soft gate in place of the clip (spec §4)
register_policy_loss("sapo", baselines.sapo_aggregation, baselines.SAPO_SETTINGS)(baselines.sapo_surrogate)


def build_parser(defaults: bool = True):
    """The command line (grpo_config.build_parser), ``--loss_type`` one of the losses registered by now."""
    return grpo_config.build_parser(defaults, loss_types=list(POLICY_LOSSES))


def check_config(cfg: GRPOConfig, world: int = 1, given: set[str] | None = None) -> list[str]:
    """grpo_config.check_config, ``loss_type`` one of the losses registered by now (before any weights load)."""
    return grpo_config.check_config(cfg, world, given, loss_types=list(POLICY_LOSSES))


def policy_loss(logp, old_logp, token_adv, response_mask, settings: LossSettings | None = None, *, ref_logp=None,
                num_tokens=None, num_sequences=None, valid_mask=None, num_valid=None, **keywords):
    """The loss (to minimise): ``settings.loss_type``'s surrogate ℓ of ratio = exp(clamp(logp − old_logp, ±20)) over
    the tokens of ``response_mask``, + β·k3 (exp(ref − logp) − (ref − logp) − 1, β > 0) over every valid token,
    ``valid_mask`` (default: ``response_mask``), each aggregated by ``aggregate`` (``dapo`` token-mean, ``grpo`` the
    mean of each sequence's token-mean, ``dr_grpo`` Σ / (B·max_completion_length)): a rule that masks ℓ leaves the
    k3 term the default's, as Forking Tokens' and FIPO's code add verl's kl_loss = agg_loss(k3, response_mask).
    ``logp``, ``old_logp``, ``response_mask``, ``valid_mask``, ``ref_logp`` ``[B, T]`` (nats; response_mask ⊆
    valid_mask); ``token_adv`` Ã ``[B, T]`` or Â ``[B]``; ``settings`` or its fields as keywords; ``num_tokens`` /
    ``num_valid`` / ``num_sequences``: the whole mini-batch's counts (of response_mask's tokens, of valid_mask's,
    given with it, and of rows) for a micro-batch. Returns (loss, token-means of ``clip_ratio/{low,high,region,
    dual}_mean`` and ``kl`` (k3 over the valid tokens); ``num_tokens``)."""
    if settings is not None and keywords:
        raise ValueError(f"give policy_loss a LossSettings or its fields as keywords, not both: {sorted(keywords)}")
    settings = settings or LossSettings.of(**keywords)  # an unknown keyword: TypeError, naming it
    mask = response_mask.to(logp.dtype)
    valid = mask if valid_mask is None else valid_mask.to(logp.dtype)
    adv = (token_adv[:, None] if token_adv.dim() == 1 else token_adv).to(logp.dtype)
    if logp.shape != old_logp.shape or logp.shape != mask.shape or logp.shape != valid.shape or \
            adv.shape[0] != logp.shape[0] or adv.shape[1] not in (1, logp.shape[1]) or \
            settings.loss_type not in POLICY_LOSSES or (settings.beta > 0 and ref_logp is None) or \
            (num_valid is not None and valid_mask is None) or \
            (settings.aggregation == "dr_grpo" and not settings.max_completion_length):
        raise ValueError(f"policy_loss: logp {tuple(logp.shape)}, old_logp {tuple(old_logp.shape)}, response_mask "
                         f"{tuple(mask.shape)}, valid_mask {tuple(valid.shape)} [B, T], token_adv {tuple(adv.shape)} "
                         f"[B] or [B, T]; loss_type {settings.loss_type!r} one of {sorted(POLICY_LOSSES)}; beta > 0 "
                         "needs ref_logp, num_valid valid_mask, dr_grpo max_completion_length")
    rule, adv = POLICY_LOSSES[settings.loss_type], adv.expand_as(logp)  # [B, T]
    # padded positions may hold anything (e.g. -inf): zero them before exp so no NaN reaches the gradient
    ratio = torch.exp(torch.where(mask > 0, logp - old_logp, torch.zeros_like(logp)).clamp(-20.0, 20.0))  # [B, T]
    per_token, dual_active = rule.surrogate(ratio, adv, settings)  # [B, T]
    B = float(logp.shape[0] if num_sequences is None else num_sequences)
    aggregation = settings.aggregation
    surrogate = aggregate(per_token * mask, mask, aggregation, num_tokens, B, settings.max_completion_length)  # ℓ·mask
    if settings.beta <= 0:
        return surrogate, surrogate_stats(ratio, adv, mask, settings, dual_active, None, valid)
    d = torch.where(valid > 0, ref_logp - logp, torch.zeros_like(logp)).clamp(-20.0, 20.0)  # [B, T]
    kl = torch.exp(d) - d - 1.0  # [B, T]: k3 ≥ 0, unbiased for KL(π‖π_ref) under samples from π
    kl_count = num_tokens if valid_mask is None else num_valid  # the valid tokens' count over the mini-batch
    penalty = aggregate(kl * valid, valid, aggregation, kl_count, B, settings.max_completion_length)
    return surrogate + settings.beta * penalty, surrogate_stats(ratio, adv, mask, settings, dual_active, kl, valid)


def aggregate(per_token, mask, aggregation: str, num_tokens, num_sequences: float, max_completion_length):
    """``per_token`` ``[B, T]`` (0 outside ``mask``) reduced by one of AGGREGATIONS: ``dapo`` Σ / Σmask (or
    ``num_tokens``, the mini-batch's count); ``grpo`` Σ over the rows of each row's Σ / its Σmask, / ``num_sequences``;
    ``dr_grpo`` Σ / (num_sequences·max_completion_length). Returns a scalar tensor."""
    if aggregation == "dapo":
        return per_token.sum() / max(float(mask.sum() if num_tokens is None else num_tokens), 1.0)
    if aggregation == "grpo":
        return (per_token.sum(-1) / mask.sum(-1).clamp(min=1.0)).sum() / num_sequences
    return per_token.sum() / (num_sequences * max_completion_length)  # dr_grpo (LossSettings.aggregation checked)


@torch.no_grad()
def surrogate_stats(ratio, adv, mask, settings: LossSettings, dual_active, kl, valid) -> dict:
    """Token-means over ``mask`` of the clipped fractions (ratio < 1−ε with Ã < 0; > 1+ε_high with Ã > 0) and the dual
    clip, and k3's over ``valid`` (the tokens of its term)."""
    n = mask.sum().clamp(min=1.0)
    low = ((ratio < 1.0 - settings.epsilon) & (adv < 0)).to(mask.dtype) * mask
    high = ((ratio > 1.0 + settings.epsilon_high) & (adv > 0)).to(mask.dtype) * mask
    return {"clip_ratio/low_mean": (low.sum() / n).item(), "clip_ratio/high_mean": (high.sum() / n).item(),
            "clip_ratio/region_mean": ((low + high).sum() / n).item(),
            "clip_ratio/dual_mean": ((dual_active.to(mask.dtype) * mask).sum() / n).item(),
            "kl": ((kl * valid).sum() / valid.sum().clamp(min=1.0)).item() if kl is not None else 0.0,
            "num_tokens": mask.sum().item()}


# --- Credit assignment: sequence advantages Â_i -> token advantages Ã_{i,t} (the --credit hook) ---------------
class Credit:
    """Â ``[N]`` -> Ã ``[N, T]`` once per rollout batch, no grad, from θ_old, fixed for the step's updates (DelTA spec
    §2.4; CSCR spec §4). ``token_weights``: the last call's weights for samples/: λ̄ (DelTA), s (CSCR), none."""

    def __init__(self, cfg: GRPOConfig, tokenizer):
        self.cfg, self.tokenizer, self.token_weights = cfg, tokenizer, {}
        self.cscr_threshold, self.cscr_calibrated = cfg.cscr_threshold, False
        if cfg.credit == "cscr":  # CSCR's options; its ablations (cscr_ablations.py) chosen once, by their flags
            self.cscr_settings = cscr_ablations.settings_from_flags(cfg)
        # DelTA's steps and proxy: the paper's, or an ablation's (delta_ablations.py), chosen once from the flags; under
        # torchrun --delta_scope global sums its statistics over the processes (spec §2.4)
        pool = distributed.all_reduce_sum if distributed.is_distributed() and cfg.delta_scope == "global" else None
        self.delta_steps = delta_ablations.steps_from_flags(cfg, pool)
        self.proxy = delta_ablations.proxy_from_flags(cfg)
        self.lam_bar = delta_ablations.lam_bar_from_flags(cfg, self._delta_lam_bar, distributed.rank())
        self.assign = {"delta": self._delta, "cscr": self._cscr}.get(cfg.credit, self.broadcast)  # grpo, fipo

    def needs_hidden(self) -> bool:  # stage 4 keeps h_t (DelTA's --delta_impl normal, not its random control)
        return self.cfg.credit == "delta" and self.cfg.delta_impl == "normal" and \
            self.lam_bar == self._delta_lam_bar

    @torch.no_grad()
    def __call__(self, model, batch: rollout.Rollout, adv, old: ThetaOld, answers, step: int = 0):
        """adv Â ``[N]``, old: stage 4's ``ThetaOld``, answers: each row's reference (CSCR), step: seeds a random
        draw. Returns (Ã ``[N, T]``, stats)."""
        return self.assign(model, batch, adv, old, answers, step)  # chosen once, by --credit (__init__)

    @staticmethod
    def broadcast(model, batch, adv, old, answers, step):  # GRPO: every token of o_i gets Â_i
        return adv[:, None] * batch.response_mask, {}

    def token_credit(self, adv, token_adv):
        """Each token's credit Ã / Â ``[N, T]`` for samples/ (where Â = 0: DelTA's λ̄, else 1)."""
        share = token_adv / torch.where(adv == 0, 1.0, adv).to(token_adv.dtype)[:, None]
        fill = self.token_weights.get("lambda_bar", torch.ones_like(share))
        return torch.where((adv == 0)[:, None], fill.to(share.dtype), share)

    def _delta(self, model, batch, adv, old, answers, step):
        lam_bar, stats = self.lam_bar(model, batch, adv, old, step)  # λ̄ [N, T]: DelTA, or the random control
        self.token_weights = {"lambda_bar": lam_bar}  # (Q2's selection: loss_rules.Q2Selection)
        return delta.delta_token_advantages(adv, lam_bar, batch.response_mask), stats  # Ã = Â·λ̄ (spec §2.3 step 7)

    def _delta_lam_bar(self, model, batch, adv, old, step):
        """DelTA's λ̄ ``[N, T]`` and stats: ``delta.delta_coefficients_chunked`` over θ_old's proxies v (App. F), from
        h_t kept by stage 4 (one chunk) or recomputed in each of its K + 3 passes (--delta_impl; spec §2.5)."""
        cfg, mask, ids = self.cfg, batch.response_mask, batch.response_ids
        proxy = delta_ablations.proxy_for(self.proxy, model, distributed.full_weight)  # v's step, bound to the model
        layout, h_chunks = policy.hidden_chunks(model, batch, cfg, old.hidden)

        def chunks():  # (v [b, t, H], Â [b], mask [b, t]) of each chunk, in order
            for h, rows, t in h_chunks():
                yield proxy(h, old.logp[rows, :t], mask[rows, :t], ids[rows, :t]), adv[rows], \
                    mask[rows, :t]

        result = delta.delta_coefficients_chunked(chunks if old.hidden is None else list(chunks()), cfg.delta_k,
                                                  cfg.delta_lam_min, cfg.delta_lam_max, self.delta_steps)
        lam_bar = torch.zeros(mask.shape, dtype=result.lam_bar[0].dtype)
        for (rows, t), part in zip(layout, result.lam_bar):
            lam_bar[rows, :t] = part.cpu()
        stats = delta.delta_stats(result)
        return lam_bar, distributed.pool_min_max(stats) if self.delta_steps.pool else stats  # extremes: per process

    def _cscr(self, model, batch, adv, old, answers, step):
        cfg, mask, old_logp = self.cfg, batch.response_mask, old.logp
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
        token_adv = cscr.cscr_token_advantages(adv, old_logp, lp_pos, lp_neg, mask, self.cscr_threshold,
                                               self.cscr_settings)
        stats = cscr.cscr_stats(adv, old_logp, lp_pos, lp_neg, mask, self.cscr_threshold, self.cscr_settings)
        self.token_weights = {"sensitivity": s}
        return token_adv, {**stats, "cscr/threshold": float(self.cscr_threshold)}

    def _scoring_logprobs(self, *args):  # CSCR's scoring passes: each privileged prompt run once (--shared_prompt)
        return (policy.shared_prompt_logprobs if self.cfg.shared_prompt else policy.token_logprobs)(*args)


# --- One step: rollout -> verify -> advantages -> θ_old -> credit -> update -> log ----------------------------
# What a step works on beside its config (``train`` makes both once): the policy and what policy.build makes beside
# it (``llm``: --use_vllm's engine, None: HF generate); the training problems, their order, template and stop tokens
Actor = namedtuple("Actor", "model tokenizer optimizer ref_model llm", defaults=(None,))
PromptSource = namedtuple("PromptSource", "dataset sampler template stop_ids")
ThetaOld = policy.ThetaOld  # stage 4's results (policy.py: their sizes at the papers' scale)
old_logprobs = functools.partial(policy.old_logprobs, check_hidden=memory_plan.check_delta_cache)  # stage 4


def train_step(step, cfg: GRPOConfig, actor: Actor, source: PromptSource, credit, run: checkpoint.RunFolder,
               rules: loss_rules.Rules | None = None) -> dict:
    """One step: the seven stages of the module header (each process on its own whole groups); returns its metrics
    record. ``rules``: the loss stage's comparison rules (default: from ``cfg``)."""
    model, tokenizer, optimizer, ref_model, _ = actor
    rules, begun, _ = rules if rules is not None else loss_rules.choose(cfg), time.time(), policy.reset_peak_memory()
    # 1. rollout: G responses per prompt; every process takes its own whole groups of the same prompt order
    batch, answers, t_gen = run_setup.rollout_batch(step, cfg, actor, source)
    # 2. verify: binary reward, every grader failure counted; DAPO's overlong shaping adds R_length ≤ 0 (§3.4)
    graded, lengths = verify.grade_batch(batch.texts, answers), batch.response_lengths  # lengths as sampled
    correct = torch.tensor([float(ok) for ok, _ in graded])
    rewards = correct + overlong_penalty(lengths, cfg.max_completion_length, cfg.overlong_buffer_len,
                                         cfg.overlong_penalty_factor) if cfg.overlong_buffer_len else correct
    # 3. group advantages Â_i (GRPO); --mask_truncated_completions leaves truncated responses out of the loss
    adv, batch.response_mask = group_advantages(rewards, cfg.num_generations, cfg.scale_rewards), loss_mask(batch, cfg)
    # 4. θ_old's log-probs, no grad (+ DelTA's h_t, + the reference's for --beta > 0); for one update at θ_old = θ,
    #    the training forward, which stage 6 reuses
    old = old_logprobs(model, batch, cfg, credit.needs_hidden(), ref_model,
                       training_forward=can_update_on_policy(cfg, len(adv), ref_model is not None))
    # 5. token advantages Ã_{i,t}; then the tokens a rule of the loss keeps from them (rules.kept; None: all)
    with distributed.gathered_weights(model) if cfg.credit == "cscr" else contextlib.nullcontext():  # CSCR: FSDP2
        token_adv, credit_stats = credit(model, batch, adv, old, answers, step)
    token_adv, _, rule_stats = rules.select(adv, token_adv, credit.token_weights, batch.response_mask, step)
    # 6. update: num_iterations × num_mini_batches AdamW steps on Ã·w (w: sampler_mismatch's, 1 without); each token's
    #    loss-side factor for samples/ in rules.loss_weights ([N, T], N·T·4 bytes: 34 MB at 2,048 × 4,096)
    rules.loss_weights = torch.zeros_like(token_adv) if rules else None
    update_adv, sampling_stats = sampler_mismatch.correction(cfg)(token_adv, old.logp, batch)
    update = policy_update(model, optimizer, batch, old, update_adv, cfg, step, rules)
    # 7. log: metrics.jsonl (pooled over processes) every step, samples/ every logging_steps
    record = run_setup.log_step(run, step, cfg, batch, rewards, correct, verify.summarize(graded), lengths,
                                update, {**credit_stats, **rule_stats, **sampling_stats}, (begun, t_gen))
    run_setup.write_samples(run, step, cfg, tokenizer, batch, rewards, adv, token_adv, credit, rules.loss_weights)
    return record


def loss_mask(batch, cfg: GRPOConfig):
    """The response mask the loss uses: --mask_truncated_completions zeroes the responses cut at the length limit."""
    stopped = torch.tensor([r == "stop" for r in batch.finish_reasons], dtype=batch.response_mask.dtype)[:, None]
    return batch.response_mask * stopped if cfg.mask_truncated_completions else batch.response_mask


def update_stat_names(cfg: GRPOConfig, rules=None) -> list[str]:
    """The statistics ``policy_update`` logs: ``policy_loss``'s (asked of a one-token call) and its rules'."""
    one = torch.zeros(1, 1)
    names = list(policy_loss(one, one, one[:, 0], torch.ones(1, 1), LossSettings.from_config(cfg))[1])
    return names + (rules if rules is not None else loss_rules.choose(cfg)).stat_names


def can_update_on_policy(cfg: GRPOConfig, num_rows: int, has_reference: bool) -> bool:
    """Whether stage 4 may take θ_old's log-probs from the training forward: --fuse_old_logprobs (where exact), one
    update of one micro-batch, no KL reference; not CSCR under FSDP, nor a rule that needs the update's entropies."""
    return (cfg.fuse_old_logprobs and cfg.num_iterations == 1 and cfg.num_mini_batches == 1 and not has_reference
            and (cfg.micro_batch_size == 0 or cfg.micro_batch_size >= num_rows)
            and not (cfg.credit == "cscr" and distributed.is_distributed())
            and not loss_rules.choose(cfg).needs_entropy)


def policy_update(model, optimizer, batch, old: ThetaOld, token_adv, cfg: GRPOConfig, step: int, rules=None):
    """Stage 6: ``num_iterations`` passes × ``num_mini_batches`` clipped AdamW steps (a non-finite one skipped), the
    rows permuted by a generator seeded by (seed, step, pass). ``token_adv`` Ã ``[N, T]``; ``rules``: the loss's.
    Returns (Σ mini-batch losses, applied pre-clip gradient norms, token-weighted statistic sums, skipped updates)."""
    model.train()
    rules, N = rules if rules is not None else loss_rules.choose(cfg), batch.response_mask.shape[0]
    mb_size, loss_sum, grad_norms, agg, skipped = N // cfg.num_mini_batches, 0.0, [], {}, 0
    signal = distributed.all_reduce_sum(torch.tensor([float(token_adv.abs().sum())], dtype=torch.float64)).item()
    if signal == 0 and cfg.beta == 0:  # every advantage 0: no gradient, and an AdamW step would still move the
        return 0.0, [], {**dict.fromkeys(update_stat_names(cfg, rules), 0.0), "no_signal": 1.0}, 0  # weights
        # (decay, momentum): the weights and AdamW's state stay, each statistic 0.0 (every line has the same keys)
    for epoch in range(cfg.num_iterations):
        perm = torch.randperm(N, generator=torch.Generator().manual_seed(cfg.seed + 7919 * step + epoch))
        for k in range(cfg.num_mini_batches):
            rows = perm[k * mb_size:(k + 1) * mb_size] if cfg.num_mini_batches > 1 else torch.arange(N)
            optimizer.zero_grad(set_to_none=True)
            loss, stats = minibatch_backward(model, batch, old, token_adv, rows, cfg, rules)
            loss = distributed.all_reduce_sum(torch.tensor(loss, dtype=torch.float64)).item()  # Σ of the parts
            loss_sum += loss
            agg.update({name: agg.get(name, 0.0) + value for name, value in stats.items()})
            grad_norm = policy.clip_and_step(model, optimizer, loss, cfg.max_grad_norm, step)
            skipped, grad_norms = skipped + (grad_norm is None), grad_norms + ([] if grad_norm is None else [grad_norm])
    # free the gradients now: otherwise they stay allocated through the next rollout (16 GB for a full Qwen3-8B)
    optimizer.zero_grad(set_to_none=True)
    return loss_sum, grad_norms, agg, skipped


def backward_minibatch(model, batch, old: ThetaOld, token_adv, rows, cfg: GRPOConfig, keep=None, loss_weights=None):
    """``minibatch_backward`` with the rules of ``cfg`` (``keep`` ``[N, T]`` bool: the tokens a rule selected, None:
    all; ``loss_weights`` ``[N, T]``, optional, written: each token's loss-side factor). Returns (loss, stat sums)."""
    return minibatch_backward(model, batch, old, token_adv, rows, cfg, loss_rules.choose(cfg, keep, loss_weights))


def minibatch_backward(model, batch, old: ThetaOld, token_adv, rows, cfg: GRPOConfig, rules: loss_rules.Rules):
    """Accumulate the gradient of one mini-batch's loss (``rows``), ``cfg.micro_batch_size`` rows at a time, its
    normaliser counted once over the mini-batch and the processes (trl#3021). ``rules`` may mask, weight and rescale
    (call on zeroed gradients). Returns (loss, token-weighted ``policy_loss`` statistic sums)."""
    device, loss_total, agg = next(model.parameters()).device, 0.0, {}
    settings = rules.settings(LossSettings.from_config(cfg))
    tokens = rules.pool(model, batch, rows, rules.kept)  # a rule's tokens, ranked over the mini-batch at the current θ
    valid = batch.response_mask  # every valid token: the k3 term's, whatever a rule keeps (policy_loss)
    mask = valid if tokens is None else valid * tokens  # the tokens of the surrogate
    counts = distributed.all_reduce_sum(torch.tensor([mask[rows].sum().item(), valid[rows].sum().item(),
                                                      float(len(rows))], dtype=torch.float64))
    n_tok, n_valid, n_seq = counts[0].item(), counts[1].item(), int(counts[2].item())
    # the training forward over these rows: stage 4's, when it was this one (its only update), else a new one
    passes = old.update_passes or policy.Passes(model, batch, rows, cfg, grad=True, entropy=rules.needs_entropy)
    for mb in passes:
        at = lambda x: mb.take(x).to(device) if x is not None else None  # noqa: E731  (this micro-batch's part)
        adv_t, old_t, valid_t = at(token_adv), at(old.logp), at(valid)
        weight, mask_t, rule_stats = rules.weigh(mb, old_t, valid_t, adv_t, at(mask))
        # a rule that counts each micro-batch's own kept tokens: their mean, divided by the micro-batches summed
        n_mb = max(float(mask_t.sum()), 1.0) * len(passes.layout) * distributed.world_size() if rules.own_count \
            else n_tok
        if rules.loss_weights is not None:  # what the loss made of each token's credit: its mask, times its factor
            rules.loss_weights[mb.rows, :mb.t] = (mask_t * weight).cpu().to(rules.loss_weights.dtype)
        loss, stats = policy_loss(mb.logp, old_t, adv_t * weight, mask_t, settings, ref_logp=at(old.ref_logp),
                                  num_tokens=n_mb, num_sequences=n_seq, valid_mask=valid_t, num_valid=n_valid)
        loss.backward()
        loss_total += loss.item()
        for key, v in {**stats, **rule_stats}.items():  # token-weighted: Σ / Σ num_tokens is the step's token-mean
            agg[key] = agg.get(key, 0.0) + (v * stats["num_tokens"] if key != "num_tokens" else v)
    passes.backward_prompts()  # --shared_prompt: the prompts' share, summed over the responses that read them
    per_token = settings.aggregation == "dapo"
    return loss_total * rules.finish(model, per_token, n_tok if per_token else float(n_seq)), agg


# --- The loop -------------------------------------------------------------------------------------------------
def train(cfg: GRPOConfig, given: set[str] | None = None) -> dict | None:
    """Train as configured, under its recipe (``recipes.apply``: the recipe's settings not in ``given``, the flags
    given); returns the before/after evaluation and the last step's record (None: --dry_run). --resume continues
    exactly (every random draw is seeded by the step); torchrun: distributed.py."""
    from tqdm import tqdm

    rank, world = distributed.init_distributed()
    say = tqdm.write if rank == 0 else (lambda *a, **k: None)
    policy.model_path(cfg.model)  # a folder that does not exist: one line before anything else is said
    cfg = recipes.apply(cfg, given, say)
    notes = check_config(cfg, cfg.plan_processes or world if cfg.dry_run else world, given)
    random.seed(cfg.seed)
    torch.manual_seed(cfg.seed)
    dataset, eval_set = run_setup.load_data(cfg, say)  # data first: a bad row stops the run before any model loads
    run = run_setup.open_run(cfg, rank, say)
    if run is not None and run.finished(cfg.max_steps):  # --resume of a run that ran its --max_steps: nothing to do
        return run.summary()
    # before any weights: prompts over --max_prompt_length left out, DelTA's host cache checked, the memory plan
    dataset = preflight.check(cfg, dataset, world, notes, given, say)
    if dataset is None:  # --dry_run: the resolved settings and the plan were printed
        return None
    model, tokenizer, ref_model, optimizer, llm, template, stop_ids, state, optimisations = \
        run_setup.build_policy(cfg, run, say)
    credit, sampler = Credit(cfg, tokenizer), rollout.PromptSampler(len(dataset), cfg.seed)
    actor, source = Actor(model, tokenizer, optimizer, ref_model, llm), PromptSource(dataset, sampler, template,
                                                                                     stop_ids)
    rules = loss_rules.choose(cfg)  # the loss stage's comparison rules, once
    start_step, heldout = run_setup.restore(state, sampler, credit), run_setup.HeldOut(cfg, model, tokenizer,
                                                                                       eval_set, template, run)
    run.start(model, {"prompt_template": template, "num_processes": world, "optimisations": optimisations})
    summary = run_setup.run_steps(cfg, run, start_step, heldout, lambda step: train_step(
        step, cfg, actor, source, credit, run, rules), lambda step: run.save_checkpoint(
        step, model, tokenizer, optimizer, run_setup.trainer_state(sampler, credit)), loss_rules.rule_label(cfg))
    run_setup.finish(run, actor, summary, {"step": cfg.max_steps, **run_setup.trainer_state(sampler, credit)})
    del actor, llm  # free --use_vllm's engine before the process group goes (vLLM's shutdown touches it)
    gc.collect()
    return summary


def main(argv=None):
    cfg = GRPOConfig(**vars(build_parser().parse_args(argv)))
    given = set(vars(build_parser(defaults=False).parse_args(argv)))  # the flags given beat the recipe's values
    run_setup.run_command(train, cfg, given)  # errors and Ctrl-C as one line; the closing line


if __name__ == "__main__":
    signal.signal(signal.SIGINT, signal.default_int_handler)  # Ctrl-C: KeyboardInterrupt, run_command's line
    main()
