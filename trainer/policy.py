"""The policy model of grpo.py: loading it, wrapping it for training, and the pieces that live next to it.

* ``load_model_and_tokenizer``: ``from_pretrained`` of a registered name (``MODELS``: ``"toy"``, toy.py), a local
  folder or a hub id, in the dtype and on the device asked for; the tokenizer pads on the left;
* ``prepare_model``: the float32 LM head (``cast_lm_head_to_fp32``), gradient checkpointing and LoRA adapters (peft);
* ``reference_model``: the frozen initial policy for the k3 KL term (``--beta > 0``);
* ``build_optimizer``: AdamW; ``oom_guard``: out-of-memory errors as one line naming the flags that help;
  ``peak_memory`` (per step; the host-memory guards are memory_plan.py's ``check_host_memory``);
* ``token_logprobs`` and ``Passes``: the policy's log-probs (and LM-head inputs) of a batch's rows, micro-batch by
  micro-batch (laid out by ``micro_batches``; ``MicroBatch``), padding-free, with ``SharedPrompts`` (each group's
  prompt run once, ``--shared_prompt``), with or without grad: grpo.py's stages 4 and 6 and DelTA's streamed passes
  all run the model through it; ``reference_logprobs``: the KL reference's, on the same micro-batches; above
  ``LOGITS_CHUNK_BYTES`` of a micro-batch's logits, the LM head in chunks of positions (``ChunkedLMHead``, on the
  models ``lm_head`` accepts);
* ``exact_optimisations``: which default optimisations the model's features allow (``model_features``);
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
import inspect
import math
import os
from collections import namedtuple

import torch

from trainer import distributed, hub

# Named models an entry point adds (``register_model``): ``--model name`` loads the folder ``MODELS[name]()`` returns
# (toy.py's ``register`` adds ``toy``). A function, not a path: the folder may be built on first use.
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

    ``"toy"`` resolves to the toy model's folder (toy.py), then goes through exactly the same ``from_pretrained``
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
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # resets VmHWM, the peak resident set size, to the current one
        return True
    except OSError:
        return False


def peak_memory() -> dict:
    """Peak memory since ``reset_peak_memory``, in GB (10⁹ bytes): ``memory/peak_rss_gb`` (host, this process) and,
    on a GPU, ``memory/peak_gpu_allocated_gb`` (tensors) and ``memory/peak_gpu_reserved_gb`` (the allocator's)."""
    kib = proc_status_kib("VmHWM")
    if kib is None:
        import resource
        import sys

        kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // (1024 if sys.platform == "darwin" else 1)
    out = {"memory/peak_rss_gb": kib * 1024 / 1e9}
    if torch.cuda.is_available():
        out["memory/peak_gpu_allocated_gb"] = torch.cuda.max_memory_allocated() / 1e9
        out["memory/peak_gpu_reserved_gb"] = torch.cuda.max_memory_reserved() / 1e9
    return out


_ENTROPY_CHUNK = 256  # positions per float32 [chunk, V] temporary (148 MiB each at V = 151,936; a few live at once)


def entropy_from_logits(logits, temperature=1.0):
    """Policy entropy H = −Σ_j p_j log p_j, p = softmax(z/T) over the last dim (nats), without gradient
    (docs/specs/baselines.md §3).

    Source: FT paper Eq. 1; FT dp_actor L439–447.  Computed as logsumexp(z/T) − Σ_j softmax(z/T)_j·z_j/T, in float32
    (float64 for float64 logits) over ``_ENTROPY_CHUNK`` positions at a time, so the only full-size tensor is the
    given logits (a float32 copy of bf16 [16k, 151,936] logits would be 9.3 GiB).  Under no_grad: the mask that
    uses H is not differentiable.

    Args: logits z [..., V] (any float dtype, e.g. [B, T, V] of the training forward); temperature T > 0, the
    rollout temperature.  Returns H [...] (float32 or float64), in [0, log V].
    Raises ValueError: temperature <= 0, logits not a floating tensor with at least one dimension.
    """
    if not (isinstance(temperature, (int, float)) and temperature > 0):
        raise ValueError(f"policy.entropy_from_logits: temperature must be > 0, got {temperature!r}")
    if not torch.is_tensor(logits) or logits.dim() < 1 or not logits.is_floating_point():
        raise ValueError("policy.entropy_from_logits: logits must be a floating [..., V] tensor")
    dt = torch.promote_types(logits.dtype, torch.float32)
    x = logits.detach()
    # [R, T, V] without a copy for the usual [B, T, V] (a slice along T of the full logits included)
    rows = x.reshape(1, 1, -1) if x.dim() == 1 else x[None] if x.dim() == 2 else x.reshape(-1, *x.shape[-2:])
    out = torch.empty(rows.shape[:2], dtype=dt, device=logits.device)
    zero = torch.zeros((), dtype=dt, device=logits.device)
    with torch.no_grad():
        for r in range(rows.shape[0]):
            for a in range(0, rows.shape[1], _ENTROPY_CHUNK):
                z = rows[r, a : a + _ENTROPY_CHUNK].to(dt) / temperature
                p = torch.softmax(z, dim=-1)
                # H = logsumexp(z) − E_p[z]; p·z is taken as 0 where p = 0 (a −inf logit would give 0·inf = NaN)
                out[r, a : a + _ENTROPY_CHUNK] = torch.logsumexp(z, dim=-1) - torch.where(p > 0, p * z, zero).sum(-1)
    return out.reshape(logits.shape[:-1])


# Per-token statistics of the policy's distribution p = softmax(z/τ) at a response position, by name: what a credit
# function asks of θ_old's pass (its ``needs``; e.g. verl's Optimal Token Baseline reads Σ_v p_v²). Each maps
# u = z/τ ``[n, V]`` (float32, float64 for a float64 model; a chunk of positions) to ``[n]``, no grad. Computed in
# the LM head's pass, a chunk of positions at a time (no [T, V] logits kept: ``ChunkedLMHead``, ``position_stats``);
# θ_old's pass keeps each as ``[N, T]`` floats (N·T·4 bytes: 34 MB at 2,048 × 4,096; memory_plan.py counts them).
TOKEN_STATS = {
    "sum_sq_prob": lambda u: torch.softmax(u, dim=-1).square().sum(-1),  # Σ_v p_v² ∈ [1/V, 1]
}


def position_stats(logits, temperature: float, names) -> torch.Tensor:
    """``TOKEN_STATS`` ``names`` of logits z ``[B, T, V]`` at ``temperature``: ``[B, T, len(names)]`` (float32,
    float64 for float64 logits), no grad, ``_ENTROPY_CHUNK`` positions at a time (no full float32 copy)."""
    dt = torch.promote_types(logits.dtype, torch.float32)
    out = torch.empty(*logits.shape[:-1], len(names), dtype=dt, device=logits.device)
    with torch.no_grad():
        for r in range(logits.shape[0]):
            for a in range(0, logits.shape[1], _ENTROPY_CHUNK):
                u = logits[r, a : a + _ENTROPY_CHUNK].detach().to(dt) / temperature
                out[r, a : a + _ENTROPY_CHUNK] = torch.stack([TOKEN_STATS[name](u) for name in names], -1)
    return out


def clip_and_step(model, optimizer, loss: float, max_grad_norm: float, step: int) -> float | None:
    """Clip the accumulated gradient to ``max_grad_norm`` (0: no clipping) and apply the optimizer; returns the
    pre-clip norm, or None (the gradient discarded, with a warning) when the loss or the norm is not finite."""
    from tqdm import tqdm

    grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm or float("inf"))
    if hasattr(grad_norm, "full_tensor"):  # FSDP2: the global norm as a DTensor
        grad_norm = grad_norm.full_tensor()
    if not (math.isfinite(loss) and torch.isfinite(grad_norm)):  # both global: every process agrees
        optimizer.zero_grad(set_to_none=True)  # a non-finite loss or gradient never reaches the weights
        tqdm.write(f"[warn] step {step + 1}: non-finite loss or gradient norm, update skipped")
        return None
    optimizer.step()
    return grad_norm.item()


