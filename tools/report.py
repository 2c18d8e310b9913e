"""The run report: where the credit goes, token by token, for one or several runs of grpo.py, as one HTML page.

    python tools/report.py runs/grpo runs/delta runs/cscr              # writes report.html here
    python tools/report.py runs/delta --output delta.html --steps 1,30,60

Token-level credit assignment decides which tokens of a response get more or less of its sequence advantage Â_i. The
page paints that on the tokens: every logged response (``samples/step_*.jsonl``, written by
``run_setup.write_samples``) is shown token by token, each token shaded by its credit c_{i,t} = Ã_{i,t} / Â_i
(GRPO: 1; DelTA: λ̄_{i,t}, Eq. 8; CSCR: w̃_t = w_t / mean_t(w), spec §5) on one diverging colour scale centred at 1,
with the exact value on hover. Runs sampled with the same seed log the same prompts at the same step: their responses to
a prompt stand next to each other (the prompt text is the key). Above them: one row per run (held-out accuracy before
and after, reward, length), the credit's distribution per run (histograms on one scale) and the curves of
``metrics.jsonl`` (reward, held-out accuracy, length, DelTA's λ̄ statistics, CSCR's weight statistics) as small
multiples. For runs on the toy, whose responses' truth is known (``toy.logged_truth``, computed from each samples/
row's prompt and tokens when it is read): "Where the credit lands", the mean credit of an incorrect response's first
wrong token, of the shared prefix before it and of the tokens after it, and of a correct response's result digits and
its other tokens, with the AUROCs of the credit at picking out those tokens, and the first wrong token marked in the
token view; for DelTA runs, the tokens with the highest and lowest mean λ̄ per side. These numbers are
trainer/samples_summary.py's (``truth_numbers``; its ``write_samples_summary`` writes one finished run's
samples/summary.json); the page draws them and writes them to ``<page>.json`` next to it (report.html -> report.json).

The page is self-contained: inline CSS and SVG, no script, style or font from the network, so it can be mailed or
attached to an issue. Hover values are ``title`` attributes (no JavaScript). A folder that is not a run, or a run
whose files cannot be read, is named in one line and left out; the other runs are still reported.
Left out on purpose: interactive zoom and filtering (the curves are for reading, TensorBoard or wandb via
``grpo.py --report_to`` for exploring), and responses of steps beyond a size budget (``--steps all`` shows them).
Read next: trainer/run_setup.py ``write_samples`` (what samples/ holds), trainer/samples_summary.py (the numbers),
docs/report.md.
"""

from __future__ import annotations

import sys as _sys  # run as a script (python tools/X.py): the repository root on the path
from pathlib import Path as _Path

_sys.path.insert(0, str(_Path(__file__).resolve().parents[1]))

import argparse
import html
import json
import math
import os
import re
import sys
import time
from dataclasses import dataclass

import toy
from trainer import samples_summary

RUN_COLOURS = ["#0072b2", "#009e73", "#cc79a7", "#e69f00", "#56b4e9", "#d55e00", "#555555"]  # Okabe-Ito
# The token scale (ColorBrewer PuOr): purple = less than the sequence advantage, orange = more, white = exactly Â.
LESS = ["#ffffff", "#e7e4f1", "#c9c3e0", "#a79dce", "#8073ac", "#5e3f96", "#3f1f73"]
MORE = ["#ffffff", "#fdebd3", "#fdd19c", "#f9ae5d", "#e6862a", "#c0620f", "#8f4206"]
LEVELS = 12  # colour classes per side; the exact value is in each token's title
TOKEN_BUDGET = 120_000  # --steps auto: show every logged step while the page holds at most this many tokens


# The credit c = Ã_{i,t} / Â_i of each --credit, as hovered (FIPO: its future-KL weight f, Â·f/Â); a rule that masks
# tokens out of the loss (Forking Tokens, DelTA's Q2) shows "c" (``symbol``).
SYMBOL = {"grpo": "c", "delta": "λ̄", "cscr": "w̃", "fipo": "f", "otb": "c", "optimal_token_baseline": "c"}


def credit_of(config: dict) -> str:
    """The credit a run's config.json "config" names: its --credit, or "fipo" for a ``--fipo`` run (python -m
    comparisons; ``--credit fipo`` is its old spelling, which older runs' configs hold); "" when it names none. A key
    the config lacks (older runs) takes its default."""
    return "fipo" if config.get("fipo", False) else config.get("credit", "")


def _masks(config: dict, credit: str) -> bool:
    """Whether the run's loss leaves tokens out (Forking Tokens' entropy masks, DelTA's Q2 selection)."""
    return (
        config.get("entropy_top_ratio", 0.0) > 0
        or config.get("top_entropy_quantile", 1.0) < 1
        or (credit == "delta" and config.get("delta_select", "none") != "none")
    )


def rule_name(config: dict) -> str:
    """The comparison rule a run trained with, from its config.json's "config" (the fields of grpo.py's GRPOConfig,
    or of python -m comparisons' config, its flags beside them): the names of tools/bench/reproduce.py's RULES in
    words, e.g. "grpo", "delta", "fipo" (``--fipo``, or its old spelling ``--credit fipo``: ``credit_of``), "sapo",
    "forking tokens ρ=0.2", "delta: hard assignment", "delta Q2: top 50%", "cscr: group scope". Rules combine: the
    loss-side rule (sapo, Forking Tokens in its code's or TRL's reading) first, then the credit with its non-default
    settings, e.g. "sapo + delta: frozen γ, raw α". A key the config lacks (older runs, or a grpo.py run without
    the comparisons' flags) takes its default, so an older config names what it names today: its --credit. "" when
    the config has no "credit" (unknown).
    Left out, as they do not change the rule: --loss_type grpo/dr_grpo, DelTA's --delta_impl and --delta_scope,
    --entropy_pool, and the strengths of CSCR other than α (--cscr_threshold, ...), SAPO and FIPO."""
    g = config.get
    credit = credit_of(config)
    if not credit:
        return ""
    loss = []
    if g("loss_type", "dapo") == "sapo":
        loss.append("sapo")
    if g("entropy_top_ratio", 0.0) > 0:
        loss.append(f"forking tokens ρ={g('entropy_top_ratio'):g}")
    if g("top_entropy_quantile", 1.0) < 1:
        loss.append(f"forking tokens (TRL) ρ={g('top_entropy_quantile'):g}")
    base, details = credit, []
    if credit == "delta":
        if g("delta_select", "none") != "none":
            base = "delta Q2"
            details.append(f"{g('delta_select')} {g('delta_select_fraction', 0.5):.0%}")
        details += [
            label
            for on, label in [
                (g("delta_scores", "contrastive") == "within_side", "within-side scores"),
                (g("delta_assignment", "soft") == "hard", "hard assignment"),
                (g("delta_gamma", "adaptive") == "frozen", "frozen γ"),
                (g("delta_coefficients", "bounded") == "raw", "raw α"),
                (g("delta_coefficients", "bounded") == "random", "random λ"),
                (not g("delta_normalize", True), "no λ-normalisation"),
                (g("delta_proxy", "hidden") == "topk", f"top-K proxy K={g('delta_proxy_topk', 20)}"),
                (g("delta_k", 1) != 1, f"K={g('delta_k', 1)}"),
                (
                    (g("delta_lam_min", 0.8), g("delta_lam_max", 1.2)) != (0.8, 1.2),
                    f"λ∈[{g('delta_lam_min', 0.8):g}, {g('delta_lam_max', 1.2):g}]",
                ),
            ]
            if on
        ]
    elif credit == "cscr":
        weight, scope = g("cscr_weight", "exp"), g("cscr_scope", "sequence")
        if weight != "exp":
            details.append({"sign_aware": "sign-aware", "upweight": "up-weighting"}.get(weight, f"{weight} weight"))
        if scope != "sequence":
            details.append(f"{scope} scope")
        if g("cscr_alpha", 1.0) != 1.0:  # the strength ablation (spec §9.2)
            details.append(f"α={g('cscr_alpha', 1.0):g}")
    rule = base + (": " + ", ".join(details) if details else "")
    if loss and credit == "grpo":  # the loss rule alone: DAPO's loss with another gate or a mask
        return " + ".join(loss)
    return " + ".join([*loss, rule])


