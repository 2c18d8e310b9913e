"""The scale path: the policy's passes as the 8B run needs them, a whole replacement of grpo.py's plain ones
(``token_outputs``, ``micro_batches``, ``old_logprobs``), chosen once when a run starts (``forward``): by the
``delta_paper`` and ``delta_one_gpu`` recipes (any model but the toy) or by its flags, each of which turns on one
optimisation and leaves every number as the plain path's to rounding (float64 tests: tests/test_scale.py,
tests/test_credit_e2e.py, tests/test_architectures.py, tests/test_chunked_head.py):

* ``--padding_free``: micro-batches of rows of similar length, each cut to its own longest prompt and response
  (``micro_batches``: ``PADDING_FREE_BUCKETS`` of them when ``--micro_batch_size`` is 0);
* ``--shared_prompt``: each distinct prompt run once, its keys and values read by its G responses (``SharedPrompts``);
* ``--chunked_lm_head``: the LM head a chunk of positions at a time, never a micro-batch's [b, T, V] logits
  (trainer/chunked_head.py), above ``LOGITS_CHUNK_BYTES`` of them;
* ``--fuse_old_logprobs``: with one update per rollout batch, θ_old's pass is the update's own training forward, kept
  and reused (``old_logprobs``; memory_plan.updates_on_policy says when).

Where the model lacks a feature an optimisation relies on, it turns itself off with one logged line
(``exact_optimisations``). Imports torch and trainer/ (policy's types, chunked_head, distributed).
"""

from __future__ import annotations

import contextlib
import functools
import inspect
from typing import NamedTuple

import torch

from trainer import chunked_head, distributed, policy
from trainer.grpo_config import PADDING_FREE_BUCKETS

# The LM head in chunks of positions (--chunked_lm_head; off: never): a micro-batch whose b·T response positions hold
# more than this many bytes of float32 logits (b·T·V·4) goes through the head LOGITS_CHUNK_BYTES // (V·4) positions at a
# time (441 at Qwen3's V = 151,936), never holding its [b, T, V] logits (12.4 GB for one 20,480-token row); one that
# fits runs the model's own head over all its positions at once, as before. Tests set it smaller to force several
# chunks.
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
        model, input_ids, attention_mask, response_mask, temperature, policy.Asked(), shared, chunk_bytes
    ).logp


def token_outputs(
    model,
    input_ids,
    attention_mask,
    response_mask,
    temperature=1.0,
    asked=policy.Asked(),
    shared=None,
    chunk_bytes=None,
) -> policy.TokenOutputs:
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
    return policy.TokenOutputs(
        logp.view(B, T) * mask,
        captured["h"] if asked.hidden else None,
        entropy.view(B, T) * mask if asked.entropy else None,
        {name: extra[..., k] * mask for k, name in enumerate(asked.token_stats)} if asked.token_stats else None,
        logits if asked.logits else None,
    )


class ChunkedHead(NamedTuple):
    """How ``token_outputs`` runs a chunked LM head: a ``chunked_head.LMHead`` and its chunk (positions)."""

    lm_head: chunked_head.LMHead
    chunk: int