# ----------------------------------------------------------------------------------------------------------
# Log-probs of rows of a rollout batch: one forward per micro-batch, laid out as the run's flags say
# ----------------------------------------------------------------------------------------------------------
# The LM head in chunks of positions: a micro-batch whose b·T response positions hold more than this many bytes of
# float32 logits (b·T·V·4) goes through the head LOGITS_CHUNK_BYTES // (V·4) positions at a time (441 at Qwen3's
# V = 151,936), never holding its [b, T, V] logits (12.4 GB for one 20,480-token row); one that fits runs the
# model's own head over all its positions at once, as before. Tests set it smaller to force several chunks.
LOGITS_CHUNK_BYTES = 256 * 2**20


def token_logprobs(model, input_ids, attention_mask, response_mask, temperature=1.0, shared=None, chunk_bytes=None):
    """log π(y_t | x, y_<t) (nats) of the response tokens under logits / temperature: ``[B, T]``, 0 on padding.

    ``input_ids``/``attention_mask`` ``[B, P + T]``: left-padded prompt, right-padded response in the last T
    positions; position ids count real tokens only, so padding changes nothing. Only the T + 1 last positions are
    projected to the vocabulary, and log p(y) = z_y − logsumexp(z) row by row in float32 (float64 for a float64
    model; no [B, T, V] softmax). When the micro-batch's float32 logits B·T·V·4 exceed ``chunk_bytes`` (None:
    ``LOGITS_CHUNK_BYTES``; 0: never), the head runs in chunks of positions instead (``ChunkedLMHead``: the same
    values; the backward recomputes each chunk), inside the model's forward (FSDP2 gathers the head there), on the
    models ``lm_head`` accepts; the others take the whole micro-batch at once. ``shared``: ``(SharedPrompts, the
    rows' indices)``: the prompts already ran once per group (same result). More of the same forward (h_t, the
    entropy, per-token statistics, the logits): ``token_outputs``.
    """
    return token_outputs(
        model, input_ids, attention_mask, response_mask, temperature, Asked(), shared, chunk_bytes
    ).logp


# What a forward returns beside log p, each only when asked for (``Asked``'s fields, in order): ``hidden``, the LM
# head's input h_t ``[B, T, H]`` (the body's output, the final norm's, detached) at the positions that predict the
# response tokens, which DelTA's proxy needs (App. F); ``entropy``, the policy's entropy H_t = −Σ_j p_j log p_j
# (nats) ``[B, T]`` of softmax(z/T) (Forking Tokens' score, docs/specs/baselines.md §3), no grad; ``token_stats``,
# names of ``TOKEN_STATS`` (e.g. Σ_v p_v²), each ``[B, T]`` of softmax(z/T), no grad; ``logits``, z ``[B, T, V]``
# (before the temperature; a view, no copy; the whole micro-batch at once), for full-vocabulary quantities
# (cscr_diagnostics.py's D4c and top-1 probability).
Asked = namedtuple("Asked", "hidden entropy token_stats logits", defaults=(False, False, (), False))

# What ``token_outputs`` returns: log p ``[B, T]``, h ``[B, T, H]``, H ``[B, T]``, {name: ``[B, T]``}, z ``[B, T, V]``
# (each None unless asked for, log p always)
TokenOutputs = namedtuple("TokenOutputs", "logp hidden entropy token_stats logits")


