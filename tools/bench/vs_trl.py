"""Our GRPO loop (grpo.py) against TRL's ``GRPOTrainer`` on the built-in toy: seconds per step and accuracy.

What it measures
----------------
Both trainers train the same toy model (a private snapshot of ``toy.model_folder()``, loaded with
``from_pretrained`` in float32 on the CPU) on the same prompts in the same order, with the same settings:

==================================  =================================================  ==============================
setting                             ours (``grpo.GRPOConfig``)                         TRL 1.16 (``trl.GRPOConfig``)
==================================  =================================================  ==============================
prompts per step × group size       ``num_prompts_per_step`` P × ``num_generations``  ``per_device_train_batch_size``
                                    G (default 16 × 8)                                 = P·G, ``num_generations`` G,
                                                                                       ``gradient_accumulation_steps``
                                                                                       1, ``steps_per_generation`` 1:
                                                                                       one optimizer step per rollout
                                                                                       batch of P·G responses
prompt order                        ``rollout.PromptSampler(len(train), seed)``        a ``datasets.Dataset`` already
                                                                                       in that order,
                                                                                       ``shuffle_dataset=False``
prompt text                         ``rollout.apply_template(problem, "none")``        the same strings
reward                              ``verify.grade_batch`` (binary)                    the same call
                                                                                       (= ``verify.reward`` per
                                                                                       response)
sampling                            T 1.0, top-p 1.0, top-k off, 64 new tokens         ``temperature`` 1.0, ``top_p``
                                                                                       1.0, ``top_k`` 0,
                                                                                       ``max_completion_length`` 64
optimizer                           AdamW lr 3e-4 constant, betas (0.9, 0.999),        ``learning_rate`` 3e-4,
                                    eps 1e-8, weight decay 0, clip 1.0                 ``lr_scheduler_type="constant"``,
                                                                                       ``warmup_steps=0`` (TRL's
                                                                                       default is linear decay),
                                                                                       same AdamW, ``max_grad_norm`` 1
loss                                DAPO token-mean, ε 0.2, ε_high 0.28, β 0,          ``loss_type="dapo"``,
                                    group-std advantages, 1 iteration                  ``epsilon`` 0.2,
                                                                                       ``epsilon_high`` 0.28, ``beta``
                                                                                       0, ``scale_rewards="group"``,
                                                                                       ``num_iterations`` 1
precision, memory                   float32, no gradient checkpointing                 ``use_cpu=True``,
                                                                                       ``bf16=False``,
                                                                                       ``gradient_checkpointing=False``
logging                             ``eval_num_generations`` 0, no sample files        ``report_to="none"``, no
                                    (``logging_steps`` 0), no checkpoints              logging, no saving
threads                             ``--num_threads`` (default 1, what grpo.py picks   ``torch.set_num_threads`` with
                                    for the toy) in every run's process                the same number
policy's passes                     grpo.py's default, the plain path (every row       TRL's own: every row padded
                                    padded to the batch's longest prompt and           to the batch's longest
                                    response, every prompt run G times, θ_old from     prompt and response; θ_old
                                    the update's own forward); and, a run of its       from the training forward
                                    own, the scale path (``--padding_free              (one update per batch)
                                    --shared_prompt --chunked_lm_head``)
==================================  =================================================  ==============================

Known differences that remain (neither changes the cost of a step measurably): TRL divides advantages by
std + 1e-4, ours by std + 1e-6 (binary rewards: std ≥ 0.35 when non-zero); TRL seeds its sampler differently, so
the sampled responses differ (same prompts); ours cuts a response after a prompt template's stop string (none
occurs on the toy). When one optimizer step uses each rollout batch once, TRL takes θ_old's log-probs from the
training forward (TRL 1.16: ``old_per_token_logps = per_token_logps.detach()``), and so does ours on either path
(``--fuse_old_logprobs``, grpo.py's default, where ``memory_plan.updates_on_policy`` allows: it does here).
Ours runs twice per round, the same update to rounding: with its defaults (``ours``: the plain path, every row
padded to the batch's longest prompt and response, every prompt run G times) and on the scale path
(``ours_scale``: ``--padding_free``, micro-batches of similar length, each cut to its own longest row;
``--shared_prompt``, each group's prompt run once; ``--chunked_lm_head``, the LM head a chunk of positions at a
time where the logits are large (never on the toy)). Goals: the default at most 1.0× TRL's s/step, the scale path
at most 0.85× (the run it was set for: an update that computes no padding).

Seconds per step: ours from ``metrics.jsonl`` ``step_time`` (rollout, grading, advantages, old log-probs,
credit, update; ``generation_time`` its rollout part); TRL from a ``TrainerCallback``, ``on_step_begin`` to
``on_step_end`` (TRL 1.16 generates inside ``training_step`` → ``_prepare_inputs`` →
``_generate_and_score_completions``, so generation is inside the step; its generation time is read by a timing
wrapper around the trainer's ``_generate``). The first step of every run is excluded (grading-worker start,
allocator growth). CPU seconds per step (``time.process_time`` over the same span) are reported next to wall
seconds: much less sensitive to other processes sharing the cores. A second table splits each step into
generation, grading, the separate old-log-prob pass, the update (forward with grad, loss, backward, clip, AdamW)
and the rest, from timing wrappers installed in the run's process only (ours: ``verify.grade_batch``,
``grpo.old_logprobs`` and ``scale_passes.old_logprobs`` (stage 4 on either path), ``grpo.policy_update``; TRL:
``_calculate_rewards`` and ``_generate_and_score_completions``, the update being the rest of the step).

Runs alternate (ours, TRL, ours on the scale path, ours, TRL, ...; ``--rounds`` rounds), each in a fresh process
forked from a server that has already imported torch/transformers/trl, so slow machine drift hits all alike. Round r
uses seed ``--seed + r`` for every trainer (data order and sampling), so the rounds also show seed-to-seed spread.

Accuracy: the same function for both, ``evaluate.evaluate_rows(model, tokenizer, rows, "none", k=8, temperature
1.0, top_p 1.0, max_new_tokens 64, seed=--eval_seed)`` on the toy's held-out split (``--eval_limit`` problems,
default all 200): greedy accuracy and avg@8. "Before" is evaluated once (the same weights and evaluation seed for
every run); "after" once per run, on the trained weights (ours: reloaded from ``final/``; TRL: the trainer's
model in memory).

Peak memory: the resident-set increase from loading the model to the end of training (``_common.PeakMemory``).

Results: a markdown table on stdout and JSON (``--out``, default ``tools/bench/results/vs_trl.json``) with the machine,
library versions (trl, datasets, accelerate included), git commit, exact command, every setting of both
trainers, every step's timings and every run's accuracies.

TRL is a benchmark-only dependency: ``pip install -r requirements.txt -r tools/requirements-bench.txt`` (never needed
by the project itself).

Usage::

    python tools/bench/vs_trl.py                      # 2 rounds × 30 steps (about 3.5 minutes on 2 CPU cores)
    python tools/bench/vs_trl.py --steps 60 --rounds 3
    python tools/bench/vs_trl.py --profile            # also cProfile one run of each, print the top functions
"""

