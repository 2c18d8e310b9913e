"""CSCR: Counterfactual Sensitivity Credit Reallocation (a GRPO extension).

Paper: He, Wu, Wang, "Not All Tokens Deserve Equal Credit: Counterfactual Sensitivity Credit
Reallocation for Long-CoT Reasoning", arXiv 2607.27888 (2026).  Implementation spec:
``shared/specs/cscr.md`` (cited below as "spec §N").  The paper's full text was NOT available when this
file was written: only its abstract [S] and digests of the full PDF [S2].  Its section numbers are
therefore unknown; comments name the part of the paper (abstract / method / diagnostics / ablations)
and the spec section that describes it.

What CSCR does (abstract [S], spec §1, §4, §5)
----------------------------------------------
Keep every sampled trajectory fixed and re-score it, with the same weights, under two privileged prompts
of opposite polarity: ``c+`` asserts that the response is correct, ``c-`` that it is incorrect.  Per token
(spec §4)::

    l0_t = log pi(y_t | x,      y_<t)          (the plain old-log-prob pass the trainer already runs)
    l+_t = log pi(y_t | x + c+, y_<t)          l-_t = log pi(y_t | x + c-, y_<t)
    D+_t = l+_t - l0_t ,   D-_t = l-_t - l0_t
    s_t  = max(|D+_t|, |D-_t|)                 counterfactual sensitivity, nats

Highly sensitive tokens lose credit, which is renormalised within each sequence so that the verifier's
sign and the credit budget stay unchanged (spec §5)::

    w_t     = max(w_min, exp(-alpha * max(0, s_t - threshold)))
    w_bar_i = (1/L_i) sum_t m_t w_t
    A_i,t   = A_i * (w_t / w_bar_i) * m_t      =>  sign(A_i,t) = sign(A_i),  sum_t A_i,t = L_i * A_i

The loss is the usual clipped GRPO surrogate with these token advantages (spec §6); this file only
produces the advantages.  ``s``, ``w`` and the advantages are constants (no gradient).

Every inferred choice [I] and the option that switches it
---------------------------------------------------------
Sourced facts are marked [S] (abstract) / [S2] (full-PDF digest).  Everything else is our reading,
exposed as an option whose default is the spec's primary reading:

==== ======================================================== ==================================== =========================
 #   inferred choice                                           option (function)                    default
==== ======================================================== ==================================== =========================
 1   wording of the two privileged notes (spec §3)             ``template`` (build_condition_       ``"verdict"`` (variant A);
                                                               prompts); also a (c+, c-) tuple      ``"reference"`` = B,
                                                               of custom note strings               ``"answer"`` = C
 2   where the note goes in the templated prompt (spec §3)     ``marker``, ``turn_end``,            end of the last user turn,
                                                               ``anchor`` (build_condition_         i.e. before the
                                                               prompts)                             ``<|im_end|>`` preceding
                                                                                                    the last
                                                                                                    ``<|im_start|>assistant``
 3   how conditioned prompts are tokenised                     ``add_special_tokens``               ``False`` (templated text)
                                                               (condition_logprobs)
 4   scorer = the rollout policy, same weights, eval mode      ``eval_mode`` (condition_logprobs)   ``True``
     (spec §4)
 5   log-probs at the sampling temperature                     ``temperature``                      ``1.0``
 6   sampled-token log-ratio (not full-vocab KL) and the       ``mode`` (sensitivity,               ``"max"`` ([S2] "maximum of
     aggregation of D+ and D- (spec §4)                        cscr_token_advantages)               the shifts"); ``"mean"``,
                                                                                                    ``"common"``
 7   exact weight map (spec §5; [S2]: exponential above a      ``weight`` (credit_weights,          ``"exp"``:
     threshold, full weight below)                             cscr_token_advantages)               exp(-a*max(0, s-thr));
                                                                                                    ``"exp_abs"``:
                                                                                                    exp(-a*s) above thr;
                                                                                                    ``"inverse"``:
                                                                                                    1/(1+a*max(0, s-thr))
 8   decay strength alpha (spec §5)                            ``alpha``                            ``1.0``
 9   threshold lambda in nats (spec §5)                        ``threshold``; or                    ``0.2``; calibration
                                                               ``calibrate_threshold(quantile)``    quantile ``0.8``
 10  weight floor (spec §5 suggests 0.1 for safety)            ``w_min``                            ``0.0`` (the §8 example)
 11  renormalisation scope ([S2]: within each sequence)        ``scope``, ``group_size``            ``"sequence"``; ablations
                                                                                                    ``"group"``, ``"batch"``
 12  w/w_bar is computed scale-free (log-weights shifted by     (no option: exact, no eps)           -
     the row maximum), so underflowing weights keep the budget
 13  "affected token" threshold for D1-D3 (spec §7, §11)       ``tau`` (diagnostics)                ``0.05`` nats
 14  top-k fraction for D4b (spec §7)                          ``top_frac`` / ``top_k``             ``0.1``
 15  "most sensitive" fraction for D6 (spec §7)                ``sens_top_frac``                    ``0.05``
 16  surface-form vs content heuristic for D6 (spec §7)        ``classify_token``,                  see classify_token
                                                               ``DISCOURSE_MARKERS``,
                                                               ``FUNCTION_WORDS``
 17  D3: a zero differential D+ - D- counts as inconsistent    (documented, no option)              -
 18  D4c: forward-KL gradient g = p0 - p (OPSD) per position   ``full_vocab_overlap``               cosine, KL(p+|p0),
                                                                                                    KL(p-|p0)
 19  CLI: responses keep their EOS token; problems are         ``diagnose`` arguments               see diagnose
     shuffled (seed) and cycled; template C's answer =
     last \\boxed{...} (else last number)
==== ======================================================== ==================================== =========================

Conventions (shared with the rest of the project): ``response_mask`` [B, T] bool or float (0/1),
sequence advantages [B] float, token advantages [B, T], log-probs in nats, responses right-padded, groups
contiguous.  The library part imports only torch (and the standard library); the CLI (``diagnose``,
``main``) imports transformers and the project's ``verify`` / ``toy`` lazily.
"""

from __future__ import annotations

import inspect
import json
import math
import os
import re

import torch

__all__ = [
    "CONDITION_TEMPLATES",
    "DEFAULT_MARKER",
    "DEFAULT_TURN_END",
    "build_condition_prompts",
    "default_logprob_fn",
    "condition_logprobs",
    "sensitivity",
    "credit_weights",
    "cscr_token_advantages",
    "calibrate_threshold",
    "shift_masks",
    "pearson",
    "spearman",
    "full_vocab_overlap",
    "classify_token",
    "diagnostics",
    "diagnose",
    "main",
]

# ---------------------------------------------------------------------------------------------------
# Spec §3: privileged contexts (the two outcome conditions)
# ---------------------------------------------------------------------------------------------------

# [I] Wording is ours (no template text was available).  Each pair is a minimal pair: the two strings
# differ only in the verdict word(s), so whatever is common to "being handed privileged outcome
# information" cancels when the two conditions are compared (spec §3).  Placeholders: {reference}
# (the gold answer) and {answer} (this response's own extracted answer); they are substituted with
# str.replace, so LaTeX braces in the values (or elsewhere in a custom note) need no escaping.
_VERIFIER_LINE = "Note: a verifier has already checked the response that follows."
CONDITION_TEMPLATES = {
    # Variant A (primary): assert correctness / incorrectness of this response (spec §3, table row A).
    "verdict": (
        _VERIFIER_LINE + "\nVerdict: the final answer of this response is CORRECT.",
        _VERIFIER_LINE + "\nVerdict: the final answer of this response is INCORRECT.",
    ),
    # Variant B: OPSD-style reference block with the gold answer, plus the same verdict (spec §3, row B).
    "reference": (
        "Here is the reference answer to this problem.\nCorrect final answer: {reference}\n\n"
        + _VERIFIER_LINE + "\nVerdict: the final answer of this response is CORRECT.",
        "Here is the reference answer to this problem.\nCorrect final answer: {reference}\n\n"
        + _VERIFIER_LINE + "\nVerdict: the final answer of this response is INCORRECT.",
    ),
    # Variant C: assert that this response's own answer is / is not the correct final answer, in OPSD's
    # "reference answer" phrasing (spec §3, row C), written as a minimal pair (" not ").
    "answer": (
        _VERIFIER_LINE + "\nVerdict: {answer} is the correct final answer.",
        _VERIFIER_LINE + "\nVerdict: {answer} is not the correct final answer.",
    ),
    # Variant A without the verifier sentence: the same minimal pair at a quarter of the length. Not from the
    # paper; it makes the two extra scoring passes cheap when the tokenizer is character level (the toy).
    "verdict_short": ("Verdict: CORRECT.", "Verdict: INCORRECT."),
}
_TEMPLATE_ALIASES = {"A": "verdict", "B": "reference", "C": "answer"}

DEFAULT_MARKER = "<|im_start|>assistant"  # ChatML (Qwen) assistant header
DEFAULT_TURN_END = "<|im_end|>"  # ChatML end-of-turn token