def token_outputs(
    model, input_ids, attention_mask, response_mask, temperature=1.0, asked=Asked(), shared=None, chunk_bytes=None
) -> TokenOutputs:
    """``token_logprobs``' log p and what ``asked`` (an ``Asked``) names, from the same forward: a ``TokenOutputs``
    (the fields not asked for None). What ``Passes`` reads."""
    B, T = response_mask.shape
    targets = input_ids[:, -T:]  # y_1..y_T [B, T]
    head = _chunked_head(model, B * T, asked, chunk_bytes)  # None: the model's own head, every position at once
    with _body_outputs(model, head, targets, temperature, asked) as captured:
        out = _forward(model, input_ids, attention_mask, T, shared, head)
    if head is not None:
        _, (logp, entropy, extra) = out  # [B·T] each (extra [B·T, S]): ChunkedLMHead's
        logits = None
    else:
        logits = out.logits[:, -(T + 1) : -1]  # position p predicts token p+1: [B, T, V]
        logp, entropy, extra = _from_logits(logits, targets, temperature, asked)
    mask = response_mask.to(logp.dtype)
    extra = extra.view(B, T, -1) if extra is not None else None
    return TokenOutputs(
        logp.view(B, T) * mask,
        captured["h"] if asked.hidden else None,
        entropy.view(B, T) * mask if asked.entropy else None,
        {name: extra[..., k] * mask for k, name in enumerate(asked.token_stats)} if asked.token_stats else None,
        logits if asked.logits else None,
    )


ChunkedHead = namedtuple("ChunkedHead", "lm_head chunk")  # an ``LMHead`` and its chunk (positions)


