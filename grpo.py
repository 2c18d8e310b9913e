"""GRPO with token-level credit assignment (GRPO, DelTA, CSCR): the trainer, read top to bottom as the method.

One training step (``train_step``) is seven stages, in the order of the papers::

    1. rollout      G responses o_i for each prompt q             rollout.sample: HF generate or vLLM (--use_vllm)
    2. verify       binary reward r_i ∈ {0, 1} (+ overlong shaping) verify.grade_batch; overlong_penalty DAPO §3.4
    3. advantages   Â_i = (r_i − mean_g r) / (std_g r + 1e-6)       group_advantages   GRPO (Shao et al. 2024)
    4. θ_old        log π_θold(o_{i,t}) per token, detached         old_logprobs       (+ h_t for DelTA, same pass)
    5. credit       Ã_{i,t} (--credit): Â_i, Â_i·λ̄ or Â_i·w̃       CREDIT_FUNCTIONS   delta.py, cscr.py (credit_methods)
    6. update       clipped surrogate, token-mean, AdamW            policy_loss        DAPO (Yu et al. 2025) §3.1, §3.3
    7. log          metrics.jsonl, samples/                         run_setup.log_step

In that order: the maths, the policy's log-probs (stages 4 and 6), one step (``train_step``), the loop (``train``).
Stages 4 and 6 run the plain computation (``token_outputs``: a padded forward, log-softmax, gather; with one update
per batch θ_old's log-probs are the update's own, detached, as TRL takes them); the 8B run's optimisations replace
them whole, chosen once by the scale recipes or their flags (trainer/scale_passes.py; ``--dry_run`` says which path).
One update per rollout batch (the toy's default) keeps the ratio at 1, so the clip never acts; ``--num_mini_batches
4`` makes four updates of each batch, and the later ones clip. ``--loss_type dapo`` is the token-mean over the
mini-batch: with DelTA's λ̄ (mean 1 over the batch) DelTA's Σλℓ / Σλ (Eq. 8), per mini-batch approximately (DelTA's
code: per micro-batch, spec §6). The papers' comparisons (comparisons/, ``python -m comparisons``) are whole
replacements, or their own micro-batch loss for ``minibatch_backward``, handed to ``train`` as a ``Method``. Left
out: entropy bonus, KL by default, dynamic sampling, learning-rate schedules, reward shaping beyond DAPO's overlong
penalty.
"""

from __future__ import annotations

import signal

import trainer

if __name__ == "__main__":  # Ctrl-C while the imports below load: one line and exit 130 (trainer/__init__.py)
    trainer.catch_ctrl_c_while_importing()

import dataclasses
import functools
import math
import time
from typing import Callable, NamedTuple

import torch

import toy
import verify
from trainer import credit_methods, distributed, grpo_config, policy, run_setup
from trainer.credit_methods import CscrCredit, DeltaCredit, GRPOCredit
from trainer.grpo_config import GRPOConfig  # every flag (grpo_config.py): its parser and checks


# --- The maths: pure functions on tensors ---------------------------------------------------------------------
def group_advantages(rewards: torch.Tensor, num_generations: int, scale_rewards: str = "group", eps: float = 1e-6):
    """GRPO's Â_i = (r_i − mean_g) / (std_g + eps) (GRPO §4.1.2; DelTA spec §1) of ``rewards`` ``[N]``, G =
    ``num_generations`` rows a group; ``scale_rewards="none"``: r − mean (Dr. GRPO). Returns ``[N]`` float32 (float64
    for float64 rewards), exactly 0 in a group whose rewards are all equal (NeMo-RL #4161) or of one (TRL's). A reward
    that is not finite is refused, naming its row: it would make its whole group's Â NaN."""
    whole_groups = num_generations >= 1 and rewards.dim() == 1 and rewards.numel() % num_generations == 0
    if not (whole_groups and torch.isfinite(rewards).all()) or scale_rewards not in ("group", "none"):
        bad = [f"row {i} is {r}" for i, r in enumerate(rewards.flatten().tolist()) if not math.isfinite(r)]
        raise ValueError(
            f"rewards {tuple(rewards.shape)} must be finite ({', '.join(bad[:3]) or 'they are'}), 1-D, whole groups of "
            f"num_generations={num_generations}; scale_rewards 'group' or 'none' (given: {scale_rewards!r})"
        )
    r = rewards.to(torch.promote_types(rewards.dtype, torch.float32)).view(-1, num_generations)
    centred = r - r.mean(-1, keepdim=True)
    if scale_rewards == "group" and num_generations > 1:
        centred = centred / (r.std(-1, keepdim=True, unbiased=True) + eps)
    flat = (r.max(-1, keepdim=True).values - r.min(-1, keepdim=True).values) == 0  # no spread (or one member): Â = 0
    return torch.where(flat, torch.zeros_like(centred), centred).view(-1)


