"""GRPO with token-level credit assignment (GRPO, DelTA, CSCR): the trainer, read top to bottom as the method.

One training step (``train_step``) is seven stages, in the order of the papers::

    1. rollout      G responses o_i for each prompt q             rollout.sample: HF generate or vLLM (--use_vllm)
    2. verify       binary reward r_i ∈ {0, 1} (+ overlong shaping) verify.grade_batch; overlong_penalty DAPO §3.4
    3. advantages   Â_i = (r_i − mean_g r) / (std_g r + 1e-6)       group_advantages   GRPO (Shao et al. 2024)
    4. θ_old        log π_θold(o_{i,t}) per token, detached         old_logprobs       (+ h_t for DelTA, same pass)
    5. credit       Ã_{i,t} (--credit): Â_i, Â_i·λ̄ or Â_i·w̃       CREDIT_FUNCTIONS   delta.py, cscr.py (credit_methods)
    6. update       clipped surrogate, token-mean, AdamW            policy_loss        DAPO (Yu et al. 2025) §3.1, §3.3
    7. log          metrics.jsonl, samples/                         run_setup.log_step

In that order: the maths, the credit (``Credit``), one step (``train_step``), the loop (``train``; run_setup.py).

* ``--loss_type dapo`` is the token-mean over the mini-batch; with DelTA's λ̄ (mean 1 over the batch) it is DelTA's
  Σλℓ / Σλ (Eq. 8), only approximately so per mini-batch, as in DelTA's code. KL to a frozen reference: off by default.
* The papers' comparisons (comparisons/, docs/reproduce.md) replace, they do not hook: a surrogate is an entry of
  ``POLICY_LOSSES``, a token-credit method one of ``CREDIT_FUNCTIONS``, a changed loss stage one of ``LOSS_STAGES``,
  each a whole function with the signature of the one it replaces, registered from its own file and chosen once
  from its flags (``register``; ``run_setup.credit_name``, ``run_setup.loss_stage_name``; ``flag_choices``).
* Left out: entropy bonus, reward shaping beyond DAPO's overlong penalty, dynamic sampling, learning-rate schedules.
  Each step's first update starts at ratio 1 (θ_old is θ), where the loss is −(token-mean of Ã): not progress.
"""

from __future__ import annotations

import signal

import trainer

if __name__ == "__main__":  # until main: Ctrl-C while the imports below load is one line (then run_command's)
    trainer.catch_ctrl_c_while_importing()

# (after the handler: these imports take seconds)
import dataclasses
import time
from collections import namedtuple
from dataclasses import dataclass

import torch

import verify
from trainer import credit_methods, distributed, grpo_config, policy, run_setup
from trainer.grpo_config import GRPOConfig  # every flag (grpo_config.py); its parser and checks: build_parser


