"""CSCR: Counterfactual Sensitivity Credit Reallocation, a GRPO extension that moves credit off sensitive tokens.

Paper: He, Wu, Wang, "Not All Tokens Deserve Equal Credit: Counterfactual Sensitivity Credit Reallocation for
Long-CoT Reasoning", arXiv 2607.27888 (2026).  Spec: ``docs/specs/cscr.md`` ("spec §N"), from the abstract [S] and
digests of the full PDF [S2]; the rest is our reading [I], an option whose default is the spec's.

GRPO gives every token of response i its advantage Â_i.  CSCR re-scores each sampled response, fixed, with the
rollout's weights θ_old and no gradient, under two privileged prompts of opposite polarity (c+: the response is
correct, c-: it is incorrect) [S].  In the order of this file (m: response mask, L_i = Σ_t m_t)::

    §3 prompts       x + c+,  x + c-                                                  build_condition_prompts
    §4 scoring       ℓ0_t = log π(y_t | x, y_<t) (θ_old's pass),  ℓ±_t under x + c±    condition_logprobs
    §4 sensitivity   Δ±_t = ℓ±_t - ℓ0_t,  s_t = max(|Δ+_t|, |Δ-_t|)  (nats) [S2]      sensitivity
    §5 weights       w_t = max(w_min, exp(-α·max(0, s_t - λ)))  [S2]                  credit_log_weights
    §5 renormalise   w̃_t = w_t / w̄_i,  w̄_i = (1/L_i) Σ_t m_t w_t  (per sequence [S2])  per_sequence
    §5 reallocation  Ã_i,t = Â_i · w̃_t · m_t                                          cscr_token_advantages
    §5 calibration   λ = a quantile of s over the first batch, then frozen            calibrate_threshold

so sign(Ã_i,t) = sign(Â_i) and Σ_t Ã_i,t = L_i·Â_i: the verifier's direction and the credit budget are kept [S].

inferred [I]                      argument                      default; alternatives
wording of c+ / c- (§3)           template                      "verdict" (A); "reference" (B), "answer" (C)
where the note goes (§3)          marker, turn_end, anchor      the end of the last user turn (ChatML)
scorer (§4)                       logprob_fn, temperature       θ_old in eval mode at the sampling temperature
aggregation of Δ± (§4)            Settings.mode                 "max" [S2]; "mean", "common"
weight map; α; floor (§5)         Settings.weight, alpha, w_min  "exp"; "exp_abs", "inverse"; 1.0; 0.0 (§5: 0.1)
renormalisation scope (§5)        Settings.renormalise          per_sequence [S2]
threshold λ, nats (§5)            threshold                     0.2, or calibrate_threshold(quantile 0.8)

Left out on purpose: the loss (the trainer's clipped surrogate with Ã, spec §6); full-vocabulary shifts (diagnostics,
cscr_diagnostics.py); pooling s over processes before calibration (the trainer's); the spec §9 ablations
(cscr_ablations.py: functions for ``Settings.weight`` and ``Settings.renormalise``).  Read next: grpo.py's
``Credit._cscr`` (the trainer's call), tests/test_cscr.py (the spec §8 worked example).

Usage from any trainer (``model`` in eval mode; ``prompts``: the B rollout prompt texts x; ``response_ids``,
``response_mask``: [B, T] right-padded sampled responses; ``adv``: [B] sequence advantages Â; temperature 1; ℓ0 is
your trainer's old-log-prob pass if it matches ``default_logprob_fn``'s positions and temperature)::

    import cscr, torch

    inputs = cscr.scoring_inputs(tokenizer, prompts, response_ids, response_mask)  # [x | y] rows [B, P + T]
    with torch.no_grad():
        old_logp = cscr.default_logprob_fn(model, *inputs, response_mask, 1.0)    # ℓ0 = log π(y_t | x, y_<t) [B, T]
    pairs = [cscr.build_condition_prompts(x) for x in prompts]                      # (x + c+, x + c-) per response
    lp_pos, lp_neg = cscr.condition_logprobs(model, tokenizer, pairs, response_ids, response_mask)  # ℓ+, ℓ- [B, T]
    token_adv = cscr.cscr_token_advantages(adv, old_logp, lp_pos, lp_neg, response_mask)           # Ã [B, T]

Options: ``cscr_token_advantages(..., threshold=0.5, settings=cscr.Settings(alpha=2.0, w_min=0.1))``.  TOKENISATION
RULE: a conditioned prompt is tokenised as the rollout's prompt was, by ``tokenizer(prompt)`` (special tokens, e.g. a
BOS, included), as this project's rollout does for x; pass token ids if your trainer tokenised x another way.  Masks:
bool or float 0/1; log-probs: nats.  Imports torch and the standard library.
"""