from __future__ import annotations

import argparse
import io
import os
import shlex
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from tools.bench import _common  # noqa: E402
from tools.bench._common import median  # noqa: E402

PROG = "vs_trl.py"
GOAL_RATIO = 0.85  # the scale path's s/step at most this × TRL's (issue: an update that computes no padding)
GOAL_RATIO_DEFAULT = 1.0  # grpo.py's default (the plain path) at most this × TRL's
EXTRA_PACKAGES = ("trl", "datasets", "accelerate")
PRELOAD = _common.PRELOAD + ["datasets", "accelerate", "trl", "trl.trainer.grpo_trainer"]
TEMPLATE = "none"


# ----------------------------------------------------------------------------------------------------------
# Child processes
# ----------------------------------------------------------------------------------------------------------
def _quiet():
    import warnings

    import transformers

    transformers.logging.set_verbosity_error()
    warnings.filterwarnings("ignore")


def _toy_rows(split: str) -> list[dict]:
    """The toy's ``split`` rows; registers the toy's data first (a worker has not run ``toy.register``, which
    grpo.train calls)."""
    import toy
    from trainer import problems

    toy.register_data()
    return problems.load_problems("toy", split=split)


def _evaluate(model, tokenizer, spec) -> dict:
    """The shared held-out evaluation (greedy + avg@k); returns the headline metrics and its seconds."""
    import evaluate

    rows = _toy_rows("test")
    if spec["eval_limit"]:
        rows = rows[: spec["eval_limit"]]
    t0 = time.perf_counter()
    settings = evaluate.EvalSettings(spec["eval_k"], 1.0, 1.0, spec["max_completion_length"], seed=spec["eval_seed"])
    res = evaluate.evaluate_rows(model, tokenizer, rows, TEMPLATE, settings)
    k = spec["eval_k"]
    return {
        "greedy": res["greedy"],
        f"avg@{k}": res[f"avg@{k}"],
        "problems": len(rows),
        "eval_seconds": time.perf_counter() - t0,
    }


def _timed(owner, name: str, sink: list):
    """Replace ``owner.name`` (looked up at call time by its callers) by a wrapper appending each call's seconds."""
    original = getattr(owner, name)

    def wrapper(*a, **k):
        t0 = time.perf_counter()
        out = original(*a, **k)
        sink.append(time.perf_counter() - t0)
        return out

    setattr(owner, name, wrapper)
    return original


