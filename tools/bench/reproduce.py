"""Every row of the papers' comparison tables on the toy: one command per row and seed, recorded with the commit and
the machine that ran it, and checked against that record (docs/reproduce.md).

``RULES`` is the list of rows: DelTA's Table 1 (DAPO, DAPO w/ Forking Tokens in its code's and in TRL's reading,
SAPO, FIPO, DelTA), its ablation table, its Q2 token selection, and CSCR's ablations (cscr spec §9) — each with the
flags that select it, the paper's number (Table 1: the 7-benchmark average on Qwen3-8B-Base; ablations: the
4-benchmark average; docs/specs/delta.md §5, baselines.md §1) and the row's command at the paper's recipe.

A row's toy run is ``python grpo.py <the row's flags> --num_mini_batches 4 --padding_free --shared_prompt
--chunked_lm_head --fuse_old_logprobs --seed S`` (``command``; ``python -m comparisons`` in place of ``python grpo.py``
where a flag is a comparison's, ``entry_point``): four mini-batches per step, the paper's setting (with one, FIPO is
DAPO and Forking Tokens rank θ_old's entropies), and the scale path (trainer/scale_passes.py), grpo.py's default when
the records were made, so that every run of a row takes the path its records took (the plain path, grpo.py's
default now, rounds otherwise in float32: its 60-step figures drift from the record's, docs/reproduce.md); 60 steps
of 16 × 8, one run at a time by default. Its figures are what the command prints at its end (held-out avg@8 and
greedy before and after, ``summary.json``) and the credit's AUROCs at the toy's first wrong token and result digits
(``samples/summary.json``, ``trainer.samples_summary.credit_lands``).

    python tools/bench/reproduce.py --rules delta --seeds 0,1,2   # run a row's seeds, merge them into the record
    python tools/bench/reproduce.py --check delta --seed 0         # rerun one recorded run, compare (exit 1: differs;
                                                             # --log_check adds the outcome to the record)
    python tools/bench/reproduce.py --table --page docs/reproduce.md   # the page's tables from the record

The record (``--record``, default tools/bench/results/reproduce.json) keeps, per row and seed, the exact command, the
commit and the uncommitted files it ran with, the machine (CPU family/model, its vector instructions, torch's CPU
kernels) and the figures. Running rows replaces only their runs. A run made before its command's spelling changed
keeps the command it ran as under ``command_as_run``, and under ``command`` today's spelling of the same settings
(the runs before commit 5c2fadd: grpo.py's defaults were the scale path's four flags, now written out, and
``--credit fipo`` is now ``python -m comparisons --fipo``); ``--check`` reruns ``command``.

Figures depend on torch's CPU kernels (``torch.backends.cpu.get_cpu_capability()``: DEFAULT, AVX2, AVX512), which
torch picks from the CPU unless ``ATEN_CPU_CAPABILITY`` names a set the CPU supports. So every run is made under a
named set (``--cpu_capability``, default avx2: the record's set, which any x86 CPU since 2013 has) and recorded with
it, and ``--check`` reruns a row under the set its record names; where this CPU lacks that set it says so in one
line (exit 2) instead of comparing figures that cannot agree. ``--check`` reruns the record's own command (its
flags and entry point, exactly) and says where it is no longer the row's (``command`` today): a mismatch. A run
folder under ``--root`` that holds a finished run of the same command, on the same kind of machine, by code unchanged
since (tools/bench/, tests/ and documentation aside), is read, not rerun (a killed batch resumes).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from _common import REPO, SCALE_FLAGS, git_state, machine_description, now_iso, write_json

PAPER = ["--recipe", "delta_paper", "--model", "Qwen/Qwen3-8B-Base"]  # + the row's flags (the recipe: the scale path)
# (name, table, flags, the paper's number or None, what the row is)
RULES = [
    ("dapo", "Table 1", [], 22.95, "DAPO: the clipped token-mean surrogate, every token Â_i"),
    (
        "dapo_ft",
        "Table 1",
        ["--entropy_top_ratio", "0.2"],
        24.80,
        "DAPO w/ Forking Tokens, its code's rule: the top ⌈0.2n⌉ tokens by entropy, their mean",
    ),
    (
        "dapo_ft_trl",
        "Table 1",
        ["--top_entropy_quantile", "0.2"],
        None,
        "the same as TRL reads it: entropy ≥ the 0.8 quantile, the normaliser unchanged",
    ),
    ("sapo", "Table 1", ["--loss_type", "sapo"], 25.14, "SAPO: the soft gate, τ 1.0 / 1.05, per-sequence mean"),
    ("fipo", "Table 1", ["--fipo"], 23.89, "FIPO: the future-KL weight (decay 32, clip 0.2)"),
    ("delta", "Table 1", ["--credit", "delta"], 28.40, "DelTA (K = 1, [0.8, 1.2])"),
    (
        "within_side",
        "ablation",
        ["--credit", "delta", "--delta_scores", "within_side"],
        17.94,
        "within-side scores α = σ(−‖v − μ_own‖²/γ)",
    ),
    (
        "frozen_gamma",
        "ablation",
        ["--credit", "delta", "--delta_gamma", "frozen"],
        21.19,
        "w/o adaptive γ: the first batch's γ, kept",
    ),
    ("hard", "ablation", ["--credit", "delta", "--delta_assignment", "hard"], 20.93, "hard 0/1 assignment"),
    ("no_lamnorm", "ablation", ["--credit", "delta", "--no-delta_normalize"], 21.39, "w/o λ-normalisation"),
    ("raw_alpha", "ablation", ["--credit", "delta", "--delta_coefficients", "raw"], 20.78, "raw α as the weight"),
    ("k0", "ablation", ["--credit", "delta", "--delta_k", "0"], 19.97, "w/o refinement (K = 0)"),
    ("k2", "ablation", ["--credit", "delta", "--delta_k", "2"], 22.15, "K = 2"),
    ("k3", "ablation", ["--credit", "delta", "--delta_k", "3"], 22.20, "K = 3"),
    ("lam_0.5_1.2", "ablation", ["--credit", "delta", "--delta_lam_min", "0.5"], 23.22, "λ ∈ [0.5, 1.2]"),
    ("lam_0.8_1.5", "ablation", ["--credit", "delta", "--delta_lam_max", "1.5"], 22.77, "λ ∈ [0.8, 1.5]"),
    (
        "lam_0.5_1.5",
        "ablation",
        ["--credit", "delta", "--delta_lam_min", "0.5", "--delta_lam_max", "1.5"],
        23.07,
        "λ ∈ [0.5, 1.5]",
    ),
    (
        "topk_proxy",
        "ablation",
        ["--credit", "delta", "--delta_proxy", "topk", "--delta_proxy_topk", "20"],
        24.29,
        "the top-K hidden-gradient proxy (K = 20; the paper does not give K)",
    ),
    (
        "random_lambda",
        "ablation",
        ["--credit", "delta", "--delta_coefficients", "random"],
        18.34,
        "random λ ~ U[0.8, 1.2], the same normalisation",
    ),
    ("q2_top", "Q2", ["--credit", "delta", "--delta_select", "top"], None, "DAPO on the top 50% of tokens by λ"),
    ("q2_random", "Q2", ["--credit", "delta", "--delta_select", "random"], None, "DAPO on a random 50%"),
    ("q2_bottom", "Q2", ["--credit", "delta", "--delta_select", "bottom"], None, "DAPO on the bottom 50% by λ"),
    ("cscr", "CSCR", ["--credit", "cscr"], None, "CSCR (spec §5 defaults: λ 0.2 nats, α 1, per sequence)"),
    (
        "cscr_sign_aware",
        "CSCR",
        ["--credit", "cscr", "--cscr_weight", "sign_aware"],
        None,
        "direction ablation: RLSD's sign-aware weight",
    ),
    (
        "cscr_upweight",
        "CSCR",
        ["--credit", "cscr", "--cscr_weight", "upweight"],
        None,
        "up-weighting the sensitive tokens instead",
    ),
    ("cscr_group", "CSCR", ["--credit", "cscr", "--cscr_scope", "group"], None, "renormalised per group"),
    ("cscr_batch", "CSCR", ["--credit", "cscr", "--cscr_scope", "batch"], None, "renormalised over the batch"),
    ("cscr_alpha_0.5", "CSCR", ["--credit", "cscr", "--cscr_alpha", "0.5"], None, "strength: α = 0.5"),
    ("cscr_alpha_4", "CSCR", ["--credit", "cscr", "--cscr_alpha", "4"], None, "strength: α = 4"),
    (
        "otb",
        "verl's token baseline",
        ["--credit", "otb"],
        None,
        "verl's Optimal Token Baseline: B*_t weighted by W_t = Σ(1 − 2π + Σπ²), ε 1e-8, the zero tail",
    ),
]
# every toy run's shared flags: the paper's four mini-batches per step, and the scale path (the records' path)
TOY = ["--num_mini_batches", "4", *SCALE_FLAGS]
# What a run prints and logs that the record keeps and --check compares, exactly (the same command on the same kind
# of machine gives the same bits: fixed seeds, one thread).
FIGURES = ("avg8_before", "avg8_after", "greedy_before", "greedy_after", "auroc_first_wrong", "auroc_result_digits")
RECORD = REPO / "tools" / "bench" / "results" / "reproduce.json"
SIDECAR = "reproduce_run.json"  # in a run folder: how tools/bench/reproduce.py ran it


def entry_point(flags: list[str]) -> list[str]:
    """The command that takes ``flags``: ``python grpo.py`` when its parser takes every one of them, else ``python -m
    comparisons`` (grpo.py's flags and the comparisons': ``--fipo``, ``--entropy_top_ratio``, ``--credit otb``, ...)."""
    from trainer import grpo_config

    try:
        grpo_config.build_parser(grpo_config.GRPOConfig, defaults=False).parse_args(list(flags))
    except SystemExit:  # (its one-line error, not printed)
        return ["python", "-m", "comparisons"]
    return ["python", "grpo.py"]


def command(flags: list[str], seed: int, extra: list[str] = ()) -> list[str]:
    """A row's toy command, as the page prints it (the output folder, which changes no figure, left out)."""
    args = [*flags, *TOY, *extra, "--seed", str(seed)]
    return [*entry_point(args), *args]


