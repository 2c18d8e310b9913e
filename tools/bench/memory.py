"""Memory of a DelTA step as the rollout batch grows: --delta_impl normal against memory_efficient, beside GRPO.

What it measures
----------------
The toy model widened to ``--hidden_size`` (2,048 by default; ``widen_toy_model`` pads every weight with zeros, so
the function does not change) trains for ``--steps`` steps at each rollout size of ``--sizes`` (responses per
step; 64, 256, 1,024) with GRPO, DelTA ``normal`` (stage 4 keeps the batch's h_t, [N, T, H] float32 on the host) and
DelTA ``memory_efficient`` (h recomputed in K + 3 no-grad passes over micro-batches; memory independent of N). Every
response runs to exactly ``--max_completion_length`` tokens and each group gets half its rewards right (the
benchmark-only patches of ``_common.install_patches``: T is fixed, every response has Â ≠ 0), and the learning rate
is 1e-30 (updates computed and applied, weights unchanged), so every variant sees the same rollouts; every run takes
the scale path (``_common.SCALE_PATH``: grpo.py's defaults when the recorded results were made). Each run is a
fresh ``grpo.train`` in a fresh process; the variants of one size run side by side, interleaved over
``--repeats`` rounds.

Per step it reads ``metrics.jsonl``: ``memory/peak_rss_gb`` (the process's peak resident set during the step, the
peak counter reset when the step starts: grpo.py logs it every step) and ``step_time`` / ``generation_time``. The
first step of every run is not counted (AdamW's state and the allocator's first growth). Reported per size:

* each variant's peak RSS and its extra over GRPO's at the same size (median over the runs' counted steps; range
  over rounds). ``normal``'s extra should grow as N·T·H·4 bytes (printed beside it), ``memory_efficient``'s stay
  flat: it holds one micro-batch of h and a few floats per token;
* seconds per step and the ratio to GRPO, whole step and without generation; DelTA's paper reports +37 s, about
  10% of its first step, for K + 2 = 3 extra forward passes (App. L.1).

Stage 5 alone (``--stage5_mib``, default 64 and 256 MiB of h): ``credit_methods.DeltaCredit`` with ``--delta_impl
normal`` (``delta.proxy_vectors`` then ``delta.delta_coefficients``) on a synthetic h cache of that size ([N, T, H]
float32, T = ``--max_completion_length``, H = ``--hidden_size``, random lengths, half the rows Â > 0), each run in a
fresh process, after one call on 4 rows (so that the code pages of its kernels, which RSS counts, are already resident):
the peak RSS during the call above the RSS with the cache in place (``_common.PeakMemory``), in copies of N·T·H·4
bytes, beside what the code holds by derivation: ``memory_plan.DELTA_NORMAL_HOST_COPIES`` − 1 (v) plus one row block of
v − μ (``delta.ROW_BLOCK_BYTES``, at least one row); the [N, T] tensors (1/H of a copy each) and what the allocator
keeps of freed memory are left out of the derived figure. ``--only stage5`` runs this part alone (under a minute;
``--out`` then defaults to ``tools/bench/results/memory_stage5.json``).

The LM head alone (``--only lm_head``): one row of ``--lm_head_tokens`` response tokens (4,096) after 16 prompt
tokens, ``scale_passes.token_logprobs`` (the scale path's) forward and ``.sum().backward()`` in train mode, on a
one-layer Qwen3 with Qwen3's
vocabulary (151,936) and hidden size ``--lm_head_hidden`` (512: Qwen3-8B's 4,096 would need 11.5 GB of weights and
gradients beside the unchunked run's 10 GB), float32, its gradients already allocated (as from an earlier
micro-batch), each variant in a fresh process after a 64-token warm-up through the same path: the LM head in
chunks of positions (``scale_passes.LOGITS_CHUNK_BYTES``, the default under ``--chunked_lm_head``) and the whole row
at once (no chunking). Measured:
the peak of the CPU allocator's live bytes above those at the start (torch.profiler's memory events) and the peak
resident-set increase (``_common.PeakMemory``, glibc's mmap threshold held at 128 KiB so that freed tensors leave
the resident set), each as a multiple of the row's float32 logits T·V·4, beside ``memory_plan``'s prediction of
the same (``parts["update_activations"]``: the kept activations and the backward's extra of a one-row micro-batch).
About a minute; it needs about 12 GB of free memory (the unchunked run). ``--out`` then defaults to
``tools/bench/results/memory_lm_head.json``.

Results: a markdown table and ``--out`` (default ``tools/bench/results/memory.json``) with the machine, versions,
commit,
command, every step's numbers and the summary. About 20 minutes on 2 CPU cores with the defaults.

Usage::

    python tools/bench/memory.py
    python tools/bench/memory.py --sizes 64,256 --hidden_size 1024 --repeats 1
    python tools/bench/memory.py --only stage5 --stage5_repeats 5
    python tools/bench/memory.py --only lm_head
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
from tools.bench._common import PRELOAD, median, run_one  # noqa: E402

VARIANTS = {
    "grpo": {"credit": "grpo"},
    "delta": {"credit": "delta", "delta_impl": "normal"},
    "delta[memory_efficient]": {"credit": "delta", "delta_impl": "memory_efficient"},
}


def widen_toy_model(src: str, dst: str, hidden_size: int) -> str:
    """Save to ``dst`` the model of ``src`` (a Qwen3, e.g. the toy) with its residual stream widened to
    ``hidden_size`` by zeros: the same function (tests/test_bench.py), ``hidden_size`` wide.

    Embeddings, o_proj and down_proj get zero columns / rows, so the extra dimensions of the residual stream stay 0;
    q/k/v, gate/up and the LM head get zero input columns, so they ignore them. Every RMSNorm over the hidden size
    then sees mean(x²) scaled by h/H: its weight is multiplied by sqrt(h/H) and ``rms_norm_eps`` by h/H, which
    gives the same output, exactly when H/h is a power of 4 (2,048 = 16·128: sqrt(h/H) = 1/4 is exact in float32).
    (Qwen3 uses one ``rms_norm_eps`` for all norms: the per-head q/k norms, which are not widened, get the smaller
    ε too, a change of the order of ε·(1 − h/H)/mean(q²) ≈ 1e-6 relative.)
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(src, dtype=torch.float32)
    cfg, h = model.config, model.config.hidden_size
    if hidden_size < h:
        raise SystemExit(f"memory.py: error: --hidden_size {hidden_size} is below the model's {h}")
    wide_cfg = type(cfg).from_dict(
        {**cfg.to_dict(), "hidden_size": hidden_size, "rms_norm_eps": cfg.rms_norm_eps * h / hidden_size}
    )
    wide = AutoModelForCausalLM.from_config(wide_cfg, dtype=torch.float32)
    state, scale = {}, (h / hidden_size) ** 0.5
    for name, w in model.state_dict().items():
        target = wide.state_dict()[name]
        new = torch.zeros_like(target)
        if name.endswith("norm.weight") and w.shape[0] == h:  # input/post-attention/final norms, not q/k norms
            new.fill_(1.0)
            new[:h] = w * scale
        else:
            new[tuple(slice(0, n) for n in w.shape)] = w  # zeros in every widened dimension
        state[name] = new
    wide.load_state_dict(state)
    wide.save_pretrained(dst)
    AutoTokenizer.from_pretrained(src).save_pretrained(dst)
    return dst


