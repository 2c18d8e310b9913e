"""evaluate.py's benchmark command around the evaluation: its flags, the rows and the model it loads, the results
folder it writes (results.json and results.md, and delta_paper.json / .md when the folder holds DelTA's seven
benchmarks; the benchmarks an earlier run with the same settings left there are kept), the tables and bar charts it
prints (one row per benchmark and the overall row; DelTA's Table 1 row laid out as the paper prints it; ``--compare``:
two results side by side), and, for a checkpoint of a grpo.py run, the figures the run logged beside this evaluation's.

Each benchmark's metrics come from evaluate.py and are handed in: nothing here computes an accuracy. Over benchmarks
it averages them, weighted by their questions (``overall_metrics``; ``delta_paper_table``: DelTA's Table 1 row and
its "Avg"). Imported by evaluate.py (which this module does not import: no circle); imports verify.py (the grader's
reasons, counted), trainer/checkpoint.py (library versions), policy.py (the model), problems.py (the rows) and
responses_file.py (the sampling rules).
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import verify
from trainer import checkpoint, policy, problems, responses_file

# The column headers of DelTA's Table 1 (the benchmarks of problems.DELTA_PAPER, in its order; delta.md, section 5).
DELTA_PAPER_COLUMNS = dict(
    zip(problems.DELTA_PAPER, ("AIME24", "AIME25", "AIME26", "HMMT25 Feb", "HMMT25 Nov", "HMMT26 Feb", "Brumo25"))
)


# ---- The command's flags and what it loads ---------------------------------------------------------------------------
class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, as grpo.py's parser (argparse would print the 20-line usage first)
        raise SystemExit(f"evaluate.py: error: {message} (python evaluate.py --help lists the flags)")


def help_text(protocols: dict) -> str:
    """The named suites and ``protocols`` (evaluate.PROTOCOLS) as ``--help`` lists them: benchmarks, flags."""

    def flags(table):
        return " ".join(
            f"--{k}" if v is True else f"--no-{k}" if v is False else f"--{k} {v}" for k, v in table.items()
        )

    suites = problems.SUITES.items()
    return (
        "suites (--benchmarks): "
        + "; ".join(f"{name}: {','.join(names)}" for name, names in suites)
        + " (delta_paper also prints DelTA's Table 1 row: one column per benchmark and the question-weighted "
        "Avg.). protocols (--protocol; a flag given beats the protocol's value): "
        + "; ".join(f"{name}: {flags(table)}" for name, table in protocols.items())
    )


def _ks(text: str) -> list[int]:  # --pass_k's type: argparse names the flag when a k is not an integer
    try:
        return [int(k) for k in text.split(",") if k.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: comma-separated integers, e.g. 1,8") from None


def build_parser(protocols: dict) -> argparse.ArgumentParser:
    """evaluate.py's flags; ``protocols``: its presets (evaluate.PROTOCOLS, the choices of ``--protocol``)."""
    ap = _Parser(
        description="Evaluate a model on math benchmarks (greedy, avg@k, pass@k).", epilog=help_text(protocols)
    )
    ap.add_argument("--model", default="toy", help="'toy', a local folder or a hub id")
    ap.add_argument(
        "--benchmarks",
        default="toy",
        help="comma-separated: a suite (all: the eight benchmarks; delta_paper: DelTA's seven, with its "
        "Table 1), toy, a benchmark name (" + ", ".join(problems.KNOWN_BENCHMARKS) + ") or a .jsonl path",
    )
    ap.add_argument(
        "--data_dir", default=None, help="folder of <name>.jsonl benchmark files (default: $RLVR_DATA_DIR or data/)"
    )
    ap.add_argument(
        "--protocol",
        choices=sorted(protocols),
        default=None,
        help="preset: delta = DelTA's evaluation (avg@16, T=1.0, top-p 0.7, 30k tokens, no greedy "
        "pass); greedy = one greedy response; a flag given beats the preset",
    )
    ap.add_argument("--prompt_template", default="auto", help="none | qwen_math | r1 | auto (as in training)")
    _add_generation_flags(ap)
    ap.add_argument("--limit", type=int, default=None, help="only the first N problems of each benchmark")
    ap.add_argument("--grade_workers", type=int, default=2, help="grading worker processes")
    ap.add_argument("--grade_timeout", type=float, default=5.0, help="seconds per graded response")
    ap.add_argument(
        "--num_threads", type=int, default=None, help="torch CPU threads (default: 1 for models under 10M parameters)"
    )
    ap.add_argument(
        "--output_dir",
        default=None,
        help="where results.json, results.md and the responses go (default: eval_results/<model>-<hash "
        "of the settings>); results of other benchmarks with the same settings there are kept",
    )
    ap.add_argument(
        "--overwrite",
        action="store_true",
        help="discard responses and results saved in --output_dir with other settings",
    )
    ap.add_argument(
        "--resample",
        action="store_true",
        help="generate every response anew, discarding those saved in --output_dir with these settings",
    )
    ap.add_argument("--no_plot", action="store_true", help="skip the PNG bar charts")
    ap.add_argument("--no_progress", action="store_true", help="no progress bar")
    ap.add_argument(
        "--compare",
        nargs=2,
        metavar=("A.json", "B.json"),
        help="print two results.json side by side with the difference, and exit",
    )
    return ap