def symbol(config: dict, credit: str) -> str:
    """What a run's hovered credit is called: SYMBOL of its --credit, or "c" when its loss masks tokens out (the
    credit is then the product of the mask and the rule's weight)."""
    return "c" if _masks(config, credit) else SYMBOL.get(credit, "credit")


@dataclass
class Run(samples_summary.RunSamples):
    """A run folder as the page reads it: its logged samples (path, name, credit, config, samples:
    ``samples_summary.RunSamples``) and its curves and summary."""

    metrics: list[dict]  # metrics.jsonl: training steps and evaluations
    summary: dict  # summary.json (absent while a run is in progress: {})

    @property
    def rule(self) -> str:
        """``rule_name`` of the run's config (its ``credit`` when config.json lacks the key)."""
        return rule_name({"credit": self.credit, **self.config})

    @property
    def symbol(self) -> str:
        return symbol(self.config, self.credit)


# --- Reading the run folders ----------------------------------------------------------------------------------
def load_run(path: str, say=print) -> Run:
    """One run folder of grpo.py (``--output_dir``). A torn last line of metrics.jsonl or of a samples file (a run
    in progress, or killed mid-write) is left out and named in one line (``say``). The truth of each logged response
    of a run on a task that registered one (the toy's) is added to its row (``samples_summary.add_truth``). Raises
    samples_summary.RunError: not a folder, no metrics.jsonl, any other line that is not JSON, a logged response
    without its fields or whose ``tokens`` and ``credit`` differ in length."""
    if not os.path.isdir(path):
        raise samples_summary.RunError(
            f"{path}: " + ("a file, not a run folder" if os.path.exists(path) else "no such folder")
        )
    if not os.path.isfile(os.path.join(path, "metrics.jsonl")):
        raise samples_summary.RunError(f"{path}: not a run folder of grpo.py (it has no metrics.jsonl)")
    metrics, torn = samples_summary.read_jsonl(os.path.join(path, "metrics.jsonl"))
    left_out = [torn] if torn else []
    docs = {}
    for name in ("config.json", "summary.json"):
        try:
            with open(os.path.join(path, name)) as f:
                docs[name] = json.load(f)
        except FileNotFoundError:
            docs[name] = {}
        except json.JSONDecodeError as e:
            raise samples_summary.RunError(f"{os.path.join(path, name)}: not JSON ({e})") from None
    samples, torn_samples = samples_summary.read_samples(path)
    left_out += torn_samples
    if left_out:  # one line for the run, however many of its files were torn
        say(f"report.py: {'; '.join(left_out)} (a run in progress or killed mid-write): the rest is reported")
    config = docs["config.json"].get("config", {})
    samples_summary.add_truth(samples, config.get("data"))
    return Run(
        path=path,
        name=os.path.basename(os.path.normpath(path)),
        credit=credit_of(config),
        config=config,
        samples=samples,
        metrics=metrics,
        summary=docs["summary.json"],
    )


def load_runs(paths: list[str], say=print) -> list[Run]:
    """The readable runs among ``paths``; each one left out is named in one line (``say``). Runs get unique names
    (the folder's name, or the path when two folders share it)."""
    runs = []
    for path in paths:
        try:
            run = load_run(path, say=say)
        except (samples_summary.RunError, OSError) as e:
            say(f"report.py: skipping {e}")
            continue
        if not run.samples:
            say(f"report.py: {path} has no samples/step_*.jsonl (--logging_steps 0?): its curves only")
        elif not any("tokens" in r for rows in run.samples.values() for r in rows):
            say(f"report.py: {path}'s samples have no per-token credit (an older grpo.py): responses as plain text")
        runs.append(run)
    names = [r.name for r in runs]
    for r in runs:
        if names.count(r.name) > 1:
            r.name = os.path.normpath(r.path)
    return runs


# --- The colour of a credit -------------------------------------------------------------------------------------
def credit_range(runs: list[Run], largest: float = 2.0) -> float:
    """R > 1: the colour scale runs from 1/R (darkest purple) through 1 (white) to R (darkest orange), on a log
    scale (half and double the sequence advantage are equally far from white). R covers 99.5% of the tokens that
    carry a gradient (Â ≠ 0) in any run, rounded up to a value a colour bar can label, and is at most ``largest``
    (CSCR's w̃ can be ~0: the scale would leave DelTA's λ̄ ∈ [0.8, 1.2] white); beyond it, the end colour."""
    dev = sorted(
        abs(math.log(max(c, 1e-6)))
        for run in runs
        for rows in run.samples.values()
        for row in rows
        if row.get("advantage")
        for c in row.get("credit", ())
    )
    top = math.exp(dev[int(0.995 * (len(dev) - 1))]) if dev else 1.0
    return min(next((R for R in (1.1, 1.2, 1.25, 1.5, 2.0, 3.0, 4.0, 5.0, 10.0) if R >= top), 10.0), largest)


def _scale_label(v: float, R: float) -> str:
    return ("≤" if v == 1 / R else "≥" if v == R else "") + f"{v:.2f}"


def position(c: float, R: float) -> float:
    """Where credit ``c`` sits on the scale: −1 (≤ 1/R) ... 0 (exactly 1) ... +1 (≥ R)."""
    return max(-1.0, min(1.0, math.log(max(c, 1e-9)) / math.log(R)))


def level(c: float, R: float) -> int:
    """The colour class of credit ``c``: −LEVELS ... LEVELS (0: white)."""
    return round(position(c, R) * LEVELS)


def colour(t: float) -> str:
    """The scale's colour at position ``t`` ∈ [−1, 1], interpolated between the ColorBrewer stops."""
    stops = MORE if t >= 0 else LESS
    x = abs(t) * (len(stops) - 1)
    i = min(int(x), len(stops) - 2)
    a, b = (tuple(int(s[k : k + 2], 16) for k in (1, 3, 5)) for s in stops[i : i + 2])
    return "#" + "".join(f"{round(p + (q - p) * (x - i)):02x}" for p, q in zip(a, b))


