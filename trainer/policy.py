"""The policy model of grpo.py: loading it, wrapping it for training, and the pieces that live next to it.

* ``load_model_and_tokenizer``: ``from_pretrained`` of a registered name (``MODELS``: ``"toy"``, toy/), a local
  folder or a hub id, in the dtype and on the device asked for; the tokenizer pads on the left;
* ``prepare_model``: the float32 LM head (``cast_lm_head_to_fp32``), gradient checkpointing and LoRA adapters (peft);
* ``reference_model``: the frozen initial policy for the k3 KL term (``--beta > 0``);
* ``build_optimizer``: AdamW; ``oom_guard``: out-of-memory errors as one line naming the flags that help;
  ``peak_memory`` (per step; the host-memory guards are memory_plan.py's ``check_host_memory``);
* ``clip_and_step``: the update's gradient clipping and AdamW step (a non-finite one skipped);
* the types a pass of the policy returns, whichever path made it (grpo.py's plain passes, trainer/scale_passes.py's):
  ``Asked``, ``TokenOutputs``, ``MicroBatch``, ``ThetaOld``, and ``Forward``, the passes a run takes, chosen once;
* ``build``: loading, LoRA, reference, optimizer in the order that matters for the trainer, with a hook for
  ``--resume``'s weights and torchrun's sharding (distributed.py) in between.

The model knows no run folder: resuming (checkpoint.py) and the data (problems.py) are the trainer's; a batch is
read by its fields (``input_ids``, ``attention_mask``, ``response_mask``), whatever made it. Left out on purpose:
quantised base weights (QLoRA), DoRA and other adapter types, DeepSpeed, learning-rate schedules. Read next:
grpo.py ``train``, which calls ``build``.
"""

from __future__ import annotations

import contextlib
import importlib.util
import math
import os
from typing import Callable, NamedTuple

import torch

from trainer import distributed

# Named models an entry point adds (``register_model``): ``--model name`` loads the folder ``MODELS[name]()`` returns
# (``toy.register`` adds ``toy``). A function, not a path: the folder may be built on first use.
MODELS: dict = {}


def register_model(name: str, folder) -> None:
    """Make ``--model name`` load the folder that ``folder()`` (no arguments) returns."""
    MODELS[name] = folder


def model_path(name: str) -> str:
    """The folder or hub id ``from_pretrained`` gets for ``--model name``: a registered name's folder (``MODELS``).

    Raises ValueError (one line) for a path that does not exist (``/x``, ``./x``, ``~/x``, or with two or more
    ``/``: a hub id has at most one), instead of the hub's "Repo id must be in the form ..." message.
    """
    if name in MODELS:
        return MODELS[name]()
    looks_like_path = name.startswith(("/", ".", "~")) or name.count("/") > 1 or os.sep != "/" and os.sep in name
    if looks_like_path and not os.path.isdir(os.path.expanduser(name)):
        raise ValueError(f"model folder {name} does not exist")
    return os.path.expanduser(name) if looks_like_path else name