def _add_generation_flags(ap: argparse.ArgumentParser) -> None:
    """The flags of evaluate.DEFAULT_SETTINGS (None: not given), ``--sampling`` and ``--pass_k``."""
    ap.add_argument("--num_samples", type=int, default=None, help="n sampled responses per problem (default 8)")
    ap.add_argument("--temperature", type=float, default=None, help="sampling temperature (default 1.0)")
    ap.add_argument("--top_p", type=float, default=None, help="nucleus mass (default 1.0)")
    ap.add_argument("--max_new_tokens", type=int, default=None, help="response budget in tokens (default 64)")
    ap.add_argument(
        "--greedy",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="also one greedy response per problem (default on; off in --protocol delta)",
    )
    ap.add_argument("--seed", type=int, default=None, help="base seed (default 0)")
    ap.add_argument("--batch_size", type=int, default=None, help="rows per generate call (default 256)")
    ap.add_argument(
        "--chunk_size", type=int, default=None, help="problems generated, saved and resumed together (default 32)"
    )
    ap.add_argument(
        "--sampling",
        choices=responses_file.SAMPLINGS,
        default=None,
        help="chunks: length-sorted chunks of --chunk_size, each with its own seed (resumes chunk by "
        "chunk); trainer: as grpo.py's held-out evaluation (file order, one pass per mode with "
        "--seed: its very responses; resumes mode by mode). Default: trainer for a trained run's "
        "checkpoint without --protocol, else chunks",
    )
    ap.add_argument("--pass_k", type=_ks, default=None, help="comma-separated ks for pass@k (default 1,2,4,...,n)")


def load_rows(benches: list[tuple[str, str]], data_dir, limit: int | None) -> dict[str, list[dict]]:
    """Every benchmark's rows (the first ``limit``), all before the model loads; ValueError for repeated ids."""
    data = {}
    for name, source in benches:
        rows = problems.load_benchmark(name, source, data_dir)[:limit]
        ids = [r["id"] for r in rows]
        if len(set(ids)) != len(ids):
            raise ValueError(f"benchmark {name}: problem ids must be unique (responses are saved by id)")
        data[name] = rows
    return data


def load_model(name: str, num_threads: int | None):
    """``policy.load_model_and_tokenizer(name)``; torch's CPU threads set to ``num_threads``, or to 1 for a model
    under 10M parameters (thread sync costs more than it gives)."""
    import torch

    model, tokenizer = policy.load_model_and_tokenizer(name)
    n_params = sum(p.numel() for p in model.parameters())
    if num_threads or n_params < 10_000_000:
        torch.set_num_threads(num_threads or 1)
    return model, tokenizer