def overlong_penalty(lengths: torch.Tensor, max_completion_length: int, buffer_len: int, factor=1.0) -> torch.Tensor:
    """DAPO's soft overlong punishment (§3.4), added to the reward: min(0, ((L_max − L_cache) − |o|) / L_cache ·
    factor) of ``lengths`` ``[N]``, L_max = ``max_completion_length``, L_cache = ``buffer_len`` (0: none). ``[N]``."""
    if buffer_len == 0:
        return torch.zeros(lengths.shape)
    expected = max_completion_length - buffer_len  # L_max − L_cache
    return torch.clamp((expected - lengths.to(torch.float32)) / buffer_len * factor, max=0.0)


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


# --loss_type (TRL's names) -> the loss's normaliser (verl's loss_agg_mode names): ``aggregate``
AGGREGATIONS = {"dapo": "token-mean", "grpo": "seq-mean-token-mean", "dr_grpo": "seq-mean-token-sum-norm"}


@dataclasses.dataclass(frozen=True)
class LossSettings:
    """``policy_loss``'s settings, from the flags of the same names (``from_config``); ``aggregation`` is --loss_type's
    normaliser; ``surrogate`` the per-token loss (a comparison's subclass replaces it: comparisons/sapo.py)."""

    epsilon: float = 0.2
    epsilon_high: float = 0.28
    dual_clip: float | None = None
    loss_type: str = "dapo"
    max_completion_length: int | None = None
    beta: float = 0.0
    surrogate = staticmethod(clipped_surrogate)  # (ratio [B, T], Ã [B, T], settings) -> (ℓ [B, T], dual-clipped)

    @property
    def aggregation(self) -> str | None:
        return AGGREGATIONS.get(self.loss_type)

    @classmethod
    def from_config(cls, cfg: GRPOConfig) -> LossSettings:  # the fields of the flags of the same names
        return cls(**{f.name: getattr(cfg, f.name) for f in dataclasses.fields(cls) if hasattr(cfg, f.name)})


class LossScope(NamedTuple):
    """A mini-batch's counts for each of its micro-batch's losses (None: the micro-batch's own): tokens, rows, and the
    k3 term's tokens (``valid_mask`` this micro-batch's, ``num_valid`` the mini-batch's count)."""

    num_tokens: float | None = None
    num_sequences: int | None = None
    valid_mask: torch.Tensor | None = None
    num_valid: float | None = None


# policy_loss's statistics (surrogate_stats), beside its token count "num_tokens"
POLICY_STATS = ("clip_ratio/low_mean", "clip_ratio/high_mean", "clip_ratio/region_mean", "clip_ratio/dual_mean", "kl")


