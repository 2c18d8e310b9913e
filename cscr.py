"""CSCR (reconstructed): Counterfactual Sensitivity Credit Reallocation, GRPO credit moved off sensitive tokens.

Paper: He, Wu, Wang, "Not All Tokens Deserve Equal Credit: Counterfactual Sensitivity Credit Reallocation for
Long-CoT Reasoning", arXiv 2607.27888 (2026).  Spec: ``docs/specs/cscr.md`` ("spec §N"), from the abstract [S] and
digests of the full PDF [S2]; the rest is our reading [I], an option whose default is the spec's.

GRPO gives every token of response i its advantage Â_i.  CSCR re-scores each sampled response, fixed, with the
rollout's weights θ_old and no gradient, under two privileged prompts of opposite polarity (c+: the response is
correct, c-: it is incorrect) [S].  In the order of this file (m: the loss mask, L_i = Σ_t m_t)::

    §3 prompts       x + c+,  x + c-                                                  build_condition_prompts
    §4 scoring       ℓ0_t = log π(y_t | x, y_<t) (θ_old's pass),  ℓ±_t under x + c±    condition_logprobs
    §4 sensitivity   Δ±_t = ℓ±_t - ℓ0_t,  s_t = max(|Δ+_t|, |Δ-_t|)  (nats) [S2]      sensitivity
    §5 weights       w_t = max(w_min, exp(-α·max(0, s_t - λ)))  [S2]                  sensitivity_weights
    §5 renormalise   w̃_t = w_t / w̄_i,  w̄_i = (1/L_i) Σ_t m_t w_t  (per sequence [S2])  per_sequence
    §5 reallocation  Ã_i,t = Â_i · w̃_t · m_t                                          cscr_token_advantages
    §5 calibration   λ = a quantile of s over the first batch, then frozen            calibrate_threshold

so sign(Ã_i,t) = sign(Â_i) and Σ_t Ã_i,t = L_i·Â_i: the verifier's direction and the credit budget are kept [S].

Our reading [I], each an argument defaulting to the spec's: the notes' wording (``template``: "verdict" A; "reference"
B, "answer" C) and place (``marker``, ``turn_end``, ``anchor``: the end of the last user turn, ChatML); the scorer
(``logprob_fn``, ``temperature``: θ_old, eval mode, the sampling temperature); ``Settings``: Δ± -> s (``mode`` "max"
[S2]; "mean", "common"), the map (``weight`` "exp" [S2]; "exp_abs" exp(-α·s), "inverse" 1/(1 + α·s)), ``alpha`` 1,
``w_min`` 0 (spec §5 suggests 0.1); λ (``threshold`` 0.2 nats, or ``calibrate_threshold``); w̄ per sequence [S2].

§5's weights and renormalisation are ``CscrFunctions``' fields, one argument ``functions`` (None: the paper's; the
§9 ablations': comparisons/cscr_ablations.py). Left out: the loss (the trainer's surrogate with Ã, spec §6);
full-vocabulary shifts (cscr_diagnostics.py). Read next: trainer/credit_methods.py (CscrCredit).

Usage from any trainer (``import cscr``; ``model`` in eval mode; ``prompts``: the B rollout prompt texts x;
``response_ids``, ``loss_mask``: [B, T] right-padded responses; ``adv``: Â [B]; ℓ0 may be your old-log-prob pass;
options to the last two: ``threshold=0.5, settings=cscr.Settings(alpha=2.0, w_min=0.1)``; ``python cscr.py`` runs it
on a tiny random Qwen3).  TOKENISATION RULE: prompts are tokenised by ``tokenizer(prompt)``, as the rollout's x::

    inputs = cscr.scoring_inputs(tokenizer, prompts, response_ids, loss_mask)  # [x | y] rows [B, P + T]
    with torch.no_grad():
        old_logp = cscr.default_logprob_fn(model, *inputs, loss_mask, 1.0)  # ℓ0 = log π(y_t | x, y_<t) [B, T]
    pairs = [cscr.build_condition_prompts(x) for x in prompts]  # (x + c+, x + c-) per response
    lp_pos, lp_neg = cscr.condition_logprobs(model, tokenizer, pairs, response_ids, loss_mask)  # ℓ+, ℓ- [B, T]
    token_adv = cscr.cscr_token_advantages(adv, old_logp, lp_pos, lp_neg, loss_mask)  # Ã [B, T]
    stats = cscr.cscr_stats(adv, old_logp, lp_pos, lp_neg, loss_mask)  # to log (floats): w̄, w̃, s, ...
"""

