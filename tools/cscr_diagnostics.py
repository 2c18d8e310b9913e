"""CSCR diagnostics D1-D7: do "correct" and "incorrect" privileged prompts move a response's tokens apart?

Paper: CSCR, He, Wu, Wang, arXiv 2607.27888 (2026), its diagnostic study [S2]: 400 on-policy trajectories, each
re-scored under c+ ("this response is correct") and c- ("... incorrect"), sampled-token and full-vocabulary
shifts compared at the same prefix.  Spec: ``docs/specs/cscr.md`` §7 (definitions) and §8 (toy numbers).  The
method is in ``cscr.py``; this file is the analysis behind it: ``diagnostics`` on tensors, ``diagnose`` on a
model, and a CLI.  Quantities as in cscr.py: old_logp = θ_old's sampled-token log-probs under the plain prompt
(ℓ0), Δ+ = lp_pos - old_logp and Δ− = lp_neg - old_logp (``shift_pos``, ``shift_neg``), s = max(|Δ+|, |Δ−|);
affected = |Δ+| > tau and |Δ−| > tau (tau = 0.05 nats).  Definitions [I] (spec §7):

    D1  same-direction rate       P[sign Δ+ = sign Δ− | affected]                         paper [S2]: 91.4-95.8 %
    D2  sign-reversal rate        1 - D1
    D3  polarity-outcome          share of affected tokens whose Δ+ - Δ− has the sign the true outcome
        consistency               predicts (> 0 if correct, < 0 if not); 0.5 = no information    paper: ~58 %
    D4a signal correlation        Pearson / Spearman of Δ+ and Δ− over valid tokens
    D4b top-k overlap             Jaccard of the top 10 % tokens by |Δ+| and by |Δ−|
    D4c full-vocabulary overlap   mean cosine of the OPSD forward-KL gradients p0 - p+ and p0 - p- per position
    D5  common-mode share         sum cm^2 / (sum cm^2 + sum df^2), cm = (Δ+ + Δ−)/2, df = (Δ+ - Δ−)/2
    D6  token-class profile       mean s and share of the top 5 % most sensitive tokens: surface form vs content
    D7  substitutability          correlation of s with the base entropy H(p0) and with 1 - p0(top-1)

The study (``diagnose``), in the order of spec §7: 1. sample on-policy trajectories as the trainer's stage 1 does
(rollout.py: the prompt template, its stop tokens and stop strings, the trainer's sampling distribution);
2. grade them with the trainer's verifier (``verify.grade_batch``: the last \\boxed{}, no fallback), so the
report counts the same answers right as training; 3. re-score each under x, x + c+, x + c- (same weights, no
grad); 4. D1-D7 (``diagnostics``), plus CSCR's weights at the calibrated threshold and the most sensitive tokens.

Inferred choices [I] (spec §7, §11): the "affected" threshold ``tau`` (0.05 nats); the D4b fraction ``top_frac``
/ ``top_k`` (0.1); the D6 fraction ``sens_top_frac`` (0.05); the surface-form vs content heuristic
(``classify_token``, ``DISCOURSE_MARKERS``, ``FUNCTION_WORDS``); D3 counts a zero Δ+ - Δ− as inconsistent;
D4c uses g = p0 - p per position (``full_vocab_overlap``, also KL(p+ || p0), KL(p- || p0)); ``diagnose`` keeps a
response's EOS token (as the trainer), shuffles the problems with the seed and cycles them (one response each),
and template C's answer is ``verify.extract_boxed`` of the response ("" without a box), as in
``credit_methods.CscrCredit``.  All prompts, plain and conditioned, are tokenised by cscr.py's TOKENISATION RULE
(``tokenizer(prompt)``, as the rollout does).

Run (prints D1-D7 beside the paper's values, ``summary_table``; writes DIR/report.json, plus delta_scatter.png and
s_by_class.png when matplotlib is installed)::

    python tools/cscr_diagnostics.py --model toy --data toy --num_trajectories 64 --output_dir runs/cscr_diagnose
    python tools/cscr_diagnostics.py --model Qwen/Qwen3-1.7B --data problems.jsonl --num_trajectories 400 \\
        --max_new_tokens 4096 --dtype bfloat16      # jsonl rows with "problem" and "answer"

or from Python: ``report = diagnose(model, tokenizer, problems, answers, 400, prompt_template="qwen_math")``, or
``diagnostics(old_logp, lp_pos, lp_neg, response_mask, correct)`` on log-probs you already have.

Imports torch and, for the study and its CLI, the project's modules that do each job for the trainer: rollout
(templates, sampling, stop tokens and strings), verify (grading, the answer of template C), problems (``load_problems``:
jsonl, benchmark names, the toy), policy (``load_model_and_tokenizer``: the toy, folders, hub ids, dtype), scale_passes
(``token_outputs``: the trainer's log-probs, the one function on every scoring path) and cscr (condition prompts, the
scoring inputs, sensitivity, weights); matplotlib only inside the plots.  toy/ is reached through problems/policy once
the CLI's ``toy.register()`` added it.  Left out on purpose: training (CSCR itself is cscr.py, the trainer grpo.py); the
vLLM sampler and top-k sampling (the trainer's HF distribution, softmax(logits / T) cut to top-p, is the one studied);
confidence intervals and repeated seeds; the RLCSD-style differential signal (spec §4, "not CSCR").  Read next: spec §7,
``cscr.py``, and ``tests/test_cscr_diagnostics.py`` (the spec §8 toy numbers).
"""