# --- Small SVG charts, written by hand (no plotting library needed at build or view time) --------------------------
def _ticks(lo: float, hi: float, n: int = 4) -> list[float]:
    if hi <= lo:
        return [lo]
    raw = (hi - lo) / n
    step = min((m * 10 ** math.floor(math.log10(raw)) for m in (1, 2, 2.5, 5, 10)), key=lambda s: abs(s - raw))
    first = math.ceil(lo / step - 1e-9) * step
    return [round(first + k * step, 10) for k in range(int((hi - first) / step + 1e-9) + 1)]


def _fmt(v: float) -> str:
    return f"{v:.0f}" if abs(v) >= 100 else f"{v:.3g}"


def _tick_labels(ticks: list[float]) -> list[str]:
    """The labels of an axis's ticks with the fewest significant digits that write every tick exactly (to 1e-6 of
    their spacing), so that no two read the same: 0.9965, 0.997, 0.9975, 0.998 where ``_fmt``'s three digits gave
    0.997 twice; 200 ... 1000, never 1e+03."""
    if len(ticks) < 2:
        return [_fmt(t) for t in ticks]
    spacing = min(b - a for a, b in zip(ticks, ticks[1:]))
    for digits in range(1, 18):
        labels = [f"{t:.{digits}g}" for t in ticks]
        if not any("e+" in label for label in labels) and all(
            abs(float(label) - t) <= spacing * 1e-6 for label, t in zip(labels, ticks)
        ):
            return labels
    return [repr(t) for t in ticks]


def line_chart(series: list[dict], width: int = 330, height: int = 170) -> str:
    """An SVG chart of one metric: ``series`` of {colour, label, points [(x, y)], band [(x, lo, hi)] (optional)},
    drawn as lines (markers when a series has few points), bands as translucent areas."""
    L, R_, T, B = 40, 10, 8, 22
    pts = [p for s in series for p in s["points"]] + [
        (x, v) for s in series for x, lo, hi in s.get("band", ()) for v in (lo, hi)
    ]
    if not pts:
        return ""
    x0, x1 = min(p[0] for p in pts), max(p[0] for p in pts)
    y0, y1 = min(p[1] for p in pts), max(p[1] for p in pts)
    pad = (y1 - y0) * 0.08 or abs(y0) * 0.05 or 0.5
    y0, y1, x1 = y0 - pad, y1 + pad, x1 if x1 > x0 else x0 + 1

    def X(x):
        return L + (x - x0) / (x1 - x0) * (width - L - R_)

    def Y(y):
        return T + (y1 - y) / (y1 - y0) * (height - T - B)

    out = [f'<svg viewBox="0 0 {width} {height}" width="{width}" height="{height}" role="img">']
    ys = _ticks(y0, y1)
    for t, text in zip(ys, _tick_labels(ys)):
        out.append(
            f'<line x1="{L}" x2="{width - R_}" y1="{Y(t):.1f}" y2="{Y(t):.1f}" class="grid"/>'
            f'<text x="{L - 5}" y="{Y(t) + 3.5:.1f}" class="yl">{text}</text>'
        )
    xs = _ticks(x0, x1, 5)
    for t, text in zip(xs, _tick_labels(xs)):
        out.append(f'<text x="{X(t):.1f}" y="{height - 6}" class="xl">{text}</text>')
    for s in series:
        if s.get("band"):
            upper = " ".join(f"{X(x):.1f},{Y(hi):.1f}" for x, lo, hi in s["band"])
            lower = " ".join(f"{X(x):.1f},{Y(lo):.1f}" for x, lo, hi in reversed(s["band"]))
            out.append(f'<polygon points="{upper} {lower}" fill="{s["colour"]}" fill-opacity="0.15"/>')
        line = " ".join(f"{X(x):.1f},{Y(y):.1f}" for x, y in s["points"])
        last = s["points"][-1][1] if s["points"] else float("nan")
        label = html.escape(f"{s['label']}: {_fmt(last)} at step {s['points'][-1][0]}" if s["points"] else s["label"])
        out.append(
            f'<polyline points="{line}" fill="none" stroke="{s["colour"]}" stroke-width="1.6">'
            f"<title>{label}</title></polyline>"
        )
        if len(s["points"]) <= 12:
            out += [
                f'<circle cx="{X(x):.1f}" cy="{Y(y):.1f}" r="2.8" fill="{s["colour"]}"><title>{label}</title></circle>'
                for x, y in s["points"]
            ]
    return "".join(out) + "</svg>"


def colour_bar(R: float, width: int = 420) -> str:
    """The legend's colour bar: 1/R ... 1 ... R, with labelled ticks."""
    stops = "".join(f'<stop offset="{k / 40:.3f}" stop-color="{colour(k / 20 - 1)}"/>' for k in range(41))
    ticks = sorted({1 / R, 1 / math.sqrt(R), 1.0, math.sqrt(R), R})
    m = 16  # room for the end labels
    marks = "".join(
        f'<line x1="{x:.1f}" x2="{x:.1f}" y1="20" y2="26" stroke="#555"/>'
        f'<text x="{x:.1f}" y="38" class="xl">{_scale_label(v, R)}</text>'
        for v in ticks
        for x in [m + (position(v, R) + 1) / 2 * (width - 2 * m)]
    )
    return (
        f'<svg viewBox="0 0 {width} 44" width="{width}" height="44" role="img" aria-label="colour scale">'
        f'<defs><linearGradient id="cbar">{stops}</linearGradient></defs>'
        f'<rect x="{m}" y="2" width="{width - 2 * m}" height="18" rx="3" fill="url(#cbar)" stroke="#bbb"/>'
        f"{marks}</svg>"
    )


def bin_counts(values: list[float], R: float, bins: int = 40) -> list[int]:
    """How many of ``values`` (credits) fall in each of ``bins`` equal bins of the colour scale's log axis 1/R ... R;
    values beyond an end count in its bin."""
    counts = [0] * bins
    for c in values:
        counts[min(bins - 1, int((position(c, R) + 1) / 2 * bins))] += 1
    return counts