def check_context(model, tokenizer, data: dict, template: str, max_new_tokens: int, protocol) -> None:
    """Refuse, in one line and before any generation, a setting whose longest prompt (after ``template``) plus
    ``max_new_tokens`` exceeds the model's context (``config.max_position_embeddings``; a model without one is not
    checked): the model's context, the longest prompt, the protocol's budget and the flag that changes it."""
    import rollout

    context = getattr(getattr(model, "config", None), "max_position_embeddings", None)
    if not context or not any(data.values()):
        return
    lengths = {
        (name, row["id"]): len(tokenizer(rollout.apply_template(row["problem"], template))["input_ids"])
        for name, rows in data.items()
        for row in rows
    }
    (name, problem), longest = max(lengths.items(), key=lambda item: item[1])
    if longest + max_new_tokens > context:
        budget = f"--protocol {protocol}'s" if protocol else "the"
        raise ValueError(
            f"the model's context is {context} positions; the prompt of {name} problem {problem} has {longest} "
            f"tokens and {budget} --max_new_tokens is {max_new_tokens}: {longest + max_new_tokens} > {context} (lower "
            "--max_new_tokens, or evaluate a model with a longer context: --protocol delta is for a real model)"
        )


def trained_run(model: str) -> dict | None:
    """The flags of the grpo.py run ``model`` is a checkpoint of (``<run>/final`` or ``<run>/checkpoint-<step>``:
    ``<run>/config.json``'s ``config``, with ``num_processes`` added), or None for any other model."""
    if not os.path.isdir(model):  # "toy" or a hub id: no run folder above it (never the current folder's config)
        return None
    try:
        with open(os.path.join(os.path.dirname(os.path.normpath(model)), "config.json")) as f:
            saved = json.load(f)
        return {**saved["config"], "num_processes": saved.get("num_processes", 1)}
    except (OSError, ValueError, KeyError, TypeError):
        return None


# ---- Over benchmarks: the overall row and DelTA's Table 1 row (question-weighted averages of evaluate.py's metrics) --
def weighted_average(values) -> float:
    """``sum_b n_b * v_b / sum_b n_b`` of ``(n_b, v_b)`` pairs: per-benchmark values (an accuracy, a length) weighted by
    their question counts n_b (ints >= 1). The DelTA paper's "Avg" (docs/specs/delta.md section 5: each Avg of its Table
    1 is reproduced with n = 30 per benchmark and 33 for HMMT26 Feb). Raises ValueError: no pairs, or a bad n_b."""
    values = list(values)
    if not values:
        raise ValueError("weighted_average needs at least one (questions, value) pair")
    bad = [n for n, _ in values if isinstance(n, bool) or not isinstance(n, int) or n < 1]
    if bad:
        raise ValueError(f"question counts must be ints >= 1, got {bad}")
    return sum(n * v for n, v in values) / sum(n for n, _ in values)


def overall_metrics(benchmarks: dict[str, dict]) -> dict:
    """The overall row: the metrics present in every benchmark, weighted by their number of problems
    (:func:`weighted_average`), counts (``num_problems``, grader failures) summed, ``*/max_length`` the max.

    Raises ValueError: no benchmarks, or a benchmark without ``num_problems`` >= 1.
    """
    if not benchmarks:
        raise ValueError("overall_metrics needs at least one benchmark")
    for name, m in benchmarks.items():
        if not isinstance(m.get("num_problems"), int) or m["num_problems"] < 1:
            raise ValueError(f"benchmark {name!r} has no num_problems >= 1")
    first = next(iter(benchmarks.values()))
    numeric = [
        k
        for k in first
        if all(isinstance(m.get(k), (int, float)) and not isinstance(m[k], bool) for m in benchmarks.values())
    ]
    out = {}
    for k in numeric:
        values = [(m["num_problems"], m[k]) for m in benchmarks.values()]
        if k == "num_problems" or k.split("/")[-1] in verify.REASONS:  # counts
            out[k] = sum(v for _, v in values)
        elif k.endswith("/max_length"):
            out[k] = max(v for _, v in values)
        else:
            out[k] = weighted_average(values)
    return out