import inspect
import math
from typing import Callable, NamedTuple

import torch

# ---- Spec §3: the privileged prompts x + c+, x + c- ---------------------------------------------------------------
# [I] Our wording (no template text was available), minimal pairs: the notes differ only in the verdict, so what is
# common to "being handed privileged outcome information" cancels; {reference}, {answer}: str.replace'd (LaTeX-safe).
_VERIFIED = "Note: a verifier has already checked the response that follows.\nVerdict: "
_VERDICT = _VERIFIED + "the final answer of this response is "
_REFERENCE = "Here is the reference answer to this problem.\nCorrect final answer: {reference}\n\n"
_ANSWER = _VERIFIED + "{answer} is "
CONDITION_TEMPLATES = {  # spec §3's rows A (primary), B (OPSD-style reference block + A), C (this response's answer)
    "verdict": (_VERDICT + "CORRECT.", _VERDICT + "INCORRECT."),
    "reference": (_REFERENCE + _VERDICT + "CORRECT.", _REFERENCE + _VERDICT + "INCORRECT."),
    "answer": (_ANSWER + "the correct final answer.", _ANSWER + "not the correct final answer."),
    "verdict_short": ("Verdict: CORRECT.", "Verdict: INCORRECT."),  # A without the verifier sentence (not the paper's)
}
MARKER = "<|im_start|>assistant"  # the default: ChatML's (Qwen's) assistant header
TURN_END = "<|im_end|>"  # the default: ChatML's end-of-turn token
WEIGHT_MAPS = ("exp", "exp_abs", "inverse")  # ``Settings.weight``: spec §5's maps s -> w (``sensitivity_weights``)


def condition_notes(template):
    """The notes c+, c- of ``template`` (spec §3): (name, (note_pos, note_neg)) of a name, alias or custom pair."""
    aliases = {"A": "verdict", "B": "reference", "C": "answer"}
    name = aliases.get(template, template) if isinstance(template, str) else None
    if name in CONDITION_TEMPLATES:
        return name, CONDITION_TEMPLATES[name]
    pair = isinstance(template, (tuple, list)) and len(template) == 2
    if pair and all(isinstance(note, str) and note for note in template):
        return "custom", (template[0], template[1])
    raise ValueError(f"template {template!r}: not one of {sorted(CONDITION_TEMPLATES)}, A/B/C or a pair of strings")


def _insert_note(prompt, note, marker, turn_end, anchor):
    """``prompt`` with ``note`` inserted so that the prompt's ending is unchanged (see build_condition_prompts)."""
    if anchor is not None:
        if anchor not in prompt:
            raise ValueError(f"anchor {anchor!r} does not occur in prompt")
        cut = prompt.rfind(anchor) + len(anchor)
        return prompt[:cut] + "\n\n" + note + prompt[cut:]
    at = prompt.rfind(marker) if marker else -1
    end = prompt.rfind(turn_end, 0, at) if turn_end and at >= 0 else -1
    if end >= 0:  # chat template: the note ends the last user turn; from its end-of-turn token on, byte for byte
        return prompt[:end] + "\n\n" + note + prompt[end:]
    if at >= 0:  # no end-of-turn token: its own lines before the assistant header
        return prompt[:at] + note + "\n\n" + prompt[at:]
    body = prompt.rstrip()  # plain text (the toy's "Compute 7+5.\n"): its own line before the trailing whitespace,
    if len(body) < len(prompt):
        return body + "\n" + note + prompt[len(body) :]
    nl = prompt.rfind("\n")  # else before the last line
    return prompt[: nl + 1] + note + "\n" + prompt[nl + 1 :]