def policy_loss(logp, old_logp, token_adv, loss_mask, settings=None, *, ref_logp=None, scope=None):
    """The loss to minimise: ``settings.surrogate`` ℓ of ratio = exp(clamp(logp − old_logp, ±20)) on ``loss_mask``'s
    tokens + β·k3 (exp(ref − logp) − (ref − logp) − 1) on ``scope.valid_mask``'s (default: the same), each reduced by
    ``aggregate``. ``logp``, ``old_logp``, ``loss_mask``, ``ref_logp`` ``[B, T]`` (nats); ``token_adv`` Ã ``[B, T]`` or
    Â ``[B]``. Returns (loss, token-means of ``POLICY_STATS``)."""
    settings = settings or LossSettings()
    scope = scope or LossScope()
    check_loss_inputs(logp, old_logp, token_adv, loss_mask, settings, ref_logp, scope)
    mask = loss_mask.to(logp.dtype)
    valid = mask if scope.valid_mask is None else scope.valid_mask.to(logp.dtype)
    adv = (token_adv[:, None] if token_adv.dim() == 1 else token_adv).to(logp.dtype).expand_as(logp)  # [B, T]
    log_ratio = torch.where(mask > 0, logp - old_logp, torch.zeros_like(logp))  # 0 on padding (which may hold -inf)
    ratio = torch.exp(log_ratio.clamp(-20.0, 20.0))  # [B, T]
    per_token, dual_active = settings.surrogate(ratio, adv, settings)  # [B, T]
    num_sequences = float(logp.shape[0] if scope.num_sequences is None else scope.num_sequences)
    max_len = settings.max_completion_length  # (seq-mean-token-sum-norm's normaliser)
    surrogate = aggregate(per_token * mask, mask, settings.aggregation, scope.num_tokens, num_sequences, max_len)
    if settings.beta <= 0:
        return surrogate, surrogate_stats(ratio, adv, mask, settings, dual_active, None, valid)
    d = torch.where(valid > 0, ref_logp - logp, torch.zeros_like(logp)).clamp(-20.0, 20.0)  # [B, T]
    kl = torch.exp(d) - d - 1.0  # [B, T]: k3 ≥ 0, unbiased for KL(π‖π_ref) under samples from π
    kl_count = scope.num_tokens if scope.valid_mask is None else scope.num_valid  # the valid tokens' count
    penalty = aggregate(kl * valid, valid, settings.aggregation, kl_count, num_sequences, max_len)
    return surrogate + settings.beta * penalty, surrogate_stats(ratio, adv, mask, settings, dual_active, kl, valid)


def check_loss_inputs(logp, old_logp, token_adv, loss_mask, settings: LossSettings, ref_logp, scope: LossScope):
    """``policy_loss``'s arguments, checked: ``[B, T]`` tensors and Ã ``[B]`` or ``[B, T]``; ref_logp where beta > 0,
    valid_mask with num_valid; an aggregation of AGGREGATIONS (dr_grpo's with max_completion_length)."""
    valid = loss_mask if scope.valid_mask is None else scope.valid_mask
    fits = logp.shape == old_logp.shape == loss_mask.shape == valid.shape and token_adv.shape[0] == logp.shape[0]
    fits = fits and token_adv.shape[1:] in ((), logp.shape[1:])
    given = (settings.beta <= 0 or ref_logp is not None) and (scope.num_valid is None or scope.valid_mask is not None)
    norm = settings.aggregation
    known = norm in AGGREGATIONS.values() and (norm != "seq-mean-token-sum-norm" or settings.max_completion_length)
    if not (fits and given and known):
        raise ValueError(
            f"policy_loss: logp {tuple(logp.shape)}, old_logp, loss_mask, valid_mask [B, T], token_adv "
            f"{tuple(token_adv.shape)} [B] or [B, T]; --loss_type {settings.loss_type!r} one of {list(AGGREGATIONS)} "
            "(dr_grpo: max_completion_length); beta > 0 needs ref_logp; num_valid needs valid_mask"
        )


def aggregate(per_token, mask, aggregation: str, num_tokens, num_sequences: float, max_completion_length):
    """``per_token`` ``[B, T]`` (0 outside ``mask``) to a scalar: ``token-mean`` Σ / Σmask (or ``num_tokens``);
    ``seq-mean-token-mean`` Σ_rows (row Σ / row Σmask) / num_sequences; ``seq-mean-token-sum-norm`` Σ / (rows·L_max)."""
    if aggregation == "token-mean":
        return per_token.sum() / max(float(mask.sum() if num_tokens is None else num_tokens), 1.0)
    if aggregation == "seq-mean-token-mean":
        return (per_token.sum(-1) / mask.sum(-1).clamp(min=1.0)).sum() / num_sequences
    return per_token.sum() / (num_sequences * max_completion_length)  # seq-mean-token-sum-norm (checked)