def delta_paper_table(results: dict, delta_protocol: dict) -> dict | None:
    """This run as a row of DelTA's Table 1 (docs/specs/delta.md, section 5; laid out by ``format_delta_paper_table``;
    ``delta_protocol``: evaluate.PROTOCOLS["delta"], the settings a note names where the run's differ), or None
    without all seven of ``problems.DELTA_PAPER``: ``{"model", "protocol", "metric", "columns", "benchmarks": {name:
    {"column", "questions", "accuracy"}}, "questions", "avg", "notes"}``, the accuracy avg@n (greedy without samples),
    "avg" their question-weighted average, "notes" where the run is not DelTA's evaluation (questions, settings)."""
    b = results["benchmarks"]
    if not all(name in b for name in problems.DELTA_PAPER):
        return None
    settings = results.get("settings", {})
    n = settings.get("num_samples", 0)
    metric = f"avg@{n}" if n else "greedy"
    cells = {
        name: {"column": DELTA_PAPER_COLUMNS[name], "questions": b[name]["num_problems"], "accuracy": b[name][metric]}
        for name in problems.DELTA_PAPER
    }
    total = sum(c["questions"] for c in cells.values())
    questions = problems.DELTA_PAPER_QUESTIONS
    notes = [f"{total} questions, not DelTA's {questions}"] if total != questions else []
    notes += [
        f"{k} {settings[k]} (delta: {v})" for k, v in delta_protocol.items() if k in settings and settings[k] != v
    ]
    return {
        "model": results.get("model"),
        "protocol": results.get("protocol"),
        "metric": metric,
        "columns": [DELTA_PAPER_COLUMNS[name] for name in problems.DELTA_PAPER],
        "benchmarks": cells,
        "questions": total,
        "avg": weighted_average((c["questions"], c["accuracy"]) for c in cells.values()),
        "notes": notes,
    }


# ---- The results folder ----------------------------------------------------------------------------------------------
def new_results(args: argparse.Namespace, template: str, settings: dict, run_hash: str) -> dict:
    """results.json before any benchmark: the model, protocol, template, ``settings`` (the generation settings, the
    sampling rule, pass ks, stop ids, limit, grade timeout), the settings hash and the library versions."""
    return {
        "model": args.model,
        "protocol": args.protocol,
        "prompt_template": template,
        "settings": settings,
        "settings_hash": run_hash,
        "versions": checkpoint.library_versions(),
        "benchmarks": {},
        "run": {"seconds": {}, "reused_responses": {}},
    }


def model_slug(name: str) -> str:
    """A folder name for ``--model``: ``toy``, ``Qwen3-8B-Base`` (a hub id), ``delta-final`` (``runs/delta/final``)."""
    parts = Path(name.rstrip("/")).parts
    return "-".join(parts[-2:]) if os.path.isdir(name) else parts[-1]


def earlier_results(output_dir: str, run_hash: str, overwrite: bool) -> dict:
    """The benchmarks of an earlier ``results.json`` in ``output_dir`` made with the same settings (kept in the new
    one); with other settings, a ValueError, unless ``overwrite`` (then they are dropped)."""
    path = os.path.join(output_dir, "results.json")
    if not os.path.exists(path):
        return {}
    with open(path, encoding="utf-8") as f:
        old = json.load(f)
    if old.get("settings_hash") == run_hash:
        return old.get("benchmarks", {})
    if overwrite:
        return {}
    raise ValueError(
        f"{path} holds results made with different settings (model {old.get('model')}, protocol "
        f"{old.get('protocol')}): choose another --output_dir, or pass --overwrite to replace them"
    )


def default_folder(model: str, run_hash: str) -> str:
    """``--output_dir``'s default: ``eval_results/<model slug>-<the settings hash's first 8 characters>``."""
    return os.path.join("eval_results", f"{model_slug(model)}-{run_hash[:8]}")


def load_results(path: str) -> dict:
    """A results.json, for ``--compare``. Raises ValueError: not JSON (one line, naming it); OSError: missing."""
    with open(path, encoding="utf-8") as f:
        try:
            return json.load(f)
        except ValueError as e:
            raise ValueError(f"--compare {path}: not a results.json file ({e})") from None