def build_condition_prompts(
    prompt, reference=None, response_answer=None, template="verdict", *, marker=MARKER, turn_end=TURN_END, anchor=None
):
    """The two privileged prompts ``(x + c+, x + c-)`` (str) of one rollout prompt x, a str (spec §3): [S] contexts
    asserting that the fixed response is correct / incorrect, [S2] "of opposite polarity"; wording, placement [I].
    Each ends as ``prompt`` does (the response ids are reused): the note goes after the last ``anchor``, else at the
    end of the last user turn before ``marker`` (Llama-3: ``"<|start_header_id|>assistant"``, ``"<|eot_id|>"``), else
    on its own line before the trailing whitespace or the last line.  ``template``: a CONDITION_TEMPLATES name (B needs
    ``reference``, C ``response_answer``), A/B/C or ``(note_pos, note_neg)``.  Raises ValueError: unknown template."""
    if not isinstance(prompt, str):
        raise ValueError(f"prompt must be a str, got {type(prompt).__name__}")
    name, notes = condition_notes(template)  # (c+, c-)
    for key, value, what in (("{reference}", reference, "reference"), ("{answer}", response_answer, "response_answer")):
        if any(key in note for note in notes):
            if value is None:
                raise ValueError(f"template {name!r} needs `{what}` (its note holds {key})")
            notes = tuple(note.replace(key, str(value)) for note in notes)
    return tuple(_insert_note(prompt, n, marker, turn_end, anchor) for n in notes)


# ---- Spec §4, §6 step 2: ℓ0, ℓ+, ℓ- of the fixed responses (no-grad prefill passes), the sensitivity s ------------
def _as_mask(mask):  # [B, T] bool view of a bool/float 0-1 mask (response_mask, loss_mask)
    if not torch.is_tensor(mask):
        raise ValueError(f"the mask must be a torch.Tensor, got {type(mask).__name__}")
    return mask if mask.dtype == torch.bool else mask != 0


def default_logprob_fn(model, input_ids, attention_mask, response_mask, temperature):
    """log π(y_t | ., y_<t) = z_t[y_t]/temp - logsumexp(z_t/temp) [B, T] (nats; float32, float64 for a float64 model;
    0 off the mask) of the last T columns of the left-padded rows ``input_ids`` [B, L], at position ids
    cumsum(attention_mask) - 1 (the trainer's ℓ0 pass should use the same, or Δ± picks up the difference)."""
    T = response_mask.shape[1]
    try:  # only the T + 1 logits needed, where the model supports it (HF causal LMs do)
        keep = "logits_to_keep" in inspect.signature(model.forward).parameters
    except (TypeError, ValueError):
        keep = False
    kwargs = {"logits_to_keep": T + 1} if keep else {}
    positions = (attention_mask.long().cumsum(-1) - 1).clamp(min=0)  # left padding: the first real token is at 0
    out = model(input_ids=input_ids, attention_mask=attention_mask, position_ids=positions, use_cache=False, **kwargs)
    logits = (out.logits if hasattr(out, "logits") else out[0])[:, -(T + 1) : -1]  # [B, T, V]: k predicts k + 1
    chunk = 1024  # positions per float32 [B, chunk, V] block (memory of long responses)
    lp = torch.zeros(logits.shape[:2], dtype=torch.promote_types(logits.dtype, torch.float32), device=logits.device)
    for a in range(0, T, chunk):  # positions a, ..., a + chunk - 1
        z = logits[:, a : a + chunk].to(lp.dtype) / temperature  # [B, chunk, V]
        tgt = input_ids[:, -T:][:, a : a + chunk].unsqueeze(-1)  # [B, chunk, 1]: the sampled tokens
        lp[:, a : a + chunk] = z.gather(-1, tgt).squeeze(-1) - torch.logsumexp(z, dim=-1)  # [B, chunk]
    return torch.where(_as_mask(response_mask).to(lp.device), lp, 0.0)


def scoring_inputs(tokenizer, prompts, response_ids, response_mask):
    """``(input_ids, attention_mask)`` [B, P + T] (long) scoring the responses [B, T] after the B ``prompts`` (str, by
    THE TOKENISATION RULE, or ids), for x (ℓ0) and x + c± (ℓ±) alike: prompts left-padded with the pad id to the
    longest (P), responses as given (padding: the pad id, mask 0).  Raises ValueError: no pad token, no token."""
    pad_id = getattr(tokenizer, "pad_token_id", None)
    if pad_id is None:
        raise ValueError("tokenizer.pad_token_id must be set (e.g. tokenizer.pad_token = tokenizer.eos_token)")
    prompt_ids = [
        list(tokenizer(x)["input_ids"]) if isinstance(x, str) else torch.as_tensor(x).reshape(-1).tolist()
        for x in prompts
    ]
    if any(len(ids) == 0 for ids in prompt_ids):
        raise ValueError("every prompt must tokenise to at least one token")
    m = _as_mask(response_mask)
    P = max(len(ids) for ids in prompt_ids)
    input_ids = torch.full((len(m), P + m.shape[1]), pad_id, dtype=torch.long, device=response_ids.device)
    attn = torch.zeros_like(input_ids)  # [B, P + T] long
    for i, ids in enumerate(prompt_ids):
        input_ids[i, P - len(ids) : P] = torch.tensor(ids, dtype=torch.long, device=input_ids.device)
        attn[i, P - len(ids) : P] = 1
    input_ids[:, P:] = torch.where(m, response_ids.long(), torch.full_like(response_ids, pad_id).long())
    attn[:, P:] = m.long()
    return input_ids, attn


