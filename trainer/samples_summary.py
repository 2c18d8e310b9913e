"""samples/summary.json: the numbers of one run's logged samples (``samples/step_*.jsonl``, written by
``run_setup.write_samples``), written when the run has finished (``run_setup.finish``, ``write_samples_summary``), so
that one run's numbers need no page; tools/report.py computes the same numbers for several runs (its ``<page>.json``)
and draws them.

* ``delta_tokens``: DelTA's token view, the tokens with the highest and lowest mean λ̄ per side (docs/specs/delta.md
  §5, "Token clouds").
* ``credit_lands``: where the credit c_{i,t} = Ã_{i,t} / Â_i lands against a task's truth of each logged response
  (its first wrong token, its result digits): the mean credit of each class of tokens and the AUROCs of the credit at
  picking them out. A task that knows the truth of its responses registers it here by its ``--data`` name
  (``register_truth``; the toy does, from ``toy.register``), and it is computed from each row's prompt and tokens
  when the row is read (``add_truth``); this file names no task.

Left out: the page (tools/report.py draws these numbers, with the curves and the tokens), metrics.jsonl and
summary.json (the page's, not the samples'). Standard library only: importing it loads no torch and no other
project file. Read next: tools/report.py, docs/report.md (the numbers' schema).
"""

import glob
import json
import os
import re
import statistics
from collections.abc import Callable
from dataclasses import dataclass

# The truth of a logged response for each task that knows it, by its --data name: ``TRUTH[data](prompt, tokens)`` ->
# ``{"first_wrong": token index | None, "result_digits": [token indices]}``, or None (not one of its problems).
TRUTH: dict[str, Callable[[str, list[str]], dict | None]] = {}
# The token classes, in the table's order: (key, heading, the responses they belong to).
CLASSES = [
    ("first_wrong", "first wrong token", "incorrect"),
    ("prefix", "shared prefix before it", "incorrect"),
    ("after", "after it", "incorrect"),
    ("result_digits", "result digits", "correct"),
    ("other", "other tokens", "correct"),
]
# DelTA's token view lists a token only when it occurs at least this often on a side of the run. Measured on a default
# 60-step toy run, λ̄ of one token has a std of 0.05-0.15 from place to place, so the mean of 20 has a standard
# error of 0.01-0.03, small against the ~0.1 between a side's highest and lowest listed means; rarer tokens would
# fill the two ends with noise.
MIN_TOKEN_COUNT = 20
TOP_TOKENS = 8  # DelTA's token view: how many highest and lowest tokens per side


def register_truth(data: str, truth: Callable[[str, list[str]], dict | None]) -> None:
    """``truth(prompt, tokens)`` is the truth of a logged response of the runs trained on ``--data data`` (``TRUTH``);
    again with the same name replaces it."""
    TRUTH[data] = truth


class RunError(ValueError):
    """A run folder that cannot be read, with the one line that says why."""


@dataclass
class RunSamples:
    """One run's logged samples and what names its numbers (tools/report.py's ``Run`` adds its curves)."""

    path: str
    name: str
    credit: str  # grpo, delta, cscr (config.json), or "" when unknown
    config: dict  # config.json's "config" (the flags)
    samples: dict[int, list[dict]]  # step -> the logged responses (samples/step_*.jsonl)


# --- Reading samples/ -------------------------------------------------------------------------------------------
def read_jsonl(path: str) -> tuple[list[dict], str]:
    """The JSON objects of a jsonl file, and ``""`` or one line saying what was left out: a torn last line (no
    newline at its end and not valid JSON: a run still writing it, or one killed mid-write) is left out,
    since jsonl files are appended a line at a time. Raises RunError naming the file and line for any other line
    that is not a JSON object (blank lines are skipped)."""
    rows = []
    with open(path, "rb") as f:  # bytes: a torn line may end inside a UTF-8 character
        lines = f.readlines()
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line.decode("utf-8"))
        except (json.JSONDecodeError, UnicodeDecodeError):
            if n == len(lines) and not line.endswith(b"\n"):  # half a line: the writer has not finished it
                return rows, f"{path} line {n}: left out a torn last line ({len(line)} bytes, no newline)"
            row = None
        if not isinstance(row, dict):
            raise RunError(f"{path} line {n}: not a JSON object")
        rows.append(row)
    return rows, ""


