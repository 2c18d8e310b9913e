"""Evaluation: load problems, sample k responses each, grade with verify.py, report avg@k, pass@k, greedy.

Metrics (per benchmark):

* **greedy accuracy**: one response at temperature 0.
* **avg@k**: the mean accuracy over k sampled responses per problem (= mean pass@1; the DelTA paper's avg@16).
* **pass@k**: the unbiased estimator of Chen et al. (2021), ``1 - C(n-c, k) / C(n, k)`` averaged over
  problems, for n samples of which c are correct; k > n is refused.
* mean response length (tokens), truncation rate (responses that hit the token budget), boxed rate (responses
  with a ``\\boxed{}`` answer).

Command line::

    python evaluate.py --model toy --benchmarks toy
    python evaluate.py --model Qwen/Qwen3-8B-Base --benchmarks ../shared/data/math500.jsonl --prompt_template qwen_math
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from pathlib import Path

import rollout
import verify

REQUIRED_FIELDS = ("problem", "answer")


# ----------------------------------------------------------------------------------------------------------
# Data
# ----------------------------------------------------------------------------------------------------------
def load_problems(source: str, split: str = "train") -> list[dict]:
    """Problems as ``{id, problem, answer, source}`` rows from a jsonl file, or the toy task (``"toy"``).

    Every row is checked before anything else runs: a line that is not a JSON object, or a missing, non-string
    or empty ``problem``/``answer`` field, raises one error naming the file, the line number and the field.

    Args:
        source: a ``.jsonl`` path, or ``"toy"``.
        split: for ``"toy"``: ``"train"`` or ``"test"``.
    Raises:
        FileNotFoundError: the file does not exist.
        ValueError: a bad row (message ``file:line: ...``) or an empty file.
    """
    if source == "toy":
        import toy

        return toy.load_split(split)
    path = Path(source)
    if not path.is_file():
        raise FileNotFoundError(f"data file not found: {source}")
    rows, errors = [], []
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                errors.append(f"{path}:{lineno}: not valid JSON ({e.msg})")
                continue
            if not isinstance(row, dict):
                errors.append(f"{path}:{lineno}: expected a JSON object, got {type(row).__name__}")
                continue
            for key in REQUIRED_FIELDS:
                value = row.get(key)
                if isinstance(value, (int, float)) and not isinstance(value, bool):
                    value = row[key] = str(value)  # e.g. a numeric answer written as a JSON number
                if not isinstance(value, str) or not value.strip():
                    what = "missing" if key not in row else "empty" if isinstance(value, str) else "not a string"
                    errors.append(f"{path}:{lineno}: field '{key}' is {what}")
            row.setdefault("id", f"{path.stem}-{lineno}")
            row.setdefault("source", path.stem)
            rows.append(row)
    if errors:
        more = f"\n... and {len(errors) - 10} more" if len(errors) > 10 else ""
        raise ValueError(f"{len(errors)} bad row(s) in {path}:\n" + "\n".join(errors[:10]) + more)
    if not rows:
        raise ValueError(f"{path}: no rows")
    return rows


# ----------------------------------------------------------------------------------------------------------
# Metrics
# ----------------------------------------------------------------------------------------------------------
def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k of Chen et al. (2021, Eq. 1): ``1 - C(n-c, k) / C(n, k)``.

    The probability that at least one of k responses drawn without replacement from n (c of them correct)
    is correct.
    Raises:
        ValueError: unless ``0 <= c <= n`` and ``1 <= k <= n`` (k > n would overstate: human-eval#35).
    """
    if not (0 <= c <= n) or not (1 <= k <= n):
        raise ValueError(f"pass_at_k needs 0 <= c <= n and 1 <= k <= n, got n={n}, c={c}, k={k}")
    if n - c < k:
        return 1.0
    # product form of C(n-c, k) / C(n, k), numerically stable for large n
    return 1.0 - math.prod((n - c - i) / (n - i) for i in range(k))


