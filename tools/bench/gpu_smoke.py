"""GPU smoke test at Qwen3-8B scale: one training step per credit through grpo.py's own functions.

What it does (no download, no generation, one process, about two minutes on one H200 / H100 / A100-80GB)
------------------------------------------------------------------------------------------------------------
1. Builds a randomly initialised model with the public **Qwen3-8B-Base** architecture (36 layers, hidden 4096,
   MLP 12288, 32 query / 8 key-value heads of 128, vocabulary 151,936, untied head: 8.19 B parameters) in
   bfloat16 directly on the GPU (``torch.device("cuda")`` as the default device: 16 GB of weights are never
   built on the CPU), with SDPA attention.
2. Measures the rollout's KV cache: one prefill of the whole batch (below) with ``use_cache=True`` and only the
   last position's logits, as generation's first step does: the cache's bytes per token and the peak memory.
3. Wraps it with LoRA (``policy.prepare_model``: r=16, α=32, dropout 0.05 on q,k,v,o,gate,up,down) and
   non-reentrant gradient checkpointing, exactly as ``grpo.py --use_peft --gradient_checkpointing`` does.
4. Makes one rollout batch without sampling: 4 prompts × 8 responses, random token ids, prompts of 96-128
   tokens (left-padded), responses of 1024 tokens of which some end early (right-padded, masked); fixed binary
   rewards with both signs in every group.
5. Runs one training step per credit, the trainer's step minus rollout and grading, on the scale path (the four
   flags of the scale recipes, ``--padding_free --shared_prompt --chunked_lm_head --fuse_old_logprobs``; its passes
   chosen by ``run_setup.step_parts`` as ``grpo.train`` chooses them):
     old log-probs (and, for DelTA, the LM-head inputs from the same pass) ... the run's ``old_logprobs``
                    (trainer/scale_passes.py)
     credit  grpo:  ``credit_methods.GRPOCredit`` (broadcast)
             delta: ``credit_methods.DeltaCredit`` -> delta.py (``--delta_impl memory_efficient`` streaming by
                    default)
             cscr:  ``cscr.condition_logprobs`` on prompt-variant token ids (the prompt + a "correct" or an
                    "incorrect" note of 24 random tokens: the two conditioned passes, tokenizer-free, with
                    ``scale_passes.token_logprobs``) and ``cscr.cscr_token_advantages``, ``cscr.cscr_stats``
     update  ``grpo.policy_update`` -> ``minibatch_backward`` (micro-batches with the whole-mini-batch
             normaliser, gradient checkpointing) -> clip -> AdamW (``policy.build_optimizer``)
   after one untimed-for-the-table warm-up GRPO step (CUDA context, cuBLAS, allocator growth).
6. Then the same model without adapters (``unload``), every weight trainable (full fine-tuning, bfloat16
   weights and AdamW moments, fused AdamW), micro-batches of 2 rows as docs/scaling.md recommends: one GRPO step.

For each step it prints and records seconds (old log-probs / credit / update / total), tokens per second (all
tokens, and response tokens), ``torch.cuda.max_memory_allocated`` (and reserved) since the step began, the memory
held before the step (weights, adapters, optimizer state) and after it (gradients freed), the loss and gradient
norm, DelTA's LM-head inputs (size and device) and ``ok`` (finite loss and gradient norm, the trainable weights
changed); memory in GB = 10^9 bytes, as in docs/scaling.md's memory table. The JSON also records the command,
the machine (CPU, GPU, CUDA, driver), the library versions and the git commit (``provenance``). Results go to
``$OUT/gpu_smoke.json`` if ``$OUT`` is set, else ``tools/bench/results/gpu_smoke.json`` (``--out DIR`` overrides;
``--tiny`` writes ``gpu_smoke_tiny.json``), rewritten after every step so a time-out keeps what was measured.

Needs only torch, transformers (with Qwen3: >= 4.51) and peft; prints their versions first. tools/bench/gpu_check.py
runs it as the first part of the GPU check (docs/scaling.md, "How to run the GPU check").

Usage::

    python tools/bench/gpu_smoke.py                 # the 8B check on one GPU
    python tools/bench/gpu_smoke.py --tiny          # the same code on a tiny config, on the CPU, in seconds
    python tools/bench/gpu_smoke.py --micro_batch_size 8 --modes lora
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

# Public Qwen3-8B-Base config (hub: Qwen/Qwen3-8B-Base, config.json)
QWEN3_8B = dict(
    hidden_size=4096,
    num_hidden_layers=36,
    num_attention_heads=32,
    num_key_value_heads=8,
    intermediate_size=12288,
    vocab_size=151936,
    head_dim=128,
    max_position_embeddings=40960,
    tie_word_embeddings=False,
    rope_theta=1e6,
)
TINY = dict(
    hidden_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    intermediate_size=128,
    vocab_size=512,
    head_dim=16,
    max_position_embeddings=256,
    tie_word_embeddings=False,
    rope_theta=1e4,
)
# versions recorded next to checkpoint.library_versions()'s (torch, transformers, peft, math-verify, vllm, ...)
EXTRA_PACKAGES = (
    "latex2sympy2_extended",
    "antlr4-python3-runtime",
    "pebble",
    "sympy",
    "tokenizers",
    "accelerate",
    "safetensors",
    "huggingface-hub",
    "tqdm",
)
# written by tools/bench/gpu_wheels.sh: the commit of a tree copied without its .git (the device machine's copy)
GIT_STAMP = ROOT / ".whl" / "git_state.json"


def parse_args(argv=None):
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    ap.add_argument("--tiny", action="store_true", help="tiny config on the CPU (float32), for testing the script")
    ap.add_argument("--modes", default="lora,full", help="lora (one step per credit), full (one GRPO step)")
    ap.add_argument("--credits", default="grpo,delta,cscr")
    ap.add_argument("--num_prompts", type=int, default=None, help="default 4 (tiny: 2)")
    ap.add_argument("--num_generations", type=int, default=None, help="default 8 (tiny: 4)")
    ap.add_argument("--response_length", type=int, default=None, help="default 1024 (tiny: 24)")
    ap.add_argument("--prompt_length", type=int, default=None, help="longest prompt, default 128 (tiny: 12)")
    ap.add_argument("--micro_batch_size", type=int, default=None, help="default 4 (tiny: 3)")
    ap.add_argument(
        "--full_micro_batch_size",
        type=int,
        default=2,
        help="rows per forward/backward of the full fine-tuning step (docs/scaling.md: 2 for 8B)",
    )
    ap.add_argument("--delta_impl", default="memory_efficient", choices=["normal", "memory_efficient"])
    ap.add_argument("--attn_implementation", default="sdpa")
    ap.add_argument(
        "--dtype",
        default="auto",
        choices=["auto", "bfloat16", "float32"],
        help="auto: bfloat16 on the GPU, float32 on the CPU",
    )
    ap.add_argument("--no_gradient_checkpointing", action="store_true")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=None, help="output folder (default $OUT, else tools/bench/results)")
    args = ap.parse_args(argv)
    d = dict(
        num_prompts=(2, 4),
        num_generations=(4, 8),
        response_length=(24, 1024),
        prompt_length=(12, 128),
        micro_batch_size=(3, 4),
    )
    for k, (tiny, big) in d.items():
        if getattr(args, k) is None:
            setattr(args, k, tiny if args.tiny else big)
    return args


def gpu_info() -> dict | None:
    """The GPU as torch and ``nvidia-smi`` see it: name, memory, compute capability, CUDA, cuDNN and the driver's
    version (None without CUDA; the driver None when ``nvidia-smi`` cannot be run)."""
    if not torch.cuda.is_available():
        return None
    p = torch.cuda.get_device_properties(0)
    info = {
        "name": p.name,
        "memory_gib": round(p.total_memory / 2**30, 1),
        "capability": f"{p.major}.{p.minor}",
        "multiprocessors": p.multi_processor_count,
        "count": torch.cuda.device_count(),
        "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version(),
        "driver": None,
    }
    try:
        r = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version,name,memory.total", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
        info["driver"], info["nvidia_smi_name"], info["nvidia_smi_memory"] = (
            x.strip() for x in r.stdout.splitlines()[0].split(",")
        )
    except (OSError, subprocess.SubprocessError, IndexError, ValueError):
        pass
    return info


def provenance(command: str) -> dict:
    """What every result of the GPU check records: the command, when it started, the machine (CPU, memory,
    library versions; ``tools/bench/_common.machine_description``), the GPU (``gpu_info``) and the git commit, taken
    from
    ``GIT_STAMP`` when the tree is no git checkout (the device machine gets a copy without .git)."""
    from tools.bench import _common

    git = _common.git_state()
    if git.get("commit") is None and GIT_STAMP.exists():
        git = {**json.loads(GIT_STAMP.read_text()), "source": str(GIT_STAMP.relative_to(ROOT))}
    return {
        "command": command,
        "started": _common.now_iso(),
        "machine": _common.machine_description(EXTRA_PACKAGES),
        "gpu": gpu_info(),
        "git": git,
    }


def build_model(args, device, dtype):
    """Randomly initialised Qwen3ForCausalLM built directly on ``device`` in ``dtype``; returns (model, seconds
    the build took, imports excluded)."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    config = Qwen3Config(**(TINY if args.tiny else QWEN3_8B), attn_implementation=args.attn_implementation)
    torch.manual_seed(args.seed)
    old = torch.get_default_dtype()
    t0 = time.time()
    torch.set_default_dtype(dtype)  # parameters are created in bfloat16, not built in float32 and cast
    try:
        with torch.device(device):
            model = Qwen3ForCausalLM(config)
    finally:
        torch.set_default_dtype(old)
    _sync()
    return model, time.time() - t0