def _resolve_template(template):
    if isinstance(template, str):
        name = _TEMPLATE_ALIASES.get(template, template)
        if name not in CONDITION_TEMPLATES:
            raise ValueError(
                f"template must be one of {sorted(CONDITION_TEMPLATES)} (or A/B/C) or a (note_correct, "
                f"note_incorrect) tuple of strings, got {template!r}"
            )
        return name, CONDITION_TEMPLATES[name]
    if (
        isinstance(template, (tuple, list))
        and len(template) == 2
        and all(isinstance(t, str) and t for t in template)
    ):
        return "custom", (template[0], template[1])
    raise ValueError(
        "template must be a template name or a (note_correct, note_incorrect) tuple of non-empty strings, "
        f"got {template!r}"
    )


def _insert_note(prompt, note, marker, turn_end, anchor):
    """Insert ``note`` into ``prompt`` so that the prompt's ending is unchanged (see build_condition_prompts)."""
    if anchor is not None:
        i = prompt.rfind(anchor)
        if i < 0:
            raise ValueError(f"anchor {anchor!r} does not occur in prompt")
        j = i + len(anchor)
        return prompt[:j] + "\n\n" + note + prompt[j:]
    p = prompt.rfind(marker) if marker else -1
    if p >= 0:
        # Chat-templated prompt: the note ends the last user turn, i.e. goes right before the end-of-turn
        # token that precedes the final assistant header; everything from there on (end of turn, assistant
        # header, e.g. an empty <think></think> block) is kept byte for byte.
        q = prompt.rfind(turn_end, 0, p) if turn_end else -1
        if q >= 0:
            return prompt[:q] + "\n\n" + note + prompt[q:]
        # No end-of-turn token before the header: the note goes right before the header on its own lines.
        return prompt[:p] + note + "\n\n" + prompt[p:]
    # Plain-text prompt (e.g. the toy "Compute 37+48-12.\n"): split off its ending = the trailing
    # whitespace if there is any, else the whole last line, and put the note as its own line before it.
    body = prompt.rstrip()
    if len(body) < len(prompt):
        return body + "\n" + note + prompt[len(body):]
    nl = prompt.rfind("\n")
    return prompt[: nl + 1] + note + "\n" + prompt[nl + 1 :]


def build_condition_prompts(
    prompt,
    reference=None,
    response_answer=None,
    template="verdict",
    *,
    marker=DEFAULT_MARKER,
    turn_end=DEFAULT_TURN_END,
    anchor=None,
):
    """Build the two privileged prompts ``(x + c+, x + c-)`` for one rollout prompt.

    Source: abstract [S] (re-score each fixed trajectory under a context asserting it is correct and one
    asserting it is incorrect); [S2] "counterfactual privileged prompts of opposite polarity"; spec §3
    (wording and placement are inferred [I]).

    The two returned strings are a minimal pair: they differ only in the verdict word(s) ("CORRECT" vs
    "INCORRECT" for A/B, "is" vs "is not" for C).  The response token ids are reused unchanged, so the
    note is inserted such that each prompt ends exactly as ``prompt`` ends.  Insertion rule, first match:

    1. ``anchor`` given: the note goes right after the last occurrence of ``anchor`` (e.g. pass the raw
       problem text to place it between the problem and the answer-format instruction, the spec §3 layout),
       as ``"\\n\\n" + note``; ValueError if ``anchor`` does not occur.
    2. ``marker`` (default ``"<|im_start|>assistant"``) occurs: the note ends the last user turn; it is
       inserted as ``"\\n\\n" + note`` right before the last ``turn_end`` (default ``"<|im_end|>"``) that
       precedes the last ``marker``.  If there is no such ``turn_end``, it is inserted as
       ``note + "\\n\\n"`` right before the marker.  (Other chat formats: set ``marker``/``turn_end``,
       e.g. Llama-3 ``"<|start_header_id|>assistant"`` / ``"<|eot_id|>"``.)
    3. Plain text: the prompt's ending is its trailing whitespace if any (``"Compute 37+48-12.\\n"`` ->
       ``"Compute 37+48-12.\\n" + note + "\\n"``), else its last line (``"Q...\\nAnswer:"`` ->
       ``"Q...\\n" + note + "\\nAnswer:"``); the note goes as its own line right before that ending.

    Keep Qwen3's ``enable_thinking`` the same as in the rollout prompt: it only affects text after the
    marker, which is copied unchanged.

    Args:
        prompt: str, the already-templated rollout prompt (the base, unprivileged context x).
        reference: str, gold final answer; required by template ``"reference"`` (B).
        response_answer: str, this response's extracted final answer; required by ``"answer"`` (C).
        template: ``"verdict"`` (A, default), ``"reference"`` (B), ``"answer"`` (C) (aliases "A"/"B"/"C"),
            or a ``(note_correct, note_incorrect)`` tuple of custom strings that may contain ``{reference}``
            and ``{answer}`` placeholders.
        marker, turn_end, anchor: placement options, see above (inferred choice #2).

    Returns:
        (prompt_correct, prompt_incorrect): two str.

    Raises:
        ValueError: unknown ``template``; ``reference`` missing for B (or for a custom note using
        ``{reference}``); ``response_answer`` missing for C (or ``{answer}``); ``prompt`` not a str;
        ``anchor`` not found.
    """
    if not isinstance(prompt, str):
        raise ValueError(f"prompt must be a str, got {type(prompt).__name__}")
    name, (note_pos, note_neg) = _resolve_template(template)
    notes = []
    for note in (note_pos, note_neg):
        if "{reference}" in note:
            if reference is None:
                raise ValueError(f"template {name!r} needs `reference` (the gold final answer)")
            note = note.replace("{reference}", str(reference))
        if "{answer}" in note:
            if response_answer is None:
                raise ValueError(f"template {name!r} needs `response_answer` (this response's own answer)")
            note = note.replace("{answer}", str(response_answer))
        notes.append(note)
    return tuple(_insert_note(prompt, n, marker, turn_end, anchor) for n in notes)


# ---------------------------------------------------------------------------------------------------
# Spec §4 / §6 step 2: re-scoring the fixed responses under c+ and c- (two no-grad prefill passes)
# ---------------------------------------------------------------------------------------------------


def _as_mask(response_mask):
    """[B, T] bool view of a bool/float 0-1 response mask."""
    if not torch.is_tensor(response_mask):
        raise ValueError("response_mask must be a torch.Tensor")
    return response_mask if response_mask.dtype == torch.bool else response_mask != 0


def _position_ids(attention_mask):
    # Left padding: the first real token gets position 0.  Qwen3 in transformers 5.x uses arange(L) when
    # position_ids is None, which would shift every left-padded row; so pass cumsum(mask) - 1 (clamped).
    return (attention_mask.long().cumsum(-1) - 1).clamp(min=0)


_POS_CHUNK = 1024  # positions per float32 chunk of [b, chunk, V] (bounds memory for long responses)


def _response_logits(model, input_ids, attention_mask, num_response_tokens):
    """Logits [b, T, V] (model dtype) predicting the last ``T`` tokens of ``input_ids`` ([prompt | response])."""
    T = num_response_tokens
    kwargs = {}
    try:  # only compute the T+1 logits we need when the model supports it (HF causal LMs do)
        if "logits_to_keep" in inspect.signature(model.forward).parameters:
            kwargs["logits_to_keep"] = T + 1
    except (TypeError, ValueError):
        pass
    out = model(
        input_ids=input_ids,
        attention_mask=attention_mask,
        position_ids=_position_ids(attention_mask),
        use_cache=False,
        **kwargs,
    )
    logits = out.logits if hasattr(out, "logits") else out[0]
    # logits at position j predict token j+1: positions L-T-1 .. L-2 predict the T response tokens.
    return logits[:, -(T + 1) : -1, :]


def default_logprob_fn(model, input_ids, attention_mask, response_mask, temperature):
    """Default per-token log-probs of the response part of left-padded ``[prompt | response]`` inputs.

    log pi(y_t | ., y_<t) = z_t[y_t]/temp - logsumexp(z_t/temp)  (nats), computed in float32 with a
    logsumexp and a gather, in chunks of positions, so that no float32 [B, T, V] tensor is materialised
    (the model's own [B, T, V] logits still are: bound them with ``micro_batch_size``).  Position ids =
    cumsum(attention_mask) - 1 (left padding starts at 0).  The trainer's own old-log-prob pass (l0) should
    use the same forward convention, or D+/D- pick up the difference.

    Args:
        model: a causal LM returning ``.logits`` [B, L, V].
        input_ids: LongTensor [B, L]; the last T = response_mask.shape[1] columns are the response.
        attention_mask: [B, L] 0/1 (0 on the left prompt padding and the right response padding).
        response_mask: [B, T] bool/float.
        temperature: float > 0, logits are divided by it (sampling temperature).

    Returns:
        FloatTensor [B, T] (float32), 0 where ``response_mask`` is 0.
    """
    T = response_mask.shape[1]
    logits = _response_logits(model, input_ids, attention_mask, T)
    targets = input_ids[:, -T:]
    lp = torch.zeros(targets.shape, dtype=torch.float32, device=logits.device)
    for c in range(0, T, _POS_CHUNK):
        z = logits[:, c : c + _POS_CHUNK].float() / temperature
        tgt = targets[:, c : c + _POS_CHUNK].unsqueeze(-1)
        lp[:, c : c + _POS_CHUNK] = z.gather(-1, tgt).squeeze(-1) - torch.logsumexp(z, dim=-1)
    return torch.where(_as_mask(response_mask).to(lp.device), lp, torch.zeros((), dtype=lp.dtype, device=lp.device))


