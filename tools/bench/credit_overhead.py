"""Cost of token credit assignment and of every comparison rule: each against DAPO/GRPO, same steps, side by side.

What it measures
----------------
For each row it runs ``grpo.train`` for ``--steps`` steps with the same model, data, seed and therefore the same
prompts. The rows are the comparison rules of tools/bench/reproduce.py's ``RULES`` (``--rules``, default: every one of
them; ``dapo``, the row without flags, i.e. ``--credit grpo --loss_type dapo``, is the baseline of every ratio),
each run with its rule's flags exactly as ``RULES`` gives them (parsed by ``python -m comparisons``' own parser:
grpo.py's flags and the comparisons'), at ``--num_mini_batches`` 4 by default (reproduce.py's toy setting, the
paper's four mini-batches per step: with one, FIPO is DAPO and Forking Tokens rank θ_old's entropies). Every row
takes ``--path`` (default ``scale``: the scale path's four flags, ``_common.SCALE_FLAGS``, grpo.py's defaults when
the recorded results were made; ``plain``: grpo.py's default now, the padded forward). The interface before the
rules still works: ``--credits grpo,delta,cscr`` is an alias for the rows ``dapo, delta, cscr``, every ``delta``
entry run once per ``--delta_impls`` (default ``normal,memory_efficient``), at ``--num_mini_batches`` 1 as before.
By default (``--learning_rate 1e-30``, see its help) the updates are computed and applied but leave the float32
weights unchanged, so every rule also gets the identical rollouts at every step and the comparison is shape for
shape (the output says whether that held); every rule's own computation still runs in full (e.g. FIPO's future-KL
weight and Forking Tokens' entropies and masks, whose values are those of a policy that did not move). The runs are
INTERLEAVED, ``dapo, delta, cscr, ..., dapo, delta, ...`` (the order of ``--rules``) for ``--repeats`` rounds, so a
slow drift of the machine's load hits every row alike; an untimed warm-up round (2 steps per row) comes first
(``--no-warmup_round`` skips it). Each run is a fresh ``train()`` in a fresh process
(forked from a fork server that has already imported torch/transformers, so a run starts in about a second).

Where each rule's cost lives: DelTA's variants (the top-K proxy too: v from h and the LM head) and CSCR's in the
credit function (the run's ``Method.credit``, timed on its own below); SAPO, FIPO and Forking Tokens in the policy
update (their loss stages and surrogates, comparisons/; Forking Tokens' default mini-batch entropy pool adds one
no-grad forward per mini-batch), so for them the credit-hook column shows GRPO's broadcast and the whole step's
seconds carry the difference.

Per step it reads ``metrics.jsonl`` (``step_time``: the whole step; ``generation_time``: the rollout part) and,
through a timing subclass of the run's credit function made in the child process only (``_common.timed_credit``;
grpo.py is not changed), the time of the credit hook itself. The first step of every run is excluded (warm-up: grading
worker start, allocator growth, first-call overheads). Reported per row, over the pooled remaining steps:

* median seconds per step, and the ratio of medians against DAPO/GRPO's (the ``dapo`` row of the same run);
* median seconds per step excluding generation (``step_time − generation_time``: old log-probs, credit,
  forward/backward, optimizer, grading, logging), where the credit overhead lives, and its ratio;
* the same two medians in CPU seconds of the run's process (``time.process_time`` from the step's
  ``rollout.generate`` call to its ``write_samples`` call, through wrappers installed in the child only):
  much less sensitive than wall time to other processes sharing the cores, but blind to the grading worker
  (a separate process doing the same work for every credit);
* median seconds in the credit hook (DelTA: λ̄ from the cached hidden states; CSCR: the two conditioned
  forward passes + weights; GRPO: a broadcast);
* the spread of the per-round ratio (each round's median against the same round's DAPO median), which shows
  how much of a ratio is noise;
* peak memory. CPU: the increase of the process's resident set during ``train()``: the peak RSS counter
  (``VmHWM``) is reset just before ``train()`` by writing ``5`` to ``/proc/self/clear_refs`` and read after
  it, minus ``VmRSS`` before it (falls back to ``ru_maxrss`` if the reset is refused). Unlike tracemalloc it
  sees torch's allocations; it includes everything ``train()`` allocates (data, model, optimizer, activations,
  glibc caching), so it is an honest upper bound of the working set, identical in kind for every credit.
  CUDA: ``torch.cuda.max_memory_allocated`` over ``train()`` (reset before it).

Goals checked (reported, never enforced), on the rows ``delta`` and ``cscr``: DelTA ≤ 1.10× GRPO seconds per
step, CSCR ≤ 1.6× (wall clock; the CPU-time verdict is shown next to it). The other rules have no goal: their
ratios are reported as measured.

Results: a markdown table on stdout and a JSON file (``--out``, default ``tools/bench/results/credit_overhead.json``)
with the machine (CPU model, cores, torch threads, load average, GPU), library versions, git commit, date,
the exact command, the configuration, every row's flags and config overrides, every step's raw timings and
the summary.

Usage::

    python tools/bench/credit_overhead.py                  # every rule of RULES (27 rows) × 3 rounds × 6 steps
    python tools/bench/credit_overhead.py --rules dapo,fipo,dapo_ft,sapo --steps 4 --repeats 2
    python tools/bench/credit_overhead.py --credits grpo,delta,cscr   # the three credits, as before the rules
    python tools/bench/credit_overhead.py --profile cscr   # cProfile one extra run, print the top functions

With ``--model toy`` the warmed-up toy model (``toy.model_folder()``: the shipped toy/model/, else the cache) is
copied to a private temporary folder first, so a concurrent rebuild of the cache cannot change the model
mid-benchmark; if there is none, a benchmark-only one is built once with ``--toy_warmup_steps`` supervised steps
(default 200: the cost of a step hardly depends on the warm-up, but reward must be non-zero somewhere, or
zero-advantage batches skip the credit code paths) and kept under ``$TMPDIR/credit_overhead_toy/`` for later runs.
"""