from __future__ import annotations

import dataclasses
import inspect
import math
from typing import Callable

import torch

# ---- Spec §3: the privileged prompts x + c+, x + c- ---------------------------------------------------------------
# [I] Our wording (no template text was available), in minimal pairs: the two notes differ only in the verdict, so
# whatever is common to "being handed privileged outcome information" cancels between them.  {reference} (the gold
# answer) and {answer} (this response's) are substituted with str.replace (LaTeX braces need no escaping).
_VERIFIED = "Note: a verifier has already checked the response that follows.\nVerdict: "
_VERDICT = _VERIFIED + "the final answer of this response is "
_REFERENCE = "Here is the reference answer to this problem.\nCorrect final answer: {reference}\n\n"
CONDITION_TEMPLATES = {  # spec §3's rows A (primary), B (OPSD-style reference block + A), C (this response's answer)
    "verdict": (_VERDICT + "CORRECT.", _VERDICT + "INCORRECT."),
    "reference": (_REFERENCE + _VERDICT + "CORRECT.", _REFERENCE + _VERDICT + "INCORRECT."),
    "answer": (_VERIFIED + "{answer} is the correct final answer.",
               _VERIFIED + "{answer} is not the correct final answer."),
    "verdict_short": ("Verdict: CORRECT.", "Verdict: INCORRECT."),  # A without the verifier sentence (not the paper's)
}
DEFAULT_MARKER = "<|im_start|>assistant"  # ChatML (Qwen) assistant header
DEFAULT_TURN_END = "<|im_end|>"  # ChatML end-of-turn token


def condition_notes(template):
    """The notes c+, c- of ``template`` (spec §3): (name, (note_pos, note_neg)) of a name, alias or custom pair."""
    aliases = {"A": "verdict", "B": "reference", "C": "answer"}
    name = aliases.get(template, template) if isinstance(template, str) else None
    if name in CONDITION_TEMPLATES:
        return name, CONDITION_TEMPLATES[name]
    if isinstance(template, (tuple, list)) and len(template) == 2 and all(isinstance(note, str) and note for note in template):
        return "custom", (template[0], template[1])
    raise ValueError(f"template must be one of {sorted(CONDITION_TEMPLATES)} (or A/B/C) or a (note_pos, note_neg) "
                     f"tuple of non-empty strings, got {template!r}")


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
        return body + "\n" + note + prompt[len(body):]
    nl = prompt.rfind("\n")  # else before the last line
    return prompt[: nl + 1] + note + "\n" + prompt[nl + 1 :]


def build_condition_prompts(prompt, reference=None, response_answer=None, template="verdict", *,
                            marker=DEFAULT_MARKER, turn_end=DEFAULT_TURN_END, anchor=None):
    """The two privileged prompts ``(x + c+, x + c-)`` (str) of one rollout prompt x, a str (spec §3): [S] contexts
    asserting that the fixed response is correct / incorrect, [S2] "of opposite polarity"; wording, placement [I].
    Each ends as ``prompt`` does (the response ids are reused): the note goes after the last ``anchor`` (e.g. the
    problem, the spec §3 layout), else at the end of the last user turn before ``marker`` (Llama-3:
    ``"<|start_header_id|>assistant"``, ``"<|eot_id|>"``), else (plain text) on its own line before the trailing
    whitespace or the last line.  ``template``: "verdict" (A), "reference" (B, needs ``reference``, the gold answer),
    "answer" (C, needs ``response_answer``), "A"/"B"/"C", "verdict_short", or a custom ``(note_pos, note_neg)``.
    Raises ValueError: an unknown template, a value it needs missing, ``anchor`` not found."""
    if not isinstance(prompt, str):
        raise ValueError(f"prompt must be a str, got {type(prompt).__name__}")
    name, notes = condition_notes(template)  # (c+, c-)
    for key, value, what in (("{reference}", reference, "`reference` (the gold final answer)"),
                             ("{answer}", response_answer, "`response_answer` (this response's own answer)")):
        if any(key in note for note in notes):
            if value is None:
                raise ValueError(f"template {name!r} needs {what}")
            notes = tuple(note.replace(key, str(value)) for note in notes)
    return tuple(_insert_note(prompt, n, marker, turn_end, anchor) for n in notes)