def evaluate_rows(model, tokenizer, rows: list[dict], template: str, num_samples: int = 8,
                  temperature: float = 1.0, top_p: float = 1.0, max_new_tokens: int = 64, seed: int = 0,
                  batch_size: int = 256, greedy: bool = True) -> dict:
    """Greedy accuracy, avg@k and pass@k (k = 1, 2, 4, ..., n) of ``model`` on ``rows``.

    Returns a dict of floats (accuracies as fractions in [0, 1], lengths in tokens) and ``"responses"``: every
    sampled response with its grade.
    """
    prompts = [rollout.apply_template(r["problem"], template) for r in rows]
    stops = rollout.stop_token_ids(tokenizer, template)
    out: dict = {"num_problems": len(rows)}
    records = []
    runs = ([("greedy", 1, 0.0)] if greedy else []) + ([("sample", num_samples, temperature)] if num_samples else [])
    for mode, n, temp in runs:
        ro = rollout.generate(model, tokenizer, prompts, n, max_new_tokens, temperature=temp, top_p=top_p,
                              seed=seed, stop_ids=stops, batch_size=batch_size)
        refs = [r["answer"] for r in rows for _ in range(n)]
        graded = verify.grade_batch(ro.texts, refs)
        correct = [c for c, _ in graded]
        lengths = ro.response_lengths.tolist()
        per_problem = [sum(correct[i * n:(i + 1) * n]) for i in range(len(rows))]
        key = "greedy" if mode == "greedy" else f"avg@{n}"
        out[key] = sum(correct) / len(correct)
        if mode == "sample":
            k = 1
            while k <= n:
                out[f"pass@{k}"] = sum(pass_at_k(n, c, k) for c in per_problem) / len(rows)
                k *= 2
        out[f"{mode}/mean_length"] = sum(lengths) / len(lengths)
        out[f"{mode}/truncation_rate"] = ro.finish_reasons.count("length") / len(lengths)
        out[f"{mode}/boxed_rate"] = sum(verify.extract_boxed(t) is not None for t in ro.texts) / len(lengths)
        for reason, count in verify.summarize(graded).items():
            if reason not in ("total", "correct", "ok"):
                out[f"{mode}/{reason}"] = count
        for i, (text, (ok, reason)) in enumerate(zip(ro.texts, graded)):
            row = rows[i // n]
            records.append({"id": row["id"], "mode": mode, "sample": i % n, "response": text, "answer": row["answer"],
                            "correct": ok, "reason": reason, "length": lengths[i],
                            "finish_reason": ro.finish_reasons[i]})
    out["responses"] = records
    return out


def library_versions() -> dict:
    """Versions of the libraries that decide the numbers (saved next to every result)."""
    import importlib.metadata as md

    versions = {"python": sys.version.split()[0]}
    for pkg in ("torch", "transformers", "peft", "math-verify", "vllm", "numpy"):
        try:
            versions[pkg] = md.version(pkg)
        except md.PackageNotFoundError:
            pass
    return versions


def main(argv=None):
    ap = argparse.ArgumentParser(description="Evaluate a model on math benchmarks (avg@k, pass@k, greedy).")
    ap.add_argument("--model", default="toy", help="'toy', a local folder or a hub id")
    ap.add_argument("--benchmarks", default="toy", help="comma-separated jsonl paths, or 'toy'")
    ap.add_argument("--prompt_template", default="auto", help="none | qwen_math | r1 | auto (none for the toy)")
    ap.add_argument("--num_samples", type=int, default=8)
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--top_p", type=float, default=1.0)
    ap.add_argument("--max_new_tokens", type=int, default=64)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--output_dir", default="eval_results")
    args = ap.parse_args(argv)
    model, tokenizer = rollout.load_model_and_tokenizer(args.model)
    template = rollout.resolve_template(args.prompt_template, args.model)
    os.makedirs(args.output_dir, exist_ok=True)
    results = {"model": args.model, "prompt_template": template, "settings": vars(args),
               "versions": library_versions(), "benchmarks": {}}
    for bench in args.benchmarks.split(","):
        rows = load_problems(bench, split="test")
        t0 = time.time()
        res = evaluate_rows(model, tokenizer, rows, template, args.num_samples, args.temperature, args.top_p,
                            args.max_new_tokens, args.seed)
        name = Path(bench).stem if bench != "toy" else "toy"
        with open(os.path.join(args.output_dir, f"{name}_responses.jsonl"), "w") as f:
            f.writelines(json.dumps(r) + "\n" for r in res.pop("responses"))
        res["seconds"] = time.time() - t0
        results["benchmarks"][name] = res
        print(name, json.dumps({k: round(v, 4) if isinstance(v, float) else v for k, v in res.items()}))
    with open(os.path.join(args.output_dir, "results.json"), "w") as f:
        json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