from __future__ import annotations

import sys as _sys  # run as a script (python tools/X.py): the repository root on the path
from pathlib import Path as _Path

_sys.path.insert(0, str(_Path(__file__).resolve().parents[1]))

import json
import math
import os

import torch

import cscr
import rollout
import toy
import verify
from trainer import policy, problems, scale_passes

__all__ = [
    "shift_masks",
    "pearson",
    "spearman",
    "full_vocab_overlap",
    "classify_token",
    "DISCOURSE_MARKERS",
    "FUNCTION_WORDS",
    "diagnostics",
    "sample_trajectories",
    "grade",
    "condition_contexts",
    "score_contexts",
    "surface_classes",
    "diagnose",
    "PAPER_REFERENCE",
    "summary_table",
    "main",
]

# ---- Spec §7: the diagnostics on tensors (D1-D7) -----------------------------------------------------------------


def _affected(shift_pos, shift_neg, m, tau):
    """The D1/D2 masks from the shifts ``shift_pos``, ``shift_neg`` [B, T] (nats) and the valid-token mask ``m``."""
    if not tau >= 0:
        raise ValueError(f"tau must be >= 0, got {tau!r}")
    aff = m & (shift_pos.abs() > tau) & (shift_neg.abs() > tau)
    same = aff & (torch.sign(shift_pos) == torch.sign(shift_neg))
    return {"affected": aff, "same": same, "reversal": aff & ~same}


