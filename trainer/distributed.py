"""Many processes: torchrun + FSDP2 for grpo.py. With one process every function here is a no-op or the identity.

What it holds, and why it is not in grpo.py: the trainer's maths does not change with the number of processes.
Each process samples and scores whole groups; three things cross processes, each behind one call here:

* sums: the loss normalisers (token and sequence counts), DelTA's sufficient statistics and the logged statistics
  are summed with ``all_reduce_sum``; lists of Python objects (rewards, lengths) are pooled with
  ``all_gather_objects``;
* weights: ``shard_model`` shards every decoder layer with FSDP2 (``fully_shard``) and sums, not averages, the
  gradients: each process's loss is already divided by the global normaliser, so the sum is the single-process
  gradient of the whole batch (trl PR #3231; verl multiplies by dp_size instead);
* full weights for a while: ``gathered_weights`` (sampling, CSCR's scoring passes); full state dicts for
  checkpoints and ``final/``: ``gathered_model_state`` (the model's), ``full_optimizer_state`` and
  ``load_full_optimizer_state`` (AdamW's, saved by N processes and resumed by M).

Left out on purpose: tensor/sequence/pipeline parallelism, HSDP, CPU offload of parameters, and a separate
inference cluster (vLLM runs colocated, one engine per process, see rollout.py). Read next: checkpoint.py.
"""

from __future__ import annotations

import contextlib
import gc
import os

import torch
import torch.distributed as dist


def init_distributed() -> tuple[int, int]:
    """Join the process group ``torchrun`` describes in the environment; returns (rank, world_size).

    Without torchrun (no ``WORLD_SIZE``, or 1) nothing happens: (0, 1). Otherwise the backend is NCCL on GPUs
    (process ``LOCAL_RANK`` takes GPU ``LOCAL_RANK``) and gloo on the CPU. Calling it again is harmless.
    """
    if int(os.environ.get("WORLD_SIZE", "1")) <= 1:
        return 0, 1
    if not dist.is_initialized():
        if torch.cuda.is_available():
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
    return dist.get_rank(), dist.get_world_size()


def close() -> None:
    """Leave the process group, if one was joined.

    A known exit race, in torch's gloo backend (torch issue #117762; gloo has no call that joins its worker
    threads): a worker drops its last reference to a finished collective a moment after the waiting thread wakes. If
    that reference is the last one to a tensor Python has let go of (an all-gather's output, FSDP2's or
    ``full_tensor``'s), dropping it takes the GIL, and if the interpreter is shutting down by then, the process
    aborts ("terminate called without an active exception") after all its work is done. The trainer's last
    collective is ``RunFolder.finish``'s barrier, whose work holds no tensor, reached after process 0 has written
    final/: the all-gathers before it ended long before the process does. A script that ends right after an
    all-gather (as the mixed-precision driver in tests/test_distributed.py does) should not rely on interpreter
    shutdown; that driver leaves with ``os._exit``. No barrier here: a process that failed alone would wait in it
    until the timeout instead of exiting. Objects the trainer left (--use_vllm's engine) are freed first: vLLM's
    shutdown touches the process group.
    """
    gc.collect()
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def rank_from_env() -> int:
    """This process's rank as torchrun set it (also before or after the process group exists)."""
    return int(os.environ.get("RANK", "0"))


def is_distributed() -> bool:
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def rank() -> int:
    return dist.get_rank() if is_distributed() else 0


def world_size() -> int:
    return dist.get_world_size() if is_distributed() else 1


def barrier() -> None:
    if is_distributed():
        dist.barrier()


def all_reduce_sum(t: torch.Tensor) -> torch.Tensor:
    """Σ over processes of ``t``, as a new tensor on ``t``'s device (``t`` itself with one process).

    NCCL reduces GPU tensors only and gloo CPU tensors only: ``t`` is copied to the backend's device and back.
    """
    if not is_distributed():
        return t
    comm = t.to("cuda" if dist.get_backend() == "nccl" else "cpu", copy=True)
    dist.all_reduce(comm)
    return comm.to(t.device)


def all_gather_objects(obj) -> list:
    """``[obj of process 0, obj of process 1, ...]`` (picklable objects); ``[obj]`` with one process."""
    if not is_distributed():
        return [obj]
    out = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out


def pool_min_max(stats: dict) -> dict:
    """Replace every ``*_min`` / ``*_max`` value of ``stats`` by its minimum / maximum over processes (NaN, i.e.
    nothing on that process, is skipped). Sums are pooled with ``all_reduce_sum``; extremes need this."""
    if not is_distributed():
        return stats
    import math

    for key in [k for k in stats if k.endswith(("_min", "_max"))]:
        values = [v for v in all_gather_objects(stats[key]) if math.isfinite(v)]
        stats[key] = (min if key.endswith("_min") else max)(values) if values else float("nan")
    return stats