def paper_command(flags: list[str]) -> str:
    """A row's command at the paper's recipe (Qwen3-8B-Base), as the page prints it."""
    return " ".join([*entry_point(flags), *PAPER, *flags])


CAPABILITY_DEFAULT = "avx2"  # the kernels the record's runs are made with (docs/reproduce.md)


def capability_env(capability: str) -> str:
    """``ATEN_CPU_CAPABILITY``'s value for a capability as torch reports it (``AVX2`` -> ``avx2``)."""
    return capability.lower()


def torch_kernels() -> str:
    """The CPU kernels torch picks in a new process under this process's environment (``ATEN_CPU_CAPABILITY`` as
    set), e.g. ``AVX2``: what the runs started from here use, whatever this process's own torch was started with."""
    probe = subprocess.run(
        [sys.executable, "-c", "import torch; print(torch.backends.cpu.get_cpu_capability())"],
        capture_output=True,
        text=True,
        env=os.environ,
    )
    return probe.stdout.strip() or f"unknown ({probe.stderr.strip()[-200:]})"


def pin_capability(capability: str) -> str | None:
    """Make the runs started from here use torch's ``capability`` kernels (sets ``ATEN_CPU_CAPABILITY``); returns
    None where this CPU runs them, else one line saying why not."""
    os.environ["ATEN_CPU_CAPABILITY"] = capability_env(capability)
    got = torch_kernels()
    if got.lower() == capability_env(capability):
        return None
    return (
        f"this CPU cannot run torch's {capability.upper()} kernels (ATEN_CPU_CAPABILITY={capability_env(capability)}"
        f" gives {got})"
    )