def load_model_and_tokenizer(
    name: str,
    dtype: str = "auto",
    device: str | None = None,
    attn_implementation: str | None = None,
    trust_remote_code: bool = False,
):
    """Load a causal LM and its tokenizer with ``from_pretrained``: ``"toy"``, a local folder or a hub id.

    ``"toy"`` resolves to the toy model's folder (toy/), then goes through exactly the same ``from_pretrained``
    path. A folder holding a LoRA adapter (``adapter_config.json``, e.g. a ``--use_peft`` run's ``final/``) loads
    its base model (``base_model_name_or_path``, which may be ``toy``) with the adapter on top. A hub id is looked
    up in the local cache first; a download is tried only when the hub answers (``hub.require_hub``). The tokenizer
    pads on the left (generation) and gets a pad token (EOS) if it has none.

    Args:
        dtype: ``"auto"`` (bfloat16 on a GPU, float32 on the CPU), ``"bfloat16"`` or ``"float32"``
            (``"float16"`` is accepted too).
        device: ``"cuda"``, ``"cuda:1"``, ``"cpu"``...; default: CUDA when available. On a GPU the weights are
            loaded straight onto it (``device_map``), never materialised in CPU memory first.
        attn_implementation: ``"sdpa"``, ``"eager"``, ``"flash_attention_2"``...; None: transformers' default.
        trust_remote_code: allow a hub repository's own model code.
    Raises:
        ValueError: an unknown dtype, flash attention without the flash-attn package (or on the CPU), a folder
        that does not exist, a hub id that cannot be loaded (one line, not a deep traceback).
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = model_path(name)
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    if dtype == "auto":
        dtype = "bfloat16" if device.startswith("cuda") else "float32"
    if dtype not in ("bfloat16", "float32", "float16"):
        raise ValueError(f"dtype (--torch_dtype) must be auto, bfloat16 or float32, got {dtype!r}")
    if attn_implementation and attn_implementation.startswith("flash_attention"):
        pkg = "flash_attn_interface" if attn_implementation == "flash_attention_3" else "flash_attn"
        if importlib.util.find_spec(pkg) is None:
            raise ValueError(
                f"--attn_implementation {attn_implementation} needs the {pkg} package "
                f"(pip install flash-attn); use --attn_implementation sdpa"
            )
        if not device.startswith("cuda"):
            raise ValueError(f"--attn_implementation {attn_implementation} runs on a GPU only; use sdpa on the CPU")
    adapter = os.path.join(path, "adapter_config.json")
    if os.path.isfile(adapter):  # a LoRA run's folder: its base model, then the adapter
        import json

        from peft import PeftModel

        with open(adapter) as f:
            base = json.load(f)["base_model_name_or_path"]
        model, _ = load_model_and_tokenizer(base, dtype, device, attn_implementation, trust_remote_code)
        tokenizer = AutoTokenizer.from_pretrained(path, trust_remote_code=trust_remote_code)
        model = PeftModel.from_pretrained(model, path)
        return model, _left_padded(tokenizer, name)
    kwargs = dict(dtype=getattr(torch, dtype), trust_remote_code=trust_remote_code)
    if attn_implementation:
        kwargs["attn_implementation"] = attn_implementation
    if device.startswith("cuda"):
        kwargs["device_map"] = device  # load shard by shard onto the GPU

    def load(**extra):
        tok = AutoTokenizer.from_pretrained(path, trust_remote_code=trust_remote_code, **extra)
        return AutoModelForCausalLM.from_pretrained(path, **kwargs, **extra), tok

    model, tokenizer = _from_pretrained(name, path, load)
    if not device.startswith("cuda"):
        model = model.to(device)
    return model, _left_padded(tokenizer, name)


def load_tokenizer(name: str, trust_remote_code: bool = False):
    """The tokenizer of ``--model name`` alone, no weights (the prompt filter and the memory plan run before the
    model loads), padded on the left as ``load_model_and_tokenizer``'s. Raises ValueError (one line) as it does."""
    from transformers import AutoTokenizer

    path = model_path(name)
    return _left_padded(
        _from_pretrained(
            name,
            path,
            lambda **extra: AutoTokenizer.from_pretrained(path, trust_remote_code=trust_remote_code, **extra),
        ),
        name,
    )


def _from_pretrained(name: str, path: str, load):
    """``load(**extra)`` from the local folder or cache first, from the hub only when it answers (``hub.require_hub``);
    an ``OSError`` (a folder without a model, an unknown hub id) becomes one ValueError line naming ``name``."""
    try:
        try:
            return load(local_files_only=True)  # a folder, or a hub id already in the cache
        except OSError:
            if os.path.isdir(path):
                raise
            from trainer import hub

            hub.require_hub(path)
            return load()
    except OSError as e:
        where = "folder" if os.path.isdir(path) else "hub id"
        raise ValueError(f"cannot load model {name!r} as a {where}: {str(e).splitlines()[0]}") from None