def histogram(counts: list[int], R: float, ymax: float, width: int = 330, height: int = 130) -> str:
    """The bars of ``bin_counts``, painted with the colour scale; ``ymax``: the shared top (fraction of tokens); a
    taller bar is cut and labelled with its height."""
    L, B, T, bins = 16, 22, 14, len(counts)
    n, w = max(sum(counts), 1), (width - 2 * L) / bins
    out = [f'<svg viewBox="0 0 {width} {height}" width="{width}" height="{height}" role="img">']
    for k, cnt in enumerate(counts):
        if not cnt:
            continue
        frac = cnt / n
        h = min(frac / ymax, 1.0) * (height - B - T)
        out.append(
            f'<rect x="{L + k * w:.1f}" y="{height - B - h:.1f}" width="{w - 0.6:.1f}" height="{h:.1f}" '
            f'fill="{colour((k + 0.5) / bins * 2 - 1)}" stroke="#888" stroke-width="0.4">'
            f"<title>{frac:.1%} of tokens</title></rect>"
        )
        if frac > ymax * 1.001:
            out.append(f'<text x="{L + (k + 0.5) * w:.1f}" y="{T - 3}" class="xl">{frac:.0%}</text>')
    for v in sorted({1 / R, 1 / math.sqrt(R), 1.0, math.sqrt(R), R}):
        x = L + (position(v, R) + 1) / 2 * (width - 2 * L)
        out.append(
            f'<line x1="{x:.1f}" x2="{x:.1f}" y1="{height - B}" y2="{height - B + 4}" stroke="#555"/>'
            f'<text x="{x:.1f}" y="{height - 6}" class="xl">{_scale_label(v, R)}</text>'
        )
    out.append(f'<line x1="{L}" x2="{width - L}" y1="{height - B}" y2="{height - B}" stroke="#999"/>')
    return "".join(out) + "</svg>"


# --- The page's parts -----------------------------------------------------------------------------------------
def _series(runs, colours, key) -> list[dict]:
    out = []
    for run in runs:
        pts = [(r["step"], r[key]) for r in run.metrics if isinstance(r.get(key), (int, float)) and "step" in r]
        if pts:
            out.append({"colour": colours[run.name], "label": run.name, "points": pts})
    return out


def _band_series(runs, colours, side) -> list[dict]:
    """DelTA's λ̄ on one side (pos/neg): the mean, with the min–max range as a band."""
    out = []
    for run in runs:
        keys = [f"delta/lam_{side}_{k}" for k in ("mean", "min", "max")]
        rows = [r for r in run.metrics if all(isinstance(r.get(k), (int, float)) for k in keys)]
        if rows:
            out.append(
                {
                    "colour": colours[run.name],
                    "label": f"{run.name} mean λ̄",
                    "points": [(r["step"], r[keys[0]]) for r in rows],
                    "band": [(r["step"], r[keys[1]], r[keys[2]]) for r in rows],
                }
            )
    return out


def curves(runs: list[Run], colours: dict) -> str:
    """The small multiples: one chart per metric, every run that logged it in its colour."""
    evals = sorted({k for run in runs for r in run.metrics for k in r if re.fullmatch(r"eval/avg@\d+", k)})
    charts = [
        ("training reward", "mean over the step's rollout batch", _series(runs, colours, "reward")),
        *[(f"held-out {k[5:]}", "step 0, every --eval_steps, last", _series(runs, colours, k)) for k in evals],
        ("mean response length", "tokens, EOS included", _series(runs, colours, "completions/mean_length")),
        ("DelTA λ̄, tokens of Â > 0", "mean and min–max", _band_series(runs, colours, "pos")),
        ("DelTA λ̄, tokens of Â < 0", "mean and min–max", _band_series(runs, colours, "neg")),
        ("DelTA λ̄ spread, Â > 0", "std over the side's tokens", _series(runs, colours, "delta/lam_pos_std")),
        ("DelTA cos(μ̄+, μ̄−)", "overlap of the two centroids", _series(runs, colours, "delta/cos_mu")),
        ("CSCR mean weight w", "before renormalising", _series(runs, colours, "cscr/w_mean")),
        ("CSCR tokens with w < 1", "fraction with s_t > λ", _series(runs, colours, "cscr/frac_w_lt_1")),
        ("CSCR largest w̃", "max over the batch", _series(runs, colours, "cscr/w_tilde_max")),
        ("CSCR effective token fraction", "(Σw)² / (L·Σw²)", _series(runs, colours, "cscr/eff_token_frac")),
    ]
    figs = [
        f"<figure><figcaption>{html.escape(title)} <small>{html.escape(note)}</small></figcaption>"
        f"{line_chart(series)}</figure>"
        for title, note, series in charts
        if series
    ]
    return f'<div class="grid">{"".join(figs)}</div>'


def _rule_note(run: Run) -> str:
    """A caption's "<rule> · ", unless the run's folder is already named after its rule."""
    return f"{html.escape(run.rule)} · " if run.rule not in ("", run.name) else ""


def histograms(runs: list[Run], colours: dict, R: float) -> str:
    """Per run, the credit of every logged token of a response with Â ≠ 0, on one axis and one height."""
    data = {
        run.name: [
            c for rows in run.samples.values() for row in rows if row.get("advantage") for c in row.get("credit", ())
        ]
        for run in runs
    }
    data = {k: v for k, v in data.items() if v}
    if not data:
        return '<p class="muted">No logged tokens with a non-zero advantage.</p>'
    counts = {name: bin_counts(vals, R) for name, vals in data.items()}
    tops = [(max(c) / len(data[name]), sum(k > 0 for k in c)) for name, c in counts.items()]
    spread = [top for top, filled in tops if filled > 2]  # a spike (GRPO: every credit 1) is cut instead
    ymax = max(spread or [top for top, _ in tops])
    figs = []
    for run in runs:
        vals = data.get(run.name)
        if not vals:
            continue
        below, above = sum(c < 0.9995 for c in vals) / len(vals), sum(c > 1.0005 for c in vals) / len(vals)
        figs.append(
            f'<figure><figcaption><span class="chip" style="background:{colours[run.name]}"></span>'
            f"{html.escape(run.name)} <small>{_rule_note(run)}{run.symbol} · {len(vals):,} tokens · "
            f"mean {sum(vals) / len(vals):.3f} · &lt;1: {below:.0%} · &gt;1: {above:.0%}</small></figcaption>"
            f"{histogram(counts[run.name], R, ymax)}</figure>"
        )
    return f'<div class="grid">{"".join(figs)}</div>'


def _eval(run: Run, when: str) -> dict:
    """The held-out evaluation before / after training (summary.json, else the first / last one logged)."""
    if run.summary.get(when):
        return run.summary[when]
    logged = [r for r in run.metrics if any(k.startswith("eval/") for k in r)]
    return (logged[0] if when == "before" else logged[-1]) if logged else {}


