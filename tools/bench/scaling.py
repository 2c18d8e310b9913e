"""How the cost of one training step grows with model size and completion length, per credit (GRPO, DelTA, CSCR).

What it measures
----------------
The same ``grpo.train`` step as ``tools/bench/credit_overhead.py`` (rollout, grading, advantages, old log-probs, credit
hook, policy update) on randomly initialised ``Qwen3ForCausalLM`` models of growing size, at growing completion
lengths. For each grid cell (``--cells``, ``size:length`` pairs) and each credit (``--credits``) it runs
``--steps`` training steps in a fresh process (credits interleaved within a cell, ``--repeats`` rounds) and reports,
over the steps after the first (warm-up: first-call overheads, allocator growth):

* median seconds per step, split into generation (``rollout.generate``) and the rest (old log-probs, credit,
  forward/backward, optimizer), and the same in CPU seconds of the run's process;
* response tokens per second (tokens generated and trained on per step / seconds per step);
* seconds in the credit hook (DelTA: λ̄ from the cached hidden states; CSCR: two conditioned forward passes);
* peak memory: the resident-set increase over ``train()`` (CPU; CUDA: ``max_memory_allocated``);
* every credit's ratio against GRPO in the same cell: how DelTA's and CSCR's overheads change with size/length.

Models (``SIZES``; exact parameter counts are printed and saved): the toy's architecture (``toy.MODEL``, 0.81M
parameters), about 30M (hidden 512, 10 layers) and about 120M (hidden 768, 14 layers), all with the toy's
character-level tokenizer. Its vocabulary has 100 tokens, so the embedding and LM head are tiny and the size is
almost all in the decoder layers (a real 151k-token vocabulary would add 2 × 151k × hidden parameters and a large
LM-head/log-softmax cost per token; this benchmark does not measure that part). Weights are random
(``toy.build_model(seed=0)``) and saved once per size; every run of a size loads the same folder.

Two benchmark-only patches, installed in the run's process only (grpo.py, rollout.py and verify.py are not
changed; see ``_common.install_patches``):

* **full-length responses**: the stop-token list is ``[vocab_size]``, an id the model has no logit for, and
  there are no stop strings, so every response has exactly ``length`` tokens (a random model would emit EOS at
  random, making lengths and costs differ between runs);
* **random rewards**: the verifier is replaced by a seeded draw marking exactly half of each group correct, so
  every response has a non-zero advantage and DelTA's and CSCR's code paths do their full work.

The learning rate is 1e-30 (as in credit_overhead.py): updates are computed and applied but leave float32
weights unchanged, so every credit samples identical rollouts.

Threads: ``--num_threads`` (default 1) in every run. grpo.py's own rule (1 thread below 10M parameters, torch's
default otherwise) is available with ``--num_threads 0``; the default is 1 because on a 2-core machine shared with
other processes a second torch thread can make the small decode steps many times slower (measured here: 64 new
tokens × 8 rows on the 30M model took 2.8 s with 1 thread and 46 s with 2 at load average 4).

Default grid (about 4.5 minutes on the project's 2-core CPU): a length sweep on the toy (64, 256, 1024 tokens), a
size sweep at 64 tokens (toy, 30M, 120M) and 30M at 128 tokens; 2 prompts × 2 responses per step; 3 steps per
run (2 timed), one run per credit and cell. 30M × 256 takes about 12 s per step there, 120M × 256 about 40 s, and
120M × 1024 several minutes: pass such cells with ``--cells`` on a bigger machine (e.g.
``--cells toy:1024,30m:1024,120m:256,120m:1024 --repeats 2``).

Results: a markdown table on stdout and JSON (``--out``, default ``tools/bench/results/scaling.json``) with the machine,
library versions, git commit, exact command, model configurations, every step's timings and the summary;
``--plot FILE.png`` also draws seconds per step against length and size (needs matplotlib,
``tools/requirements-bench.txt``).

Every run takes the scale path (``_common.SCALE_PATH``: ``--padding_free --shared_prompt --chunked_lm_head
--fuse_old_logprobs``, grpo.py's defaults when the recorded results were made; grpo.py's default now is the plain
path).

Padding: ``--update_lengths 64:1024`` measures something else: the policy update alone (θ_old's log-probs from the
training forward, the credit, loss, backward, AdamW; what ``grpo.train_step`` runs after grading) of one rollout
batch whose responses run from 64 to 1024 tokens (evenly spaced, shuffled; random tokens, one prompt of 12-24
tokens per group, half of each group correct) in three modes of the scale path (``--chunked_lm_head
--fuse_old_logprobs`` in each), alternating in fresh processes: ``--padding_free --shared_prompt``,
``--padding_free`` alone, and neither (padded): seconds per update, response tokens per second, the speed-up over
padded and the peak memory of each. ``--cells`` then gives the model sizes (their lengths are ignored).

Usage::

    python tools/bench/scaling.py
    python tools/bench/scaling.py --cells toy:64,toy:512,30m:512 --credits grpo,delta --steps 4 --repeats 2
    python tools/bench/scaling.py --update_lengths 64:1024 --cells toy:0,30m:0 --num_prompts_per_step 4
    --num_generations 4
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

from tools.bench import _common  # noqa: E402
from tools.bench._common import median  # noqa: E402

PROG = "scaling.py"
# Qwen3 configurations (overrides of toy.MODEL). head_dim 64 and grouped-query attention as in Qwen3.
SIZES = {
    "toy": {},
    "30m": dict(
        hidden_size=512,
        intermediate_size=1536,
        num_hidden_layers=10,
        num_attention_heads=8,
        num_key_value_heads=4,
        head_dim=64,
    ),
    "120m": dict(
        hidden_size=768,
        intermediate_size=3072,
        num_hidden_layers=14,
        num_attention_heads=12,
        num_key_value_heads=4,
        head_dim=64,
    ),
}
DEFAULT_CELLS = "toy:64,toy:256,toy:1024,30m:64,30m:128,120m:64"
CREDITS = ("grpo", "delta", "cscr")


# ----------------------------------------------------------------------------------------------------------
# Child processes
# ----------------------------------------------------------------------------------------------------------
def build_random_model(size: str, path: str, max_positions: int, seed: int = 0) -> dict:
    """Child: a randomly initialised float32 Qwen3 of ``size`` with the toy tokenizer, saved to ``path``."""
    import toy

    tokenizer = toy.build_tokenizer()
    model = toy.build_model(tokenizer, seed=seed, **{**SIZES[size], "max_position_embeddings": max_positions})
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    cfg = model.config
    return {
        "num_parameters": sum(p.numel() for p in model.parameters()),
        "config": {
            k: getattr(cfg, k)
            for k in (
                "vocab_size",
                "hidden_size",
                "intermediate_size",
                "num_hidden_layers",
                "num_attention_heads",
                "num_key_value_heads",
                "head_dim",
                "max_position_embeddings",
                "tie_word_embeddings",
            )
        },
    }


# --update_lengths: (--padding_free, --shared_prompt) of each mode (--chunked_lm_head and --fuse_old_logprobs on in
# each: the scale path); the last one is the baseline of the speed-up
UPDATE_MODES = {"padding-free, shared prompt": (True, True), "padding-free": (True, False), "padded": (False, False)}


def update_only(spec: dict) -> dict:
    """Child: ``spec["steps"]`` policy updates of one synthetic rollout batch whose response lengths are spread over
    ``spec["lengths"]`` (see the module docstring), with ``spec["padding_free"]`` and ``spec["shared_prompt"]`` (on
    the scale path: --chunked_lm_head and --fuse_old_logprobs on); seconds and peak memory."""
    import random

    import torch

    import grpo
    import rollout
    from trainer import credit_methods, policy, run_setup

    torch.set_num_threads(spec["num_threads"] or torch.get_num_threads())
    model, tok = policy.load_model_and_tokenizer(spec["model"], dtype="float32", device="cpu")
    rng, G, n = random.Random(spec["seed"]), spec["num_generations"], spec["num_prompts_per_step"]
    lo, hi = spec["lengths"]
    N = n * G
    lengths = [round(lo + (hi - lo) * i / max(N - 1, 1)) for i in range(N)]
    rng.shuffle(lengths)
    vocab = len(tok) - 4  # ids 4.. are ordinary characters
    prompts = [[4 + rng.randrange(vocab) for _ in range(rng.randint(12, 24))] for _ in range(n)]  # one per group
    P, T = max(map(len, prompts)), max(lengths)
    ids = torch.full((N, P + T), tok.pad_token_id)
    attn = torch.zeros(N, P + T, dtype=torch.long)
    for i, t in enumerate(lengths):
        p = len(prompts[i // G])
        ids[i, P - p : P + t] = torch.tensor(prompts[i // G] + [4 + rng.randrange(vocab) for _ in range(t)])
        attn[i, P - p : P + t] = 1
    mask = attn[:, P:].float()
    batch = rollout.RolloutBatch(
        input_ids=ids,
        attention_mask=attn,
        response_ids=ids[:, P:],
        response_mask=mask,
        prompt_length=P,
        finish_reasons=["stop"] * N,
        texts=[""] * N,
        prompts=[""] * N,
        num_generations=G,
    )
    rewards = torch.tensor([float(i % 2) for i in range(N)])  # half of each group correct
    adv = grpo.group_advantages(rewards, G)
    cfg = grpo.GRPOConfig(
        model=spec["model"],
        credit=spec["credit"],
        learning_rate=1e-30,
        num_prompts_per_step=n,
        num_generations=G,
        max_completion_length=T,
        micro_batch_size=spec["micro_batch_size"],
        padding_free=spec["padding_free"],
        shared_prompt=spec["shared_prompt"],
        chunked_lm_head=True,
        fuse_old_logprobs=True,
    )
    method = grpo.paper_method(cfg)
    optimizer = policy.build_optimizer(model.parameters(), cfg)
    credit = method.credit(cfg, tok)
    # the run's passes, chosen once as grpo.train chooses them (the scale path's; θ_old fused where it may be)
    parts = run_setup.step_parts(cfg, credit, method, policy.Forward(grpo.old_logprobs, grpo.micro_batches))
    answers = ["0"] * N  # (no reference answers: CSCR's notes read them)
    times = []
    with _common.PeakMemory() as mem:
        for step in range(spec["steps"]):
            t0 = time.perf_counter()
            # stages 4-6 of grpo.train_step, as it calls them
            old = parts.forward.old_logprobs(model, batch, cfg, credit.asks, None)
            inputs = credit_methods.CreditInputs(batch, adv, old, answers, step, mask, rewards, parts.forward)
            result = credit(model, inputs)
            update = grpo.Update(batch, old, result.token_adv, mask, result.token_values, parts)
            grpo.policy_update(model, optimizer, update, cfg, step)
            times.append(time.perf_counter() - t0)
    return {
        "padding_free": spec["padding_free"],
        "shared_prompt": spec["shared_prompt"],
        "seconds": times,
        "response_tokens": int(mask.sum()),
        "padded_response_tokens": N * T,
        "batch_shape": [N, P + T],
        **mem.as_dict(),
    }


def update_lengths_main(args, command: str, cells) -> dict:
    """``--update_lengths``: the update in each of ``UPDATE_MODES`` on each size of ``--cells``."""
    lo, _, hi = args.update_lengths.partition(":")
    if not (lo.isdigit() and hi.isdigit() and 1 <= int(lo) <= int(hi)):
        raise SystemExit(f"{PROG}: error: --update_lengths must be LO:HI with 1 <= LO <= HI, got {args.update_lengths}")
    credit = args.credits.split(",")[0].strip() or "grpo"
    workdir = Path(tempfile.mkdtemp(prefix="scaling-update-"))
    sizes = [s for s in SIZES if any(c[0] == s for c in cells)]
    load_start, t_start, rows, runs = os.getloadavg(), time.time(), [], []
    pool = _common.forkserver_pool(_common.PRELOAD)
    try:
        for size in sizes:
            path = str(workdir / f"model_{size}")
            info = pool.apply(build_random_model, (size, path, int(hi) + 64, 0))
            by_mode = {mode: [] for mode in UPDATE_MODES}
            for r in range(args.repeats):
                for mode, (pf, shared) in UPDATE_MODES.items():
                    spec = {
                        "model": path,
                        "lengths": (int(lo), int(hi)),
                        "seed": args.seed + r,
                        "credit": credit,
                        "num_generations": args.num_generations,
                        "num_prompts_per_step": args.num_prompts_per_step,
                        "micro_batch_size": args.micro_batch_size,
                        "padding_free": pf,
                        "shared_prompt": shared,
                        "steps": args.steps,
                        "num_threads": args.num_threads,
                    }
                    res = pool.apply(update_only, (spec,))
                    runs.append({"size": size, "round": r, "mode": mode, **res})
                    by_mode[mode].append(res)
                    print(
                        f"[bench] {size} {mode:<28} round {r + 1}: update {median(res['seconds'][1:]):.3f} s, "
                        f"peak RSS +{res['peak_rss_increase_mib']:.0f} MiB",
                        flush=True,
                    )
            for mode, (pf, shared) in UPDATE_MODES.items():
                rs = by_mode[mode]
                sec = median([x for r in rs for x in r["seconds"][1:]])
                rows.append(
                    {
                        "size": size,
                        "parameters": info["num_parameters"],
                        "mode": mode,
                        "padding_free": pf,
                        "shared_prompt": shared,
                        "s_update": sec,
                        "response_tokens_per_s": rs[0]["response_tokens"] / sec,
                        "peak_rss_increase_mib": median([r["peak_rss_increase_mib"] for r in rs]),
                        "round_s_update": [median(r["seconds"][1:]) for r in rs],
                    }
                )
            for row in rows[-len(UPDATE_MODES) :]:  # the last mode is the padded update
                row["speedup"] = rows[-1]["s_update"] / row["s_update"]
    finally:
        pool.close()
        pool.join()
    head = "| model (params) | update | s/update (rounds) | response tokens/s | speed-up | peak RSS +MiB |"
    lines = [head, "|---|---|---|---|---|---|"]
    for r in rows:
        rr = r["round_s_update"]
        lines.append(
            f"| {r['size']} ({r['parameters'] / 1e6:.2f}M) | {r['mode']}"
            f" | {r['s_update']:.3f} ({min(rr):.3f}–{max(rr):.3f}) | {r['response_tokens_per_s']:.0f} | "
            f"{r.get('speedup', 1.0):.2f}× | {r['peak_rss_increase_mib']:.0f} |"
        )
    table = "\n".join(lines)
    total = time.time() - t_start
    print(
        f"\n{table}\n\n{args.num_prompts_per_step}×{args.num_generations} responses of {lo}–{hi} tokens "
        f"({runs[0]['response_tokens']} response tokens, padded to {runs[0]['padded_response_tokens']}), credit "
        f"{credit}, {args.steps - 1} timed updates per run (the first is not timed) × {args.repeats} round(s). "
        f"Total {total:.0f}s; load average {load_start[0]:.2f} -> {os.getloadavg()[0]:.2f}."
    )
    machine = _common.machine_description(())
    machine["load_average_start"], machine["load_average_end"] = list(load_start), list(os.getloadavg())
    result = {
        "benchmark": "scaling --update_lengths",
        "date": _common.now_iso(),
        "command": command,
        "python": sys.executable,
        "git": _common.git_state(),
        "machine": machine,
        "settings": vars(args),
        "memory_method": _common.MEMORY_METHOD_CPU + " (over the updates)",
        "summary": rows,
        "table_markdown": table,
        "total_seconds": total,
        "runs": runs,
    }
    return _common.finish(result, args.out, workdir, args.keep_runs, kept="models")


# ----------------------------------------------------------------------------------------------------------
# Parent
# ----------------------------------------------------------------------------------------------------------
def parse_cells(spec: str) -> list[tuple[str, int]]:
    """``"toy:64,30m:256"`` -> ``[("toy", 64), ("30m", 256)]``; SystemExit on a bad entry."""
    cells = []
    for item in spec.split(","):
        item = item.strip()
        if not item:
            continue
        size, _, length = item.partition(":")
        if size not in SIZES or not length.isdigit() or int(length) < 1:
            raise SystemExit(
                f"{PROG}: error: bad --cells entry {item!r}: want SIZE:LENGTH with SIZE in "
                f"{sorted(SIZES)} and LENGTH a positive integer"
            )
        if (size, int(length)) not in cells:
            cells.append((size, int(length)))
    if not cells:
        raise SystemExit(f"{PROG}: error: --cells is empty")
    return cells


def summarize(runs: dict, cells: list[tuple[str, int]], credits: list[str]) -> list[dict]:
    """One row per (cell, credit): medians over the pooled steps after the first of every run, ratios vs GRPO."""
    rows = []
    for size, length in cells:
        base = None
        for credit in credits:
            rs = runs[(size, length, credit)]
            st = [s for r in rs for s in r["steps"][1:]]
            row = {
                "size": size,
                "length": length,
                "credit": credit,
                "runs": len(rs),
                "steps_timed": len(st),
                "s_per_step": median([s["step_time"] for s in st]),
                "s_generation": median([s["generation_time"] for s in st]),
                "s_rest": median([s["step_time"] - s["generation_time"] for s in st]),
                "cpu_s_per_step": median([s["cpu_step_time"] for s in st]),
                "cpu_s_rest": median([s["cpu_step_time"] - s["cpu_generation_time"] for s in st]),
                "s_credit_hook": median([s.get("credit_time") for s in st]),
                "response_tokens_per_step": median([s.get("response_tokens") for s in st]),
                "response_tokens_per_s": median([s["response_tokens"] / s["step_time"] for s in st]),
                "mean_completion_length": statistics.fmean(s["completions/mean_length"] for s in st) if st else None,
                "rows_nonzero_adv": median([s.get("rows_nonzero_adv") for s in st]),
                "peak_rss_increase_mib": median([r["peak_rss_increase_mib"] for r in rs]),
                "cuda_max_allocated_mib": (
                    median([r["cuda_max_allocated_mib"] for r in rs])
                    if rs and rs[0]["cuda_max_allocated_mib"] is not None
                    else None
                ),
                "torch_threads": sorted({r["torch_threads"] for r in rs}),
            }
            if credit == "grpo":
                base = row
            if base is not None:
                mem = "cuda_max_allocated_mib" if base["cuda_max_allocated_mib"] else "peak_rss_increase_mib"
                for key in ("s_per_step", "s_rest", "cpu_s_per_step", "cpu_s_rest"):
                    row[f"ratio_{key}"] = row[key] / base[key] if base[key] else None
                row["ratio_memory"] = row[mem] / base[mem] if base[mem] else None
            rows.append(row)
    return rows


def markdown_table(rows: list[dict], params: dict, cuda: bool) -> str:
    mem = "CUDA max alloc MiB" if cuda else "peak RSS +MiB"
    head = [
        "model (params)",
        "length",
        "credit",
        "s/step",
        "× GRPO",
        "generation s",
        "rest s",
        "× GRPO (rest)",
        "CPU s/step",
        "× GRPO (CPU)",
        "credit hook s",
        "response tok/s",
        mem,
        "× GRPO (mem)",
    ]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]

    def r(x):
        return "" if x is None else f"{x:.2f}"

    for row in rows:
        m = row["cuda_max_allocated_mib"] if cuda else row["peak_rss_increase_mib"]
        lines.append(
            "| "
            + " | ".join(
                [
                    f"{row['size']} ({params[row['size']] / 1e6:.2f}M)",
                    str(row["length"]),
                    row["credit"],
                    f"{row['s_per_step']:.3f}",
                    r(row.get("ratio_s_per_step")),
                    f"{row['s_generation']:.3f}",
                    f"{row['s_rest']:.3f}",
                    r(row.get("ratio_s_rest")),
                    f"{row['cpu_s_per_step']:.3f}",
                    r(row.get("ratio_cpu_s_per_step")),
                    f"{row['s_credit_hook']:.3f}",
                    f"{row['response_tokens_per_s']:.0f}",
                    f"{m:.0f}",
                    r(row.get("ratio_memory")),
                ]
            )
            + " |"
        )
    return "\n".join(lines)


def plot(rows: list[dict], params: dict, path: str) -> str:
    """Seconds per step against completion length (one line per size × credit); returns the file written."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    styles = {"grpo": "-o", "delta": "--s", "cscr": ":^"}
    for size in params:
        for credit in styles:
            pts = sorted((r["length"], r["s_per_step"]) for r in rows if r["size"] == size and r["credit"] == credit)
            if pts:
                ax.plot(*zip(*pts), styles[credit], label=f"{size} ({params[size] / 1e6:.1f}M) {credit}")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("completion length (tokens)")
    ax.set_ylabel("seconds per step")
    ax.legend(fontsize=7)
    ax.grid(True, which="both", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    return path


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    ap.add_argument(
        "--cells",
        default=DEFAULT_CELLS,
        help=f"comma-separated SIZE:LENGTH grid cells; sizes {sorted(SIZES)}, length = completion "
        f"tokens (every response is forced to exactly this length)",
    )
    ap.add_argument("--credits", default="grpo,delta,cscr", help="comma-separated credits; grpo is the baseline")
    ap.add_argument("--num_prompts_per_step", type=int, default=2)
    ap.add_argument("--num_generations", type=int, default=2, help="group size G (>= 2)")
    ap.add_argument("--steps", type=int, default=3, help="training steps per run (the first is not timed)")
    ap.add_argument("--repeats", type=int, default=1, help="interleaved rounds per cell (one run per credit each)")
    ap.add_argument(
        "--num_threads",
        type=int,
        default=1,
        help="torch CPU threads in every run (0 = grpo.py's rule: 1 below 10M parameters, else torch's default)",
    )
    ap.add_argument("--micro_batch_size", type=int, default=0, help="as grpo.py (0 = whole batch)")
    ap.add_argument(
        "--learning_rate",
        type=float,
        default=1e-30,
        help="tiny on purpose: updates are applied but leave the float32 weights unchanged, so every "
        "credit samples identical rollouts",
    )
    ap.add_argument("--seed", type=int, default=0, help="data order, sampling and the random rewards")
    ap.add_argument(
        "--out",
        default=str(REPO / "tools" / "bench" / "results" / "scaling.json"),
        help="JSON results file ('' = do not write)",
    )
    ap.add_argument("--plot", default="", metavar="FILE.png", help="also plot s/step against length (matplotlib)")
    ap.add_argument("--keep_runs", action="store_true", help="keep the models and runs' output folders (printed)")
    ap.add_argument(
        "--update_lengths",
        default="",
        metavar="LO:HI",
        help="instead: the update alone, responses of LO to HI tokens, in the three modes of UPDATE_MODES",
    )
    return ap


def main(argv=None) -> dict:
    args = build_parser().parse_args(argv)
    command = shlex.join(["python", *(sys.argv if argv is None else [__file__, *argv])])
    if args.update_lengths:
        return update_lengths_main(args, command, [(c.partition(":")[0], 0) for c in args.cells.split(",")])
    cells = parse_cells(args.cells)
    credits = [c.strip() for c in args.credits.split(",") if c.strip()]
    if any(c not in CREDITS for c in credits) or "grpo" not in credits:
        raise SystemExit(f"{PROG}: error: --credits must be a subset of {CREDITS} that includes grpo (the baseline)")
    credits = ["grpo"] + [c for c in credits if c != "grpo"]
    if args.steps < 2 or args.repeats < 1 or args.num_generations < 2 or args.num_prompts_per_step < 1:
        raise SystemExit(
            f"{PROG}: error: need --steps >= 2 (step 1 is not timed), --repeats >= 1, "
            f"--num_generations >= 2 and --num_prompts_per_step >= 1"
        )
    if args.plot:
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            raise SystemExit(
                f"{PROG}: error: --plot needs matplotlib: pip install -r tools/requirements-bench.txt"
            ) from None
    os.environ["TQDM_DISABLE"] = "1"  # read by tqdm when imported: set before the fork server imports anything
    workdir = Path(tempfile.mkdtemp(prefix="scaling-"))
    load_start = os.getloadavg()
    t_start = time.time()
    sizes = [s for s in SIZES if any(c[0] == s for c in cells)]
    models, params = {}, {}
    runs = {(s, L, c): [] for s, L in cells for c in credits}
    print(
        f"[bench] cells {', '.join(f'{s}×{L}' for s, L in cells)}; credits {', '.join(credits)}; "
        f"{args.num_prompts_per_step}×{args.num_generations} rollouts per step, {args.steps} steps per run, "
        f"{args.repeats} round(s)",
        flush=True,
    )
    pool = _common.forkserver_pool(_common.PRELOAD)
    try:
        for size in sizes:
            # positions: prompt (~20 tokens; CSCR's conditioned prompt adds a ~150-token note) + the longest response
            max_positions = max(L for s, L in cells if s == size) + 512
            path = str(workdir / f"model_{size}")
            models[size] = pool.apply(build_random_model, (size, path, max_positions, 0))
            models[size]["path"] = path
            params[size] = models[size]["num_parameters"]
            print(f"[bench] {size}: {params[size]:,} parameters (random init)", flush=True)
        for size, length in cells:
            for r in range(args.repeats):
                for credit in credits:
                    cfg = dict(
                        model=models[size]["path"],
                        data="toy",
                        prompt_template="none",
                        credit=credit,
                        num_generations=args.num_generations,
                        num_prompts_per_step=args.num_prompts_per_step,
                        max_completion_length=length,
                        max_steps=args.steps,
                        learning_rate=args.learning_rate,
                        micro_batch_size=args.micro_batch_size,
                        seed=args.seed,
                        num_threads=args.num_threads,
                        eval_num_generations=0,
                        save_steps=0,
                        logging_steps=1,
                        num_samples_to_log=1,
                        output_dir=str(workdir / f"{size}_{length}_{credit}_r{r}"),
                        **_common.SCALE_PATH,  # the path of the recorded results (grpo.py's default then)
                    )
                    patches = {"no_stop": True, "random_rewards": args.seed, "num_generations": args.num_generations}
                    res = pool.apply(_common.run_one, ({"config": cfg, "patches": patches},))
                    runs[(size, length, credit)].append(res)
                    st = res["steps"][1:]
                    print(
                        f"[bench] {size}×{length} {credit:<5} round {r + 1}: s/step "
                        f"{median([s['step_time'] for s in st]):.3f} (generation "
                        f"{median([s['generation_time'] for s in st]):.3f}, credit hook "
                        f"{median([s.get('credit_time') for s in st]):.3f}), peak RSS "
                        f"+{res['peak_rss_increase_mib']:.0f} MiB, run {res['wall_time']:.1f}s",
                        flush=True,
                    )
    finally:
        pool.close()
        pool.join()
    total = time.time() - t_start
    import torch

    cuda = torch.cuda.is_available()
    rows = summarize(runs, cells, credits)
    lengths_ok = all(
        s["completions/mean_length"] == L
        and s["response_tokens"] == L * args.num_prompts_per_step * args.num_generations
        for (_, L, _), rs in runs.items()
        for r in rs
        for s in r["steps"]
    )
    table = markdown_table(rows, params, cuda)
    print()
    print(table)
    threads = sorted({r["torch_threads"] for rs in runs.values() for r in rs})
    print(
        f"\n{args.steps - 1} timed steps per run (step 1 excluded) × {args.repeats} round(s); "
        f"{args.num_prompts_per_step} prompts × {args.num_generations} responses per step, every response exactly "
        f"`length` tokens: {'yes' if lengths_ok else 'NO'}; random rewards (half of each group correct); torch "
        f"threads {threads}; rest = step − generation. Parameters: "
        + ", ".join(f"{s} {params[s]:,}" for s in sizes)
        + f" (toy tokenizer, 100-token vocabulary). Total {total:.0f}s; load average "
        f"{load_start[0]:.2f} -> {os.getloadavg()[0]:.2f}."
    )
    plot_path = plot(rows, params, args.plot) if args.plot else None
    if plot_path:
        print(f"wrote {plot_path}")
    machine = _common.machine_description(("matplotlib",))
    machine["torch_threads_in_train"] = threads
    machine["load_average_start"], machine["load_average_end"] = list(load_start), list(os.getloadavg())
    result = {
        "benchmark": "scaling",
        "date": _common.now_iso(),
        "command": command,
        "python": sys.executable,
        "git": _common.git_state(),
        "machine": machine,
        "models": {s: {k: v for k, v in m.items() if k != "path"} for s, m in models.items()},
        "settings": {**vars(args), "cells": [list(c) for c in cells], "credits": credits},
        "patches": next(iter(runs.values()))[0]["patches"] if runs else None,
        "memory_method": _common.MEMORY_METHOD_CUDA if cuda else _common.MEMORY_METHOD_CPU + " (over train())",
        "all_responses_full_length": lengths_ok,
        "summary": rows,
        "table_markdown": table,
        "total_seconds": total,
        "plot": plot_path,
        "runs": [
            {"size": s, "length": L, "credit": c, **{k: v for k, v in r.items() if k != "pid"}}
            for (s, L, c), rs in runs.items()
            for r in rs
        ],
    }
    return _common.finish(result, args.out, workdir, args.keep_runs, kept="models and runs")


if __name__ == "__main__":
    main()