def _left_padded(tokenizer, name: str):
    if len(tokenizer) <= 1:  # transformers builds an empty tokenizer for a folder without tokenizer files
        raise ValueError(
            f"cannot load the tokenizer of model {name!r}: no tokenizer files there (tokenizer.json, "
            f"tokenizer_config.json, ...)"
        )
    tokenizer.padding_side = "left"
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def prepare_model(model, cfg):
    """The float32 LM head (``--cast_lm_head_to_fp32``), gradient checkpointing (non-reentrant: it restores the RNG,
    so dropout masks match) and LoRA adapters (``peft.get_peft_model``; only the adapters require gradients) as
    ``cfg`` asks; returns the policy.

    With both, ``enable_input_require_grads`` makes the embeddings' output require grad (as peft and TRL do).
    Raises ValueError when no module matches ``cfg.lora_target_modules`` (peft's message).
    """
    if cfg.cast_lm_head_to_fp32:
        cast_lm_head_to_fp32(model)
    if cfg.gradient_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    if not cfg.use_peft:
        return model
    from peft import LoraConfig, get_peft_model

    if cfg.gradient_checkpointing:
        model.enable_input_require_grads()
    targets = cfg.lora_target_modules.strip()
    targets = targets if targets == "all-linear" else [t.strip() for t in targets.split(",") if t.strip()]
    lora = LoraConfig(
        r=cfg.lora_r,
        lora_alpha=cfg.lora_alpha,
        lora_dropout=cfg.lora_dropout,
        target_modules=targets,
        bias="none",
        task_type="CAUSAL_LM",
    )
    return get_peft_model(model, lora)


def cast_lm_head_to_fp32(model):
    """``--cast_lm_head_to_fp32`` (TRL's flag of that name; ScaleRL, arXiv 2510.13786): the LM head's weight in
    float32 and its input cast to float32 before the matmul, so the logits and the head's gradient are computed in
    float32 while the body keeps its dtype. Returns ``model``. Raises ValueError (one line) for a head tied to the
    input embeddings: its float32 weight would change the body's input too."""
    head = model.get_output_embeddings()
    if head.weight is model.get_input_embeddings().weight:
        raise ValueError(
            "--cast_lm_head_to_fp32 needs an LM head of its own: this model ties it to its input "
            "embeddings (tie_word_embeddings)"
        )
    head.float()
    head.register_forward_pre_hook(_input_in_weight_dtype)
    return model


def _input_in_weight_dtype(module, args):
    return (args[0].to(module.weight.dtype),) + args[1:]


class AdapterDisabledReference:
    """The KL reference of a LoRA run: the policy itself, called with its adapter disabled (the base weights are
    frozen, so that *is* the initial policy: no second copy, as in TRL). Callable like a model."""

    def __init__(self, model):
        self.model = model

    def __call__(self, *args, **kwargs):
        with self.model.disable_adapter():
            return self.model(*args, **kwargs)

    def parameters(self):
        return self.model.parameters()

    def __getattr__(self, name):  # the rest (config, LM head, body: the chunked LM head's) is the policy's
        if name == "model":  # not set yet (a copy being built): no recursion
            raise AttributeError(name)
        return getattr(self.model, name)


def reference_model(model, cfg):
    """The frozen reference for the k3 KL term (``cfg.beta > 0``), or None. LoRA: ``AdapterDisabledReference``.
    Full fine-tuning: a frozen copy of the initial policy, on its device, or loaded again onto the CPU with
    ``--ref_on_cpu``. Call it before any update (and before loading a checkpoint's weights into the policy)."""
    if cfg.beta <= 0:
        return None
    if cfg.use_peft:
        return AdapterDisabledReference(model)
    if cfg.ref_on_cpu:
        dtype = str(next(model.parameters()).dtype).replace("torch.", "")
        ref, _ = load_model_and_tokenizer(
            cfg.model,
            dtype=dtype,
            device="cpu",
            attn_implementation=cfg.attn_implementation,
            trust_remote_code=cfg.trust_remote_code,
        )
        if cfg.cast_lm_head_to_fp32:  # the policy's head, as prepare_model made it
            cast_lm_head_to_fp32(ref)
        return ref.eval().requires_grad_(False)
    import copy

    return copy.deepcopy(model).eval().requires_grad_(False)


