"""The LM head a chunk of positions at a time: the scale path's answer to [b, T, V] logits (12.4 GB of float32 for one
20,480-token row at Qwen3's V = 151,936), and the per-position quantities of softmax(z/T) computed the same way.

* ``ChunkedLMHead``: log π(y) (and, without gradient, the entropy and a credit function's per-token statistics) from the
  LM head's inputs h, ``chunk`` positions at a time, its backward recomputing each chunk's logits;
* ``lm_head``: whether a model's logits are its head's output (softcap(h·Wᵀ)), checked once per model, else why not;
* ``entropy_from_logits`` and ``position_stats``: the entropy and per-token statistics of given logits, a few
  positions at a time (no full float32 copy).

The plain computation this replaces is grpo.py's ``token_outputs`` (logits, log-softmax at the temperature, gather);
tests/test_chunked_head.py ties the two in float64 (forward, backward, six architectures). Chosen by
``--chunked_lm_head`` (the scale recipes turn it on; trainer/scale_passes.py calls it). Imports torch only.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

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
        raise ValueError(f"chunked_head.entropy_from_logits: temperature must be > 0, got {temperature!r}")
    if not torch.is_tensor(logits) or logits.dim() < 1 or not logits.is_floating_point():
        raise ValueError("chunked_head.entropy_from_logits: logits must be a floating [..., V] tensor")
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


def position_stats(logits, temperature: float, functions) -> torch.Tensor:
    """Per-token statistics ``functions`` (each u = z/T ``[n, V]`` -> ``[n]``, e.g. OTB's Σ_v p_v²) of logits z
    ``[B, T, V]`` at ``temperature``: ``[B, T, len(functions)]`` (float32,
    float64 for float64 logits), no grad, ``_ENTROPY_CHUNK`` positions at a time (no full float32 copy)."""
    dt = torch.promote_types(logits.dtype, torch.float32)
    out = torch.empty(*logits.shape[:-1], len(functions), dtype=dt, device=logits.device)
    with torch.no_grad():
        for r in range(logits.shape[0]):
            for a in range(0, logits.shape[1], _ENTROPY_CHUNK):
                u = logits[r, a : a + _ENTROPY_CHUNK].detach().to(dt) / temperature
                out[r, a : a + _ENTROPY_CHUNK] = torch.stack([statistic(u) for statistic in functions], -1)
    return out


def log_softmax_at(u, targets):
    """(log softmax(u)_y ``[n]``, logsumexp(u) ``[n]``) of logits ``u`` ``[n, V]`` (already divided by the
    temperature) at the token ids ``targets`` ``[n]``: log p(y) = u_y − logsumexp(u)."""
    picked = u.gather(-1, targets[:, None]).squeeze(-1)  # before logsumexp: the backward's order and peak as before
    lse = torch.logsumexp(u, -1)
    return picked - lse, lse


def base_model(model):
    """The transformers model under a peft wrapper (the module FSDP2 shards last, as the root: distributed.py)."""
    return model.get_base_model() if hasattr(model, "get_base_model") else model


def model_body(model):
    """The model's body: the module whose output (the final norm's) is the LM head's input."""
    return base_model(model).get_decoder()


class LMHead(NamedTuple):
    """What ``ChunkedLMHead`` needs of a model: its body (whose output h is the head's input), its head (a bias-free
    ``nn.Linear`` W ``[V, H]``) and Gemma's ``final_logit_softcapping`` (None: none)."""

    body: torch.nn.Module
    head: torch.nn.Linear
    softcap: float | None


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
    base = base_model(model)
    key = (type(base), head.weight.dtype, model.config.to_json_string(use_diff=False))
    if key not in _HEAD_CHECKS:
        seen, was = {}, model.training

        def apply_head(module, args, output):  # the head as ChunkedLMHead applies it, inside the forward
            seen["ours"] = _scaled_logits(output[0][:, -2:], head.weight, softcap, None)

        handle = model_body(model).register_forward_hook(apply_head)
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
    return _HEAD_CHECKS[key] or LMHead(model_body(model), head, softcap)


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
    H ``[n]`` (no grad; None unless ``entropy``) and the statistics ``stats`` (functions of u = z/τ ``[c, V]`` ->
    ``[c]``) ``[n, len(stats)]`` (no grad; None without), float32 (float64 for a float64 head), equal to the
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
            logp[a : a + chunk], lse[a : a + chunk] = log_softmax_at(u, targets[a : a + chunk])
            if entropy:
                ent[a : a + chunk] = entropy_from_logits(u)  # u is z/τ already: temperature 1
            if stats:
                extra[a : a + chunk] = torch.stack([statistic(u) for statistic in stats], -1)
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
