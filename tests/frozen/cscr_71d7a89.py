"""CSCR: Counterfactual Sensitivity Credit Reallocation, a GRPO extension that moves credit off sensitive tokens.

Paper: He, Wu, Wang, "Not All Tokens Deserve Equal Credit: Counterfactual Sensitivity Credit Reallocation for
Long-CoT Reasoning", arXiv 2607.27888 (2026).  Spec: ``docs/specs/cscr.md`` ("spec §N").  The paper's full text
was NOT available, only its abstract [S] and digests of the full PDF [S2]; the rest is our reading [I], exposed
as an option whose default is the spec's primary reading.

What CSCR does, in the order of this file: GRPO gives every token of response i its advantage A_i.  CSCR keeps
each sampled response fixed and re-scores it, with the same weights and no gradient, under two privileged prompts
of opposite polarity: c+ asserts that the response is correct, c- that it is incorrect [S].  Per token (m =
response mask, L_i = number of valid tokens)::

    §3 condition prompts  x + c+,  x + c-                                              build_condition_prompts
    §4 scoring            old_logp = log pi(y_t | x,      y_<t)   the trainer's old-log-prob pass
                          lp_pos_t = log pi(y_t | x + c+, y_<t)                        condition_logprobs
                          lp_neg_t = log pi(y_t | x + c-, y_<t)
    §4 sensitivity        d_pos = lp_pos - old_logp,  d_neg = lp_neg - old_logp
                          s_t = max(|d_pos_t|, |d_neg_t|)  (nats)  [S2]                 sensitivity
    §5 weights            w_t = max(w_min, exp(-alpha * max(0, s_t - lambda)))  [S2]    credit_log_weights
    §5 reallocation       w_bar_i = (1/L_i) sum_t m_t w_t                               cscr_token_advantages
                          A_i,t   = A_i * (w_t / w_bar_i) * m_t    (Â ``adv``, Ã ``token_adv``)
    §5 calibration        lambda = a quantile of s over the first batch, then frozen     calibrate_threshold

so sign(A_i,t) = sign(A_i) and sum_t A_i,t = L_i * A_i: the verifier's direction and the credit budget are kept
and the sensitive tokens' credit goes to the others [S].  s, w and A_i,t are constants in the loss (no gradient).

# inferred choice [I]                      option                    default; alternatives
1 wording of c+ / c- (spec §3)             template                  "verdict" (A); "reference" (B), "answer" (C)
2 where the note goes (spec §3)            marker, turn_end, anchor  end of the last user turn (ChatML)
3 tokenisation of the conditioned prompts  none: the rule below      tokenizer(prompt), as the rollout
4 scorer: rollout weights, eval mode (§4)  eval_mode, temperature    True, the sampling temperature
5 sampled-token shifts; aggregation (§4)   mode                      "max" [S2]; "mean", "common"
6 exact weight map (§5)                    weight                    "exp"; "exp_abs", "inverse"; the spec §9
                                                                     ablations "upweight", "sign_aware"
7 decay alpha; threshold lambda, nats (§5) alpha; threshold          1.0; 0.2 or calibrate_threshold(q = 0.8)
8 weight floor (§5 suggests 0.1)           w_min                     0.0 (the spec §8 example)
9 normalisation scope ([S2]: per sequence) scope, group_size         "sequence"; "group", "batch" (ablations)

Ablations (spec §9, ``weight=``; the same renormalisation, so signs and budgets are kept as above) [I]:
"upweight" (§9.3, SC-GRPO/RLSD-like: log w = +alpha * max(0, s - lambda), the sensitive tokens get MORE credit);
"sign_aware" (§9.1, the direction ablation in the RLSD form of arXiv 2604.03128 with the RLCSD repo's RLSD config
eps_w = 0.2, mix = 0.5: w = (1 - mix) + mix * clip(exp(sign(A_i) * d_pos), 1 - eps_w, 1 + eps_w), trusting the
direction of the c+ shift).  The strength ablation (§9.2) is the alpha / lambda sweep of the default map.
Left out on purpose: the loss (the trainer's clipped GRPO surrogate with these token advantages, spec §6); the
trainer's own old-log-prob pass (ℓ0 below is the same pass, for a trainer without one); full-vocabulary shifts
(diagnostics only, spec §4); pooling s over processes before calibration (the trainer's).
Read next: ``grpo.py`` ``Credit._cscr`` (the trainer's call), ``cscr_diagnostics.py`` (the paper's diagnostics
D1-D7 and their CLI), ``tests/test_cscr.py`` (the spec §8 worked example), spec §6-§7.

Usage from any trainer (``model`` in eval mode; ``prompts``: the B rollout prompt texts x; ``response_ids``,
``response_mask``: [B, T] right-padded sampled responses; ``adv``: [B] sequence advantages Â; temperature 1).  ℓ0
(``old_logp``) is your trainer's old-log-prob pass if it matches ``default_logprob_fn`` (positions, temperature)::

    import cscr, torch

    inputs = cscr.scoring_inputs(tokenizer, prompts, response_ids, response_mask)  # [x | y] rows [B, P + T]
    with torch.no_grad():
        old_logp = cscr.default_logprob_fn(model, *inputs, response_mask, 1.0)    # ℓ0 = log pi(y_t | x, y_<t) [B, T]
    pairs = [cscr.build_condition_prompts(x) for x in prompts]                      # (x + c+, x + c-) per response
    lp_pos, lp_neg = cscr.condition_logprobs(                                       # ℓ+, ℓ- [B, T]: two no-grad passes
        model, tokenizer, [x_pos for x_pos, _ in pairs], [x_neg for _, x_neg in pairs], response_ids, response_mask)
    token_adv = cscr.cscr_token_advantages(adv, old_logp, lp_pos, lp_neg, response_mask)   # Ã [B, T]

TOKENISATION RULE: a conditioned prompt is tokenised exactly as the rollout prompt was: ``scoring_inputs``
calls ``tokenizer(prompt)``, the tokenizer's default call (its special tokens, e.g. a BOS, included), as the
project's rollout does for x.  If your trainer tokenised its prompts another way, pass token ids built that way.
Conventions: response masks bool or float 0/1; log-probs in nats; responses right-padded; groups contiguous.
Imports only torch and the standard library.
"""

