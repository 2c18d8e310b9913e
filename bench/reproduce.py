"""Every row of the papers' comparison tables on the toy: one batch of runs, three seeds each (docs/reproduce.md).

``RULES`` is the list of rows: DelTA's Table 1 (DAPO, DAPO w/ Forking Tokens in its code's and in TRL's reading,
SAPO, FIPO, DelTA), its ablation table, its Q2 token selection, and CSCR's ablations (cscr spec §9) — each with the
flags that select it, the paper's number (Table 1: the 7-benchmark average on Qwen3-8B-Base; ablations: the
4-benchmark average; docs/specs/delta.md §5, baselines.md §1) and the row's command at the paper's recipe.

Every toy run is ``python grpo.py <the rule's flags> --num_mini_batches 4 --seed S`` (four mini-batches per step,
the paper's setting: with one, FIPO is DAPO and Forking Tokens rank θ_old's entropies), 60 steps of 16 × 8, run
``--jobs`` at a time (2 on the 2-core machine; each run uses one thread). A run folder that already holds a
finished run (summary.json) is read, not rerun, so a killed batch resumes. Per rule it reports the held-out avg@8
gained (points, mean ± population std and the seeds' range) and the credit's AUROCs at the toy's first wrong token
and result digits (samples/summary.json, ``report.credit_lands``).

    python bench/reproduce.py                        # every rule, seeds 0 1 2: 87 runs, ~2 h on 2 cores
    python bench/reproduce.py --rules dapo,fipo --seeds 0
    python bench/reproduce.py --table                # docs/reproduce.md's toy tables from the finished runs

Results: ``--out`` (default bench/results/reproduce.json) with every run's figures and the machine.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from _common import REPO, git_state, machine_description, write_json

PAPER = "python grpo.py --recipe delta_paper --model Qwen/Qwen3-8B-Base"  # + the row's flags
# (name, table, flags, the paper's number or None, what the row is)
RULES = [
    ("dapo", "Table 1", [], 22.95, "DAPO: the clipped token-mean surrogate, every token Â_i"),
    ("dapo_ft", "Table 1", ["--entropy_top_ratio", "0.2"], 24.80,
     "DAPO w/ Forking Tokens, its code's rule: the top ⌈0.2n⌉ tokens by entropy, their mean"),
    ("dapo_ft_trl", "Table 1", ["--top_entropy_quantile", "0.2"], None,
     "the same as TRL reads it: entropy ≥ the 0.8 quantile, the normaliser unchanged"),
    ("sapo", "Table 1", ["--loss_type", "sapo"], 25.14, "SAPO: the soft gate, τ 1.0 / 1.05, per-sequence mean"),
    ("fipo", "Table 1", ["--credit", "fipo"], 23.89, "FIPO: the future-KL weight (decay 32, clip 0.2)"),
    ("delta", "Table 1", ["--credit", "delta"], 28.40, "DelTA (K = 1, [0.8, 1.2])"),
    ("within_side", "ablation", ["--credit", "delta", "--delta_scores", "within_side"], 17.94,
     "within-side scores α = σ(−‖v − μ_own‖²/γ)"),
    ("frozen_gamma", "ablation", ["--credit", "delta", "--delta_gamma", "frozen"], 21.19,
     "w/o adaptive γ: the first batch's γ, kept"),
    ("hard", "ablation", ["--credit", "delta", "--delta_assignment", "hard"], 20.93, "hard 0/1 assignment"),
    ("no_lamnorm", "ablation", ["--credit", "delta", "--no-delta_normalize"], 21.39, "w/o λ-normalisation"),
    ("raw_alpha", "ablation", ["--credit", "delta", "--delta_coefficients", "raw"], 20.78, "raw α as the weight"),
    ("k0", "ablation", ["--credit", "delta", "--delta_k", "0"], 19.97, "w/o refinement (K = 0)"),
    ("k2", "ablation", ["--credit", "delta", "--delta_k", "2"], 22.15, "K = 2"),
    ("k3", "ablation", ["--credit", "delta", "--delta_k", "3"], 22.20, "K = 3"),
    ("lam_0.5_1.2", "ablation", ["--credit", "delta", "--delta_lam_min", "0.5"], 23.22, "λ ∈ [0.5, 1.2]"),
    ("lam_0.8_1.5", "ablation", ["--credit", "delta", "--delta_lam_max", "1.5"], 22.77, "λ ∈ [0.8, 1.5]"),
    ("lam_0.5_1.5", "ablation", ["--credit", "delta", "--delta_lam_min", "0.5", "--delta_lam_max", "1.5"], 23.07,
     "λ ∈ [0.5, 1.5]"),
    ("topk_proxy", "ablation", ["--credit", "delta", "--delta_proxy", "topk", "--delta_proxy_topk", "20"], 24.29,
     "the top-K hidden-gradient proxy (K = 20; the paper does not give K)"),
    ("random_lambda", "ablation", ["--credit", "delta", "--delta_coefficients", "random"], 18.34,
     "random λ ~ U[0.8, 1.2], the same normalisation"),
    ("q2_top", "Q2", ["--credit", "delta", "--delta_select", "top"], None, "DAPO on the top 50% of tokens by λ"),
    ("q2_random", "Q2", ["--credit", "delta", "--delta_select", "random"], None, "DAPO on a random 50%"),
    ("q2_bottom", "Q2", ["--credit", "delta", "--delta_select", "bottom"], None, "DAPO on the bottom 50% by λ"),
    ("cscr", "CSCR", ["--credit", "cscr"], None, "CSCR (spec §5 defaults: λ 0.2 nats, α 1, per sequence)"),
    ("cscr_sign_aware", "CSCR", ["--credit", "cscr", "--cscr_weight", "sign_aware"], None,
     "direction ablation: RLSD's sign-aware weight"),
    ("cscr_upweight", "CSCR", ["--credit", "cscr", "--cscr_weight", "upweight"], None,
     "up-weighting the sensitive tokens instead"),
    ("cscr_group", "CSCR", ["--credit", "cscr", "--cscr_scope", "group"], None, "renormalised per group"),
    ("cscr_batch", "CSCR", ["--credit", "cscr", "--cscr_scope", "batch"], None, "renormalised over the batch"),
    ("cscr_alpha_0.5", "CSCR", ["--credit", "cscr", "--cscr_alpha", "0.5"], None, "strength: α = 0.5"),
    ("cscr_alpha_4", "CSCR", ["--credit", "cscr", "--cscr_alpha", "4"], None, "strength: α = 4"),
]
TOY = ["--num_mini_batches", "4"]  # every toy run's shared flags (the paper's four mini-batches per step)


def run_folder(root: Path, name: str, seed: int) -> Path:
    return root / f"{name}-seed{seed}"


def run(root: Path, name: str, flags: list[str], seed: int) -> dict:
    """One toy run (skipped when its folder holds a finished one); returns its figures."""
    out = run_folder(root, name, seed)
    if not (out / "summary.json").exists():
        log = root / f"{name}-seed{seed}.log"
        cmd = [sys.executable, str(REPO / "grpo.py"), *flags, *TOY, "--seed", str(seed), "--output_dir", str(out),
               "--overwrite_output_dir"]
        t0 = time.time()
        with open(log, "w") as f:
            subprocess.run(cmd, cwd=REPO, stdout=f, stderr=subprocess.STDOUT, check=True)
        print(f"  {name} seed {seed}: {time.time() - t0:.0f} s", flush=True)
    return figures(out)


def figures(out: Path) -> dict:
    summary = json.loads((out / "summary.json").read_text())
    lands = json.loads((out / "samples" / "summary.json").read_text())["where_the_credit_lands"]
    land = next(iter(lands.values()))
    b, a = summary["before"], summary["after"]
    return {"avg8_before": b["eval/avg@8"], "avg8_after": a["eval/avg@8"],
            "gain": 100 * (a["eval/avg@8"] - b["eval/avg@8"]), "greedy_after": a["eval/greedy"],
            "auroc_first_wrong": land["auroc"]["first_wrong"]["mean"],
            "auroc_result_digits": land["auroc"]["result_digits"]["mean"]}


def spread(values: list[float]) -> dict:
    values = [v for v in values if v is not None]
    if not values:
        return {"mean": None}
    return {"mean": statistics.mean(values), "std": statistics.pstdev(values), "min": min(values),
            "max": max(values), "n": len(values)}


def table(results: dict) -> str:
    """docs/reproduce.md's tables: per paper table, one row per rule (its flags at the paper's recipe, the paper's
    number, the toy's three-seed figures)."""
    def cell(s, d, sign=""):  # mean ± std (the seeds' range)
        if s["mean"] is None:
            return "–"
        return f"{s['mean']:{sign}.{d}f} ± {s['std']:.{d}f} ({s['min']:{sign}.{d}f} to {s['max']:{sign}.{d}f})"

    out = []
    for where in dict.fromkeys(t for _, t, _, _, _ in RULES):
        if not any(t == where and name in results for name, t, _, _, _ in RULES):
            continue
        out += [f"\n**{where}**\n", "| row | flags | paper | toy: avg@8 gained (points) | AUROC first wrong | "
                "AUROC result digits |", "|---|---|---|---|---|---|"]
        for name, t, flags, paper, what in RULES:
            r = results.get(name)
            if t != where or not r:
                continue
            out.append(f"| {name}: {what} | `{' '.join(flags) or '(none)'}` | "
                       f"{'–' if paper is None else f'{paper:.2f}'} | {cell(r['gain'], 1, '+')} | "
                       f"{cell(r['auroc_first_wrong'], 3)} | {cell(r['auroc_result_digits'], 3)} |")
    return "\n".join(out)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rules", default="", help="comma-separated names of RULES (default: all)")
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--jobs", type=int, default=2, help="runs at a time")
    ap.add_argument("--root", default=str(REPO / "runs" / "reproduce"), help="where the run folders go")
    ap.add_argument("--out", default=str(REPO / "bench" / "results" / "reproduce.json"))
    ap.add_argument("--table", action="store_true", help="only read the finished runs and print the table")
    args = ap.parse_args(argv)
    chosen = [r for r in RULES if not args.rules or r[0] in args.rules.split(",")]
    unknown = set(filter(None, args.rules.split(","))) - {r[0] for r in RULES}
    if unknown:
        raise SystemExit(f"reproduce.py: error: --rules: unknown {sorted(unknown)} (names: {[r[0] for r in RULES]})")
    seeds, root = [int(s) for s in args.seeds.split(",")], Path(args.root)
    root.mkdir(parents=True, exist_ok=True)
    jobs = [(name, flags, seed) for seed in seeds for name, _, flags, _, _ in chosen]  # seed-major: rows fill evenly
    if args.table:
        per_run = {(n, s): figures(run_folder(root, n, s)) for n, _, s in jobs
                   if (run_folder(root, n, s) / "summary.json").exists()}
    else:
        with ThreadPoolExecutor(args.jobs) as pool:
            done = pool.map(lambda j: ((j[0], j[2]), run(root, *j)), jobs)
            per_run = dict(done)
    results = {}
    for name, *_ in chosen:
        runs = [per_run[(name, s)] for s in seeds if (name, s) in per_run]
        if runs:
            results[name] = {k: spread([r[k] for r in runs]) for k in runs[0]}
            results[name]["runs"] = runs
    print(table(results))
    if results:  # also after --table: the figures of every finished run
        write_json(args.out, {"machine": machine_description(), "git": git_state(), "seeds": seeds,
                               "toy_flags": TOY, "rules": [{"name": n, "table": t, "flags": f, "paper": p,
                                                            "what": w, "paper_command": f"{PAPER} {' '.join(f)}"}
                                                           for n, t, f, p, w in chosen], "results": results})


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main()