def run_table(runs: list[Run], colours: dict) -> str:
    rows = []
    for run in runs:
        before, after = _eval(run, "before"), _eval(run, "after")
        avg = next((k for k in after if re.fullmatch(r"eval/avg@\d+", k)), None)
        steps = [r for r in run.metrics if "reward" in r]
        last = steps[-10:]

        def change(key):
            if key and isinstance(before.get(key), (int, float)) and isinstance(after.get(key), (int, float)):
                return f"{before[key]:.3f} → <b>{after[key]:.3f}</b>"
            return "–"

        reward = f"{sum(r['reward'] for r in last) / len(last):.3f}" if last else "–"
        length = (
            f"{steps[-1]['completions/mean_length']:.1f}" if steps and "completions/mean_length" in steps[-1] else "–"
        )
        n = sum(len(v) for v in run.samples.values())
        rows.append(
            f'<tr><td class="run"><span class="chip" style="background:{colours[run.name]}"></span>'
            f"<b>{html.escape(run.name)}</b></td><td>{html.escape(run.rule or '?')}</td>"
            f'<td class="num">{len(steps)}</td><td class="num">{change(avg)}</td>'
            f'<td class="num">{change("eval/greedy")}</td><td class="num">{reward}</td>'
            f'<td class="num">{length}</td><td class="num">{n:,} ({len(run.samples)} steps)</td>'
            f'<td class="muted">{html.escape(run.path)}</td></tr>'
        )
    k = next((k[5:] for run in runs for k in _eval(run, "after") if re.fullmatch(r"eval/avg@\d+", k)), "avg@k")
    return (
        '<table class="runs"><thead><tr><th>run</th><th>credit</th><th>steps</th>'
        f"<th>held-out {k}</th><th>held-out greedy</th><th>reward, last 10 steps</th><th>mean length</th>"
        f"<th>logged responses</th><th>folder</th></tr></thead><tbody>{''.join(rows)}</tbody></table>"
    )


def _token_text(tok: str) -> str:
    return html.escape(tok.replace("\n", "↵\n").replace("\t", "→\t"), quote=False) or "∅"


def response(row: dict, R: float, symbol: str, first_wrong: int | None = None) -> str:
    """One logged response: reward, Â, and its tokens painted by their credit (value in each title); the token at
    index ``first_wrong`` (an incorrect toy response's first wrong token, ``toy.response_truth``) is underlined."""
    a, ok = row["advantage"], row["reward"] > 0
    adv = f"{a:+.2f}".replace("-", "−") if a else "0"  # a typographic minus
    meta = f'<span class="{"ok" if ok else "bad"}">{"✓" if ok else "✗"} {row["reward"]:g}</span> Â {adv}' + (
        '<br><span class="muted">truncated</span>' if row.get("finish_reason") == "length" else ""
    )
    if "tokens" in row:
        body = "".join(
            f'<i class="c{level(c, R) + LEVELS}{" fw" * (k == first_wrong)}" title="{symbol}={c:.4f}">'
            f"{_token_text(t)}</i>"
            for k, (t, c) in enumerate(zip(row["tokens"], row["credit"]))
        )
    else:
        body = html.escape(row["response"], quote=False)
    attrs = 'class="resp"' if a else 'class="resp zero" title="Â = 0: no gradient"'
    return f'<div {attrs}><div class="meta">{meta}</div><div class="tok">{body}</div></div>'


def _groups(run: Run, step: int) -> dict[str, list[dict]]:
    out = {}
    for row in run.samples.get(step, []):
        out.setdefault(row["prompt"], []).append(row)
    return out


def pick_steps(runs: list[Run], choice: str) -> tuple[list[int], list[int]]:
    """(every logged step, the steps whose responses the page shows): ``all``, a comma-separated list, or ``auto``
    (every step while the page holds at most TOKEN_BUDGET tokens, else evenly spaced steps, first and last kept).
    Raises ValueError for a list that names no logged step."""
    logged = sorted({s for run in runs for s in run.samples})
    if choice == "all" or not logged:
        return logged, logged
    if choice != "auto":
        try:
            wanted = {int(s) for s in choice.split(",") if s.strip()}
        except ValueError:
            raise ValueError(f"--steps {choice}: expected auto, all or step numbers like 1,30,60") from None
        shown = [s for s in logged if s in wanted]
        if not shown:
            raise ValueError(f"--steps {choice}: none of them was logged (logged: {logged[0]} ... {logged[-1]})")
        return logged, shown
    tokens = sum(len(r.get("tokens") or r["response"]) for run in runs for rows in run.samples.values() for r in rows)
    k = max(2, int(len(logged) * TOKEN_BUDGET / max(tokens, 1)))
    if k >= len(logged):
        return logged, logged
    return logged, sorted({logged[round(j * (len(logged) - 1) / (k - 1))] for j in range(k)})


def _first_wrong(run: Run, row: dict) -> int | None:
    """The first wrong token of an incorrect response whose truth was logged (a toy run's), else None."""
    if row["reward"] > 0:
        return None
    truth = samples_summary.logged_truth(row)
    return truth["first_wrong"] if truth else None


def step_section(step: int, runs: list[Run], colours: dict, R: float, is_open: bool) -> str:
    """One logged step: each prompt once, with every run's responses to it side by side (a run that did not log
    this prompt at this step shows the nearest step at which it did, or says it has none)."""
    groups = {run.name: _groups(run, step) for run in runs}
    prompts = list(dict.fromkeys(p for run in runs for p in groups[run.name]))
    cards = []
    for prompt in prompts:
        cols = []
        for run in runs:
            rows, note = groups[run.name].get(prompt), ""
            if rows is None:
                near = sorted(
                    (abs(s - step), s) for s, rs in run.samples.items() if any(r["prompt"] == prompt for r in rs)
                )
                if near:
                    rows, note = _groups(run, near[0][1])[prompt], f" (step {near[0][1]})"
            sym = run.symbol
            head = (
                f'<div class="colhead"><span class="chip" style="background:{colours[run.name]}"></span>'
                f"{html.escape(run.name)}{note} <small>{sum(r['reward'] > 0 for r in rows or [])}/{len(rows or [])}"
                f" correct · hover: {sym}</small></div>"
            )
            body = (
                "".join(response(r, R, sym, _first_wrong(run, r)) for r in sorted(rows, key=lambda r: -r["advantage"]))
                if rows
                else '<p class="muted">not among this run\'s logged prompts</p>'
            )
            cols.append(f'<div class="col" data-run="{html.escape(run.name)}">{head}{body}</div>')
        cards.append(
            f'<div class="card"><div class="prompt"><span class="muted">prompt</span> '
            f"{html.escape(prompt.strip(), quote=False)}</div>"
            f'<div class="cols" style="grid-template-columns:repeat({len(runs)},minmax(0,1fr))">'
            f"{''.join(cols)}</div></div>"
        )
    score = " · ".join(
        f"{html.escape(run.name)} {sum(r['reward'] > 0 for r in run.samples.get(step, []))}/"
        f"{len(run.samples.get(step, []))}"
        for run in runs
        if step in run.samples
    )
    return (
        f'<details class="step"{" open" if is_open else ""} id="step-{step}"><summary>Step {step} '
        f"<small>{len(prompts)} prompt{'s' * (len(prompts) != 1)} · correct: {score}</small></summary>"
        f"{''.join(cards)}</details>"
    )


# --- Where the credit lands and DelTA's tokens: samples_summary's numbers drawn ---------------------------------
def _stat_cell(stat: dict) -> str:
    """A table cell: the mean in bold, below it the per-step min–max and the count; the std in the title."""
    if stat["mean"] is None:
        return '<td class="num muted">–</td>'
    title = (
        f"mean over {stat['count']:,}; per-step means {stat['step_min']:.4f} to {stat['step_max']:.4f}, "
        f"std {stat['step_std']:.4f}, over {len(stat['per_step'])} steps"
    )
    return (
        f'<td class="num" title="{title}"><b>{stat["mean"]:.3f}</b><br><small>{stat["step_min"]:.3f}–'
        f"{stat['step_max']:.3f} · {stat['count']:,}</small></td>"
    )