def shift_masks(old_logp, lp_pos, lp_neg, response_mask, tau=0.05):
    """Per-token masks behind D1/D2 (spec §7).

    affected = |Δ+| > tau and |Δ−| > tau (valid tokens only); same = affected and sign Δ+ = sign Δ−;
    reversal = affected and sign Δ+ != sign Δ−.

    Args:
        old_logp, lp_pos, lp_neg: [B, T] sampled-token log-probs (nats) under x, x + c+, x + c-.
        response_mask: [B, T] bool/float.  tau: nats.

    Returns:
        dict of bool [B, T]: "affected", "same", "reversal".

    Raises:
        ValueError: tau < 0, shape mismatch.
    """
    shift_pos, shift_neg, m = cscr.condition_shifts(old_logp, lp_pos, lp_neg, response_mask)
    return _affected(shift_pos, shift_neg, m, tau)


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
_FORMAT_TOKENS = {
    "$",
    "$$",
    "\\[",
    "\\]",
    "\\(",
    "\\)",
    "<think>",
    "</think>",
    "```",
    "**",
    "##",
    "###",
    "####",
    "---",
    "- ",
    "* ",
    "\\boxed",
    "\\boxed{",
    "\\text",
    "\\text{",
    "\\quad",
    "\\,",
}


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
    old_logp,
    lp_pos,
    lp_neg,
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
    with affected = |Δ+| > tau and |Δ−| > tau, in the spec's order:

    - D1-D3 (``_direction``): ``d1_num_affected``, ``d1_same_direction_rate``, ``d2_sign_reversal_rate``,
      ``d3_polarity_outcome_consistency``.
    - D4a, D4b, D5 (``_overlap``): ``d4a_pearson``, ``d4a_spearman``, ``d4b_k``, ``d4b_topk_jaccard``,
      ``d5_common_mode_share``.  (D4c needs full distributions: ``full_vocab_overlap``.)
    - the sensitivity s (``_sensitivity_summary``): ``s_mean``, ``s_q50``, ``s_q80``, ``s_q95``,
      ``mean_delta_pos``, ``mean_delta_neg``.
    - D6 (needs ``token_classes``; ``_token_class_profile``): ``d6_s_mean_surface``, ``d6_s_mean_content``,
      ``d6_surface_share_top`` (share of surface tokens among the top ``sens_top_frac`` tokens by s),
      ``d6_surface_share_all`` (base rate), ``d6_top_k``.
    - D7 (needs ``entropy`` / ``top1_prob``; ``_substitutability``): ``d7_pearson_s_entropy``,
      ``d7_spearman_s_entropy``, ``d7_pearson_s_1_minus_top1``, ``d7_spearman_s_1_minus_top1``.
    - Also ``num_valid_tokens``.

    Args:
        old_logp, lp_pos, lp_neg: [B, T] sampled-token log-probs (nats) under x (θ_old's ℓ0), x + c+, x + c-.
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
    shift_pos, shift_neg, m = cscr.condition_shifts(old_logp, lp_pos, lp_neg, response_mask)
    if not torch.is_tensor(correct) or correct.shape != (m.shape[0],):
        raise ValueError(f"correct must be a [B] = [{m.shape[0]}] tensor")
    n = int(m.sum())
    if n == 0:
        raise ValueError("response_mask has no valid token")
    s = cscr.sensitivity(old_logp, lp_pos, lp_neg, response_mask, mode=mode)  # [B, T], nats
    out = {"num_valid_tokens": n, **_direction(shift_pos, shift_neg, m, correct, tau)}
    out.update(_overlap(shift_pos[m], shift_neg[m], top_frac, top_k))
    out.update(_sensitivity_summary(s, m, shift_pos[m], shift_neg[m]))
    if token_classes is not None:
        out.update(
            _token_class_profile(s[m].double(), _surface_mask(token_classes, m.shape, m.device)[m], sens_top_frac)
        )
    out.update(_substitutability(s[m].double(), m, entropy, top1_prob))
    return out


def _direction(shift_pos, shift_neg, m, correct, tau):
    """D1-D3 (spec §7) from the shifts [B, T] (nats), the valid mask [B, T] and the outcomes ``correct`` [B].

    D3: the differential Δ+ - Δ− should be > 0 on correct and < 0 on incorrect trajectories if the
    conditioning acted as a Bayesian posterior (spec §7's null); a zero difference counts as inconsistent [I].
    All three are nan without affected tokens.
    """
    masks = _affected(shift_pos, shift_neg, m, tau)
    n_aff = int(masks["affected"].sum())
    if not n_aff:
        nan = float("nan")
        return {
            "d1_num_affected": 0,
            "d1_same_direction_rate": nan,
            "d2_sign_reversal_rate": nan,
            "d3_polarity_outcome_consistency": nan,
        }
    d1 = int(masks["same"].sum()) / n_aff
    diff = shift_pos - shift_neg
    want = torch.where(correct.bool().to(m.device), 1.0, -1.0).unsqueeze(1).to(diff.dtype)
    consistent = masks["affected"] & (torch.sign(diff) == want)
    return {
        "d1_num_affected": n_aff,
        "d1_same_direction_rate": d1,
        "d2_sign_reversal_rate": 1.0 - d1,
        "d3_polarity_outcome_consistency": int(consistent.sum()) / n_aff,
    }


def _overlap(xp, xn, top_frac, top_k):
    """D4a, D4b and D5 (spec §7) from the valid tokens' shifts ``xp`` = shift_pos, ``xn`` = shift_neg ([n], nats)."""
    k = _top_k(xp.numel(), top_frac, top_k)  # D4b: Jaccard of the top-k sets by |Δ+| and |Δ−|
    a = set(torch.topk(xp.abs(), k).indices.tolist())
    b = set(torch.topk(xn.abs(), k).indices.tolist())
    cm, df = 0.5 * (xp + xn), 0.5 * (xp - xn)  # D5: common mode and differential
    tot = float((cm**2).sum() + (df**2).sum())
    return {
        "d4a_pearson": pearson(xp, xn),
        "d4a_spearman": spearman(xp, xn),
        "d4b_k": k,
        "d4b_topk_jaccard": len(a & b) / len(a | b),
        "d5_common_mode_share": float((cm**2).sum()) / tot if tot > 0 else float("nan"),
    }


def _sensitivity_summary(s, m, xp, xn):
    """Mean and quantiles (0.5, 0.8, 0.95) of s [B, T] over the valid tokens ``m``; mean shifts ``xp``, ``xn`` [n]."""
    out = {"s_mean": float(s[m].double().mean())}
    for q in (50, 80, 95):
        out[f"s_q{q}"] = cscr.calibrate_threshold(s, m, q / 100)
    out["mean_delta_pos"] = float(xp.double().mean())
    out["mean_delta_neg"] = float(xn.double().mean())
    return out


def _token_class_profile(sv, surface, sens_top_frac):
    """D6 (spec §7) from the valid tokens' s ``sv`` [n] (float64, nats) and their surface flags ``surface`` [n]."""
    nan = float("nan")
    ks = _top_k(sv.numel(), sens_top_frac, None)
    top = torch.topk(sv, ks).indices
    return {
        "d6_s_mean_surface": float(sv[surface].mean()) if int(surface.sum()) else nan,
        "d6_s_mean_content": float(sv[~surface].mean()) if int((~surface).sum()) else nan,
        "d6_surface_share_top": float(surface[top].double().mean()),
        "d6_surface_share_all": float(surface.double().mean()),
        "d6_top_k": ks,
    }


def _substitutability(sv, m, entropy, top1_prob):
    """D7 (spec §7): correlations of the valid tokens' s ``sv`` [n] with H(p0) and 1 - p0(top-1) ([B, T] each)."""
    out = {}
    for name, x in (("entropy", entropy), ("1_minus_top1", None if top1_prob is None else 1.0 - top1_prob)):
        if x is None:
            continue
        if x.shape != m.shape:
            raise ValueError(f"{'entropy' if name == 'entropy' else 'top1_prob'} must have shape {tuple(m.shape)}")
        xv = x.to(m.device)[m]
        out[f"d7_pearson_s_{name}"] = pearson(sv, xv)
        out[f"d7_spearman_s_{name}"] = spearman(sv, xv)
    return out


# ---- The on-policy study and its CLI (the paper's diagnostic section [S2]: 400 trajectories; spec §7) ------------

PAPER_REFERENCE = {  # [S2] numbers to compare a run with
    "d1_same_direction_rate": "0.914-0.958 (range over settings)",
    "d2_sign_reversal_rate": "0.042-0.086 (1 - D1: rare)",
    "d3_polarity_outcome_consistency": "about 0.58",
    "d4_overlap": "heavy (no figure in the abstract)",
    "d6_token_class": "large shifts on surface-form tokens, content less sensitive",
    "d7_substitutability": "large shifts on highly substitutable tokens",
    "num_trajectories": 400,
}


def summary_table(report: dict) -> str:
    """The CLI's printout of a ``diagnose`` report: D1-D7 beside the paper's values ([S2], ``PAPER_REFERENCE``), one
    line each (rates in %, correlations and shares as numbers, s in nats; "n/a" where nothing was measured)."""
    d, paper = report["diagnostics"], PAPER_REFERENCE

    def num(key, pct=False):
        v = d.get(key)
        return (
            "n/a" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{100 * v:.1f}%" if pct else f"{v:.3f}"
        )

    def pair(a, b):
        return f"{num(a)} / {num(b)}"

    def pct_range(text):  # "0.914-0.958 (...)" -> "91.4-95.8%"
        lo, hi = text.split()[0].split("-")
        return f"{100 * float(lo):.1f}-{100 * float(hi):.1f}%"

    rows = [
        ("D1", "same-direction rate", num("d1_same_direction_rate", True), pct_range(paper["d1_same_direction_rate"])),
        (
            "D2",
            "sign-reversal rate (1 - D1)",
            num("d2_sign_reversal_rate", True),
            pct_range(paper["d2_sign_reversal_rate"]) + ": rare",
        ),
        (
            "D3",
            "polarity-outcome consistency",
            num("d3_polarity_outcome_consistency", True),
            "about 58% (50%: no information)",
        ),
        ("D4a", "Pearson / Spearman of d+, d-", pair("d4a_pearson", "d4a_spearman"), paper["d4_overlap"]),
        ("D4b", "top-10% overlap (Jaccard)", num("d4b_topk_jaccard"), ""),
        ("D4c", "full-vocabulary cosine", num("d4c_cosine_mean"), ""),
        ("D5", "common-mode share", num("d5_common_mode_share"), ""),
        ("D6", "mean s: surface / content", pair("d6_s_mean_surface", "d6_s_mean_content"), paper["d6_token_class"]),
        ("", "surface share: top 5% / all", pair("d6_surface_share_top", "d6_surface_share_all"), ""),
        (
            "D7",
            "corr(s, H(p0)): Pearson / Spearman",
            pair("d7_pearson_s_entropy", "d7_spearman_s_entropy"),
            paper["d7_substitutability"],
        ),
        ("", "corr(s, 1 - p0 top-1)", pair("d7_pearson_s_1_minus_top1", "d7_spearman_s_1_minus_top1"), ""),
    ]
    head = (
        f"CSCR diagnostics: {report['config']['num_trajectories']} trajectories (accuracy "
        f"{report['accuracy']:.3f}), {d.get('d1_num_affected', 0)} of {d.get('num_valid_tokens', 0)} tokens "
        f"affected (|d+| and |d-| > {report['config']['tau']} nats); the paper: {paper['num_trajectories']} "
        f"on-policy trajectories, each re-scored under both conditions"
    )
    lines = [head, f"{'':<4} {'':<36} {'this run':>15}   the paper [S2]"]
    lines += [f"{i:<4} {name:<36} {value:>15}   {ref}".rstrip() for i, name, value, ref in rows]
    return "\n".join(lines)


def sample_trajectories(
    model,
    tokenizer,
    problems,
    answers,
    num_trajectories,
    prompt_template,
    max_new_tokens,
    temperature,
    top_p,
    seed,
    batch_size,
):
    """Step 1 (spec §7, [S2] "on-policy trajectories"): one response per prompt, sampled and cut as in training.

    The problems are shuffled with ``seed`` and cycled until ``num_trajectories`` prompts [I]; each is templated
    with ``rollout.apply_template`` and sampled with ``rollout.generate``, the HF sampler that grpo.py's stage 1
    (``rollout.sample``) calls, with the same stop ids (``rollout.stop_token_ids``: EOS, the model's
    generation-config EOS, the template's stop tokens) and stop strings (``rollout.template_stop_strings``), so a
    response is cut exactly where training cuts it and keeps its EOS.  ``batch_size`` rows per ``generate`` call
    (``rollout.sample`` has none: it samples one step's batch at once).

    Returns:
        (``rollout.RolloutBatch`` with N = ``num_trajectories`` rows, its response columns trimmed to the longest kept
        response: ``response_ids`` [N, T] long, ``response_mask`` [N, T] bool; the N references, list of str).
    """
    order = torch.randperm(len(problems), generator=torch.Generator().manual_seed(seed)).tolist()
    idx = [order[i % len(order)] for i in range(num_trajectories)]
    prompts = [rollout.apply_template(problems[i], prompt_template) for i in idx]
    settings = rollout.SamplingSettings(
        max_new_tokens,
        temperature,
        top_p,
        seed,
        rollout.stop_token_ids(tokenizer, prompt_template, model),
        rollout.template_stop_strings(prompt_template),
    )
    batch = rollout.generate(model, tokenizer, prompts, 1, settings, batch_size=batch_size)
    T = int(batch.response_mask.sum(1).max())  # columns past every stop string or stop token hold only padding
    batch.response_ids, batch.response_mask = batch.response_ids[:, :T], batch.response_mask[:, :T].bool()
    return batch, [answers[i] for i in idx]


def grade(texts, references):
    """Step 2: the outcome of each response, by ``verify.grade_batch`` as grpo.py's stage 2 (last \\boxed{} only).

    Args:
        texts: N response texts (``RolloutBatch.texts``: special tokens removed, cut at stop strings).
        references: N reference answers.

    Returns:
        (correct [N] bool, ``verify.summarize`` counts: total, correct and each grader reason).

    Raises:
        ValueError: as ``verify.grade_batch`` (lengths differ, an empty reference).
    """
    graded = verify.grade_batch(texts, references)
    return torch.tensor([ok for ok, _ in graded], dtype=torch.bool), verify.summarize(graded)


def condition_contexts(prompts, references, texts, template, marker, turn_end):
    """Step 3a (spec §3): the plain prompts x and the privileged x + c+, x + c- of every response.

    Template C's response answer is ``verify.extract_boxed(text) or ""``, exactly as ``credit_methods.CscrCredit``.

    Returns:
        dict of N prompt texts each: "x", "pos", "neg".
    """
    pairs = [
        cscr.build_condition_prompts(
            p,
            reference=ref,
            response_answer=verify.extract_boxed(t) or "",
            template=template,
            marker=marker,
            turn_end=turn_end,
        )
        for p, ref, t in zip(prompts, references, texts)
    ]
    return {"x": list(prompts), "pos": [a for a, _ in pairs], "neg": [b for _, b in pairs]}


_SCORES = ("old_logp", "lp_pos", "lp_neg", "entropy", "top1_prob", "fv_cosine", "fv_kl_pos", "fv_kl_neg")
_POS_CHUNK = 1024  # positions per chunk of three [b, chunk, V] float32 probability tensors (D4c)


@torch.no_grad()
def score_contexts(model, tokenizer, contexts, response_ids, response_mask, temperature, micro_batch_size):
    """Step 3b (spec §7, [S2]): re-score the fixed responses under x, x + c+, x + c- with the same weights.

    Three no-grad forwards per micro-batch, each the trainer's own log-prob function on the scale path,
    ``scale_passes.token_outputs`` (its θ_old pass and CSCR's scoring passes: the same ℓ0, ℓ±; grpo.py's plain
    ``token_outputs`` gives them to rounding, but not the logits), on ``cscr.scoring_inputs`` (every prompt
    tokenised by cscr.py's TOKENISATION RULE, left-padded); the model as given (``diagnose`` puts it in eval mode).
    H(p0) is its ``Asked(entropy=True)``; top-1 and D4c come from its logits (``Asked(logits=True)``;
    ``_full_vocab_scores``).

    Args:
        contexts: ``condition_contexts``'s dict.  response_ids: [N, T] long.  response_mask: [N, T] bool.
        temperature: > 0, the sampling temperature (log-probs of softmax(logits / T), as the trainer scores).

    Returns:
        dict of float32 [N, T] tensors (float64 for a float64 model, as the trainer's): "old_logp", "lp_pos",
        "lp_neg" (sampled-token log-probs, nats, 0 off the mask), "entropy" (H(p0), nats), "top1_prob" (p0's
        largest probability), "fv_cosine", "fv_kl_pos", "fv_kl_neg" (D4c per position, ``full_vocab_overlap``).
    """
    N, T = response_ids.shape
    device, dtype = next(model.parameters()).device, torch.promote_types(next(model.parameters()).dtype, torch.float32)
    out = {k: torch.zeros((N, T), dtype=dtype) for k in _SCORES}
    for a in range(0, N, micro_batch_size):
        rows = slice(a, min(a + micro_batch_size, N))
        r, mz = response_ids[rows].to(device), response_mask[rows].to(device)
        logits = []  # [b, T, V] of x, x + c+, x + c-
        for name, k in (("old_logp", "x"), ("lp_pos", "pos"), ("lp_neg", "neg")):
            inputs = cscr.scoring_inputs(tokenizer, contexts[k][rows], r, mz)
            asked = policy.Asked(entropy=k == "x", logits=True)
            scored = scale_passes.token_outputs(model, *inputs, mz, temperature, asked)  # log p, H(p0) for x, z [b,T,V]
            out[name][rows] = scored.logp.cpu()
            if scored.entropy is not None:
                out["entropy"][rows] = scored.entropy.cpu()  # D7: the base distribution's entropy H(p0)
            logits.append(scored.logits)
        for t0 in range(0, T, _POS_CHUNK):
            cols = slice(t0, min(t0 + _POS_CHUNK, T))
            for k, score in _full_vocab_scores([z[:, cols] for z in logits], temperature).items():
                out[k][rows, cols] = score.cpu()
        del logits
    for k in ("old_logp", "lp_pos", "lp_neg"):
        out[k] = torch.where(response_mask, out[k], torch.zeros((), dtype=dtype))
    return out


def _full_vocab_scores(logits, temperature):
    """``score_contexts``'s full-vocabulary columns at n positions from ``logits``, three [b, n, V] (x, x + c+,
    x + c-): "top1_prob" (D7) and D4c's "fv_cosine", "fv_kl_pos", "fv_kl_neg" ([b, n] float32 each).  Memory:
    three [b, n, V] float32 probability tensors (D4c needs all three at once)."""
    p0, p_pos, p_neg = (
        torch.softmax(z.to(torch.promote_types(z.dtype, torch.float32)) / temperature, dim=-1) for z in logits
    )
    fv = full_vocab_overlap(p0, p_pos, p_neg)  # D4c
    return {
        "top1_prob": p0.max(-1).values,
        "fv_cosine": fv["cosine"],
        "fv_kl_pos": fv["kl_pos"],
        "fv_kl_neg": fv["kl_neg"],
    }


def surface_classes(tokenizer, response_ids, response_mask):
    """Step 4a (D6): ``classify_token`` of every response token, each distinct id decoded once.

    Returns:
        (surface [N, T] bool, True on valid surface-form tokens; {token id: decoded text}).
    """
    uniq = sorted(set(response_ids[response_mask].tolist()))
    text_of = {i: tokenizer.decode([i]) for i in uniq}
    lookup = torch.zeros(max(uniq) + 1, dtype=torch.bool)
    for i in uniq:
        lookup[i] = classify_token(text_of[i]) == "surface"
    return lookup[response_ids.clamp(min=0, max=max(uniq))] & response_mask, text_of


def _cscr_at_q80(scores, response_mask, correct):
    """CSCR on the study's tokens: λ = the 0.8 quantile of s (spec §5), α = 1, adv = ±1 by outcome.

    Returns (s [N, T] nats, λ, ``cscr.cscr_stats``)."""
    lp = (scores["old_logp"], scores["lp_pos"], scores["lp_neg"])
    s = cscr.sensitivity(*lp, response_mask)
    threshold = cscr.calibrate_threshold(s, response_mask, 0.8)
    adv = torch.where(correct, 1.0, -1.0)  # the sign of a GRPO sequence advantage Â_i (magnitude 1)
    stats = cscr.cscr_stats(adv, *lp, response_mask, threshold=threshold)
    return s, threshold, stats


def _most_sensitive(s, scores, response_ids, response_mask, surface, text_of, num_examples):
    """The ``num_examples`` valid tokens of largest s, each with its row, position, text, class and shifts."""
    T = s.shape[1]
    top = torch.topk(
        torch.where(response_mask, s, torch.full((), -1.0)).flatten(), min(num_examples, int(response_mask.sum()))
    )
    examples = []
    for sv, f in zip(top.values.tolist(), top.indices.tolist()):
        i, j = divmod(f, T)
        examples.append(
            {
                "row": i,
                "t": j,
                "token": text_of[int(response_ids[i, j])],
                "class": "surface" if bool(surface[i, j]) else "content",
                "s": sv,
                "delta_pos": float(scores["lp_pos"][i, j] - scores["old_logp"][i, j]),
                "delta_neg": float(scores["lp_neg"][i, j] - scores["old_logp"][i, j]),
            }
        )
    return examples


def _json_safe(x):
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, dict):
        return {key: _json_safe(val) for key, val in x.items()}
    if isinstance(x, (list, tuple)):
        return [_json_safe(v) for v in x]
    return x