# ---- Spec §4, §6 step 2: ℓ0, ℓ+, ℓ- of the fixed responses (no-grad prefill passes) ------------------------------
def _as_mask(response_mask):
    """[B, T] bool view of a bool/float 0-1 response mask."""
    if not torch.is_tensor(response_mask):
        raise ValueError("response_mask must be a torch.Tensor")
    return response_mask if response_mask.dtype == torch.bool else response_mask != 0


def default_logprob_fn(model, input_ids, attention_mask, response_mask, temperature):
    """log π(y_t | ., y_<t) = z_t[y_t]/temp - logsumexp(z_t/temp) [B, T] (nats; float32, float64 for a float64 model;
    0 off the mask) of the last T columns of the left-padded rows ``input_ids`` [B, L], at position ids
    cumsum(attention_mask) - 1 (the trainer's ℓ0 pass should use the same, or Δ± picks up the difference)."""
    T, kwargs = response_mask.shape[1], {}
    try:  # only the T + 1 logits needed, where the model supports it (HF causal LMs do)
        if "logits_to_keep" in inspect.signature(model.forward).parameters:
            kwargs["logits_to_keep"] = T + 1
    except (TypeError, ValueError):
        pass
    position_ids = (attention_mask.long().cumsum(-1) - 1).clamp(min=0)  # left padding: the first real token is at 0
    out = model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, use_cache=False,
                **kwargs)
    logits = (out.logits if hasattr(out, "logits") else out[0])[:, -(T + 1) : -1, :]  # [B, T, V]: position k predicts k + 1
    targets, chunk = input_ids[:, -T:], 1024  # positions per float32 [B, chunk, V] block (memory of long responses)
    lp = torch.zeros(targets.shape, dtype=torch.promote_types(logits.dtype, torch.float32), device=logits.device)
    for a in range(0, T, chunk):  # positions a, ..., a + chunk - 1
        z = logits[:, a : a + chunk].to(lp.dtype) / temperature  # [B, chunk, V]
        tgt = targets[:, a : a + chunk].unsqueeze(-1)  # [B, chunk, 1]
        lp[:, a : a + chunk] = z.gather(-1, tgt).squeeze(-1) - torch.logsumexp(z, dim=-1)  # [B, chunk]
    return torch.where(_as_mask(response_mask).to(lp.device), lp, 0.0)


def scoring_inputs(tokenizer, prompts, response_ids, response_mask):
    """``(input_ids, attention_mask)`` [B, P + T] (long) scoring the responses [B, T] after the B ``prompts`` (str, by
    THE TOKENISATION RULE, or ids), for x (ℓ0) and x + c± (ℓ±) alike: each prompt left-padded to the longest (P) with
    the pad id, its response as given (padded slots: the pad id, mask 0).  Raises ValueError: no pad token, no token."""
    pad_id = getattr(tokenizer, "pad_token_id", None)
    if pad_id is None:
        raise ValueError("tokenizer.pad_token_id must be set (e.g. tokenizer.pad_token = tokenizer.eos_token)")
    prompt_ids = [list(tokenizer(x)["input_ids"]) if isinstance(x, str) else torch.as_tensor(x).reshape(-1).tolist()
                  for x in prompts]
    if any(len(ids) == 0 for ids in prompt_ids):
        raise ValueError("every prompt must tokenise to at least one token")
    m, (b, T), device = _as_mask(response_mask), response_ids.shape, response_ids.device
    P = max(len(ids) for ids in prompt_ids)
    input_ids = torch.full((b, P + T), pad_id, dtype=torch.long, device=device)
    attn = torch.zeros((b, P + T), dtype=torch.long, device=device)
    for i, ids in enumerate(prompt_ids):
        input_ids[i, P - len(ids) : P] = torch.tensor(ids, dtype=torch.long, device=device)
        attn[i, P - len(ids) : P] = 1
    input_ids[:, P:] = torch.where(m, response_ids.long(), torch.full_like(response_ids, pad_id).long())
    attn[:, P:] = m.long()
    return input_ids, attn