def condition_logprobs(
    model, tokenizer, prompt_pairs, response_ids, credited, temperature=1.0, micro_batch_size=None, logprob_fn=None
):
    """(lp_pos, lp_neg) = (ℓ+, ℓ-) [B, T] (nats; float32, float64 for a float64 model; 0 off the mask): each fixed
    response scored after its x + c+ and its x + c- (``prompt_pairs``: ``build_condition_prompts``'); spec §4: no
    grad, eval mode (restored afterwards), on the ``credited`` tokens [B, T] (the loss mask's in rows with Â ≠ 0; a
    row without one is not scored); ``micro_batch_size``: rows per pass (None: all); ``logprob_fn``:
    ``default_logprob_fn``'s signature.  Raises ValueError: shapes, temperature."""
    m = _as_mask(credited)
    shapes = torch.is_tensor(response_ids) and m.dim() == 2 and m.shape == response_ids.shape
    if not (shapes and len(prompt_pairs) == len(m) and temperature > 0):
        raise ValueError("need two prompts per response, response_ids of the credited mask's shape, temperature > 0")
    rows = m.any(1).cpu().nonzero().flatten()  # the rows with a valid token
    size = micro_batch_size or max(len(rows), 1)
    param = next(iter(model.parameters()), None) if hasattr(model, "parameters") else None
    device = response_ids.device if param is None else param.device
    dtype = torch.float32 if param is None else torch.promote_types(param.dtype, torch.float32)  # f64 for f64 models
    lps = [torch.zeros(response_ids.shape, dtype=dtype, device=response_ids.device) for _ in range(2)]  # ℓ+, ℓ-
    was_training = getattr(model, "training", False)
    if was_training:
        model.eval()
    try:
        with torch.no_grad():
            for side, lp in enumerate(lps):  # x + c+, then x + c-
                for a in range(0, len(rows), size):
                    idx = rows[a : a + size].to(response_ids.device)  # this pass's rows
                    prompts = [prompt_pairs[i][side] for i in idx.tolist()]
                    inputs = scoring_inputs(tokenizer, prompts, response_ids[idx].to(device), m[idx].to(device))
                    out = (logprob_fn or default_logprob_fn)(model, *inputs, m[idx].to(device), temperature)  # [b, T]
                    lp[idx] = torch.where(m[idx], out.to(lp), lp.new_zeros(()))
    finally:
        if was_training:
            model.train()
    return lps[0], lps[1]


def condition_shifts(old_logp, lp_pos, lp_neg, loss_mask):
    """``(shift_pos, shift_neg, m)``: spec §4's likelihood shifts Δ± = ℓ± - ℓ0 [B, T] (nats; no gradient; the
    log-probs' dtype, at least float32; padding set to 0 BEFORE subtracting, so no NaN) and the bool mask."""
    m = _as_mask(loss_mask)
    for name, lp in (("old_logp", old_logp), ("lp_pos", lp_pos), ("lp_neg", lp_neg)):
        if not torch.is_tensor(lp) or lp.dim() != 2 or lp.shape != m.shape:
            raise ValueError(f"{name} must be a [B, T] tensor of the loss_mask's shape {tuple(m.shape)}")
    dt = torch.promote_types(old_logp.dtype, lp_pos.dtype)
    dt = torch.promote_types(torch.promote_types(dt, lp_neg.dtype), torch.float32)  # at least float32
    l0, l_pos, l_neg = (torch.where(m, lp.detach().to(dt), 0.0) for lp in (old_logp, lp_pos, lp_neg))
    return l_pos - l0, l_neg - l0, m  # Δ+ = ℓ+ - ℓ0, Δ- = ℓ- - ℓ0