def _check_study(tokenizer, problems, answers, num_trajectories, temperature):
    """``diagnose``'s argument checks (ValueError), before any sampling."""
    if len(problems) != len(answers) or not problems:
        raise ValueError("problems and answers must be non-empty lists of the same length")
    if not (isinstance(num_trajectories, int) and num_trajectories >= 1):
        raise ValueError(f"num_trajectories must be a positive int, got {num_trajectories!r}")
    if not temperature > 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    if tokenizer.pad_token_id is None:
        raise ValueError("tokenizer.pad_token_id must be set")


def diagnose(
    model,
    tokenizer,
    problems,
    answers,
    num_trajectories,
    *,
    prompt_template="none",
    template="verdict",
    max_new_tokens=64,
    temperature=1.0,
    top_p=1.0,
    seed=0,
    gen_batch_size=16,
    micro_batch_size=8,
    tau=0.05,
    top_frac=0.1,
    sens_top_frac=0.05,
    output_dir=None,
    marker=cscr.MARKER,
    turn_end=cscr.TURN_END,
    num_examples=20,
    return_tensors=False,
):
    """Sample on-policy trajectories, grade them, re-score them under c+ and c-, and report D1-D7 (spec §7).

    Paper ([S2]): 400 on-policy trajectories re-scored under both conditions, sampled-token and full-vocabulary
    shifts compared at the same prefix.  Steps, each a function of this module: 1. ``sample_trajectories``
    (rollout.py, as training's stage 1); 2. ``grade`` (verify.py, as training's stage 2); 3.
    ``condition_contexts`` and ``score_contexts`` (x, x + c+, x + c-); 4. ``surface_classes`` and ``diagnostics``.

    Args:
        model, tokenizer: HF causal LM and tokenizer (``pad_token_id`` required), e.g. from
            ``policy.load_model_and_tokenizer``.
        problems, answers: lists of str of the same length (raw problems; ``prompt_template`` wraps them).
        num_trajectories: int >= 1.  prompt_template: a key of ``rollout.PROMPT_TEMPLATES`` (resolved, not "auto").
        template: condition template (see ``cscr.build_condition_prompts``).
        output_dir: if given, writes ``report.json`` there (and PNG plots when matplotlib is installed).
        return_tensors: also return a dict of the per-token tensors ([N, T]: response_ids, response_mask and
            ``score_contexts``'s; surface; [N]: correct) and the texts (texts, references, prompts, prompts_pos,
            prompts_neg).
        other args: sampling (temperature > 0, top_p, seed, ``gen_batch_size`` rows per ``generate`` call,
            ``micro_batch_size`` rows per scoring pass) and diagnostics options, see ``diagnostics``.

    Returns:
        dict report (JSON-safe: nan -> None; "grader": ``verify.summarize``'s counts, as training logs them), or
        ``(report, tensors)`` with ``return_tensors``.

    Raises:
        ValueError: bad sizes, no pad token, temperature <= 0, an unknown template or prompt template.
    """
    _check_study(tokenizer, problems, answers, num_trajectories, temperature)
    name, notes = cscr.condition_notes(template)  # an unknown template fails before any sampling
    batch, refs = sample_trajectories(
        model,
        tokenizer,
        problems,
        answers,
        num_trajectories,
        prompt_template,
        max_new_tokens,
        temperature,
        top_p,
        seed,
        gen_batch_size,
    )
    correct, grader = grade(batch.texts, refs)
    contexts = condition_contexts(batch.prompts, refs, batch.texts, template, marker, turn_end)
    was_training = model.training
    model.eval()  # the scorer of spec §4: the rollout's weights, no dropout
    try:
        scores = score_contexts(
            model, tokenizer, contexts, batch.response_ids, batch.response_mask, temperature, micro_batch_size
        )
    finally:
        model.train(was_training)
    ids, mask = batch.response_ids, batch.response_mask
    surface, text_of = surface_classes(tokenizer, ids, mask)
    lp = (scores["old_logp"], scores["lp_pos"], scores["lp_neg"])
    diag = diagnostics(
        *lp,
        mask,
        correct,
        tau=tau,
        top_frac=top_frac,
        token_classes=surface,
        entropy=scores["entropy"],
        top1_prob=scores["top1_prob"],
        sens_top_frac=sens_top_frac,
    )
    for k in ("cosine", "kl_pos", "kl_neg"):  # D4c: d4c_cosine_mean, d4c_kl_pos_mean, d4c_kl_neg_mean
        diag[f"d4c_{k}_mean"] = float(scores[f"fv_{k}"][mask].double().mean())
    s, threshold, stats = _cscr_at_q80(scores, mask, correct)
    report = _json_safe(
        {
            "config": {
                "num_trajectories": num_trajectories,
                "prompt_template": prompt_template,
                "template": name if name != "custom" else list(notes),
                "max_new_tokens": max_new_tokens,
                "temperature": temperature,
                "top_p": top_p,
                "seed": seed,
                "tau": tau,
                "top_frac": top_frac,
                "sens_top_frac": sens_top_frac,
            },
            "num_correct": int(correct.sum()),
            "accuracy": float(correct.double().mean()),
            "grader": grader,
            "mean_response_length": float(mask.sum(1).double().mean()),
            "diagnostics": diag,
            "suggested_threshold_q80": threshold,
            "cscr_stats_at_q80_alpha1": stats,
            "most_sensitive_tokens": _most_sensitive(s, scores, ids, mask, surface, text_of, num_examples),
            "example_condition_prompts": [contexts["pos"][0], contexts["neg"][0]],
            "paper_reference": PAPER_REFERENCE,
        }
    )
    if output_dir is not None:
        os.makedirs(output_dir, exist_ok=True)
        with open(os.path.join(output_dir, "report.json"), "w", encoding="utf-8") as f:
            json.dump(report, f, indent=2, ensure_ascii=False)
        _plots(output_dir, *lp, mask, s, surface)
    if not return_tensors:
        return report
    return report, {
        "response_ids": ids,
        "response_mask": mask,
        **scores,
        "surface": surface,
        "correct": correct,
        "texts": batch.texts,
        "references": refs,
        "prompts": contexts["x"],
        "prompts_pos": contexts["pos"],
        "prompts_neg": contexts["neg"],
    }