@torch.no_grad()
def surrogate_stats(ratio, adv, mask, settings: LossSettings, dual_active, kl, valid) -> dict:
    """Token-means over ``mask``: clipped (ratio < 1−ε, Ã < 0; > 1+ε_high, Ã > 0), dual-clipped; k3 over ``valid``."""
    n = mask.sum().clamp(min=1.0)
    low = ((ratio < 1.0 - settings.epsilon) & (adv < 0)).to(mask.dtype) * mask
    high = ((ratio > 1.0 + settings.epsilon_high) & (adv > 0)).to(mask.dtype) * mask
    return {
        "clip_ratio/low_mean": (low.sum() / n).item(),
        "clip_ratio/high_mean": (high.sum() / n).item(),
        "clip_ratio/region_mean": ((low + high).sum() / n).item(),
        "clip_ratio/dual_mean": ((dual_active.to(mask.dtype) * mask).sum() / n).item(),
        "kl": ((kl * valid).sum() / valid.sum().clamp(min=1.0)).item() if kl is not None else 0.0,
        "n:kl": valid.sum().item(),  # the count k3's mean is over (minibatch_backward weighs it by this)
        "num_tokens": mask.sum().item(),
    }


# --- Stages 4 and 6: the policy's log-probs, the plain computation ---------------------------------------------
def token_outputs(model, input_ids, attention_mask, response_mask, temperature: float, asked=policy.Asked()):
    """One padded forward of rows [left-padded prompt | right-padded response] (``input_ids``, ``attention_mask``
    ``[b, P + T]``, ``response_mask`` ``[b, T]``): log π(y_t | x, y_<t) ``[b, T]`` at the temperature (nats, 0 on
    padding) and what ``asked`` names of the same forward, in a ``policy.TokenOutputs``."""
    T = response_mask.shape[1]
    position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)  # real tokens only, as generate() counts them
    no_cache = dict(attention_mask=attention_mask, position_ids=position_ids, use_cache=False)
    out = model(input_ids, **no_cache, output_hidden_states=asked.hidden)
    logits = out.logits[:, -T - 1 : -1]  # [b, T, V]: position p predicts token p + 1
    u = logits.to(torch.promote_types(logits.dtype, torch.float32)) / temperature  # z/temperature, float32 or float64
    log_probs = torch.log_softmax(u, dim=-1)  # [b, T, V]
    logp = log_probs.gather(-1, input_ids[:, -T:, None]).squeeze(-1) * response_mask  # [b, T]
    hidden = out.hidden_states[-1][:, -T - 1 : -1].detach() if asked.hidden else None  # [b, T, H]: the head's input
    with torch.no_grad():  # the entropy −Σ p log p and the credit's statistics: no gradient
        entropy = -(log_probs.exp() * log_probs).sum(-1) * response_mask if asked.entropy else None
        stats = {name: statistic(u) * response_mask for name, statistic in (asked.token_stats or {}).items()}
    return policy.TokenOutputs(logp, hidden, entropy, stats or None)


def micro_batches(model, batch, rows, cfg: GRPOConfig, grad: bool, asked=policy.Asked()):
    """The plain pass over rollout rows ``rows``, --micro_batch_size at a time (0: all), with gradient in train mode
    (``grad``) or without in eval mode: a ``policy.MicroBatch`` each, as wide as the batch."""
    device = next(model.parameters()).device
    T = batch.response_mask.shape[1]
    row_groups = rows.split(cfg.micro_batch_size or len(rows))
    model.train(grad)
    for j in row_groups:
        inputs = (batch.input_ids[j].to(device), batch.attention_mask[j].to(device), batch.response_mask[j].to(device))
        with torch.set_grad_enabled(grad):
            out = token_outputs(model, *inputs, cfg.temperature, asked)
        yield policy.MicroBatch(j, T, out.logp, out.hidden, out.entropy, out.token_stats, len(row_groups))