def summarize(runs: dict, sizes: list[int], T: int, H: int) -> dict:
    """Per size and variant: median peak RSS and step times over counted steps, extras and ratios vs GRPO."""
    out = {}
    for n in sizes:
        rows = {}
        for name in VARIANTS:
            rs = runs[(n, name)]
            steps = [s for r in rs for s in r["steps"][1:]]
            rows[name] = {
                "peak_rss_gb": median([s["memory/peak_rss_gb"] for s in steps]),
                "round_peak_rss_gb": [median([s["memory/peak_rss_gb"] for s in r["steps"][1:]]) for r in rs],
                "s_per_step": median([s["step_time"] for s in steps]),
                "s_per_step_train": median([s["step_time"] - s["generation_time"] for s in steps]),
                "round_s_per_step": [median([s["step_time"] for s in r["steps"][1:]]) for r in rs],
                "round_s_per_step_train": [
                    median([s["step_time"] - s["generation_time"] for s in r["steps"][1:]]) for r in rs
                ],
            }
        base = rows["grpo"]
        for name, s in rows.items():
            s["extra_gb"] = s["peak_rss_gb"] - base["peak_rss_gb"]
            s["round_extra_gb"] = [a - b for a, b in zip(s["round_peak_rss_gb"], base["round_peak_rss_gb"])]
            s["ratio_s_per_step"] = s["s_per_step"] / base["s_per_step"]
            s["ratio_s_per_step_train"] = s["s_per_step_train"] / base["s_per_step_train"]
            s["round_ratio_s_per_step"] = [a / b for a, b in zip(s["round_s_per_step"], base["round_s_per_step"])]
        rows["delta"]["cache_gb_predicted"] = n * T * H * 4 / 1e9  # N·T·H·4 bytes of h_t
        out[n] = rows
    return out