def make_batch(args, vocab, device):
    """Random [left-padded prompt | right-padded response] rows, group by group, with fixed rewards."""
    g = torch.Generator().manual_seed(args.seed + 1)
    n, G, P, T = args.num_prompts, args.num_generations, args.prompt_length, args.response_length
    N = n * G
    pad = 0
    prompt_lens = torch.randint(max(1, 3 * P // 4), P + 1, (n,), generator=g)
    prompts = [torch.randint(1, vocab, (int(L),), generator=g).tolist() for L in prompt_lens]
    # response lengths: a quarter hit the budget (truncated), the rest end somewhere in the second half
    resp_lens = torch.randint(T // 2, T + 1, (N,), generator=g)
    resp_lens[::4] = T
    response_ids = torch.randint(1, vocab, (N, T), generator=g)
    pos = torch.arange(T)[None]
    response_mask = (pos < resp_lens[:, None]).float()
    response_ids = torch.where(response_mask.bool(), response_ids, torch.full_like(response_ids, pad))
    input_ids = torch.full((N, P + T), pad, dtype=torch.long)
    attn = torch.zeros((N, P + T), dtype=torch.long)
    for i in range(N):
        p = prompts[i // G]
        input_ids[i, P - len(p) : P] = torch.tensor(p)
        attn[i, P - len(p) : P] = 1
    input_ids[:, P:] = response_ids
    attn[:, P:] = response_mask.long()
    base = torch.tensor([1.0, 0.0, 0.0, 1.0, 0.0, 1.0, 0.0, 0.0])  # both signs in every group
    rewards = base.repeat(N // len(base) + 1)[:N] if G >= 2 else torch.zeros(N)
    for k in range(n):  # make sure every group has a 1 and a 0
        rewards[k * G] = 1.0
        rewards[k * G + G - 1] = 0.0
    # CSCR's prompt variants: the prompt followed by a "correct" or an "incorrect" note (random ids)
    note_c = torch.randint(1, vocab, (24 if not args.tiny else 4,), generator=g).tolist()
    note_i = torch.randint(1, vocab, (len(note_c),), generator=g).tolist()
    return SimpleNamespace(
        input_ids=input_ids.to(device),
        attention_mask=attn.to(device),
        response_ids=response_ids,
        response_mask=response_mask,
        rewards=rewards,
        prompts=[prompts[i // G] for i in range(N)],
        note_c=note_c,
        note_i=note_i,
        pad_id=pad,
    )


def _sync():
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def _gb(x):
    return round(x / 1e9, 3)  # GB = 10^9 bytes, as in the README's memory table


def kv_cache_prefill(model, batch):
    """One prefill of every row of ``batch`` with the KV cache on and only the last position's logits, as
    generation's first step does (no grad). Returns the cache's size, its bytes per token (docs/scaling.md:
    2 (K, V) × layers × KV heads × head_dim × 2 bytes in bf16) and the prefill's peak memory (CUDA)."""
    model.eval()
    with torch.no_grad():
        out = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask, use_cache=True, logits_to_keep=1)
    tensors = [t for layer in out.past_key_values.layers for t in (layer.keys, layer.values)]
    nbytes = sum(t.numel() * t.element_size() for t in tensors)
    positions = batch.input_ids.numel()  # the cache holds every position, padding included
    return {
        "rows": batch.input_ids.shape[0],
        "positions": positions,
        "cache_gb": _gb(nbytes),
        "mb_per_token": round(nbytes / positions / 1e6, 4),
        "dtype": str(tensors[0].dtype).replace("torch.", ""),
        "ok": len(tensors) == 2 * model.config.num_hidden_layers,
    }


def train_step(model, optimizer, batch, credit_name, cfg):
    """One trainer step without rollout; returns timings and statistics."""
    import cscr
    import grpo
    from trainer import credit_methods, policy, run_setup, scale_passes

    t = {}
    _sync()
    t0 = time.time()
    mask = batch.response_mask
    adv = grpo.group_advantages(batch.rewards, cfg.num_generations)
    method = grpo.paper_method(cfg)
    credit = method.credit(cfg, None)
    # the run's passes, chosen once as grpo.train chooses them (the scale path's: cfg turns it on)
    parts = run_setup.step_parts(cfg, credit, method, policy.Forward(grpo.old_logprobs, grpo.micro_batches))
    theta_old = parts.forward.old_logprobs(model, batch, cfg, credit.asks, None)  # stage 4, as grpo.py
    old, hidden = theta_old.logp, theta_old.hidden
    # DelTA's LM-head inputs [N, T, H] (docs/scaling.md: float32, on the CPU)
    held = (
        None
        if hidden is None
        else {
            "gb": _gb(hidden.numel() * hidden.element_size()),
            "device": str(hidden.device),
            "dtype": str(hidden.dtype).replace("torch.", ""),
        }
    )
    _sync()
    t["old_logprobs"] = time.time() - t0
    t1 = time.time()
    stats = {}
    if credit_name in ("grpo", "delta"):
        inputs = credit_methods.CreditInputs(batch, adv, theta_old, None, 0, mask, batch.rewards, parts.forward)
        result = credit(model, inputs)  # (no answers: GRPO and DelTA read none)
        token_adv = result.token_adv
        stats = result.stats
    else:  # CSCR, tokenizer-free: the two conditioned passes on prompt-variant ids, then the weights
        rows = (adv != 0).nonzero().flatten().tolist()
        lp_pos, lp_neg = torch.zeros_like(old), torch.zeros_like(old)
        pc = [batch.prompts[i] + batch.note_c for i in rows]
        pi = [batch.prompts[i] + batch.note_i for i in rows]
        lp_c, lp_i = cscr.condition_logprobs(
            model,
            SimpleNamespace(pad_token_id=batch.pad_id),
            list(zip(pc, pi)),
            batch.response_ids[rows],
            mask[rows],
            temperature=cfg.temperature,
            micro_batch_size=cfg.micro_batch_size or None,
            logprob_fn=scale_passes.token_logprobs,
        )
        lp_pos[rows], lp_neg[rows] = lp_c.cpu(), lp_i.cpu()
        settings = cscr.Settings(cfg.cscr_alpha, cfg.cscr_w_min, cfg.cscr_mode)
        token_adv = cscr.cscr_token_advantages(adv, old, lp_pos, lp_neg, mask, cfg.cscr_threshold, settings)
        stats = cscr.cscr_stats(adv, old, lp_pos, lp_neg, mask, cfg.cscr_threshold, settings)
    _sync()
    t["credit"] = time.time() - t1
    t2 = time.time()
    watch = [p for p in model.parameters() if p.requires_grad][-2:]  # e.g. the last adapter's A and B
    before = [p.detach().float().clone() for p in watch]
    update = grpo.Update(batch, theta_old, token_adv, batch.response_mask, {}, parts)
    loss_sum, grad_norms, agg, skipped = grpo.policy_update(model, optimizer, update, cfg, step=0)
    _sync()
    t["update"] = time.time() - t2
    t["total"] = time.time() - t0
    changed = any(not torch.equal(b, p.detach().float()) for b, p in zip(before, watch))
    grad_norm = grad_norms[0] if grad_norms else float("nan")
    ok = math.isfinite(loss_sum) and math.isfinite(grad_norm) and grad_norm > 0 and skipped == 0 and changed
    keep = {
        k: float(v)
        for k, v in stats.items()
        if isinstance(v, (int, float))
        and k.split("/")[-1] in ("lam_pos_mean", "lam_neg_mean", "w_mean", "frac_w_lt_1", "eff_token_frac")
    }
    return {
        "seconds": {k: round(v, 3) for k, v in t.items()},
        "loss": loss_sum,
        "grad_norm": grad_norm,
        "skipped": skipped,
        "weights_changed": changed,
        "ok": bool(ok),
        "credit_stats": keep,
        **({"delta_hidden": held} if held else {}),
    }


def main(argv=None) -> dict:
    args = parse_args(argv)
    t_start = time.time()
    command = "python tools/bench/gpu_smoke.py " + shlex.join(sys.argv[1:] if argv is None else argv)
    prov = provenance(command.strip())
    info = {k: prov["machine"]["versions"].get(k) for k in ("python", "torch", "transformers", "peft")}
    print("versions:", json.dumps({**info, "gpu": prov["gpu"]}), flush=True)
    if info["peft"] is None:
        raise SystemExit("gpu_smoke.py: peft is not installed (pip install peft)")
    import grpo
    from trainer import policy, scale_passes

    cuda = torch.cuda.is_available() and not args.tiny
    if not args.tiny and not cuda:
        raise SystemExit("gpu_smoke.py: no CUDA device; use --tiny on the CPU")
    device = torch.device("cuda" if cuda else "cpu")
    if args.tiny:
        torch.set_num_threads(1)  # tiny matmuls: threads cost more than they give
    dtype = getattr(torch, args.dtype) if args.dtype != "auto" else (torch.bfloat16 if cuda else torch.float32)
    out_dir = Path(args.out or os.environ.get("OUT") or ROOT / "tools" / "bench" / "results")
    out_dir.mkdir(parents=True, exist_ok=True)
    out_path = out_dir / ("gpu_smoke_tiny.json" if args.tiny else "gpu_smoke.json")
    N = args.num_prompts * args.num_generations
    cfg = grpo.GRPOConfig(
        use_peft=True,
        gradient_checkpointing=not args.no_gradient_checkpointing,
        micro_batch_size=args.micro_batch_size,
        num_generations=args.num_generations,
        num_prompts_per_step=args.num_prompts,
        max_completion_length=args.response_length,
        delta_impl=args.delta_impl,
        learning_rate=1e-5,
        attn_implementation=args.attn_implementation,
        padding_free=True,  # the scale path, as the scale recipes (delta_paper, delta_one_gpu) take it
        shared_prompt=True,
        chunked_lm_head=True,
        fuse_old_logprobs=True,
    )
    result = {
        "benchmark": "gpu_smoke",
        **prov,
        "device": str(device),
        "dtype": str(dtype).replace("torch.", ""),
        "args": vars(args),
        "path": str(out_path),
        "rows": N,
        "response_tokens": 0,
        "runs": [],
    }

    def save():
        result["total_seconds"] = round(time.time() - t_start, 1)
        out_path.write_text(json.dumps(result, indent=1))

    def mem():
        return torch.cuda.memory_allocated() if cuda else 0

    def guarded(fn, *a):  # out of memory: record it and carry on with the next measurement
        if cuda:
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
        static = mem()
        try:
            r = fn(*a)
        except RuntimeError as e:
            if "out of memory" not in str(e).lower():
                raise
            r = {"ok": False, "error": str(e).splitlines()[0]}
        r.update(static_gb=_gb(static), after_gb=_gb(mem()))
        if cuda:
            r["peak_allocated_gb"] = _gb(torch.cuda.max_memory_allocated())
            r["peak_reserved_gb"] = _gb(torch.cuda.max_memory_reserved())
        return r

    model, build_seconds = build_model(args, device, dtype)
    n_params = sum(p.numel() for p in model.parameters())
    result["model"] = {
        "parameters": n_params,
        "build_seconds": round(build_seconds, 1),
        "weights_gb": _gb(mem()),
        "config": TINY if args.tiny else QWEN3_8B,
    }
    print(
        f"model: {n_params / 1e9:.3f} B parameters, built in {result['model']['build_seconds']} s, "
        f"{_gb(mem())} GB on {device}",
        flush=True,
    )
    batch = make_batch(args, model.config.vocab_size, device)
    n_resp = int(batch.response_mask.sum())
    result["response_tokens"] = n_resp
    n_tok = int(batch.attention_mask.sum())
    kv = result["kv_cache"] = guarded(kv_cache_prefill, model, batch)
    print(
        f"[kv cache] prefill of {N} rows: "
        + (
            f"{kv['cache_gb']} GB cache, {kv['mb_per_token']} MB per token, "
            f"peak {kv.get('peak_allocated_gb', 0):.2f} GB"
            if "error" not in kv
            else f"FAILED: {kv['error']}"
        ),
        flush=True,
    )
    save()

    def measure(label, mode, credit_name, model, optimizer):
        c = grpo.GRPOConfig(
            **{
                **cfg.__dict__,
                "credit": credit_name,
                "use_peft": mode == "lora",
                "micro_batch_size": args.micro_batch_size if mode == "lora" else args.full_micro_batch_size,
            }
        )
        r = guarded(train_step, model, optimizer, batch, credit_name, c)
        if "error" in r:
            optimizer.zero_grad(set_to_none=True)
        r.update(label=label, mode=mode, credit=credit_name, micro_batch_size=c.micro_batch_size)
        if "seconds" in r:
            r["tokens_per_second"] = round(n_tok / r["seconds"]["total"], 1)
            r["response_tokens_per_second"] = round(n_resp / r["seconds"]["total"], 1)
        print(
            f"[{label}] {mode:4s} {credit_name:5s} "
            + (
                f"{r['seconds']['total']:7.2f} s (old {r['seconds']['old_logprobs']:.2f}, credit "
                f"{r['seconds']['credit']:.2f}, update {r['seconds']['update']:.2f})  peak "
                f"{r.get('peak_allocated_gb', 0):.2f} GB (static {r['static_gb']:.2f})  loss {r['loss']:.4g} "
                f"grad_norm {r['grad_norm']:.4g}  ok={r['ok']}"
                if "seconds" in r
                else f"FAILED: {r['error']}"
            ),
            flush=True,
        )
        return r

    modes = [m for m in args.modes.split(",") if m]
    credits = [c for c in args.credits.split(",") if c]
    if "lora" in modes:
        model = policy.prepare_model(model, cfg)  # LoRA + gradient checkpointing, as grpo.py does
        scale_passes.exact_optimisations(model, cfg)  # as grpo.py does: what checkpointing and dropout rule out
        trainable = [p for p in model.parameters() if p.requires_grad]
        result["lora_parameters"] = sum(p.numel() for p in trainable)
        optimizer = policy.build_optimizer(trainable, cfg)
        result["warmup"] = measure("warm-up", "lora", "grpo", model, optimizer)
        save()
        for c in credits:
            result["runs"].append(measure("step", "lora", c, model, optimizer))
            save()
    if "full" in modes:
        if "lora" in modes:
            model = model.unload()  # drop the adapters: the plain model (checkpointing stays on)
            optimizer = None
            if cuda:
                torch.cuda.empty_cache()
        elif not args.no_gradient_checkpointing:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        model.requires_grad_(True)
        scale_passes.exact_optimisations(model, cfg)
        optimizer = policy.build_optimizer(model.parameters(), cfg)
        result["runs"].append(measure("step", "full", "grpo", model, optimizer))
        save()
    result["all_ok"] = all(r["ok"] for r in result["runs"]) and result["kv_cache"]["ok"]
    save()
    print(f"done in {result['total_seconds']} s; all ok: {result['all_ok']}; results: {out_path}", flush=True)
    return result


if __name__ == "__main__":
    main()