def machine() -> dict:
    """``_common.machine_description`` and what decides the toy's floating-point results: the CPU's family, model
    and vector instructions, and the kernels torch picks for its runs (``torch_kernels``)."""
    desc, info = machine_description(), {}
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() in ("vendor_id", "cpu family", "model", "stepping", "flags") and key.strip() not in info:
                    info[key.strip()] = value.strip()
                if not line.strip() and info:
                    break
    except OSError:
        pass
    simd = sorted(f for f in info.get("flags", "").split() if f.startswith(("avx", "amx", "fma", "sse4")))
    desc["cpu"] = {
        "vendor": info.get("vendor_id"),
        "family": info.get("cpu family"),
        "model": info.get("model"),
        "stepping": info.get("stepping"),
        "simd": simd,
    }
    desc["torch_cpu_capability"] = torch_kernels()  # the runs', not this process's
    return desc


def machine_kind(m: dict | None) -> str:
    """What must agree for two runs of one command to agree: the CPU (vendor, family, model, vector instructions),
    torch's CPU kernels and the library versions; 'not recorded' where the record does not say."""
    if not m or "cpu" not in m:
        return "not recorded"
    c = m["cpu"]
    return (
        f"{c['vendor']} family {c['family']} model {c['model']} ({m.get('cpu_model')}), "
        f"{'/'.join(f for f in c['simd'] if f in ('avx2', 'avx512f', 'amx_tile'))}, torch kernels "
        f"{m.get('torch_cpu_capability')}, torch {m['versions'].get('torch')}, transformers "
        f"{m['versions'].get('transformers')}"
    )