def save_and_print(results: dict, args: argparse.Namespace, run_heldout: dict | None) -> None:
    """Write results.json and results.md into ``--output_dir`` (and delta_paper.json / delta_paper.md when the folder
    holds DelTA's seven benchmarks); print the settings line, the table(s), the trainer's figures for the same
    checkpoint (``run_heldout``: its held-out settings, evaluate.run_settings), the bar charts (unless ``--no_plot``)
    and where everything is."""
    settings = results["settings"]
    table = format_table(results)
    paper = format_delta_paper_table(results["delta_paper"]) if "delta_paper" in results else None
    outputs = [("results", results, table)] + ([("delta_paper", results["delta_paper"], paper)] if paper else [])
    for stem, data, text in outputs:
        with open(os.path.join(args.output_dir, f"{stem}.json"), "w", encoding="utf-8") as f:
            json.dump(data, f, indent=1)
        with open(os.path.join(args.output_dir, f"{stem}.md"), "w", encoding="utf-8") as f:
            f.write(text + "\n")
    print(
        f"\nmodel {args.model} | template {results['prompt_template']} | protocol {args.protocol or '-'} | "
        + ", ".join(
            f"{k}={settings[k]}" for k in ("num_samples", "temperature", "top_p", "max_new_tokens", "greedy", "seed")
        )
        + "\n"
    )
    print(table)
    if paper:
        print(
            f"\nDelTA's Table 1 (--benchmarks delta_paper; {results['delta_paper']['metric']}, Avg. weighted by "
            f"question count):\n{paper}"
        )
    figures = trainer_figures(args.model, results, settings, run_heldout)  # the same checkpoint, as grpo.py logged it
    for line in figures:
        print(line)
    if not args.no_plot:
        pngs = plot_results(results, args.output_dir)
        print(
            f"\nbar charts: {len(pngs)} PNG in {args.output_dir}"
            if pngs
            else "\n(matplotlib not installed: no bar charts)"
        )
    print(
        f"results: {os.path.join(args.output_dir, 'results.json')}"
        + (f"; DelTA's table: {os.path.join(args.output_dir, 'delta_paper.md')}" if paper else "")
        + "; responses: "
        f"{os.path.join(args.output_dir, '<benchmark>_responses.jsonl')}"
    )


# ---- The tables and charts it prints ---------------------------------------------------------------------------------
def _pct(v) -> str:
    return "–" if v is None else f"{100 * v:.1f}"


def _acc_columns(results: dict) -> list[str]:
    """The accuracy keys shown: greedy, avg@n, pass@k (k ascending), as present in the overall metrics."""
    m = results.get("overall") or next(iter(results["benchmarks"].values()), {})
    avg = [k for k in m if k.startswith("avg@")]
    passes = sorted((k for k in m if k.startswith("pass@")), key=lambda k: int(k[5:]))
    return (["greedy"] if "greedy" in m else []) + avg + passes