def credit_lands_section(runs: list[Run], colours: dict, lands: dict[str, dict]) -> str:
    """The page's "Where the credit lands" (toy runs): a row per run of ``credit_lands``' numbers and the two AUROCs
    over training steps as curves."""
    rows = []
    for run in runs:
        d = lands[run.name]
        k = d["responses"]
        credit = f' <small class="muted">{html.escape(run.rule)}</small>' if run.rule not in ("", run.name) else ""
        rows.append(
            f'<tr><td class="lrun"><span class="chip" style="background:{colours[run.name]}"></span>'
            f"<b>{html.escape(run.name)}</b>{credit}</td>"
            + "".join(_stat_cell(d["classes"][key]) for key, _, _ in samples_summary.CLASSES)
            + "".join(_stat_cell(d["auroc"][key]) for key in ("first_wrong", "result_digits"))
            + f'<td class="num" title="{k["no_wrong_token"]} incorrect with no wrong token (a prefix of a '
            f'correct solution): counted, not classed">{k["incorrect"]} incorrect · {k["correct"]} correct'
            f"</td></tr>"
        )
    heads = "".join(f"<th>{html.escape(h)}<br><small>{side}</small></th>" for _, h, side in samples_summary.CLASSES)
    table = (
        f'<table class="runs lands"><thead><tr><th>run</th>{heads}<th>AUROC first wrong<br><small>incorrect'
        f"</small></th><th>AUROC result digits<br><small>correct</small></th><th>responses<br><small>with Â ≠ 0"
        f"</small></th></tr></thead><tbody>{''.join(rows)}</tbody></table>"
    )
    charts = []
    for key, title in (("first_wrong", "AUROC: first wrong token"), ("result_digits", "AUROC: result digits")):
        series = [
            {
                "colour": colours[run.name],
                "label": run.name,
                "points": [(s, m) for s, m, _ in lands[run.name]["auroc"][key]["per_step"]],
            }
            for run in runs
        ]
        series = [s for s in series if s["points"]]
        if series:
            charts.append(
                f"<figure><figcaption>{title} <small>mean over the step's responses; 0.5: no better "
                f"than chance</small></figcaption>{line_chart(series)}</figure>"
            )
    intro = (
        "<p>On the toy the truth of every response is known (<code>toy.response_truth</code>): an incorrect "
        "response's <b>first wrong token</b> is the first token at which it is no longer a prefix of any "
        "correct solution the toy's grammar allows (the tokens before it, the <b>shared prefix</b>, a correct "
        "response could also write); a correct response's <b>result digits</b> are the digits after each "
        "<code>=</code> and inside the box. Each cell: the mean credit c = Ã<sub>i,t</sub>/Â<sub>i</sub> of "
        "that class's tokens over every logged step (rows with Â ≠ 0), below it the min–max of the per-step "
        "means and the number of tokens (hover: the std). <b>AUROC</b>: per response, the Mann–Whitney "
        "probability (ties ½) that the class's token gets a higher c than the response's other tokens, "
        "averaged over responses (count: responses). Higher c is more of Â<sub>i</sub>: for an incorrect "
        "response (Â<sub>i</sub> &lt; 0) more of the penalty. GRPO gives every token c = 1: 1 and 0.5 "
        "exactly. Incorrect responses with no wrong token (cut off while still a prefix of a correct "
        "solution) are counted, not classed. A red underline marks the first wrong token below.</p>"
    )
    return f'{intro}{table}<div class="grid" style="margin-top:14px">{"".join(charts)}</div>'


def _tok_cell(tok: str) -> str:
    return f"<code>{html.escape(tok.replace(' ', '␣').replace(chr(10), '↵'), quote=False)}</code>"


def delta_tokens_section(runs: list[Run], colours: dict, views: dict[str, dict]) -> str:
    """DelTA's token view (``delta_tokens``) of each delta run: per side, the highest and lowest mean λ̄."""
    figs = []
    for run in runs:
        view = views.get(run.name)
        if view is None:
            continue
        parts = []
        for side, label in (("pos", "Â &gt; 0"), ("neg", "Â &lt; 0")):
            v = view[side]
            cols = []
            for which in ("highest", "lowest"):
                body = (
                    "".join(
                        f'<tr><td>{_tok_cell(t)}</td><td class="num">{m:.3f}</td><td class="num">{n:,}</td></tr>'
                        for t, m, n in v[which]
                    )
                    or '<tr><td colspan="3" class="muted">none</td></tr>'
                )
                cols.append(
                    f'<table class="runs"><thead><tr><th>{which} λ̄</th><th>mean</th><th>count</th></tr>'
                    f"</thead><tbody>{body}</tbody></table>"
                )
            parts.append(
                f'<div><p><b>{label}</b> <small class="muted">{v["tokens"]:,} tokens, {v["listed"]} of '
                f"{v['distinct']} distinct seen ≥ {samples_summary.MIN_TOKEN_COUNT} times</small></p>"
                f'<div class="pair">{"".join(cols)}</div></div>'
            )
        figs.append(
            f'<figure><figcaption><span class="chip" style="background:{colours[run.name]}"></span>'
            f'{html.escape(run.name)}</figcaption><div class="sides">{"".join(parts)}</div></figure>'
        )
    return "".join(figs)