def _tokenize_prompts(tokenizer, prompts, add_special_tokens):
    out = []
    for p in prompts:
        if isinstance(p, str):
            out.append(list(tokenizer(p, add_special_tokens=add_special_tokens)["input_ids"]))
        elif torch.is_tensor(p):
            out.append([int(v) for v in p.reshape(-1).tolist()])
        else:  # a list of token ids
            out.append([int(v) for v in p])
    if any(len(ids) == 0 for ids in out):
        raise ValueError("every prompt must tokenise to at least one token")
    return out


def _build_inputs(prompt_ids, response_ids, response_mask, pad_id):
    """Left-padded [prompt | response] rows: input_ids, attention_mask, both [b, P_max + T]."""
    m = _as_mask(response_mask)
    b, T = response_ids.shape
    P = max(len(p) for p in prompt_ids)
    device = response_ids.device
    input_ids = torch.full((b, P + T), pad_id, dtype=torch.long, device=device)
    attn = torch.zeros((b, P + T), dtype=torch.long, device=device)
    for i, ids in enumerate(prompt_ids):
        input_ids[i, P - len(ids) : P] = torch.tensor(ids, dtype=torch.long, device=device)
        attn[i, P - len(ids) : P] = 1
    # response tokens stay right-padded; padded slots get pad_id (they may hold e.g. -100) and mask 0
    input_ids[:, P:] = torch.where(m, response_ids.long(), torch.full_like(response_ids, pad_id).long())
    attn[:, P:] = m.long()
    return input_ids, attn


def condition_logprobs(
    model,
    tokenizer,
    prompts_correct,
    prompts_incorrect,
    response_ids,
    response_mask,
    temperature=1.0,
    micro_batch_size=None,
    logprob_fn=None,
    *,
    add_special_tokens=False,
    eval_mode=True,
):
    """Log-probs of each fixed sampled response under the "correct" and the "incorrect" prompt.

    Source: abstract [S] (re-score a fixed trajectory under two opposing outcome conditions); spec §4
    (l+_t, l-_t with the rollout-time weights, no grad) and §6 step 2.  Only the two conditioned passes
    happen here; the plain pass l0 is the old-log-prob pass the trainer already runs (spec §4: compute l0
    with the trainer's forward, with the same weights and position-id convention).  The caller passes only
    the responses whose sequence advantage is non-zero (for A_i = 0 CSCR gives 0 anyway, spec §6 step 2).

    Inputs are built as left-padded ``[prompt | response]`` rows (prompts tokenised one by one and
    left-padded here with ``tokenizer.pad_token_id``, whatever ``tokenizer.padding_side`` says; response ids
    reused unchanged), attention mask 0 on padding, position
    ids = cumsum(mask) - 1.  Runs under ``torch.no_grad()``; with ``eval_mode`` the model is put in eval
    mode for the passes (no dropout noise in D) and restored afterwards.

    Args:
        model: causal LM (HF-style: ``model(input_ids=, attention_mask=, position_ids=)`` -> ``.logits``).
        tokenizer: HF tokenizer with a ``pad_token_id``; used for str prompts only.
        prompts_correct, prompts_incorrect: sequences of B prompts (str, or lists/tensors of token ids),
            e.g. from ``build_condition_prompts``.
        response_ids: LongTensor [B, T], right-padded sampled responses.
        response_mask: [B, T] bool/float, 1 on response tokens.
        temperature: float > 0, sampling temperature (log-probs of logits / temperature).
        micro_batch_size: rows per forward pass (None = all B at once).
        logprob_fn: ``fn(model, input_ids, attention_mask, response_mask, temperature) -> [b, T]``, e.g. the
            trainer's memory-efficient token log-prob function; default ``default_logprob_fn``.
        add_special_tokens: passed to the tokenizer for str prompts (False: the text is already templated).
        eval_mode: temporarily switch the model to eval mode.

    Returns:
        (lp_correct, lp_incorrect): float32 [B, T] in nats on ``response_ids.device``, 0 on padding.

    Raises:
        ValueError: shapes/lengths disagree, temperature <= 0, micro_batch_size < 1, no pad token, a prompt
        tokenises to nothing.
    """
    if not torch.is_tensor(response_ids) or response_ids.dim() != 2:
        raise ValueError("response_ids must be a [B, T] tensor")
    m = _as_mask(response_mask)
    if m.shape != response_ids.shape:
        raise ValueError(f"response_mask shape {tuple(m.shape)} != response_ids shape {tuple(response_ids.shape)}")
    B = response_ids.shape[0]
    if len(prompts_correct) != B or len(prompts_incorrect) != B:
        raise ValueError(
            f"prompts_correct ({len(prompts_correct)}) and prompts_incorrect ({len(prompts_incorrect)}) "
            f"must each have B = {B} entries"
        )
    if not temperature > 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    if micro_batch_size is not None and micro_batch_size < 1:
        raise ValueError(f"micro_batch_size must be >= 1 or None, got {micro_batch_size}")
    pad_id = getattr(tokenizer, "pad_token_id", None)
    if pad_id is None:
        raise ValueError("tokenizer.pad_token_id must be set (e.g. tokenizer.pad_token = tokenizer.eos_token)")
    logprob_fn = logprob_fn or default_logprob_fn
    mb = micro_batch_size or max(B, 1)
    try:
        device = next(model.parameters()).device
    except (StopIteration, AttributeError):
        device = response_ids.device

    was_training = getattr(model, "training", False)
    if eval_mode and was_training:
        model.eval()
    try:
        outs = []
        with torch.no_grad():
            for prompts in (prompts_correct, prompts_incorrect):
                ids = _tokenize_prompts(tokenizer, prompts, add_special_tokens)
                lp = torch.zeros(response_ids.shape, dtype=torch.float32, device=response_ids.device)
                for a in range(0, B, mb):
                    z = slice(a, min(a + mb, B))
                    inp, attn = _build_inputs(ids[z], response_ids[z].to(device), m[z].to(device), pad_id)
                    out = logprob_fn(model, inp, attn, m[z].to(device), temperature)
                    lp[z] = torch.where(m[z], out.float().to(lp.device), torch.zeros((), device=lp.device))
                outs.append(lp)
    finally:
        if eval_mode and was_training:
            model.train()
    return outs[0], outs[1]


# ---------------------------------------------------------------------------------------------------
# Spec §4: per-token counterfactual sensitivity
# ---------------------------------------------------------------------------------------------------

_MODES = ("max", "mean", "common")


def _shifts(lp_base, lp_correct, lp_incorrect, response_mask):
    """Validated (D+, D-, mask, dtype); padded log-probs are replaced by 0 BEFORE subtracting (no NaN)."""
    for name, t in (("lp_base", lp_base), ("lp_correct", lp_correct), ("lp_incorrect", lp_incorrect)):
        if not torch.is_tensor(t) or t.dim() != 2:
            raise ValueError(f"{name} must be a [B, T] tensor")
    m = _as_mask(response_mask)
    for name, t in (("lp_correct", lp_correct), ("lp_incorrect", lp_incorrect), ("response_mask", m)):
        if t.shape != lp_base.shape:
            raise ValueError(f"{name} shape {tuple(t.shape)} != lp_base shape {tuple(lp_base.shape)}")
    dt = torch.promote_types(torch.promote_types(lp_base.dtype, lp_correct.dtype), lp_incorrect.dtype)
    dt = torch.promote_types(dt, torch.float32)
    zero = torch.zeros((), dtype=dt, device=lp_base.device)
    l0, lp, ln = (torch.where(m, t.detach().to(dt), zero) for t in (lp_base, lp_correct, lp_incorrect))
    return lp - l0, ln - l0, m, dt  # spec §4: D+ = l+ - l0, D- = l- - l0


def sensitivity(lp_base, lp_correct, lp_incorrect, response_mask, mode="max"):
    """Per-token counterfactual sensitivity s_t in nats (spec §4).

    ``"max"`` (default, [S2] "the maximum of the likelihood shifts under the two conditions"):
    s = max(|D+|, |D-|);  ``"mean"`` [I]: (|D+| + |D-|)/2;  ``"common"`` [I]: |D+ + D-|/2 (the
    polarity-independent part).  D+ = l+ - l0, D- = l- - l0 with sampled-token log-probs [I].
    Padded positions are filled with 0 before subtracting, so -inf - (-inf) cannot give NaN.

    Args:
        lp_base, lp_correct, lp_incorrect: [B, T] log-probs l0, l+, l- of the sampled tokens (nats).
        response_mask: [B, T] bool/float.
        mode: "max" | "mean" | "common".

    Returns:
        Tensor [B, T] (float32 or float64), >= 0, 0 on padding; no gradient.

    Raises:
        ValueError: unknown mode, shape mismatch.
    """
    if mode not in _MODES:
        raise ValueError(f"mode must be one of {_MODES}, got {mode!r}")
    d_pos, d_neg, m, _ = _shifts(lp_base, lp_correct, lp_incorrect, response_mask)
    if mode == "max":
        s = torch.maximum(d_pos.abs(), d_neg.abs())
    elif mode == "mean":
        s = 0.5 * (d_pos.abs() + d_neg.abs())
    else:
        s = (0.5 * (d_pos + d_neg)).abs()
    return torch.where(m, s, torch.zeros((), dtype=s.dtype, device=s.device))


# ---------------------------------------------------------------------------------------------------
# Spec §5: credit reallocation
# ---------------------------------------------------------------------------------------------------

_WEIGHTS = ("exp", "exp_abs", "inverse")
_SCOPES = ("sequence", "group", "batch")