def _chunked_head(model, positions: int, asked: policy.Asked, chunk_bytes) -> ChunkedHead | None:
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
    head = chunked_head.lm_head(model)
    return None if isinstance(head, str) else ChunkedHead(head, max(1, budget // position_bytes))


@contextlib.contextmanager
def _body_outputs(model, head: ChunkedHead | None, targets, temperature: float, asked: policy.Asked):
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
            captured["head"] = chunked_head.ChunkedLMHead.apply(
                h.reshape(-1, h.shape[-1]),
                head.lm_head.head.weight,
                targets.reshape(-1),
                temperature,
                head.lm_head.softcap,
                head.chunk,
                asked.entropy,
                tuple(asked.token_stats.values()) if asked.token_stats else (),
            )

    if asked.hidden or head is not None:
        hooks.append(
            (head.lm_head.body if head is not None else chunked_head.model_body(model)).register_forward_hook(from_body)
        )
    if head is not None:  # the model returns (its output, (log p, H)), also to the hooks after this one: FSDP2's
        # post-forward, which on what the model returns registers the head weight's re-gathering for the backward
        hooks.append(
            chunked_head.base_model(model).register_forward_hook(
                lambda m, a, out: (out, captured.pop("head")), prepend=True
            )
        )
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


def _from_logits(logits, targets, temperature: float, asked: policy.Asked) -> tuple:
    """(log p ``[B, T]``, H ``[B, T]`` or None, the statistics ``[B, T, S]`` or None) of the logits z ``[B, T, V]`` at
    y ``targets`` ``[B, T]``, of softmax(z/T), in float32 (float64 for a float64 model)."""
    dt = torch.promote_types(logits.dtype, torch.float32)
    # log p one row at a time keeps the float32 copy small (V can be 152k); H and the statistics take a few positions
    # at a time, no [T, V] copy
    logp = torch.stack(
        [chunked_head.log_softmax_at(logits[i].to(dt) / temperature, targets[i])[0] for i in range(len(logits))]
    )
    entropy = chunked_head.entropy_from_logits(logits, temperature) if asked.entropy else None
    functions = tuple(asked.token_stats.values()) if asked.token_stats else ()
    extra = chunked_head.position_stats(logits, temperature, functions) if functions else None
    return logp, entropy, extra


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


class Passes:
    """The scale path's forward passes of ``model`` over the rows ``rows`` of a rollout batch, one micro-batch at a
    time (grpo.py's ``micro_batches`` with the flags' optimisations): θ_old's pass, DelTA's streamed passes, the update.

    Iterating yields ``policy.MicroBatch``es laid out as the flags say: ``--micro_batch_size`` rows each (0: all),
    ``--padding_free`` (rows of similar length, each micro-batch cut to its own longest prompt and response; its
    ``take`` picks its part of any ``[N, T]`` tensor), ``--shared_prompt`` (each distinct prompt run once, its keys
    and values read by its responses: under ``grad``, once the caller has run every micro-batch's backward and asks
    for the next, the prompt pass gets its share of the gradient), ``--chunked_lm_head``. ``grad``: train mode with
    gradient, else eval mode, no gradient. ``asked``: what else each forward returns (a ``policy.Asked``).
    ``keep_graphs``: the micro-batches are kept and a second iteration yields them again without running the model
    (stage 4's training forward, reused by stage 6's only update). ``batch``: a ``rollout.RolloutBatch`` on any device
    (each micro-batch goes to the model's).
    """

    def __init__(self, model, batch, rows, cfg, *, grad: bool, keep_graphs=False, asked=policy.Asked()):
        self.model = model
        self.batch = batch
        self.rows = rows
        self.cfg = cfg
        self.grad = grad
        self.keep_graphs = keep_graphs
        self.asked = asked
        self.kept = None
        self.shared = None
        self.chunk_bytes = None if cfg.chunked_lm_head else 0  # 0: the model's own head, a micro-batch at once
        # the micro-batches as (rows, input columns, response width T_j), planned once for every pass
        self.layout = micro_batches(
            rows, batch.attention_mask, cfg.micro_batch_size, batch.response_mask.shape[1], cfg.padding_free
        )

    def __iter__(self):
        if self.kept is not None:
            yield from self.kept
            self.backward_prompts()
            return
        kept = []
        for j, cols, t in self.layout:
            mb = self.forward(j, cols, t)
            if self.keep_graphs:  # the graph, not h: stage 4's kept h_t live on the host (old_logprobs)
                kept.append(mb._replace(hidden=None))
            yield mb
        self.kept = kept if self.keep_graphs else None
        if self.grad and not self.keep_graphs:
            self.backward_prompts()

    def forward(self, rows, cols, t) -> policy.MicroBatch:
        """One micro-batch's forward (rows ``rows``, input columns ``cols``, response width ``t``)."""
        b = self.batch
        self.model.train(self.grad)
        with torch.set_grad_enabled(self.grad):  # not around the yield: the caller's code keeps its own mode
            if self.shared is None and self.cfg.shared_prompt:
                self.shared = SharedPrompts(
                    self.model, b.input_ids, b.attention_mask, self.rows, b.response_mask.shape[1]
                )
            shared = (self.shared, rows) if self.cfg.shared_prompt else None
            inputs = micro_batch_inputs(b, rows, cols, t, next(self.model.parameters()).device)
            out = token_outputs(self.model, *inputs, self.cfg.temperature, self.asked, shared, self.chunk_bytes)
        return policy.MicroBatch(rows, t, out.logp, out.hidden, out.entropy, out.token_stats, len(self.layout))

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
    """Turn off each optimisation of ``OPTIMISATIONS`` (a flag of ``cfg``) that ``model`` lacks a feature for, and
    ``--chunked_lm_head`` where the model's logits are not its head's output (``chunked_head.lm_head``'s check, made
    here once, by every process together under torchrun), with one logged line each; returns {flag: "on" | "off:
    <reason>"} for config.json."""
    missing = model_features(model, cfg)
    out = {}
    for flag, needs in OPTIMISATIONS.items():
        reasons = [f"{feature}: {missing[feature]}" for feature in needs if missing[feature]]
        if getattr(cfg, flag) and reasons:
            setattr(cfg, flag, False)
            say(f"[exact] --{flag} off: it needs {'; '.join(reasons)}")
        out[flag] = "on" if getattr(cfg, flag) else f"off: {'; '.join(reasons) or 'the flag'}"
    head = chunked_head.lm_head(model) if cfg.chunked_lm_head else None
    if isinstance(head, str):
        cfg.chunked_lm_head = False
        say(f"[exact] --chunked_lm_head off: {head}")
    out["chunked_lm_head"] = "on" if cfg.chunked_lm_head else f"off: {head or 'the flag'}"
    return out


def has_dropout(model) -> bool:
    """Whether a training-mode forward of ``model`` differs from an eval-mode one: an ``nn.Dropout`` with p > 0
    (e.g. LoRA's) or attention dropout in the config (applied inside the attention kernel)."""
    p_attn = getattr(getattr(model, "config", None), "attention_dropout", 0.0) or 0.0
    return p_attn > 0 or any(isinstance(m, torch.nn.Dropout) and m.p > 0 for m in model.modules())


def old_logprobs(model, batch, cfg, asked=policy.Asked(), ref_model=None, training_forward=False) -> policy.ThetaOld:
    """grpo.py's ``old_logprobs`` on the scale path: θ_old's log-probs ``[N, T]`` (and what ``asked`` names: h_t
    ``[N, T, H]``, per-token statistics ``[N, T]``) from a no-grad, eval-mode ``Passes`` over the batch, the
    reference's log-probs when ``ref_model`` is given. ``training_forward`` (--fuse_old_logprobs, when one update uses
    the batch: memory_plan.updates_on_policy): the training forward instead (train mode, with grad; TRL's choice when
    μ = 1), kept in the ``ThetaOld`` for the update to reuse. Every process runs as many micro-batches (FSDP's
    gathers). The same numbers as the plain pass (float64, 1e-10 relative: tests/test_credit_e2e.py)."""
    N, T = batch.response_mask.shape
    dt = torch.promote_types(next(model.parameters()).dtype, torch.float32)  # float32 (float64 for a float64 model)
    logp = torch.zeros(N, T, dtype=dt)
    hidden = None  # [N, T, H] once the first micro-batch says H
    stats = {name: torch.zeros(N, T, dtype=dt) for name in asked.token_stats or {}}
    passes = Passes(
        model, batch, torch.arange(N), cfg, grad=training_forward, keep_graphs=training_forward, asked=asked
    )
    for mb in passes:
        logp[mb.rows, : mb.t] = mb.logp.detach().cpu()
        for name in stats:
            stats[name][mb.rows, : mb.t] = mb.token_stats[name].to(dt).cpu()
        if asked.hidden:  # h_t on the host, bounded (policy.ThetaOld)
            if hidden is None:
                hidden = torch.zeros(N, T, mb.hidden.shape[-1], dtype=dt)
            hidden[mb.rows, : mb.t] = mb.hidden.to(dt).cpu()
    ref_logp = reference_logprobs(ref_model, batch, passes.layout, cfg.temperature) if ref_model else None
    return policy.ThetaOld(logp, hidden, ref_logp, stats, passes if training_forward else None)


def micro_batch_passes(model, batch, rows, cfg, grad: bool, asked=policy.Asked()) -> Passes:
    """grpo.py's ``micro_batches`` on the scale path: a ``Passes`` over ``rows``."""
    return Passes(model, batch, rows, cfg, grad=grad, asked=asked)


def scoring_logprobs(shared_prompt: bool, chunk_bytes, model, input_ids, attention_mask, loss_mask, temperature=1.0):
    """CSCR's scoring passes on the scale path (cscr.condition_logprobs' ``logprob_fn``, bound to the first two
    arguments): ``token_logprobs`` of every row, with each distinct prompt run once (``SharedPrompts``) under
    --shared_prompt, the LM head in chunks under --chunked_lm_head."""
    if not shared_prompt:
        return token_logprobs(model, input_ids, attention_mask, loss_mask, temperature, chunk_bytes=chunk_bytes)
    rows = torch.arange(len(input_ids))
    shared = SharedPrompts(model, input_ids, attention_mask, rows, loss_mask.shape[1])
    return token_logprobs(model, input_ids, attention_mask, loss_mask, temperature, (shared, rows), chunk_bytes)


FLAGS = ("padding_free", "shared_prompt", "chunked_lm_head")  # the scale path's (--fuse_old_logprobs: either path's)


def chosen(cfg) -> bool:
    """Whether the run takes the scale path: any of its three flags on (the plain path: all off, the toy's default)."""
    return any(getattr(cfg, flag) for flag in FLAGS)


def paths(cfg, fused: bool) -> list[str]:
    """Which path each stage of a step takes under ``cfg``, one line each (--dry_run prints them); ``fused``: stage 4
    takes the update's own forward (the plan's memory_plan.updates_on_policy, as run_setup.step_parts chooses)."""
    if chosen(cfg):
        on = ", ".join(f"--{flag}" for flag in FLAGS if getattr(cfg, flag))
        passes = f"the scale path (trainer/scale_passes.py: {on})"
    else:
        passes = "the plain path (grpo.py: padded micro-batches, log-softmax at the temperature, gather)"
    if fused:
        old = passes + ", from the update's own forward, detached (--fuse_old_logprobs: one update of one micro-batch)"
    elif cfg.fuse_old_logprobs:  # on, where it does not apply (memory_plan.updates_on_policy)
        old = passes + ", its own no-grad forward (--fuse_old_logprobs: only for one update of one micro-batch, β = 0)"
    else:
        old = passes + ", its own no-grad forward (--no-fuse_old_logprobs)"
    streamed = cfg.delta_impl == "memory_efficient"
    delta = "streamed, h recomputed a micro-batch at a time" if streamed else "the whole batch at once (h kept)"
    return [f"stage 4, θ_old: {old}", f"stage 5, DelTA: {delta}", f"stage 6, update: {passes}"]


def forward(cfg, fuse_old: bool) -> policy.Forward:
    """The scale path's passes for grpo.py's stages 4-6, chosen once (``fuse_old``: stage 4 takes the training
    forward, memory_plan.updates_on_policy)."""
    chunk_bytes = None if cfg.chunked_lm_head else 0
    return policy.Forward(
        functools.partial(old_logprobs, training_forward=fuse_old),
        micro_batch_passes,
        functools.partial(scoring_logprobs, cfg.shared_prompt, chunk_bytes),
    )