def condition_logprobs(model, tokenizer, prompt_pairs, response_ids, response_mask, temperature=1.0,
                       micro_batch_size=None, logprob_fn=None):
    """(lp_pos, lp_neg) = (ℓ+, ℓ-) [B, T]: the log-probs of each fixed response under its x + c+ and its x + c- (nats;
    float32, float64 for a float64 model; 0 off the mask).  [S]: a fixed trajectory re-scored under two opposing
    outcome conditions; spec §4: the rollout's weights, no grad, eval mode (restored afterwards).  ``prompt_pairs``:
    B pairs from ``build_condition_prompts``.  A row of ``response_mask`` without a valid token is not scored (pass
    ``mask * (adv != 0)[:, None]``: a row with Â_i = 0 gets no credit); ``micro_batch_size``: rows per pass (None:
    all); ``logprob_fn(model, input_ids, attention_mask, response_mask, temperature) -> [b, T]``: the trainer's own, so
    Δ± measures the prompt only (default ``default_logprob_fn``).  Raises ValueError: shapes, temperature, pad token."""
    m = _as_mask(response_mask)
    if not (torch.is_tensor(response_ids) and m.dim() == 2 and m.shape == response_ids.shape
            and len(prompt_pairs) == len(m) and temperature > 0):
        raise ValueError(f"prompt_pairs ({len(prompt_pairs)}) must hold one pair of prompts per response, response_ids "
                         f"the response_mask's shape {tuple(m.shape)}, and temperature ({temperature}) be > 0")
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
                    idx = rows[a:a + size].to(response_ids.device)  # this pass's rows
                    inputs = scoring_inputs(tokenizer, [prompt_pairs[i][side] for i in idx.tolist()],
                                            response_ids[idx].to(device), m[idx].to(device))
                    out = (logprob_fn or default_logprob_fn)(model, *inputs, m[idx].to(device), temperature)  # [b, T]
                    lp[idx] = torch.where(m[idx], out.to(lp), lp.new_zeros(()))
    finally:
        if was_training:
            model.train()
    return lps[0], lps[1]


# ---- Spec §4: the per-token counterfactual sensitivity -----------------------------------------------------------
_MODES = ("max", "mean", "common")


def condition_shifts(old_logp, lp_pos, lp_neg, response_mask):
    """``(shift_pos, shift_neg, m)``: spec §4's likelihood shifts Δ± = ℓ± - ℓ0 [B, T] (nats; no gradient; the
    log-probs' dtype, at least float32; padding set to 0 BEFORE subtracting, so no NaN) and the bool mask."""
    m = _as_mask(response_mask)
    for name, lp in (("old_logp", old_logp), ("lp_pos", lp_pos), ("lp_neg", lp_neg)):
        if not torch.is_tensor(lp) or lp.dim() != 2 or lp.shape != m.shape:
            raise ValueError(f"{name} must be a [B, T] tensor of the response_mask's shape {tuple(m.shape)}")
    dt = torch.promote_types(torch.promote_types(old_logp.dtype, lp_pos.dtype), lp_neg.dtype)
    dt = torch.promote_types(dt, torch.float32)
    l0, l_pos, l_neg = (torch.where(m, lp.detach().to(dt), 0.0) for lp in (old_logp, lp_pos, lp_neg))
    return l_pos - l0, l_neg - l0, m  # Δ+ = ℓ+ - ℓ0, Δ- = ℓ- - ℓ0