def code_state() -> dict:
    """``_common.git_state`` with the uncommitted .py files that a toy run can import (tools/bench/ and tests/ left
    out)."""
    git = git_state()
    if "dirty_python_files" in git:
        git["dirty_python_files"] = [
            f for f in git["dirty_python_files"] if not f.startswith(("tools/bench/", "tests/"))
        ]
    return git


def same_code(commit: str | None) -> bool:
    """Whether this checkout runs the code of ``commit``: no file outside tools/bench/, tests/ and the documentation
    differs from it, committed or not."""
    if not commit:
        return False
    r = subprocess.run(
        ["git", "diff", "--quiet", commit, "--", ".", ":!tools/bench", ":!tests", ":!docs", ":!*.md"],
        cwd=REPO,
        capture_output=True,
    )
    return r.returncode == 0


def run_folder(root: Path, name: str, seed: int) -> Path:
    return root / f"{name}-seed{seed}"


def run(root: Path, name: str, seed: int, cmd: list[str]) -> dict:
    """One toy run of ``cmd`` (a ``command``, as the page prints it) into ``root/<name>-seed<seed>`` (read, not rerun,
    when that folder holds a finished run of the same command at the same commit); returns its record: command,
    commit, machine, date, figures."""
    out, git = run_folder(root, name, seed), code_state()
    side = out / SIDECAR
    if side.exists() and (out / "summary.json").exists():
        done = json.loads(side.read_text())
        if (
            done["command"] == shlex.join(cmd)
            and not done["git"].get("dirty_python_files")
            and same_code(done["git"].get("commit"))
            and done["machine_kind"] == machine_kind(machine())
        ):
            return {**done, **figures(out)}  # the same command on this code and kind of machine: its record
    argv = [sys.executable, *cmd[1:], "--output_dir", str(out), "--overwrite_output_dir"]  # (from the repository)
    log, t0, started = root / f"{name}-seed{seed}.log", time.time(), now_iso()
    root.mkdir(parents=True, exist_ok=True)
    with open(log, "w") as f:
        rc = subprocess.run(argv, cwd=REPO, stdout=f, stderr=subprocess.STDOUT).returncode
    if rc:
        raise SystemExit(f"reproduce.py: {shlex.join(cmd)} failed (exit {rc}); its output: {log}")
    m = machine()
    done = {
        "seed": seed,
        "command": shlex.join(cmd),
        "git": git,
        "machine_kind": machine_kind(m),
        "machine": m,
        "started": started,
        "wall_s": round(time.time() - t0, 1),
    }
    side.write_text(json.dumps(done, indent=1, ensure_ascii=False) + "\n")
    print(f"  {name} seed {seed}: {done['wall_s']:.0f} s", flush=True)
    return {**done, **figures(out)}