from __future__ import annotations

import argparse
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

from tools.bench import _common  # noqa: E402  (shared benchmark helpers: run_one, memory, provenance)
from tools.bench._common import PRELOAD, git_state, machine_description, median, run_one  # noqa: E402,F401

if str(REPO / "tools" / "bench") not in sys.path:  # tools/bench/reproduce.py imports its helpers as a script does
    sys.path.insert(0, str(REPO / "tools" / "bench"))
from reproduce import RULES, TOY  # noqa: E402  (the comparison rules: name, table, flags, paper, what)

BASELINE = "dapo"  # RULES' DAPO row (no flags: --credit grpo, --loss_type dapo), every ratio's denominator
CREDIT_ROWS = {"grpo": "dapo", "delta": "delta", "cscr": "cscr"}  # --credits' names -> RULES' rows

GOALS = {"delta": 1.10, "cscr": 1.6}  # max allowed s/step ratio against DAPO/GRPO (whole step), rows delta and cscr


def prepare_model(args, workdir: Path) -> tuple[str, dict]:
    """The model path every run loads, and a description of where it came from.

    ``--model toy``: a private copy of the toy model (``toy.model_folder()``), or, when there is none, of a
    benchmark-only toy built with ``--toy_warmup_steps`` warm-up steps (see ``_common.prepare_toy_model``).
    """
    if args.model != "toy":
        return args.model, {"source": args.model}
    return _common.prepare_toy_model(workdir, args.toy_warmup_steps, "credit_overhead.py")


def rule_overrides(flags: list[str]) -> dict:
    """The config fields a rule's flags set (``python -m comparisons``' own parser: grpo.py's flags and the
    comparisons', so the flags mean exactly what they mean on its command line); a bad flag stops with the parser's
    one-line error."""
    import comparisons
    from trainer import grpo_config

    return vars(grpo_config.build_parser(comparisons.config_class(), defaults=False).parse_args(flags))