from __future__ import annotations

import inspect
import math

import torch

__all__ = ["CONDITION_TEMPLATES", "DEFAULT_MARKER", "DEFAULT_TURN_END", "build_condition_prompts", "scoring_inputs",
           "default_logprob_fn", "condition_logprobs", "sensitivity", "credit_log_weights", "credit_weights",
           "cscr_token_advantages", "calibrate_threshold", "condition_notes", "condition_shifts"]

# ---- Spec §3: condition prompts (the two outcome conditions) -----------------------------------------------------

# [I] Wording is ours (no template text was available).  Each pair is a minimal pair: the two strings differ
# only in the verdict word(s), so whatever is common to "being handed privileged outcome information" cancels
# when the two conditions are compared.  Placeholders {reference} (the gold answer) and {answer} (this
# response's extracted answer) are substituted with str.replace: LaTeX braces in the values need no escaping.
_VERIFIED = "Note: a verifier has already checked the response that follows.\nVerdict: "
_VERDICT = _VERIFIED + "the final answer of this response is "
_REFERENCE = "Here is the reference answer to this problem.\nCorrect final answer: {reference}\n\n"
CONDITION_TEMPLATES = {
    # A (primary, spec §3 row A): assert correctness / incorrectness of this response.
    "verdict": (_VERDICT + "CORRECT.", _VERDICT + "INCORRECT."),
    # B (row B): an OPSD-style reference block with the gold answer, plus the same verdict.
    "reference": (_REFERENCE + _VERDICT + "CORRECT.", _REFERENCE + _VERDICT + "INCORRECT."),
    # C (row C): this response's own answer is / is not the correct final answer (the minimal pair is " not ").
    "answer": (_VERIFIED + "{answer} is the correct final answer.",
               _VERIFIED + "{answer} is not the correct final answer."),
    # A without the verifier sentence (not from the paper): cheap extra passes with a character-level tokenizer.
    "verdict_short": ("Verdict: CORRECT.", "Verdict: INCORRECT."),
}
_TEMPLATE_ALIASES = {"A": "verdict", "B": "reference", "C": "answer"}

DEFAULT_MARKER = "<|im_start|>assistant"  # ChatML (Qwen) assistant header
DEFAULT_TURN_END = "<|im_end|>"  # ChatML end-of-turn token


def condition_notes(template):
    """The notes c+, c− of ``template`` (spec §3): (name, (note_pos, note_neg)) of a name, alias or custom pair."""
    name = _TEMPLATE_ALIASES.get(template, template) if isinstance(template, str) else None
    if name in CONDITION_TEMPLATES:
        return name, CONDITION_TEMPLATES[name]
    if isinstance(template, (tuple, list)) and len(template) == 2 and all(isinstance(t, str) and t for t in template):
        return "custom", (template[0], template[1])
    raise ValueError(f"template must be one of {sorted(CONDITION_TEMPLATES)} (or A/B/C) or a (note_pos, note_neg) "
                     f"tuple of non-empty strings, got {template!r}")


def _insert_note(prompt, note, marker, turn_end, anchor):
    """Insert ``note`` into ``prompt`` so that the prompt's ending is unchanged (see build_condition_prompts)."""
    if anchor is not None:
        i = prompt.rfind(anchor)
        if i < 0:
            raise ValueError(f"anchor {anchor!r} does not occur in prompt")
        j = i + len(anchor)
        return prompt[:j] + "\n\n" + note + prompt[j:]
    at = prompt.rfind(marker) if marker else -1
    if at >= 0:
        # Chat-templated prompt: the note ends the last user turn (right before the end-of-turn token preceding
        # the final assistant header); everything from there on is kept byte for byte.
        end = prompt.rfind(turn_end, 0, at) if turn_end else -1
        if end >= 0:
            return prompt[:end] + "\n\n" + note + prompt[end:]
        return prompt[:at] + note + "\n\n" + prompt[at:]  # no end-of-turn token: own lines before the header
    # Plain text (e.g. the toy "Compute 37+48-12.\n"): the ending is the trailing whitespace if there is any,
    # else the whole last line; the note goes as its own line before it.
    body = prompt.rstrip()
    if len(body) < len(prompt):
        return body + "\n" + note + prompt[len(body):]
    nl = prompt.rfind("\n")
    return prompt[: nl + 1] + note + "\n" + prompt[nl + 1 :]