def figures(out: Path) -> dict:
    """What the run printed at its end (held-out avg@8 and greedy, before and after), the gain in points, and the
    credit's AUROCs (None where the run logged no response with that class)."""
    summary = json.loads((out / "summary.json").read_text())
    lands = json.loads((out / "samples" / "summary.json").read_text())["where_the_credit_lands"]
    auroc = next(iter(lands.values()), {}).get("auroc") or {}
    b, a = summary["before"], summary["after"]
    avg = next(k for k in a if k.startswith("eval/avg@"))  # avg@8 (avg@k of a smoke test's --eval_num_generations)
    return {
        "avg8_before": b[avg],
        "avg8_after": a[avg],
        "greedy_before": b["eval/greedy"],
        "greedy_after": a["eval/greedy"],
        "gain": 100 * (a[avg] - b[avg]),
        **{f"auroc_{k}": (auroc.get(k) or {}).get("mean") for k in ("first_wrong", "result_digits")},
    }


def spread(values: list[float]) -> dict:
    values = [v for v in values if v is not None]
    if not values:
        return {"mean": None}
    return {
        "mean": statistics.mean(values),
        "std": statistics.pstdev(values),
        "min": min(values),
        "max": max(values),
        "n": len(values),
    }


# ----------------------------------------------------------------------------------------------------------
# The record: per row, its runs (one per seed), each with its command, commit and machine
# ----------------------------------------------------------------------------------------------------------
def load_record(path: Path) -> dict:
    if not path.exists():
        return {"results": {}}
    try:
        record = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise SystemExit(f"reproduce.py: {path}: not JSON ({e}); nothing was run or written")
    for row in record.get("results", {}).values():
        for r in row.get("runs", []):
            r["machine_kind"] = (
                machine_kind(r.get("machine")) if r.get("machine_kind") in (None, "?") else r["machine_kind"]
            )
    return record


def merge(record: dict, name: str, new_runs: list[dict]) -> None:
    """Replace the row's runs of the same seeds by ``new_runs`` and recompute its spreads over all its runs."""
    row = record["results"].setdefault(name, {"runs": []})
    seeds = {r["seed"] for r in new_runs}
    runs = sorted([r for r in row["runs"] if r.get("seed") not in seeds] + new_runs, key=lambda r: r["seed"])
    record["results"][name] = {**{k: spread([r.get(k) for r in runs]) for k in ("gain", *FIGURES)}, "runs": runs}


def recorded(run_: dict) -> bool:
    """A run the record can vouch for: its exact command, commit and machine were recorded when it ran."""
    return bool(run_.get("command")) and bool((run_.get("git") or {}).get("commit")) and "machine" in run_


def save_record(path: Path, record: dict) -> None:
    record["rules"] = [
        {
            "name": n,
            "table": t,
            "flags": f,
            "paper": p,
            "what": w,
            "toy_command": shlex.join(command(f, 0)).replace("--seed 0", "--seed S"),
            "paper_command": paper_command(f),
        }
        for n, t, f, p, w in RULES
    ]
    record["toy_flags"] = TOY
    record["figures"] = {
        "avg8_*, greedy_*": "held-out avg@8 and greedy accuracy before/after training, as the command prints them",
        "gain": "100 × (avg8_after − avg8_before), points",
        "auroc_*": "samples_summary.credit_lands: the credit's AUROC at the first wrong token / result digits",
    }
    write_json(str(path), record)