def sensitivity(old_logp, lp_pos, lp_neg, loss_mask, mode="max"):
    """The per-token counterfactual sensitivity s_t [B, T] (nats, >= 0, 0 on padding, no gradient; spec §4) from ℓ0,
    ℓ+, ℓ- [B, T]: [S2] "the maximum of the likelihood shifts under the two conditions", s = max(|Δ+|, |Δ-|) on the
    sampled token [I]; ``mode`` "mean" (|Δ+| + |Δ-|)/2 or "common" |Δ+ + Δ-|/2 (the polarity-free part) [I]."""
    if mode not in ("max", "mean", "common"):
        raise ValueError(f"mode must be max, mean or common, got {mode!r}")
    shift_pos, shift_neg, m = condition_shifts(old_logp, lp_pos, lp_neg, loss_mask)
    if mode == "max":
        s = torch.maximum(shift_pos.abs(), shift_neg.abs())
    elif mode == "mean":
        s = 0.5 * (shift_pos.abs() + shift_neg.abs())
    else:
        s = (0.5 * (shift_pos + shift_neg)).abs()
    return torch.where(m, s, 0.0)


# ---- Spec §5: the weights as log w [B, T] (w̃ = w / w̄ exact when every w underflows), renormalised, calibrated --
def sensitivity_weights(s, shift_pos, adv, threshold, settings):
    """The weight step: log w_t [B, T] of s [B, T] (nats) by the map ``settings.weight``, α = ``settings.alpha``, λ =
    ``threshold`` (nats; "exp" only); Δ+ ``shift_pos`` [B, T] and Â ``adv`` [B] unread (an ablation reads them)."""
    if settings.weight == "exp":  # [S2] down-weighting above λ: w = exp(-α·max(0, s - λ)), 1 up to λ
        return -settings.alpha * (s - threshold).clamp(min=0.0)
    if settings.weight == "exp_abs":  # [I] the spec's alternative w = exp(-α·s), no threshold
        return -settings.alpha * s
    return -torch.log1p(settings.alpha * s)  # "inverse" [I]: the spec's alternative w = 1 / (1 + α·s), no threshold


def per_sequence(log_w, credited):
    """The renormalisation: w̃_t = w_t / w̄_i [B, T], w̄_i = (1/L_i) Σ_t w_t over row i's ``credited`` tokens ([B, T]
    bool; 0 elsewhere), from log w (spec §5 [S2]: within each sequence); each row's largest w divided out first."""
    log_w_max = torch.where(credited, log_w, -math.inf).amax(1, keepdim=True)  # [B, 1]
    w = torch.where(credited, torch.exp(log_w - log_w_max), 0.0)  # w_t / max_t w_t, in (0, 1]
    w_bar = w.sum(1, keepdim=True) / credited.sum(1, keepdim=True).clamp(min=1)  # w̄_i, on the same scale
    return torch.where(credited, w / w_bar, 0.0)


class Settings(NamedTuple):  # what a run keeps fixed (spec §4-§5 [I]; defaults: the spec's)
    alpha: float = 1.0  # α >= 0, the decay strength (spec §5; 0 gives GRPO)
    w_min: float = 0.0  # the weight floor in [0, 1] (spec §5 suggests 0.1; 0 in the §8 example)
    mode: str = "max"  # Δ± -> s (spec §4): "max" [S2], "mean", "common"
    weight: str = "exp"  # s -> log w (spec §5): "exp" [S2]; "exp_abs", "inverse" [I]


class CscrFunctions(NamedTuple):  # the replaceable steps of §5 (defaults: the paper's), one argument ``functions``
    weights: Callable = sensitivity_weights  # (s, shift_pos, adv, threshold, settings) -> log w [B, T]
    renormalise: Callable = per_sequence  # (log_w, credited) -> w̃ [B, T]


