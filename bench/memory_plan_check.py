"""The memory planner against measured peaks: memory_plan.plan's host prediction beside the peak RSS of real steps.

What it measures
----------------
For each configuration of ``CONFIGS`` (the toy model widened to hidden 128 ... 2,048 by ``bench/memory.py``'s
``widen_toy_model``; full fine-tuning or LoRA; gradient checkpointing or not; micro-batches of the whole batch or
of a few rows; GRPO, DelTA ``normal`` and ``memory_efficient``) one fresh ``grpo.train`` run of ``--steps`` steps in
a fresh process (``bench/_common.run_one``): every response runs to exactly ``max_completion_length`` tokens and
each group gets half its rewards right (``_common.install_patches``: T is fixed, every row has Â ≠ 0), learning
rate 1e-30 (updates computed and applied, weights unchanged). The process imports torch, transformers, peft and the
project before anything is measured; its baseline is its resident set just before ``grpo.train`` (before the model
loads). Measured: the largest ``memory/peak_rss_gb`` over the steps (grpo.py logs each step's peak resident set,
the counter reset when the step starts) minus that baseline. Predicted: ``memory_plan.plan(...).peak_gb`` for the CPU
(the CPU is the device: weights, gradients, AdamW, activations, the batch and DelTA's cache all count), from the
widened model's config.json and the run's settings, with ``prompt_tokens`` the longest prompt of the toy's training
set (16 tokens).

The bound, and why
------------------
``BOUND``: the prediction is within -15% / +25% of the measured peak, or within 25 MB of it when that is wider (the
small configurations). Why a band and not equality: the measured resident set also holds what the plan leaves out:
glibc keeps freed blocks (a step frees and reallocates the same sizes: the peak is the live bytes plus the arena's
free space; at most a few tens of MB here), the tokenizer, the 5,000 training rows, the run folder's logs, torch's
CPU kernels' scratch buffers; and it lacks what the plan over-counts on purpose: every response at the longest
prompt (the batch's prompts are 14-16 tokens), one worst-case backward working set (the gradients alive at once
are 0.6-1.0× of ``gradient_flow_bytes`` on the CPU allocator's live-byte count), pages of zero-filled buffers that a
step never touches (calloc'd, not resident). The plan is an upper bound by design where it can be: a prediction
below the measurement by more than the band is a missing term, above by more than the band a useless margin.

Results: a markdown table and ``--out`` (default ``bench/results/memory_plan_check.json``) with the machine,
versions, commit, command, each run's steps and the prediction's stages. About 6 minutes on 2 CPU cores.

Usage::

    python bench/memory_plan_check.py
    python bench/memory_plan_check.py --tiny      # two small configurations, about a minute (tests/test_bench.py)
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench import _common  # noqa: E402

# (name, hidden size, GRPOConfig overrides, allocator). Every run: 8 prompts × 8 responses of 32 tokens, 2 steps.
# "fixed": glibc's mmap threshold held at 128 KiB (``MALLOC_MMAP_THRESHOLD_``), so that a freed tensor's pages go
# back to the OS and the resident set follows the live bytes; "default": glibc as it comes (its threshold grows
# to 32 MiB after the first large free, and freed blocks below it stay resident: the allocator's slack).
CONFIGS = [
    ("h128 full", 128, {}, "fixed"),
    ("h512 full ckpt", 512, {"gradient_checkpointing": True}, "fixed"),
    ("h1024 lora mb8", 1024, {"use_peft": True, "lora_dropout": 0.0, "micro_batch_size": 8}, "fixed"),
    ("h2048 full", 2048, {}, "fixed"),
    ("h2048 full ckpt", 2048, {"gradient_checkpointing": True}, "fixed"),
    ("h1024 lora-dropout ckpt mb4", 1024, {"use_peft": True, "gradient_checkpointing": True, "micro_batch_size": 4},
     "fixed"),
    ("h1024 full delta mb8", 1024, {"credit": "delta", "micro_batch_size": 8}, "fixed"),
    ("h1024 lora delta-me mb16", 1024, {"use_peft": True, "lora_dropout": 0.0, "credit": "delta",
                                        "delta_impl": "memory_efficient", "micro_batch_size": 16}, "fixed"),
    ("h2048 full ckpt", 2048, {"gradient_checkpointing": True}, "default"),
]
TINY = [("h128 full", 128, {}, "fixed"),
        ("h256 lora ckpt mb4", 256, {"use_peft": True, "gradient_checkpointing": True, "micro_batch_size": 4}, "fixed")]
MMAP_THRESHOLD = "131072"  # glibc's default before it adjusts itself
BOUND = {"low": -0.15, "high": 0.25, "abs_mb": 25}  # (predicted − measured) / measured, or |difference| in MB


def within_bound(predicted_mb: float, measured_mb: float) -> bool:
    rel = (predicted_mb - measured_mb) / measured_mb
    return BOUND["low"] <= rel <= BOUND["high"] or abs(predicted_mb - measured_mb) <= BOUND["abs_mb"]


def measure(spec: dict) -> dict:
    """A child process: the benchmark's patches, a warm-up (``spec["warmup"]``: the same settings on the toy, one
    prompt × 2 responses of 2 tokens, 2 steps: what a process pays once, whatever the run's size, is paid before
    the baseline: library code pages touched for the first time, thread pools, the grader's workers, peft's
    import), then the measured ``grpo.train`` run (``_common.run_one``: its baseline is VmRSS just before it)."""
    import peft  # noqa: F401

    import grpo
    import policy

    _common.install_patches(spec["patches"])
    r0 = policy.proc_status_kib("VmRSS")
    grpo.train(grpo.GRPOConfig(**spec["warmup"]))
    out = _common.run_one({"config": spec["config"]})
    out["warmup_rss_increase_mb"] = (policy.proc_status_kib("VmRSS") - r0) * 1024 / 1e6 if r0 else None
    return out


def longest_prompt_tokens(model_path: str) -> int:
    """The longest training prompt of the toy in tokens, as the rollout encodes it."""
    from transformers import AutoTokenizer

    import evaluate
    import rollout

    tok = AutoTokenizer.from_pretrained(model_path)
    return max(len(tok(rollout.apply_template(r["problem"], "none"))["input_ids"])
               for r in evaluate.load_problems("toy", split="train"))


def predict(model_path: str, config: dict, prompt_tokens: int):
    import grpo
    import memory_plan

    cfg = grpo.GRPOConfig(**config)
    return memory_plan.plan(memory_plan.read_model_config(model_path), cfg, prompt_tokens=prompt_tokens)


def markdown_table(rows: list) -> str:
    head = ["configuration", "glibc", "rows/micro-batch", "measured MB", "predicted MB", "predicted − measured",
            "peak stage", "within bound"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        lines.append("| " + " | ".join([
            r["name"], r["allocator"], str(r["rows_per_micro_batch"]), f"{r['measured_mb']:.0f}",
            f"{r['predicted_mb']:.0f}", f"{r['predicted_mb'] - r['measured_mb']:+.0f} MB ({r['relative']:+.0%})",
            r["peak_stage"], "yes" if r["within_bound"] else "**no**"]) + " |")
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("--tiny", action="store_true", help="two small configurations (a smoke test)")
    ap.add_argument("--steps", type=int, default=2, help="steps per run (the peak is over all of them)")
    ap.add_argument("--num_prompts_per_step", type=int, default=8)
    ap.add_argument("--num_generations", type=int, default=8)
    ap.add_argument("--max_completion_length", type=int, default=32, help="every response has exactly this length")
    ap.add_argument("--out", default=str(REPO / "bench" / "results" / "memory_plan_check.json"),
                    help="JSON results ('' = none)")
    ap.add_argument("--keep_runs", action="store_true", help="keep the runs' folders (printed)")
    return ap


def main(argv=None) -> dict:
    args = build_parser().parse_args(argv)
    command = shlex.join(["python", *(sys.argv if argv is None else [__file__, *argv])])
    os.environ["TQDM_DISABLE"] = "1"  # before the fork server imports tqdm
    from bench.memory import widen_toy_model

    configs = TINY if args.tiny else CONFIGS
    if args.tiny:
        args.num_prompts_per_step, args.max_completion_length = 4, 16
    workdir = Path(tempfile.mkdtemp(prefix="memory_plan_check-"))
    toy_path, toy_info = _common.prepare_toy_model(workdir, 200, "memory_plan_check.py")
    models = {h: toy_path if h == 128 else widen_toy_model(toy_path, str(workdir / f"toy_h{h}"), h)
              for h in sorted({c[1] for c in configs})}
    prompt_tokens = longest_prompt_tokens(toy_path)
    base_cfg = dict(prompt_template="none", num_prompts_per_step=args.num_prompts_per_step,
                    num_generations=args.num_generations, max_completion_length=args.max_completion_length,
                    max_steps=args.steps, learning_rate=1e-30, eval_num_generations=0, save_steps=0,
                    logging_steps=0)
    patches = {"no_stop": True, "random_rewards": 0, "group_size": args.num_generations}
    rows, t_start = [], time.time()
    pools = {}
    try:
        for i, (name, hidden, over, allocator) in enumerate(configs):
            config = {**base_cfg, **over, "model": models[hidden], "output_dir": str(workdir / f"run{i}")}
            p = predict(models[hidden], config, prompt_tokens)
            if allocator not in pools:  # the fork server (and every run it forks) starts with this environment
                os.environ.pop("MALLOC_MMAP_THRESHOLD_", None)
                if allocator == "fixed":
                    os.environ["MALLOC_MMAP_THRESHOLD_"] = MMAP_THRESHOLD
                pools[allocator] = _common.forkserver_pool(_common.PRELOAD + ["peft"])
            warmup = {**config, "model": toy_path, "num_prompts_per_step": 1, "num_generations": 2,
                      "max_completion_length": 2, "output_dir": config["output_dir"] + "_warmup"}
            res = pools[allocator].apply(measure, ({"config": config, "warmup": warmup, "patches": patches},))
            peak_gb = max(s["memory/peak_rss_gb"] for s in res["steps"])
            measured_mb = (peak_gb * 1e9 - res["rss_before_mib"] * 2**20) / 1e6
            predicted_mb = p.peak_gb * 1e3
            row = {"name": name, "hidden": hidden, "overrides": over, "allocator": allocator, "measured_mb": measured_mb,
                   "predicted_mb": predicted_mb, "relative": (predicted_mb - measured_mb) / measured_mb,
                   "within_bound": within_bound(predicted_mb, measured_mb), "peak_stage": p.peak_stage,
                   "rows_per_micro_batch": p.parts["rows_per_micro_batch"], "fused": p.parts["fused"],
                   "stages_mb": {s.name: round(s.device_gb * 1e3, 1) for s in p.stages},
                   "baseline_rss_mb": res["rss_before_mib"] * 2**20 / 1e6,
                   "per_step_peak_rss_mb": [s["memory/peak_rss_gb"] * 1e3 for s in res["steps"]],
                   "run_seconds": res["wall_time"], "warmup_rss_increase_mb": res["warmup_rss_increase_mb"]}
            rows.append(row)
            print(f"[memory_plan_check] {name:<28} {allocator:<8} measured {measured_mb:7.0f} MB, predicted {predicted_mb:7.0f} MB "
                  f"({row['relative']:+.0%}, {p.peak_stage}), run {res['wall_time']:.0f}s", flush=True)
    finally:
        for pool in pools.values():
            pool.close()
        os.environ.pop("MALLOC_MMAP_THRESHOLD_", None)
    table = markdown_table(rows)
    bound = (f"bound (glibc fixed): predicted within {BOUND['low']:+.0%} / {BOUND['high']:+.0%} of measured, or within "
             f"{BOUND['abs_mb']} MB")
    print(f"\n{table}\n\n{bound}; {sum(r['within_bound'] for r in rows)} of {len(rows)} within. "
          f"Total {time.time() - t_start:.0f}s.")
    result = {"benchmark": "memory_plan_check", "date": _common.now_iso(), "command": command,
              "git": _common.git_state(), "machine": _common.machine_description(("peft",)),
              "model": toy_info, "prompt_tokens": prompt_tokens, "bound": BOUND,
              "method": {"measured": "max over steps of memory/peak_rss_gb minus VmRSS just before grpo.train "
                                     "(after imports), fresh forked process per run; glibc 'fixed': "
                                     f"MALLOC_MMAP_THRESHOLD_={MMAP_THRESHOLD}, 'default': glibc's own",
                         "predicted": "memory_plan.plan(read_model_config(model), cfg, prompt_tokens).peak_gb, "
                                      "CPU as the device"},
              "settings": {**vars(args), "train_config": base_cfg, "patches": patches},
              "rows": rows, "table_markdown": table,
              "all_within_bound": all(r["within_bound"] for r in rows if r["allocator"] == "fixed"),
              "total_seconds": time.time() - t_start}
    return _common.finish(result, args.out, workdir, args.keep_runs)


if __name__ == "__main__":
    main()