# ----------------------------------------------------------------------------------------------------------
# --check: rerun one recorded run and compare
# ----------------------------------------------------------------------------------------------------------
def recorded_command(run_: dict, name: str, seed: int) -> list[str]:
    """The command a recorded run ran (``command``, today's spelling), as a list; one line naming the record's run
    where it is not a toy command of grpo.py or of the comparisons."""
    cmd = shlex.split(run_.get("command") or "")
    if cmd[:2] != ["python", "grpo.py"] and cmd[:3] != ["python", "-m", "comparisons"]:
        raise SystemExit(
            f"reproduce.py: --check {name} --seed {seed}: the record's command {run_.get('command')!r} is not "
            f"'python grpo.py ...' or 'python -m comparisons ...'; rerun it: python tools/bench/reproduce.py "
            f"--rules {name} --seeds {seed}"
        )
    return cmd


def check(record: dict, name: str, seed: int, extra: list[str], keep: bool) -> bool:
    """Rerun row ``name``'s seed ``seed`` with its record's command (its flags and entry point, under its CPU kernels)
    and compare its figures with the record's run (exactly); print both, the row's command today (``extra`` added),
    the commits and the machines. True when the record's command is the row's and every figure agrees."""
    flags = next(f for n, _, f, _, _ in RULES if n == name)
    runs = {r.get("seed"): r for r in record.get("results", {}).get(name, {}).get("runs", [])}
    if seed not in runs:
        raise SystemExit(
            f"reproduce.py: --check {name} --seed {seed}: the record has no such run "
            f"(its seeds of {name}: {sorted(runs) or 'none'}); run it: python tools/bench/reproduce.py "
            f"--rules {name} --seeds {seed}"
        )
    old, cmd = runs[seed], shlex.join(command(flags, seed, extra))  # the row's command today
    wanted = (old.get("machine") or {}).get("torch_cpu_capability")
    if not wanted:
        raise SystemExit(
            f"reproduce.py: --check {name} --seed {seed}: the record does not say which CPU kernels "
            f"made this run; rerun it: python tools/bench/reproduce.py --rules {name} --seeds {seed}"
        )
    cannot = pin_capability(wanted)
    if cannot:
        print(f"cannot check {name} seed {seed}: its figures come from torch's {wanted} kernels and {cannot}")
        raise SystemExit(2)
    rerun = recorded_command(old, name, seed)
    work = Path(tempfile.mkdtemp(prefix="reproduce-check-"))
    try:
        new = run(work, name, seed, rerun)
    finally:
        if keep:
            print(f"run kept in {run_folder(work, name, seed)}")
        else:
            shutil.rmtree(work, ignore_errors=True)
    same_cmd = old.get("command") == cmd
    print(f"{name}, seed {seed}: {shlex.join(rerun)}")
    print(f"  the row's command: {cmd}{'' if same_cmd else '   <- not the recorded one'}")
    if old.get("command_as_run"):
        print(f"  as it ran:         {old['command_as_run']}")
    print(f"  {'figure':<20} {'recorded':>12} {'now':>12}")
    bad = [] if same_cmd else ["command"]
    for k in FIGURES:
        a, b = old.get(k), new.get(k)
        fa, fb = ("–" if v is None else f"{v:.6f}" for v in (a, b))
        if k not in old:  # an older record without this figure: nothing to compare
            print(f"  {k:<20} {'not recorded':>12} {fb:>12}")
            continue
        bad += [] if a == b else [k]
        print(f"  {k:<20} {fa:>12} {fb:>12}   {'same' if a == b else 'DIFFERS'}")
    old_commit = (old.get("git") or {}).get("commit")
    old_kind, dirty = old.get("machine_kind", machine_kind(old.get("machine"))), new["git"].get("dirty_python_files")
    print(
        f"  commit:  recorded {old_commit or 'not recorded'}, now {new['git'].get('commit')}"
        f"{' + uncommitted ' + ', '.join(dirty) if dirty else ''}"
    )
    print(f"  machine: recorded {old_kind}\n           now      {new['machine_kind']}")
    old.setdefault("checks", []).append(
        {
            "date": now_iso(),
            "git": new["git"],
            "machine_kind": new["machine_kind"],
            "match": not bad,
            "differs": bad,
            **{k: new.get(k) for k in FIGURES},
        }
    )
    # (saved with --log_check)
    if bad:
        why = (
            ""
            if old_kind == new["machine_kind"]
            else " (the record comes from another kind of machine, or does not say which: the figures depend on it)"
        )
        print(f"MISMATCH: {', '.join(bad)}{why}")
    else:
        print("MATCH: the command prints the recorded figures")
    return not bad