def build_condition_prompts(prompt, reference=None, response_answer=None, template="verdict", *,
                            marker=DEFAULT_MARKER, turn_end=DEFAULT_TURN_END, anchor=None):
    """The two privileged prompts ``(x + c+, x + c-)`` of one rollout prompt x (spec §3).

    Source: abstract [S] (re-score each fixed trajectory under a context asserting it is correct and one asserting
    it is incorrect); [S2] "counterfactual privileged prompts of opposite polarity"; wording and placement [I].
    The two strings differ only in the verdict word(s).  The response ids are reused unchanged, so each prompt
    ends exactly as ``prompt`` ends.  The note goes (first match):

    1. with ``anchor``: as ``"\\n\\n" + note`` right after the last ``anchor`` (e.g. the raw problem text: the
       spec §3 layout, between the problem and the answer-format instruction);
    2. if ``marker`` (``"<|im_start|>assistant"``) occurs: at the end of the last user turn, as ``"\\n\\n" +
       note`` before the last ``turn_end`` (``"<|im_end|>"``) preceding the last marker (without one, as ``note +
       "\\n\\n"`` before the marker).  Llama-3: ``"<|start_header_id|>assistant"`` / ``"<|eot_id|>"``.  Qwen3's
       ``enable_thinking`` only changes text after the marker, which is copied unchanged;
    3. plain text: as its own line before the trailing whitespace (``"Compute 7+5.\\n"`` -> ``"Compute 7+5.\\n" +
       note + "\\n"``), else before the last line (``"Q\\nAnswer:"`` -> ``"Q\\n" + note + "\\nAnswer:"``).

    ``prompt`` is the templated rollout prompt x (str); ``template`` is ``"verdict"`` (A), ``"reference"`` (B,
    needs ``reference``, the gold final answer), ``"answer"`` (C, needs ``response_answer``, this response's
    extracted answer), their aliases "A"/"B"/"C", ``"verdict_short"``, or a ``(note_pos, note_neg)`` tuple of
    custom strings (with optional ``{reference}`` / ``{answer}``).  Returns ``(prompt_pos, prompt_neg)``, two str.
    Raises ValueError: unknown template, a needed value missing, ``prompt`` not a str, ``anchor`` not found.
    """
    if not isinstance(prompt, str):
        raise ValueError(f"prompt must be a str, got {type(prompt).__name__}")
    name, (note_pos, note_neg) = condition_notes(template)
    notes = []
    for note in (note_pos, note_neg):
        for key, value, what in (("{reference}", reference, "`reference` (the gold final answer)"),
                                 ("{answer}", response_answer, "`response_answer` (this response's own answer)")):
            if key in note:
                if value is None:
                    raise ValueError(f"template {name!r} needs {what}")
                note = note.replace(key, str(value))
        notes.append(note)
    return tuple(_insert_note(prompt, n, marker, turn_end, anchor) for n in notes)


# ---- Spec §4, §6 step 2: scoring the fixed responses under c+ and c- (two no-grad prefill passes) ----------------

def _as_mask(response_mask):
    """[B, T] bool view of a bool/float 0-1 response mask."""
    if not torch.is_tensor(response_mask):
        raise ValueError("response_mask must be a torch.Tensor")
    return response_mask if response_mask.dtype == torch.bool else response_mask != 0


_POS_CHUNK = 1024  # positions per float32 chunk of [b, chunk, V] (bounds memory for long responses)


def _response_logits(model, input_ids, attention_mask, T):
    """Logits [b, T, V] (model dtype) predicting the last ``T`` tokens of ``input_ids`` ([prompt | response])."""
    kwargs = {}
    try:  # only compute the T+1 logits we need when the model supports it (HF causal LMs do)
        if "logits_to_keep" in inspect.signature(model.forward).parameters:
            kwargs["logits_to_keep"] = T + 1
    except (TypeError, ValueError):
        pass
    # Left padding: the first real token gets position 0 (Qwen3 would use arange(L) without position_ids).
    position_ids = (attention_mask.long().cumsum(-1) - 1).clamp(min=0)
    out = model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, use_cache=False,
                **kwargs)
    logits = out.logits if hasattr(out, "logits") else out[0]
    return logits[:, -(T + 1) : -1, :]  # position j predicts token j+1