def _chunked_head(model, positions: int, asked: Asked, chunk_bytes) -> ChunkedHead | None:
    """How ``token_outputs`` runs the LM head over ``positions`` = B·T positions: in chunks (a ``ChunkedHead``) when
    their float32 logits (positions·V·4 bytes) exceed ``chunk_bytes`` (None: ``LOGITS_CHUNK_BYTES``; 0: never) and
    ``lm_head`` accepts the model, else None (the model's own head; also when the logits are asked for)."""
    budget = LOGITS_CHUNK_BYTES if chunk_bytes is None else chunk_bytes
    out_head = getattr(model, "get_output_embeddings", lambda: None)()
    if not budget or asked.logits or out_head is None:
        return None
    position_bytes = out_head.weight.shape[0] * 4  # one position's float32 logits: V·4
    if positions * position_bytes <= budget:
        return None
    head = lm_head(model)
    return None if isinstance(head, str) else ChunkedHead(head, max(1, budget // position_bytes))


@contextlib.contextmanager
def _body_outputs(model, head: ChunkedHead | None, targets, temperature: float, asked: Asked):
    """Hooks on the model for one forward, removed after it; yields the dict they fill: ``"h"``, the body's output
    at the positions that predict y_1..y_T (``targets`` ``[B, T]``) ``[B, T, H]`` (detached; when ``asked.hidden``),
    and, with a chunked ``head``, ``ChunkedLMHead``'s (log p, H, statistics) of h at the temperature, computed inside
    the model's forward (under FSDP2: the head's weight gathered), which the model then returns beside its own
    output."""
    T = targets.shape[1]
    captured = {}
    hooks = []

    def from_body(module, args, output):
        h = output[0][:, -(T + 1) : -1]  # [B, T, H]: the final norm's output at the positions predicting y_1..y_T
        captured["h"] = h.detach()
        if head is not None:
            captured["head"] = ChunkedLMHead.apply(
                h.reshape(-1, h.shape[-1]),
                head.lm_head.head.weight,
                targets.reshape(-1),
                temperature,
                head.lm_head.softcap,
                head.chunk,
                asked.entropy,
                tuple(asked.token_stats),
            )

    if asked.hidden or head is not None:
        hooks.append((head.lm_head.body if head is not None else _body(model)).register_forward_hook(from_body))
    if head is not None:  # the model returns (its output, (log p, H)), also to the hooks after this one: FSDP2's
        # post-forward, which on what the model returns registers the head weight's re-gathering for the backward
        hooks.append(_base(model).register_forward_hook(lambda m, a, out: (out, captured.pop("head")), prepend=True))
    try:
        yield captured
    finally:
        for hook in hooks:
            hook.remove()


def _forward(model, input_ids, attention_mask, T: int, shared, head: ChunkedHead | None):
    """The model's forward over the last T + 1 positions' logits (one, with a chunked ``head``: its own head's
    output is unused). Left padding shifts every prompt: positions count real tokens only, as generate() does.
    ``shared``: (``SharedPrompts``, rows): all but the last prompt token are cached; the last T + 1 positions run."""
    keep = 1 if head is not None else T + 1  # chunked: the model's own head sees one position
    if shared is not None:  # --shared_prompt
        return shared[0].forward(
            model, shared[1], input_ids[:, -(T + 1) :], attention_mask[:, -(T + 1) :], logits_to_keep=keep
        )
    position_ids = (attention_mask.long().cumsum(-1) - 1).clamp(min=0)
    return model(
        input_ids=input_ids,
        attention_mask=attention_mask,
        position_ids=position_ids,
        use_cache=False,
        logits_to_keep=keep,
    )


def _from_logits(logits, targets, temperature: float, asked: Asked) -> tuple:
    """(log p ``[B, T]``, H ``[B, T]`` or None, the statistics ``[B, T, S]`` or None) of the logits z ``[B, T, V]`` at
    y ``targets`` ``[B, T]``, of softmax(z/T), in float32 (float64 for a float64 model)."""
    dt = torch.promote_types(logits.dtype, torch.float32)
    # log p one row at a time keeps the float32 copy small (V can be 152k); H and the statistics take a few positions
    # at a time, no [T, V] copy
    logp = torch.stack([_log_softmax_at(logits[i].to(dt) / temperature, targets[i])[0] for i in range(len(logits))])
    entropy = entropy_from_logits(logits, temperature) if asked.entropy else None
    extra = position_stats(logits, temperature, asked.token_stats) if asked.token_stats else None
    return logp, entropy, extra


def _log_softmax_at(u, targets):
    """(log softmax(u)_y ``[n]``, logsumexp(u) ``[n]``) of logits ``u`` ``[n, V]`` (already divided by the
    temperature) at the token ids ``targets`` ``[n]``: log p(y) = u_y − logsumexp(u)."""
    picked = u.gather(-1, targets[:, None]).squeeze(-1)  # before logsumexp: the backward's order and peak as before
    lse = torch.logsumexp(u, -1)
    return picked - lse, lse


def _base(model):
    """The transformers model under a peft wrapper (the module FSDP2 shards last, as the root: distributed.py)."""
    return model.get_base_model() if hasattr(model, "get_base_model") else model


def _body(model):
    """The model's body: the module whose output (the final norm's) is the LM head's input."""
    return _base(model).get_decoder()


LMHead = namedtuple("LMHead", "body head softcap")
_HEAD_CHECKS = {}  # (model class, head dtype, config JSON) -> None (logits = softcap(h·Wᵀ)) or why not: lm_head's


def lm_head(model):
    """What ``ChunkedLMHead`` needs of ``model``: ``LMHead(body, head, softcap)`` (the body, whose output h is the
    head's input; the head, a bias-free ``nn.Linear`` W ``[V, H]``; Gemma's ``final_logit_softcapping``, or None),
    or a string saying why its logits cannot be computed that way (then ``token_logprobs`` takes a micro-batch's
    logits at once). Checked by one no-grad, eval-mode forward of 3 tokens, once per model class, head dtype and
    config (every value of it: Granite's ``logits_scaling``, Cohere's ``logit_scale``, Gemma's
    ``final_logit_softcapping`` and whatever else scales, caps or biases a model's logits; a LoRA or a bias on the
    head is refused before): the model's own logits must equal softcap(h·Wᵀ) bit for bit (the same operations on
    the same shapes), so any other post-processing (Cohere's logit scale, Granite's divisor, a remote model's own
    code) turns chunking off. Under FSDP2 every process must make that first call together
    (``exact_optimisations`` does, when the run starts)."""
    head = getattr(model, "get_output_embeddings", lambda: None)()
    if type(head) is not torch.nn.Linear or head.bias is not None:
        kind = type(head).__name__ + (" with a bias" if type(head) is torch.nn.Linear else "")
        return f"the LM head is a {kind}, not a bias-free nn.Linear"
    config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    softcap = getattr(config, "final_logit_softcapping", None)
    base = _base(model)
    key = (type(base), head.weight.dtype, model.config.to_json_string(use_diff=False))
    if key not in _HEAD_CHECKS:
        seen, was = {}, model.training

        def apply_head(module, args, output):  # the head as ChunkedLMHead applies it, inside the forward
            seen["ours"] = _scaled_logits(output[0][:, -2:], head.weight, softcap, None)

        handle = _body(model).register_forward_hook(apply_head)
        try:
            model.eval()
            with torch.no_grad():
                ids = torch.arange(3, device=head.weight.device)[None] % head.weight.shape[0]
                theirs = model(input_ids=ids, logits_to_keep=2, use_cache=False).logits
        finally:
            handle.remove()
            model.train(was)
        _HEAD_CHECKS[key] = (
            None
            if torch.equal(seen["ours"], theirs)
            else f"{type(base).__name__}'s logits are not its LM head's output{' soft-capped' if softcap else ''}"
        )
    return _HEAD_CHECKS[key] or LMHead(_body(model), head, softcap)


def _scaled_logits(h, weight, softcap, temperature):
    """z/τ in float32 (float64 for a float64 model) of the LM head's inputs ``h`` ``[n, H]`` (or ``[b, n, H]``):
    z = h·Wᵀ (in W's dtype), soft-capped as Gemma's forward does (z/c, tanh, ·c; ``softcap`` None: not), each step
    on a new tensor in place; ``temperature`` None: z itself, in W's dtype."""
    z = torch.nn.functional.linear(h.to(weight.dtype), weight)  # (--cast_lm_head_to_fp32: bf16 h, float32 W)
    if softcap is not None:
        z = z.div_(softcap).tanh_().mul_(softcap)
    return z if temperature is None else z.to(torch.promote_types(z.dtype, torch.float32)).div_(temperature)


class ChunkedLMHead(torch.autograd.Function):
    """log π(y) and the entropy of softmax(z/τ), z = softcap(h·Wᵀ), ``chunk`` positions at a time: no [n, V] logits

    ``apply(h, weight, targets, temperature, softcap, chunk, entropy, stats=())``: the LM head's inputs h ``[n, H]``
    (one micro-batch's response positions, rows after rows; cast to W's dtype a chunk at a time: a bf16 h under
    ``--cast_lm_head_to_fp32``'s float32 W), W ``[V, H]``, the token ids y ``[n]``; returns log p(y) ``[n]``,
    H ``[n]`` (no grad; None unless ``entropy``) and the ``TOKEN_STATS`` ``stats`` ``[n, len(stats)]`` (no grad;
    None without), float32 (float64 for a float64 head), equal to the
    whole micro-batch's computation up to the order of the matmul's sums (the float64 tests: 1e-10). Kept for the
    backward: h (b·T·H·c bytes, 168 MB for one 20,480-token row of Qwen3-8B in bf16) and logsumexp(z/τ) (b·T·4).
    The backward recomputes each chunk's z and takes ∂log p(y)/∂(z/τ) = onehot(y) − softmax(z/τ) in place (times
    1 − tanh²(·) under soft-capping), then dh = dz·W and dW += dzᵀ·h: one chunk of float32 logits at a time, and
    one W-sized gradient, summed in float32 (float64 for a float64 model) and cast to W's dtype once, after the
    last chunk, as TRL's chunked log-probs and Liger-Kernel's float32 ``accum_dtype`` do: for bfloat16 weights
    dzᵀ·h is a float32 matmul and the sum holds a float32 buffer V·H·4 (2.5 GB at Qwen3-8B), whose one rounding
    at the end leaves dW as close to the exact sum as the model's own head's (a running bf16 sum rounded once per
    chunk: 3.3× its error over one 20,480-token row's 47 chunks; tests/test_chunked_head.py); for float32 and
    float64 weights the sum is W's gradient itself, the same operations as before, and differs from the whole
    micro-batch's matmul only in the order of its sums. Why our own: verl's FusedLinearForPPO and Liger-Kernel's
    fused linear losses do this inside their trainers or on GPUs only; this is the same idea in plain torch, exact
    on the CPU too. Under FSDP2 token_logprobs returns its outputs as the root module's, so that FSDP2 gathers W
    again before this backward reads it (the root frees it after its forward).
    """

    @staticmethod
    def forward(ctx, h, weight, targets, temperature, softcap, chunk, entropy, stats=()):
        lse = torch.empty(len(h), dtype=torch.promote_types(weight.dtype, torch.float32), device=h.device)
        logp, ent = torch.empty_like(lse), torch.empty_like(lse) if entropy else None
        extra = lse.new_empty(len(h), len(stats)) if stats else None
        for a in range(0, len(h), chunk):
            u = _scaled_logits(h[a : a + chunk], weight, softcap, temperature)  # [c, V]
            logp[a : a + chunk], lse[a : a + chunk] = _log_softmax_at(u, targets[a : a + chunk])
            if entropy:
                ent[a : a + chunk] = entropy_from_logits(u)  # u is z/τ already: temperature 1
            if stats:
                extra[a : a + chunk] = torch.stack([TOKEN_STATS[name](u) for name in stats], -1)
            del u  # before the next chunk's: one chunk of logits at a time
        ctx.save_for_backward(h, weight, targets, lse)
        ctx.temperature, ctx.softcap, ctx.chunk = temperature, softcap, chunk
        ctx.mark_non_differentiable(*[t for t in (ent, extra) if t is not None])
        return logp, ent, extra

    @staticmethod
    def backward(ctx, grad, *_):
        h, weight, targets, lse = ctx.saved_tensors
        dh = torch.empty_like(h) if ctx.needs_input_grad[0] else None
        sum_dtype = torch.promote_types(weight.dtype, torch.float32)  # dW summed over chunks in float32 at least
        dw = torch.zeros_like(weight, dtype=sum_dtype) if ctx.needs_input_grad[1] else None
        for a in range(0, len(h), ctx.chunk):
            s = slice(a, a + ctx.chunk)
            x = torch.nn.functional.linear(h[s].to(weight.dtype), weight)  # h·Wᵀ [c, V]
            t = None if ctx.softcap is None else x.div_(ctx.softcap).tanh_()  # z = c·tanh(x/c): t = tanh(x/c)
            u = (x if t is None else t * ctx.softcap).to(lse.dtype).div_(ctx.temperature)  # z/τ, as the forward
            del x  # (bfloat16: its float32 copy u is all the chunk needs from here)
            g = grad[s, None] / ctx.temperature  # ∂/∂z of g·log p(y) = (g/τ)·(onehot(y) − softmax(z/τ))
            dz = u.sub_(lse[s, None]).exp_().mul_(-g).scatter_add_(-1, targets[s, None], g)
            if t is not None:  # ∂z/∂x = 1 − tanh²(x/c)
                dz.mul_(t.square_().neg_().add_(1))
            if dh is not None:
                dh[s] = dz.to(weight.dtype) @ weight
            if dw is not None:  # float32 and float64: dz and h[s] themselves, no copies
                dw.addmm_(dz.T, h[s].to(sum_dtype))
            del u, dz  # before the next chunk's
        return dh, None if dw is None else dw.to(weight.dtype), None, None, None, None, None, None


from trainer.grpo_config import PADDING_FREE_BUCKETS  # noqa: E402  (grpo_config.py: --micro_batch_size 0 help)


def micro_batches(
    rows: torch.Tensor,
    attention_mask: torch.Tensor,
    size: int = 0,
    response_len: int | None = None,
    padding_free: bool = True,
) -> list[tuple[torch.Tensor, slice, int]]:
    """The micro-batches of the rollout rows ``rows`` as ``(row indices, input columns, response columns T_j)``: the
    layout of ``Passes``, planned once per batch and shared by its passes (``reference_logprobs`` reads it too).

    A rollout batch is laid out ``[left-padded prompt | right-padded response]`` (``attention_mask`` ``[N, P + T]``,
    ``response_len`` = T). Plain: ``size`` rows at a time (0: all of them), every one ``P + T`` columns wide.
    ``padding_free``: the rows are sorted by length first, so that each micro-batch holds rows of similar length,
    and each is cut to its own longest prompt and response: ``input_ids[j][:, cols]``, and ``[j, :T_j]`` of any
    ``[N, T]`` tensor. With ``size`` 0 the rows are split into ``PADDING_FREE_BUCKETS`` such micro-batches. Padding
    never changes a token's log-prob (position ids count real tokens), so the loss is the same to rounding.
    """
    T = attention_mask.shape[1] if response_len is None else response_len
    if not padding_free:
        return [(j, slice(None), T) for j in rows.split(size or len(rows))]
    P = attention_mask.shape[1] - T
    mask = attention_mask[rows.to(attention_mask.device)].cpu()
    order = rows[torch.argsort(mask.sum(1), stable=True)]
    parts = order.split(size) if size else order.tensor_split(min(PADDING_FREE_BUCKETS, len(order)))
    out = []
    for j in parts:
        m = attention_mask[j.to(attention_mask.device)]
        p = int(m[:, :P].sum(1).max())  # the longest prompt of the micro-batch
        t = int(m[:, P:].sum(1).max().clamp(min=1))  # and its longest response
        out.append((j, slice(P - p, P + t), t))
    return out


class MicroBatch(namedtuple("MicroBatch", "rows cols t logp hidden entropy token_stats", defaults=(None, None))):
    """One forward of ``Passes``: the rollout rows ``rows`` ``[b]``, their input columns ``cols`` and response width
    ``t`` (T_j ≤ T); ``logp`` ``[b, T_j]`` (a graph under grad); ``hidden`` ``[b, T_j, H]`` (the LM head's input)
    or None; ``entropy`` ``[b, T_j]`` (nats, no grad) or None; ``token_stats`` {name: ``[b, T_j]``} (no grad) or
    None."""

    def take(self, x: torch.Tensor) -> torch.Tensor:
        """This micro-batch's part of a batch-wide ``[N, T, ...]`` tensor: rows ``rows``, the first ``t`` columns."""
        return x[self.rows, : self.t]


class Passes:
    """Forward passes of ``model`` over the rows ``rows`` of a rollout batch, one micro-batch at a time: the one
    interface through which grpo.py runs its policy (θ_old's pass, DelTA's streamed passes, the update).

    Iterating yields ``MicroBatch``es laid out as the flags say: ``--micro_batch_size`` rows each (0: all),
    ``--padding_free`` (rows of similar length, each micro-batch cut to its own longest prompt and response; its
    ``take`` picks its part of any ``[N, T]`` tensor), ``--shared_prompt`` (each distinct prompt run once, its keys
    and values read by its responses). ``grad``: train mode with gradient; call ``backward_prompts`` once after the
    micro-batches' backward passes (it sends the prompt pass its share). Else eval mode, no gradient. ``asked``: what
    else each forward returns (an ``Asked``: the LM head's inputs h_t, the entropy, ``TOKEN_STATS``; no logits).
    ``keep_graphs``: the micro-batches are kept and a second iteration yields them again without running the model
    (stage 4's training forward, reused by stage 6's only update).
    ``batch``: a ``rollout.Rollout`` (``input_ids``/``attention_mask`` ``[N, P + T]``, ``response_mask`` ``[N, T]``,
    on any device: each micro-batch goes to the model's).
    """

    def __init__(self, model, batch, rows, cfg, *, grad: bool, keep_graphs=False, asked=Asked()):
        self.model = model
        self.batch = batch
        self.rows = rows
        self.cfg = cfg
        self.grad = grad
        self.keep_graphs = keep_graphs
        self.asked = asked
        self.kept = None
        self.shared = None
        # the micro-batches as (rows, input columns, response width T_j), planned once for every pass
        self.layout = micro_batches(
            rows, batch.attention_mask, cfg.micro_batch_size, batch.response_mask.shape[1], cfg.padding_free
        )

    def __iter__(self):
        if self.kept is not None:
            yield from self.kept
            return
        kept = []
        b = self.batch
        device = next(self.model.parameters()).device
        self.model.train(self.grad)
        for j, cols, t in self.layout:
            with torch.set_grad_enabled(self.grad):  # not around the yield: the caller's code keeps its own mode
                if self.shared is None and self.cfg.shared_prompt:
                    self.shared = SharedPrompts(
                        self.model, b.input_ids, b.attention_mask, self.rows, b.response_mask.shape[1]
                    )
                shared = (self.shared, j) if self.cfg.shared_prompt else None
                inputs = micro_batch_inputs(b, j, cols, t, device)
                out = token_outputs(self.model, *inputs, self.cfg.temperature, self.asked, shared)
            mb = MicroBatch(j, cols, t, out.logp, out.hidden, out.entropy, out.token_stats)
            if self.keep_graphs:  # the graph, not h: stage 4's kept h_t live on the host (grpo.old_logprobs)
                kept.append(mb._replace(hidden=None))
            yield mb
        self.kept = kept if self.keep_graphs else None

    def backward_prompts(self) -> None:
        """After the last micro-batch's backward: the shared prompt pass's share of the gradient (no-op without)."""
        if self.shared is not None:
            self.shared.backward()


def reference_logprobs(ref_model, batch, layout, temperature: float) -> torch.Tensor:
    """log π_ref of the response tokens ``[N, T]`` (0 on padding), no grad, micro-batch by micro-batch in
    ``layout`` (a ``Passes``'s), on the reference's own device (``--ref_on_cpu``): the k3 KL term's (``--beta``)."""
    N, T = batch.response_mask.shape
    device = next(ref_model.parameters()).device
    ref = torch.zeros(N, T, dtype=torch.promote_types(next(ref_model.parameters()).dtype, torch.float32))
    with torch.no_grad():
        for j, cols, t in layout:
            ref[j, :t] = token_logprobs(ref_model, *micro_batch_inputs(batch, j, cols, t, device), temperature).cpu()
    return ref


def micro_batch_inputs(batch, rows, cols, t, device) -> tuple:
    """One micro-batch of a layout (``micro_batches``) as ``token_logprobs`` takes it, on ``device``:
    ``input_ids``, ``attention_mask`` ``[b, len(cols)]`` (rows ``rows``, input columns ``cols``), ``response_mask``
    ``[b, t]``."""
    return (
        batch.input_ids[rows][:, cols].to(device),
        batch.attention_mask[rows][:, cols].to(device),
        batch.response_mask[rows, :t].to(device),
    )


class SharedPrompts:
    """Each distinct prompt of a batch run through the model once, its keys and values then read by all the
    responses to it (the G of its group), instead of once per response: the update's forward and backward skip
    (G − 1)/G of the prompt tokens. The log-probs and the gradient are those of the full forward to rounding
    (tested to 1e-6 relative in float64, where HF's RMSNorm still rounds to float32); ``--shared_prompt``
    (``shared_prompts``), used by grpo.py's stages 4 and 6.

    Built from the rows ``rows`` of a rollout batch (``input_ids``/``attention_mask`` ``[N, P + T]``, left-padded
    prompts, ``response_len`` T): a forward of the distinct prompts without their last token, keeping its cache.
    ``forward`` then runs the last prompt token and the response of any of those rows on top of it. Under grad the
    prompt pass is a separate graph: each micro-batch's backward leaves the gradient of the keys and values it read
    on detached copies, and ``backward`` sends their sum through the prompt pass once, after the last micro-batch.
    Memory: the prompt pass's activations (distinct prompts × prompt tokens) stay until ``backward``.
    """

    def __init__(self, model, input_ids, attention_mask, rows, response_len: int):
        from transformers import DynamicCache

        self.cache_class = DynamicCache
        self.config = model.config
        P = input_ids.shape[1] - response_len
        prompts = torch.cat([input_ids[rows, :P], attention_mask[rows, :P]], 1)
        distinct, which = torch.unique(prompts, dim=0, return_inverse=True)  # a group's rows share one prompt
        distinct = distinct.to(next(model.parameters()).device)
        p = int(distinct[:, P:].sum(1).max())  # the longest prompt; all but its last token go into the cache
        ids = distinct[:, P - p : P - 1]
        self.mask = distinct[:, 2 * P - p : 2 * P - 1]
        self.kv = []  # keys, values of layer 0, 1, ... (none for one-token prompts)
        if p > 1:
            out = model(
                input_ids=ids,
                attention_mask=self.mask,
                use_cache=True,
                logits_to_keep=1,
                position_ids=(self.mask.cumsum(-1) - 1).clamp(min=0),
            )
            self.kv = [t for layer in out.past_key_values.layers for t in (layer.keys, layer.values)]
        self.read = [t.detach().requires_grad_(t.requires_grad) for t in self.kv]  # what the responses read
        self.index = torch.full((input_ids.shape[0],), -1, dtype=torch.long)
        self.index[rows.cpu()] = which.cpu()

    def forward(self, model, rows, input_ids, attention_mask, **kwargs):
        """``model``'s output for the rows ``rows`` given the positions after the cached prompt: ``input_ids`` and
        ``attention_mask`` ``[len(rows), 1 + T']`` (the last prompt token, then the response)."""
        u = self.index[rows.cpu()].to(self.mask.device)
        read = [t[u] for t in self.read]  # each row reads its own prompt's keys and values
        cache = self.cache_class(ddp_cache_data=list(zip(read[0::2], read[1::2])), config=self.config)
        mask = torch.cat([self.mask[u], attention_mask], 1)
        position_ids = (mask.cumsum(-1) - 1).clamp(min=0)[:, -input_ids.shape[1] :]
        return model(
            input_ids=input_ids,
            attention_mask=mask,
            position_ids=position_ids,
            past_key_values=cache,
            use_cache=True,
            **kwargs,
        )

    def backward(self):
        """The prompt pass's share of the gradient: the keys' and values' gradients, summed over every response
        that read them, sent through the prompt pass (once, after the micro-batches' backward passes)."""
        pairs = [(t, r.grad) for t, r in zip(self.kv, self.read) if r.grad is not None]
        if pairs:
            torch.autograd.backward([t for t, _ in pairs], [g for _, g in pairs])


# ----------------------------------------------------------------------------------------------------------
# Which default optimisations are exact on this model: checked once, when it loads
# ----------------------------------------------------------------------------------------------------------
# Each default optimisation gives the plain padded update (the same old log-probs, λ̄, token advantages, loss and
# gradient, tested in float64 on several architectures: tests/test_architectures.py) only where the model has the
# features it relies on. Where one is missing the optimisation turns itself off, with one logged line naming it.
OPTIMISATIONS = {
    # micro-batches of similar length, each cut to its own longest row: padding must change nothing
    "padding_free": ("attention by distance", "position ids", "train = eval"),
    # each distinct prompt run once, its keys and values read from a cache by its G responses
    "shared_prompt": ("full attention", "position ids", "train = eval", "one process", "no gradient checkpointing"),
    # θ_old's log-probs (and DelTA's h_t, CSCR's ℓ0) taken from the training forward: it must be the eval forward
    "fuse_old_logprobs": ("train = eval",),
}


def model_features(model, cfg) -> dict:
    """The features ``OPTIMISATIONS`` rely on: {feature: None where ``model`` (and the run) has it, else why not}.

    * full attention: every layer attends to the whole prefix through a key/value cache. A sliding-window layer
      (Mistral, Gemma-2/3, gpt-oss, Qwen3 with ``use_sliding_window``) keeps only the window's tokens in its
      cache; linear-attention or state-space layers keep no keys and values.
    * attention by distance: every layer is full or sliding-window attention, whose masks depend on the distance
      between two tokens only, so left padding (contiguous, before the first real token) changes nothing; not
      chunked attention (Llama 4: absolute chunk boundaries) or recurrent layers.
    * position ids: ``forward`` takes them, so a left-padded row gets positions counted from its first real token
      (padding then changes nothing; tests/test_bug_cases.py C24).
    * train = eval: no dropout (an ``nn.Dropout`` with p > 0, e.g. LoRA's, or the config's attention dropout) and
      no router jitter noise (Mixtral-style MoE): a training-mode forward then equals the eval-mode one (the
      dropout masks of a padded and a padding-free layout also differ).
    * one process: FSDP2's per-layer gathers follow a layer's outputs, not cached keys and values read later.
    * no gradient checkpointing: it replays forwards, and HF turns the cache off under it.
    """
    config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    types = list(getattr(config, "layer_types", None) or [])
    window = getattr(config, "sliding_window", None) if getattr(config, "use_sliding_window", True) else None
    other = sorted(set(types) - {"full_attention"}) if types else (["sliding_attention"] if window else [])
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    jitter = getattr(config, "router_jitter_noise", 0.0) or 0.0

    def layers(kinds):
        if not kinds:
            return None
        return f"{config.model_type} has {', '.join(kinds)} layers" + (
            f" (window {window} tokens)" if "sliding_attention" in kinds and window else ""
        )

    return {
        "full attention": layers(other),
        "attention by distance": layers([kind for kind in other if kind != "sliding_attention"]),
        "position ids": None
        if "position_ids" in inspect.signature(base.forward).parameters
        else f"{type(base).__name__}.forward takes no position_ids",
        "train = eval": "the model has dropout"
        if has_dropout(model)
        else f"router jitter noise {jitter}"
        if jitter > 0
        else None,
        "one process": "torchrun" if distributed.is_distributed() else None,
        "no gradient checkpointing": "--gradient_checkpointing" if cfg.gradient_checkpointing else None,
    }


def exact_optimisations(model, cfg, say=print) -> dict:
    """Turn off each default optimisation of ``OPTIMISATIONS`` (a flag of ``cfg``) that ``model`` lacks a feature
    for, with one logged line each; returns {flag: "on" | "off: <reason>"} for config.json, and the same for
    ``chunked_lm_head`` (``lm_head``'s check, made here once, by every process together under torchrun: a model whose
    logits are not its head's output takes each micro-batch's logits at once, with one logged line)."""
    missing, out = model_features(model, cfg), {}
    for flag, needs in OPTIMISATIONS.items():
        reasons = [f"{feature}: {missing[feature]}" for feature in needs if missing[feature]]
        if getattr(cfg, flag) and reasons:
            setattr(cfg, flag, False)
            say(f"[exact] --{flag} off: it needs {'; '.join(reasons)}")
        out[flag] = "on" if getattr(cfg, flag) else f"off: {'; '.join(reasons) or 'the flag'}"
    head = lm_head(model)  # the LM head in chunks of positions (token_logprobs): no flag, on where it is exact
    if isinstance(head, str):
        say(f"[exact] the LM head runs on a micro-batch's logits at once (not in chunks of positions): {head}")
    out["chunked_lm_head"] = f"off: {head}" if isinstance(head, str) else "on"
    return out


def has_dropout(model) -> bool:
    """Whether a training-mode forward of ``model`` differs from an eval-mode one: an ``nn.Dropout`` with p > 0
    (e.g. LoRA's) or attention dropout in the config (applied inside the attention kernel)."""
    p_attn = getattr(getattr(model, "config", None), "attention_dropout", 0.0) or 0.0
    return p_attn > 0 or any(isinstance(m, torch.nn.Dropout) and m.p > 0 for m in model.modules())


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


# θ_old, as grpo.py's stage 4 leaves it for stages 5 and 6, float32 on the host (N responses × T tokens, hidden size
# H; at the papers' scale 2,048 × 4,096, H = 4,096): logp N·T·4 bytes (34 MB); ref_logp (--beta > 0, else None)
# N·T·4 (34 MB); hidden (DelTA's --delta_impl normal, else None) N·T·H·4 (137 GB), bounded: preflight.check refuses
# a run whose cache (and v beside it) would pass its share of the host's memory (memory_plan.check_delta_cache,
# HOST_MEMORY_SHARE), once, before any weights load; the paper's recipe streams h instead (--delta_impl
# memory_efficient: None here); update_passes: the training forward, which stage 6 reuses
# (memory_plan.updates_on_policy; graphs on the device), or None; token_stats: the per-token statistics a credit
# function asked for by name ({name: [N, T]}, N·T·4 bytes each; ``TOKEN_STATS``).
ThetaOld = namedtuple("ThetaOld", "logp hidden ref_logp update_passes token_stats", defaults=(None,))


def old_logprobs(model, batch, cfg, need_hidden=False, ref_model=None, training_forward=False, token_stats=()):
    """θ_old's log-probs ``[N, T]`` from a no-grad, eval-mode pass over the batch (``Passes``); the LM-head inputs
    ``[N, T, H]`` from the same pass when ``need_hidden`` (bounded: the comment above ThetaOld); the ``TOKEN_STATS``
    ``token_stats`` (names) ``[N, T]`` each, from the same pass; the reference's log-probs when ``ref_model`` is
    given. ``training_forward``: the training forward instead (train mode, with grad, TRL's choice when μ = 1), kept
    for the update to reuse. Returns a ``ThetaOld``. Every process runs as many micro-batches (FSDP's gathers). Each
    micro-batch is ``token_outputs`` of its rows; --no-padding_free --no-shared_prompt make it the plain forward of the
    padded rows, and the defaults give the same numbers (float64, 1e-10 relative: tests/test_credit_e2e.py)."""
    N, T = batch.response_mask.shape
    dt = torch.promote_types(next(model.parameters()).dtype, torch.float32)  # float32 (float64 for a float64 model)
    logp = torch.zeros(N, T, dtype=dt)
    hidden = None  # [N, T, H] once the first micro-batch says H
    stats = {name: torch.zeros(N, T, dtype=dt) for name in token_stats}
    asked = Asked(hidden=need_hidden, token_stats=token_stats)  # what the credit reads of this pass
    passes = Passes(
        model, batch, torch.arange(N), cfg, grad=training_forward, keep_graphs=training_forward, asked=asked
    )
    for mb in passes:
        logp[mb.rows, : mb.t] = mb.logp.detach().cpu()
        for name in token_stats:
            stats[name][mb.rows, : mb.t] = mb.token_stats[name].to(dt).cpu()
        if need_hidden:  # h_t on the host, bounded (the comment above ThetaOld)
            if hidden is None:
                hidden = torch.zeros(N, T, mb.hidden.shape[-1], dtype=dt)
            hidden[mb.rows, : mb.t] = mb.hidden.to(dt).cpu()
    ref_logp = reference_logprobs(ref_model, batch, passes.layout, cfg.temperature) if ref_model else None
    return ThetaOld(logp, hidden, ref_logp, passes if training_forward else None, stats)


def hidden_chunks(model, batch, cfg, kept=None):
    """The batch's LM-head inputs h_t in chunks: ``kept`` ``[N, T, H]`` (θ_old's pass kept them) as one chunk, else
    recomputed on each call by a no-grad, eval-mode ``Passes`` over every row, one micro-batch at a time (memory flat
    in the batch). Returns (the chunks' (rows, t), a callable yielding each chunk's (h ``[b, t, H]``, rows, t))."""
    if kept is not None:  # N·T·H·4 bytes (137 GB at 2,048 × 4,096 × 4,096): bounded, as stage 4 keeps it only
        # under --delta_impl normal, which memory_plan.check_delta_cache refuses above its share of host memory
        # before any weights load; the paper's recipe streams (memory_efficient: kept is None, a micro-batch at once)
        T = batch.response_mask.shape[1]
        return [(slice(None), T)], lambda: iter([(kept, slice(None), T)])
    passes = Passes(model, batch, torch.arange(batch.response_mask.shape[0]), cfg, grad=False, asked=Asked(hidden=True))
    return [(rows, t) for rows, _, t in passes.layout], lambda: ((mb.hidden, mb.rows, mb.t) for mb in passes)


def shared_prompt_logprobs(model, input_ids, attention_mask, response_mask, temperature=1.0):
    """``token_logprobs`` of every row with each distinct prompt run once (``SharedPrompts``; --shared_prompt)."""
    rows = torch.arange(len(input_ids))
    shared = SharedPrompts(model, input_ids, attention_mask, rows, response_mask.shape[1])
    return token_logprobs(model, input_ids, attention_mask, response_mask, temperature, shared=(shared, rows))