# ----------------------------------------------------------------------------------------------------------
# The page's tables
# ----------------------------------------------------------------------------------------------------------
def table(record: dict) -> str:
    """docs/reproduce.md's tables: per paper table, one row per recorded rule: its runs' command, the paper's number,
    what seed 0's command prints (avg@8 and greedy after), the seeds' gain and AUROCs (mean ± population std and
    range); under them, the commits and machines. Rows whose runs were not recorded with their command, commit and
    machine are left out and listed."""
    results = record.get("results", {})

    def cell(s, d, sign=""):  # mean ± std (the seeds' range)
        if s.get("mean") is None:
            return "–"
        return f"{s['mean']:{sign}.{d}f} ± {s['std']:.{d}f} ({s['min']:{sign}.{d}f} to {s['max']:{sign}.{d}f})"

    out, kinds, commits, missing = [], {}, set(), []
    for where in dict.fromkeys(t for _, t, _, _, _ in RULES):
        rows = []
        for name, t, flags, paper, what in RULES:
            runs = results.get(name, {}).get("runs", [])
            if t != where:
                continue
            if not runs or not all(recorded(r) for r in runs):
                missing.append(name)
                continue
            tags = []
            for r in runs:
                tags.append(kinds.setdefault(r["machine_kind"], f"M{len(kinds) + 1}"))
                commits.add(
                    r["git"]["commit"][:7] + (" + uncommitted .py" if r["git"].get("dirty_python_files") else "")
                )
            r = results[name]
            s0 = next((x for x in runs if x["seed"] == 0), None)
            prints = f"{s0['avg8_after']:.3f} / {s0['greedy_after']:.3f}" if s0 else "–"
            seeds = ",".join(str(x["seed"]) for x in runs)
            cmds = "`, `".join(sorted({x["command"].rsplit(" --seed ", 1)[0] + " --seed S" for x in runs}))
            rows.append(
                f"| {name}: {what} | `{cmds}` (S = {seeds}) | {'–' if paper is None else f'{paper:.2f}'} | "
                f"{prints} | {cell(r['gain'], 1, '+')} | {cell(r['auroc_first_wrong'], 3)} | "
                f"{cell(r['auroc_result_digits'], 3)} | {', '.join(sorted(set(tags)))} |"
            )
        if rows:
            out += [
                f"\n**{where}**\n",
                "| row | toy command | paper | seed 0 prints: avg@8 / greedy after | "
                "avg@8 gained (points) | AUROC first wrong | AUROC result digits | machine |",
                "|---|---|---|---|---|---|---|---|",
                *rows,
            ]
    if kinds:
        out.append(
            "\nMachines: "
            + "; ".join(f"{tag} = {kind}" for kind, tag in kinds.items())
            + f". Commits: {', '.join(sorted(commits))}."
        )
    if missing:
        out.append(
            f"\nNot in these tables (no run recorded with its command, commit and machine): {', '.join(missing)}."
        )
    return "\n".join(out)


