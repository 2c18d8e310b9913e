"""The memory plan of a run: the peak memory of each stage of grpo.py's step, per process, from config.json alone.

``plan(read_model_config(model), cfg, prompt_tokens=...)`` computes, before any weight is loaded, what each stage
of a training step holds on the device (GPU, or the CPU when there is none) and on the host, and whether it fits:
docs/scaling.md's arithmetic as one function. GB = 10⁹ bytes. The stages (grpo.py's numbering):

* 1. rollout: HF ``generate`` keeps the KV cache of every row of the process at once (rollout.generate, batch_size
  None) plus its prefill and the sampling logits; vLLM (``--use_vllm``) takes ``vllm_gpu_memory_utilization`` of the
  device (its weights and KV cache), kept through the update unless ``--vllm_enable_sleep_mode``. Under FSDP2 the
  rollout gathers the full weights (distributed.gathered_weights).
* 4. θ_old pass: no-grad micro-batches; or, when stage 6 reuses it (``updates_on_policy``), the training
  forward of the whole batch with every micro-batch's graph kept; DelTA ``normal``'s h_t on the host.
* 5. credit: DelTA ``normal`` (its host peak, ``DELTA_NORMAL_HOST_COPIES`` × N·T·H·4), ``memory_efficient`` (K + 3
  no-grad passes over micro-batches), CSCR's two no-grad scoring passes (gathered weights under FSDP2).
* 6. update: weights, gradients, AdamW, one micro-batch's activations (all of them when stage 4's are reused), the
  shared prompt's kept activations, the LM head's float32 copy, the backward pass's working set.

Every pass holds the LM head's logits as scale_passes.token_logprobs does: a micro-batch's float32 logits b·T·V·4,
or, under ``--chunked_lm_head`` where they exceed ``LOGITS_CHUNK_BYTES``, one chunk of positions at a time
(``chunked_head_bytes``).

Every activation byte count is derived from the model's shapes and the code path (scale_passes.token_logprobs over HF's
Qwen3 decoder layer: q/k/v/o projections, RMSNorms, rotary, SDPA, SwiGLU MLP; peft's LoRA layers), tensor by tensor
as autograd saves them (``layer_activation_bytes``); tests/test_memory_plan.py measures the saved tensors of real
layers and finds these counts to the byte. docs/scaling.md's earlier measured figures (8B per layer per token: full
215 KB, LoRA 443 KB, 296 KB with ``--lora_dropout 0``) are these counts for the CPU's code path, to the kilobyte
(443 KB is the CPU's float32 dropout noise). They differ on a GPU, where LoRA dropout keeps a 1-byte mask (333 KB,
not 443 KB), and wherever a micro-batch has padding, which adds what those figures left out: HF repeats the KV
heads before a masked SDPA call (+12 KB per token for 8B) and each layer keeps SDPA's float copy of the mask, rows
× S² × 2 bytes (45 KB per token per layer at 22,528 tokens); a micro-batch of one padding-free row has no mask.

Left out (what the plan does not count, and why it is small or not ours): the Python/torch process itself (about
0.3 GB of host memory, before the model loads), the allocator's cached free blocks (CUDA: ``CUDA_ALLOCATOR_SLACK``;
glibc on the CPU: tools/bench/memory_plan_check.py measures it), CUDA graphs and vLLM's own buffers beyond its
``gpu_memory_utilization`` share, the first layer saving less under LoRA (its input needs no gradient), tokenizer
and data. Mixture-of-experts layers are not planned (one-line ValueError). It imports no project module (torch,
transformers' AutoConfig, the standard library: tests/test_layout.py), so it can run before anything loads.
Read next: docs/scaling.md.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path

GB = 1e9  # docs/scaling.md's unit

# Host copies of N·T·H·4 bytes that DelTA's --delta_impl normal holds at stage 5's peak, its cache included
# (credit_methods.DeltaCredit.lam_bar -> delta.proxy_vectors -> delta.delta_coefficients): stage 4's h_t cache and the
# proxies v, which proxy_vectors masks in place and delta_coefficients reads as they are (+0.0 on padding: no masked
# copy); v − μ and its square exist one row block at a time (delta.ROW_BLOCK_BYTES = 16 MiB of v, or one response's
# T·H·4 when larger). Beyond them: that block and [N, T] tensors (1/H of a copy each). Measured above the cache at 64
# and 256 MiB of h: 1.28 and 1.075 copies where v + a block gives 1.25 and 1.0625 (4.0 before the blocks;
# tools/bench/memory.py --only stage5, docs/scaling.md). check_delta_cache counts the two copies.
DELTA_NORMAL_HOST_COPIES = 2  # the plan (stage 5's host peak) and check_delta_cache count these
# The most of the host memory available to a process that one allocation's peak may take (check_host_memory):
# half, the other half for the process itself (model, rollouts, allocator slack). DelTA's cache may then take a
# quarter (HOST_MEMORY_SHARE / DELTA_NORMAL_HOST_COPIES).
HOST_MEMORY_SHARE = 0.5


# DelTA --delta_impl memory_efficient keeps per token, across its K + 3 passes: a float mask and two bool sides
# (6 B, delta.py pass 1), the margin (4 B, pass 2) and λ̄ (4 B): 14 bytes on h's device (delta.py's comments).
DELTA_STREAM_BYTES_PER_TOKEN = 14
# CSCR's privileged note in tokens: the longest template ("reference": 161 characters + the reference answer) is
# under 64 tokens for a BPE tokenizer; 160 covers a character-level tokenizer (the toy's) too.
CSCR_NOTE_TOKENS = 160
# vLLM's share: besides its weights and KV cache, its profile run of ``VLLM_PROFILE_TOKENS`` tokens (vLLM's default
# max_num_batched_tokens for offline inference) and the logits of ``VLLM_MAX_SEQS`` sequences (max_num_seqs).
VLLM_PROFILE_TOKENS = 8192
VLLM_MAX_SEQS = 256
# --vllm_gpu_memory_utilization not given: 0.3 of the device (TRL's default), except with sleep mode on a GPU, where
# the plan sizes it (``vllm_share``) so that the rollout stage, vLLM's share beside what stays resident through the
# rollout, leaves VLLM_HEADROOM of the GPU free at its peak (after the CUDA context and allocator slack) for what this
# plan does not count on vLLM's side: CUDA graphs, the sampler's buffers beyond its profile run, NCCL's buffers.
VLLM_DEFAULT_SHARE = 0.3
VLLM_HEADROOM = 0.10
# A suggested flag set (``suggest``) must leave a usable run: on a GPU with vLLM, a KV cache that holds at least this
# many sequences at once. One sequence at a time decodes the process's rows one after another (2,048 rows of the
# paper's recipe: 2,048 passes). 4: the fewest that any plan of docs/scaling.md holds (the paper's 14B run on 8 × 80
# GB), so that each run documented there counts as usable; a judgement of throughput, not a measured bound.
MIN_VLLM_SEQUENCES = 4
# A GPU's memory beyond the tensors: the CUDA context (about 0.5 GB with cuBLAS workspaces) and the caching
# allocator's free blocks (a fraction of the largest stage, and of no more than the GPU has: a stage planned past the
# GPU's size gets the GPU's fraction, not 5% of memory that is not there). Allowances, not measured here:
# tools/bench/gpu_check.py records the prediction beside the measured peak for the day a GPU is lent.
CUDA_CONTEXT_GB = 0.6
CUDA_ALLOCATOR_SLACK = 0.05
PADDING_FREE_BUCKETS = 8  # grpo_config.PADDING_FREE_BUCKETS (copied: this module imports no project file)
# scale_passes.LOGITS_CHUNK_BYTES (copied): under --chunked_lm_head a micro-batch whose b·T float32 logits exceed it
# goes through the LM head LOGITS_CHUNK_BYTES // (V·4) positions at a time (chunked_head.ChunkedLMHead; 441 at
# V = 151,936)
LOGITS_CHUNK_BYTES = 256 * 2**20
LINEAR_NAMES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


# --- config.json ------------------------------------------------------------------------------------------------
SHIPPED_CONFIGS = Path(__file__).resolve().parent / "model_configs"  # <hub id>/config.json (its README: sources)


def shipped_config(model: str) -> Path | None:
    """The folder of trainer/model_configs/ holding the config.json of the hub id ``model`` (e.g.
    ``Qwen/Qwen3-8B-Base``),
    or None: a copy shipped so that the plan of the models the README names needs no network."""
    parts = model.split("/")
    if len(parts) != 2 or any(p in ("", ".", "..") for p in parts) or os.path.isdir(os.path.expanduser(model)):
        return None
    folder = SHIPPED_CONFIGS.joinpath(*parts)
    return folder if (folder / "config.json").is_file() else None


def read_model_config(model: str, trust_remote_code: bool = False, before_download=None) -> dict:
    """The text model's config of ``model`` (a folder, a hub id, or ``"toy"``: the shipped toy/model/) as a dict,
    from config.json only: never weights. ``transformers.AutoConfig`` from the local files first (a folder holding
    only config.json works; a hub id in the local cache), then a hub id's copy in trainer/model_configs/
    (``shipped_config``), then the hub (config.json alone is downloaded), after ``before_download()`` (grpo.py's
    preflight: hub.require_hub, which fails in seconds where the hub cannot answer, instead of the hub client's
    half a minute of retries); a multimodal config gives its text config.
    A config AutoConfig does not know (a ``model_type`` of a newer transformers) is read as JSON.
    Raises ValueError (one line) when it cannot be read (``before_download``'s line after "cannot read ...: ")."""
    from transformers import AutoConfig

    path = str(Path(__file__).resolve().parents[1] / "toy" / "model") if model == "toy" else os.path.expanduser(model)
    try:
        try:
            config = AutoConfig.from_pretrained(path, local_files_only=True, trust_remote_code=trust_remote_code)
        except OSError:
            if os.path.isdir(path):
                raise
            shipped = shipped_config(model)
            path = str(shipped) if shipped else path
            if shipped is None and before_download is not None:  # the hub is next: can it answer?
                before_download()
            config = AutoConfig.from_pretrained(
                path, local_files_only=shipped is not None, trust_remote_code=trust_remote_code
            )
        text = config.get_text_config() if hasattr(config, "get_text_config") else config
        return {**text.to_dict(), "model_type": getattr(text, "model_type", None) or config.model_type}
    except (OSError, ValueError, KeyError) as e:
        file = Path(path) / "config.json"
        if file.is_file():  # an architecture this transformers does not know: its JSON is enough
            try:
                raw = json.loads(file.read_text())
                return {**raw, **raw.get("text_config", {})}
            except (OSError, json.JSONDecodeError) as bad:
                raise ValueError(f"cannot read {file}: {bad}") from None
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ValueError(f"cannot read the config.json of model {model!r}: {first}") from None


@dataclass(frozen=True)
class Shapes:
    """What the plan reads of a decoder-only config.json (Qwen3 / Qwen2 / Llama style)."""

    hidden: int
    intermediate: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    tied: bool
    qk_norm: bool  # Qwen3: an RMSNorm over each head's queries and keys
    qkv_bias: bool
    o_bias: bool
    mlp_bias: bool
    dtype: str  # the checkpoint's dtype
    full_attention: bool  # every layer full attention (the shared prompt's condition)

    @classmethod
    def from_config(cls, c: dict) -> "Shapes":
        """Raises ValueError (one line) for a field that is missing or a mixture-of-experts config."""
        kind = c.get("model_type") or "?"
        if any(c.get(k) for k in ("num_experts", "num_local_experts", "n_routed_experts", "moe_intermediate_size")):
            raise ValueError(
                f"memory_plan: {kind} has mixture-of-experts layers, which this plan does not cover "
                "(dense decoder layers only)"
            )
        try:
            H, heads, layers = int(c["hidden_size"]), int(c["num_attention_heads"]), int(c["num_hidden_layers"])
            I, V = int(c["intermediate_size"]), int(c["vocab_size"])
        except (KeyError, TypeError, ValueError) as e:
            raise ValueError(
                f"memory_plan: config.json of {kind} lacks {e} (hidden_size, intermediate_size, "
                "num_hidden_layers, num_attention_heads, vocab_size are needed)"
            ) from None
        types = c.get("layer_types") or []
        window = c.get("sliding_window") if c.get("use_sliding_window", True) else None
        return cls(
            hidden=H,
            intermediate=I,
            layers=layers,
            heads=heads,
            kv_heads=int(c.get("num_key_value_heads") or heads),
            head_dim=int(c.get("head_dim") or H // heads),
            vocab=V,
            tied=bool(c.get("tie_word_embeddings", False)),
            qk_norm=kind.startswith("qwen3"),
            qkv_bias=bool(c.get("attention_bias", kind == "qwen2")),
            o_bias=bool(c.get("attention_bias")),
            mlp_bias=bool(c.get("mlp_bias")),
            dtype=str(c.get("dtype") or c.get("torch_dtype") or "float32"),
            full_attention=all(t == "full_attention" for t in types) and not (not types and window),
        )

    @property
    def q_width(self) -> int:
        return self.heads * self.head_dim

    @property
    def kv_width(self) -> int:
        return self.kv_heads * self.head_dim

    def linear_shapes(self) -> dict:
        """{module name: (in, out)} of one decoder layer's projections."""
        H, I, Hq, Hkv = self.hidden, self.intermediate, self.q_width, self.kv_width
        return {
            "q_proj": (H, Hq),
            "k_proj": (H, Hkv),
            "v_proj": (H, Hkv),
            "o_proj": (Hq, H),
            "gate_proj": (H, I),
            "up_proj": (H, I),
            "down_proj": (I, H),
        }

    def layer_parameters(self) -> int:
        H, I, Hq, Hkv = self.hidden, self.intermediate, self.q_width, self.kv_width
        n = sum(i * o for i, o in self.linear_shapes().values()) + 2 * H  # projections, the two RMSNorms
        n += 2 * self.head_dim if self.qk_norm else 0
        n += (Hq + 2 * Hkv) * self.qkv_bias + H * self.o_bias + (2 * I + H) * self.mlp_bias
        return n

    def root_parameters(self) -> int:
        """Embeddings, final norm and (untied) LM head: FSDP2's root module."""
        return self.vocab * self.hidden * (1 if self.tied else 2) + self.hidden

    def parameters(self) -> int:
        return self.layers * self.layer_parameters() + self.root_parameters()

    def lora_parameters(self, targets: str, r: int) -> int:
        """r·(in + out) per adapted projection (peft's A [r, in] and B [out, r]), over the layers."""
        return self.layers * sum(
            r * (i + o) for m, (i, o) in self.linear_shapes().items() if m in lora_targets(targets)
        )

    def kv_bytes_per_token(self, c: int) -> int:
        """The KV cache: keys and values of every layer, c bytes each: 2 × layers × KV heads × head_dim × c."""
        return 2 * self.layers * self.kv_width * c


def lora_targets(targets: str) -> set:
    """``--lora_target_modules`` as the set of projections it adapts (``all-linear``: every one but the LM head)."""
    names = {t.strip() for t in (targets or "").split(",") if t.strip()}
    return set(LINEAR_NAMES) if "all-linear" in names else names


# --- Activations: what autograd keeps, tensor by tensor -----------------------------------------------------------
def layer_activation_bytes(
    sh: Shapes, *, c: int, full: bool, lora: tuple | None, cuda: bool, q_tokens: int, kv_tokens: int, masked: bool
) -> int:
    """Bytes one decoder layer keeps for the backward pass, for one row of ``q_tokens`` query positions attending
    to ``kv_tokens`` key positions (equal without the shared prompt), ``c`` bytes per compute element (2 bf16,
    4 float32). ``full``: the base weights are trained; ``lora``: (targets, r, dropout) of peft's adapters;
    ``cuda``: a GPU (its fused dropout keeps a 1-byte mask, the CPU's float32 noise); ``masked``: the micro-batch
    has padding (a 4-D mask reaches SDPA). Per query token, as HF's Qwen3 layer and peft run (verified byte for
    byte against the tensors autograd saves: tests/test_memory_plan.py):

    * each RMSNorm (input, post-attention, and per head q/k): its float32 input (``.to(float32)`` is a copy in
      bf16 and the input itself in float32: 4 bytes either way) and 1/rms; the normalised input (c) when its
      weight is trained;
    * SDPA: the rotated queries and the output (c each; o_proj reads the output's storage), logsumexp (float32 per
      head), keys and values per key position: the KV heads, or all heads when a mask is given (HF repeats them,
      integrations/sdpa_attention.py), and then SDPA's float copy of the mask (c per key position);
    * MLP: the gate (SiLU's input), SiLU's output and up (c each, kept by SiLU and the product);
    * the projections' inputs (c: the normalised input read by q/k/v, by gate/up, and the product read by down)
      when a base weight is trained; LoRA: peft casts the input to the adapter's float32 (a copy per projection in
      bf16, the shared input itself in float32), its dropout keeps its output and its noise (float32 on the CPU,
      a bool mask on a GPU), lora_A's output (r floats) is kept by lora_B.
    """
    H, I, Hq, Hkv = sh.hidden, sh.intermediate, sh.q_width, sh.kv_width
    nh, nkv = sh.heads, sh.kv_heads
    per_q = 2 * (4 * H + 4) + (4 * Hq + 4 * nh + 4 * Hkv + 4 * nkv if sh.qk_norm else 0)  # RMSNorm inputs, 1/rms
    if full:
        per_q += 2 * c * H + (c * (Hq + Hkv) if sh.qk_norm else 0)  # normalised inputs, for the norms' weights
    per_q += 2 * c * Hq + 4 * nh  # SDPA: rotated queries, output; logsumexp
    per_q += 3 * c * I  # MLP: gate, SiLU(gate), up
    targets, r, p = lora if lora else (set(), 0, 0.0)
    groups = (("q_proj", "k_proj", "v_proj"), ("o_proj",), ("gate_proj", "up_proj"), ("down_proj",))
    widths = (H, Hq, H, I)  # what each group of projections reads
    for mods, width, kept_anyway in zip(groups, widths, (False, True, False, False)):  # o_proj: SDPA's output
        adapted = [m for m in mods if m in targets]
        if (full or (adapted and p == 0 and c == 4)) and not kept_anyway:
            per_q += c * width  # the shared input, kept once
        for _ in adapted:
            if p > 0:
                per_q += 4 * width + (1 if cuda else 4) * width  # dropout's float32 output and its mask / noise
            elif c < 4:
                per_q += 4 * width  # the float32 copy of the input
            per_q += 4 * r  # lora_A's output
    k_heads = Hq if masked and nkv < nh else Hkv
    per_kv = 2 * c * k_heads
    return q_tokens * per_q + kv_tokens * per_kv + (q_tokens * kv_tokens * c if masked else 0)


def nograd_layer_bytes(
    sh: Shapes, *, c: int, q_tokens: int, kv_tokens: int, masked: bool, lora: tuple | None = None
) -> int:
    """The largest set of one layer's tensors alive at once in a no-grad (eval) forward, one row. Per query token
    the largest of three phases: a residual add and the RMSNorm after it (the two summands or the sum and the
    norm's output, c each, and its float32 input and normalised input, 4 each), the attention (the residual
    stream and the normalised input, q, k, v, the rotary products, the output; float32 q/k norm internals in
    bf16), the MLP (the residual stream, the normalised input, gate, up and their product); under LoRA, the widest
    adapter's float32 input copy (bf16) and its float32 result and scaled result. Per key position the keys and
    values SDPA reads (all heads when masked) and, masked, the bool mask and its float copy. Against the CPU
    allocator's live bytes of a whole no-grad forward: -13% ... +5% (tests/test_memory_plan.py)."""
    H, I, Hq, Hkv = sh.hidden, sh.intermediate, sh.q_width, sh.kv_width
    norm = 3 * c * H + 8 * H
    attn = 2 * c * H + c * (Hq + 2 * Hkv) + 3 * c * Hq + (8 * Hq if c < 4 else 0)
    mlp = 2 * c * H + 3 * c * I
    per_q = max(norm, attn, mlp)
    if lora and lora[0]:
        per_q += max((4 * i if c < 4 else 0) + 8 * o for m, (i, o) in sh.linear_shapes().items() if m in lora[0])
    per_kv = 2 * c * (Hq if masked and sh.kv_heads < sh.heads else Hkv)
    return q_tokens * per_q + kv_tokens * per_kv + (q_tokens * kv_tokens * (c + 1) if masked else 0)


def gradient_flow_bytes(sh: Shapes, c: int, lora: tuple | None = None) -> int:
    """Per token, the backward pass's gradients alive at once beside the kept activations (which it frees as it
    goes): the residual stream's gradient and two gradients of the widest intermediate (the MLP's product
    operands, or the norms' outputs): c·H + 2·c·max(H, I); under LoRA also the float32 gradients of the widest
    adapter's input and result. The CPU allocator's live bytes during the backward pass of Qwen3 layers (hidden
    128 ... 2,048, float32 and bf16, LoRA or not, with and without checkpointing) peaked at 0.6-1.15× of it above
    the kept activations (torch.profiler's memory events)."""
    extra = max(4 * (i + o) for m, (i, o) in sh.linear_shapes().items() if m in lora[0]) if lora and lora[0] else 0
    return c * sh.hidden + 2 * c * max(sh.hidden, sh.intermediate) + extra


def chunked_head_bytes(chunk: int, V: int, H: int, c: int, trained: bool) -> dict:
    """chunked_head.ChunkedLMHead's working set, ``chunk`` positions at a time, in bytes (c: the compute dtype's bytes).
    Forward: a chunk's logits z/τ in float32 and logsumexp's temporary, 2·4·chunk·V (bf16: its z, 2·chunk·V, is
    freed before logsumexp runs). Backward: the chunk's float32 logits, turned in place into ∂/∂z, and their bf16
    copy for dh's matmul (c = 2), plus, when the head is trained, W's gradient summed chunk by chunk in float32,
    V·H·4 (float64: V·H·8), then added to W's .grad; a bf16 head's sum is a buffer of its own, cast to V·H·2 once
    after the last chunk, when the chunk's logits are gone. Beside them: what ``kept_row`` counts (h and logsumexp
    per position). Measured with the CPU allocator's live bytes (tests/test_chunked_head.py): forward
    8.00·chunk·V, backward 4.00 and 6.00 beside V·H·4."""
    f = max(c, 4)  # the float32 copy (float64 for a float64 model)
    per_chunk = (f + (c if c < f else 0)) * chunk * V  # its float32 logits and their bf16 copy
    cast = V * H * c if c < f else 0  # a bf16 head: its gradient cast from the float32 sum
    return {"forward": 2 * f * chunk * V, "backward": (V * H * f + max(per_chunk, cast)) if trained else per_chunk}


# --- Settings: what the plan reads of the run's flags --------------------------------------------------------------
@dataclass
class Settings:
    """The flags the plan reads, with grpo.GRPOConfig's defaults (``from_cfg`` takes any object with these
    attributes; a missing one keeps its default)."""

    torch_dtype: str = "auto"
    use_peft: bool = False
    lora_r: int = 16
    lora_dropout: float = 0.05
    lora_target_modules: str = ",".join(LINEAR_NAMES)
    gradient_checkpointing: bool = False
    micro_batch_size: int = 0
    padding_free: bool = False
    shared_prompt: bool = False
    chunked_lm_head: bool = False
    fuse_old_logprobs: bool = True
    num_prompts_per_step: int = 16
    num_generations: int = 8
    num_mini_batches: int = 1
    num_iterations: int = 1
    max_completion_length: int = 64
    use_vllm: bool = False
    vllm_gpu_memory_utilization: float | None = None  # None: sized by the plan (``vllm_share``)
    vllm_enable_sleep_mode: bool = False
    vllm_kv_cache_dtype: str = "auto"  # "fp8": one byte per cached key/value element
    credit: str = "grpo"
    credit_gathers_weights: bool = False  # the credit function's own passes need the whole weights (CSCR's)
    credit_token_arrays: int = 0  # the float32 [N, T] arrays the credit function keeps (DelTA's λ̄; CSCR's ℓ±, s)
    reuses_old_forward: bool = True  # the loss stage may reuse stage 4's training forward (not Forking Tokens' micro)
    delta_impl: str = "normal"
    delta_k: int = 1
    beta: float = 0.0
    ref_on_cpu: bool = False
    attn_implementation: str = "sdpa"

    @classmethod
    def from_cfg(cls, cfg, traits: dict | None = None) -> "Settings":  # traits: the two fields above, by name
        return cls(**{**{f.name: getattr(cfg, f.name, f.default) for f in dataclasses.fields(cls)}, **(traits or {})})


def updates_on_policy(
    s, num_rows: int, processes: int, reuses_old_forward: bool = True, credit_gathers_weights: bool = False
) -> bool:
    """Whether grpo.py's stage 4 takes θ_old's log-probs from the training forward, which stage 6's only update then
    reuses (the trainer's choice, run_setup.step_parts, and the plan's): --fuse_old_logprobs (where exact), one update
    of one micro-batch, no KL reference (``beta`` 0); not a loss stage that needs its own forward
    (``reuses_old_forward`` False), nor, over several processes, a credit function whose own passes need the gathered
    weights (``credit_gathers_weights``: CSCR's scoring), which are not available inside a forward/backward. ``s``: a
    grpo.GRPOConfig or a ``Settings``; ``num_rows``: this process's rollout rows."""
    return (
        s.fuse_old_logprobs
        and s.num_iterations == 1
        and s.num_mini_batches == 1
        and s.beta <= 0
        and (s.micro_batch_size == 0 or s.micro_batch_size >= num_rows)
        and not (credit_gathers_weights and processes > 1)
        and reuses_old_forward
    )


# --- The plan -------------------------------------------------------------------------------------------------------
@dataclass
class Stage:
    name: str
    device_gb: float
    host_gb: float
    what: str


@dataclass
class Suggestion:
    flags: list  # e.g. ["--gradient_checkpointing", "--micro_batch_size 2"]
    processes: int
    peak_gb: float
    vllm_sequences: int | None = None  # what its vLLM KV cache holds at once (None: no vLLM)

    def command(self) -> str:
        launch = f"torchrun --nproc_per_node {self.processes} grpo.py" if self.processes > 1 else ""
        return " ".join([launch, *self.flags]).strip() or "(no change)"


@dataclass
class MemoryPlan:
    """Per-stage memory of one process (GB = 10⁹ bytes): ``stages`` (rollout, θ_old pass, credit, update) with
    their device and host GB and what dominates; ``device_gb`` the device's memory (host memory when the CPU is
    the device), ``reserve_gb`` what a GPU needs beyond its tensors (CUDA context, allocator slack); ``peak_gb``
    the largest stage plus the reserve; ``parts`` the components in bytes (docs/scaling.md's rows);
    ``suggestions`` flag sets that fit when re-planned, each a usable run (``MIN_VLLM_SEQUENCES``; empty when it
    fits); ``near_misses`` when there is none, the flag sets that fit but leave vLLM fewer sequences (the verdict
    says why nothing is suggested)."""

    model: str
    device: str  # "GPU" or "CPU"
    processes: int
    device_gb: float
    host_capacity_gb: float | None
    stages: list
    reserve_gb: float
    parts: dict
    problems: list = field(default_factory=list)  # reasons beyond the peak (vLLM's KV cache, host memory)
    suggestions: list = field(default_factory=list)
    near_misses: list = field(default_factory=list)

    @property
    def peak_gb(self) -> float:
        return max(s.device_gb for s in self.stages) + self.reserve_gb

    @property
    def peak_stage(self) -> str:
        return max(self.stages, key=lambda s: s.device_gb).name

    @property
    def fits(self) -> bool:
        return self.peak_gb <= self.device_gb and not self.problems

    @property
    def shortfall_gb(self) -> float:
        return max(self.peak_gb - self.device_gb, 0.0)

    def verdict(self) -> str:
        """One line: ``fits: peak X GB of Y GB`` or ``does not fit: ..., short by Z GB; fits with: <flags> [or:
        torchrun --nproc_per_node N ...]``, or, where only runs whose vLLM holds too few sequences fit, why nothing
        is suggested, naming them (``near_misses``)."""
        where = f"peak {self.peak_gb:.1f} GB of {self.device_gb:.1f} GB ({self.peak_stage})"
        if self.fits:
            return f"fits: {where}"
        why = f", short by {self.shortfall_gb:.1f} GB" if self.shortfall_gb > 0 else ""
        why += "".join(f"; {p}" for p in self.problems)
        if not self.suggestions and self.near_misses:
            near = " or: ".join(f"{s.command()} ({_sequences(s.vllm_sequences)})" for s in self.near_misses)
            return (
                f"does not fit: {where}{why}; nothing tried leaves a usable run (vLLM's KV cache holding "
                f"at least {MIN_VLLM_SEQUENCES} sequences at once); these fit with fewer: {near}"
            )
        if not self.suggestions:
            return f"does not fit: {where}{why}; nothing tried fits (every flag of the ladder, torchrun up to 8)"
        fix = " or: ".join(s.command() for s in self.suggestions)
        return f"does not fit: {where}{why}; fits with: {fix}"

    def vllm_line(self) -> str:
        """One line on vLLM's share: who chose it, the sequences its KV cache holds at once, and the grpo.py flag that
        holds more: an FP8 KV cache (``--vllm_kv_cache_dtype fp8``, one byte per element)."""
        p = self.parts
        budget, one, c = p["vllm_kv_budget"], p["vllm_sequence_bytes"], p["compute_bytes"]
        who = "sized by the plan (sleep mode)" if p["vllm_sized"] else "as given"
        line = (
            f"vLLM: --vllm_gpu_memory_utilization {p['vllm_share']:.2f} {who}, KV cache {budget / GB:.1f} GB: "
            f"{_sequences(p['vllm_sequences'])} at once"
        )
        if c > 1 and one % c == 0 and p["kv_per_token"] * p["row_tokens"] == one:  # not fp8 already
            line += f"; more: --vllm_kv_cache_dtype fp8 holds {int(budget // (one // c)):,}"
        return line

    def table(self) -> str:
        """A short fixed-width table (at most 12 lines): one line per stage, the fixed parts, the verdict."""
        p = self.parts
        size = f"{p['parameters'] / 1e9:.2f} B" if p["parameters"] >= 1e8 else f"{p['parameters'] / 1e6:.2f} M"
        head = (
            f"memory plan: {self.model}, {size} parameters, {self.processes} "
            f"{'process' if self.processes == 1 else 'processes'} on a {self.device} of {self.device_gb:.1f} GB"
        )
        lines = [head, f"{'stage':<12}{'device GB':>10}{'host GB':>9}  what"]
        lines += [f"{s.name:<12}{s.device_gb:>10.1f}{s.host_gb:>9.1f}  {s.what}" for s in self.stages]
        lines.append(
            f"fixed: weights {p['weights'] / GB:.2f} GB, AdamW {p['adamw'] / GB:.2f} GB, gradients "
            f"(update) {p['gradients'] / GB:.2f} GB"
            + (
                f"; + {CUDA_CONTEXT_GB:.1f} GB CUDA context, {self.reserve_gb - CUDA_CONTEXT_GB:.1f} GB allocator slack"
                if self.reserve_gb
                else ""
            )
        )
        if p.get("vllm_share") and self.device == "GPU":
            lines.append(self.vllm_line())
        lines.append(
            f"per token: activations {p['activation_row'] / p['row_tokens'] / 1e6:.2f} MB kept to the "
            f"backward, KV cache {p['kv_per_token'] / 1e6:.3f} MB"
        )
        lines.append(self.verdict())
        return "\n".join(lines)


def vllm_share(resident: float, engine: float, sequence: float, rows: int, device_gb: float) -> float:
    """``--vllm_gpu_memory_utilization`` sized for a colocated vLLM with sleep mode: the largest share (down to 0.01)
    with which the rollout stage, ``resident`` bytes that stay through it (the trainer's sharded weights, AdamW, a
    frozen reference) plus vLLM's share of the device, peaks at (1 − VLLM_HEADROOM) of ``device_gb`` with the CUDA
    context and the allocator's slack counted as ``plan`` counts them; no larger than holding all ``rows`` sequences
    of ``sequence`` bytes of KV cache beside ``engine`` bytes (vLLM's weights and profile run). Sleep mode frees the
    share during the update, so the share is what the rollout leaves free, not what the update leaves. Where that
    holds no sequence, the smallest share that holds one (into the headroom; the plan then says whether it fits)."""
    stage = ((1 - VLLM_HEADROOM) * device_gb - CUDA_CONTEXT_GB) / (1 + CUDA_ALLOCATOR_SLACK) * GB  # rollout bytes
    pool = min(stage - resident, engine + rows * sequence)
    if pool < engine + sequence:
        return min(math.ceil((engine + sequence) / (device_gb * GB) * 100) / 100, 1.0)
    return math.floor(pool / (device_gb * GB) * 100) / 100


def _rows(n: int) -> str:
    return f"{n:,} row" + ("" if n == 1 else "s")


def _sequences(n: int) -> str:
    return f"{n:,} sequence" + ("" if n == 1 else "s")


def _cuda() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except ImportError:
        return False


def host_available_bytes() -> int:
    """The host's available memory in bytes: MemAvailable (Linux), else the free physical pages
    (``host_memory_available``
    divides it among a node's processes)."""
    try:
        with open("/proc/meminfo") as f:
            return next(int(line.split()[1]) * 1024 for line in f if line.startswith("MemAvailable:"))
    except (OSError, StopIteration):
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def host_memory_available() -> int:
    """Bytes of host memory available to this process: MemAvailable (Linux; else the free physical pages) divided
    among the node's processes (torchrun's LOCAL_WORLD_SIZE)."""
    return host_available_bytes() // max(int(os.environ.get("LOCAL_WORLD_SIZE", "1")), 1)


def check_host_memory(nbytes: int, what: str, fix: str) -> None:
    """Stop (``SystemExit``, one line naming ``fix``) before ``nbytes`` (the peak of ``what``, every copy it will
    hold counted) are allocated on the host when that is more than ``HOST_MEMORY_SHARE`` of
    ``host_memory_available()``: a clear message instead of an out-of-memory kill in the middle of a step."""
    avail = host_memory_available()
    if nbytes > HOST_MEMORY_SHARE * avail:
        raise SystemExit(
            f"grpo.py: error: {what} = {nbytes / 1e9:.1f} GB, more than {HOST_MEMORY_SHARE:.0%} of the "
            f"{avail / 1e9:.1f} GB of host memory available to this process; use {fix}"
        )


def check_delta_cache(N: int, T: int, H: int) -> None:  # one line, not an out-of-memory kill mid-step
    copies = DELTA_NORMAL_HOST_COPIES  # stage 5's peak: the cache of h_t and the proxies v beside it
    check_host_memory(
        copies * N * T * H * 4,
        f"--delta_impl normal's stage 5 holds DelTA's h_t of the whole "
        f"rollout batch and v on the host ({copies} × {N} responses × {T} tokens × {H} hidden × 4 "
        "bytes)",
        "--delta_impl memory_efficient (the same λ̄ from micro-batches: h recomputed in K + 3 forward passes)",
    )


def plan(
    model_config: dict,
    cfg,
    *,
    prompt_tokens: int,
    processes: int = 1,
    gpu_memory_gb: float | None = None,
    host_memory_gb: float | None = None,
    traits: dict | None = None,
) -> MemoryPlan:
    """The memory plan of ``cfg`` (a grpo.GRPOConfig, or any object with ``Settings``' attributes) on the model of
    ``model_config`` (``read_model_config``), per process of a torchrun of ``processes`` (FSDP2 shards weights,
    gradients and AdamW; each process takes num_prompts_per_step / processes groups). ``prompt_tokens``: the
    longest prompt in tokens. ``gpu_memory_gb``: plan for a GPU of that size (None: the local GPU, else the CPU
    is the device and host memory its size: ``host_memory_gb`` or MemAvailable). When it does not fit,
    ``suggestions`` holds the first flag sets that do, each re-planned (``suggest``). Raises ValueError (one line)
    for a config it cannot plan or settings that cannot run (grpo_config.check_config's divisibility). ``traits``:
    what the run's credit function and loss stage are (``Settings.credit_gathers_weights``, ``reuses_old_forward``:
    run_setup.prepare reads them from the run's ``grpo.Method`` and preflight passes them on; None: the defaults,
    GRPO's)."""
    s = Settings.from_cfg(cfg, traits)
    sh = Shapes.from_config(model_config)
    gpu = gpu_memory_gb is not None or _cuda()
    if gpu_memory_gb is None and gpu:
        import torch

        gpu_memory_gb = torch.cuda.get_device_properties(0).total_memory / GB
    host = (
        host_memory_gb if host_memory_gb is not None else (host_available_bytes() / GB if _cuda() or not gpu else None)
    )
    path = Path(str(model_config.get("_name_or_path") or model_config.get("model_type") or "model"))
    name = path.name if path.name != "model" else f"{path.parent.name}/model"  # (the toy's folder: toy/model)
    out = _plan(sh, s, prompt_tokens, processes, gpu, gpu_memory_gb if gpu else host, host, name)
    if not out.fits:
        out.suggestions = suggest(sh, s, prompt_tokens, processes, gpu, out.device_gb, host, name)
    if not out.fits and not out.suggestions:  # why: some flag set fits, but vLLM holds too few sequences?
        out.near_misses = suggest(sh, s, prompt_tokens, processes, gpu, out.device_gb, host, name, min_sequences=1)
    return out


def _plan(
    sh: Shapes, s: Settings, P: int, n: int, gpu: bool, device_gb: float, host_gb: float | None, name: str
) -> MemoryPlan:
    """``plan`` without suggestions (every quantity per process, in bytes until the stages)."""
    if n < 1 or s.num_prompts_per_step % n:
        raise ValueError(
            f"memory_plan: --num_prompts_per_step {s.num_prompts_per_step} must be a multiple of the "
            f"number of processes ({n})"
        )
    if s.num_mini_batches < 1 or (s.num_prompts_per_step // n * s.num_generations) % s.num_mini_batches:
        raise ValueError(
            f"memory_plan: --num_mini_batches {s.num_mini_batches} must divide each process's "
            f"{s.num_prompts_per_step // n * s.num_generations} rows"
        )
    dtype = s.torch_dtype if s.torch_dtype != "auto" else ("bfloat16" if gpu else "float32")
    cw = 4 if dtype == "float32" else 2  # stored weights
    c = 2 if gpu and n > 1 and cw == 4 else cw  # compute: FSDP2's bf16 gathers of float32 master weights
    L, H, V, T = sh.layers, sh.hidden, sh.vocab, s.max_completion_length
    S, N = P + T, s.num_prompts_per_step // n * s.num_generations  # one row's tokens, this process's rows
    prompts = s.num_prompts_per_step // n
    full, peft = not s.use_peft, s.use_peft
    lora = (lora_targets(s.lora_target_modules), s.lora_r, s.lora_dropout) if peft else None
    n_params, n_lora = sh.parameters(), sh.lora_parameters(s.lora_target_modules, s.lora_r) if peft else 0
    trainable, tb = (n_lora, 4) if peft else (n_params, cw)  # peft keeps adapters in float32
    weights = (n_params * cw + n_lora * 4) / n
    grads, adamw = trainable * tb / n, 2 * trainable * tb / n
    if peft:
        largest = (
            max(s.lora_r * max(i, o) for m, (i, o) in sh.linear_shapes().items() if m in lora[0]) if lora[0] else 0
        )
    else:
        largest = max(V * H, H * sh.intermediate)
    opt_temp = 0 if gpu else 2 * largest * tb  # CUDA: fused AdamW; CPU: sqrt(v) and its quotient, per tensor
    ref = n_params * cw / n if s.beta > 0 and full else 0  # the frozen copy (LoRA: the adapter disabled)
    # the scale path's optimisations (their flags), off where they would not be exact (scale_passes.exact_optimisations)
    dropout = peft and s.lora_dropout > 0
    padding_free = s.padding_free and not dropout
    shared = s.shared_prompt and not s.gradient_checkpointing and not dropout and n == 1 and sh.full_attention
    mini = N // s.num_mini_batches
    fuse = not dropout and updates_on_policy(s, N, n, s.reuses_old_forward, s.credit_gathers_weights)

    def rows(k: int) -> int:  # rows per micro-batch of a pass over k rows (scale_passes.micro_batches)
        return (
            min(s.micro_batch_size, k)
            if s.micro_batch_size
            else (math.ceil(k / PADDING_FREE_BUCKETS) if padding_free else k)
        )

    flash = s.attn_implementation.startswith("flash")
    masked = lambda b: not flash and not (b == 1 and padding_free)  # noqa: E731  (padding reaches SDPA)
    Sq = T + 1 if shared else S  # with the shared prompt: the last prompt token and the response
    chunked = lambda b: s.chunked_lm_head and b * T * V * 4 > LOGITS_CHUNK_BYTES  # noqa: E731  (scale_passes' rule)
    head = chunked_head_bytes(max(1, LOGITS_CHUNK_BYTES // (V * 4)), V, H, c, full)
    kv_bpt = sh.kv_bytes_per_token(c)

    def layer(b):
        return layer_activation_bytes(
            sh, c=c, full=full, lora=lora, cuda=gpu, q_tokens=Sq, kv_tokens=S, masked=masked(b)
        )

    def kept_row(b):  # one row's activations kept until its backward
        core = L * c * H * Sq if s.gradient_checkpointing else L * layer(b)  # checkpointing: each layer's input
        extra = 2 * c * sh.head_dim * Sq + (4 * H + 4 + (c * H if full else 0)) * Sq  # cos/sin, final norm
        if chunked(b):  # ChunkedLMHead keeps h (the final norm's output: its whole storage when it needs no copy),
            extra += c * H * Sq + 12 * T  # and per position logsumexp (4 B) and the token id (8 B)
        else:  # the LM head's input (as above), logsumexp's float32 logits (scale_passes.token_logprobs)
            extra += (c * H * Sq if full else 0) + 4 * V * T
        extra += Sq * S if masked(b) else 0  # the bool mask
        return core + extra

    def backward_extra(b):  # beside the kept activations, the largest of:
        if chunked(b):  # one chunk's forward; its backward, with W's gradient and h's [b·T, H]
            head_fwd, head_bwd = head["forward"] + b * V * c, head["backward"] + b * T * H * c
        else:
            head_fwd = b * (T + 1) * V * c + T * V * 4  # the logits (c) and one row's second float32 copy
            head_bwd = max(3 * T * V * 4, 2 * b * (T + 1) * V * c)  # one row's float32 gradients; the logits' two
        flow = b * Sq * gradient_flow_bytes(sh, c, lora) + (b * layer(b) if s.gradient_checkpointing else 0)
        return max(head_fwd, head_bwd, flow)  # (measured: the LM head, scale_passes.token_logprobs, exactly)

    def nograd(b, q=Sq, kv=S):  # one micro-batch's no-grad forward: a layer at a time, then the LM head
        return b * nograd_layer_bytes(sh, c=c, q_tokens=q, kv_tokens=kv, masked=masked(b), lora=lora) + (
            head["forward"] + b * V * c
            if chunked(b)
            # a chunk (and the model's own head at one position)
            else b * (T + 1) * V * c + 2 * T * V * 4
        )  # the logits, one row's float32 copy and logsumexp's exp

    def prompt_pass(k, grad):  # the shared prompt pass of k distinct prompts (P − 1 tokens each)
        if not shared:
            return 0
        kv = k * (P - 1) * kv_bpt
        if not grad:
            return kv
        act = L * layer_activation_bytes(
            sh, c=c, full=full, lora=lora, cuda=gpu, q_tokens=P - 1, kv_tokens=P - 1, masked=k > 1
        )
        return k * act + 2 * kv  # its activations, the keys/values and their gradients, until backward_prompts

    layer_w, root_w = sh.layer_parameters(), sh.root_parameters()
    fsdp_grad = (
        ((2 * layer_w + root_w) * c + ((layer_w + root_w) * (4 if c != cw else cw) if full else 0)) if n > 1 else 0
    )  # two layers gathered (one prefetched), the root kept; unsharded gradients (reduce dtype)
    fsdp_nograd = (2 * layer_w + root_w) * c if n > 1 else 0
    gathered = (n_params * c + n_lora * 4) if n > 1 else 0  # distributed.gathered_weights: the full weights

    # host tensors of the step: the batch ([N, S] ids and mask, [N, T] response ids and mask, int64) and its
    # float32 [N, T] per-token arrays (θ_old's log-probs, token advantages, λ̄ or CSCR's two passes and s, ref)
    per_token = 2 + (s.beta > 0) + s.credit_token_arrays
    host_batch = N * S * 16 + N * T * (16 + 4 * per_token)
    delta_normal = s.credit == "delta" and s.delta_impl == "normal"
    h_cache = N * T * H * 4 if delta_normal else 0
    host_ref = n_params * cw if s.beta > 0 and full and s.ref_on_cpu else 0
    if s.ref_on_cpu:
        ref = 0

    # 1. rollout
    fixed = weights + adamw + ref
    if s.use_vllm:
        pool_of = device_gb if gpu else (host_gb or 0)
        v_weights = n_params * c
        profile = (
            VLLM_PROFILE_TOKENS * nograd_layer_bytes(sh, c=c, q_tokens=1, kv_tokens=1, masked=False)
            + VLLM_MAX_SEQS * V * 4
        )
        resident = fixed + (gathered if peft else 0)  # LoRA under FSDP2: merged from full weights
        v_kv = sh.kv_bytes_per_token(1 if s.vllm_kv_cache_dtype == "fp8" else c) * S  # one sequence's cache
        share = s.vllm_gpu_memory_utilization or (
            vllm_share(resident, v_weights + profile, v_kv, N, device_gb)
            if gpu and s.vllm_enable_sleep_mode
            else VLLM_DEFAULT_SHARE
        )
        pool = share * pool_of * GB
        kv_budget = pool - v_weights - profile if gpu else pool
        sequences = int(max(kv_budget, 0) // v_kv)
        pool_total = pool if gpu else pool + v_weights
        rollout_dev = resident + pool_total
        rollout_what = (
            f"vLLM {share:.2f} × {device_gb:.0f} GB: its KV cache holds "
            f"{sequences:,} of {_rows(N)} of {S:,} tokens at once"
        )
        held = 0 if s.vllm_enable_sleep_mode else pool_total
        vllm = {
            "vllm_share": share,
            "vllm_sequences": sequences,
            "vllm_kv_budget": max(kv_budget, 0),
            "vllm_sequence_bytes": v_kv,
            "vllm_weights": v_weights,
            "vllm_sized": not s.vllm_gpu_memory_utilization,
        }
    else:
        prefill = (
            N * nograd_layer_bytes(sh, c=c, q_tokens=P, kv_tokens=P, masked=True, lora=lora)
            + N * P * kv_bpt
            + N * V * (c + 4)
        )
        decode = (
            N * S * kv_bpt
            + N * nograd_layer_bytes(sh, c=c, q_tokens=1, kv_tokens=S, masked=True, lora=lora)
            + N * V * (c + 12)
            + N * S * kv_bpt // L
        )  # DynamicCache's torch.cat: one layer's cache twice
        rollout_dev = fixed + gathered + max(prefill, decode)
        rollout_what = f"HF generate: KV cache {N * S * kv_bpt / GB:.1f} GB ({_rows(N)} × {S:,} tokens)"
        if prefill > decode:
            rollout_what += f", prefill {prefill / GB:.1f} GB"
        sequences, held, vllm = None, 0, {"vllm_sequences": None}
    # 4. θ_old pass
    b4 = rows(N)
    base = fixed + held
    if fuse:
        kept = N * kept_row(b4) + prompt_pass(prompts, True)
        theta_dev = base + kept + fsdp_grad + (head["forward"] + b4 * V * c if chunked(b4) else b4 * (T + 1) * V * c)
        theta_what = f"training forward of {_rows(N)} kept for the update (micro-batches of {b4:,})"
    else:
        kept = 0
        theta_dev = base + nograd(b4) + prompt_pass(prompts, False) + fsdp_nograd
        theta_what = f"no-grad micro-batches of {_rows(b4)} × {S:,} tokens"
        if ref:
            theta_what += " (+ the reference's)"
    if delta_normal:
        theta_dev += b4 * T * H * c  # the micro-batch's h_t before it goes to the host
        theta_what += f"; h_t to the host {h_cache / GB:.1f} GB"
    # 5. credit
    if s.credit == "delta" and s.delta_impl == "memory_efficient":
        credit_dev = (
            base
            + kept
            + nograd(b4)
            + prompt_pass(prompts, False)
            + b4 * T * H * (c + 8)
            + N * T * DELTA_STREAM_BYTES_PER_TOKEN
            + fsdp_nograd
        )
        credit_what = f"DelTA memory_efficient: {s.delta_k + 3} no-grad passes of {_rows(b4)}"
    elif delta_normal:
        credit_dev = base + kept
        credit_what = f"DelTA normal: {DELTA_NORMAL_HOST_COPIES:g} × h cache {h_cache / GB:.1f} GB on the host"
    elif s.credit == "cscr":
        bc = min(s.micro_batch_size, N) if s.micro_batch_size else N
        Sc = S + CSCR_NOTE_TOKENS
        credit_dev = (
            base
            + kept
            + (nograd(bc, q=T + 1, kv=Sc) + bc * (Sc - T - 1) * kv_bpt if s.shared_prompt else nograd(bc, q=Sc, kv=Sc))
            + gathered
        )
        credit_what = f"CSCR: 2 no-grad passes of {_rows(bc)} × {Sc:,} tokens"
    else:
        credit_dev, credit_what = base + kept, "GRPO: none"
    # 6. update
    b6 = b4 if fuse else rows(mini)
    kept6 = N * kept_row(b4) if fuse else b6 * kept_row(b6)
    update_dev = (
        base + grads + kept6 + prompt_pass(min(prompts, mini), True) + backward_extra(b6) + fsdp_grad + opt_temp
    )
    update_what = (
        f"{'all ' + _rows(N) if fuse else _rows(b6)} × {S:,} tokens of activations"
        f"{' (checkpointed)' if s.gradient_checkpointing else ''}, gradients, AdamW"
    )
    if shared:
        update_what += ", shared prompt"

    host_base = host_batch + host_ref
    stages = [
        ("rollout", rollout_dev, host_base, rollout_what),
        ("θ_old pass", theta_dev, host_base + h_cache, theta_what),
        ("credit", credit_dev, host_base + DELTA_NORMAL_HOST_COPIES * h_cache, credit_what),
        ("update", update_dev, host_base, update_what),
    ]
    if not gpu:  # the CPU is the device: everything is on the host
        stages = [(a, d + h, 0.0, w) for a, d, h, w in stages]
    stages = [Stage(a, d / GB, h / GB, w) for a, d, h, w in stages]
    largest = max(x.device_gb for x in stages)
    reserve = CUDA_CONTEXT_GB + CUDA_ALLOCATOR_SLACK * min(largest, device_gb) if gpu else 0.0  # (the comment above)
    parts = {
        "parameters": n_params,
        "lora_parameters": n_lora,
        "trainable": trainable,
        "weights": weights,
        "gradients": grads,
        "adamw": adamw,
        "kv_per_token": kv_bpt,
        "row_tokens": S,
        "activation_row": kept_row(b6),
        "layer_row": layer(b6),
        "rows_per_micro_batch": b6,
        "update_activations": kept6 + prompt_pass(min(prompts, mini), True) + backward_extra(b6),
        "chunked_lm_head": chunked(b6),
        "compute_bytes": c,
        "weight_bytes": cw,
        "h_cache": h_cache,
        "host_batch": host_batch,
        **vllm,
        "fused": fuse,
        "shared_prompt": shared,
        "padding_free": padding_free,
    }
    problems = []
    if s.use_vllm and gpu and sequences is not None and sequences < 1:
        problems.append(
            f"vLLM's KV cache holds no sequence of {S:,} tokens at --vllm_gpu_memory_utilization {vllm['vllm_share']:g}"
        )
    host_need = max(x.host_gb for x in stages) * n  # torchrun: the node's processes share its host memory
    if gpu and host_gb is not None and host_need > host_gb:
        problems.append(f"host memory {host_need:.1f} GB of {host_gb:.1f} GB")
    return MemoryPlan(name, "GPU" if gpu else "CPU", n, device_gb, host_gb, stages, reserve, parts, problems)


def _ladder(s: Settings, gpu: bool) -> list:
    """The flags tried, in order, each with the settings it changes: with vLLM at a share given, one large enough for
    its KV cache to hold the sequences of a usable run; checkpointing, smaller micro-batches (the largest that fits,
    halving down to 1), vLLM (with sleep mode on a GPU), DelTA memory_efficient, LoRA: on a GPU over bf16 base
    weights (``--torch_dtype bfloat16`` where they were float32: TRL's and the papers' LoRA runs keep the frozen
    base in bf16, the adapters in float32; LoRA over a float32 base halves neither the weights nor vLLM's room)."""
    steps = [("vllm_util", None)] if s.use_vllm and gpu else []
    if not s.gradient_checkpointing:
        steps.append((["--gradient_checkpointing"], {"gradient_checkpointing": True}))
    steps.append(("micro_batch", None))
    if gpu and not (s.use_vllm and s.vllm_enable_sleep_mode):
        flags = ([] if s.use_vllm else ["--use_vllm"]) + ["--vllm_enable_sleep_mode"]
        steps.append((flags, {"use_vllm": True, "vllm_enable_sleep_mode": True}))
        if not s.use_vllm:  # vLLM just turned on: its share must hold one sequence too
            steps.append(("vllm_util", None))
    if s.credit == "delta" and s.delta_impl == "normal":
        steps.append((["--delta_impl memory_efficient"], {"delta_impl": "memory_efficient"}))
    if not s.use_peft and gpu and s.torch_dtype == "float32":
        steps.append((["--use_peft", "--torch_dtype bfloat16"], {"use_peft": True, "torch_dtype": "bfloat16"}))
    elif not s.use_peft:
        steps.append((["--use_peft"], {"use_peft": True}))
    return steps


def suggest(
    sh: Shapes,
    s: Settings,
    P: int,
    n: int,
    gpu: bool,
    device_gb: float,
    host_gb,
    name,
    min_sequences: int = MIN_VLLM_SEQUENCES,
) -> list:
    """Flag sets that make the run fit, each found by re-planning with them applied: the first prefix of the
    ladder (``_ladder``, applied cumulatively) that fits on ``n`` processes, and the fewest torchrun processes
    (2, 4, 8) that fit with the flags unchanged, else with the fewest ladder flags. On a GPU with vLLM, fitting
    includes a KV cache that holds ``min_sequences`` sequences at once (a usable run). Empty when nothing fits."""

    def fits(settings, procs):
        try:
            p = _plan(sh, settings, P, procs, gpu, device_gb, host_gb, name)
        except ValueError:
            return None
        few = gpu and settings.use_vllm and p.parts["vllm_sequences"] < min_sequences
        return p if p.fits and not few else None

    def climb(procs):  # the ladder, cumulatively; the first prefix that fits
        cur, flags = dataclasses.replace(s), []
        for step, change in _ladder(s, gpu):
            if step == "vllm_util":  # a share given: the smallest (in 0.05 steps) whose KV cache holds enough
                if (
                    cur.vllm_gpu_memory_utilization is None
                    or _plan(sh, cur, P, procs, gpu, device_gb, host_gb, name).parts["vllm_sequences"] >= min_sequences
                ):
                    continue  # (a share the plan sizes is sized again at every step)
                for k in range(1, 20):
                    tried = dataclasses.replace(cur, vllm_gpu_memory_utilization=round(0.05 * k, 2))
                    if (
                        _plan(sh, tried, P, procs, gpu, device_gb, host_gb, name).parts["vllm_sequences"]
                        >= min_sequences
                    ):
                        share = tried.vllm_gpu_memory_utilization
                        cur, flags = tried, flags + [f"--vllm_gpu_memory_utilization {share}"]
                        break
            elif step == "micro_batch":  # halve the rows per micro-batch the update has now
                size = _plan(sh, cur, P, procs, gpu, device_gb, host_gb, name).parts["rows_per_micro_batch"]
                tried = None
                while size > 1:
                    size = max(size // 2, 1)
                    tried = dataclasses.replace(cur, micro_batch_size=size)
                    if fits(tried, procs):
                        break
                if tried is None:
                    continue
                cur, flags = tried, flags + [f"--micro_batch_size {size}"]
            else:
                cur, flags = dataclasses.replace(cur, **change), flags + step
            p = fits(cur, procs)
            if p:
                return Suggestion(flags, procs, p.peak_gb, p.parts["vllm_sequences"])
        return None

    out = []
    here = climb(n)
    if here:
        out.append(here)
    for procs in (2, 4, 8):
        if procs <= n:
            continue
        try:
            p = fits(s, procs)
            more = (
                Suggestion([], procs, p.peak_gb, p.parts["vllm_sequences"]) if p else (None if here else climb(procs))
            )
        except ValueError:  # the prompts or mini-batches do not divide among that many processes
            continue
        if more:
            out.append(more)
            break
    return out