def sensitivity(old_logp, lp_pos, lp_neg, response_mask, mode="max"):
    """The per-token counterfactual sensitivity s_t [B, T] (nats, >= 0, 0 on padding, no gradient; spec §4) from ℓ0,
    ℓ+, ℓ- [B, T]: [S2] "the maximum of the likelihood shifts under the two conditions", s = max(|Δ+|, |Δ-|) on the
    sampled token [I]; ``mode`` "mean" (|Δ+| + |Δ-|)/2 or "common" |Δ+ + Δ-|/2 (the polarity-free part) [I]."""
    if mode not in _MODES:
        raise ValueError(f"mode must be one of {_MODES}, got {mode!r}")
    shift_pos, shift_neg, m = condition_shifts(old_logp, lp_pos, lp_neg, response_mask)
    s = (torch.maximum(shift_pos.abs(), shift_neg.abs()) if mode == "max"
         else 0.5 * (shift_pos.abs() + shift_neg.abs()) if mode == "mean" else (0.5 * (shift_pos + shift_neg)).abs())
    return torch.where(m, s, 0.0)


# ---- Spec §5: the weights ----------------------------------------------------------------------------------------
# A weight map gives log w_t [B, T] (logs keep w̃ = w / w̄ exact when every w underflows) from (s, threshold, alpha,
# shift_pos, adv): the spec's maps read s (nats), λ and α; Δ+ [B, T] and Â [B] serve a map that reads the shift's sign.
def exp_weight(s, threshold, alpha, shift_pos=None, adv=None):
    """Default, [S2] exponential down-weighting above λ: log w = -α·max(0, s - λ) (w = 1 up to λ; continuous)."""
    return -alpha * (s - threshold).clamp(min=0.0)


def exp_abs_weight(s, threshold, alpha, shift_pos=None, adv=None):
    """[I] the spec's exp(-α·s), above λ only: log w = -α·s if s > λ, else 0 (a jump at λ)."""
    return torch.where(s > threshold, -alpha * s, torch.zeros_like(s))


def inverse_weight(s, threshold, alpha, shift_pos=None, adv=None):
    """[I] the spec's 1 / (1 + α·s), above λ: w = 1 / (1 + α·max(0, s - λ))."""
    return -torch.log1p(alpha * (s - threshold).clamp(min=0.0))


WEIGHT_MAPS = {"exp": exp_weight, "exp_abs": exp_abs_weight, "inverse": inverse_weight}


def credit_log_weights(s, threshold=0.2, alpha=1.0, w_min=0.0, weight="exp", shift_pos=None, adv=None):
    """log w_t [B, T] (spec §5): the map ``weight`` of s [B, T] (nats) at λ = ``threshold`` (nats) and α = ``alpha``,
    floored at log ``w_min`` (w = max(w_min, map)); ``credit_weights`` gives w itself."""
    weight_map = WEIGHT_MAPS.get(weight) if isinstance(weight, str) else weight
    if not callable(weight_map):
        raise ValueError(f"weight must be one of {sorted(WEIGHT_MAPS)} or a weight map, got {weight!r}")
    log_w = weight_map(s, threshold, alpha, shift_pos, adv)
    return log_w.clamp(min=math.log(w_min)) if w_min > 0 else log_w  # the floor against budget concentration


def credit_weights(s, response_mask, threshold=0.2, alpha=1.0, w_min=0.0, weight="exp"):
    """w_t = exp(``credit_log_weights``) [B, T] (spec §5) on valid tokens, 0 on padding, without gradient."""
    m = _as_mask(response_mask)
    if not torch.is_tensor(s) or s.shape != m.shape:
        raise ValueError(f"s must be a tensor with the response_mask shape {tuple(m.shape)}")
    w = torch.exp(credit_log_weights(s.detach(), threshold, alpha, w_min, weight))
    return torch.where(m, w, 0.0)


# ---- Spec §5: the renormalisation --------------------------------------------------------------------------------
def per_sequence(log_w, tokens):
    """w̃_t = w_t / w̄_i [B, T], w̄_i = (1/L_i) Σ_t w_t over row i's ``tokens`` ([B, T] bool; 0 elsewhere), from log w
    (spec §5 [S2]: within each sequence); each row's largest w divided out first (w̃ unchanged): w̄_i > 0 always."""
    log_w_max = torch.where(tokens, log_w, -math.inf).amax(1, keepdim=True)  # [B, 1]
    w = torch.where(tokens, torch.exp(log_w - log_w_max), 0.0)  # w_t / max_t w_t, in (0, 1]
    w_bar = w.sum(1, keepdim=True) / tokens.sum(1, keepdim=True).clamp(min=1)  # w̄_i, on the same scale
    return torch.where(tokens, w / w_bar, 0.0)