CSS = """
:root{--ink:#1c2128;--muted:#667080;--line:#e2e5ea;--panel:#f6f7f9}
*{box-sizing:border-box}
body{margin:0;color:var(--ink);background:#fff;font:14px/1.5 system-ui,-apple-system,"Segoe UI",Roboto,
"Helvetica Neue","Liberation Sans","DejaVu Sans",Arial,sans-serif}
main{max-width:1500px;margin:0 auto;padding:26px 34px 60px}
h1{font-size:23px;margin:0 0 2px;letter-spacing:-.01em}
h2{font-size:16px;margin:30px 0 12px;padding-bottom:6px;border-bottom:1px solid var(--line)}
h2 small,figcaption small,summary small,.colhead small{font-weight:400;color:var(--muted)}
.muted{color:var(--muted)} p{margin:6px 0;max-width:1100px}
table.runs{border-collapse:collapse;font-variant-numeric:tabular-nums;font-size:13px}
table.runs th{font-weight:600;text-align:left;color:var(--muted);font-size:12px}
table.runs th,table.runs td{padding:5px 14px 5px 0;border-bottom:1px solid var(--line);white-space:nowrap}
td.num{text-align:right}
.chip{display:inline-block;width:10px;height:10px;border-radius:2px;margin:0 5px 0 8px}
td .chip,figcaption .chip,.colhead .chip{margin-left:0}
.legend{display:grid;grid-template-columns:auto 1fr;gap:6px 28px;align-items:start;background:var(--panel);
padding:14px 18px;border-radius:8px;margin-top:18px}
.legend p{margin:0 0 6px;font-size:13px}
.scale-ends{display:flex;justify-content:space-between;width:420px;font-size:12px;color:var(--muted);padding:0 8px}
.grid{display:grid;grid-template-columns:repeat(auto-fill,minmax(330px,1fr));gap:14px 22px}
figure{margin:0} figcaption{font-weight:600;font-size:13px;margin-bottom:2px}
svg text{font:10px system-ui,"DejaVu Sans",sans-serif;fill:#667080}
svg .yl{text-anchor:end} svg .xl{text-anchor:middle} svg .grid{stroke:#eceef1}
details.step{border:1px solid var(--line);border-radius:8px;margin:10px 0;overflow:hidden}
details.step>summary{cursor:pointer;padding:8px 14px;font-weight:600;background:var(--panel)}
.card{padding:10px 14px 12px;border-top:1px solid var(--line)}
.prompt{font:13px ui-monospace,"SFMono-Regular",Menlo,Consolas,"DejaVu Sans Mono",monospace;margin-bottom:8px}
.prompt .muted{font:12px system-ui,sans-serif;margin-right:6px}
.cols{display:grid;gap:18px}
.colhead{font-weight:600;font-size:13px;margin-bottom:4px;padding-bottom:3px;border-bottom:2px solid var(--line)}
.resp{display:grid;grid-template-columns:84px minmax(0,1fr);gap:8px;padding:3px 0;border-bottom:1px dotted #e8eaee}
.resp.zero{opacity:.55}
.meta{font-size:12px;color:var(--muted);font-variant-numeric:tabular-nums;white-space:nowrap;padding-top:1px}
.ok{color:#1a7f37;font-weight:600}.bad{color:#b42318;font-weight:600}
.tok{font:13px/1.75 ui-monospace,"SFMono-Regular",Menlo,Consolas,"DejaVu Sans Mono",monospace;
white-space:pre-wrap;overflow-wrap:anywhere}
.tok i{font-style:normal;border-radius:2px;padding:1px 0;box-shadow:inset -1px 0 rgba(255,255,255,.55)}
.tok i:hover{outline:1.5px solid #1c2128}
.tok i.fw{box-shadow:inset 0 -3px #d1242f}
table.lands td,table.lands th{white-space:normal;line-height:1.3;padding-right:18px}
.sides{display:flex;gap:26px;flex-wrap:wrap}.pair{display:flex;gap:18px;align-items:flex-start}
.pair code{background:var(--panel);padding:0 3px;border-radius:2px}
footer{margin-top:34px;font-size:12px;color:var(--muted)}
"""


def legend(runs: list[Run], R: float) -> str:
    credits = {run.credit for run in runs}
    lines = [
        "<p><b>Colour: each token's credit c<sub>i,t</sub> = Ã<sub>i,t</sub> / Â<sub>i</sub></b>, the share of "
        "its response's sequence advantage it receives in the clipped surrogate. <b>White</b>: exactly Â<sub>i"
        '</sub>, what GRPO gives every token. <b style="color:#c0620f">Orange</b>: more than Â<sub>i</sub>; '
        '<b style="color:#5e3f96">purple</b>: less. When Â<sub>i</sub> &lt; 0 the same colours mean more or '
        "less of the penalty. Hover a token for its exact value.</p>"
    ]
    if "delta" in credits:
        lines.append(
            "<p><b>DelTA</b>: c = λ̄<sub>i,t</sub> (Eq. 8): λ = λ<sub>min</sub> + (λ<sub>max</sub> − "
            "λ<sub>min</sub>)·α, α = σ(Δ/γ) the soft assignment of the token's own-side margin Δ, "
            "rescaled to mean 1 over the batch: orange tokens sit on their side of the discriminator "
            "(the contrastive ones), purple tokens look like both sides.</p>"
        )
    if "cscr" in credits:
        lines.append(
            "<p><b>CSCR</b>: c = w̃<sub>t</sub> = w<sub>t</sub> / mean<sub>t</sub>(w), w<sub>t</sub> = "
            "max(w<sub>min</sub>, exp(−α·max(0, s<sub>t</sub> − λ))): purple tokens are "
            "counterfactually sensitive (s<sub>t</sub> &gt; λ: their log-probability moves under the "
            "privileged notes c±), and the credit they lose goes to the others (Σ<sub>t</sub> c = "
            "L<sub>i</sub>).</p>"
        )
    if "fipo" in credits:
        lines.append(
            "<p><b>FIPO</b>: c = f<sub>i,t</sub>, the future-KL weight its loss multiplies Â<sub>i</sub> by: "
            "exp of the decayed sum of log π<sub>θ</sub>/π<sub>old</sub> over token t and the tokens after "
            "it, clipped to [1, 1 + clip] (Â &lt; 0 tokens with a large ratio: [0.8, 1]); orange tokens "
            "lead to text the update already made likelier (baselines.future_kl_weights).</p>"
        )
    if any(_masks(run.config, run.credit) for run in runs):
        lines.append(
            "<p><b>Masked rules</b> (Forking Tokens, DelTA's Q2): c is 0 on the tokens the loss leaves "
            "out (darkest purple) and the rule's weight on the others.</p>"
        )
    if any(samples_summary.has_truth(run) for run in runs):
        lines.append(
            '<p><b style="color:#d1242f">Red underline</b> (toy runs): an incorrect response\'s first wrong '
            'token, where it is no longer a prefix of any correct solution (see "Where the credit '
            'lands").</p>'
        )
    lines.append(
        '<p class="muted">Faded responses have Â<sub>i</sub> = 0 (the whole group scored alike): they '
        "get no gradient; DelTA's λ̄ is shown for them as computed, the other credits as 1. Colours are "
        "on a log scale shared by all runs; the histograms count the tokens of responses with Â ≠ 0.</p>"
    )
    return (
        f'<div class="legend"><div>{colour_bar(R)}<div class="scale-ends"><span>← less credit than Â</span>'
        f"<span>more credit than Â →</span></div></div><div>{''.join(lines)}</div></div>"
    )