def credit_log_weights(adv, old_logp, lp_pos, lp_neg, loss_mask, threshold=0.2, settings=None, functions=None):
    """log w_t [B, T] (spec §4-§5, no gradient): s_t of ℓ0, ℓ+, ℓ- [B, T] (nats) by ``settings.mode``, weighted by
    ``functions.weights`` (None: the paper's, ``settings.weight``'s map) at λ = ``threshold`` (nats), floored: w =
    max(w_min, w); ``adv``: Â [B].  Raises ValueError: shapes; settings out of range; not finite (large α)."""
    settings = settings or Settings()
    functions = functions or CscrFunctions()
    if not (torch.is_tensor(adv) and adv.dim() == 1 and torch.is_tensor(old_logp) and len(adv) == len(old_logp)):
        raise ValueError(f"adv must be a [B] tensor, B = old_logp's rows; got adv shape {getattr(adv, 'shape', None)}")
    ok = math.isfinite(settings.alpha) and settings.alpha >= 0 and 0 <= settings.w_min <= 1
    if not (ok and settings.weight in WEIGHT_MAPS):  # (sensitivity checks the mode)
        raise ValueError(f"Settings needs a finite alpha >= 0, w_min in [0, 1], a weight in {list(WEIGHT_MAPS)}")
    with torch.no_grad():
        s = sensitivity(old_logp, lp_pos, lp_neg, loss_mask, settings.mode)  # spec §4: max(|Δ+_t|, |Δ-_t|)
        shift_pos, _, m = condition_shifts(old_logp, lp_pos, lp_neg, loss_mask)  # Δ+ = ℓ+ - ℓ0
        m = m.to(s.device)
        if not torch.isfinite(s[m]).all():
            raise ValueError("old_logp, lp_pos and lp_neg must be finite on valid (loss_mask) tokens")
        adv = adv.detach().to(device=s.device, dtype=s.dtype)
        log_w = functions.weights(s, shift_pos, adv, threshold, settings)  # spec §5: log w_t
        floored = log_w.clamp(min=math.log(settings.w_min)) if settings.w_min > 0 else log_w  # against concentration
        if not torch.isfinite(floored[m]).all():
            raise ValueError(f"alpha = {settings.alpha} times s overflows (log w not finite): lower it, or w_min > 0")
        return floored


def cscr_token_advantages(adv, old_logp, lp_pos, lp_neg, loss_mask, threshold=0.2, settings=None, functions=None):
    """CSCR's token advantages Ã [B, T] (spec §5; the log-probs' dtype, at least float32; 0 on padding): [S] the credit
    of sensitive tokens moved to the others, keeping the verifier's direction sign(Ã_i,t) = sign(Â_i) and the budget
    Σ_t Ã_i,t = L_i·Â_i (exactly); α = 0, all s <= λ or Â_i = 0 give GRPO.  Arguments as ``credit_log_weights``."""
    functions = functions or CscrFunctions()
    with torch.no_grad():
        log_w = credit_log_weights(adv, old_logp, lp_pos, lp_neg, loss_mask, threshold, settings, functions)
        adv = adv.detach().to(log_w)
        credited = _as_mask(loss_mask).to(log_w.device) & (adv != 0)[:, None]  # the tokens that carry credit
        w_tilde = functions.renormalise(log_w, credited)  # spec §5: w̃_t = w_t / w̄_i, w̄_i = (1/L_i) Σ_t m_t w_t
        return torch.where(credited, adv[:, None] * w_tilde, 0.0)  # Ã_i,t = Â_i · w̃_t · m_t


def cscr_stats(adv, old_logp, lp_pos, lp_neg, loss_mask, threshold=0.2, settings=None, functions=None):
    """What a trainer logs of ``cscr_token_advantages`` (same arguments), floats over the credited tokens (valid, Â ≠ 0)
    of s, w, w̃ (spec §5: keep 1/w̄ <~ 1.3, the effective-token fraction mean_i (Σw)² / (L Σw²) >~ 0.85)."""
    settings = settings or Settings()
    functions = functions or CscrFunctions()
    log_w = credit_log_weights(adv, old_logp, lp_pos, lp_neg, loss_mask, threshold, settings, functions)
    s = sensitivity(old_logp, lp_pos, lp_neg, loss_mask, settings.mode)
    adv = adv.detach().to(log_w)
    m = _as_mask(loss_mask).to(s.device)
    rows = (adv != 0) & m.any(1)  # the rows that carry credit, and their valid tokens:
    credited = m & rows[:, None]
    n = int(credited.sum())
    w = torch.where(m, torch.exp(log_w), 0.0)  # unscaled w
    L = m[rows].sum(1).double()
    w_bar = w[rows].double().sum(1) / L
    log_w_max = torch.where(m[rows], log_w[rows], -math.inf).amax(1, keepdim=True)  # the effective-token fraction
    w_r = torch.where(m[rows], torch.exp(log_w[rows] - log_w_max), 0.0).double()  # is scale-free: w / the row's max

    def mean(x, sel):
        return float(x[sel].double().sum() / int(sel.sum())) if int(sel.sum()) else 0.0

    return {
        "cscr/w_mean": mean(w, credited),
        "cscr/frac_w_lt_1": mean((w < 1).to(w.dtype), credited),
        "cscr/w_tilde_max": float(functions.renormalise(log_w, credited)[credited].max()) if n else 0.0,
        "cscr/eff_token_frac": float((w_r.sum(1) ** 2 / (L * (w_r**2).sum(1))).mean()) if n else 0.0,
        "cscr/w_bar_mean": float(w_bar.mean()) if n else 0.0,
        "cscr/inv_w_bar_max": (float((1.0 / w_bar).max()) if float(w_bar.min()) > 0 else math.inf) if n else 0.0,
        "cscr/s_mean": mean(s, credited),
        "cscr/s_pos_mean": mean(s, m & (adv > 0)[:, None]),
        "cscr/s_neg_mean": mean(s, m & (adv < 0)[:, None]),
        "cscr/num_tokens": float(n),
    }