def row_specs(args) -> list[tuple[str, dict]]:
    """(row name, config overrides) for every benchmarked row, in schedule order.

    ``--rules``: RULES' names, each row its rule's flags exactly (``rule_overrides``). ``--credits`` (the interface
    before --rules): grpo, delta, cscr as RULES' rows dapo, delta, cscr, every ``delta`` once per ``--delta_impls``."""
    flags = {name: f for name, _, f, _, _ in RULES}
    rows = []
    if args.credits is not None and args.rules is not None:
        raise SystemExit(
            "credit_overhead.py: error: give --rules or --credits (its alias for dapo, delta, cscr), not both"
        )
    if args.credits is not None:
        for credit in args.credits.split(","):
            credit = credit.strip()
            if credit not in CREDIT_ROWS:
                raise SystemExit(
                    f"credit_overhead.py: error: unknown credit {credit!r} in --credits (grpo, delta, "
                    "cscr; --rules takes every rule of tools/bench/reproduce.py)"
                )
            if credit == "delta":
                for impl in args.delta_impls.split(","):
                    if impl not in ("normal", "memory_efficient"):
                        raise SystemExit(
                            f"credit_overhead.py: error: unknown DelTA implementation {impl!r} in "
                            "--delta_impls (normal, memory_efficient)"
                        )
                    name = "delta" if impl == "normal" else f"delta[{impl}]"
                    rows.append((name, {**rule_overrides(flags["delta"]), "delta_impl": impl}))
            else:
                rows.append((CREDIT_ROWS[credit], rule_overrides(flags[CREDIT_ROWS[credit]])))
        return rows
    names = [n.strip() for n in (args.rules or ",".join(flags)).split(",") if n.strip()]
    unknown = [n for n in names if n not in flags]
    if unknown:
        raise SystemExit(
            f"credit_overhead.py: error: --rules: unknown {unknown} (tools/bench/reproduce.py's RULES: "
            f"{', '.join(flags)})"
        )
    return [(name, rule_overrides(flags[name])) for name in dict.fromkeys(names)]


def row_flags(name: str) -> list[str]:
    """A row's flags: its rule's (RULES), and ``--delta_impl`` for --credits' ``delta[<impl>]`` rows (the path's
    flags, ``--path``, come on top for every row: the settings' ``train_config``)."""
    rule, _, impl = name.partition("[")
    return next(f for n, _, f, _, _ in RULES if n == rule) + (["--delta_impl", impl.rstrip("]")] if impl else [])


def summarize(runs: dict, baseline: str) -> dict:
    """Per row: medians over pooled steps (first step of every run dropped), ratios vs ``baseline``."""
    out = {}
    for name, rs in runs.items():
        steps = [s for r in rs for s in r["steps"][1:]]
        per_round = [[s for s in r["steps"][1:]] for r in rs]
        out[name] = {
            "steps_timed": len(steps),
            "s_per_step": median([s["step_time"] for s in steps]),
            "s_per_step_train": median([s["step_time"] - s["generation_time"] for s in steps]),
            "s_generation": median([s["generation_time"] for s in steps]),
            "cpu_s_per_step": median([s["cpu_step_time"] for s in steps]),
            "cpu_s_per_step_train": median([s["cpu_step_time"] - s["cpu_generation_time"] for s in steps]),
            "s_credit_hook": median([s.get("credit_time", float("nan")) for s in steps]),
            "round_s_per_step": [median([s["step_time"] for s in st]) for st in per_round],
            "round_s_per_step_train": [median([s["step_time"] - s["generation_time"] for s in st]) for st in per_round],
            "mean_completion_length": statistics.fmean(s["completions/mean_length"] for s in steps) if steps else None,
            "mean_reward": statistics.fmean(s["reward"] for s in steps) if steps else None,
            "mean_rows_nonzero_adv": statistics.fmean(s.get("rows_nonzero_adv", 0) for s in steps) if steps else None,
            "peak_rss_increase_mib": median([r["peak_rss_increase_mib"] for r in rs]),
            "cuda_max_allocated_mib": (
                median([r["cuda_max_allocated_mib"] for r in rs])
                if rs and rs[0]["cuda_max_allocated_mib"] is not None
                else None
            ),
        }
    base = out.get(baseline)
    for name, s in out.items():
        if base is None:
            continue
        s["ratio_s_per_step"] = s["s_per_step"] / base["s_per_step"]
        s["ratio_s_per_step_train"] = s["s_per_step_train"] / base["s_per_step_train"]
        s["ratio_cpu_s_per_step"] = s["cpu_s_per_step"] / base["cpu_s_per_step"]
        s["ratio_cpu_s_per_step_train"] = s["cpu_s_per_step_train"] / base["cpu_s_per_step_train"]
        s["round_ratio_s_per_step"] = [a / b for a, b in zip(s["round_s_per_step"], base["round_s_per_step"])]
        s["round_ratio_s_per_step_train"] = [
            a / b for a, b in zip(s["round_s_per_step_train"], base["round_s_per_step_train"])
        ]
        mem, bmem = (
            ("cuda_max_allocated_mib", base["cuda_max_allocated_mib"])
            if base["cuda_max_allocated_mib"]
            else ("peak_rss_increase_mib", base["peak_rss_increase_mib"])
        )
        s["ratio_memory"] = s[mem] / bmem if bmem else None
        goal = GOALS.get(name.split("[")[0])
        if goal is not None:
            s["goal_ratio_s_per_step"] = goal
            s["goal_met"] = s["ratio_s_per_step"] <= goal  # the goal is on wall-clock seconds per step
            s["goal_met_cpu_time"] = s["ratio_cpu_s_per_step"] <= goal
    return out