# --- The maths: pure functions on tensors ---------------------------------------------------------------------
def group_advantages(
    rewards: torch.Tensor, group_size: int, scale_rewards: str = "group", eps: float = 1e-6
) -> torch.Tensor:
    """GRPO's Â_i = (r_i − mean_g) / (std_g + eps) (GRPO §4.1.2; DelTA spec §1), ``rewards`` ``[N]`` group by group;
    ``scale_rewards="none"``: r − mean (Dr. GRPO). Returns ``[N]`` float32 (float64 for float64 rewards), exactly 0
    for a group whose rewards are all equal (NeMo-RL #4161) and for a group of one (TRL's; DelTA's code: Â = r)."""
    if group_size < 1 or rewards.dim() != 1 or rewards.numel() % group_size:
        raise ValueError(
            f"rewards must be 1-D with a length divisible by group_size={group_size}, got shape {tuple(rewards.shape)}"
        )
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
    ``max_completion_length``, L_cache = ``buffer_len`` (0: no shaping). Returns ``[N]`` float32 (≤ 0)."""
    if buffer_len == 0:
        return torch.zeros(lengths.shape)
    expected = max_completion_length - buffer_len  # L_max − L_cache
    return torch.clamp((expected - lengths.to(torch.float32)) / buffer_len * factor, max=0.0)


@dataclass(frozen=True)
class LossSettings:
    """The surrogate's settings (``policy_loss``), as the flags of the same names give them (``from_config``);
    ``aggregation``: the normaliser, one of AGGREGATIONS (None: the registered loss_type's, set when they are made)."""

    epsilon: float = 0.2
    epsilon_high: float = 0.28
    dual_clip: float | None = None
    loss_type: str = "dapo"
    max_completion_length: int | None = None
    beta: float = 0.0
    aggregation: str | None = None

    def __post_init__(self):  # the normaliser: the loss_type's own, where not given
        if self.aggregation is None and self.loss_type in POLICY_LOSSES:
            object.__setattr__(self, "aggregation", POLICY_LOSSES[self.loss_type].aggregation)

    @classmethod
    def from_config(cls, cfg: GRPOConfig) -> LossSettings:  # the fields of the flags of the same names
        return cls(**{f.name: getattr(cfg, f.name) for f in dataclasses.fields(cls) if hasattr(cfg, f.name)})


# The policy losses by TRL's loss_type (verl's registry): the per-token surrogate ``surrogate(ratio [B, T],
# token_adv [B, T], settings) -> (ℓ [B, T], dual-clipped [B, T] bool)``, its normaliser (one of AGGREGATIONS) and
# the settings it reads (a LossSettings, or a subclass with the loss's own fields, e.g. a gate's temperatures).
PolicyLoss = namedtuple("PolicyLoss", "surrogate aggregation settings", defaults=(LossSettings,))
AGGREGATIONS = ("dapo", "grpo", "dr_grpo")  # policy_loss's normalisers (TRL's loss_type names)
# What a loss stage works out over its whole mini-batch for each micro-batch's loss: its tokens' and rows' counts,
# and the k3 term's tokens (``valid_mask``, this micro-batch's; ``num_valid`` the mini-batch's count). None: its own.
LossScope = namedtuple("LossScope", "num_tokens num_sequences valid_mask num_valid", defaults=(None,) * 4)


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


POLICY_LOSSES = {name: PolicyLoss(clipped_surrogate, name) for name in AGGREGATIONS}  # + the comparisons' losses
CLIP_STATS = ("clip_ratio/low_mean", "clip_ratio/high_mean", "clip_ratio/region_mean", "clip_ratio/dual_mean")
POLICY_STATS = CLIP_STATS + ("kl", "num_tokens")  # policy_loss's statistics (surrogate_stats)


def policy_loss(logp, old_logp, token_adv, response_mask, settings=None, *, ref_logp=None, scope=LossScope()):
    """The loss (to minimise): ``settings.loss_type``'s surrogate ℓ of ratio = exp(clamp(logp − old_logp, ±20)) on
    ``response_mask``'s tokens, + β·k3 (exp(ref − logp) − (ref − logp) − 1) on ``scope.valid_mask``'s (default: the
    same), each reduced by ``aggregate``. ``logp``, ``old_logp``, ``response_mask``, ``ref_logp`` ``[B, T]`` (nats);
    ``token_adv`` Ã ``[B, T]`` or Â ``[B]``; ``settings`` a ``LossSettings`` or its loss_type's subclass (None: the
    defaults); ``scope`` the mini-batch's counts for a micro-batch. Returns (loss, token-means of ``POLICY_STATS``)."""
    settings = settings or LossSettings()
    check_loss_inputs(logp, old_logp, token_adv, response_mask, settings, ref_logp, scope)
    mask = response_mask.to(logp.dtype)
    valid = mask if scope.valid_mask is None else scope.valid_mask.to(logp.dtype)
    adv = (token_adv[:, None] if token_adv.dim() == 1 else token_adv).to(logp.dtype).expand_as(logp)  # [B, T]
    # padded positions may hold anything (e.g. -inf): zero them before exp so no NaN reaches the gradient
    ratio = torch.exp(torch.where(mask > 0, logp - old_logp, torch.zeros_like(logp)).clamp(-20.0, 20.0))  # [B, T]
    per_token, dual_active = POLICY_LOSSES[settings.loss_type].surrogate(ratio, adv, settings)  # [B, T]
    B = float(logp.shape[0] if scope.num_sequences is None else scope.num_sequences)
    max_len = settings.max_completion_length  # (dr_grpo's normaliser)
    surrogate = aggregate(per_token * mask, mask, settings.aggregation, scope.num_tokens, B, max_len)
    if settings.beta <= 0:
        return surrogate, surrogate_stats(ratio, adv, mask, settings, dual_active, None, valid)
    d = torch.where(valid > 0, ref_logp - logp, torch.zeros_like(logp)).clamp(-20.0, 20.0)  # [B, T]
    kl = torch.exp(d) - d - 1.0  # [B, T]: k3 ≥ 0, unbiased for KL(π‖π_ref) under samples from π
    kl_count = scope.num_tokens if scope.valid_mask is None else scope.num_valid  # the valid tokens' count
    penalty = aggregate(kl * valid, valid, settings.aggregation, kl_count, B, max_len)
    return surrogate + settings.beta * penalty, surrogate_stats(ratio, adv, mask, settings, dual_active, kl, valid)


def check_loss_inputs(logp, old_logp, token_adv, response_mask, settings: LossSettings, ref_logp, scope: LossScope):
    """``policy_loss``'s arguments, checked: a registered loss_type with one of AGGREGATIONS; ``[B, T]`` tensors and Ã
    ``[B]`` or ``[B, T]``; ref_logp where beta > 0, valid_mask with num_valid, max_completion_length for dr_grpo."""
    if settings.loss_type not in POLICY_LOSSES:
        raise ValueError(f"policy_loss: loss_type {settings.loss_type!r} is not one of {sorted(POLICY_LOSSES)}")
    valid = response_mask if scope.valid_mask is None else scope.valid_mask
    adv_shape = tuple(token_adv.shape) + (1,) * (2 - token_adv.dim())
    fits = logp.shape == old_logp.shape == response_mask.shape == valid.shape and adv_shape[0] == logp.shape[0]
    given = (settings.beta <= 0 or ref_logp is not None) and (scope.num_valid is None or scope.valid_mask is not None)
    aggregation = settings.aggregation
    normaliser = aggregation in AGGREGATIONS and (aggregation != "dr_grpo" or settings.max_completion_length)
    if not (fits and token_adv.dim() in (1, 2) and adv_shape[1] in (1, logp.shape[1]) and given and normaliser):
        raise ValueError(
            f"policy_loss: logp {tuple(logp.shape)}, old_logp {tuple(old_logp.shape)}, response_mask "
            f"{tuple(response_mask.shape)}, valid_mask {tuple(valid.shape)} [B, T], token_adv {tuple(token_adv.shape)} "
            f"[B] or [B, T]; loss {settings.loss_type!r}'s aggregation {aggregation!r} one of {AGGREGATIONS}; "
            "beta > 0 needs ref_logp, num_valid valid_mask, dr_grpo max_completion_length"
        )


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
    return {
        "clip_ratio/low_mean": (low.sum() / n).item(),
        "clip_ratio/high_mean": (high.sum() / n).item(),
        "clip_ratio/region_mean": ((low + high).sum() / n).item(),
        "clip_ratio/dual_mean": ((dual_active.to(mask.dtype) * mask).sum() / n).item(),
        "kl": ((kl * valid).sum() / valid.sum().clamp(min=1.0)).item() if kl is not None else 0.0,
        "num_tokens": mask.sum().item(),
    }


# --- Credit assignment: sequence advantages Â_i -> token advantages Ã_{i,t} (stage 5) -------------------------
old_logprobs = policy.old_logprobs  # stage 4: θ_old's log-probs, and what the credit function asks of the pass

# The credit functions by name (--credit, and the comparisons' names: run_setup.credit_name), the loss stages by name
# (run_setup.loss_stage_name); the comparisons add theirs (run_setup.register: comparisons/__init__.py).
CREDIT_FUNCTIONS = {
    "grpo": credit_methods.GRPOCredit,
    "delta": credit_methods.DeltaCredit,
    "cscr": credit_methods.CscrCredit,
}


class Credit:
    """Stage 5, Â ``[N]`` -> Ã ``[N, T]`` once per rollout batch, no grad, from θ_old, fixed for the step's updates
    (DelTA spec §2.4; CSCR spec §4): the credit function of the flags, chosen once. ``token_values``: the last
    call's per-token values for samples/."""

    def __init__(self, cfg: GRPOConfig, tokenizer):
        self.method = CREDIT_FUNCTIONS[run_setup.credit_name(cfg)](cfg, tokenizer)
        self.token_values = {}

    def needs_hidden(self) -> bool:  # stage 4 keeps h_t
        return "hidden" in self.method.needs

    def token_stats(self) -> tuple[str, ...]:  # the per-token statistics it asks of stage 4 (policy.TOKEN_STATS)
        return tuple(name for name in self.method.needs if name != "hidden")

    @torch.no_grad()
    def __call__(self, model, batch, adv, old: policy.ThetaOld, answers, step=0, loss_mask=None, rewards=None):
        """adv Â ``[N]``, old: stage 4's ``ThetaOld``, answers: each row's reference (CSCR), ``loss_mask`` (default
        ``batch.response_mask``), rewards r ``[N]``. Returns (Ã ``[N, T]``, stats)."""
        mask = batch.response_mask if loss_mask is None else loss_mask
        result = self.method(model, credit_methods.CreditInputs(batch, adv, old, answers, step, mask, rewards))
        self.token_values = result.token_values
        return result.token_adv, result.stats

    def state_dict(self) -> dict:
        return self.method.state_dict()

    def load_state_dict(self, state: dict) -> None:
        self.method.load_state_dict(state)


# --- One step: rollout -> verify -> advantages -> θ_old -> credit -> update -> log ----------------------------
Actor = run_setup.Actor  # what a step works on beside its config: the policy, its optimizer, engine (run_setup.py)
PromptSource = run_setup.PromptSource  # and the training problems, their order, template and stop tokens


@dataclass
class Update:
    """What stage 6 works on: the rollout, stage 4's ``ThetaOld``, ``update_adv`` ``[N, T]`` (stage 5's Ã, times the
    sampler correction's weight where --vllm_importance_sampling_correction is on), the loss mask ``[N, T]`` (stage
    3's), the credit's per-token values; ``loss_factor`` ``[N, T]``: each token's factor of the loss where a
    comparison's loss stage has one (it writes it, for samples/; None: 1)."""

    batch: object
    old: policy.ThetaOld
    update_adv: torch.Tensor
    loss_mask: torch.Tensor
    token_values: dict
    loss_factor: torch.Tensor | None = None


def train_step(step, cfg: GRPOConfig, actor: Actor, source: PromptSource, credit: Credit, run, parts=None) -> dict:
    """One step: the seven stages of the module header (each process on its own whole groups); returns its metrics
    record. ``parts``: the step's parts the flags chose once (``run_setup.step_parts``; default: made here)."""
    model = actor.model
    begun = time.time()
    policy.reset_peak_memory()
    # 1. rollout: G responses per prompt; every process takes its own whole groups of the same prompt order
    batch, answers, t_gen = run_setup.rollout_batch(step, cfg, actor, source)
    parts = parts or run_setup.step_parts(cfg, len(batch.texts), credit, LOSS_STAGES)
    # 2. verify: binary reward, every grader failure counted; DAPO's overlong shaping adds R_length ≤ 0 (§3.4)
    graded = verify.grade_batch(batch.texts, answers)
    lengths = batch.response_lengths  # as sampled
    correct = torch.tensor([float(ok) for ok, _ in graded])
    shaping = overlong_penalty(lengths, cfg.max_completion_length, cfg.overlong_buffer_len, cfg.overlong_penalty_factor)
    rewards = correct + shaping
    # 3. group advantages Â_i (GRPO); the loss mask [N, T] (--mask_truncated_completions: no truncated response)
    adv = group_advantages(rewards, cfg.num_generations, cfg.scale_rewards)
    loss_mask = run_setup.loss_mask(batch, cfg)
    # 4. θ_old's log-probs, no grad (+ DelTA's h_t, + the reference's for --beta > 0); one update: stage 6's forward
    needs = {"need_hidden": credit.needs_hidden(), "token_stats": credit.token_stats()}  # what stage 5 reads of it
    old = old_logprobs(model, batch, cfg, ref_model=actor.ref_model, training_forward=parts.fuse_old, **needs)
    # 5. token advantages Ã_{i,t} (the credit function of --credit)
    token_adv, credit_stats = credit(model, batch, adv, old, answers, step, loss_mask, rewards)
    # 6. update: num_iterations × num_mini_batches AdamW steps on Ã·w (w: sampler_mismatch's, 1 without)
    update_adv, sampling_stats = parts.correction(token_adv, old.logp, batch, loss_mask)
    update = Update(batch, old, update_adv, loss_mask, credit.token_values)
    outcome = policy_update(model, actor.optimizer, update, cfg, step, parts.loss_stage)
    # 7. log: metrics.jsonl (pooled over processes) every step, samples/ every logging_steps
    logged = run_setup.StepLog(batch, rewards, correct, graded, lengths, adv, token_adv)
    record = run_setup.log_step(run, step, cfg, logged, outcome, {**credit_stats, **sampling_stats}, (begun, t_gen))
    run_setup.write_samples(run, step, cfg, actor.tokenizer, logged, update)
    return record


def policy_update(model, optimizer, update: Update, cfg: GRPOConfig, step: int, loss_stage=None):
    """Stage 6: ``num_iterations`` passes × ``num_mini_batches`` clipped AdamW steps (a non-finite one skipped), the
    rows permuted by a generator seeded by (seed, step, pass); ``loss_stage``: a ``LossStage`` (default: the flags').
    Returns (Σ mini-batch losses, applied pre-clip gradient norms, token-weighted statistic sums, skipped updates)."""
    model.train()
    loss_stage = loss_stage or LOSS_STAGES[run_setup.loss_stage_name(cfg)]
    N = update.loss_mask.shape[0]
    mb_size = N // cfg.num_mini_batches
    loss_sum = 0.0
    grad_norms, sums, skipped = [], {}, 0
    adv_mass = distributed.all_reduce_sum(torch.tensor([float(update.update_adv.abs().sum())], dtype=torch.float64))
    if adv_mass.item() == 0 and cfg.beta == 0:  # every advantage 0: no gradient, and an AdamW step would still move
        # the weights (decay, momentum): the weights and AdamW's state stay, each statistic 0.0 (same keys each line)
        return 0.0, [], {**dict.fromkeys(POLICY_STATS + loss_stage.stat_names, 0.0), "no_signal": 1.0}, 0
    for epoch in range(cfg.num_iterations):
        perm = torch.randperm(N, generator=torch.Generator().manual_seed(cfg.seed + 7919 * step + epoch))
        for k in range(cfg.num_mini_batches):
            rows = perm[k * mb_size : (k + 1) * mb_size] if cfg.num_mini_batches > 1 else torch.arange(N)
            optimizer.zero_grad(set_to_none=True)
            loss, stats = loss_stage.backward(model, update, rows, cfg)
            loss = distributed.all_reduce_sum(torch.tensor(loss, dtype=torch.float64)).item()  # Σ over the processes
            loss_sum += loss
            sums.update({name: sums.get(name, 0.0) + value for name, value in stats.items()})
            grad_norm = policy.clip_and_step(model, optimizer, loss, cfg.max_grad_norm, step)
            skipped += grad_norm is None
            grad_norms += [] if grad_norm is None else [grad_norm]
    # free the gradients now: otherwise they stay allocated through the next rollout (16 GB for a full Qwen3-8B)
    optimizer.zero_grad(set_to_none=True)
    return loss_sum, grad_norms, sums, skipped


def minibatch_backward(model, update: Update, rows, cfg: GRPOConfig):
    """The paper's loss stage: accumulate the gradient of one mini-batch's loss (``rows``) on every valid token,
    ``cfg.micro_batch_size`` rows at a time, its normaliser counted once over the mini-batch and the processes
    (trl#3021); call on zeroed gradients. Returns (loss, token-weighted ``policy_loss`` statistic sums)."""
    device = next(model.parameters()).device
    settings = POLICY_LOSSES[cfg.loss_type].settings.from_config(cfg)
    mask = update.loss_mask
    old = update.old
    counts = distributed.all_reduce_sum(torch.tensor([mask[rows].sum().item(), float(len(rows))], dtype=torch.float64))
    scope = LossScope(num_tokens=counts[0].item(), num_sequences=int(counts[1].item()))
    # the training forward over these rows: stage 4's, when it was this one (its only update), else a new one
    passes = old.update_passes or policy.Passes(model, update.batch, rows, cfg, grad=True)
    loss_total = 0.0
    sums = {}
    for mb in passes:
        at = lambda x: mb.take(x).to(device) if x is not None else None  # noqa: E731  (this micro-batch's part)
        loss, stats = policy_loss(
            mb.logp, at(old.logp), at(update.update_adv), at(mask), settings, ref_logp=at(old.ref_logp), scope=scope
        )
        loss.backward()
        loss_total += loss.item()
        for key, v in stats.items():  # token-weighted: Σ / Σ num_tokens is the step's token-mean
            sums[key] = sums.get(key, 0.0) + (v * stats["num_tokens"] if key != "num_tokens" else v)
    passes.backward_prompts()  # --shared_prompt: the prompts' share, summed over the responses that read them
    return loss_total, sums


# The loss stages by name (run_setup.loss_stage_name): ``backward(model, update, rows, cfg) -> (loss, stat sums)``,
# the statistics it adds to policy_loss's, and whether it may reuse stage 4's training forward (no forward of its own)
LossStage = namedtuple("LossStage", "backward stat_names reuses_old_forward", defaults=((), True))
LOSS_STAGES = {"default": LossStage(minibatch_backward)}


# --- The loop -------------------------------------------------------------------------------------------------
def train(cfg: GRPOConfig, given: set[str] | None = None) -> dict | None:
    """Train as configured, under its recipe (``recipes.apply``: the recipe's settings not in ``given``, the flags
    given); returns the before/after evaluation and the last step's record (None: --dry_run). --resume continues
    exactly (every random draw is seeded by the step); torchrun: distributed.py."""
    world = distributed.init_distributed()[1]
    prepared = run_setup.prepare(cfg, given, world, flag_choices(), CREDIT_FUNCTIONS, LOSS_STAGES)
    if prepared is None or isinstance(prepared, dict):  # --dry_run, or --resume of a finished run: its summary
        return prepared
    cfg, run, actor, source, heldout, state = prepared
    credit = Credit(cfg, actor.tokenizer)
    start_step = run_setup.restore(state, source.sampler, credit)
    num_rows = cfg.num_prompts_per_step // world * cfg.num_generations  # this process's rollout rows
    parts = run_setup.step_parts(cfg, num_rows, credit, LOSS_STAGES)
    summary = run_setup.run_steps(
        cfg,
        run,
        start_step,
        heldout,
        lambda step: train_step(step, cfg, actor, source, credit, run, parts),
        lambda step: run_setup.save_checkpoint(run, step, actor, source, credit),
    )
    run_setup.finish_run(cfg, run, summary, actor, source, credit)
    return summary  # (--use_vllm's engine is freed before the process group goes: distributed.close)


def register() -> None:
    """The comparisons' functions into the registries above, and the toy under its name (again: a no-op)."""
    run_setup.register(CREDIT_FUNCTIONS, LOSS_STAGES, POLICY_LOSSES)


def flag_choices() -> dict[str, list[str]]:
    """The registered names --loss_type and --credit take (a credit name with "/" is a method's variant, which the
    method's own flags choose: comparisons/__init__.py's ``credit_name``)."""
    register()
    return {"loss_type": list(POLICY_LOSSES), "credit": [name for name in CREDIT_FUNCTIONS if "/" not in name]}


def build_parser(defaults: bool = True):  # the command line: grpo_config.build_parser with the registered names
    return grpo_config.build_parser(defaults, choices=flag_choices())


def check_config(cfg: GRPOConfig, world: int = 1, given: set[str] | None = None) -> list[str]:
    """grpo_config.check_config, --loss_type and --credit among the names registered (before any weights load)."""
    return grpo_config.check_config(cfg, world, given, choices=flag_choices())


def main(argv=None):
    cfg = GRPOConfig(**vars(build_parser().parse_args(argv)))
    given = set(vars(build_parser(defaults=False).parse_args(argv)))  # the flags given beat the recipe's values
    run_setup.run_command(train, cfg, given)  # errors and Ctrl-C as one line; the closing line


if __name__ == "__main__":
    signal.signal(signal.SIGINT, signal.default_int_handler)  # Ctrl-C: KeyboardInterrupt, run_command's line
    import grpo  # this file as the module `grpo`, whose registries the comparisons import and fill (not __main__)

    grpo.main()