def calibrate_threshold(s, loss_mask, quantile=0.8):
    """λ (float, nats): the ``quantile`` of s [B, T] over the valid tokens (spec §5 [I]: on the first rollout batch,
    then frozen; it suggests 0.8), interpolated as ``torch.quantile(s[mask], quantile)`` (by a sort: no size limit).
    Raises ValueError: quantile outside [0, 1]; s not of the mask's shape, or not finite; no valid token."""
    m = _as_mask(loss_mask)
    s_valid = s.detach()[m].double() if torch.is_tensor(s) and s.shape == m.shape else None
    if s_valid is None or not 0.0 <= quantile <= 1.0 or not s_valid.numel() or not torch.isfinite(s_valid).all():
        raise ValueError(f"calibrate_threshold needs a quantile in [0, 1] and s finite on a valid token: {quantile}")
    s_sorted = s_valid.sort().values
    pos = quantile * (s_sorted.numel() - 1)
    lo = int(math.floor(pos))
    hi = min(lo + 1, s_sorted.numel() - 1)
    return float(s_sorted[lo] + (pos - lo) * (s_sorted[hi] - s_sorted[lo]))


if __name__ == "__main__":  # the header's example on a tiny random Qwen3 (transformers: imported here only)
    from transformers import ByT5Tokenizer, Qwen3Config, Qwen3ForCausalLM

    import cscr

    torch.manual_seed(0)
    sizes = dict(vocab_size=384, hidden_size=32, intermediate_size=64, num_hidden_layers=2, initializer_range=0.05)
    model = Qwen3ForCausalLM(Qwen3Config(**sizes, num_attention_heads=4, num_key_value_heads=2, head_dim=8)).eval()
    tokenizer = ByT5Tokenizer()  # a byte per token: a tokenizer without files
    prompts = ["Compute 7+5.\n", "Compute 7+5.\n", "Compute 12+30.\n", "Compute 12+30.\n"]
    response_ids = torch.randint(3, 259, (4, 6))
    loss_mask = torch.tensor([[1, 1, 1, 1, 1, 1], [1, 1, 1, 1, 0, 0], [1, 1, 1, 1, 1, 1], [1, 1, 0, 0, 0, 0]])
    adv = torch.tensor([0.7, -0.7, 0.7, -0.7])
    inputs = cscr.scoring_inputs(tokenizer, prompts, response_ids, loss_mask)  # [x | y] rows [B, P + T]
    with torch.no_grad():
        old_logp = cscr.default_logprob_fn(model, *inputs, loss_mask, 1.0)  # ℓ0 = log π(y_t | x, y_<t) [B, T]
    pairs = [cscr.build_condition_prompts(x) for x in prompts]  # (x + c+, x + c-) per response
    lp_pos, lp_neg = cscr.condition_logprobs(model, tokenizer, pairs, response_ids, loss_mask)  # ℓ+, ℓ- [B, T]
    token_adv = cscr.cscr_token_advantages(adv, old_logp, lp_pos, lp_neg, loss_mask)  # Ã [B, T]
    stats = cscr.cscr_stats(adv, old_logp, lp_pos, lp_neg, loss_mask)  # to log (floats): w̄, w̃, s, ...
    print(f"token_adv {token_adv}\nstats {stats}")
