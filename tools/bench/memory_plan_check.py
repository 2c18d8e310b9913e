"""The memory planner against measured peaks: memory_plan.plan's host prediction beside the peak RSS of real steps.

What it measures
----------------
For each configuration of ``CONFIGS`` (the toy model widened to hidden 128 ... 2,048 by ``tools/bench/memory.py``'s
``widen_toy_model``; full fine-tuning or LoRA, with and without dropout; gradient checkpointing or not; micro-batches
of the whole batch (stage 4's training forward kept for the update) or of 4, 8, 16 rows; GRPO, DelTA ``normal`` and
``memory_efficient``) one ``grpo.train`` run of ``--steps`` steps in a fresh process (``tools/bench/_common.run_one``):
every response runs to exactly ``max_completion_length`` tokens and each group gets half its rewards right
(``_common.install_patches``: T is fixed, every row has Â ≠ 0), learning rate 1e-30 (updates computed and applied,
weights unchanged), on the scale path (``_common.SCALE_PATH``, grpo.py's defaults when the recorded results were
made). Before its baseline the process runs a warm-up: the same settings on the toy, 1 prompt × 2
responses of 2 tokens, 2 steps, so that what a process pays once whatever the run's size (library code pages touched
for the first time, thread pools, the grader's workers: 40-55 MB) is not counted. Measured: the largest
``memory/peak_rss_gb`` over the steps (grpo.py logs each step's peak resident set, the counter reset when the step
starts) minus VmRSS just before ``grpo.train`` (before the model loads). Predicted: ``memory_plan.plan(...).peak_gb``
for the CPU (the CPU is the device: weights, gradients, AdamW, activations, the batch and DelTA's cache all count),
from the widened model's config.json and the run's settings, ``prompt_tokens`` the longest prompt of the toy's
training set (16 tokens).

glibc's allocator: "fixed" holds its mmap threshold at 128 KiB (``mallopt(M_MMAP_THRESHOLD)`` in the run's process,
as ``MALLOC_MMAP_THRESHOLD_=131072`` would), so that a freed tensor's pages go back to the OS and the resident set
follows the live bytes; "default" is glibc as it comes: after large frees its threshold grows (up to 32 MiB), and
freed blocks below it stay resident. The bound applies to "fixed"; the "default" rows measure the allocator's slack,
which the plan leaves out (a GPU's caching allocator has its own: ``memory_plan.CUDA_ALLOCATOR_SLACK``).

The bound, and why
------------------
``BOUND``: the prediction is within -15% / +25% of the measured peak, or within 25 MB of it when that is wider (the
small configurations). A band, not equality: the resident set also holds what the plan leaves out (the tokenizer,
the 5,000 training rows, the run folder's logs, torch's CPU kernels' scratch buffers, allocator blocks below the
threshold), and lacks what the plan over-counts on purpose: every prompt at the longest (the batch's are 14-16
tokens), the backward pass's working set (``gradient_flow_bytes``: the gradients alive at once were 0.6-1.15× of
it), zero-filled buffers a step never writes (not resident). Below the band is a missing term; above it, a useless
margin.

Results: a markdown table and ``--out`` (default ``tools/bench/results/memory_plan_check.json``) with the machine,
versions, commit, command, each run's steps and the prediction's stages. About 3 minutes on 2 CPU cores.

Usage::

    python tools/bench/memory_plan_check.py
    python tools/bench/memory_plan_check.py --tiny      # two small configurations, about a minute (tests/test_bench.py)
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from tools.bench import _common  # noqa: E402

# (name, hidden size, GRPOConfig overrides, allocator). Every run: 8 prompts × 8 responses of 32 tokens, 2 steps.
# "fixed": glibc's mmap threshold held at 128 KiB (``mallopt(M_MMAP_THRESHOLD)`` in the run's process, as
# ``MALLOC_MMAP_THRESHOLD_`` would), so that a freed tensor's pages go back to the OS and the resident set follows
# the live bytes; "default": glibc as it comes (its threshold grows up to 32 MiB after large frees, and freed blocks
# below it stay resident: the allocator's slack, which the plan leaves out).
CONFIGS = [
    ("h128 full", 128, {}, "fixed"),
    ("h512 full ckpt", 512, {"gradient_checkpointing": True}, "fixed"),
    ("h1024 lora mb8", 1024, {"use_peft": True, "lora_dropout": 0.0, "micro_batch_size": 8}, "fixed"),
    ("h2048 full", 2048, {}, "fixed"),
    ("h2048 full ckpt", 2048, {"gradient_checkpointing": True}, "fixed"),
    (
        "h1024 lora-dropout ckpt mb4",
        1024,
        {"use_peft": True, "gradient_checkpointing": True, "micro_batch_size": 4},
        "fixed",
    ),
    ("h1024 full delta mb8", 1024, {"credit": "delta", "micro_batch_size": 8}, "fixed"),
    (
        "h1024 lora delta-me mb16",
        1024,
        {
            "use_peft": True,
            "lora_dropout": 0.0,
            "credit": "delta",
            "delta_impl": "memory_efficient",
            "micro_batch_size": 16,
        },
        "fixed",
    ),
    ("h2048 full", 2048, {}, "default"),
    ("h2048 full ckpt", 2048, {"gradient_checkpointing": True}, "default"),
]
TINY = [
    ("h128 full", 128, {}, "fixed"),
    ("h256 lora ckpt mb4", 256, {"use_peft": True, "gradient_checkpointing": True, "micro_batch_size": 4}, "fixed"),
]
MMAP_THRESHOLD = 131072  # bytes: glibc's default before it adjusts itself
M_MMAP_THRESHOLD = -3  # mallopt's parameter number (malloc.h)
BOUND = {"low": -0.15, "high": 0.25, "abs_mb": 25}  # (predicted − measured) / measured, or |difference| in MB


def within_bound(predicted_mb: float, measured_mb: float) -> bool:
    rel = (predicted_mb - measured_mb) / measured_mb
    return BOUND["low"] <= rel <= BOUND["high"] or abs(predicted_mb - measured_mb) <= BOUND["abs_mb"]


def measure(spec: dict) -> dict:
    """A child process: the benchmark's patches, a warm-up (``spec["warmup"]``: the same settings on the toy, one
    prompt × 2 responses of 2 tokens, 2 steps: what a process pays once, whatever the run's size, is paid before
    the baseline: library code pages touched for the first time, thread pools, the grader's workers, peft's
    import), then the measured ``grpo.train`` run (``_common.run_one``: its baseline is VmRSS just before it)."""
    import ctypes

    import peft  # noqa: F401

    import grpo
    from trainer import grpo_config, policy

    if spec["allocator"] == "fixed" and not ctypes.CDLL(None).mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD):
        raise RuntimeError("mallopt(M_MMAP_THRESHOLD) failed")
    _common.install_patches(spec["patches"])
    r0 = policy.proc_status_kib("VmRSS")
    grpo.train(grpo_config.GRPOConfig(**{"recipe": "toy", **spec["warmup"]}))
    out = _common.run_one({"config": spec["config"]})
    out["warmup_rss_increase_mb"] = (policy.proc_status_kib("VmRSS") - r0) * 1024 / 1e6 if r0 else None
    return out


def longest_prompt_tokens(model_path: str) -> int:
    """The longest training prompt of the toy in tokens, as the rollout encodes it."""
    from transformers import AutoTokenizer

    import rollout
    import toy
    from trainer import problems

    toy.register_data()  # problems.load_problems("toy") reads the toy's split once toy/ registered it
    tok = AutoTokenizer.from_pretrained(model_path)
    return max(
        len(tok(rollout.apply_template(r["problem"], "none"))["input_ids"])
        for r in problems.load_problems("toy", split="train")
    )


def predict(model_path: str, config: dict, prompt_tokens: int):
    from trainer import grpo_config, memory_plan

    cfg = grpo_config.GRPOConfig(**{"recipe": "toy", **config})
    model_config = memory_plan.read_model_config(model_path)
    return memory_plan.plan(model_config, cfg, prompt_tokens=prompt_tokens, traits=_common.plan_traits(cfg.credit))


def markdown_table(rows: list) -> str:
    head = [
        "configuration",
        "glibc",
        "rows/micro-batch",
        "measured MB",
        "predicted MB",
        "predicted − measured",
        "peak stage",
        "within the bound",
    ]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        lines.append(
            "| "
            + " | ".join(
                [
                    r["name"],
                    r["allocator"],
                    str(r["rows_per_micro_batch"]),
                    f"{r['measured_mb']:.0f}",
                    f"{r['predicted_mb']:.0f}",
                    f"{r['predicted_mb'] - r['measured_mb']:+.0f} MB ({r['relative']:+.0%})",
                    r["peak_stage"],
                    ("yes" if r["within_bound"] else "**no**") if r["allocator"] == "fixed" else "(glibc's slack)",
                ]
            )
            + " |"
        )
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    ap.add_argument("--tiny", action="store_true", help="two small configurations (a smoke test)")
    ap.add_argument("--steps", type=int, default=2, help="steps per run (the peak is over all of them)")
    ap.add_argument("--num_prompts_per_step", type=int, default=8)
    ap.add_argument("--num_generations", type=int, default=8)
    ap.add_argument("--max_completion_length", type=int, default=32, help="every response has exactly this length")
    ap.add_argument(
        "--out",
        default=str(REPO / "tools" / "bench" / "results" / "memory_plan_check.json"),
        help="JSON results ('' = none)",
    )
    ap.add_argument("--keep_runs", action="store_true", help="keep the runs' folders (printed)")
    return ap


def main(argv=None) -> dict:
    args = build_parser().parse_args(argv)
    command = shlex.join(["python", *(sys.argv if argv is None else [__file__, *argv])])
    os.environ["TQDM_DISABLE"] = "1"  # before the fork server imports tqdm
    from tools.bench.memory import widen_toy_model

    configs = TINY if args.tiny else CONFIGS
    if args.tiny:
        args.num_prompts_per_step, args.max_completion_length = 4, 16
    workdir = Path(tempfile.mkdtemp(prefix="memory_plan_check-"))
    toy_path, toy_info = _common.prepare_toy_model(workdir, 200, "memory_plan_check.py")
    models = {
        h: toy_path if h == 128 else widen_toy_model(toy_path, str(workdir / f"toy_h{h}"), h)
        for h in sorted({c[1] for c in configs})
    }
    prompt_tokens = longest_prompt_tokens(toy_path)
    base_cfg = dict(
        prompt_template="none",
        num_prompts_per_step=args.num_prompts_per_step,
        num_generations=args.num_generations,
        max_completion_length=args.max_completion_length,
        max_steps=args.steps,
        learning_rate=1e-30,
        eval_num_generations=0,
        save_steps=0,
        logging_steps=0,
        **_common.SCALE_PATH,  # the path of the recorded results (grpo.py's default then)
    )
    patches = {"no_stop": True, "random_rewards": 0, "num_generations": args.num_generations}
    rows, t_start = [], time.time()
    pool = _common.forkserver_pool(_common.PRELOAD + ["peft"])
    try:
        for i, (name, hidden, over, allocator) in enumerate(configs):
            config = {**base_cfg, **over, "model": models[hidden], "output_dir": str(workdir / f"run{i}")}
            p = predict(models[hidden], config, prompt_tokens)
            warmup = {
                **config,
                "model": toy_path,
                "num_prompts_per_step": 1,
                "num_generations": 2,
                "max_completion_length": 2,
                "output_dir": config["output_dir"] + "_warmup",
            }
            res = pool.apply(
                measure, ({"config": config, "warmup": warmup, "patches": patches, "allocator": allocator},)
            )
            peak_gb = max(s["memory/peak_rss_gb"] for s in res["steps"])
            measured_mb = (peak_gb * 1e9 - res["rss_before_mib"] * 2**20) / 1e6
            predicted_mb = p.peak_gb * 1e3
            row = {
                "name": name,
                "hidden": hidden,
                "overrides": over,
                "allocator": allocator,
                "measured_mb": measured_mb,
                "predicted_mb": predicted_mb,
                "relative": (predicted_mb - measured_mb) / measured_mb,
                "within_bound": within_bound(predicted_mb, measured_mb),
                "peak_stage": p.peak_stage,
                "rows_per_micro_batch": p.parts["rows_per_micro_batch"],
                "fused": p.parts["fused"],
                "stages_mb": {s.name: round(s.device_gb * 1e3, 1) for s in p.stages},
                "baseline_rss_mb": res["rss_before_mib"] * 2**20 / 1e6,
                "per_step_peak_rss_mb": [s["memory/peak_rss_gb"] * 1e3 for s in res["steps"]],
                "run_seconds": res["wall_time"],
                "warmup_rss_increase_mb": res["warmup_rss_increase_mb"],
            }
            rows.append(row)
            print(
                f"[memory_plan_check] {name:<28} {allocator:<8} measured {measured_mb:7.0f} MB, predicted "
                f"{predicted_mb:7.0f} MB ({row['relative']:+.0%}, {p.peak_stage}), run {res['wall_time']:.0f}s",
                flush=True,
            )
    finally:
        pool.close()
    table = markdown_table(rows)
    bound = (
        f"bound (glibc fixed): predicted within {BOUND['low']:+.0%} / {BOUND['high']:+.0%} of measured, or within "
        f"{BOUND['abs_mb']} MB"
    )
    fixed = [r for r in rows if r["allocator"] == "fixed"]
    print(
        f"\n{table}\n\n{bound}; {sum(r['within_bound'] for r in fixed)} of {len(fixed)} within. "
        f"Total {time.time() - t_start:.0f}s."
    )
    result = {
        "benchmark": "memory_plan_check",
        "date": _common.now_iso(),
        "command": command,
        "git": _common.git_state(),
        "machine": _common.machine_description(("peft",)),
        "model": toy_info,
        "prompt_tokens": prompt_tokens,
        "bound": BOUND,
        "method": {
            "measured": "max over steps of memory/peak_rss_gb minus VmRSS just before grpo.train "
            "(after imports), fresh forked process per run; glibc 'fixed': "
            f"mallopt(M_MMAP_THRESHOLD, {MMAP_THRESHOLD}), 'default': glibc's own",
            "predicted": "memory_plan.plan(read_model_config(model), cfg, prompt_tokens).peak_gb, CPU as the device",
        },
        "settings": {**vars(args), "train_config": base_cfg, "patches": patches},
        "rows": rows,
        "table_markdown": table,
        "all_within_bound": all(r["within_bound"] for r in rows if r["allocator"] == "fixed"),
        "total_seconds": time.time() - t_start,
    }
    return _common.finish(result, args.out, workdir, args.keep_runs)


if __name__ == "__main__":
    main()