def read_samples(path: str) -> tuple[dict[int, list[dict]], list[str]]:
    """The logged responses of the run folder ``path`` (``samples/step_*.jsonl``): {step: rows}, steps with rows only;
    and one line per file whose torn last line was left out (``read_jsonl``). Raises RunError naming the file and line:
    a line that is not JSON, a row without its fields or whose ``tokens`` and ``credit`` differ in length."""
    samples, left_out = {}, []
    for file in sorted(glob.glob(os.path.join(path, "samples", "step_*.jsonl"))):
        m = re.fullmatch(r"step_(\d+)\.jsonl", os.path.basename(file))
        rows, torn = read_jsonl(file) if m else ([], "")
        left_out += [torn] if torn else []
        for n, row in enumerate(rows, 1):
            missing = [k for k in ("prompt", "response", "reward", "advantage") if k not in row]
            if missing:
                raise RunError(f"{file} line {n}: no {missing[0]!r}")
            if "tokens" in row and len(row["tokens"]) != len(row.get("credit", ())):
                raise RunError(f"{file} line {n}: 'tokens' and 'credit' differ in length")
        if rows:
            samples[int(m.group(1))] = rows
    return samples, left_out


def add_truth(samples: dict, data: str | None) -> None:
    """Each logged response's truth (``TRUTH[data]`` of the row's prompt and tokens: its first wrong token, its result
    digits) under ``truth``, for a run on a task that registered one (``register_truth``); a row that has one, from a
    run folder of an older grpo.py, keeps it."""
    truth_of = TRUTH.get(data)
    if truth_of is None:
        return
    for rows in samples.values():
        for row in rows:
            truth = truth_of(row["prompt"], row["tokens"]) if "tokens" in row and "truth" not in row else None
            if truth is not None:
                row["truth"] = truth


# --- The numbers ------------------------------------------------------------------------------------------------
def has_truth(run: RunSamples) -> bool:
    """A run whose samples/ rows carry their truth (``logged_truth``): a run on a task that registered its truth (the
    built-in toy)."""
    return any("truth" in row for rows in run.samples.values() for row in rows)


def auroc(pos: list[float], neg: list[float]) -> float:
    """The Mann–Whitney AUROC: the probability that a score drawn from ``pos`` exceeds one drawn from ``neg``,
    ties counting 1/2 (so all-equal scores give exactly 0.5): U / (|pos|·|neg|) (Mann & Whitney 1947; Hanley &
    McNeil 1982). Raises ZeroDivisionError when a list is empty."""
    wins = sum((p > q) + 0.5 * (p == q) for p in pos for q in neg)
    return wins / (len(pos) * len(neg))


def logged_truth(row: dict) -> dict | None:
    """A logged response's truth (``add_truth``: ``TRUTH[data]``): ``{"first_wrong": token index | None,
    "result_digits": [token indices]}``, or None: none known (no tokens, not one of the task's problems, a run on a
    task with no truth)."""
    return row.get("truth") if "tokens" in row else None


def token_classes(row: dict) -> tuple[str, dict[str, list[int]]]:
    """(kind, {class key: token indices}) of one logged response whose truth is known (``CLASSES``).

    kind: ``correct`` (reward > 0: its result digits and other tokens), ``incorrect`` (its first wrong token, the
    shared prefix before it, the tokens after it), or, with no classes, ``no_gradient`` (Â = 0, or every credit 0:
    left out of the loss by --mask_truncated_completions), ``no_wrong_token`` (incorrect, yet a prefix of a correct
    solution: it ran out of tokens before writing anything wrong), ``not_toy`` (no tokens, or no truth known).
    """
    if not row.get("advantage") or not any(row.get("credit", ())):
        return "no_gradient", {}
    truth = logged_truth(row)
    if truth is None:
        return "not_toy", {}
    n = len(row["tokens"])
    if row["reward"] > 0:
        digits = set(truth["result_digits"])
        return "correct", {"result_digits": sorted(digits), "other": [i for i in range(n) if i not in digits]}
    k = truth["first_wrong"]
    if k is None:
        return "no_wrong_token", {}
    return "incorrect", {"first_wrong": [k], "prefix": list(range(k)), "after": list(range(k + 1, n))}


def _over_steps(by_step: dict[int, list[float]]) -> dict:
    """Pooled mean of every value (each token or response once), count, and the spread of the per-step means:
    min, max and population std over the steps that have a value; ``per_step``: [step, mean, count]."""
    vals = [v for s in sorted(by_step) for v in by_step[s]]
    if not vals:
        return {"mean": None, "count": 0, "step_min": None, "step_max": None, "step_std": None, "per_step": []}
    per_step = [[s, sum(v) / len(v), len(v)] for s, v in sorted(by_step.items())]
    means = [m for _, m, _ in per_step]
    return {
        "mean": sum(vals) / len(vals),
        "count": len(vals),
        "step_min": min(means),
        "step_max": max(means),
        "step_std": statistics.pstdev(means),
        "per_step": per_step,
    }