def default_logprob_fn(model, input_ids, attention_mask, response_mask, temperature):
    """log pi(y_t | ., y_<t) = z_t[y_t]/temp - logsumexp(z_t/temp), nats, of the response part of the inputs.

    ``input_ids`` [B, L]: left-padded ``[prompt | response]`` rows, the response in the last T columns; position
    ids = cumsum(attention_mask) - 1 (the trainer's old_logp pass should use the same convention, or d_pos / d_neg pick
    up the difference).  In chunks of positions; returns float32 [B, T] (float64 for a float64 model), 0 off the mask.
    """
    T = response_mask.shape[1]
    logits = _response_logits(model, input_ids, attention_mask, T)
    targets = input_ids[:, -T:]
    lp = torch.zeros(targets.shape, dtype=torch.promote_types(logits.dtype, torch.float32), device=logits.device)
    for a in range(0, T, _POS_CHUNK):  # positions a, ..., a + _POS_CHUNK - 1
        z = logits[:, a : a + _POS_CHUNK].to(lp.dtype) / temperature  # [B, chunk, V]
        tgt = targets[:, a : a + _POS_CHUNK].unsqueeze(-1)  # [B, chunk, 1]
        lp[:, a : a + _POS_CHUNK] = z.gather(-1, tgt).squeeze(-1) - torch.logsumexp(z, dim=-1)  # [B, chunk]
    return torch.where(_as_mask(response_mask).to(lp.device), lp, torch.zeros((), dtype=lp.dtype, device=lp.device))


def scoring_inputs(tokenizer, prompts, response_ids, response_mask):
    """The model inputs that score fixed responses after ``prompts``: ``(input_ids, attention_mask)`` [B, P + T].

    One builder for the plain prompts x (ℓ0, ``old_logp``) and the conditioned x + c± (ℓ±, ``condition_logprobs``):
    each str prompt tokenised by THE TOKENISATION RULE (``tokenizer(prompt)``; token ids used as given), left-padded
    to the longest (P) with ``tokenizer.pad_token_id``, then its response right-padded as given (padded slots get the
    pad id and mask 0, so they may hold e.g. -100).  ``prompts``: B str or token ids; ``response_ids`` [B, T] long;
    ``response_mask`` [B, T] bool/float.  Returns long tensors on ``response_ids.device``, for ``default_logprob_fn``.
    Raises ValueError: no pad token, a prompt of no token.
    """
    pad_id = getattr(tokenizer, "pad_token_id", None)
    if pad_id is None:
        raise ValueError("tokenizer.pad_token_id must be set (e.g. tokenizer.pad_token = tokenizer.eos_token)")
    prompt_ids = [list(tokenizer(p)["input_ids"]) if isinstance(p, str) else torch.as_tensor(p).reshape(-1).tolist()
                  for p in prompts]
    if any(len(ids) == 0 for ids in prompt_ids):
        raise ValueError("every prompt must tokenise to at least one token")
    m = _as_mask(response_mask)
    b, T = response_ids.shape
    P = max(len(p) for p in prompt_ids)
    device = response_ids.device
    input_ids = torch.full((b, P + T), pad_id, dtype=torch.long, device=device)
    attn = torch.zeros((b, P + T), dtype=torch.long, device=device)
    for i, ids in enumerate(prompt_ids):
        input_ids[i, P - len(ids) : P] = torch.tensor(ids, dtype=torch.long, device=device)
        attn[i, P - len(ids) : P] = 1
    input_ids[:, P:] = torch.where(m, response_ids.long(), torch.full_like(response_ids, pad_id).long())
    attn[:, P:] = m.long()
    return input_ids, attn