def build_optimizer(params, cfg) -> torch.optim.AdamW:
    """AdamW (moments in each parameter's dtype). On a GPU the fused kernel: no per-step temporary copy of every
    trainable weight (16 GB for a full Qwen3-8B with torch's default multi-tensor path)."""
    params = list(params)
    fused = bool(params) and all(p.device.type == "cuda" for p in params)
    return torch.optim.AdamW(
        params, lr=cfg.learning_rate, weight_decay=cfg.weight_decay, **({"fused": True} if fused else {})
    )


OOM_HINT = (
    "out of memory during {where} ({err}). Lower the memory of a step with: --micro_batch_size 1 (rows "
    "per forward/backward; the gradient is unchanged), --gradient_checkpointing (recompute activations), "
    "--use_peft (LoRA: no full gradients or AdamW state), a smaller --max_completion_length, or fewer "
    "--num_prompts_per_step / --num_generations; with --beta > 0 and full fine-tuning, --ref_on_cpu"
)


@contextlib.contextmanager
def oom_guard(where: str):
    """Re-raise an out-of-memory error as a one-line ``SystemExit`` naming the flags that lower memory."""
    try:
        yield
    except RuntimeError as e:
        if isinstance(e, torch.OutOfMemoryError) or "out of memory" in str(e).lower():
            err = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            raise SystemExit("grpo.py: error: " + OOM_HINT.format(where=where, err=err)) from None
        raise


def proc_status_kib(field: str) -> int | None:
    """A ``/proc/self/status`` field in KiB (``VmRSS``, ``VmHWM``), or None where unavailable (not Linux)."""
    try:
        with open("/proc/self/status") as f:
            return next((int(line.split()[1]) for line in f if line.startswith(field + ":")), None)
    except OSError:
        return None


def reset_peak_memory() -> bool:
    """Start a new peak: the process's resident set (Linux: ``/proc/self/clear_refs``) and the GPU's allocator.
    Returns whether the host counter was reset (elsewhere the peak is the process's lifetime peak, ru_maxrss)."""
    if torch.cuda.is_available():
        torch.cuda.reset_peak_memory_stats()
    with contextlib.suppress(OSError), open("/proc/self/clear_refs", "w") as f:
        return f.write("5") > 0  # resets VmHWM, the peak resident set size, to the current one
    return False


def peak_memory() -> dict:
    """Peak memory since ``reset_peak_memory``, in GB (10⁹ bytes): ``memory/peak_rss_gb`` (host, this process) and,
    on a GPU, ``memory/peak_gpu_allocated_gb`` (tensors) and ``memory/peak_gpu_reserved_gb`` (the allocator's)."""
    import resource
    import sys

    lifetime_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // (1024 if sys.platform == "darwin" else 1)
    out = {"memory/peak_rss_gb": (proc_status_kib("VmHWM") or lifetime_kib) * 1024 / 1e9}
    if torch.cuda.is_available():
        out["memory/peak_gpu_allocated_gb"] = torch.cuda.max_memory_allocated() / 1e9
        out["memory/peak_gpu_reserved_gb"] = torch.cuda.max_memory_reserved() / 1e9
    return out


def clip_and_step(model, optimizer, loss: float, max_grad_norm: float, step: int) -> float | None:
    """Clip the accumulated gradient to ``max_grad_norm`` (0: no clipping) and apply the optimizer; returns the
    pre-clip norm, or None (the gradient discarded, with a warning) when the loss or the norm is not finite."""
    grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm or float("inf"))
    if hasattr(grad_norm, "full_tensor"):  # FSDP2: the global norm as a DTensor
        grad_norm = grad_norm.full_tensor()
    if not (math.isfinite(loss) and torch.isfinite(grad_norm)):  # both global: every process agrees
        optimizer.zero_grad(set_to_none=True)  # a non-finite loss or gradient never reaches the weights
        from tqdm import tqdm

        tqdm.write(f"[warn] step {step + 1}: non-finite loss or gradient norm, update skipped")
        return None
    optimizer.step()
    return grad_norm.item()