def build_report(runs: list[Run], steps: str = "auto", scale: float | None = None) -> tuple[str, dict]:
    """The HTML page of ``runs`` (loaded with ``load_runs``) and what it holds ({runs, steps_shown, steps_logged,
    responses, tokens, scale}). ``steps``: see ``pick_steps``; ``scale``: the colour scale's end R (1/R ... R),
    None: ``credit_range``. Raises ValueError: ``steps`` names no logged step, or ``scale`` <= 1."""
    colours = {run.name: RUN_COLOURS[k % len(RUN_COLOURS)] for k, run in enumerate(runs)}
    if scale is not None and not scale > 1:
        raise ValueError(f"--scale {scale}: the colour scale's end must be > 1 (it runs from 1/R to R)")
    R = scale or credit_range(runs)
    logged, shown = pick_steps(runs, steps)
    palette = "".join(
        f".c{k + LEVELS}{{background:{colour(k / LEVELS)}"  # dark colours get white text
        f"{';color:#fff' if abs(k) > 0.62 * LEVELS else ''}}}"
        for k in range(-LEVELS, LEVELS + 1)
    )
    sections = [step_section(s, runs, colours, R, s in (shown[0], shown[-1])) for s in shown]
    numbers = samples_summary.truth_numbers(runs)
    why = f"--steps {html.escape(steps)}" if steps != "auto" else "a size budget; <code>--steps all</code> shows all"
    note = "" if len(shown) == len(logged) else f" <small>{len(shown)} of {len(logged)} logged steps ({why})</small>"
    names = ", ".join(html.escape(run.name) for run in runs)
    chips = " ".join(
        f'<span class="chip" style="background:{colours[run.name]}"></span>{html.escape(run.name)}' for run in runs
    )
    body = (
        f'<h1>Where the credit goes</h1><p class="muted">{len(runs)} run{"s" * (len(runs) != 1)} of grpo.py: '
        f"{names}. Built by report.py from each run folder's metrics.jsonl, summary.json and samples/.</p>"
        f"{run_table(runs, colours)}{legend(runs, R)}"
        f"<h2>Curves <small>metrics.jsonl against the training step: {chips}</small></h2>"
        f"{curves(runs, colours)}"
        f"<h2>Credit per token <small>every logged token of a response with Â ≠ 0, on the colour scale's "
        f"log axis, one axis for all runs</small></h2>"
        f"{histograms(runs, colours, R)}{truth_sections(runs, colours, numbers)}"
        f"<h2>Responses, token by token{note}</h2>"
        + ("".join(sections) or '<p class="muted">No run has logged responses.</p>')
        + "<footer>Self-contained page: no script, style or font is loaded from elsewhere.</footer>"
    )
    page = (
        f'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><meta name="viewport" '
        f'content="width=device-width,initial-scale=1"><title>Credit report: {names}</title>'
        f"<style>{CSS}{palette}</style></head><body><main>{body}</main></body></html>"
    )
    info = {
        "runs": len(runs),
        "steps_logged": len(logged),
        "steps_shown": len(shown),
        "responses": sum(len(run.samples.get(s, [])) for run in runs for s in shown),
        "tokens": sum(len(r.get("tokens", ())) for run in runs for s in shown for r in run.samples.get(s, [])),
        "scale": R,
        "numbers": numbers,
    }
    return page, info


def truth_sections(runs: list[Run], colours: dict, numbers: dict) -> str:
    """The page's sections on ``truth_numbers``: "Where the credit lands" (toy runs) and DelTA's token view."""
    out = ""
    lands, views = numbers.get("where_the_credit_lands"), numbers.get("delta_tokens")
    if lands:
        toy_runs = [run for run in runs if run.name in lands]
        out += (
            f'<h2 id="where-the-credit-lands">Where the credit lands <small>the credit against the toy\'s truth, '
            f"every logged step</small></h2>{credit_lands_section(toy_runs, colours, lands)}"
        )
    if views:
        out += (
            f'<h2 id="delta-tokens">DelTA\'s tokens <small>highest and lowest mean λ̄ over the run, per side, '
            f"tokens seen ≥ {samples_summary.MIN_TOKEN_COUNT} times</small></h2>"
            f"{delta_tokens_section(runs, colours, views)}"
        )
    return out


def default_output(run_folders: list) -> str:
    """``report.html`` in a folder the runs own: the one run's folder, or the folder that holds all of them
    (runs/report.html for runs/grpo runs/delta runs/cscr) unless that is the working directory (then the first
    run's folder). Never the repository's root, which git does not ignore. In a run's folder the trainer counts the
    page and its numbers as the run's own (checkpoint.REPORT_PAGE): a run stopped before its first checkpoint
    starts again there, the page moved aside with its logs."""
    folders = [os.path.abspath(p) for p in run_folders]
    parent = os.path.commonpath(folders) if len(folders) > 1 else folders[0]
    if parent == os.getcwd() or parent == os.path.dirname(parent):  # the working directory, or the root
        parent = folders[0]
    return os.path.relpath(os.path.join(parent, "report.html"))


def _count(n: int, noun: str) -> str:
    """``n`` and ``noun``, plural unless n is 1: "1 run", "3 runs", "1,200 tokens"."""
    return f"{n:,} {noun}{'s' * (n != 1)}"


def numbers_path(page: str) -> str:
    """Where the page's numbers go: ``<page>.json`` (report.html -> report.json)."""
    return os.path.splitext(page)[0] + ".json"


def main(argv=None) -> str:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("runs", nargs="+", help="run folders of grpo.py (--output_dir)")
    ap.add_argument(
        "--output",
        default="",
        help="the HTML file to write (default: report.html in the folder that "
        "holds the runs, e.g. runs/report.html, or in the run's folder for one run)",
    )
    ap.add_argument(
        "--steps",
        default="auto",
        help="whose responses to show: auto (all while the page stays a few "
        "MB, else evenly spaced), all, or step numbers like 1,30,60 (default: %(default)s)",
    )
    ap.add_argument(
        "--scale",
        type=float,
        default=None,
        help="the colour scale's end R: credits from 1/R to R (default: what covers 99.5%% of the tokens, at most 2)",
    )
    args = ap.parse_args(argv)
    args.output = args.output or default_output(args.runs)
    toy.register_data()  # the toy's truth of a logged response (samples_summary.TRUTH): "Where the credit lands"
    t0 = time.time()
    runs = load_runs(args.runs, say=lambda line: print(line, file=sys.stderr))
    if not runs:
        raise SystemExit("report.py: error: none of the folders is a run of grpo.py; nothing to report")
    try:
        page, info = build_report(runs, args.steps, args.scale)
    except ValueError as e:
        raise SystemExit(f"report.py: error: {e}")
    try:  # the page's folder is made if missing (like grpo.py's --output_dir); an unwritable one is one line
        os.makedirs(os.path.dirname(os.path.abspath(args.output)), exist_ok=True)
        with open(args.output, "w", encoding="utf-8") as f:
            f.write(page)
    except OSError as e:
        raise SystemExit(f"report.py: error: --output {args.output} cannot be written ({e.strerror})")
    if info["numbers"]:  # the numbers of "Where the credit lands" and DelTA's token view, next to the page
        with open(numbers_path(args.output), "w", encoding="utf-8") as f:
            json.dump(info["numbers"], f, indent=1, ensure_ascii=False)
    size = os.path.getsize(args.output)
    print(
        f"report.py: wrote {args.output}: {_count(info['runs'], 'run')}, {_count(info['responses'], 'response')} "
        f"({_count(info['tokens'], 'token')}) of {info['steps_shown']}/"
        f"{_count(info['steps_logged'], 'logged step')}, {size / 1e6:.2f} MB, in {time.time() - t0:.2f} s"
        + (f"; its numbers in {numbers_path(args.output)}" if info["numbers"] else "")
    )
    return args.output


if __name__ == "__main__":
    main()