def condition_logprobs(model, tokenizer, prompts_pos, prompts_neg, response_ids, response_mask, temperature=1.0,
                       micro_batch_size=None, logprob_fn=None, *, adv=None, eval_mode=True):
    """Log-probs lp_pos, lp_neg of each fixed sampled response under its c+ and its c- prompt (spec §4).

    Source: abstract [S] (re-score a fixed trajectory under two opposing outcome conditions); spec §4 (rollout-
    time weights, no grad), §6 step 2.  old_logp is the trainer's old-log-prob pass.  With ``adv`` [B], only
    the rows with A_i != 0 are scored (the others stay 0: CSCR gives them no credit anyway).

    TOKENISATION RULE (one rule for every caller, no option): a str prompt is tokenised with
    ``tokenizer(prompt)``, the tokenizer's default call with its special tokens (e.g. a BOS), exactly as the
    rollout tokenised the plain prompt x; token ids are used as given (pass ids if your trainer tokenised x
    another way).  Rows: ``scoring_inputs`` (left-padded ``[prompt | response]``, ``tokenizer.pad_token_id``,
    whatever ``tokenizer.padding_side`` says), position ids = cumsum(mask) - 1.  No grad; with ``eval_mode`` the
    model is in eval mode during the passes (no dropout noise in d_pos, d_neg) and restored afterwards.

    Args:
        model: causal LM (``model(input_ids=, attention_mask=, position_ids=)`` -> ``.logits``); tokenizer: with a
            ``pad_token_id``.  prompts_pos, prompts_neg: B prompts each (str or token ids).
        response_ids: LongTensor [B, T], right-padded responses.  response_mask: [B, T] bool/float.
        temperature: float > 0, the sampling temperature.  micro_batch_size: rows per pass (None: all).
        logprob_fn: ``fn(model, input_ids, attention_mask, response_mask, temperature) -> [b, T]``, e.g. the
            trainer's own token log-prob function; default ``default_logprob_fn``.

    Returns (lp_pos, lp_neg): float32 [B, T] nats (float64 for a float64 model) on ``response_ids.device``, 0 off mask.
    Raises ValueError: shapes or lengths disagree, temperature <= 0, micro_batch_size < 1, no pad token, empty prompt.
    """
    if not torch.is_tensor(response_ids) or response_ids.dim() != 2:
        raise ValueError("response_ids must be a [B, T] tensor")
    m = _as_mask(response_mask)
    if m.shape != response_ids.shape:
        raise ValueError(f"response_mask shape {tuple(m.shape)} != response_ids shape {tuple(response_ids.shape)}")
    B = response_ids.shape[0]
    if len(prompts_pos) != B or len(prompts_neg) != B:
        raise ValueError(f"prompts_pos ({len(prompts_pos)}) and prompts_neg ({len(prompts_neg)}) must each have "
                         f"B = {B} entries")
    if not temperature > 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    if micro_batch_size is not None and micro_batch_size < 1:
        raise ValueError(f"micro_batch_size must be >= 1 or None, got {micro_batch_size}")
    if getattr(tokenizer, "pad_token_id", None) is None:  # before any pass (scoring_inputs checks it too)
        raise ValueError("tokenizer.pad_token_id must be set (e.g. tokenizer.pad_token = tokenizer.eos_token)")
    logprob_fn = logprob_fn or default_logprob_fn
    rows = torch.arange(B) if adv is None else (torch.as_tensor(adv).cpu() != 0).nonzero().flatten()
    size = micro_batch_size or max(len(rows), 1)
    try:
        device = next(model.parameters()).device
        dtype = torch.promote_types(next(model.parameters()).dtype, torch.float32)  # float64 for a float64 model
    except (StopIteration, AttributeError):
        device, dtype = response_ids.device, torch.float32

    was_training = getattr(model, "training", False)
    if eval_mode and was_training:
        model.eval()
    try:
        outs = []
        with torch.no_grad():
            for prompts in (prompts_pos, prompts_neg):
                lp = torch.zeros(response_ids.shape, dtype=dtype, device=response_ids.device)
                for a in range(0, len(rows), size):
                    idx = rows[a:a + size].to(response_ids.device)  # this pass's rows
                    inputs = scoring_inputs(tokenizer, [prompts[i] for i in idx.tolist()], response_ids[idx].to(device),
                                            m[idx].to(device))
                    out = logprob_fn(model, *inputs, m[idx].to(device), temperature)  # [b, T]
                    lp[idx] = torch.where(m[idx], out.to(lp), lp.new_zeros(()))
                outs.append(lp)
    finally:
        if eval_mode and was_training:
            model.train()
    return outs[0], outs[1]


# ---- Spec §4: per-token counterfactual sensitivity ---------------------------------------------------------------

_MODES = ("max", "mean", "common")


def condition_shifts(old_logp, lp_pos, lp_neg, response_mask):
    """Spec §4's shifts d± = ℓ± − ℓ0 [B, T] (nats, 0 on padding: replaced BEFORE subtracting, no NaN) and the mask."""
    for name, t in (("old_logp", old_logp), ("lp_pos", lp_pos), ("lp_neg", lp_neg)):
        if not torch.is_tensor(t) or t.dim() != 2:
            raise ValueError(f"{name} must be a [B, T] tensor")
    m = _as_mask(response_mask)
    for name, t in (("lp_pos", lp_pos), ("lp_neg", lp_neg), ("response_mask", m)):
        if t.shape != old_logp.shape:
            raise ValueError(f"{name} shape {tuple(t.shape)} != old_logp shape {tuple(old_logp.shape)}")
    dt = torch.promote_types(torch.promote_types(torch.promote_types(old_logp.dtype, lp_pos.dtype), lp_neg.dtype),
                             torch.float32)
    zero = torch.zeros((), dtype=dt, device=old_logp.device)
    l0, l_pos, l_neg = (torch.where(m, t.detach().to(dt), zero) for t in (old_logp, lp_pos, lp_neg))
    return l_pos - l0, l_neg - l0, m  # spec §4: d_pos = lp_pos - old_logp, d_neg = lp_neg - old_logp


def sensitivity(old_logp, lp_pos, lp_neg, response_mask, mode="max"):
    """Per-token counterfactual sensitivity s_t in nats (spec §4) from old_logp, lp_pos, lp_neg [B, T] (nats).

    ``mode="max"`` (default, [S2] "the maximum of the likelihood shifts under the two conditions"):
    s = max(|d_pos|, |d_neg|);  ``"mean"`` [I]: (|d_pos| + |d_neg|)/2;  ``"common"`` [I]: |d_pos + d_neg|/2 (the
    polarity-independent part); d_pos = lp_pos - old_logp, d_neg = lp_neg - old_logp, sampled-token log-probs [I].
    Padded positions are set to 0 before subtracting, so -inf - (-inf) cannot give NaN.

    Returns a [B, T] tensor (float32 or float64), >= 0, 0 on padding, without gradient.  Raises ValueError on an
    unknown mode or a shape mismatch.
    """
    if mode not in _MODES:
        raise ValueError(f"mode must be one of {_MODES}, got {mode!r}")
    d_pos, d_neg, m = condition_shifts(old_logp, lp_pos, lp_neg, response_mask)
    s = (torch.maximum(d_pos.abs(), d_neg.abs()) if mode == "max" else 0.5 * (d_pos.abs() + d_neg.abs())
         if mode == "mean" else (0.5 * (d_pos + d_neg)).abs())  # "common"
    return torch.where(m, s, torch.zeros((), dtype=s.dtype, device=s.device))