# ---- Spec §5: the reallocation -----------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Settings:
    """What ``cscr_token_advantages`` keeps fixed for a run (spec §4-§5 [I]; the defaults are the spec's)."""
    alpha: float = 1.0  # α >= 0, the decay strength (spec §5; 0 gives GRPO)
    w_min: float = 0.0  # the weight floor in [0, 1] (spec §5 suggests 0.1; 0 in the §8 example)
    mode: str = "max"  # Δ± -> s (spec §4): "max" [S2], "mean", "common"
    weight: str | Callable = exp_weight  # s -> log w (spec §5): a weight map (signature above) or a WEIGHT_MAPS name
    renormalise: Callable = per_sequence  # (log_w, tokens) -> w̃ (spec §5): per sequence [S2]

    def __post_init__(self):  # once per run (grpo.py's flags are checked in grpo_config.check_config)
        if not (math.isfinite(self.alpha) and self.alpha >= 0 and 0.0 <= self.w_min <= 1.0 and self.mode in _MODES
                and (callable(self.weight) or self.weight in WEIGHT_MAPS)):
            raise ValueError(f"Settings needs a finite alpha >= 0, w_min in [0, 1], a mode in {_MODES} and a weight map "
                             f"or one of {sorted(WEIGHT_MAPS)} as weight; got {self!r}")


def cscr_token_advantages(adv, old_logp, lp_pos, lp_neg, response_mask, threshold=0.2, settings=None,
                          return_stats=False):
    """CSCR's token advantages Ã [B, T] (spec §5): the credit of sensitive tokens moved to the others.

    [S]: reduce the credit of highly sensitive tokens and renormalise, keeping the credit budget and the verifier's
    direction; [S2]: exponential down-weighting above a threshold λ, per sequence; each step's form [I] is commented
    below.  So sign(Ã_i,t) = sign(Â_i) and Σ_t Ã_i,t = L_i·Â_i, exactly even when every w underflows; α = 0, all s <=
    λ or Â_i = 0 give GRPO.  ``adv``: Â [B]; ``old_logp``, ``lp_pos``, ``lp_neg``: ℓ0, ℓ+, ℓ- [B, T] (nats; a row with
    Â_i = 0 needs none); ``threshold``: λ (nats).  Returns Ã (the log-probs' dtype, at least float32; 0 on padding),
    with ``return_stats`` also a dict over the valid tokens of rows with Â ≠ 0: cscr/ w_mean, frac_w_lt_1, w_tilde_max,
    eff_token_frac (mean over rows of (Σw)² / (L Σw²)), w_bar_mean, inv_w_bar_max (spec §5: keep <~ 1.3), s_mean,
    s_pos_mean / s_neg_mean (rows with Â > 0 / < 0), num_tokens.  Raises ValueError: shapes; non-finite values."""
    settings = settings or Settings()
    if not (torch.is_tensor(adv) and adv.dim() == 1 and torch.is_tensor(old_logp) and len(adv) == len(old_logp)):
        raise ValueError(f"adv must be a [B] tensor, B = old_logp's rows; got adv shape {getattr(adv, 'shape', None)} "
                         f"and old_logp shape {getattr(old_logp, 'shape', None)}")
    with torch.no_grad():
        s = sensitivity(old_logp, lp_pos, lp_neg, response_mask, settings.mode)  # spec §4: max(|Δ+_t|, |Δ-_t|), nats
        shift_pos, _, m = condition_shifts(old_logp, lp_pos, lp_neg, response_mask)  # Δ+ = ℓ+ - ℓ0, for a weight map
        m = m.to(s.device)
        if not torch.isfinite(s[m]).all():
            raise ValueError("old_logp, lp_pos and lp_neg must be finite on valid (response_mask) tokens")
        adv = adv.detach().to(device=s.device, dtype=s.dtype)
        # spec §5: log w_t = log max(w_min, exp(-α·max(0, s_t - λ)))
        log_w = credit_log_weights(s, threshold, settings.alpha, settings.w_min, settings.weight, shift_pos, adv)
        if not torch.isfinite(log_w[m]).all():
            raise ValueError(f"alpha = {settings.alpha} times the sensitivity overflows (log w is not finite on a "
                             f"valid token): lower alpha, or floor the weights with w_min > 0")
        tokens = m & (adv != 0)[:, None]  # the tokens that carry credit
        w_tilde = settings.renormalise(log_w, tokens)  # spec §5: w̃_t = w_t / w̄_i, w̄_i = (1/L_i) Σ_t m_t w_t
        token_adv = torch.where(tokens, adv[:, None] * w_tilde, 0.0)  # Ã_i,t = Â_i · w̃_t · m_t
        return (token_adv, _stats(s, log_w, w_tilde, adv, m)) if return_stats else token_adv