def _check_weight_args(threshold, alpha, w_min, weight):
    if not (isinstance(threshold, (int, float)) and math.isfinite(threshold)):
        raise ValueError(f"threshold must be a finite number (nats), got {threshold!r}")
    if not (isinstance(alpha, (int, float)) and math.isfinite(alpha)) or alpha < 0:
        raise ValueError(f"alpha must be a finite number >= 0, got {alpha!r}")
    if not (isinstance(w_min, (int, float)) and 0.0 <= w_min <= 1.0):
        raise ValueError(f"w_min must be in [0, 1], got {w_min!r}")
    if weight not in _WEIGHTS:
        raise ValueError(f"weight must be one of {_WEIGHTS}, got {weight!r}")


def _log_credit_weights(s, threshold, alpha, w_min, weight):
    """log w_t (see credit_weights); the log domain lets the renormalisation be exact even when w underflows."""
    excess = (s - threshold).clamp(min=0.0)  # max(0, s - lambda)
    if weight == "exp":
        lw = -alpha * excess
    elif weight == "exp_abs":
        lw = torch.where(s > threshold, -alpha * s, torch.zeros_like(s))
    else:  # "inverse"
        lw = -torch.log1p(alpha * excess)
    if w_min > 0:  # floor against budget concentration (spec §5, w_min): log max(w_min, w)
        lw = lw.clamp(min=math.log(w_min))
    return lw


def credit_weights(s, response_mask, threshold=0.2, alpha=1.0, w_min=0.0, weight="exp"):
    """Un-normalised token weights w_t from the sensitivity (spec §5).

    [S2]: highly sensitive tokens are down-weighted exponentially, tokens below the threshold keep full
    weight.  Exact form [I] (option ``weight``):

    - ``"exp"`` (default): w = max(w_min, exp(-alpha * max(0, s - threshold)))  (continuous at threshold)
    - ``"exp_abs"``:       w = max(w_min, exp(-alpha * s)) if s > threshold else 1
    - ``"inverse"``:       w = max(w_min, 1 / (1 + alpha * max(0, s - threshold)))

    Args:
        s: [B, T] sensitivity (nats), from ``sensitivity``.
        response_mask: [B, T] bool/float.
        threshold: lambda in nats (finite).  alpha: decay >= 0 (0 gives w = 1).  w_min: floor in [0, 1].

    Returns:
        Tensor [B, T] in [w_min, 1] on valid tokens, 0 on padding (no gradient).

    Raises:
        ValueError: alpha < 0, w_min outside [0, 1], non-finite threshold, unknown weight, shape mismatch.
    """
    _check_weight_args(threshold, alpha, w_min, weight)
    m = _as_mask(response_mask)
    if not torch.is_tensor(s) or s.shape != m.shape:
        raise ValueError(f"s must be a tensor with the response_mask shape {tuple(m.shape)}")
    w = torch.exp(_log_credit_weights(s.detach(), threshold, alpha, w_min, weight))
    return torch.where(m, w, torch.zeros((), dtype=w.dtype, device=w.device))