# ---- Spec §5: weights --------------------------------------------------------------------------------------------

_WEIGHTS = ("exp", "exp_abs", "inverse", "upweight", "sign_aware")
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


def credit_log_weights(s, threshold=0.2, alpha=1.0, w_min=0.0, weight="exp"):
    """log w_t [B, T] from s [B, T] (nats), spec §5: −α·max(0, s − λ) for "exp" (others: ``credit_weights``, its exp
    on valid tokens, which validates), floored at log w_min; in logs, w_t / w̄_i stays exact when all w underflow
    (or, for "upweight", overflow).  ``weight="sign_aware"`` needs Â and d_pos: ValueError (use
    ``cscr_token_advantages``)."""
    excess = (s - threshold).clamp(min=0.0)  # max(0, s - lambda)
    if weight == "exp":
        log_w = -alpha * excess
    elif weight == "exp_abs":
        log_w = torch.where(s > threshold, -alpha * s, torch.zeros_like(s))
    elif weight == "inverse":
        log_w = -torch.log1p(alpha * excess)
    elif weight == "upweight":  # spec §9.3: the sensitive tokens get more credit (w >= 1, so w_min has no effect)
        log_w = alpha * excess
    elif weight == "sign_aware":
        raise ValueError("weight='sign_aware' needs the advantages and lp_pos: use cscr.cscr_token_advantages")
    else:
        raise ValueError(f"weight must be one of {_WEIGHTS}, got {weight!r}")
    if w_min > 0:  # floor against budget concentration (spec §5): log max(w_min, w)
        log_w = log_w.clamp(min=math.log(w_min))
    return log_w


def credit_weights(s, response_mask, threshold=0.2, alpha=1.0, w_min=0.0, weight="exp"):
    """Un-normalised token weights w_t [B, T] from the sensitivity s [B, T] (nats) (spec §5).

    [S2]: highly sensitive tokens are down-weighted exponentially, tokens below the threshold keep full weight.
    Exact form [I] (``weight``); ``threshold`` = lambda (nats), ``alpha`` >= 0 (0 gives w = 1), ``w_min`` in [0, 1]:

    - ``"exp"`` (default): w = max(w_min, exp(-alpha * max(0, s - threshold)))  (continuous at the threshold)
    - ``"exp_abs"``:       w = max(w_min, exp(-alpha * s)) if s > threshold else 1
    - ``"inverse"``:       w = max(w_min, 1 / (1 + alpha * max(0, s - threshold)))
    - ``"upweight"``:      w = exp(+alpha * max(0, s - threshold)) >= 1 (spec §9.3 ablation; w_min has no effect;
      w may overflow to inf here, ``cscr_token_advantages`` normalises in log space and stays finite)
    - ``"sign_aware"``:    not here (it needs Â and d_pos): ``cscr_token_advantages``

    Returns w in [w_min, 1] ([1, inf] for "upweight") on valid tokens, 0 on padding (no gradient).  Raises
    ValueError: alpha < 0, w_min outside [0, 1], non-finite threshold, unknown weight or "sign_aware", shapes.
    """
    _check_weight_args(threshold, alpha, w_min, weight)
    m = _as_mask(response_mask)
    if not torch.is_tensor(s) or s.shape != m.shape:
        raise ValueError(f"s must be a tensor with the response_mask shape {tuple(m.shape)}")
    w = torch.exp(credit_log_weights(s.detach(), threshold, alpha, w_min, weight))
    return torch.where(m, w, torch.zeros((), dtype=w.dtype, device=w.device))


# ---- Spec §5: reallocation ---------------------------------------------------------------------------------------