def build(cfg, say=print, load_weights=None):
    """The trainer's policy, in the order that matters: load the weights (``cfg.model``, ``cfg.torch_dtype``...),
    LoRA / gradient checkpointing, the frozen reference (before any weight changes), ``load_weights(model)`` (the
    unsharded model: the trainer's hook for ``--resume``'s weights, checkpoint.RunFolder.load_weights; None: none),
    FSDP2 sharding under torchrun, AdamW over the trainable weights. The optimizer's state of a resumed run is the
    caller's to load after this (it needs the sharded model: checkpoint.RunFolder.load_optimizer).

    Returns:
        (model, tokenizer, ref_model or None, optimizer, compute dtype (bfloat16 when float32 weights are sharded
        over GPUs, else None)).
    """
    world = distributed.world_size()
    device = f"cuda:{torch.cuda.current_device()}" if torch.cuda.is_available() else "cpu"
    model, tokenizer = load_model_and_tokenizer(
        cfg.model,
        dtype=cfg.torch_dtype,
        device=device,
        attn_implementation=cfg.attn_implementation,
        trust_remote_code=cfg.trust_remote_code,
    )
    if cfg.num_threads or sum(p.numel() for p in model.parameters()) < 10_000_000:
        torch.set_num_threads(cfg.num_threads or 1)  # tiny models: thread sync costs more than it gives
    model = prepare_model(model, cfg)
    ref_model = reference_model(model, cfg)  # before any weight changes
    if load_weights is not None:
        load_weights(model)
    # float32 weights on several GPUs: float32 master weights and AdamW state (sharded), bfloat16 compute
    compute_dtype = torch.bfloat16 if world > 1 and cfg.torch_dtype == "float32" and device.startswith("cuda") else None
    if world > 1:
        model = distributed.shard_model(model, compute_dtype)
        if ref_model is not None and not cfg.use_peft and not cfg.ref_on_cpu:
            distributed.shard_model(ref_model, compute_dtype)
    trainable = [p for p in model.parameters() if p.requires_grad]
    if any(p.dtype == torch.bfloat16 for p in trainable):
        # bf16 has 8 significant bits: an update below ~2^-9 of a weight rounds to nothing (no master copy here)
        say(
            "[warn] full fine-tuning with bfloat16 weights: AdamW updates smaller than ~0.2-0.4% of a weight "
            "are rounded away (at --learning_rate 1e-6 almost all are); prefer --use_peft (float32 adapters) "
            "or --torch_dtype float32 if memory allows"
        )
    return model, tokenizer, ref_model, build_optimizer(trainable, cfg), compute_dtype


# --- What a pass of the policy returns, on either path ---------------------------------------------------------
class Asked(NamedTuple):
    """What a pass returns beside log p, each only when asked: ``hidden``, the LM head's input h_t ``[b, T, H]`` at
    the positions that predict the response tokens (detached; DelTA's proxy, App. F); ``entropy``, H_t = −Σ_j p_j
    log p_j ``[b, T]`` of softmax(z/T) (nats, no grad); ``token_stats``, a credit function's per-token statistics
    {name: function of u = z/T ``[..., V]`` -> ``[...]``} (no grad; e.g. OTB's Σ_v p_v²); ``logits``, z ``[b, T, V]``
    (the scale path's ``token_outputs`` only: tools/cscr_diagnostics.py)."""

    hidden: bool = False
    entropy: bool = False
    token_stats: dict | None = None
    logits: bool = False