def format_table(results: dict) -> str:
    """The results as a markdown table: one row per benchmark and the overall row; accuracies in %.

    Length, truncation and boxed columns are those of the sampled responses when there are any, else of the
    greedy ones; time-outs and parse errors are summed over both modes.
    """
    cols = _acc_columns(results)
    rows = list(results["benchmarks"].items()) + ([("**overall**", results["overall"])] if "overall" in results else [])
    mode = "sample" if any("sample/mean_length" in m for _, m in rows) else "greedy"
    head = (
        ["benchmark", "problems"]
        + cols
        + [f"mean len ({mode})", "max len", "truncated %", "boxed %", "timeouts", "parse errors"]
    )
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join(["---"] + ["---:"] * (len(head) - 1)) + "|"]
    for name, m in rows:

        def count(reason):
            return sum(m.get(f"{md}/{reason}", 0) for md in ("greedy", "sample"))

        cells = [name, str(m.get("num_problems", ""))] + [_pct(m.get(c)) for c in cols]
        cells += [
            f"{m[f'{mode}/mean_length']:.1f}" if f"{mode}/mean_length" in m else "–",
            str(m.get(f"{mode}/max_length", "–")),
            _pct(m.get(f"{mode}/truncation_rate")),
            _pct(m.get(f"{mode}/boxed_rate")),
            str(count("timeout")),
            str(count("parse_error")),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def format_delta_paper_table(table: dict) -> str:
    """A ``delta_paper_table`` laid out as DelTA's Table 1: a header ``Model | Metric | AIME24 | ... |
    Brumo25 | Avg.``, the run's row (accuracies in %, two decimals, as the paper prints them) and a ``questions`` row
    (the counts the average is weighted by); its notes, if any, under the table."""
    head = ["Model", "Metric"] + table["columns"] + ["Avg."]
    cells = list(table["benchmarks"].values())
    lines = [
        "| " + " | ".join(head) + " |",
        "|" + "|".join(["---"] * 2 + ["---:"] * (len(head) - 2)) + "|",
        "| "
        + " | ".join(
            [str(table["model"]), table["metric"]]
            + [f"{100 * c['accuracy']:.2f}" for c in cells]
            + [f"{100 * table['avg']:.2f}"]
        )
        + " |",
        "| " + " | ".join(["questions", ""] + [str(c["questions"]) for c in cells] + [str(table["questions"])]) + " |",
    ]
    if table["notes"]:
        lines.append("\nNot DelTA's evaluation: " + "; ".join(table["notes"]) + ".")
    return "\n".join(lines)


def format_compare(a: dict, b: dict, overall: list[dict], label_a: str = "A", label_b: str = "B") -> str:
    """Two results side by side: for each accuracy metric both have, A, B and B − A (points) per benchmark.

    Benchmarks in only one of the two are listed with "–"; ``overall``: the two overall rows over the benchmarks both
    hold (overall_metrics), labelled "overall (shared)" when the two sets differ. Settings that differ are
    listed under the table.
    """
    cols = [c for c in _acc_columns(a) if c in _acc_columns(b)]
    if not cols:
        raise ValueError("the two results share no accuracy metric (greedy, avg@k, pass@k)")
    names = list(a["benchmarks"]) + [n for n in b["benchmarks"] if n not in a["benchmarks"]]
    shared = [n for n in names if n in a["benchmarks"] and n in b["benchmarks"]]
    head = ["benchmark", "problems"] + [f"{c} {lab}" for c in cols for lab in (label_a, label_b, "Δ")]
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join(["---"] + ["---:"] * (len(head) - 1)) + "|"]

    def row(name, ma, mb):
        n = (ma or mb or {}).get("num_problems", "")
        cells = [name, str(n)]
        for c in cols:
            va, vb = (ma or {}).get(c), (mb or {}).get(c)
            d = f"{100 * (vb - va):+.1f}" if va is not None and vb is not None else "–"
            cells += [_pct(va), _pct(vb), d]
        return "| " + " | ".join(cells) + " |"

    for name in names:
        lines.append(row(name, a["benchmarks"].get(name), b["benchmarks"].get(name)))
    if shared:
        same = set(a["benchmarks"]) == set(b["benchmarks"])
        lines.append(row("**overall**" if same else "**overall (shared)**", overall[0], overall[1]))
    notes = []
    for key in ("model", "protocol", "prompt_template"):
        if a.get(key) != b.get(key):
            notes.append(f"{key}: {a.get(key)} vs {b.get(key)}")
    sa = a.get("settings", {})
    sb = b.get("settings", {})
    for key in sorted(set(sa) | set(sb)):
        if sa.get(key) != sb.get(key):
            notes.append(f"{key}: {sa.get(key)} vs {sb.get(key)}")
    out = "\n".join(lines)
    if notes:
        out += f"\n\nDifferences ({label_a} vs {label_b}): " + "; ".join(notes)
    return out