def shard_model(model, compute_dtype: torch.dtype | None = None):
    """FSDP2: shard each decoder layer, then the rest (embeddings, final norm, LM head), across the processes.

    Each process keeps 1/world_size of every weight, gradient and AdamW moment; a layer's full weights are gathered
    just before its forward and backward and freed after. Full fine-tuning and LoRA alike (the frozen base weights
    are sharded too; only the adapters get gradients and optimizer state). Gradients are *summed* over processes
    (see the module header). Call it before building the optimizer.

    ``compute_dtype`` (e.g. bfloat16 for float32 weights): FSDP2's mixed precision: the stored shards, gradients
    and AdamW state stay in the weights' dtype (float32 master weights, so small updates are not rounded away),
    the gathered weights used by forward and backward are cast to ``compute_dtype``, gradients are reduced in
    float32. grpo.py uses it for ``--torch_dtype float32`` on GPUs.
    """
    from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard

    mp = (
        {}
        if compute_dtype is None
        else {"mp_policy": MixedPrecisionPolicy(param_dtype=compute_dtype, reduce_dtype=torch.float32)}
    )
    # the decoder-layer classes: transformers lists them in _no_split_modules (e.g. Qwen3DecoderLayer)
    names = set()
    for m in model.modules():
        names |= set(getattr(m, "_no_split_modules", None) or [])
    for m in [m for m in model.modules() if type(m).__name__ in names]:
        fully_shard(m, **mp)
    # the root is the transformers model: a peft wrapper's generate() calls it directly, bypassing the wrapper
    fully_shard(model.get_base_model() if hasattr(model, "get_base_model") else model, **mp)
    for m in model.modules():
        if isinstance(m, FSDPModule):
            m.set_gradient_divide_factor(1.0)  # sum, not mean (see above)
            m.set_force_sum_reduction_for_comms(True)  # plain SUM (gloo has no pre-multiplied sum)
    return model


@contextlib.contextmanager
def gathered_weights(model):
    """Sampling and no-grad scoring under FSDP2: gather every sharded weight once, run any number of forward passes
    with no communication, then free the full weights (a no-op without FSDP).

    Why: with FSDP every layer's forward is a collective, so all processes would have to run exactly the same
    forward passes, but generation stops at different lengths on different processes and CSCR scores only the
    responses with a non-zero advantage. Cost: one full copy of the weights per process while it lasts (as the
    inference engine of TRL's or verl's colocated mode holds). Every process must enter it.
    """
    from torch.distributed.fsdp import FSDPModule

    mods = [m for m in model.modules() if isinstance(m, FSDPModule)]
    for m in mods:
        m.unshard()
        m.set_reshard_after_forward(False, recurse=False)
    try:
        yield
    finally:
        for m in mods:
            m.reshard()
            m.set_reshard_after_forward(True, recurse=False)


def full_weight(weight: torch.Tensor) -> torch.Tensor:
    """A parameter's whole value, detached: FSDP2's shard gathered (a collective: every process must call it), or the
    parameter itself without FSDP."""
    from torch.distributed.tensor import DTensor

    return (weight.full_tensor() if isinstance(weight, DTensor) else weight).detach()


def gathered_model_state(model) -> dict | None:
    """The model's full (unsharded) state dict on process 0's CPU ({} on the others); None with one process (then
    ``save_pretrained`` reads the model itself). Under FSDP2 every process must call it."""
    if not is_distributed():
        return None
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))


def full_optimizer_state(model, optimizer) -> dict:
    """The optimizer's state dict with full, unsharded CPU tensors, keyed by parameter name (torch's
    distributed-checkpoint format, the same with one process and with FSDP2, so a checkpoint written by N
    processes resumes in M). Under FSDP2 every process must call it."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

    many = is_distributed()
    return get_optimizer_state_dict(model, optimizer, options=StateDictOptions(full_state_dict=True, cpu_offload=many))


def load_full_optimizer_state(model, optimizer, osd: dict) -> None:
    """Load ``full_optimizer_state``'s dict (read by process 0 only under FSDP2; the others pass {}): every process
    keeps its own shard."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

    set_optimizer_state_dict(
        model, optimizer, osd, options=StateDictOptions(full_state_dict=True, broadcast_from_rank0=is_distributed())
    )
    for group in optimizer.param_groups:  # the state-dict round trip turns AdamW's betas tuple into a list
        if isinstance(group.get("betas"), list):
            group["betas"] = tuple(group["betas"])