def _load(path):
    from trainer import policy

    return policy.load_model_and_tokenizer(path, dtype="float32", device="cpu")


def evaluate_only(spec: dict) -> dict:
    """Child: the "before" evaluation of the initial model."""
    import torch

    _quiet()
    torch.set_num_threads(spec["num_threads"])
    model, tokenizer = _load(spec["model"])
    return _evaluate(model, tokenizer, spec)


def _profiled(spec, fn):
    if not spec.get("profile"):
        return fn()
    import cProfile

    prof = cProfile.Profile()
    prof.enable()
    try:
        return fn()
    finally:
        prof.disable()
        prof.dump_stats(spec["profile"])


def run_ours(spec: dict) -> dict:
    """Child: ``grpo.train`` with the shared settings, on grpo.py's default path (the plain one) or, with
    ``spec["scale"]``, the scale path; per-step wall/CPU times, prompts, memory, accuracy after."""
    import json

    import torch

    import grpo
    import rollout
    from trainer import scale_passes

    _quiet()
    torch.set_num_threads(spec["num_threads"])
    prompts_per_step, cpu = [], []
    original_generate, original_step = rollout.generate, grpo.train_step

    def generate(model, tokenizer, prompts, *a, **k):
        prompts_per_step.append(list(prompts))
        return original_generate(model, tokenizer, prompts, *a, **k)

    def train_step(*a, **k):  # CPU seconds of the whole step (grpo.train looks it up at call time)
        c0 = time.process_time()
        out = original_step(*a, **k)
        cpu.append(time.process_time() - c0)
        return out

    rollout.generate, grpo.train_step = generate, train_step
    # where a step's time goes (each wrapper appends one entry per step)
    parts = {"grading": [], "old_logprobs": [], "update": []}
    originals = [  # (grpo.train picks stage 4's function, the plain or the scale path's, when it starts)
        (grpo.verify, "grade_batch", _timed(grpo.verify, "grade_batch", parts["grading"])),
        (grpo, "old_logprobs", _timed(grpo, "old_logprobs", parts["old_logprobs"])),
        (scale_passes, "old_logprobs", _timed(scale_passes, "old_logprobs", parts["old_logprobs"])),
        (grpo, "policy_update", _timed(grpo, "policy_update", parts["update"])),
    ]
    out_dir = spec["output_dir"]
    cfg = grpo.GRPOConfig(
        recipe="toy",
        model=spec["model"],
        data="toy",
        prompt_template=TEMPLATE,
        output_dir=out_dir,
        torch_dtype="float32",
        num_generations=spec["num_generations"],
        num_prompts_per_step=spec["num_prompts_per_step"],
        max_completion_length=spec["max_completion_length"],
        temperature=1.0,
        top_p=1.0,
        max_steps=spec["steps"],
        learning_rate=spec["learning_rate"],
        weight_decay=0.0,
        max_grad_norm=1.0,
        num_iterations=1,
        num_mini_batches=1,
        micro_batch_size=0,
        epsilon=0.2,
        epsilon_high=0.28,
        beta=0.0,
        loss_type="dapo",
        scale_rewards="group",
        eval_num_generations=0,
        logging_steps=0,
        num_samples_to_log=0,
        save_steps=0,
        seed=spec["seed"],
        num_threads=spec["num_threads"],
        credit="grpo",
        padding_free=spec.get("scale", False),  # the scale path's three flags, or grpo.py's default (the plain path)
        shared_prompt=spec.get("scale", False),
        chunked_lm_head=spec.get("scale", False),
    )
    t0 = time.perf_counter()
    with _common.PeakMemory() as mem:
        _profiled(spec, lambda: grpo.train(cfg))
    wall = time.perf_counter() - t0
    rollout.generate, grpo.train_step = original_generate, original_step  # the evaluation is not recorded
    for owner, name, fn in originals:
        setattr(owner, name, fn)
    threads = torch.get_num_threads()
    steps = []
    with open(os.path.join(out_dir, "metrics.jsonl")) as f:
        for line in f:
            rec = json.loads(line)
            if "step_time" in rec:
                steps.append(
                    {
                        "step": rec["step"],
                        "step_time": rec["step_time"],
                        "generation_time": rec["generation_time"],
                        "reward": rec["reward"],
                        "mean_length": rec["completions/mean_length"],
                    }
                )
    for i, (s, c) in enumerate(zip(steps, cpu)):
        s["cpu_step_time"] = c
        s.update({f"{k}_time": v[i] if i < len(v) else 0.0 for k, v in parts.items()})  # a part not run: 0
    model, tokenizer = _load(os.path.join(out_dir, "final"))
    return {
        "trainer": "ours_scale" if spec.get("scale") else "ours",
        "seed": spec["seed"],
        "wall_time": wall,
        "steps": steps,
        **mem.as_dict(),
        "torch_threads": threads,
        "prompts": prompts_per_step,
        "after": _evaluate(model, tokenizer, spec),
    }