def cscr_token_advantages(adv, old_logp, lp_pos, lp_neg, response_mask, threshold=0.2, alpha=1.0, w_min=0.0,
                          mode="max", *, weight="exp", scope="sequence", group_size=None, return_stats=False,
                          sign_eps=0.2, sign_mix=0.5):
    """CSCR token advantages [B, T]: down-weight sensitive tokens, keep the sign and the per-sequence credit budget.

    Source: abstract [S] (reduce the credit of highly sensitive tokens; renormalise so that the credit budget and
    the verifier-determined direction are kept); [S2] exponential down-weighting above a threshold lambda,
    normalisation within each sequence; exact form spec §5 [I] (m = response mask, L_i = its row sum)::

        s_t     = sensitivity(old_logp, lp_pos, lp_neg)                  (spec §4, ``mode``)
        w_t     = max(w_min, exp(-alpha * max(0, s_t - lambda)))    (``credit_weights``, ``weight``)
        w_bar_i = (1/L_i) sum_t m_t w_t
        A_i,t   = A_i * (w_t / w_bar_i) * m_t

    Properties (scope "sequence"): sign(A_i,t) = sign(A_i) on valid tokens; sum_t A_i,t = L_i * A_i, exactly, even
    when every w underflows (alpha = 30); alpha = 0, all s <= lambda, or A_i = 0 give exactly GRPO.  Rows with
    A_i = 0 need no scoring (their log-probs may be left 0) and get 0.  No gradient.  Ablations (spec §5 "scope",
    §9.3) [I]: ``scope="group"`` (one w_bar per ``group_size`` contiguous rows) or ``"batch"`` (one w_bar), over
    the valid tokens of rows with adv != 0; they keep the signs, not the per-sequence budget.

    Weight ablations (spec §9) [I], both with the same renormalisation (so the properties above still hold):
    ``weight="upweight"`` (§9.3): w_t = exp(+alpha * max(0, s_t - lambda)), the sensitive tokens get more credit
    (alpha = 0 gives GRPO; w_min has no effect).  ``weight="sign_aware"`` (§9.1, the direction ablation, RLSD form
    arXiv 2604.03128, eps_w = ``sign_eps``, mix = ``sign_mix`` as in the RLCSD repo's RLSD config)::

        w_t = max(w_min, (1 - mix) + mix * clip(exp(sign(A_i) * d_pos_t), 1 - eps_w, 1 + eps_w)),
        d_pos_t = lp_pos_t - old_logp_t

    (threshold, alpha and mode do not enter w; s is still computed for the stats; mix = 0 or eps_w = 0 gives GRPO).

    Args:
        adv: [B] sequence advantages Â_i.  old_logp, lp_pos, lp_neg: [B, T] sampled-token log-probs under x,
            x + c+, x + c- (nats).  response_mask: [B, T] bool/float.
        threshold (lambda, nats; or ``calibrate_threshold``), alpha, w_min, weight: see ``credit_weights``.
        mode: see ``sensitivity``.  scope, group_size: see above.  return_stats: also return a dict for logging.
        sign_eps (eps_w in [0, 1)), sign_mix (in [0, 1]): the "sign_aware" weight only.

    Returns:
        [B, T] (dtype of the log-probs, at least float32; 0 on padding), or ``(tensor, stats)``; the stats cover
        the valid tokens of rows with adv != 0 (0.0 without any): ``cscr/w_mean``, ``cscr/frac_w_lt_1``,
        ``cscr/w_tilde_max``, ``cscr/eff_token_frac`` (mean over rows of (sum w)^2 / (L sum w^2)),
        ``cscr/w_bar_mean``, ``cscr/inv_w_bar_max`` (spec §5: keep <~ 1.3), ``cscr/s_mean``, ``cscr/s_pos_mean`` /
        ``cscr/s_neg_mean`` (rows with A > 0 / A < 0), ``cscr/num_tokens``.

    Raises:
        ValueError: bad alpha, w_min, mode, weight, scope, group_size, sign_eps or sign_mix; shape mismatch;
        non-finite log-probs on valid tokens; alpha * s overflowing.
    """
    _check_weight_args(threshold, alpha, w_min, weight)
    if not (isinstance(sign_eps, (int, float)) and 0.0 <= sign_eps < 1.0):
        raise ValueError(f"sign_eps must be in [0, 1), got {sign_eps!r}")
    if not (isinstance(sign_mix, (int, float)) and 0.0 <= sign_mix <= 1.0):
        raise ValueError(f"sign_mix must be in [0, 1], got {sign_mix!r}")
    if mode not in _MODES:
        raise ValueError(f"mode must be one of {_MODES}, got {mode!r}")
    if scope not in _SCOPES:
        raise ValueError(f"scope must be one of {_SCOPES}, got {scope!r}")
    if not torch.is_tensor(adv) or adv.dim() != 1:
        raise ValueError("adv (the sequence advantages) must be a [B] tensor")
    if not torch.is_tensor(old_logp) or old_logp.dim() != 2 or adv.shape[0] != old_logp.shape[0]:
        raise ValueError(f"adv shape {tuple(adv.shape)} does not match old_logp rows "
                         f"{tuple(old_logp.shape) if torch.is_tensor(old_logp) else old_logp!r}")
    B = adv.shape[0]
    if scope == "group" and (not isinstance(group_size, int) or group_size < 1 or B % group_size != 0):
        raise ValueError(f"group_size must be a positive int dividing B = {B} for scope 'group', got {group_size!r}")

    with torch.no_grad():
        s = sensitivity(old_logp, lp_pos, lp_neg, response_mask, mode=mode)  # spec §4
        m = _as_mask(response_mask).to(s.device)
        if not torch.isfinite(s[m]).all():
            raise ValueError("old_logp, lp_pos and lp_neg must be finite on valid (response_mask) tokens")
        adv = adv.detach().to(device=s.device, dtype=s.dtype)
        zero = torch.zeros((), dtype=s.dtype, device=s.device)
        # w_t = max(w_min, exp(-alpha * max(0, s_t - lambda))), kept as log w_t (see below)
        if weight == "sign_aware":
            log_w = _sign_aware_log_weights(adv, old_logp, lp_pos, response_mask, w_min, sign_eps, sign_mix)
        else:
            log_w = credit_log_weights(s, threshold, alpha, w_min, weight)
        if not torch.isfinite(log_w[m]).all():
            raise ValueError(f"alpha = {alpha} times the sensitivity overflows: lower alpha"
                             + ("" if weight == "upweight" else " or set w_min > 0"))
        # The tokens that share one normaliser w_bar: the valid tokens of each sequence (spec §5 [S2]); for the
        # scope ablations, those of each group of rows / of the batch, over rows with A != 0.
        if scope == "sequence":
            sel, rows = m, 1
        else:
            sel, rows = m & (adv != 0)[:, None], (group_size if scope == "group" else B)
        n = B // rows  # number of normalisers; x.reshape(n, -1) puts the tokens of one normaliser in one row
        # w_t / w_bar_i does not change when every w of the row is divided by the row's largest w; we do that in
        # log space, so underflow cannot make w_bar zero (the largest scaled w is exactly 1).
        log_w_max = torch.where(sel, log_w, -math.inf).reshape(n, -1).amax(1).repeat_interleave(rows)
        w = torch.where(sel, torch.exp(log_w - log_w_max[:, None]), zero)
        # w_bar_i = (1/L_i) sum_t m_t w_t
        w_bar = (w.reshape(n, -1).sum(1) / sel.reshape(n, -1).sum(1).clamp(min=1)).repeat_interleave(rows)
        # w_tilde_t = w_t / w_bar_i
        w_tilde = torch.where(sel, w / w_bar[:, None], zero)
        # A_i,t = A_i * w_tilde_t * m_t
        token_adv = torch.where(m & (adv != 0)[:, None], adv[:, None] * w_tilde, zero)
        return (token_adv, _stats(s, log_w, w_tilde, adv, m)) if return_stats else token_adv