def markdown_table(summary: dict, cuda: bool) -> str:
    mem = "CUDA max alloc MiB" if cuda else "peak RSS +MiB"
    head = [
        "rule",
        "s/step",
        "× DAPO (rounds)",
        "s/step excl. gen",
        "× DAPO (rounds)",
        "CPU s/step",
        "× DAPO",
        "CPU s/step excl. gen",
        "× DAPO",
        "credit hook s",
        mem,
        "mean len",
        "rows Â≠0",
        "goal (wall / CPU)",
    ]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]

    def ratio(s, key, rounds=None):
        x = s.get(key)
        if x is None:
            return ""
        xs = s.get(rounds, []) if rounds else []
        return f"{x:.2f}" + (f" ({min(xs):.2f}–{max(xs):.2f})" if len(xs) > 1 else "")

    for name, s in summary.items():
        goal = s.get("goal_ratio_s_per_step")
        goal_txt = (
            (
                f"≤ {goal:.2f}×: {'met' if s['goal_met'] else 'NOT met'} / "
                f"{'met' if s['goal_met_cpu_time'] else 'NOT met'}"
            )
            if goal
            else ""
        )
        m = s["cuda_max_allocated_mib"] if cuda else s["peak_rss_increase_mib"]
        lines.append(
            "| "
            + " | ".join(
                [
                    name,
                    f"{s['s_per_step']:.3f}",
                    ratio(s, "ratio_s_per_step", "round_ratio_s_per_step"),
                    f"{s['s_per_step_train']:.3f}",
                    ratio(s, "ratio_s_per_step_train", "round_ratio_s_per_step_train"),
                    f"{s['cpu_s_per_step']:.3f}",
                    ratio(s, "ratio_cpu_s_per_step"),
                    f"{s['cpu_s_per_step_train']:.3f}",
                    ratio(s, "ratio_cpu_s_per_step_train"),
                    f"{s['s_credit_hook']:.3f}",
                    f"{m:.0f}",
                    f"{s['mean_completion_length']:.1f}",
                    f"{s['mean_rows_nonzero_adv']:.0f}",
                    goal_txt,
                ]
            )
            + " |"
        )
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    ap.add_argument("--steps", type=int, default=6, help="training steps per run (the first is not timed)")
    ap.add_argument("--repeats", type=int, default=3, help="interleaved rounds (one run per row each)")
    ap.add_argument(
        "--rules",
        default=None,
        help="comma-separated names of tools/bench/reproduce.py's RULES, each run "
        f"with its flags; {BASELINE} (DAPO/GRPO) is the baseline (default: every rule)",
    )
    ap.add_argument(
        "--credits",
        default=None,
        help="the interface before --rules: comma-separated grpo, delta, "
        "cscr (RULES' rows dapo, delta, cscr); grpo is the baseline",
    )
    ap.add_argument(
        "--delta_impls",
        default="normal,memory_efficient",
        help="DelTA implementations to run for each 'delta' in --credits (one row each)",
    )
    ap.add_argument(
        "--num_mini_batches",
        type=int,
        default=None,
        help="optimizer steps per batch (default: tools/bench/reproduce.py's toy setting "
        f"{TOY[TOY.index('--num_mini_batches') + 1]} with --rules, grpo.py's 1 with --credits)",
    )
    ap.add_argument("--num_prompts_per_step", type=int, default=16)
    ap.add_argument("--num_generations", type=int, default=8)
    ap.add_argument("--max_completion_length", type=int, default=64)
    ap.add_argument("--model", default="toy", help="'toy' (snapshot of the cached toy model) or a model folder")
    ap.add_argument("--data", default="toy", help="training problems ('toy' or a jsonl file)")
    ap.add_argument(
        "--learning_rate",
        type=float,
        default=1e-30,
        help="tiny on purpose: every update is computed and applied, but far too small to change a "
        "float32 weight, so every credit samples the identical rollouts (same shapes, same "
        "rewards); with e.g. 5e-4 (grpo.py's default) rollouts diverge after step 1 and response "
        "lengths, hence cost and memory, differ between credits for reasons other than credit",
    )
    ap.add_argument("--micro_batch_size", type=int, default=0, help="as grpo.py (0 = whole batch)")
    ap.add_argument(
        "--path",
        choices=["scale", "plain"],
        default="scale",
        help="the policy's passes in every row: scale = " + " ".join(_common.SCALE_FLAGS) + " (grpo.py's "
        "defaults when the recorded results were made); plain = grpo.py's default now (the padded forward)",
    )
    ap.add_argument("--seed", type=int, default=0, help="the same seed for every run")
    ap.add_argument(
        "--toy_warmup_steps",
        type=int,
        default=200,
        help="warm-up steps of the private toy model built when no cached one exists",
    )
    ap.add_argument(
        "--out",
        default=str(REPO / "tools" / "bench" / "results" / "credit_overhead.json"),
        help="JSON results file ('' = do not write)",
    )
    ap.add_argument(
        "--profile",
        default="",
        metavar="ROW",
        help="after the benchmark, cProfile one extra run of this row (e.g. fipo) and print the top functions",
    )
    ap.add_argument(
        "--warmup_round",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="first run every row once for 2 untimed steps: a cold machine (GPU clocks and kernel "
        "caches, file cache) otherwise slows whichever run comes first",
    )
    ap.add_argument("--keep_runs", action="store_true", help="keep the runs' output folders (printed)")
    return ap