class TokenOutputs(NamedTuple):
    """One forward's outputs: log p ``[b, T]`` (nats, 0 on padding), and, each None unless asked (``Asked``), h
    ``[b, T, H]``, H ``[b, T]``, {name: ``[b, T]``}, z ``[b, T, V]``."""

    logp: torch.Tensor
    hidden: torch.Tensor | None = None
    entropy: torch.Tensor | None = None
    token_stats: dict | None = None
    logits: torch.Tensor | None = None


class MicroBatch(NamedTuple):
    """One forward of a pass over rollout rows: the rows ``rows`` ``[b]`` and their response width ``t`` (T on the plain
    path; the longest response of these rows on the scale path's padding-free layout); ``logp`` ``[b, t]`` (a graph
    under grad), ``hidden``, ``entropy``, ``token_stats`` as ``Asked``; ``num_micro_batches``: how many the pass has."""

    rows: torch.Tensor
    t: int
    logp: torch.Tensor
    hidden: torch.Tensor | None = None
    entropy: torch.Tensor | None = None
    token_stats: dict | None = None
    num_micro_batches: int = 1

    def take(self, x: torch.Tensor) -> torch.Tensor:
        """This micro-batch's part of a batch-wide ``[N, T, ...]`` tensor: rows ``rows``, the first ``t`` columns."""
        return x[self.rows, : self.t]

    def part(self, x: torch.Tensor | None) -> torch.Tensor | None:
        """``take`` on this micro-batch's device (None: None): its part of a loss's input."""
        return None if x is None else self.take(x).to(self.logp.device)


def keep_loss_factor(update, mb: MicroBatch, factor: torch.Tensor) -> None:
    """Write micro-batch ``mb``'s loss factor ``factor`` ``[b, t]`` into ``update.loss_factor`` ``[N, T]`` (a field
    of grpo.Update: samples/ shows the credit times it), created by the first call as zeros like ``update_adv``."""
    if update.loss_factor is None:
        update.loss_factor = torch.zeros_like(update.update_adv)
    update.loss_factor[mb.rows, : mb.t] = factor.to(update.loss_factor)


class ThetaOld(NamedTuple):
    """θ_old, as grpo.py's stage 4 leaves it for stages 5 and 6, on the host (N responses × T tokens, hidden size H;
    at the papers' scale 2,048 × 4,096, H = 4,096): ``logp`` ``[N, T]`` N·T·4 bytes (34 MB); ``hidden`` ``[N, T, H]``
    (DelTA's --delta_impl normal, else None) N·T·H·4 (137 GB), bounded: preflight.check refuses a run whose cache (and
    v beside it) would pass its share of the host's memory (memory_plan.check_delta_cache), once, before any weights
    load; the paper's recipe streams h instead; ``ref_logp`` ``[N, T]`` (--beta > 0, else None); ``token_stats``
    {name: ``[N, T]``} (N·T·4 bytes each), the statistics the credit function asked for; ``training_forward``: the
    training forward (either path's) that stage 6 reuses when one update of one micro-batch uses the batch
    (--fuse_old_logprobs, the default; memory_plan.updates_on_policy), or None."""

    logp: torch.Tensor
    hidden: torch.Tensor | None
    ref_logp: torch.Tensor | None
    token_stats: dict
    training_forward: object | None = None


class Forward(NamedTuple):
    """The passes of the policy a run takes, chosen once (run_setup.step_parts): grpo.py's plain ones, or the scale
    path's (trainer/scale_passes.py). ``old_logprobs(model, batch, cfg, asked, ref_model) -> ThetaOld`` (stage 4);
    ``micro_batches(model, batch, rows, cfg, grad, asked)``, an iterable of ``MicroBatch`` (stage 6, DelTA's streamed
    passes); ``scoring_logprobs(model, input_ids, attention_mask, loss_mask, temperature) -> [B, T]`` (CSCR's scoring
    passes; None: cscr.py's own plain pass)."""

    old_logprobs: Callable
    micro_batches: Callable
    scoring_logprobs: Callable | None = None