def states_own_credit(run: RunSamples) -> bool:
    """Whether the run's credit function states each token's credit c itself, its Ã being no multiple of Â (its rows
    carry ``credit_share``: run_setup.credit_shares; verl's Optimal Token Baseline, comparisons/otb.py)."""
    return any("credit_share" in row for rows in run.samples.values() for row in rows)


def credit_lands(run: RunSamples) -> dict:
    """The numbers of "Where the credit lands" for one run with truth (a toy run), from every logged step (rows with
    Â ≠ 0 only).

    ``classes``: per class of ``CLASSES``, the credit c = Ã_{i,t}/Â_i of its tokens (``_over_steps``: mean over
    tokens, count = tokens, spread of the per-step means). ``auroc``: ``first_wrong``, per incorrect response the
    Mann–Whitney AUROC of c at telling its first wrong token from its other tokens (higher c = more of Â_i, which
    for Â_i < 0 is more of the penalty: AUROC > 0.5 means the first wrong token is penalised more than the rest);
    ``result_digits``, per correct response the AUROC of c at telling its result digits from its other tokens; each
    averaged over responses (``_over_steps``, count = responses; a response without a token of either kind is left
    out). ``responses``: how many logged responses were of each kind (``token_classes``). ``equal_reward``: the
    rows with Â_i = 0 (a group whose rewards are all equal), kept apart: how many there are, how many of their
    tokens carry credit (|c| > 1e-6; only a credit whose Ã is no multiple of Â gives them any, OTB's zero tail,
    where its c is Ã itself) and those tokens' mean c, for a run whose credit states its own c (``states_own_credit``);
    None for the other runs.
    """
    by_class = {key: {} for key, _, _ in CLASSES}
    aurocs = {"first_wrong": {}, "result_digits": {}}
    kinds = dict.fromkeys(("correct", "incorrect", "no_wrong_token", "no_gradient", "not_toy"), 0)
    apart = {"responses": 0, "credited_tokens": {}} if states_own_credit(run) else None
    for step, rows in sorted(run.samples.items()):
        for row in rows:
            if apart is not None and not row.get("advantage") and "credit" in row:
                apart["responses"] += 1
                credited = [c for c in row["credit"] if abs(c) > 1e-6]
                if credited:  # (_over_steps: a step's list is never empty)
                    apart["credited_tokens"].setdefault(step, []).extend(credited)
            kind, classes = token_classes(row)
            kinds[kind] += 1
            c = row.get("credit", ())
            for key, idx in classes.items():
                if idx:  # a first wrong token at 0 has no shared prefix, a last one nothing after it
                    by_class[key].setdefault(step, []).extend(c[i] for i in idx)
            if classes:
                key = "first_wrong" if kind == "incorrect" else "result_digits"
                chosen = set(classes[key])
                pos = [c[i] for i in chosen]
                neg = [x for i, x in enumerate(c) if i not in chosen]
                if pos and neg:
                    aurocs[key].setdefault(step, []).append(auroc(pos, neg))
    return {
        "credit": run.credit,
        "path": run.path,
        "classes": {k: _over_steps(v) for k, v in by_class.items()},
        "auroc": {k: _over_steps(v) for k, v in aurocs.items()},
        "responses": kinds,
        "equal_reward": apart and {"responses": apart["responses"], **_over_steps(apart["credited_tokens"])},
    }