def main(argv=None) -> dict:
    args = build_parser().parse_args(argv)
    command = shlex.join(["python", *(sys.argv if argv is None else [__file__, *argv])])
    rows = row_specs(args)
    names = [n for n, _ in rows]
    if BASELINE not in names:
        need = "--credits must include grpo" if args.credits is not None else f"--rules must include {BASELINE}"
        raise SystemExit(f"credit_overhead.py: error: {need} (the baseline of every ratio)")
    if args.num_mini_batches is None:
        args.num_mini_batches = 1 if args.credits is not None else int(TOY[TOY.index("--num_mini_batches") + 1])
    if args.profile and args.profile not in names:
        raise SystemExit(f"credit_overhead.py: error: --profile must be one of the rows {names}")
    if args.steps < 2 or args.repeats < 1:
        raise SystemExit("credit_overhead.py: error: --steps must be >= 2 (step 1 is not timed), --repeats >= 1")
    # no progress bars (train's, transformers' loading bar): tqdm reads this when imported, so set it before the
    # fork server starts and imports anything
    os.environ["TQDM_DISABLE"] = "1"
    workdir = Path(tempfile.mkdtemp(prefix="credit_overhead-"))
    model_path, model_info = prepare_model(args, workdir)
    base_cfg = dict(
        model=model_path,
        data=args.data,
        prompt_template="none" if args.model == "toy" else "auto",
        num_generations=args.num_generations,
        num_prompts_per_step=args.num_prompts_per_step,
        max_completion_length=args.max_completion_length,
        max_steps=args.steps,
        learning_rate=args.learning_rate,
        micro_batch_size=args.micro_batch_size,
        seed=args.seed,
        num_mini_batches=args.num_mini_batches,
        eval_num_generations=0,
        save_steps=0,
        logging_steps=1,
        **(_common.SCALE_PATH if args.path == "scale" else {}),
    )
    load_start = os.getloadavg()
    runs = {n: [] for n in names}
    t_start = time.time()
    print(
        f"[bench] {len(rows)} rows × {args.repeats} rounds × {args.steps} steps; model {model_info['source']}",
        flush=True,
    )
    profile = None
    pool = _common.forkserver_pool(PRELOAD)  # one task per process: every run starts fresh
    try:
        if args.warmup_round:
            t0 = time.time()
            for name, over in rows:
                cfg = {**base_cfg, **over, "max_steps": 2, "output_dir": str(workdir / f"warmup_{name}")}
                pool.apply(run_one, ({"config": cfg},))
            print(f"[bench] warm-up round (2 untimed steps per row): {time.time() - t0:.0f}s", flush=True)
        for r in range(args.repeats):
            for name, over in rows:
                cfg = {**base_cfg, **over, "output_dir": str(workdir / f"r{r}_{name}")}
                res = pool.apply(run_one, ({"config": cfg},))
                runs[name].append(res)
                st = res["steps"][1:]
                print(
                    f"[bench] round {r + 1}/{args.repeats} {name:<24} median s/step "
                    f"{median([s['step_time'] for s in st]):.3f} (excl. gen "
                    f"{median([s['step_time'] - s['generation_time'] for s in st]):.3f}), "
                    f"peak RSS +{res['peak_rss_increase_mib']:.0f} MiB, run {res['wall_time']:.1f}s",
                    flush=True,
                )
        if args.profile:
            over = dict(rows)[args.profile]
            prof_path = str(workdir / f"profile_{args.profile}.prof")
            cfg = {**base_cfg, **over, "output_dir": str(workdir / f"profile_{args.profile}")}
            pool.apply(run_one, ({"config": cfg, "profile": prof_path},))
            import io
            import pstats

            buf = io.StringIO()
            pstats.Stats(prof_path, stream=buf).sort_stats("cumulative").print_stats(40)
            profile = buf.getvalue()
            print(profile)
    finally:
        pool.close()
        pool.join()
    total = time.time() - t_start
    import torch

    cuda = torch.cuda.is_available()
    summary = summarize(runs, BASELINE)
    widths = {n: [[st.get("response_width") for st in r["steps"]] for r in rs] for n, rs in runs.items()}
    lengths = {n: [[st["completions/mean_length"] for st in r["steps"]] for r in rs] for n, rs in runs.items()}
    identical = all(widths[n] == widths[BASELINE] and lengths[n] == lengths[BASELINE] for n in names)
    table = markdown_table(summary, cuda)
    print()
    print(table)
    print(
        f"\n{args.steps - 1} timed steps per run (step 1 excluded) × {args.repeats} interleaved rounds; medians "
        f"over pooled steps; (a–b) = range of the per-round ratio; CPU = this process's CPU time (excludes "
        f"the grading worker). Same rollouts for every row (learning rate {args.learning_rate:g}): "
        f"{'yes' if identical else 'NO'}. "
        f"Total {total:.0f}s; load average "
        f"{load_start[0]:.2f} -> {os.getloadavg()[0]:.2f}."
    )
    machine = machine_description()
    machine["torch_threads_in_train"] = sorted({r["torch_threads"] for rs in runs.values() for r in rs})
    machine["load_average_start"], machine["load_average_end"] = list(load_start), list(os.getloadavg())
    result = {
        "benchmark": "credit_overhead",
        "date": _common.now_iso(),
        "command": command,
        "python": sys.executable,
        "git": git_state(),
        "machine": machine,
        "model": model_info,
        "settings": {**vars(args), "train_config": {k: v for k, v in base_cfg.items() if k != "model"}},
        "memory_method": (
            "torch.cuda.max_memory_allocated over train()"
            if cuda
            else "peak RSS increase over train(): VmHWM (reset via /proc/self/clear_refs before "
            "train) minus VmRSS before train, fresh forked process per run"
        ),
        "goals": {"delta": "s/step ≤ 1.10× GRPO", "cscr": "s/step ≤ 1.6× GRPO"},
        "rows": [{"name": n, "flags": row_flags(n), "config": over} for n, over in rows],
        "identical_rollouts": identical,
        "summary": summary,
        "table_markdown": table,
        "total_seconds": total,
        "profile": profile,
        "runs": {n: [{k: v for k, v in r.items() if k != "pid"} for r in rs] for n, rs in runs.items()},
    }
    return _common.finish(result, args.out, workdir, args.keep_runs)


if __name__ == "__main__":
    main()