def trl_config(spec: dict):
    """TRL 1.16's ``GRPOConfig`` equivalent to our run (see the module docstring's table)."""
    from trl import GRPOConfig

    P, G = spec["num_prompts_per_step"], spec["num_generations"]
    return GRPOConfig(
        output_dir=spec["output_dir"],
        use_cpu=True,
        bf16=False,
        fp16=False,
        report_to="none",
        save_strategy="no",
        logging_strategy="no",
        disable_tqdm=True,
        log_completions=False,
        per_device_train_batch_size=P * G,
        gradient_accumulation_steps=1,
        steps_per_generation=1,
        num_generations=G,
        max_completion_length=spec["max_completion_length"],
        temperature=1.0,
        top_p=1.0,
        top_k=0,
        learning_rate=spec["learning_rate"],
        lr_scheduler_type="constant",
        warmup_steps=0,
        weight_decay=0.0,
        adam_beta1=0.9,
        adam_beta2=0.999,
        adam_epsilon=1e-8,
        max_grad_norm=1.0,
        epsilon=0.2,
        epsilon_high=0.28,
        loss_type="dapo",
        beta=0.0,
        scale_rewards="group",
        num_iterations=1,
        mask_truncated_completions=False,
        gradient_checkpointing=False,
        shuffle_dataset=False,
        max_steps=spec["steps"],
        seed=spec["seed"],
        dataloader_num_workers=0,
        remove_unused_columns=False,
    )


def run_trl(spec: dict) -> dict:
    """Child: TRL's ``GRPOTrainer`` with the equivalent settings; the same measurements as ``run_ours``."""
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from transformers.trainer_callback import PrinterCallback, ProgressCallback
    from trl import GRPOTrainer

    import rollout
    import verify

    _quiet()
    torch.set_num_threads(spec["num_threads"])
    P, G, steps = spec["num_prompts_per_step"], spec["num_generations"], spec["steps"]
    train_rows = _toy_rows("train")
    order = rollout.PromptSampler(len(train_rows), spec["seed"]).take(P * steps)  # our trainer's exact order
    dataset = Dataset.from_list(
        [
            {"prompt": rollout.apply_template(train_rows[i]["problem"], TEMPLATE), "answer": train_rows[i]["answer"]}
            for i in order
        ]
    )
    prompts_per_step, rewards_per_step, lengths_per_step = [], [], []

    def reward(prompts, completions, answer, completion_ids, **kwargs):
        # the same grader call as grpo.py's step (binary: 1.0 iff verify.reward(completion, answer) == 1.0)
        prompts_per_step.append(list(prompts[::G]))
        lengths_per_step.append(statistics.fmean(len(c) for c in completion_ids))  # tokens, EOS included
        r = [float(ok) for ok, _ in verify.grade_batch(list(completions), list(answer))]
        rewards_per_step.append(statistics.fmean(r))
        return r

    times, gen_times = [], []

    class StepTimer(TrainerCallback):
        def on_step_begin(self, args, state, control, **kw):
            self.t0, self.c0 = time.perf_counter(), time.process_time()

        def on_step_end(self, args, state, control, **kw):
            times.append(
                {
                    "step_time": time.perf_counter() - self.t0,
                    "cpu_step_time": time.process_time() - self.c0,
                    "torch_threads": torch.get_num_threads(),
                }
            )

    t0 = time.perf_counter()
    with _common.PeakMemory() as mem:
        tokenizer = AutoTokenizer.from_pretrained(spec["model"])
        tokenizer.padding_side = "left"
        model = AutoModelForCausalLM.from_pretrained(spec["model"], dtype=torch.float32)
        trainer = GRPOTrainer(
            model=model,
            reward_funcs=reward,
            args=trl_config(spec),
            train_dataset=dataset,
            processing_class=tokenizer,
            callbacks=[StepTimer()],
        )
        for cb in (PrinterCallback, ProgressCallback):
            trainer.remove_callback(cb)
        original_generate = trainer._generate

        def timed_generate(prompts):
            g0 = time.perf_counter()
            out = original_generate(prompts)
            gen_times.append(time.perf_counter() - g0)
            return out

        trainer._generate = timed_generate
        parts = {"grading": [], "generate_and_score": []}
        _timed(trainer, "_calculate_rewards", parts["grading"])
        _timed(trainer, "_generate_and_score_completions", parts["generate_and_score"])
        _profiled(spec, trainer.train)
    wall = time.perf_counter() - t0
    steps = [
        {"step": i + 1, **t, "generation_time": g, "reward": r, "mean_length": n}
        for i, (t, g, r, n) in enumerate(zip(times, gen_times, rewards_per_step, lengths_per_step))
    ]
    for i, s in enumerate(steps):
        s.pop("torch_threads")
        s["grading_time"] = parts["grading"][i]
        s["old_logprobs_time"] = 0.0  # TRL 1.16 skips it when each rollout batch is used by one optimizer step
        # the rest of the step: forward with grad, loss, backward, clip, optimizer step
        s["update_time"] = s["step_time"] - parts["generate_and_score"][i]
    trained = trainer.accelerator.unwrap_model(trainer.model)
    eval_tok = AutoTokenizer.from_pretrained(spec["model"])  # a fresh tokenizer, as ours gets from _load
    eval_tok.padding_side = "left"
    return {
        "trainer": "trl",
        "seed": spec["seed"],
        "wall_time": wall,
        "steps": steps,
        **mem.as_dict(),
        "torch_threads": sorted({t["torch_threads"] for t in times}),
        "prompts": prompts_per_step,
        "optimizer": repr(
            trainer.optimizer.optimizer if hasattr(trainer.optimizer, "optimizer") else trainer.optimizer
        ).replace("\n", " "),
        "lr_scheduler": type(trainer.lr_scheduler).__name__,
        "lr_last": trainer.lr_scheduler.get_last_lr(),
        "after": _evaluate(trained, eval_tok, spec),
    }