def write_page(page: Path, text: str) -> None:
    """Replace what stands between the page's ``<!-- tables -->`` and ``<!-- /tables -->`` lines."""
    doc = page.read_text()
    start, end = "<!-- tables -->", "<!-- /tables -->"
    if start not in doc or end not in doc:
        raise SystemExit(f"reproduce.py: --page {page}: no '{start}' ... '{end}' block to replace")
    head, rest = doc.split(start, 1)
    page.write_text(f"{head}{start}\n{text.strip()}\n{end}{rest.split(end, 1)[1]}")
    print(f"wrote the tables of {page}")


def main(argv=None) -> int:
    before = os.environ.get("ATEN_CPU_CAPABILITY")
    try:
        return _main(argv)
    finally:  # the kernels pinned for the runs, not for the caller's later work
        if before is None:
            os.environ.pop("ATEN_CPU_CAPABILITY", None)
        else:
            os.environ["ATEN_CPU_CAPABILITY"] = before


def _main(argv) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rules", default="", help="comma-separated names of RULES to run (default: all)")
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--jobs", type=int, default=1, help="runs at a time (1: the machine is shared)")
    ap.add_argument("--root", default=str(REPO / "runs" / "reproduce"), help="where the run folders go")
    ap.add_argument("--record", "--out", default=str(RECORD), help="the record (JSON) runs are merged into")
    ap.add_argument("--check", default="", metavar="ROW", help="rerun ROW's --seed and compare it with the record")
    ap.add_argument("--seed", type=int, default=0, help="with --check: the seed")
    ap.add_argument(
        "--keep", action="store_true", help="with --check: keep its run folder (default: a temporary one, deleted)"
    )
    ap.add_argument(
        "--log_check",
        action="store_true",
        help="with --check: add its outcome (date, commit, machine, match) to the record's run",
    )
    ap.add_argument(
        "--extra",
        default="",
        help="flags added to every run's command (tiny smoke-test runs); they are part of the recorded command",
    )
    ap.add_argument(
        "--cpu_capability",
        default=CAPABILITY_DEFAULT,
        choices=["default", "avx2", "avx512"],
        help="torch's CPU kernels for new runs (ATEN_CPU_CAPABILITY; --check uses its record's)",
    )
    ap.add_argument("--table", action="store_true", help="only print the tables from the record")
    ap.add_argument("--page", default="", help="with --table: also write them into this page's tables block")
    args = ap.parse_args(argv)
    names = [r[0] for r in RULES]
    chosen = [r for r in RULES if not args.rules or r[0] in args.rules.split(",")]
    unknown = set(filter(None, args.rules.split(","))) - set(names) | ({args.check} - set(names) - {""})
    if unknown:
        raise SystemExit(f"reproduce.py: error: unknown rule {sorted(unknown)} (names: {names})")
    record_path, extra = Path(args.record), shlex.split(args.extra)
    record = load_record(record_path)
    if args.check:
        ok = check(record, args.check, args.seed, extra, args.keep)
        if args.log_check:
            save_record(record_path, record)
        return 0 if ok else 1
    if args.table:
        print(table(record))
        if args.page:
            write_page(Path(args.page), table(record))
        return 0
    cannot = pin_capability(args.cpu_capability)
    if cannot:
        raise SystemExit(f"reproduce.py: --cpu_capability {args.cpu_capability}: {cannot}")
    seeds, root = [int(s) for s in args.seeds.split(",")], Path(args.root)
    jobs = [(name, seed, command(flags, seed, extra)) for seed in seeds for name, _, flags, _, _ in chosen]
    with ThreadPoolExecutor(args.jobs) as pool:  # (seed-major: rows fill evenly)
        done = list(pool.map(lambda j: (j[0], run(root, *j)), jobs))
    for name, *_ in chosen:
        new = [r for n, r in done if n == name]
        if new:
            merge(record, name, new)
    save_record(record_path, record)
    print(table(record))
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