def markdown_table(summary: dict) -> str:
    head = [
        "responses",
        "variant",
        "peak RSS GB",
        "extra over GRPO GB (rounds)",
        "N·T·H·4 GB",
        "s/step",
        "× GRPO (rounds)",
        "s/step excl. gen",
        "× GRPO",
    ]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    rng = lambda xs, f: f" ({f.format(min(xs))} – {f.format(max(xs))})" if len(xs) > 1 else ""  # noqa: E731
    for n, rows in summary.items():
        for name, s in rows.items():
            lines.append(
                "| "
                + " | ".join(
                    [
                        str(n),
                        name,
                        f"{s['peak_rss_gb']:.3f}",
                        "" if name == "grpo" else f"{s['extra_gb']:+.3f}" + rng(s["round_extra_gb"], "{:+.3f}"),
                        f"{s['cache_gb_predicted']:.3f}" if "cache_gb_predicted" in s else "",
                        f"{s['s_per_step']:.2f}",
                        f"{s['ratio_s_per_step']:.2f}" + rng(s["round_ratio_s_per_step"], "{:.2f}"),
                        f"{s['s_per_step_train']:.2f}",
                        f"{s['ratio_s_per_step_train']:.2f}",
                    ]
                )
                + " |"
            )
    return "\n".join(lines)