# ----------------------------------------------------------------------------------------------------------
# Parent
# ----------------------------------------------------------------------------------------------------------
def summarize(runs: list[dict], k: int) -> dict:
    out = {}
    for name in ("ours", "ours_scale", "trl"):
        rs = [r for r in runs if r["trainer"] == name]
        if not rs:
            continue
        st = [s for r in rs for s in r["steps"][1:]]
        out[name] = {
            "runs": len(rs),
            "steps_timed": len(st),
            "s_per_step": median([s["step_time"] for s in st]),
            "s_generation": median([s["generation_time"] for s in st]),
            "s_per_step_excl_generation": median([s["step_time"] - s["generation_time"] for s in st]),
            "cpu_s_per_step": median([s["cpu_step_time"] for s in st]),
            "breakdown_s": {
                "generation": median([s["generation_time"] for s in st]),
                "grading": median([s["grading_time"] for s in st]),
                "old_logprobs": median([s["old_logprobs_time"] for s in st]),
                "update": median([s["update_time"] for s in st]),
                "other": median(
                    [
                        s["step_time"]
                        - s["generation_time"]
                        - s["grading_time"]
                        - s["old_logprobs_time"]
                        - s["update_time"]
                        for s in st
                    ]
                ),
            },
            "round_s_per_step": [median([s["step_time"] for s in r["steps"][1:]]) for r in rs],
            "peak_rss_increase_mib": median([r["peak_rss_increase_mib"] for r in rs]),
            "mean_train_reward": statistics.fmean(s["reward"] for r in rs for s in r["steps"]) if rs else None,
            "mean_completion_length": statistics.fmean(s["mean_length"] for r in rs for s in r["steps"])
            if rs
            else None,
            f"avg@{k}_after": [r["after"][f"avg@{k}"] for r in rs],
            "greedy_after": [r["after"]["greedy"] for r in rs],
            f"mean_avg@{k}_after": statistics.fmean(r["after"][f"avg@{k}"] for r in rs) if rs else None,
            "mean_greedy_after": statistics.fmean(r["after"]["greedy"] for r in rs) if rs else None,
        }
    t = out["trl"]
    for o in [out[n] for n in ("ours", "ours_scale") if n in out]:
        o["ratio_s_per_step_vs_trl"] = o["s_per_step"] / t["s_per_step"]
        o["ratio_cpu_s_per_step_vs_trl"] = o["cpu_s_per_step"] / t["cpu_s_per_step"]
        o["ratio_s_generation_vs_trl"] = o["s_generation"] / t["s_generation"]
        o["ratio_s_per_step_excl_generation_vs_trl"] = o["s_per_step_excl_generation"] / t["s_per_step_excl_generation"]
        o["round_ratio_s_per_step"] = [a / b for a, b in zip(o["round_s_per_step"], t["round_s_per_step"])]
    return out