def plot_results(results: dict, output_dir: str | os.PathLike) -> list[str]:
    """One bar chart (PNG) per benchmark and one for the overall row: greedy, avg@n and pass@k in %.

    Returns the written paths; returns ``[]`` (nothing written) when matplotlib is not installed.
    """
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return []
    cols = _acc_columns(results)
    paths = []
    items = list(results["benchmarks"].items()) + ([("overall", results["overall"])] if "overall" in results else [])
    for name, m in items:
        keys = [c for c in cols if c in m]
        values = [100 * m[c] for c in keys]
        fig, ax = plt.subplots(figsize=(max(3.4, 1.2 + 0.8 * len(keys)), 3.2))
        colors = ["#4c72b0" if k == "greedy" else "#dd8452" if k.startswith("avg") else "#55a868" for k in keys]
        bars = ax.bar(keys, values, width=0.8 if len(keys) > 2 else 0.5, color=colors)
        ax.bar_label(bars, fmt="%.1f", fontsize=8)
        ax.set_xlim(-1, len(keys))
        ax.set_ylim(0, max(100.0, max(values, default=0) * 1.1))
        ax.set_ylabel("accuracy (%)")
        ax.set_title(
            f"{name} ({m.get('num_problems', '?')} problems)\n{Path(str(results.get('model', ''))).name}", fontsize=9
        )
        ax.tick_params(axis="x", labelrotation=45, labelsize=8)
        fig.tight_layout()
        p = os.path.join(output_dir, f"{name}.png")
        fig.savefig(p, dpi=110)
        plt.close(fig)
        paths.append(p)
    return paths


def trainer_figures(model: str, results: dict, settings: dict, run_heldout: dict | None) -> list[str]:
    """When ``model`` is a checkpoint of a grpo.py run (``<run>/final`` or ``<run>/checkpoint-<step>``) and a
    benchmark here is that run's held-out set: the lines that set this evaluation beside the one the run logged in
    metrics.jsonl, and say whether the two drew the same responses (``--sampling trainer`` with the run's held-out
    settings, in one process: the same figures) or why sampled figures differ (the same model, other draws).
    ``run_heldout``: the run's held-out settings (evaluate.run_settings), None for a model that is no run's."""
    run = os.path.dirname(os.path.normpath(model))
    cfg = trained_run(model)
    try:
        with open(os.path.join(run, "metrics.jsonl")) as f:
            logged = [r for r in map(json.loads, f) if any(k.startswith("eval/") for k in r)]
    except (OSError, ValueError):
        return []
    if cfg is None or run_heldout is None:
        return []
    step = (
        int(os.path.basename(os.path.normpath(model)).rpartition("-")[2])
        if "checkpoint-" in model
        else cfg.get("max_steps")
    )
    heldout = cfg.get("eval_data") or ("toy" if cfg.get("data") == "toy" else "")
    mine = next((m for name, m in results["benchmarks"].items() if heldout in (name, m.get("source"))), None)
    theirs = next((r for r in logged if r["step"] == step), None)
    k = settings["num_samples"]
    if mine is None or theirs is None or f"eval/avg@{k}" not in theirs or f"avg@{k}" not in mine:
        return []
    p = mine[f"avg@{k}"]
    n = mine["num_problems"] * k
    greedy = mine.get("greedy", float("nan"))
    head = (
        f"\ngrpo.py logged for this checkpoint (step {step}): avg@{k} {theirs[f'eval/avg@{k}']:.3f}, greedy "
        f"{theirs['eval/greedy']:.3f}; here: avg@{k} {p:.3f}, greedy {greedy:.3f}."
    )
    expected = {**run_heldout, "num_samples": k}
    other = [f"--{key} {settings[key]} (run: {v})" for key, v in expected.items() if settings.get(key) != v]
    other += [f"--sampling {settings.get('sampling')}"] if settings.get("sampling") != "trainer" else []
    other += [f"--limit {results['settings']['limit']}"] if results.get("settings", {}).get("limit") else []
    if not other and cfg.get("num_processes", 1) == 1:
        return [
            head,
            "The same responses as the trainer's evaluation (--sampling trainer, the run's held-out "
            "settings): the figures agree.",
        ]
    why = (
        ", ".join(other)
        if other
        else f"the run evaluated on {cfg['num_processes']} processes, each drawing its own share of the problems"
    )
    same = abs(greedy - theirs.get("eval/greedy", float("nan"))) < 1e-9
    return [
        head,
        f"The same model with other random draws ({why}; the trainer's: --sampling trainer with the run's "
        f"held-out settings). Sampled figures differ by sampling noise: one standard deviation of "
        f"avg@{k} over {n:,} responses is {(p * (1 - p) / max(n, 1)) ** 0.5:.3f}. Greedy decoding draws nothing"
        + (" and agrees." if same else ", but other batches round differently: an argmax tie can flip."),
    ]