def _plots(output_dir, old_logp, lp_pos, lp_neg, mask, s, surf):
    """Scatter of Δ+ vs Δ− and histogram of s by token class (only if matplotlib is installed)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    shift_pos = (lp_pos - old_logp)[mask].numpy()
    shift_neg = (lp_neg - old_logp)[mask].numpy()
    fig, ax = plt.subplots(figsize=(5, 5))
    ax.scatter(shift_pos, shift_neg, s=3, alpha=0.3)
    lim = float(max(abs(shift_pos).max(), abs(shift_neg).max(), 1e-3))
    ax.plot([-lim, lim], [-lim, lim], lw=0.5, color="gray")
    ax.axhline(0, lw=0.5, color="gray")
    ax.axvline(0, lw=0.5, color="gray")
    ax.set_xlabel("Δ+ = lp_pos − old_logp (nats)")
    ax.set_ylabel("Δ− = lp_neg − old_logp (nats)")
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


def _parser():
    import argparse

    ap = argparse.ArgumentParser(
        description="CSCR diagnostics (spec §7): re-score on-policy trajectories under c+ / c-."
    )
    ap.add_argument(
        "--model", required=True, help="'toy', a model folder or a hub id (policy.load_model_and_tokenizer)"
    )
    ap.add_argument(
        "--data",
        required=True,
        help="a jsonl file of {problem, answer} rows, a benchmark or training set "
        "name, or 'toy' (problems.load_problems, train split)",
    )
    ap.add_argument(
        "--num_trajectories",
        type=int,
        default=400,
        help="on-policy trajectories (one response per prompt) to re-score under c+ and c- (paper: 400)",
    )
    ap.add_argument("--output_dir", default="runs/cscr_diagnose")
    ap.add_argument("--template", default="verdict", choices=sorted(cscr.CONDITION_TEMPLATES))
    ap.add_argument(
        "--prompt_template",
        default="auto",
        choices=["auto", *rollout.PROMPT_TEMPLATES],
        help="the training prompt template (rollout.py); auto: as grpo.py (none for the toy, the one a "
        "trained folder names, else qwen_math)",
    )
    ap.add_argument("--max_new_tokens", type=int, default=64)
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--top_p", type=float, default=1.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--gen_batch_size", type=int, default=16)
    ap.add_argument("--micro_batch_size", type=int, default=8)
    ap.add_argument("--tau", type=float, default=0.05)
    ap.add_argument("--top_frac", type=float, default=0.1)
    ap.add_argument("--device", default=None, help="default: cuda if available else cpu")
    ap.add_argument("--dtype", default="float32", choices=["auto", "float32", "bfloat16", "float16"])
    return ap


def main(argv=None):
    """CLI: ``python tools/cscr_diagnostics.py --model M --data D --num_trajectories N [options]``.

    Raises ValueError / OSError (one line under ``python tools/cscr_diagnostics.py``): a bad data row or file, a model
    that cannot be loaded, an unknown template."""
    toy.register()  # --model toy, --data toy: the built-in toy in the generic modules (toy/)
    args = _parser().parse_args(argv)
    prompt_template = rollout.resolve_template(args.prompt_template, args.model)
    rows = problems.load_problems(args.data, split="train")  # data first: a bad row stops before the model loads
    model, tokenizer = policy.load_model_and_tokenizer(args.model, args.dtype, args.device)
    report = diagnose(
        model,
        tokenizer,
        [r["problem"] for r in rows],
        [r["answer"] for r in rows],
        args.num_trajectories,
        prompt_template=prompt_template,
        template=args.template,
        max_new_tokens=args.max_new_tokens,
        temperature=args.temperature,
        top_p=args.top_p,
        seed=args.seed,
        gen_batch_size=args.gen_batch_size,
        micro_batch_size=args.micro_batch_size,
        tau=args.tau,
        top_frac=args.top_frac,
        output_dir=args.output_dir,
    )
    print(summary_table(report))
    print(f"report: {os.path.join(args.output_dir, 'report.json')} (every value, the most sensitive tokens)")
    return report


if __name__ == "__main__":
    try:
        main()
    except (ValueError, OSError) as e:  # bad data, model, folder or flag: one line, as grpo.py and evaluate.py do
        raise SystemExit(f"cscr_diagnostics.py: error: {e}")