def _shifted_weights(lw, sel, rows_per_block):
    """exp(lw - max over each block of rows' selected tokens): the largest weight of a block is exactly 1."""
    B = lw.shape[0]
    lw_sel = torch.where(sel, lw, torch.full((), -math.inf, dtype=lw.dtype, device=lw.device))
    shift = lw_sel.reshape(B // rows_per_block, -1).max(1).values
    shift = torch.where(torch.isfinite(shift), shift, torch.zeros_like(shift)).repeat_interleave(rows_per_block)
    return torch.where(sel, torch.exp(lw - shift.unsqueeze(1)), torch.zeros((), dtype=lw.dtype, device=lw.device))


def cscr_token_advantages(
    advantages,
    lp_base,
    lp_correct,
    lp_incorrect,
    response_mask,
    threshold=0.2,
    alpha=1.0,
    w_min=0.0,
    mode="max",
    *,
    weight="exp",
    scope="sequence",
    group_size=None,
    return_stats=False,
):
    """CSCR token advantages: down-weight sensitive tokens, keep sign and per-sequence credit budget.

    Source: abstract [S] (reduce the credit of highly sensitive tokens; renormalise so that the original
    credit budget and the verifier-determined direction are kept); [S2] exponential down-weighting above a
    threshold lambda, normalisation within each sequence; exact form spec §5 [I]::

        s_t      = sensitivity(l0, l+, l-)                       (spec §4, ``mode``)
        w_t      = max(w_min, exp(-alpha * max(0, s_t - lambda)))  (``credit_weights``, ``weight``)
        w_bar_i  = (1/L_i) sum_t m_t w_t                          (L_i = number of valid tokens)
        A_i,t    = A_i * (w_t / w_bar_i) * m_t

    w_t / w_bar_i is scale-free, so it is computed from log-weights shifted by the row maximum: no eps
    guard is needed and the budget stays exact even when every w_t underflows (e.g. alpha = 30).

    Properties (scope "sequence"): sign(A_i,t) = sign(A_i) on every valid token; sum_t A_i,t = L_i * A_i;
    alpha = 0, or all s <= lambda, or A_i = 0 give exactly GRPO (A_i on every valid token; 0 for A_i = 0).
    Pass all B rows; rows with A_i = 0 need no scoring (their log-probs may be left 0) and get 0.
    Everything is computed without gradient (the result is a constant in the loss).

    Ablations (spec §5 "scope", §9.3) [I]: ``scope="group"`` (mean weight 1 over the valid tokens of each
    group of ``group_size`` contiguous rows) or ``"batch"`` (over the whole batch); only rows with A != 0
    enter the normaliser.  These keep signs but not the per-sequence budget.

    Args:
        advantages: [B] sequence advantages A_i (e.g. GRPO group-normalised).
        lp_base, lp_correct, lp_incorrect: [B, T] sampled-token log-probs l0, l+, l- (nats).
        response_mask: [B, T] bool/float.
        threshold: lambda, nats (default 0.2; or ``calibrate_threshold`` once on the first batch).
        alpha: decay strength >= 0.  w_min: weight floor in [0, 1].  mode: "max" | "mean" | "common".
        weight: "exp" | "exp_abs" | "inverse" (see ``credit_weights``).
        scope: "sequence" | "group" | "batch".  group_size: rows per group (scope "group").
        return_stats: also return a dict of floats for logging.

    Returns:
        Tensor [B, T] token advantages (dtype of the log-probs, at least float32; 0 on padding), or
        ``(tensor, stats)``; stats cover the valid tokens of rows with A != 0 (0.0 when there are none):
        ``cscr/w_mean`` mean raw weight w; ``cscr/frac_w_lt_1`` fraction of tokens with w < 1;
        ``cscr/w_tilde_max`` max normalised weight w/w_bar; ``cscr/eff_token_frac`` mean over sequences of
        (sum w)^2 / (L sum w^2); ``cscr/w_bar_mean`` mean of w_bar_i; ``cscr/inv_w_bar_max`` max of
        1/w_bar_i (spec §5: keep <~ 1.3); ``cscr/s_mean``; ``cscr/s_pos_mean`` / ``cscr/s_neg_mean`` mean s
        on rows with A > 0 / A < 0; ``cscr/num_tokens`` number of tokens the stats cover.

    Raises:
        ValueError: alpha < 0, w_min not in [0, 1], unknown mode/weight/scope, shape mismatch, bad
        group_size, non-finite log-probs on valid tokens.
    """
    _check_weight_args(threshold, alpha, w_min, weight)
    if mode not in _MODES:
        raise ValueError(f"mode must be one of {_MODES}, got {mode!r}")
    if scope not in _SCOPES:
        raise ValueError(f"scope must be one of {_SCOPES}, got {scope!r}")
    if not torch.is_tensor(advantages) or advantages.dim() != 1:
        raise ValueError("advantages must be a [B] tensor")
    if not torch.is_tensor(lp_base) or lp_base.dim() != 2 or advantages.shape[0] != lp_base.shape[0]:
        raise ValueError(
            f"advantages shape {tuple(advantages.shape)} does not match lp_base rows "
            f"{tuple(lp_base.shape) if torch.is_tensor(lp_base) else lp_base!r}"
        )
    B = advantages.shape[0]
    if scope == "group":
        if not isinstance(group_size, int) or group_size < 1 or B % group_size != 0:
            raise ValueError(f"group_size must be a positive int dividing B = {B} for scope 'group', got {group_size!r}")

    with torch.no_grad():
        s = sensitivity(lp_base, lp_correct, lp_incorrect, response_mask, mode=mode)  # spec §4
        m = _as_mask(response_mask).to(s.device)
        if not torch.isfinite(s[m]).all():
            raise ValueError("lp_base, lp_correct and lp_incorrect must be finite on valid (response_mask) tokens")
        dt = s.dtype
        A = advantages.detach().to(device=s.device, dtype=dt)
        lw = _log_credit_weights(s, threshold, alpha, w_min, weight)  # spec §5: log w_t
        if scope == "sequence":
            sel, g = m, 1  # spec §5 [S2]: normalise within each sequence, over its VALID tokens
        else:
            sel, g = m & (A != 0).unsqueeze(1), (B if scope == "batch" else group_size)
        w_s = _shifted_weights(lw, sel, g)  # w_t / max_block w (max = 1)
        w_bar_s = (w_s.reshape(B // g, -1).sum(1) / sel.reshape(B // g, -1).sum(1).clamp(min=1)).repeat_interleave(g)
        zero = torch.zeros((), dtype=dt, device=s.device)
        w_tilde = torch.where(sel & (w_bar_s > 0).unsqueeze(1), w_s / w_bar_s.clamp(min=1e-300).unsqueeze(1), zero)
        # spec §5: A_i,t = A_i * w~_t * m_t
        adv = torch.where(m & (A != 0).unsqueeze(1), A.unsqueeze(1) * w_tilde, zero)
        if not return_stats:
            return adv
        stats = _cscr_stats(s, lw, w_tilde, A, m)
    return adv, stats


def _cscr_stats(s, lw, w_tilde, A, m):
    rows = (A != 0) & m.any(1)
    tok = m & rows.unsqueeze(1)
    n = int(tok.sum())
    w = torch.where(m, torch.exp(lw), torch.zeros((), dtype=lw.dtype, device=lw.device))  # raw weights

    def _mean(x, sel):
        k = int(sel.sum())
        return float(x[sel].double().sum() / k) if k else 0.0

    stats = {
        "cscr/w_mean": _mean(w, tok),
        "cscr/frac_w_lt_1": _mean((w < 1).to(w.dtype), tok),
        "cscr/w_tilde_max": float(w_tilde[tok].max()) if n else 0.0,
        "cscr/eff_token_frac": 0.0,
        "cscr/w_bar_mean": 0.0,
        "cscr/inv_w_bar_max": 0.0,
        "cscr/s_mean": _mean(s, tok),
        "cscr/s_pos_mean": _mean(s, m & (A > 0).unsqueeze(1)),
        "cscr/s_neg_mean": _mean(s, m & (A < 0).unsqueeze(1)),
        "cscr/num_tokens": float(n),
    }
    if int(rows.sum()):
        mr = m[rows]
        L = mr.sum(1).double()
        ws = _shifted_weights(lw[rows], mr, 1).double()  # scale-free per row
        # spec §5: effective-token fraction (sum w)^2 / (L * sum w^2), averaged over sequences
        stats["cscr/eff_token_frac"] = float((ws.sum(1) ** 2 / (L * (ws**2).sum(1))).mean())
        w_bar = w[rows].double().sum(1) / L
        stats["cscr/w_bar_mean"] = float(w_bar.mean())
        stats["cscr/inv_w_bar_max"] = float((1.0 / w_bar).max()) if float(w_bar.min()) > 0 else math.inf
    return stats


def calibrate_threshold(s, response_mask, quantile=0.8):
    """Threshold lambda as a quantile of the sensitivity over valid tokens (spec §5, [I]).

    Used once on the first rollout batch, then frozen (spec §5 suggests the 80th percentile).  Linear
    interpolation between order statistics, identical to ``torch.quantile(s[mask], quantile)`` (implemented
    with a sort so that it also works beyond torch.quantile's input-size limit).

    Args:
        s: [B, T] sensitivity (nats).  response_mask: [B, T] bool/float.  quantile: in [0, 1].

    Returns:
        float, nats.

    Raises:
        ValueError: quantile outside [0, 1], shape mismatch, no valid token, non-finite s on valid tokens.
    """
    if not (isinstance(quantile, (int, float)) and 0.0 <= quantile <= 1.0):
        raise ValueError(f"quantile must be in [0, 1], got {quantile!r}")
    m = _as_mask(response_mask)
    if not torch.is_tensor(s) or s.shape != m.shape:
        raise ValueError(f"s must be a tensor with the response_mask shape {tuple(m.shape)}")
    v = s.detach()[m].double()
    if v.numel() == 0:
        raise ValueError("response_mask has no valid token")
    if not torch.isfinite(v).all():
        raise ValueError("s must be finite on valid tokens")
    v, _ = v.sort()
    pos = quantile * (v.numel() - 1)
    lo = int(math.floor(pos))
    hi = min(lo + 1, v.numel() - 1)
    return float(v[lo] + (pos - lo) * (v[hi] - v[lo]))


# ---------------------------------------------------------------------------------------------------
# Spec §7: diagnostics D1-D7 (paper: diagnostic study of 400 on-policy trajectories [S2])
# ---------------------------------------------------------------------------------------------------


def shift_masks(lp_base, lp_correct, lp_incorrect, response_mask, tau=0.05):
    """Per-token masks behind D1/D2 (spec §7).

    affected = |D+| > tau and |D-| > tau (valid tokens only); same = affected and sign D+ = sign D-;
    reversal = affected and sign D+ != sign D-.

    Returns:
        dict of bool [B, T]: "affected", "same", "reversal".

    Raises:
        ValueError: tau < 0, shape mismatch.
    """
    if not tau >= 0:
        raise ValueError(f"tau must be >= 0, got {tau!r}")
    d_pos, d_neg, m, _ = _shifts(lp_base, lp_correct, lp_incorrect, response_mask)
    aff = m & (d_pos.abs() > tau) & (d_neg.abs() > tau)
    same = aff & (torch.sign(d_pos) == torch.sign(d_neg))
    return {"affected": aff, "same": same, "reversal": aff & ~same}


def pearson(x, y):
    """Pearson correlation of two 1-D tensors (float64); nan when either is constant or has < 2 values."""
    x, y = x.double().reshape(-1), y.double().reshape(-1)
    if x.numel() != y.numel():
        raise ValueError("x and y must have the same number of elements")
    if x.numel() < 2:
        return float("nan")
    x, y = x - x.mean(), y - y.mean()
    den = torch.sqrt((x * x).sum() * (y * y).sum())
    return float((x * y).sum() / den) if float(den) > 0 else float("nan")


def _rank(x):
    """Ranks (0-based) of a 1-D tensor, ties get their average rank."""
    v, idx = x.double().sort()
    _, inv, counts = torch.unique_consecutive(v, return_inverse=True, return_counts=True)
    ends = counts.cumsum(0).double()
    avg = ends - (counts.double() + 1.0) / 2.0  # average of 0-based ranks start..end-1
    r = torch.empty_like(v)
    r[idx] = avg[inv]
    return r


def spearman(x, y):
    """Spearman rank correlation (Pearson of average ranks) of two 1-D tensors."""
    x, y = x.reshape(-1), y.reshape(-1)
    if x.numel() != y.numel():
        raise ValueError("x and y must have the same number of elements")
    if x.numel() < 2:
        return float("nan")
    return pearson(_rank(x), _rank(y))


def _top_k(n, frac, k):
    if k is not None:
        if not (isinstance(k, int) and k >= 1):
            raise ValueError(f"top_k must be a positive int, got {k!r}")
        return min(k, n)
    if not (0 < frac <= 1):
        raise ValueError(f"top fraction must be in (0, 1], got {frac!r}")
    return max(1, min(n, math.ceil(frac * n - 1e-9)))


def full_vocab_overlap(p0, p_pos, p_neg, eps=1e-12):
    """Full-vocabulary overlap of the two conditioned distributions at the same prefix (spec §7 D4c, §8).

    Per position: the OPSD forward-KL gradient w.r.t. the student logits, g+ = p0 - p+ and g- = p0 - p-
    [I]; their cosine; and KL(p+ || p0), KL(p- || p0) in nats (0 log 0 = 0).

    Args:
        p0, p_pos, p_neg: [..., V] probability vectors (same shape) of the base, c+ and c- contexts.
        eps: guard on the norms.

    Returns:
        dict of tensors of shape [...]: "cosine", "kl_pos", "kl_neg".

    Raises:
        ValueError: shape mismatch.
    """
    if not (torch.is_tensor(p0) and torch.is_tensor(p_pos) and torch.is_tensor(p_neg)):
        raise ValueError("p0, p_pos and p_neg must be tensors")
    if p_pos.shape != p0.shape or p_neg.shape != p0.shape:
        raise ValueError(f"p_pos {tuple(p_pos.shape)} and p_neg {tuple(p_neg.shape)} must match p0 {tuple(p0.shape)}")
    dt = torch.promote_types(p0.dtype, torch.float32)
    p0, pp, pn = p0.to(dt), p_pos.to(dt), p_neg.to(dt)
    g_pos, g_neg = p0 - pp, p0 - pn
    cos = (g_pos * g_neg).sum(-1) / (g_pos.norm(dim=-1) * g_neg.norm(dim=-1)).clamp(min=eps)

    def kl(p, q):  # KL(p || q) = sum p log p - p log q
        return (torch.xlogy(p, p) - torch.xlogy(p, q)).sum(-1)

    return {"cosine": cos, "kl_pos": kl(pp, p0), "kl_neg": kl(pn, p0)}


# D6 heuristic word lists [I]: discourse markers named by spec §7 plus common reasoning fillers, and a
# small set of function words (highly substitutable surface forms).  Edit these to change the profile.
DISCOURSE_MARKERS = frozenset(
    """wait so let let's lets therefore hmm thus hence now okay ok alright well actually but however first
    next then also alternatively finally yes no right perhaps maybe hold on check verify recall note""".split()
)
FUNCTION_WORDS = frozenset(
    """the a an is are was were be been to of and or in on at for with by from as that this it its we i me
    us our you he she they them which what when where if than there here can could should would will do
    does did not""".split()
)
_PUNCT = set(".,;:!?'\"`()[]{}\u2019\u201c\u201d")
_FORMAT_TOKENS = {"$", "$$", "\\[", "\\]", "\\(", "\\)", "<think>", "</think>", "```", "**", "##", "###",
                  "####", "---", "- ", "* ", "\\boxed", "\\boxed{", "\\text", "\\text{", "\\quad", "\\,"}


def classify_token(text):
    """Surface-form vs content class of one decoded token (spec §7 D6, heuristic [I]).

    "surface": whitespace/newlines only; punctuation only (``.,;:!?'"`()[]{}``); formatting (markdown
    ``**``, ``##``, ``---``, bullets, ``$``, ``\\[``, ``\\boxed``, ``<think>``...); discourse markers
    (``DISCOURSE_MARKERS``: Wait, So, Let, Therefore, Hmm, ...) and function words (``FUNCTION_WORDS``),
    compared case-insensitively after stripping whitespace and punctuation.
    "content": anything with a digit or a maths operator (``+ - * / = ^ < > % | \\ _``, single ``*``/``-``),
    and every other word piece (variables, problem entities); special tokens are surface.

    Args:
        text: str, one decoded token (e.g. ``tokenizer.decode([id])``).

    Returns:
        "surface" or "content".
    """
    if not isinstance(text, str):
        raise ValueError(f"text must be a str, got {type(text).__name__}")
    t = text.strip()
    if not t:
        return "surface"  # whitespace / newlines
    if t in _FORMAT_TOKENS or (t.startswith("<|") and t.endswith("|>")):
        return "surface"  # formatting, special tokens
    if any(c.isdigit() for c in t):
        return "content"  # numbers
    if len(t) >= 2 and len(set(t)) == 1 and t[0] in "*#-=_~`":
        return "surface"  # markdown rules / emphasis (**, ###, ---, ===)
    if all(c in _PUNCT for c in t):
        return "surface"  # punctuation
    if any(c in "+-*/=^<>%|\\_" for c in t):
        return "content"  # operators, LaTeX commands
    word = "".join(c for c in t if c not in _PUNCT).lower()
    if word in DISCOURSE_MARKERS or word in FUNCTION_WORDS:
        return "surface"
    return "content"  # variables, entities, other words


def _surface_mask(token_classes, shape, device):
    if torch.is_tensor(token_classes):
        if token_classes.shape != shape:
            raise ValueError(f"token_classes shape {tuple(token_classes.shape)} != {tuple(shape)}")
        return token_classes.to(device=device).bool()
    if len(token_classes) != shape[0]:
        raise ValueError(f"token_classes must have B = {shape[0]} rows")
    out = torch.zeros(shape, dtype=torch.bool)
    for i, row in enumerate(token_classes):
        if len(row) > shape[1]:
            raise ValueError(f"token_classes row {i} is longer than T = {shape[1]}")
        for j, c in enumerate(row):
            if c not in ("surface", "content"):
                raise ValueError(f"token_classes entries must be 'surface' or 'content', got {c!r}")
            out[i, j] = c == "surface"
    return out.to(device)


def diagnostics(
    lp_base,
    lp_correct,
    lp_incorrect,
    response_mask,
    correct,
    tau=0.05,
    top_frac=0.1,
    token_classes=None,
    entropy=None,
    top1_prob=None,
    *,
    top_k=None,
    sens_top_frac=0.05,
    mode="max",
):
    """Diagnostics D1-D7 of spec §7 (pooled over all valid tokens of the batch).

    Source: [S] most affected tokens shift in the same direction under both conditions, reversals are rare,
    the induced signals overlap, large shifts sit on substitutable surface-form tokens; [S2] 91.4-95.8 %
    same direction, polarity agrees with the true outcome about 58 % of the time.  Definitions [I], spec §7,
    with affected = |D+| > tau and |D-| > tau:

    - D1 ``d1_same_direction_rate`` = P[sign D+ = sign D- | affected]; ``d1_num_affected``.
    - D2 ``d2_sign_reversal_rate`` = 1 - D1 (nan without affected tokens).
    - D3 ``d3_polarity_outcome_consistency``: fraction of affected tokens whose D+ - D- is > 0 on correct
      trajectories and < 0 on incorrect ones (a zero difference counts as inconsistent) [I].
    - D4a ``d4a_pearson``, ``d4a_spearman`` of D+ and D- over valid tokens.
    - D4b ``d4b_topk_jaccard`` of the top-k tokens by |D+| and by |D-|, k = ceil(top_frac * N) or ``top_k``;
      ``d4b_k``.  (D4c needs full distributions: ``full_vocab_overlap``.)
    - D5 ``d5_common_mode_share`` = sum cm^2 / (sum cm^2 + sum df^2), cm = (D+ + D-)/2, df = (D+ - D-)/2.
    - D6 (needs ``token_classes``): ``d6_s_mean_surface``, ``d6_s_mean_content``, ``d6_surface_share_top``
      (share of surface tokens among the top ``sens_top_frac`` tokens by s), ``d6_surface_share_all`` (base
      rate), ``d6_top_k``.
    - D7 (needs ``entropy`` / ``top1_prob``): ``d7_pearson_s_entropy``, ``d7_spearman_s_entropy``,
      ``d7_pearson_s_1_minus_top1``, ``d7_spearman_s_1_minus_top1``.
    - Also ``num_valid_tokens``, ``s_mean``, ``s_q50``, ``s_q80``, ``s_q95``, ``mean_delta_pos``,
      ``mean_delta_neg``.

    Args:
        lp_base, lp_correct, lp_incorrect: [B, T] sampled-token log-probs (nats).
        response_mask: [B, T] bool/float.
        correct: [B] bool, the verifier's outcome of each trajectory.
        tau: "affected" threshold, nats.  top_frac / top_k: D4b set size.
        token_classes: [B, T] bool tensor (True = surface) or B lists of "surface"/"content" strings.
        entropy: [B, T] entropy of the base next-token distribution (nats).  top1_prob: [B, T] base top-1
            probability.
        sens_top_frac: fraction of most sensitive tokens for D6.  mode: sensitivity mode for s (D6, D7).

    Returns:
        dict of floats / ints (nan where a quantity is undefined, e.g. a constant input to a correlation).

    Raises:
        ValueError: shape mismatches, bad tau / fractions / mode, no valid token.
    """
    d_pos, d_neg, m, _ = _shifts(lp_base, lp_correct, lp_incorrect, response_mask)
    B, T = m.shape
    if not torch.is_tensor(correct) or correct.shape != (B,):
        raise ValueError(f"correct must be a [B] = [{B}] tensor")
    n = int(m.sum())
    if n == 0:
        raise ValueError("response_mask has no valid token")
    nan = float("nan")
    out = {"num_valid_tokens": n}
    masks = shift_masks(lp_base, lp_correct, lp_incorrect, response_mask, tau)
    n_aff = int(masks["affected"].sum())
    # D1 / D2
    d1 = int(masks["same"].sum()) / n_aff if n_aff else nan
    out.update(d1_num_affected=n_aff, d1_same_direction_rate=d1, d2_sign_reversal_rate=1.0 - d1 if n_aff else nan)
    # D3: differential D+ - D- should be > 0 for correct and < 0 for incorrect trajectories (Bayes null)
    diff = d_pos - d_neg
    want = torch.where(correct.bool().to(m.device), 1.0, -1.0).unsqueeze(1).to(diff.dtype)
    consistent = masks["affected"] & (torch.sign(diff) == want)
    out["d3_polarity_outcome_consistency"] = int(consistent.sum()) / n_aff if n_aff else nan
    # D4a
    xp, xn = d_pos[m], d_neg[m]
    out["d4a_pearson"] = pearson(xp, xn)
    out["d4a_spearman"] = spearman(xp, xn)
    # D4b: Jaccard of the top-k sets by |D+| and |D-| (pooled valid tokens)
    k = _top_k(n, top_frac, top_k)
    a = set(torch.topk(xp.abs(), k).indices.tolist())
    b = set(torch.topk(xn.abs(), k).indices.tolist())
    out["d4b_k"] = k
    out["d4b_topk_jaccard"] = len(a & b) / len(a | b)
    # D5: common-mode share
    cm, df = 0.5 * (xp + xn), 0.5 * (xp - xn)
    tot = float((cm**2).sum() + (df**2).sum())
    out["d5_common_mode_share"] = float((cm**2).sum()) / tot if tot > 0 else nan
    # sensitivity summary
    s = sensitivity(lp_base, lp_correct, lp_incorrect, response_mask, mode=mode)
    sv = s[m].double()
    out["s_mean"] = float(sv.mean())
    for q in (50, 80, 95):
        out[f"s_q{q}"] = calibrate_threshold(s, m, q / 100)
    out["mean_delta_pos"] = float(xp.double().mean())
    out["mean_delta_neg"] = float(xn.double().mean())
    # D6: token-class profile
    if token_classes is not None:
        sm = _surface_mask(token_classes, m.shape, m.device)[m]
        ks = _top_k(n, sens_top_frac, None)
        top = torch.topk(sv, ks).indices
        out["d6_s_mean_surface"] = float(sv[sm].mean()) if int(sm.sum()) else nan
        out["d6_s_mean_content"] = float(sv[~sm].mean()) if int((~sm).sum()) else nan
        out["d6_surface_share_top"] = float(sm[top].double().mean())
        out["d6_surface_share_all"] = float(sm.double().mean())
        out["d6_top_k"] = ks
    # D7: substitutability
    for name, x in (("entropy", entropy), ("1_minus_top1", None if top1_prob is None else 1.0 - top1_prob)):
        if x is None:
            continue
        if x.shape != m.shape:
            raise ValueError(f"{'entropy' if name == 'entropy' else 'top1_prob'} must have shape {tuple(m.shape)}")
        xv = x.to(m.device)[m]
        out[f"d7_pearson_s_{name}"] = pearson(sv, xv)
        out[f"d7_spearman_s_{name}"] = spearman(sv, xv)
    return out


# ---------------------------------------------------------------------------------------------------
# CLI: on-policy diagnostic study (paper's diagnostic section [S2]: 400 trajectories; spec §7)
# ---------------------------------------------------------------------------------------------------

PAPER_REFERENCE = {  # [S2] numbers to compare a run with
    "d1_same_direction_rate": "0.914-0.958 (range over settings)",
    "d3_polarity_outcome_consistency": "about 0.58",
    "num_trajectories": 400,
}


def _extract_answer(text):
    """Last \\boxed{...} content (brace-matched), else the last number, else '' (template C, [I])."""
    i = text.rfind("\\boxed{")
    if i >= 0:
        j, depth = i + len("\\boxed{"), 1
        k = j
        while k < len(text) and depth:
            depth += {"{": 1, "}": -1}.get(text[k], 0)
            k += 1
        if depth == 0:
            return text[j : k - 1].strip()
    nums = re.findall(r"-?\d+(?:\.\d+)?(?:/\d+)?", text)
    return nums[-1] if nums else ""


def _eos_ids(tokenizer, model):
    ids = set()
    for v in (getattr(tokenizer, "eos_token_id", None), getattr(getattr(model, "generation_config", None), "eos_token_id", None)):
        if isinstance(v, int):
            ids.add(v)
        elif isinstance(v, (list, tuple)):
            ids.update(int(x) for x in v)
    return ids


def _json_safe(x):
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, dict):
        return {k: _json_safe(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_json_safe(v) for v in x]
    return x


def diagnose(
    model,
    tokenizer,
    problems,
    answers,
    num_trajectories,
    *,
    grade_fn,
    prompt_fn=None,
    template="verdict",
    max_new_tokens=64,
    temperature=1.0,
    top_p=1.0,
    top_k=0,
    seed=0,
    gen_batch_size=16,
    micro_batch_size=8,
    tau=0.05,
    top_frac=0.1,
    sens_top_frac=0.05,
    answer_fn=None,
    output_dir=None,
    marker=DEFAULT_MARKER,
    turn_end=DEFAULT_TURN_END,
    num_examples=20,
    return_tensors=False,
    stop_ids=None,
    add_special_tokens=True,
):
    """Sample on-policy trajectories, re-score them under c+ and c-, and report D1-D7 (spec §7).

    Paper ([S2]): 400 on-policy trajectories re-scored under both conditions, sampled-token and
    full-vocabulary shifts compared at the same prefix.  Steps:

    1. Problems are shuffled with ``seed`` and cycled until ``num_trajectories`` prompts; one response each
       with ``model.generate`` (left padding, ``do_sample``, ``temperature``/``top_p``/``top_k``; top_k 0 =
       off).  A response is cut after its first EOS token, which it keeps [I].
    2. ``grade_fn(response_text, reference) -> bool`` gives the outcome.
    3. Three no-grad passes per micro-batch (base prompt, c+, c-) with the same weights: sampled-token
       log-probs l0, l+, l- at ``temperature``, base entropy and top-1 probability (D7), and per-position
       full-vocabulary cosine / KLs (D4c, ``full_vocab_overlap``).
    4. Tokens are classified with ``classify_token`` (D6); ``diagnostics`` gives D1-D7.

    Args:
        model, tokenizer: HF causal LM and tokenizer (``pad_token_id`` required).
        problems, answers: lists of str of the same length.
        num_trajectories: int >= 1.
        grade_fn: callable(response_text, reference) -> bool.
        prompt_fn: callable(problem) -> prompt text; default ``problem + "\\n"``.
        template: condition template (see ``build_condition_prompts``); "answer" uses ``answer_fn``
            (default: last \\boxed{} else last number).
        output_dir: if given, writes ``report.json`` there (and PNG plots when matplotlib is installed).
        return_tensors: also return a dict of the per-token tensors ([N, T]: response_ids, response_mask,
            lp_base, lp_correct, lp_incorrect, entropy, top1_prob, surface, fv_cosine, fv_kl_pos, fv_kl_neg;
            [N]: correct) and the prompts (prompts, prompts_correct, prompts_incorrect).
        stop_ids: extra token ids that end a sampled response (e.g. ``<|im_end|>`` for ChatML templates),
            added to the tokenizer's and generation config's EOS ids.
        add_special_tokens: tokenizer setting for all three contexts (True, as the trainer's rollouts: the
            toy tokenizer prepends BOS, Qwen's adds nothing).
        other args: sampling and diagnostics options, see ``diagnostics``.

    Returns:
        dict report (JSON-safe: nan -> None), or ``(report, tensors)`` with ``return_tensors``.

    Raises:
        ValueError: bad sizes, no pad token, temperature <= 0.
    """
    if len(problems) != len(answers) or not problems:
        raise ValueError("problems and answers must be non-empty lists of the same length")
    if not (isinstance(num_trajectories, int) and num_trajectories >= 1):
        raise ValueError(f"num_trajectories must be a positive int, got {num_trajectories!r}")
    if not temperature > 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    pad_id = tokenizer.pad_token_id
    if pad_id is None:
        raise ValueError("tokenizer.pad_token_id must be set")
    prompt_fn = prompt_fn or (lambda p: p + "\n")
    answer_fn = answer_fn or _extract_answer
    name, _ = _resolve_template(template)
    device = next(model.parameters()).device
    was_training = model.training
    model.eval()

    # 1. sample on-policy trajectories
    gen = torch.Generator().manual_seed(seed)
    order = torch.randperm(len(problems), generator=gen).tolist()
    idx = [order[i % len(order)] for i in range(num_trajectories)]
    prompts = [prompt_fn(problems[i]) for i in idx]
    refs = [answers[i] for i in idx]
    eos = _eos_ids(tokenizer, model)
    torch.manual_seed(seed)
    responses = []
    with torch.no_grad():
        for a in range(0, num_trajectories, gen_batch_size):
            chunk = prompts[a : a + gen_batch_size]
            ids = _tokenize_prompts(tokenizer, chunk, add_special_tokens)
            P = max(len(x) for x in ids)
            inp = torch.full((len(ids), P), pad_id, dtype=torch.long)
            attn = torch.zeros((len(ids), P), dtype=torch.long)
            for i, x in enumerate(ids):
                inp[i, P - len(x) :] = torch.tensor(x)
                attn[i, P - len(x) :] = 1
            out = model.generate(
                input_ids=inp.to(device), attention_mask=attn.to(device), do_sample=True,
                temperature=temperature, top_p=top_p, top_k=top_k, max_new_tokens=max_new_tokens,
                pad_token_id=pad_id, eos_token_id=sorted(eos | set(stop_ids or ())) or None,
            )
            for row in out[:, P:].tolist():
                resp = []
                for t in row:
                    resp.append(t)
                    if t in eos:
                        break
                responses.append(resp or [row[0]])
    T = max(len(r) for r in responses)
    N = num_trajectories
    resp_ids = torch.full((N, T), pad_id, dtype=torch.long)
    mask = torch.zeros((N, T), dtype=torch.bool)
    for i, r in enumerate(responses):
        resp_ids[i, : len(r)] = torch.tensor(r)
        mask[i, : len(r)] = True
    texts = [tokenizer.decode(r, skip_special_tokens=True) for r in responses]
    # 2. grade
    correct = torch.tensor([bool(grade_fn(t, ref)) for t, ref in zip(texts, refs)])
    # 3. three passes (same weights), sampled-token log-probs + full-vocab quantities
    cond = [
        build_condition_prompts(p, reference=ref, response_answer=answer_fn(t), template=template,
                                marker=marker, turn_end=turn_end)
        for p, ref, t in zip(prompts, refs, texts)
    ]
    ctx = {"base": prompts, "pos": [c[0] for c in cond], "neg": [c[1] for c in cond]}
    tok_ids = {k: _tokenize_prompts(tokenizer, v, add_special_tokens) for k, v in ctx.items()}
    lp = {k: torch.zeros((N, T), dtype=torch.float32) for k in ctx}
    ent = torch.zeros((N, T))
    top1 = torch.zeros((N, T))
    fv = {k: torch.zeros((N, T)) for k in ("cosine", "kl_pos", "kl_neg")}
    with torch.no_grad():
        for a in range(0, N, micro_batch_size):
            z = slice(a, min(a + micro_batch_size, N))
            r, mz = resp_ids[z].to(device), mask[z].to(device)
            logits = {}
            for k in ctx:
                inp, attn = _build_inputs(tok_ids[k][z], r, mz, pad_id)
                logits[k] = _response_logits(model, inp, attn, T)
            for c in range(0, T, _POS_CHUNK):  # float32 work in chunks of positions
                cz = slice(c, min(c + _POS_CHUNK, T))
                tgt = r[:, cz].unsqueeze(-1)
                probs = {}
                for k in ctx:
                    logp = torch.log_softmax(logits[k][:, cz].float() / temperature, dim=-1)
                    lp[k][z, cz] = logp.gather(-1, tgt).squeeze(-1).cpu()
                    probs[k] = logp.exp()
                    if k == "base":
                        ent[z, cz] = -(probs[k] * logp).sum(-1).cpu()
                        top1[z, cz] = probs[k].max(-1).values.cpu()
                o = full_vocab_overlap(probs["base"], probs["pos"], probs["neg"])
                for k in fv:
                    fv[k][z, cz] = o[k].cpu()
            del logits, probs
    if was_training:
        model.train()
    for k in lp:
        lp[k] = torch.where(mask, lp[k], torch.zeros(()))
    # 4. token classes (decoded once per distinct id) and diagnostics
    uniq = sorted(set(resp_ids[mask].tolist()))
    text_of = {i: tokenizer.decode([i]) for i in uniq}
    lookup = torch.zeros(max(uniq) + 1, dtype=torch.bool)
    for i in uniq:
        lookup[i] = classify_token(text_of[i]) == "surface"
    surf = lookup[resp_ids.clamp(min=0, max=max(uniq))] & mask
    diag = diagnostics(lp["base"], lp["pos"], lp["neg"], mask, correct, tau=tau, top_frac=top_frac,
                       token_classes=surf, entropy=ent, top1_prob=top1, sens_top_frac=sens_top_frac)
    for k in fv:  # d4c_cosine_mean, d4c_kl_pos_mean, d4c_kl_neg_mean (a loop variable "name" overwrote the template's)
        diag[f"d4c_{k}_mean"] = float(fv[k][mask].double().mean())
    s = sensitivity(lp["base"], lp["pos"], lp["neg"], mask)
    A = torch.where(correct, 1.0, -1.0)
    thr = calibrate_threshold(s, mask, 0.8)
    _, stats = cscr_token_advantages(A, lp["base"], lp["pos"], lp["neg"], mask, threshold=thr, return_stats=True)
    top = torch.topk(torch.where(mask, s, torch.full((), -1.0)).flatten(), min(num_examples, int(mask.sum())))
    examples = []
    for sv, f in zip(top.values.tolist(), top.indices.tolist()):
        i, j = divmod(f, T)
        tid = int(resp_ids[i, j])
        examples.append({"row": i, "t": j, "token": text_of[tid], "class": "surface" if bool(surf[i, j]) else "content",
                         "s": sv, "delta_pos": float(lp["pos"][i, j] - lp["base"][i, j]),
                         "delta_neg": float(lp["neg"][i, j] - lp["base"][i, j])})
    report = {
        "config": {"num_trajectories": N, "template": name if name != "custom" else list(_resolve_template(template)[1]),
                   "max_new_tokens": max_new_tokens, "temperature": temperature, "top_p": top_p, "top_k": top_k,
                   "seed": seed, "tau": tau, "top_frac": top_frac, "sens_top_frac": sens_top_frac},
        "num_correct": int(correct.sum()),
        "accuracy": float(correct.double().mean()),
        "mean_response_length": float(mask.sum(1).double().mean()),
        "diagnostics": diag,
        "suggested_threshold_q80": thr,
        "cscr_stats_at_q80_alpha1": stats,
        "most_sensitive_tokens": examples,
        "example_condition_prompts": list(cond[0]),
        "paper_reference": PAPER_REFERENCE,
    }
    report = _json_safe(report)
    if output_dir is not None:
        os.makedirs(output_dir, exist_ok=True)
        with open(os.path.join(output_dir, "report.json"), "w", encoding="utf-8") as f:
            json.dump(report, f, indent=2, ensure_ascii=False)
        _plots(output_dir, lp, mask, s, surf)
    if return_tensors:
        tensors = {"response_ids": resp_ids, "response_mask": mask, "lp_base": lp["base"], "lp_correct": lp["pos"],
                   "lp_incorrect": lp["neg"], "entropy": ent, "top1_prob": top1, "surface": surf, "correct": correct,
                   "fv_cosine": fv["cosine"], "fv_kl_pos": fv["kl_pos"], "fv_kl_neg": fv["kl_neg"],
                   "prompts": ctx["base"], "prompts_correct": ctx["pos"], "prompts_incorrect": ctx["neg"]}
        return report, tensors
    return report


def _plots(output_dir, lp, mask, s, surf):
    """Scatter of D+ vs D- and histogram of s by token class (only if matplotlib is installed)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    dp = (lp["pos"] - lp["base"])[mask].numpy()
    dn = (lp["neg"] - lp["base"])[mask].numpy()
    fig, ax = plt.subplots(figsize=(5, 5))
    ax.scatter(dp, dn, s=3, alpha=0.3)
    lim = float(max(abs(dp).max(), abs(dn).max(), 1e-3))
    ax.plot([-lim, lim], [-lim, lim], lw=0.5, color="gray")
    ax.axhline(0, lw=0.5, color="gray")
    ax.axvline(0, lw=0.5, color="gray")
    ax.set_xlabel("Δ+ = l+ − l0 (nats)")
    ax.set_ylabel("Δ− = l− − l0 (nats)")
    ax.set_title("CSCR diagnostic: shifts under c+ and c−")
    fig.tight_layout()
    fig.savefig(os.path.join(output_dir, "delta_scatter.png"), dpi=120)
    plt.close(fig)
    fig, ax = plt.subplots(figsize=(6, 4))
    for sel, label in ((mask & surf, "surface"), (mask & ~surf, "content")):
        if int(sel.sum()):
            ax.hist(s[sel].numpy(), bins=50, alpha=0.5, label=label, density=True)
    ax.set_xlabel("sensitivity s (nats)")
    ax.set_ylabel("density")
    ax.legend()
    fig.tight_layout()
    fig.savefig(os.path.join(output_dir, "s_by_class.png"), dpi=120)
    plt.close(fig)


def _read_jsonl(path):
    rows = []
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if line.strip():
                row = json.loads(line)
                for key in ("problem", "answer"):
                    if key not in row:
                        raise ValueError(f"{path}:{n}: missing field {key!r}")
                rows.append(row)
    return rows


def _import_toy():
    try:
        import toy
    except ImportError as e:
        raise SystemExit(f"--model/--data toy needs the project's toy.py (import failed: {e})") from e
    return toy


def main(argv=None):
    """CLI: ``python cscr.py --diagnose --model M --data D --num_trajectories N [options]``."""
    import argparse

    ap = argparse.ArgumentParser(description="CSCR diagnostics (spec §7): re-score on-policy trajectories under c+ / c-.")
    ap.add_argument("--diagnose", action="store_true", required=True, help="run the diagnostic study")
    ap.add_argument("--model", required=True, help="model folder (transformers) or 'toy'")
    ap.add_argument("--data", required=True, help="jsonl file with {id, problem, answer, source} rows, or 'toy'")
    ap.add_argument("--num_trajectories", type=int, default=400, help="paper: 400")
    ap.add_argument("--output_dir", default="runs/cscr_diagnose")
    ap.add_argument("--template", default="verdict", choices=sorted(CONDITION_TEMPLATES))
    ap.add_argument("--prompt_template", default="auto", choices=["auto", "none", "qwen_math", "r1"],
                    help="the training prompt template (rollout.py); auto: none for the toy, qwen_math otherwise")
    ap.add_argument("--max_new_tokens", type=int, default=64)
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--top_p", type=float, default=1.0)
    ap.add_argument("--top_k", type=int, default=0, help="0 = off")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--gen_batch_size", type=int, default=16)
    ap.add_argument("--micro_batch_size", type=int, default=8)
    ap.add_argument("--tau", type=float, default=0.05)
    ap.add_argument("--top_frac", type=float, default=0.1)
    ap.add_argument("--device", default=None, help="default: cuda if available else cpu")
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    args = ap.parse_args(argv)

    from transformers import AutoModelForCausalLM, AutoTokenizer

    import rollout  # the project's prompt templates and stop tokens (CLI only; the library needs torch alone)

    prompt_template = rollout.resolve_template(args.prompt_template, args.model)
    model_path = _import_toy().ensure_toy_model() if args.model == "toy" else args.model
    rows = _import_toy().load_split("train") if args.data == "toy" else _read_jsonl(args.data)
    try:
        import verify
    except ImportError as e:
        raise SystemExit(f"the grader needs the project's verify.py (import failed: {e})") from e
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=getattr(torch, args.dtype)).to(device)
    report = diagnose(
        model, tokenizer, [r["problem"] for r in rows], [r["answer"] for r in rows], args.num_trajectories,
        grade_fn=lambda text, ref: bool(verify.verify(text, ref)),
        prompt_fn=lambda p: rollout.apply_template(p, prompt_template),
        stop_ids=rollout.stop_token_ids(tokenizer, prompt_template),
        template=args.template, max_new_tokens=args.max_new_tokens, temperature=args.temperature,
        top_p=args.top_p, top_k=args.top_k, seed=args.seed, gen_batch_size=args.gen_batch_size,
        micro_batch_size=args.micro_batch_size, tau=args.tau, top_frac=args.top_frac, output_dir=args.output_dir,
    )
    d = report["diagnostics"]
    print(json.dumps({k: d.get(k) for k in ("d1_same_direction_rate", "d3_polarity_outcome_consistency",
                                             "d4a_pearson", "d4b_topk_jaccard", "d4c_cosine_mean",
                                             "d5_common_mode_share", "d6_surface_share_top")}, indent=2))
    print(f"report: {os.path.join(args.output_dir, 'report.json')}")
    return report


if __name__ == "__main__":
    main()