def stage5_peak(spec: dict) -> dict:
    """Stage 5 of a --delta_impl normal step (``credit_methods.DeltaCredit``) on a synthetic h cache ``[N, T, H]``
    float32, in this (fresh) process: its peak RSS above the RSS with the cache in place, in MiB, and the seconds it
    took."""
    import types

    import torch

    from tools.bench._common import PeakMemory
    from trainer import credit_methods, grpo_config, policy

    def inputs(N, T, H):  # what stage 5 reads: the rollout's response mask and ids, Â [N], θ_old with the h cache
        g = torch.Generator().manual_seed(spec["seed"])
        mask = torch.arange(T)[None, :] < torch.randint(T // 2, T + 1, (N,), generator=g)[:, None]  # [N, T]
        hidden = torch.randn(N, T, H, generator=g).masked_fill_(~mask[..., None], 0.0)  # as stage 4 leaves it
        adv = torch.tensor([1.0, -1.0]).repeat(N // 2 + 1)[:N]  # both sides present: the discriminator runs
        batch = types.SimpleNamespace(response_mask=mask.float(), response_ids=torch.zeros(N, T, dtype=torch.long))
        old = policy.ThetaOld(-torch.rand(N, T, generator=g), hidden, None, {})
        # (no answers, step 0, no rewards: DelTA reads none; no passes: h is kept)
        return credit_methods.CreditInputs(batch, adv, old, None, 0, mask.float(), None, None)

    N, T, H = spec["N"], spec["T"], spec["H"]
    credit = credit_methods.DeltaCredit(grpo_config.GRPOConfig(credit="delta", delta_impl="normal"))
    credit(None, inputs(4, T, H))  # once on 4 rows: the kernels' code pages are resident before we count
    x = inputs(N, T, H)
    with PeakMemory() as mem:
        t0 = time.perf_counter()
        token_adv = credit(None, x).token_adv
        seconds = time.perf_counter() - t0
    assert token_adv.shape == (N, T)
    return {
        "peak_above_cache_mib": mem.peak_rss_increase_mib,
        "rss_before_mib": mem.rss_before_mib,
        "rss_method": mem.rss_method,
        "seconds": seconds,
        "torch_threads": torch.get_num_threads(),
    }


def stage5_derived(N: int, T: int, H: int) -> dict:
    """What stage 5 holds above the cache by derivation, in copies of N·T·H·4 bytes: v, and one row block of v − μ."""
    import delta
    from trainer import memory_plan

    rows = min(max(1, delta.ROW_BLOCK_BYTES // (T * H * 4)), N)
    return {
        "copies_total": memory_plan.DELTA_NORMAL_HOST_COPIES,
        "block_rows": rows,
        "above_cache": memory_plan.DELTA_NORMAL_HOST_COPIES - 1 + rows / N,
    }


def run_stage5(args, pool) -> dict:
    T, H = args.max_completion_length, args.hidden_size
    out = {}
    for mib in [int(x) for x in args.stage5_mib.split(",") if x.strip()]:
        N = mib * 2**20 // (T * H * 4)
        cache_mib = N * T * H * 4 / 2**20
        runs = [pool.apply(stage5_peak, ({"N": N, "T": T, "H": H, "seed": r},)) for r in range(args.stage5_repeats)]
        measured = [r["peak_above_cache_mib"] / cache_mib for r in runs]
        derived = stage5_derived(N, T, H)
        out[mib] = {
            "N": N,
            "T": T,
            "H": H,
            "cache_mib": cache_mib,
            "runs": runs,
            "measured_above_cache": measured,
            "median_above_cache": median(measured),
            **{f"derived_{k}": v for k, v in derived.items()},
            "measured_over_derived": [m / derived["above_cache"] for m in measured],
        }
        print(
            f"[memory] stage 5, h = {cache_mib:.0f} MiB ({N} × {T} × {H}): peak above the cache "
            f"{median(measured):.3f} ({min(measured):.3f} – {max(measured):.3f}) × N·T·H·4 over "
            f"{len(runs)} run{'s' * (len(runs) != 1)}; derived {derived['above_cache']:.3f} "
            f"(v + a block of {derived['block_rows']} rows); "
            f"measured / derived {median(measured) / derived['above_cache']:.3f}; "
            f"{median([r['seconds'] for r in runs]):.2f} s",
            flush=True,
        )
    return out


M_MMAP_THRESHOLD, MMAP_THRESHOLD = -3, 131072  # mallopt's parameter (malloc.h) and glibc's default threshold


def live_peak(fn) -> int:
    """Peak of the CPU allocator's live bytes during ``fn()`` above those at its start (torch.profiler's memory
    events, summed in time order)."""
    import json

    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    with tempfile.TemporaryDirectory() as d:
        prof.export_chrome_trace(os.path.join(d, "trace.json"))
        with open(os.path.join(d, "trace.json")) as f:
            events = json.load(f)["traceEvents"]
    cur = peak = 0
    for _, b in sorted(
        (e["ts"], e["args"]["Bytes"])
        for e in events
        if e.get("name") == "[memory]" and e["args"].get("Device Type") == 0
    ):
        cur += b
        peak = max(peak, cur)
    return peak


def lm_head_peak(spec: dict) -> dict:
    """One row's ``scale_passes.token_logprobs`` forward and backward on a one-layer Qwen3 (``spec``: T, P, H, V, the
    chunk budget) in this (fresh) process: the live-byte and resident-set peaks above the start, in bytes, and
    ``memory_plan``'s prediction for the same budget (the scale path's settings, --chunked_lm_head on). Both modules
    read the budget from their constant; the unchunked variant sets one no micro-batch exceeds."""
    import ctypes

    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    from tools.bench._common import SCALE_PATH, PeakMemory
    from trainer import memory_plan, scale_passes

    if not ctypes.CDLL(None).mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD):
        raise RuntimeError("mallopt(M_MMAP_THRESHOLD) failed")
    T, P, H, V = spec["T"], spec["P"], spec["H"], spec["V"]
    if spec["chunk_bytes"] is not None:  # None: the default budget
        scale_passes.LOGITS_CHUNK_BYTES = memory_plan.LOGITS_CHUNK_BYTES = spec["chunk_bytes"]
    config = Qwen3Config(
        vocab_size=V,
        hidden_size=H,
        intermediate_size=3 * H,
        num_hidden_layers=1,
        num_attention_heads=H // 128,
        num_key_value_heads=max(1, H // 512),
        head_dim=128,
        max_position_embeddings=P + T,
        tie_word_embeddings=False,
    )
    torch.manual_seed(0)
    model = Qwen3ForCausalLM(config).train()
    for p in model.parameters():  # the gradients are there, as after an earlier micro-batch
        p.grad = torch.zeros_like(p)
    gen = torch.Generator().manual_seed(1)

    def row(t):  # one row of P prompt and t response tokens: its log-probs' forward and backward
        ids = torch.randint(0, V, (1, P + t), generator=gen)
        scale_passes.token_logprobs(model, ids, torch.ones_like(ids), torch.ones(1, t)).sum().backward()

    budget = scale_passes.LOGITS_CHUNK_BYTES
    scale_passes.LOGITS_CHUNK_BYTES = min(budget, 16 * V * 4)  # the warm-up takes the measured run's path: code pages
    row(64)
    scale_passes.LOGITS_CHUNK_BYTES = budget
    with PeakMemory() as mem:
        t0 = time.perf_counter()
        live = live_peak(lambda: row(T))
        seconds = time.perf_counter() - t0
    cfg = memory_plan.Settings(
        torch_dtype="float32",
        max_completion_length=T,
        micro_batch_size=1,
        num_prompts_per_step=1,
        num_generations=1,
        **{**SCALE_PATH, "shared_prompt": False},  # the scale path, one row: no prompt shared
    )
    plan = memory_plan.plan({**config.to_dict(), "model_type": "qwen3"}, cfg, prompt_tokens=P, host_memory_gb=1e3)
    return {
        "live_peak_bytes": live,
        "rss_peak_increase_bytes": mem.peak_rss_increase_mib * 2**20,
        "rss_method": mem.rss_method,
        "predicted_bytes": plan.parts["update_activations"],
        "chunked": plan.parts["chunked_lm_head"],
        "chunk_positions": max(1, budget // (V * 4)),
        "seconds": seconds,
        "torch_threads": torch.get_num_threads(),
    }


def run_lm_head(args, pool) -> dict:
    T, H, V, P = args.lm_head_tokens, args.lm_head_hidden, 151_936, 16
    logits = T * V * 4  # the row's float32 logits
    out = {"T": T, "P": P, "H": H, "V": V, "row_logits_bytes": logits}
    for name, budget in (("chunked", None), ("unchunked", 2**62)):  # the default budget; one no row exceeds
        r = pool.apply(lm_head_peak, ({"T": T, "P": P, "H": H, "V": V, "chunk_bytes": budget},))
        r.update(
            live_over_logits=r["live_peak_bytes"] / logits,
            rss_over_logits=r["rss_peak_increase_bytes"] / logits,
            predicted_over_logits=r["predicted_bytes"] / logits,
            measured_over_predicted=r["live_peak_bytes"] / r["predicted_bytes"],
        )
        out[name] = r
        print(
            f"[memory] LM head, one row of {T:,} tokens, V = {V:,}, H = {H}, {name}"
            f"{' (' + str(r['chunk_positions']) + ' positions a chunk)' if r['chunked'] else ''}: peak live bytes "
            f"{r['live_peak_bytes'] / 1e9:.3f} GB = {r['live_over_logits']:.3f} × the row's float32 logits "
            f"({logits / 1e9:.2f} GB), RSS {r['rss_over_logits']:.3f} ×; planned "
            f"{r['predicted_over_logits']:.3f} × "
            f"(measured / planned {r['measured_over_predicted']:.3f}); {r['seconds']:.1f} s",
            flush=True,
        )
    out["chunked_over_unchunked"] = out["chunked"]["live_peak_bytes"] / out["unchunked"]["live_peak_bytes"]
    return out


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    ap.add_argument("--sizes", default="64,256,1024", help="responses per step (multiples of --num_generations)")
    ap.add_argument("--hidden_size", type=int, default=2048, help="the toy widened to this hidden size")
    ap.add_argument("--num_generations", type=int, default=8)
    ap.add_argument("--max_completion_length", type=int, default=32, help="every response has exactly this length")
    ap.add_argument("--micro_batch_size", type=int, default=32, help="rows per forward/backward (every variant)")
    ap.add_argument("--steps", type=int, default=2, help="steps per run (the first is not counted)")
    ap.add_argument("--repeats", type=int, default=2, help="interleaved rounds")
    ap.add_argument(
        "--only", choices=["steps", "stage5", "lm_head"], default=None, help="run one part (default: steps and stage5)"
    )
    ap.add_argument("--stage5_mib", default="64,256", help="stage 5 alone: sizes of the h cache, MiB")
    ap.add_argument("--stage5_repeats", type=int, default=3, help="stage 5 alone: fresh-process runs per size")
    ap.add_argument("--lm_head_tokens", type=int, default=4096, help="--only lm_head: the row's response tokens")
    ap.add_argument(
        "--lm_head_hidden",
        type=int,
        default=512,
        help="--only lm_head: the one-layer Qwen3's hidden size (a multiple of 128)",
    )
    ap.add_argument(
        "--out",
        default=None,
        help="JSON results ('' = none; default tools/bench/results/memory.json, "
        "memory_stage5.json with --only stage5, memory_lm_head.json with --only lm_head)",
    )
    ap.add_argument("--keep_runs", action="store_true", help="keep the runs' folders (printed)")
    return ap


def main(argv=None) -> dict:
    args = build_parser().parse_args(argv)
    command = shlex.join(["python", *(sys.argv if argv is None else [__file__, *argv])])
    sizes = [int(x) for x in args.sizes.split(",") if x.strip()]
    if any(n % args.num_generations for n in sizes) or args.steps < 2 or args.repeats < 1:
        raise SystemExit(
            "memory.py: error: --sizes must be multiples of --num_generations, --steps >= 2 (the first "
            "is not counted), --repeats >= 1"
        )
    if args.stage5_repeats < 1:
        raise SystemExit("memory.py: error: --stage5_repeats must be >= 1")
    out = (
        args.out
        if args.out is not None
        else str(
            REPO
            / "tools"
            / "bench"
            / "results"
            / ({"stage5": "memory_stage5.json", "lm_head": "memory_lm_head.json"}.get(args.only, "memory.json"))
        )
    )
    os.environ["TQDM_DISABLE"] = "1"  # before the fork server imports tqdm
    t_start = time.time()
    result = {
        "benchmark": "memory",
        "date": _common.now_iso(),
        "command": command,
        "git": _common.git_state(),
        "machine": _common.machine_description(),
    }
    if args.only == "lm_head":
        pool = _common.forkserver_pool(PRELOAD)
        try:
            result["lm_head"] = run_lm_head(args, pool)
        finally:
            pool.close()
            pool.join()
        result.update(settings=vars(args), total_seconds=time.time() - t_start)
        if out:
            _common.write_json(out, result)
        return result
    if args.only != "steps":
        pool = _common.forkserver_pool(PRELOAD)
        try:
            result["stage5"] = {str(k): x for k, x in run_stage5(args, pool).items()}
        finally:
            pool.close()
            pool.join()
    if args.only == "stage5":
        result.update(settings=vars(args), total_seconds=time.time() - t_start)
        if out:
            _common.write_json(out, result)
        return result
    workdir = Path(tempfile.mkdtemp(prefix="memory-"))
    toy_path, toy_info = _common.prepare_toy_model(workdir, 200, "memory.py")
    model_path = widen_toy_model(toy_path, str(workdir / f"toy_h{args.hidden_size}"), args.hidden_size)
    base_cfg = dict(
        model=model_path,
        prompt_template="none",
        num_generations=args.num_generations,
        max_completion_length=args.max_completion_length,
        max_steps=args.steps,
        learning_rate=1e-30,
        micro_batch_size=args.micro_batch_size,
        eval_num_generations=0,
        save_steps=0,
        logging_steps=0,
        **_common.SCALE_PATH,  # the path of the recorded results (grpo.py's default then)
    )
    patches = {"no_stop": True, "random_rewards": 0, "num_generations": args.num_generations}
    runs = {(n, v): [] for n in sizes for v in VARIANTS}
    pool = _common.forkserver_pool(PRELOAD)
    try:
        for r in range(args.repeats):
            for n in sizes:
                for name, over in VARIANTS.items():
                    cfg = {
                        **base_cfg,
                        **over,
                        "num_prompts_per_step": n // args.num_generations,
                        "output_dir": str(workdir / f"r{r}_{n}_{name}"),
                    }
                    res = pool.apply(run_one, ({"config": cfg, "patches": patches},))
                    runs[(n, name)].append(res)
                    st = res["steps"][1:]
                    print(
                        f"[memory] round {r + 1}/{args.repeats} N={n:<5} {name:<24} peak RSS "
                        f"{median([s['memory/peak_rss_gb'] for s in st]):.3f} GB, s/step "
                        f"{median([s['step_time'] for s in st]):.2f}, run {res['wall_time']:.0f}s",
                        flush=True,
                    )
    finally:
        pool.close()
        pool.join()
    summary = summarize(runs, sizes, args.max_completion_length, args.hidden_size)
    table = markdown_table(summary)
    print(
        "\n" + table + f"\n\nT = {args.max_completion_length} tokens, H = {args.hidden_size}; medians over steps 2.. "
        f"of each run; (a – b): range over {args.repeats} rounds. Total {time.time() - t_start:.0f}s."
    )
    result.update(
        {
            "model": {**toy_info, "widened_to": args.hidden_size},
            "settings": {
                **vars(args),
                "train_config": {k: v for k, v in base_cfg.items() if k != "model"},
                "patches": patches,
            },
            "summary": {str(n): rows for n, rows in summary.items()},
            "table_markdown": table,
            "total_seconds": time.time() - t_start,
            "runs": {
                f"{n} {v}": [{k: x for k, x in r.items() if k != "pid"} for r in rs] for (n, v), rs in runs.items()
            },
        }
    )
    return _common.finish(result, out, workdir, args.keep_runs)


if __name__ == "__main__":
    main()