def delta_tokens(run: RunSamples, min_count: int = MIN_TOKEN_COUNT, top: int = TOP_TOKENS) -> dict:
    """DelTA's token view: the paper's token clouds of high- and low-λ tokens (docs/specs/delta.md §5, "Token
    clouds") as a table, of λ̄ = λ·N/Σλ (what samples/ logs; the same order as λ within a batch). Per side (``pos``:
    Â_i > 0, ``neg``: Â_i < 0), the ``top`` tokens (decoded text) with the highest and the lowest mean λ̄ over every
    logged step of the run, each as [token, mean λ̄, count]; only tokens seen at least ``min_count`` times on that
    side count (``MIN_TOKEN_COUNT``); ties in the mean go by the token's text.
    λ̄_{i,t} of a row is its credit c (Ã_{i,t} = Â_i·λ̄_{i,t}); rows with Â_i = 0 (no side), rows left out of the
    loss (every credit 0) and tokens a mask leaves out (credit 0) are not counted. Also per side: ``tokens``
    (occurrences), ``distinct``, ``listed``."""
    out = {}
    for side, sign in (("pos", 1), ("neg", -1)):
        lam_bar = {}
        for rows in run.samples.values():
            for row in rows:
                if "tokens" in row and (row.get("advantage") or 0) * sign > 0 and any(row["credit"]):
                    for tok, c in zip(row["tokens"], row["credit"]):
                        if c:  # 0: a mask (Forking Tokens, Q2) left the token out of the loss; λ̄ itself is > 0
                            lam_bar.setdefault(tok, []).append(c)
        kept = sorted(
            ((sum(v) / len(v), len(v), t) for t, v in lam_bar.items() if len(v) >= min_count),
            key=lambda x: (-x[0], x[2]),
        )
        low = sorted(kept, key=lambda x: (x[0], x[2]))
        out[side] = {
            "highest": [[t, m, n] for m, n, t in kept[:top]],
            "lowest": [[t, m, n] for m, n, t in low[:top]],
            "tokens": sum(map(len, lam_bar.values())),
            "distinct": len(lam_bar),
            "listed": len(kept),
        }
    return out


def truth_numbers(runs: list[RunSamples]) -> dict:
    """What samples/summary.json holds for one run and report.py's ``<page>.json`` for several:
    ``where_the_credit_lands`` (``credit_lands`` of each run with truth: the toy's) and ``delta_tokens``
    (``delta_tokens`` of each delta run), by run name; with the definitions in words. Empty when no run has truth
    or is DelTA's."""
    lands = {run.name: credit_lands(run) for run in runs if has_truth(run) and run.samples}
    views = {run.name: delta_tokens(run) for run in runs if run.credit == "delta" and run.samples}
    if not lands and not views:
        return {}
    return {
        "definitions": {
            "credit": "c = Ã_{i,t}/Â_i per token (GRPO 1, DelTA λ̄, CSCR w̃; 0 where a mask leaves the token out of the "
            "loss); a credit whose Ã is no multiple of Â states its own c (credit_share); only rows with Â_i ≠ 0",
            "equal_reward": "rows with Â_i = 0 kept apart (runs whose credit states its own c): responses, and the "
            "mean c (= Ã there) of their tokens with |c| > 1e-6 (count: those tokens)",
            "classes": "incorrect responses: first_wrong (toy.first_wrong_token), prefix (before it), after (after it);"
            " "
            "correct responses (reward > 0): result_digits (toy.result_digits), other",
            "mean": "over every token (classes) or response (auroc) of every logged step; count: tokens or responses",
            "spread": "step_min, step_max, step_std (population std) of the per-step means; "
            "per_step: [step, mean, count]",
            "auroc": "per response, Mann–Whitney AUROC (ties 1/2) of c: the class's tokens against the response's "
            "other "
            "tokens (higher c = more of Â_i; for Â_i < 0 more penalty), averaged over responses",
            "delta_tokens": f"per side (pos: Â_i > 0, neg: Â_i < 0) the {TOP_TOKENS} tokens with the highest / lowest "
            "mean "
            f"λ̄ (= c) over the run, [token, mean, count], tokens seen ≥ {MIN_TOKEN_COUNT} times",
        },
        "where_the_credit_lands": lands,
        "delta_tokens": views,
    }


def write_samples_summary(path: str, say=print) -> dict:
    """samples/summary.json of the run folder ``path``: ``truth_numbers`` of that run alone (DelTA's highest and
    lowest mean λ̄ tokens; on the toy, where the credit lands), so that one run's numbers need no page. Nothing is
    written for a run without samples/ or without such numbers (a GRPO run off the toy). grpo.py's ``train`` calls it
    on process 0 once the run has finished (``run_setup.finish``), its task's truth registered (``register_truth``). A
    torn last line of a samples file is left out and named in one line (``say``). Returns the numbers ({} when none)."""
    if not os.path.isdir(os.path.join(path, "samples")):
        return {}
    with open(os.path.join(path, "config.json")) as f:
        config = json.load(f).get("config", {})
    samples, left_out = read_samples(path)
    if left_out:
        say(f"samples/summary.json: {'; '.join(left_out)}: the rest is counted")
    add_truth(samples, config.get("data"))
    name = os.path.basename(os.path.normpath(path))
    numbers = truth_numbers([RunSamples(path, name, config.get("credit", ""), config, samples)])
    if numbers:
        with open(os.path.join(path, "samples", "summary.json"), "w") as f:
            json.dump(numbers, f, indent=1)
    return numbers