def markdown_tables(summary: dict, runs: list[dict], before: dict, k: int) -> str:
    t = summary["trl"]
    rows = [
        (label, summary[n])
        for n, label in (
            ("ours", "ours (grpo.py's default: the plain path)"),
            (
                "ours_scale",
                "ours, the scale path (--padding_free --shared_prompt --chunked_lm_head --fuse_old_logprobs)",
            ),
            ("trl", "TRL GRPOTrainer"),
        )
        if n in summary
    ]
    head = [
        "trainer",
        "s/step",
        "× TRL (rounds)",
        "generation s",
        "× TRL",
        "excl. generation s",
        "× TRL",
        "CPU s/step",
        "× TRL",
        "peak RSS +MiB",
        "mean length",
        "train reward",
        f"avg@{k} before → after (mean)",
        "greedy before → after (mean)",
    ]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for name, s in rows:
        is_ours = s is not t
        rr = s.get("round_ratio_s_per_step", [])
        ratio = (
            f"{s['ratio_s_per_step_vs_trl']:.2f}" + (f" ({min(rr):.2f}–{max(rr):.2f})" if len(rr) > 1 else "")
            if is_ours
            else "1.00"
        )
        lines.append(
            "| "
            + " | ".join(
                [
                    name,
                    f"{s['s_per_step']:.3f}",
                    ratio,
                    f"{s['s_generation']:.3f}",
                    f"{s['ratio_s_generation_vs_trl']:.2f}" if is_ours else "1.00",
                    f"{s['s_per_step_excl_generation']:.3f}",
                    f"{s['ratio_s_per_step_excl_generation_vs_trl']:.2f}" if is_ours else "1.00",
                    f"{s['cpu_s_per_step']:.3f}",
                    f"{s['ratio_cpu_s_per_step_vs_trl']:.2f}" if is_ours else "1.00",
                    f"{s['peak_rss_increase_mib']:.0f}",
                    f"{s['mean_completion_length']:.1f}",
                    f"{s['mean_train_reward']:.3f}",
                    f"{before[f'avg@{k}']:.3f} → {s[f'mean_avg@{k}_after']:.3f}",
                    f"{before['greedy']:.3f} → {s['mean_greedy_after']:.3f}",
                ]
            )
            + " |"
        )
    lines += [
        "",
        "Where a step's seconds go (medians): generation = sampling (HF generate, decoding); grading = the "
        "verifier; θ_old forward = stage 4's old_logprobs (with each batch used once, on either path: the training "
        "forward with grad, whose graphs the update reuses; TRL: inside its update); update = loss, backward, "
        "clip, AdamW; other = the rest (advantages, "
        "tensors, bookkeeping).",
        "",
        "| trainer | generation | grading | θ_old forward | update | other | step |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, s in rows:
        b = s["breakdown_s"]
        lines.append(
            f"| {name} | {b['generation']:.3f} | {b['grading']:.3f} | {b['old_logprobs']:.3f} | "
            f"{b['update']:.3f} | {b['other']:.3f} | {s['s_per_step']:.3f} |"
        )
    lines += [
        "",
        "| round | seed | trainer | s/step | CPU s/step | train reward | avg@%d after | greedy after | run s |" % k,
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for i, r in enumerate(runs):
        st = r["steps"][1:]
        lines.append(
            f"| {i // len(rows) + 1} | {r['seed']} | {r['trainer']} | {median([s['step_time'] for s in st]):.3f} | "
            f"{median([s['cpu_step_time'] for s in st]):.3f} | "
            f"{statistics.fmean(s['reward'] for s in r['steps']):.3f} | {r['after'][f'avg@{k}']:.3f} | "
            f"{r['after']['greedy']:.3f} | {r['wall_time']:.0f} |"
        )
    return "\n".join(lines)


def _profile_text(path: str, n: int = 35) -> str:
    import pstats

    buf = io.StringIO()
    pstats.Stats(path, stream=buf).sort_stats("cumulative").print_stats(n)
    return buf.getvalue()


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    ap.add_argument("--steps", type=int, default=30, help="training steps per run (the first is not timed)")
    ap.add_argument(
        "--rounds", type=int, default=2, help="(ours, TRL, ours on the scale path) rounds; round r uses seed --seed + r"
    )
    ap.add_argument("--num_prompts_per_step", type=int, default=16)
    ap.add_argument("--num_generations", type=int, default=8)
    ap.add_argument("--max_completion_length", type=int, default=64)
    ap.add_argument("--learning_rate", type=float, default=3e-4, help="constant, no warm-up, in both")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--num_threads",
        type=int,
        default=1,
        help="torch CPU threads in every run's process (1 = what grpo.py picks for the toy)",
    )
    ap.add_argument("--eval_k", type=int, default=8, help="k of the held-out avg@k")
    ap.add_argument("--eval_limit", type=int, default=0, help="first N held-out problems (0 = all 200)")
    ap.add_argument("--eval_seed", type=int, default=12345, help="the evaluation's sampling seed (every run)")
    ap.add_argument(
        "--toy_warmup_steps",
        type=int,
        default=200,
        help="warm-up steps of the private toy model built when no cached one exists",
    )
    ap.add_argument(
        "--profile",
        action="store_true",
        help="after the benchmark, cProfile one more run of each trainer and print the top functions",
    )
    ap.add_argument(
        "--out",
        default=str(REPO / "tools" / "bench" / "results" / "vs_trl.json"),
        help="JSON results file ('' = do not write)",
    )
    ap.add_argument("--keep_runs", action="store_true", help="keep the runs' output folders (printed)")
    return ap


def main(argv=None) -> dict:
    args = build_parser().parse_args(argv)
    command = shlex.join(["python", *(sys.argv if argv is None else [__file__, *argv])])
    if args.steps < 2 or args.rounds < 1:
        raise SystemExit(f"{PROG}: error: --steps must be >= 2 (step 1 is not timed) and --rounds >= 1")
    os.environ["TQDM_DISABLE"] = "1"  # read by tqdm when imported: set before anything imports it
    try:
        import trl  # noqa: F401
    except ImportError:
        raise SystemExit(
            f"{PROG}: error: TRL is not installed; it is a benchmark-only dependency: "
            f"pip install -r requirements.txt -r tools/requirements-bench.txt"
        ) from None
    workdir = Path(tempfile.mkdtemp(prefix="vs_trl-"))
    model_path, model_info = _common.prepare_toy_model(workdir, args.toy_warmup_steps, PROG)
    base = {
        "model": model_path,
        "num_prompts_per_step": args.num_prompts_per_step,
        "num_generations": args.num_generations,
        "max_completion_length": args.max_completion_length,
        "steps": args.steps,
        "learning_rate": args.learning_rate,
        "num_threads": args.num_threads,
        "eval_k": args.eval_k,
        "eval_limit": args.eval_limit,
        "eval_seed": args.eval_seed,
    }
    load_start = os.getloadavg()
    t_start = time.time()
    print(
        f"[bench] {args.rounds} rounds × (ours, TRL, ours on the scale path) × {args.steps} steps of "
        f"{args.num_prompts_per_step}×"
        f"{args.num_generations} rollouts; {args.num_threads} torch thread(s); model {model_info['source']}",
        flush=True,
    )
    runs, profiles = [], {}
    pool = _common.forkserver_pool(PRELOAD)
    try:
        before = pool.apply(evaluate_only, ({**base},))
        print(
            f"[bench] before training: greedy {before['greedy']:.3f}, avg@{args.eval_k} "
            f"{before[f'avg@{args.eval_k}']:.3f} ({before['problems']} held-out problems, "
            f"{before['eval_seconds']:.0f}s)",
            flush=True,
        )
        for r in range(args.rounds):
            for name, fn in (("ours", run_ours), ("trl", run_trl), ("ours_scale", run_ours)):
                spec = {
                    **base,
                    "seed": args.seed + r,
                    "output_dir": str(workdir / f"r{r}_{name}"),
                    "scale": name == "ours_scale",  # --padding_free --shared_prompt --chunked_lm_head ...
                }
                res = pool.apply(fn, (spec,))
                runs.append(res)
                st = res["steps"][1:]
                print(
                    f"[bench] round {r + 1}/{args.rounds} {name:<11} median s/step "
                    f"{median([s['step_time'] for s in st]):.3f} (generation "
                    f"{median([s['generation_time'] for s in st]):.3f}, CPU "
                    f"{median([s['cpu_step_time'] for s in st]):.3f}), after: greedy "
                    f"{res['after']['greedy']:.3f} avg@{args.eval_k} {res['after'][f'avg@{args.eval_k}']:.3f}, "
                    f"run {res['wall_time']:.0f}s",
                    flush=True,
                )
        if args.profile:
            for name, fn in (("ours", run_ours), ("trl", run_trl)):
                path = str(workdir / f"profile_{name}.prof")
                spec = {
                    **base,
                    "seed": args.seed,
                    "output_dir": str(workdir / f"profile_{name}"),
                    "profile": path,
                    "eval_limit": 1,
                }
                pool.apply(fn, (spec,))
                profiles[name] = _profile_text(path)
                print(f"\n[profile] {name}\n{profiles[name]}")
    finally:
        pool.close()
        pool.join()
    total = time.time() - t_start
    k = args.eval_k
    summary = summarize(runs, k)
    same_prompts = all(
        runs[i]["prompts"] == runs[i + 1]["prompts"] == runs[i + 2]["prompts"] for i in range(0, len(runs) - 2, 3)
    )
    table = markdown_tables(summary, runs, before, k)
    o, t = summary["ours_scale"], summary["trl"]  # the goals: the scale path's (module docstring)
    speed_met = o["ratio_s_per_step_vs_trl"] <= GOAL_RATIO
    plain = summary["ours"]
    default_met = plain["ratio_s_per_step_vs_trl"] <= GOAL_RATIO_DEFAULT
    acc_met = o[f"mean_avg@{k}_after"] >= t[f"mean_avg@{k}_after"]
    print()
    print(table)
    print(
        f"\n{args.steps - 1} timed steps per run (step 1 excluded) × {args.rounds} rounds; medians over pooled "
        f"steps; (a–b) = range of the per-round ratio. Same prompts in the same order for every trainer: "
        f"{'yes' if same_prompts else 'NO'}. Torch threads: ours "
        f"{sorted({r['torch_threads'] for r in runs if r['trainer'] != 'trl'})}, TRL "
        f"{sorted({x for r in runs if r['trainer'] == 'trl' for x in r['torch_threads']})}. "
        f"Evaluation: {before['problems']} held-out problems, greedy + {k} samples at temperature 1.0, seed "
        f"{args.eval_seed}."
    )
    print(
        f"Goal of the default (the plain path): s/step ≤ {GOAL_RATIO_DEFAULT}× TRL: "
        f"{'met' if default_met else 'NOT met'} ({plain['ratio_s_per_step_vs_trl']:.2f}× wall, "
        f"{plain['ratio_cpu_s_per_step_vs_trl']:.2f}× CPU). "
        f"Goals of the scale path: s/step ≤ {GOAL_RATIO}× TRL: {'met' if speed_met else 'NOT met'} "
        f"({o['ratio_s_per_step_vs_trl']:.2f}× wall, {o['ratio_cpu_s_per_step_vs_trl']:.2f}× CPU). "
        f"Goal held-out avg@{k} after ≥ TRL's: {'met' if acc_met else 'NOT met'} "
        f"({o[f'mean_avg@{k}_after']:.3f} vs {t[f'mean_avg@{k}_after']:.3f}). "
        f"Total {total:.0f}s; load average {load_start[0]:.2f} -> {os.getloadavg()[0]:.2f}."
    )
    machine = _common.machine_description(EXTRA_PACKAGES)
    machine["load_average_start"], machine["load_average_end"] = list(load_start), list(os.getloadavg())
    trl_run = next(r for r in runs if r["trainer"] == "trl")
    result = {
        "benchmark": "vs_trl",
        "date": _common.now_iso(),
        "command": command,
        "python": sys.executable,
        "git": _common.git_state(),
        "machine": machine,
        "model": model_info,
        "settings": {**vars(args), "template": TEMPLATE},
        "trl_config": {
            k2: v
            for k2, v in trl_config({**base, "seed": args.seed, "output_dir": "<run>"}).to_dict().items()
            if k2 in TRL_KEYS
        },
        "trl_optimizer": trl_run.get("optimizer"),
        "trl_lr_scheduler": trl_run.get("lr_scheduler"),
        "memory_method": _common.MEMORY_METHOD_CPU + " (model load through the end of training)",
        "timing_method": {
            "ours": "metrics.jsonl step_time (generation_time: the rollout.generate part); CPU: "
            "time.process_time around grpo.train_step (ours: grpo.py's default, the plain path, θ_old from the "
            "update's forward; ours_scale: --padding_free --shared_prompt --chunked_lm_head --fuse_old_logprobs)",
            "trl": "TrainerCallback on_step_begin -> on_step_end (generation inside "
            "training_step/_prepare_inputs); generation: wrapper around trainer._generate; "
            "CPU: time.process_time over the same span",
        },
        "goals": {
            "speed": f"ours_scale s/step ≤ {GOAL_RATIO}× TRL's",
            "accuracy": f"ours_scale avg@{k} after ≥ TRL's",
            "speed_default": f"ours s/step ≤ {GOAL_RATIO_DEFAULT}× TRL's",
            "speed_met": speed_met,
            "speed_default_met": default_met,
            "accuracy_met": acc_met,
        },
        "same_prompts": same_prompts,
        "before": before,
        "summary": summary,
        "table_markdown": table,
        "total_seconds": total,
        "profiles": profiles or None,
        "runs": [{k2: v for k2, v in r.items() if k2 != "prompts"} for r in runs],
    }
    return _common.finish(result, args.out, workdir, args.keep_runs)


# the TRL settings recorded in the JSON (the ones that decide the equivalence)
TRL_KEYS = (
    "use_cpu",
    "bf16",
    "fp16",
    "per_device_train_batch_size",
    "gradient_accumulation_steps",
    "steps_per_generation",
    "generation_batch_size",
    "num_generations",
    "max_completion_length",
    "temperature",
    "top_p",
    "top_k",
    "learning_rate",
    "lr_scheduler_type",
    "warmup_steps",
    "warmup_ratio",
    "weight_decay",
    "adam_beta1",
    "adam_beta2",
    "adam_epsilon",
    "optim",
    "max_grad_norm",
    "epsilon",
    "epsilon_high",
    "loss_type",
    "beta",
    "scale_rewards",
    "num_iterations",
    "mask_truncated_completions",
    "gradient_checkpointing",
    "shuffle_dataset",
    "max_steps",
    "seed",
    "report_to",
    "save_strategy",
    "logging_strategy",
)


if __name__ == "__main__":
    main()