def old_logprobs(model, batch, cfg: GRPOConfig, asked=policy.Asked(), ref_model=None, training_forward=False):
    """Stage 4: θ_old's log-probs ``[N, T]`` from its own no-grad, eval-mode forward (``micro_batches``), or with
    ``training_forward`` from the update's own forward, detached, as TRL does: the toy's default, chosen once by
    run_setup.step_parts (--fuse_old_logprobs, one update of one micro-batch, β = 0; off where the model has dropout,
    so train mode computes what eval mode would); with what the credit asks of the same pass (``asked``: h_t for
    DelTA) and, for --beta > 0, π_ref's. A ``policy.ThetaOld`` on the host."""
    rows = torch.arange(batch.response_mask.shape[0])
    # training_forward: stage 6's forward now, its log-probs detached as θ_old's, its graph kept for the update
    outputs = list(micro_batches(model, batch, rows, cfg, grad=training_forward, asked=asked))
    logp = torch.cat([mb.logp.detach() for mb in outputs]).cpu()
    # h [N, T, H]: 137 GB at the papers' scale; preflight refuses it past its host-memory share (the recipes stream h)
    hidden = torch.cat([mb.hidden for mb in outputs]).cpu() if asked.hidden else None
    stats = {name: torch.cat([mb.token_stats[name] for mb in outputs]).cpu() for name in asked.token_stats or {}}
    ref_passes = micro_batches(ref_model, batch, rows, cfg, grad=False) if ref_model is not None else None
    ref_logp = torch.cat([mb.logp for mb in ref_passes]).cpu() if ref_passes else None  # --beta > 0: π_ref's
    return policy.ThetaOld(logp, hidden, ref_logp, stats, outputs if training_forward else None)


# --- One step: rollout -> verify -> advantages -> θ_old -> credit -> update -> log ----------------------------
# Stage 5's credit functions by --credit (trainer/credit_methods.py): Â [N] -> Ã [N, T] from θ_old, no gradient
CREDIT_FUNCTIONS = {"grpo": GRPOCredit, "delta": DeltaCredit, "cscr": CscrCredit}


@dataclasses.dataclass
class Update:
    """What stage 6 works on: the rollout, stage 4's ``ThetaOld``, ``update_adv`` ``[N, T]`` (Ã, times the sampler
    correction's weight under --vllm_importance_sampling_correction), the loss mask ``[N, T]``, the credit's per-token
    values, the run's ``parts``; ``loss_factor`` ``[N, T]``: a comparison's loss stage's factor per token (None: 1)."""

    batch: object
    old: policy.ThetaOld
    update_adv: torch.Tensor
    loss_mask: torch.Tensor
    token_values: dict
    parts: run_setup.StepParts
    loss_factor: torch.Tensor | None = None


def train_step(step, cfg: GRPOConfig, actor, source, credit, run, parts: run_setup.StepParts) -> dict:
    """One step, the seven stages of the module header (each process on its own whole groups): its metrics record."""
    begun = time.time()
    policy.reset_peak_memory()
    # 1. rollout: G responses per prompt; every process takes its own whole groups of the same prompt order
    batch, answers, t_gen = run_setup.rollout_batch(step, cfg, actor, source)
    # 2. verify: binary reward, every grader failure counted; DAPO's overlong shaping adds R_length ≤ 0 (§3.4)
    graded = verify.grade_batch(batch.texts, answers, cfg.grade_timeout, cfg.grade_workers)
    lengths = batch.response_lengths  # as sampled
    correct = torch.tensor([float(ok) for ok, _ in graded])
    shaping = overlong_penalty(lengths, cfg.max_completion_length, cfg.overlong_buffer_len, cfg.overlong_penalty_factor)
    rewards = correct + shaping
    # 3. group advantages Â_i (GRPO); the loss mask [N, T] (--mask_truncated_completions: no truncated response)
    adv = group_advantages(rewards, cfg.num_generations, cfg.scale_rewards)
    loss_mask = run_setup.loss_mask(batch, cfg)
    # 4. θ_old: old_logprobs above (+ h_t for DelTA; one update: the update's forward, as TRL), or the scale path's
    old = parts.forward.old_logprobs(actor.model, batch, cfg, credit.asks, actor.ref_model)
    # 5. token advantages Ã_{i,t}: the credit function of --credit
    inputs = credit_methods.CreditInputs(batch, adv, old, answers, step, loss_mask, rewards, parts.forward)
    result = credit(actor.model, inputs)
    # 6. update: num_iterations × num_mini_batches AdamW steps on Ã·w (w: sampler_mismatch's, 1 without)
    update_adv, sampling_stats = parts.correction(result.token_adv, old.logp, batch, loss_mask)
    update = Update(batch, old, update_adv, loss_mask, result.token_values, parts)
    outcome = policy_update(actor.model, actor.optimizer, update, cfg, step)
    # 7. log: metrics.jsonl (pooled over processes) every step, samples/ every logging_steps
    logged = run_setup.StepLog(batch, rewards, correct, graded, lengths, adv, result.token_adv)
    record = run_setup.log_step(run, step, cfg, logged, outcome, {**result.stats, **sampling_stats}, (begun, t_gen))
    run_setup.write_samples(run, step, cfg, actor.tokenizer, logged, update)
    return record