def _stats(s, log_w, w_tilde, adv, m):
    """``cscr_token_advantages``'s logging statistics (see its docstring)."""
    rows = (adv != 0) & m.any(1)
    tok = m & rows[:, None]
    n = int(tok.sum())
    w = torch.where(m, torch.exp(log_w), 0.0)  # unscaled w

    def mean(x, sel):
        return float(x[sel].double().sum() / int(sel.sum())) if int(sel.sum()) else 0.0

    stats = {"cscr/w_mean": mean(w, tok), "cscr/frac_w_lt_1": mean((w < 1).to(w.dtype), tok),
             "cscr/w_tilde_max": float(w_tilde[tok].max()) if n else 0.0,
             "cscr/eff_token_frac": 0.0, "cscr/w_bar_mean": 0.0, "cscr/inv_w_bar_max": 0.0,
             "cscr/s_mean": mean(s, tok), "cscr/s_pos_mean": mean(s, m & (adv > 0)[:, None]),
             "cscr/s_neg_mean": mean(s, m & (adv < 0)[:, None]), "cscr/num_tokens": float(n)}
    if int(rows.sum()):
        m_r, log_w_r = m[rows], log_w[rows]
        L = m_r.sum(1).double()
        # spec §5: the effective-token fraction (Σw)² / (L Σw²), scale-free: w divided by the row's largest
        log_w_max = torch.where(m_r, log_w_r, -math.inf).amax(1, keepdim=True)
        w_r = torch.where(m_r, torch.exp(log_w_r - log_w_max), 0.0).double()
        stats["cscr/eff_token_frac"] = float((w_r.sum(1) ** 2 / (L * (w_r**2).sum(1))).mean())
        w_bar = w[rows].double().sum(1) / L
        stats["cscr/w_bar_mean"] = float(w_bar.mean())
        stats["cscr/inv_w_bar_max"] = float((1.0 / w_bar).max()) if float(w_bar.min()) > 0 else math.inf
    return stats


# ---- Spec §5: the calibrated threshold λ -------------------------------------------------------------------------
def calibrate_threshold(s, response_mask, quantile=0.8):
    """λ (float, nats): the ``quantile`` of s [B, T] over the valid tokens (spec §5 [I]: on the first rollout batch,
    then frozen; it suggests 0.8), linearly interpolated as ``torch.quantile(s[mask], quantile)`` (by a sort: no size
    limit).  Raises ValueError: quantile outside [0, 1]; s not of the mask's shape, or not finite; no valid token."""
    m = _as_mask(response_mask)
    s_valid = s.detach()[m].double() if torch.is_tensor(s) and s.shape == m.shape else None
    if s_valid is None or not 0.0 <= quantile <= 1.0 or not s_valid.numel() or not torch.isfinite(s_valid).all():
        raise ValueError(f"calibrate_threshold needs a quantile in [0, 1] (got {quantile!r}) and s of the response "
                         f"mask's shape {tuple(m.shape)}, finite on the mask's valid tokens (it needs one)")
    s_valid, _ = s_valid.sort()
    pos = quantile * (s_valid.numel() - 1)
    lo = int(math.floor(pos))
    hi = min(lo + 1, s_valid.numel() - 1)
    return float(s_valid[lo] + (pos - lo) * (s_valid[hi] - s_valid[lo]))
