"""What grpo.py's ``train`` builds once before its loop and what each step hands to the run folder, behind one-line
calls: the training and held-out problems, the run folder, the policy and its sampler engine, the held-out
evaluation on its schedule, the state a checkpoint keeps beside the weights; a step's peak memory, its
metrics.jsonl record and its samples/. Infrastructure only: no formula of the method is here (grpo.py holds them).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import os
import random
import sys
import time
from typing import NamedTuple

import torch

import rollout
import verify
from trainer import distributed, policy

# The modules a run needs once, before its loop (recipes, checks, data, run folder, memory plan, vLLM, evaluation),
# are imported by the functions that use them: ``import grpo`` loads the step's modules only.


class Actor(NamedTuple):
    """What a step works on beside its config (``prepare`` makes it once): the policy and what policy.build makes
    beside it (``vllm_sampler``: --use_vllm's engine in a vllm_engine.VllmSampler, None: HF generate)."""

    model: object
    tokenizer: object
    optimizer: object
    ref_model: object = None
    vllm_sampler: object = None


class PromptSource(NamedTuple):
    """The training problems, their order (``rollout.PromptSampler``), template and stop tokens (``prepare``)."""

    dataset: list
    sampler: object
    template: str
    stop_ids: list


class StepLog(NamedTuple):
    """What stage 7 logs of a step: the rollout as trained, rewards [N], correctness [N], the grader's results, the
    lengths as sampled [N], Â [N] and the credit's Ã [N, T]."""

    batch: object
    rewards: torch.Tensor
    correct: torch.Tensor
    graded: list
    lengths: torch.Tensor
    adv: torch.Tensor
    token_adv: torch.Tensor


def sampler_correction(cfg):
    """The update's Ã from stage 5's, chosen once: ``uncorrected`` (the default), or sampler_mismatch.py's
    (--vllm_importance_sampling_correction)."""
    from trainer import sampler_mismatch

    return sampler_mismatch.correction(cfg) if cfg.vllm_importance_sampling_correction else uncorrected


def uncorrected(token_adv, old_logp, batch, loss_mask):  # no sampler correction (HF generate): Ã, no statistics
    return token_adv, {}


class StepParts(NamedTuple):
    """What the run's flags choose once before the loop (``step_parts``): the policy's passes (``forward``: grpo.py's
    plain ones or the scale path's), the loss stage and the surrogate's settings of the run's method, the sampler
    correction of the update's Ã (sampler_mismatch.py)."""

    forward: policy.Forward
    loss_stage: object
    loss_settings: object
    correction: object


def step_parts(cfg, credit, method, plain: policy.Forward) -> StepParts:
    """What the flags choose for every step, once before the loop: the scale path's passes when one of its flags is
    on (trainer/scale_passes.py), else ``plain`` (grpo.py's); on either, θ_old from the update's own forward where
    memory_plan.updates_on_policy allows (--fuse_old_logprobs: one update of one micro-batch); ``method``'s loss stage
    and surrogate settings; ``credit``: the run's credit function."""
    from trainer import memory_plan, scale_passes

    processes = distributed.world_size()
    num_rows = cfg.num_prompts_per_step // processes * cfg.num_generations  # this process's rows
    reuses = method.loss_stage.reuses_old_forward
    fuse_old = memory_plan.updates_on_policy(cfg, num_rows, processes, reuses, credit.gathers_weights)
    forward = plain._replace(old_logprobs=functools.partial(plain.old_logprobs, training_forward=fuse_old))
    if scale_passes.chosen(cfg):
        forward = scale_passes.forward(cfg, fuse_old)
    return StepParts(forward, method.loss_stage, method.loss_settings.from_config(cfg), sampler_correction(cfg))


def loss_mask(batch, cfg) -> torch.Tensor:
    """Stage 3's loss mask ``[N, T]``: the tokens the credit and the loss see, the rollout's response mask without the
    responses cut at the length limit under --mask_truncated_completions (TRL's flag)."""
    if not cfg.mask_truncated_completions:
        return batch.response_mask
    stopped = torch.tensor([r == "stop" for r in batch.finish_reasons], dtype=batch.response_mask.dtype)[:, None]
    return batch.response_mask * stopped


def prepare(cfg, given, world: int, method):
    """What ``train`` does once before its loop: the recipe, the checks, the data, the run folder, the preflight, the
    policy. Returns None (--dry_run), a finished run's summary (--resume of a run that ran its --max_steps), or
    (cfg, run, actor, source, heldout, trainer state or None). ``method``: the run's ``grpo.Method`` (the checks read
    its credit function's choices, the plan what its credit function and loss stage need)."""
    from tqdm import tqdm

    from trainer import grpo_config, preflight, recipes

    say = tqdm.write if distributed.rank() == 0 else (lambda *a, **k: None)
    policy.model_path(cfg.model)  # a folder that does not exist: one line before anything else is said
    cfg = recipes.apply(cfg, given, say)
    processes = cfg.plan_processes or world if cfg.dry_run else world
    notes = grpo_config.check_config(cfg, processes, given, method.credit.min_generations)
    if cfg.top_p < 1:  # rollout.py's module docstring
        say(f"[warn] --top_p {cfg.top_p}: sampled from the nucleus, scored uncut: each update is off-policy there")
    random.seed(cfg.seed)
    torch.manual_seed(cfg.seed)
    dataset, eval_set = load_data(cfg, say)  # data first: a bad row stops the run before any model loads
    run = open_run(cfg, distributed.rank(), say, method.label)
    if run is not None and run.finished(cfg.max_steps):  # --resume of a run that ran its --max_steps: nothing to do
        return run.summary()
    # before any weights: prompts over --max_prompt_length left out, DelTA's host cache checked, the memory plan
    asks = method.credit.asks
    traits = {
        "credit_gathers_weights": method.credit.gathers_weights,
        "reuses_old_forward": method.loss_stage.reuses_old_forward,
        "credit_token_arrays": method.credit.token_arrays + len(asks.token_stats or {}),
    }
    dataset = preflight.check(cfg, dataset, world, notes, given, say, traits)
    if dataset is None:  # --dry_run: the resolved settings and the plan were printed
        return None
    model, tokenizer, ref_model, optimizer, vllm_sampler, template, stop_ids, state, optimisations = build_policy(
        cfg, run, say
    )
    actor = Actor(model, tokenizer, optimizer, ref_model, vllm_sampler)
    source = PromptSource(dataset, rollout.PromptSampler(len(dataset), cfg.seed), template, stop_ids)
    heldout = HeldOut(cfg, model, tokenizer, eval_set, template, run)
    run.start(model, {"prompt_template": template, "num_processes": world, "optimisations": optimisations})
    return cfg, run, actor, source, heldout, state


def load_data(cfg, say):
    """The training rows and the held-out rows (the toy's test split by default for the toy; [] when off, said)."""
    fields = dict(problem_field=cfg.data_problem_field, answer_field=cfg.data_answer_field)
    rows = _load_problems("--data", cfg.data, split="train", **fields)
    eval_source = cfg.eval_data or ("toy" if cfg.data == "toy" else "")  # the toy's held-out split by default
    eval_rows = _load_problems("--eval_data", eval_source, split="test") if eval_source else []
    if not eval_rows or not cfg.eval_num_generations:  # said once: the closing line then names no accuracy
        why = (
            "--eval_num_generations 0; pass K >= 1"
            if eval_rows
            else "--data is not the toy and --eval_data is empty; pass --eval_data FILE (e.g. data/math500.jsonl)"
        )
        say(f"[eval] off: {why} for a held-out accuracy before and after training")
    return rows, eval_rows


def _load_problems(flag: str, source: str, **kwargs) -> list[dict]:
    """``problems.load_problems(source, **kwargs)``, a missing file named by the flag that gave it."""
    from trainer import problems

    try:
        return problems.load_problems(source, **kwargs)
    except FileNotFoundError as e:
        raise FileNotFoundError(f"{flag}: {e}") from None


def open_run(cfg, rank: int, say, label: str):
    """The run folder (None for --dry_run; default: named after the model and the method's ``label``); an earlier run
    there: see checkpoint.RunFolder (nothing written yet)."""
    from trainer import checkpoint

    if cfg.dry_run:
        return None
    folder = cfg.output_dir or checkpoint.default_run_folder(cfg.model, label)
    return checkpoint.RunFolder(folder, dataclasses.asdict(cfg), rank == 0, say)


def build_policy(cfg, run, say):
    """The policy (LoRA, checkpointing), the frozen reference (--beta > 0), --resume's weights, sharding, AdamW, then
    --resume's AdamW and RNG states; the template, its stop tokens and --use_vllm's engine (after the policy is on the
    GPU: vLLM's memory check counts it) in its sampler. Returns (model, tokenizer, ref_model, optimizer,
    vllm_sampler or None, template, stop_ids, trainer state or None, the optimisations on)."""
    from trainer import scale_passes, vllm_engine

    model, tokenizer, ref_model, optimizer, compute_dtype = policy.build(cfg, say, load_weights=run.load_weights)
    state = run.load_optimizer(model, optimizer)
    optimisations = scale_passes.exact_optimisations(model, cfg, say)  # each one exact here, or off with a reason
    template = rollout.resolve_template(cfg.prompt_template, cfg.model, say, cfg.data)
    stop_ids = rollout.stop_token_ids(tokenizer, template, model)
    vllm_sampler = (
        vllm_engine.VllmSampler(
            vllm_engine.create_engine(
                policy.model_path(cfg.model),
                gpu_memory_utilization=cfg.vllm_gpu_memory_utilization,
                enable_sleep_mode=cfg.vllm_enable_sleep_mode,
                seed=cfg.seed,
                trust_remote_code=cfg.trust_remote_code,
                kv_cache_dtype=cfg.vllm_kv_cache_dtype,
                sampler_logprobs=cfg.vllm_importance_sampling_correction,
                dtype=str(compute_dtype or next(model.parameters()).dtype).removeprefix("torch."),
            ),
            sleep_after=cfg.vllm_enable_sleep_mode,  # the engine sleeps from the end of a rollout to the next one
        )
        if cfg.use_vllm
        else None
    )
    return model, tokenizer, ref_model, optimizer, vllm_sampler, template, stop_ids, state, optimisations


class HeldOut:
    """Held-out greedy, avg@k and pass@k at a step (``__call__``), logged to the run folder; {} when off."""

    def __init__(self, cfg, model, tokenizer, rows, template, run):
        self.cfg, self.model, self.tokenizer, self.rows, self.template, self.run = (
            cfg,
            model,
            tokenizer,
            rows,
            template,
            run,
        )

    def __call__(self, step: int) -> dict:
        import evaluate

        cfg = self.cfg
        if not self.rows or not cfg.eval_num_generations:
            return {}
        settings = evaluate.EvalSettings(**evaluate.run_settings(vars(cfg)))  # the run's held-out settings, one rule
        with policy.oom_guard(f"the evaluation at step {step}"):
            record = {
                "step": step,
                **evaluate.heldout(
                    self.model, self.tokenizer, self.rows, self.template, settings, progress=f"eval step {step}"
                ),
            }
        return log_record(self.run, record, echo=f"[eval step {step}]")

    def due(self, step: int) -> bool:  # after ``step`` steps: --eval_steps, not the last (train evaluates it)
        return bool(self.cfg.eval_steps) and step % self.cfg.eval_steps == 0 and step < self.cfg.max_steps


def trainer_state(sampler, credit) -> dict:
    """What a checkpoint keeps beside the weights: the data order, the credit's own state (``state_dict``: CSCR's
    calibrated λ, or an ablation's kept value)."""
    return {"sampler_position": sampler.position, **credit.state_dict()}


def restore(state, sampler, credit) -> int:
    """--resume: where the data order and the credit's state stood; returns the first step (0: a new run)."""
    if not state:
        return 0
    sampler.position = state["sampler_position"]
    credit.load_state_dict(state)
    return state["step"]


def save_checkpoint(run, step: int, actor, source, credit) -> None:  # checkpoint-<step>/: weights, AdamW, state
    run.save_checkpoint(step, actor.model, actor.tokenizer, actor.optimizer, trainer_state(source.sampler, credit))


def finish_run(cfg, run, summary, actor, source, credit) -> None:  # ``finish`` with the trainer's state at the end
    finish(run, actor, summary, {"step": cfg.max_steps, **trainer_state(source.sampler, credit)})


def run_steps(cfg, run, start_step, heldout, train_step, save_checkpoint, label: str) -> dict:
    """The loop: ``train_step(step)`` from ``start_step`` to --max_steps under a progress bar (``label``: the method's),
    the held-out evaluation before, on --eval_steps and after, a checkpoint every --save_steps
    (``save_checkpoint(step)``). A run stopped before its first step leaves nothing that blocks the rerun; Ctrl-C raises
    KeyboardInterrupt with one line on what the folder holds and what next. Returns {before, after, last_step}."""
    from tqdm import tqdm

    last, started, bar = {}, False, None
    try:
        first_eval = heldout(0) if start_step == 0 else run.logged_eval(0)  # a resumed run logged it already
        bar = tqdm(
            range(start_step, cfg.max_steps),
            desc=f"GRPO[{label}]",
            dynamic_ncols=True,
            initial=start_step,
            total=cfg.max_steps,
            **({} if distributed.rank() == 0 else {"disable": True}),
        )
        for step in bar:
            with policy.oom_guard(f"step {step + 1}"):
                last = train_step(step)
            started = True
            bar.set_postfix(reward=f"{last['reward']:.3f}", len=f"{last['completions/mean_length']:.1f}")
            if last["completions/clipped_ratio"] > 0.5 and step < 3 and distributed.rank() == 0:
                tqdm.write(
                    f"[warn] {last['completions/clipped_ratio']:.0%} of responses hit --max_completion_length "
                    f"{cfg.max_completion_length}: they rarely score; raise it"
                )
            if heldout.due(step + 1):
                heldout(step + 1)
            if cfg.save_steps and (step + 1) % cfg.save_steps == 0 and step + 1 < cfg.max_steps:
                save_checkpoint(step + 1)
        return {
            "before": first_eval,
            "after": heldout(cfg.max_steps) if cfg.max_steps else first_eval,
            "last_step": last,
        }
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


def finish(run, actor, summary, state) -> None:
    """final/ (save_pretrained, and resumable: AdamW's state and the trainer's ``state``), summary.json, and
    samples/summary.json: samples_summary's numbers of this run's logged samples. Ctrl-C: one line on the folder."""
    try:
        run.finish(actor.model, actor.tokenizer, summary, actor.optimizer, state)
        if run.main:
            from trainer import samples_summary

            samples_summary.write_samples_summary(run.path)
    except KeyboardInterrupt:
        raise KeyboardInterrupt(run.interrupted_note()) from None


def closing_line(summary, cfg, label: str) -> str:
    """main's last line: the held-out accuracy before -> after, or where the run went (evaluation off)."""
    b, a, k = summary["before"], summary["after"], cfg.eval_num_generations
    if b and a:
        return (
            f"held-out avg@{k}: {b[f'eval/avg@{k}']:.3f} -> {a[f'eval/avg@{k}']:.3f}   "
            f"greedy: {b['eval/greedy']:.3f} -> {a['eval/greedy']:.3f}"
        )
    from trainer import checkpoint

    folder = cfg.output_dir or checkpoint.default_run_folder(cfg.model, label)
    return f"done: {cfg.max_steps} steps in {folder} (held-out evaluation off)"


def prompts_of_step(cfg, sampler, rows, template):
    """This process's whole groups of the step's prompt order: (prompts, each response's reference answer)."""
    rank = distributed.rank()
    per_rank = cfg.num_prompts_per_step // distributed.world_size()
    idx = sampler.take(cfg.num_prompts_per_step)[rank * per_rank : (rank + 1) * per_rank]
    prompts = [rollout.apply_template(rows[i]["problem"], template) for i in idx]
    return prompts, [rows[i]["answer"] for i in idx for _ in range(cfg.num_generations)]


def step_peak() -> dict:  # this step's peak host RSS (and GPU memory), the largest over processes
    peaks = distributed.all_gather_objects(policy.peak_memory())
    return {k: max(p[k] for p in peaks) for k in peaks[0]}


def log_step(run, step: int, cfg, logged: StepLog, outcome, credit_stats: dict, times) -> dict:
    """Stage 7: metrics.jsonl's line of a step, every process's responses pooled: the rewards (group by group), the
    verifier's 0/1 (``accuracy``; ``overlong/penalty_mean`` when DAPO's shaping is on), lengths and finish reasons,
    the grader's counts; the update's statistics, each the mean over its own tokens (``outcome``: policy_update's Σ
    losses, grad norms, each statistic's Σ mean·count and its count's Σ, ``"n:" + name`` or num_tokens, skipped
    updates); the credit's statistics, the step's peak memory and times (``times``: the step's start, the rollout's
    seconds). Every process must call it."""
    loss_sum, grad_norms, token_sums, skipped = outcome
    no_signal = token_sums.pop("no_signal", 0.0)  # no update: its statistics 0.0 (policy_update)
    keys = sorted(token_sums)
    pooled_sums = distributed.all_reduce_sum(torch.tensor([token_sums[k] for k in keys], dtype=torch.float64))
    sums = dict(zip(keys, pooled_sums.tolist()))
    num_tokens = max(sums.pop("num_tokens", 1.0), 1.0)
    reasons = [reason for _, reason in logged.graded]
    counts = [float(reasons.count(reason)) for reason in verify.REASONS]  # every reason, a stable column each
    counted = distributed.all_reduce_sum(torch.tensor(counts, dtype=torch.float64)).tolist()
    mine = (logged.rewards.tolist(), logged.lengths.tolist(), logged.batch.finish_reasons, logged.correct.tolist())
    per_process = distributed.all_gather_objects(mine)
    r = torch.tensor([x for part in per_process for x in part[0]])
    lengths = torch.tensor([x for part in per_process for x in part[1]], dtype=torch.float)
    finish = [x for part in per_process for x in part[2]]
    c = torch.tensor([x for part in per_process for x in part[3]])
    groups = r.view(-1, cfg.num_generations)
    run.skipped_updates_total += skipped  # (kept across --resume)
    record = {
        "step": step + 1,
        "reward": r.mean().item(),
        "reward_std": r.std().item() if len(r) > 1 else 0.0,
        "accuracy": c.mean().item(),
        **({"overlong/penalty_mean": (r - c).mean().item()} if cfg.overlong_buffer_len else {}),  # r − c: the shaping
        "frac_reward_zero_std": (groups.max(-1).values == groups.min(-1).values).float().mean().item(),
        "completions/mean_length": lengths.mean().item(),
        "completions/clipped_ratio": finish.count("length") / len(r),
        **{k: v / max(sums.get("n:" + k, num_tokens), 1.0) for k, v in sums.items() if not k.startswith("n:")},
        **{f"verify/{k}": int(v) for k, v in zip(verify.REASONS, counted)},
        "loss": loss_sum / (cfg.num_iterations * cfg.num_mini_batches),
        "grad_norm": sum(grad_norms) / max(len(grad_norms), 1),
        "skipped_updates": skipped,
        "no_signal": no_signal,
        **credit_stats,
        **step_peak(),
        "step_time": time.time() - times[0],
        "generation_time": times[1],
        "skipped_updates_total": run.skipped_updates_total,
    }
    return log_record(run, record)


def log_record(run, record: dict, echo: str = "") -> dict:
    """Append one record to metrics.jsonl (the main process; returns it); NaN/inf (e.g. a DelTA side statistic of a
    batch with no positive response) become null, so every line is strict JSON; the ``--report_to`` trackers get its
    finite numbers under the same names at its ``step``. ``echo``: also print it after this prefix."""
    if not run.main:
        return record
    strict = {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in record.items()}
    run.metrics_file.write(json.dumps(strict) + "\n")
    run.metrics_file.flush()
    values = {k: v for k, v in record.items() if k != "step" and isinstance(v, (int, float)) and math.isfinite(v)}
    for tracker in run.trackers:  # --report_to: the same values, under the same names, at the same step
        tracker.log(values, record["step"])
    if echo:
        run.say(echo + " " + " ".join(f"{k.split('/', 1)[-1]}={v:.3f}" for k, v in record.items() if k != "step"))
    return record


def rollout_batch(step, cfg, actor, source):
    """Stage 1: this process's whole groups of the step's prompts, G responses each (``rollout.sample``: HF or vLLM),
    seeded by the step and the process. Returns (the ``rollout.RolloutBatch``, each response's reference, seconds)."""
    t0 = time.time()
    prompts, answers = prompts_of_step(cfg, source.sampler, source.dataset, source.template)
    seed = cfg.seed * 100_003 + step + 1_000_003 * distributed.rank()
    stops = (source.stop_ids, rollout.template_stop_strings(source.template))  # stop tokens, stop strings
    settings = rollout.SamplingSettings(cfg.max_completion_length, cfg.temperature, cfg.top_p, seed, *stops)
    batch = rollout.sample(actor.model, actor.tokenizer, prompts, cfg.num_generations, settings, actor.vllm_sampler)
    return batch, answers, time.time() - t0


def write_samples(run, step: int, cfg, tokenizer, logged: StepLog, update) -> None:
    """samples/step_*.jsonl every --logging_steps (the main process): the first --num_samples_to_log groups, one JSON
    line per response: ``prompt``, ``response``, ``reward``, ``advantage`` (Â_i), ``finish_reason``; ``tokens`` (each
    decoded on its own, EOS included) and ``credit`` (``credit_shares``, × the loss's own factor where a comparison's
    loss stage has one; 0 for a response --mask_truncated_completions left out of the loss). Where Â_i ≠ 0, each of
    the credit's per-token values under its name (``update.token_values``: ``lam_bar`` λ̄, CSCR's ``sensitivity``
    s), then ``token_advantages`` (Ã), one number per token of ``tokens``. report.py reads them (and computes the
    toy's truth from ``prompt`` and ``tokens``)."""
    if distributed.rank() != 0 or not cfg.logging_steps or (step + 1) % cfg.logging_steps:
        return
    batch = logged.batch
    credit = credit_shares(logged.adv, logged.token_adv, update.token_values)
    if update.loss_factor is not None:
        credit = credit * update.loss_factor
    num_rows = min(cfg.num_samples_to_log, len(batch.texts) // cfg.num_generations) * cfg.num_generations
    with open(os.path.join(run.path, "samples", f"step_{step + 1:06d}.jsonl"), "w") as f:
        for i in range(num_rows):
            live = update.loss_mask[i].bool()
            shown = live if live.any() or batch.finish_reasons[i] != "length" else torch.ones_like(live)  # truncated
            tokens = [tokenizer.decode([t]) for t in batch.response_ids[i][shown].tolist()]  # and masked: all shown
            a = logged.adv[i].item()
            row = {
                "prompt": batch.prompts[i],
                "response": batch.texts[i],
                "reward": logged.rewards[i].item(),
                "advantage": a,
                "finish_reason": batch.finish_reasons[i],
                "tokens": tokens,
                "credit": [round(c, 4) for c in torch.where(live[shown], credit[i][shown], 0.0).tolist()],
            }
            if update.token_values and live.any() and a != 0:  # per token, as ``tokens``: λ̄, s, ..., then Ã
                values = {**update.token_values, "token_advantages": logged.token_adv}
                row.update({name: [round(x, 4) for x in v[i][shown].tolist()] for name, v in values.items()})
            f.write(json.dumps(row) + "\n")


def credit_shares(adv, token_adv, token_values):
    """Each token's credit c ``[N, T]`` for samples/: the credit function's own (``token_values["credit_share"]``,
    where Ã is not Â·c), else Ã / Â (where Â = 0: DelTA's λ̄, else 1)."""
    if "credit_share" in token_values:
        return token_values["credit_share"]
    share = token_adv / torch.where(adv == 0, 1.0, adv).to(token_adv.dtype)[:, None]
    fill = token_values.get("lam_bar", torch.ones_like(share))
    return torch.where((adv == 0)[:, None], fill.to(share.dtype), share)


def run_command(train, cfg, given, method) -> None:
    """grpo.py's command: ``train(cfg, given, method)``; a bad data file, model name or folder is one line (no
    traceback); Ctrl-C one line on the run folder and status 130; then the closing line (none for --dry_run)."""
    from trainer import recipes

    interrupted = None
    try:
        summary = train(cfg, given, method)
        cfg = recipes.apply(cfg, given)  # the settings it ran with, for the closing line
    except (ValueError, OSError) as e:
        raise SystemExit(f"grpo.py: error: {e}")
    except KeyboardInterrupt as e:  # train's note on the run folder (none: nothing written yet)
        interrupted = str(e) or "before training began; the same command starts again"
    finally:
        distributed.close()
    if interrupted is not None:  # (after the except block: the interrupted frames, and their bars, are gone)
        if distributed.rank_from_env() == 0:
            print(f"grpo.py: interrupted: {interrupted}", file=sys.stderr, flush=True)
        raise SystemExit(130)  # a shell's status for SIGINT
    if summary is not None and distributed.rank_from_env() == 0:
        print(closing_line(summary, cfg, method.label))