def policy_update(model, optimizer, update: Update, cfg: GRPOConfig, step: int):
    """Stage 6: ``num_iterations`` passes × ``num_mini_batches`` clipped AdamW steps (a non-finite one skipped), rows
    permuted by (seed, step, iteration), each gradient from the run's loss stage. Returns (Σ mini-batch losses, applied
    pre-clip gradient norms, statistic sums as minibatch_backward's, skipped updates)."""
    N = update.loss_mask.shape[0]
    size = N // cfg.num_mini_batches  # rows per mini-batch
    loss_sum = 0.0
    grad_norms, sums, skipped = [], {}, 0
    adv_mass = distributed.all_reduce_sum(torch.tensor([float(update.update_adv.abs().sum())], dtype=torch.float64))
    if adv_mass.item() == 0 and cfg.beta == 0:  # no gradient: no AdamW step either (decay, momentum would move θ)
        zeros = dict.fromkeys(POLICY_STATS + ("num_tokens",) + update.parts.loss_stage.stat_names, 0.0)
        return 0.0, [], {**zeros, "no_signal": 1.0}, 0
    for iteration in range(cfg.num_iterations):
        perm = torch.randperm(N, generator=torch.Generator().manual_seed(cfg.seed + 7919 * step + iteration))
        for k in range(cfg.num_mini_batches):
            rows = perm[k * size : (k + 1) * size] if cfg.num_mini_batches > 1 else torch.arange(N)
            optimizer.zero_grad(set_to_none=True)
            local_loss, stats = update.parts.loss_stage.backward(model, update, rows, cfg)
            loss = distributed.all_reduce_sum(torch.tensor(local_loss, dtype=torch.float64)).item()  # Σ over processes
            loss_sum += loss
            sums.update({name: sums.get(name, 0.0) + value for name, value in stats.items()})
            grad_norm = policy.clip_and_step(model, optimizer, loss, cfg.max_grad_norm, step)
            skipped += grad_norm is None
            grad_norms += [] if grad_norm is None else [grad_norm]
    # free the gradients now: otherwise they stay allocated through the next rollout (16 GB for a full Qwen3-8B)
    optimizer.zero_grad(set_to_none=True)
    return loss_sum, grad_norms, sums, skipped


def minibatch_scope(mask, rows) -> LossScope:
    """Mini-batch ``rows``' counts over the processes (trl#3021), its losses' normaliser: ``mask``'s tokens, rows."""
    counts = distributed.all_reduce_sum(torch.tensor([mask[rows].sum().item(), float(len(rows))], dtype=torch.float64))
    return LossScope(num_tokens=counts[0].item(), num_sequences=int(counts[1].item()))


def surrogate_loss(mb: policy.MicroBatch, update: Update, scope: LossScope):
    """The paper's loss of micro-batch ``mb``: ``policy_loss`` on its rows of ``update``, over ``scope``'s counts."""
    old_logp = mb.part(update.old.logp)
    adv = mb.part(update.update_adv)
    mask = mb.part(update.loss_mask)
    ref_logp = mb.part(update.old.ref_logp)
    return policy_loss(mb.logp, old_logp, adv, mask, update.parts.loss_settings, ref_logp=ref_logp, scope=scope)