def _sign_aware_log_weights(adv, old_logp, lp_pos, response_mask, w_min, eps, mix):
    """log w [B, T] of the spec §9.1 direction ablation: log max(w_min, (1 - mix) + mix * clip(exp(sign(A) * d_pos),
    1 - eps, 1 + eps)); the clip is taken on the exponent (exp is monotone), so w >= 1 - mix * eps > 0."""
    d_pos, _, _ = condition_shifts(old_logp, lp_pos, lp_pos, response_mask)  # d_pos = lp_pos - old_logp, 0 on padding
    x = (torch.sign(adv)[:, None] * d_pos).clamp(math.log1p(-eps), math.log1p(eps))
    log_w = torch.log((1.0 - mix) + mix * torch.exp(x))
    return log_w.clamp(min=math.log(w_min)) if w_min > 0 else log_w


def _stats(s, log_w, w_tilde, adv, m):
    """The logging statistics of ``cscr_token_advantages`` (see its docstring)."""
    rows = (adv != 0) & m.any(1)
    tok = m & rows[:, None]
    n = int(tok.sum())
    w = torch.where(m, torch.exp(log_w), torch.zeros((), dtype=log_w.dtype, device=log_w.device))  # unscaled w

    def mean(x, sel):
        k = int(sel.sum())
        return float(x[sel].double().sum() / k) if k else 0.0

    stats = {"cscr/w_mean": mean(w, tok), "cscr/frac_w_lt_1": mean((w < 1).to(w.dtype), tok),
             "cscr/w_tilde_max": float(w_tilde[tok].max()) if n else 0.0,
             "cscr/eff_token_frac": 0.0, "cscr/w_bar_mean": 0.0, "cscr/inv_w_bar_max": 0.0,
             "cscr/s_mean": mean(s, tok), "cscr/s_pos_mean": mean(s, m & (adv > 0)[:, None]),
             "cscr/s_neg_mean": mean(s, m & (adv < 0)[:, None]), "cscr/num_tokens": float(n)}
    if int(rows.sum()):
        m_r, log_w_r = m[rows], log_w[rows]
        L = m_r.sum(1).double()
        # spec §5: effective-token fraction (sum w)^2 / (L sum w^2), scale-free: w divided by the row's largest
        log_w_max = torch.where(m_r, log_w_r, -math.inf).amax(1, keepdim=True)
        w_r = torch.where(m_r, torch.exp(log_w_r - log_w_max), 0.0).double()
        stats["cscr/eff_token_frac"] = float((w_r.sum(1) ** 2 / (L * (w_r**2).sum(1))).mean())
        w_bar = w[rows].double().sum(1) / L
        stats["cscr/w_bar_mean"] = float(w_bar.mean())
        stats["cscr/inv_w_bar_max"] = float((1.0 / w_bar).max()) if float(w_bar.min()) > 0 else math.inf
    return stats


# ---- Spec §5: calibration of the threshold lambda ----------------------------------------------------------------

def calibrate_threshold(s, response_mask, quantile=0.8):
    """Threshold lambda (float, nats) as a quantile in [0, 1] of s [B, T] over the valid tokens (spec §5, [I]).

    Used once on the first rollout batch, then frozen (spec §5 suggests the 80th percentile).  Linear
    interpolation between order statistics, identical to ``torch.quantile(s[mask], quantile)`` (with a sort, so
    it also works beyond torch.quantile's input-size limit).  Raises ValueError: quantile outside [0, 1], shape
    mismatch, no valid token, non-finite s on valid tokens.
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