def minibatch_backward(model, update, rows, cfg, micro_loss=surrogate_loss, scope=None, asked=policy.Asked()):
    """The paper's loss stage: mini-batch ``rows``' gradient, ``micro_loss(mb, update, scope)`` a micro-batch at a time
    (a comparison passes its own). Returns (Σ losses, the sums of each statistic × its count and of each count)."""
    scope = minibatch_scope(update.loss_mask, rows) if scope is None else scope
    # the training forward over these rows (the scale path's --fuse_old_logprobs: stage 4's, when it was this one)
    forward = update.parts.forward
    passes = update.old.training_forward or forward.micro_batches(model, update.batch, rows, cfg, True, asked)
    loss_total = 0.0
    sums = {}
    for mb in passes:
        loss, stats = micro_loss(mb, update, scope)
        loss.backward()
        loss_total += loss.item()
        for key, v in stats.items():  # a mean times its count ("n:" + key, else num_tokens); a count as it is
            count = 1.0 if key == "num_tokens" or key.startswith("n:") else stats.get("n:" + key, stats["num_tokens"])
            sums[key] = sums.get(key, 0.0) + v * count
    return loss_total, sums


class LossStage(NamedTuple):
    """Stage 6's gradient of a mini-batch, its statistics beside policy_loss's, if it may reuse stage 4's forward."""

    backward: Callable = minibatch_backward  # (model, update, rows, cfg) -> (loss, statistic sums)
    stat_names: tuple = ()
    reuses_old_forward: bool = True


class Method(NamedTuple):
    """A run's method, chosen once from its flags: credit class, loss stage, surrogate settings class, name."""

    credit: type
    loss_stage: LossStage
    loss_settings: type
    label: str


def paper_method(cfg: GRPOConfig) -> Method:
    """The paper's method of the flags: --credit's credit function, ``minibatch_backward``, the clipped surrogate."""
    return Method(CREDIT_FUNCTIONS[cfg.credit], LossStage(), LossSettings, cfg.credit)


# --- The loop -------------------------------------------------------------------------------------------------
def train(cfg: GRPOConfig, given: set[str] | None = None, method: Method | None = None) -> dict | None:
    """Train under the recipe (the flags in ``given`` beat it) with ``method`` (None: the paper's): the evaluation
    before and after and the last step's record (None: --dry_run)."""
    toy.register()  # --model toy, --data toy: the toy by its name (toy/__init__.py)
    method = method or paper_method(cfg)
    world = distributed.init_distributed()[1]
    prepared = run_setup.prepare(cfg, given, world, method)
    if prepared is None or isinstance(prepared, dict):  # --dry_run, or --resume of a finished run: its summary
        return prepared
    cfg, run, actor, source, heldout, state = prepared
    credit = method.credit(cfg, actor.tokenizer)
    start_step = run_setup.restore(state, source.sampler, credit)
    plain = policy.Forward(old_logprobs, micro_batches)  # the plain passes above; the scale path's replace them
    parts = run_setup.step_parts(cfg, credit, method, plain)
    one_step = functools.partial(train_step, cfg=cfg, actor=actor, source=source, credit=credit, run=run, parts=parts)
    save = functools.partial(run_setup.save_checkpoint, run, actor=actor, source=source, credit=credit)
    summary = run_setup.run_steps(cfg, run, start_step, heldout, one_step, save, method.label)
    run_setup.finish_run(cfg, run, summary, actor, source, credit)
    return summary  # (--use_vllm's engine is freed before the process group goes: distributed.close)


def main(argv=None):
    cfg = GRPOConfig(**vars(grpo_config.build_parser(GRPOConfig).parse_args(argv)))
    given = set(vars(grpo_config.build_parser(GRPOConfig, defaults=False).parse_args(argv)))  # beat the recipe's
    run_setup.run_command(train, cfg, given, paper_method(cfg))  # errors, Ctrl-C: one line; the closing line


if __name__ == "__main__":
    signal.signal(signal.SIGINT, signal.default_int_handler)  # Ctrl-C: KeyboardInterrupt, run_command's line
    main()
