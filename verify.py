r"""Answer grader for RLVR rewards and evaluation: is the last ``\boxed{}`` of a response the reference?

Built on math-verify 0.9.0 (sympy), in three steps, in this file's order: 1. **extract** (:func:`extract_boxed`) the
content of the *last* ``\boxed{...}``, braces counted; 2. **normalise** (:func:`normalize_answer`; the reference also
:func:`normalize_reference`) both sides alike; 3. **grade** (:func:`grade_answer`, pure): wrap each side as
``\boxed{...}`` (a bare ``2x-y+5=0`` parses to ``0``; C06, C08, C11-C13), ``math_verify.parse`` both, and
``math_verify.verify(gold, pred)``, the reference (gold) ALWAYS first (it is not symmetric; C12, Math-Verify #25).
Step 3 runs in a worker process with a wall-clock limit per pair (:data:`DEFAULT_TIMEOUT` s; section 5): math-verify
can grind for minutes (``9^{9^{9}}`` vs ``2``), and its own ``signal.alarm`` works on the main thread only.

Reasons (:data:`REASONS`; :func:`verify_with_reason` returns ``(correct, reason)``, correct only with "ok"): "ok" (the
verdict), "no_box" (no box, or the last one unclosed: cut-off output), "empty_box", "hedged" (alternatives against a
reference that is not a set), "parse_error" (a side gave no math object and the strings differ), "timeout", "error"
(math-verify raised, or the worker died); time-outs and errors are logged at WARNING, never silently a score.

Grading rules, each with its case of docs/specs/bug_cases.md or data rule (tests/test_verify.py shows each one):

- **Last box wins**, anywhere; ``\fbox`` and the brace-less ``\boxed 9`` count (C02); ``\boxed{3} or maybe \boxed{8}``
  is ``8`` (C03 c/d); an unclosed last box is "no_box", never an earlier one; no box scores 0, no fallback (C05).
- **Hedging never scores** (C03): a set never equals a value (``\boxed{1, 2, 3, 4, 5, 6}`` vs ``4``); "or" (also in
  ``\text{}``), ``\vee``, ``\lor`` is "hedged" unless the reference says "or" or is a set; ``\boxed{}`` scores 0.
- **Equations vs values** (C06, C12 row 6): ``x = 3`` vs ``3`` and ``3`` vs ``x=3`` match (the last right-hand side);
  a rearranged equation matches (``y=2x+5``, ``2x-y+5=0``), another does not, nor ``1`` vs ``2x+z=1``.
- **Percentages** (C08, issue 12): a reference ``50\%`` accepts ``50``, ``0.5`` and ``50\%``, decimals too (``62.5\%``
  == ``62.5``: :func:`_percent_free`); ``$28$ \%`` and ``28 percent`` read as ``28\%``; ``0.5`` rejects ``50``.
- **Units and degrees** (C10): a trailing ``\text{..}`` group, degree mark or unit word after a number is stripped,
  not converted (``15\text{ cm}^2`` == ``15``, ``30^\circ`` != ``\frac{\pi}{6}``); math-verify's ``units`` is off (it
  strips variables: ``2t`` == ``2s``), so a bare ``5 m`` != ``5``.
- **Sets vs tuples** (C11, ``strict=True``): a pair is ordered (``(\frac{\pi}{3}, 2)`` != ``(2, \frac{\pi}{3})``); a
  bare comma list is a set (``84, 69`` == ``\{69, 84\}`` != ``69``); sets never match tuples.
- **Intervals vs inequalities** (C12): exact endpoints (``[2,5)`` != ``(2,5)``); ``t \geq \sqrt{3}`` matches
  ``[\sqrt{3}, \infty)`` both ways (``allow_set_relation_comp=True``, C12 row 4).
- **Thousands separators** (GSM8K, MATH): ``1,450,000``, ``\$32,\!348``, ``1\,000``, ``1{,}000``, ``12 345 678`` are
  one number; ``1 2 3`` keeps its spaces; a comma is never a decimal point.
- **Notation** (C13; the issue "Correct answers graded wrong"): leading zeros (``025``), ``\dfrac``, sums and products
  in any order; unicode as LaTeX (``−√3``, ``(-∞,0]``, ``r²``, ``½``; an en dash is no minus); ``7i`` == ``7 i``;
  ``\boxed{-10\,}`` == ``-10``.
- **Numbers**: equal after rounding to 6 places (``\frac{1}{3}`` == ``0.333333`` != ``0.333``; C13), and never more
  than :data:`REL_TOL` apart (that rounding finds all values below ~1e-7 equal; minerva 264), percentages exempt.
- **Spellings** (minerva): ``4.5e33``, ``np.arcsin``, ``-1./3``, stray ``$``, ``M_{\odot}``, end punctuation.
- The prediction is parsed as LaTeX only (no number dug out of prose), the reference also as a plain expression.

Left out: partial credit, format rewards, length penalties (the reward is binary); answers outside a box, extraction
heuristics, LLM judges (C05); unit and degree conversion; a grading server (one local pool per process).

Imported by grpo.py, evaluate.py, trainer/ and the tools; imports math-verify and pebble only. Copy it into any trainer
with ``pip install math-verify==0.9.0 antlr4-python3-runtime==4.13.2 pebble`` (workers are spawned and re-import the
calling script: guard its entry point with ``if __name__ == "__main__":``)::

    graded = verify.grade_batch(responses, references)       # [(correct, reason)], one per response
    metrics = verify.summarize(graded)                        # {"total", "correct", "no_box", "timeout", ...}
    verify.reward(response, reference)                        # one response: 1.0 or 0.0
    verify.grade_answer("3", "x = 3", hedged=False)           # the rules alone, in-process: (True, "ok", "")
"""

from __future__ import annotations

import atexit
import concurrent.futures
import functools
import itertools
import logging
import math
import multiprocessing.util
import os
import re
import signal
import threading
from concurrent.futures import Future, wait
from typing import Sequence

from pebble import ProcessExpired, ProcessPool

logger = logging.getLogger(__name__)

DEFAULT_TIMEOUT = 5.0  # wall-clock limit, in seconds, for grading one (response, reference) pair
KILL_GRACE = 1.0  # seconds beyond `timeout` after which an unresponsive worker is killed (and replaced)
STARTUP_TIMEOUT = 120.0  # seconds for a pool's first worker to start (import sympy, math-verify); not in `timeout`
WORKER_MEMORY_LIMIT = 4 << 30  # bytes a worker may map beyond its start-up size (RLIMIT_AS): fail, not exhaust RAM
GOLD_CACHE_SIZE = 4096  # parsed references cached per process (a group of G responses shares one reference)
REL_TOL = 1e-3  # two numbers further apart than this, relative to the larger, never verify (_relative_mismatch)
REASONS = ("ok", "no_box", "empty_box", "hedged", "parse_error", "timeout", "error")  # the module docstring's


# ---- 1. Extraction (pure string code, runs in the caller's process) --------------------------------------------------
# `\boxed` / `\fbox` as a whole control word (not `\boxedanswer`).
_BOX_RE = re.compile(r"\\(?:boxed|fbox)(?![A-Za-z])")
_TRAILING_PUNCT = ".,;:"  # not "!": `\boxed 5!` is a factorial


def _braced_content(text: str, open_pos: int) -> tuple[str, int] | None:
    r"""(content, index of the closing ``}``) for ``text[open_pos] == '{'``, braces counted (C01: a ``[^}]*`` regex cuts
    ``\frac{2}{7}`` to ``\frac{2``), ``\{`` ``\}`` ``\\`` not; None if unclosed."""
    depth = 0
    i = open_pos
    n = len(text)
    while i < n:
        c = text[i]
        if c == "\\":
            i += 2
            continue
        if c == "{":
            depth += 1
        elif c == "}":
            depth -= 1
            if depth == 0:
                return text[open_pos + 1 : i], i
        i += 1
    return None


def _braceless_content(text: str, start: int) -> str:
    r"""Argument of a brace-less ``\boxed 9`` (C02 a/b): up to whitespace, ``$``, a control symbol (``\]``) or an
    unmatched ``}``, keeping control words and balanced groups (``\frac{1}{2}``); trailing punctuation dropped."""
    i = start
    n = len(text)
    depth = 0
    while i < n:
        c = text[i]
        if depth == 0 and (c.isspace() or c == "$"):
            break
        if c == "\\":
            j = i + 1
            while j < n and text[j].isalpha():
                j += 1
            if j == i + 1:  # control symbol: `\]`, `\)`, `\,`, `\\` ends the argument at depth 0
                if depth == 0:
                    break
                j = min(i + 2, n)
            i = j
            continue
        if c == "{":
            depth += 1
        elif c == "}":
            if depth == 0:
                break
            depth -= 1
        i += 1
    return text[start:i].rstrip(_TRAILING_PUNCT)


def extract_boxed(text: str) -> str | None:
    r"""The stripped content of the LAST ``\boxed{...}`` / ``\fbox{...}`` / ``\boxed 9`` anywhere in ``text`` (C02,
    C03), nested braces counted (C01), ``""`` if empty; None without a box (C05) or if the last is unclosed."""
    if not isinstance(text, str):
        raise ValueError(f"text must be a str, got {type(text).__name__}")
    boxes = list(_BOX_RE.finditer(text))
    if not boxes:
        return None
    j = boxes[-1].end()
    while j < len(text) and text[j].isspace():
        j += 1
    if j < len(text) and text[j] == "{":
        found = _braced_content(text, j)
        return None if found is None else found[0].strip()
    return _braceless_content(text, j).strip()


# ---- 2. Normalisation (same rules for reference and prediction) ------------------------------------------------------
# Unescaped `$` (math delimiters left inside an answer, minerva 72). `\$` (currency) is kept.
_STRAY_DOLLAR_RE = re.compile(r"(?<!\\)\$")
# 4.5e33, 1.24e-8, 9.35E+5 -> 4.5\times10^{33}; not inside a word or a command (`\theta2e5`, `2ex`).
_SCI_RE = re.compile(r"(?<![\w.\\])(\d+(?:\.\d*)?|\.\d+)[eE]([+-]?\d+)(?![\w.])")
# Typeset thousands separators: 1\,000 / 1\ 000 / 1~000 / 1{,}000 / 29,\!322 (math-verify misses the last in \frac).
_THIN_SEP_RE = re.compile(r"(?<=\d)(?:\\,|\\ |\\;|~|\{,\}|,\\!)(?=\d{3}(?!\d))")
# Whitespace runs: LaTeX reads any run as one space, math-verify does not (`$28$ \%` -> `28  \%` fails to parse).
_SPACE_RUN_RE = re.compile(r"\s+")
# Spaces between digit groups (`1 000`, `12 345 678`) -> one number; `1 2 3`, `12 34`, `12 345 6789`, `x_1 000` kept.
_SPACE_SEP_RE = re.compile(r"(?<![\w.^])(?<!\d )\d{1,3}(?: \d{3})+(?!\w| \d)")
# Sentence punctuation after the answer (`30^\circ.`); an ellipsis `...` and a spacing command's `\,` are kept.
_END_PUNCT_RE = re.compile(r"(?<![.\\])[.,;:]\s*$")
# Spacing commands at either end (`\boxed{-10\,}`, `\boxed{\quad 5}`, a `\ ` stripped to `\`) typeset nothing there.
_EDGE_SPACE_RE = re.compile(
    r"^(?:\s|\\[,;:! ]|\\q?quad(?![A-Za-z])|~)+|(?:\s|\\[,;:! ]|\\q?quad(?![A-Za-z])|~)+$|(?<!\\)\\$"
)
# Any other `\,` `\;` `\:` (`\frac{d\,x}{d\,t}`, `8\,\%`) -> a space, as LaTeX reads it.
_THIN_SPACE_RE = re.compile(r"\\[,;:]")
# `7i`, `7\,i` -> `7 i`: math-verify 0.9.0 reads `i` as complex only alone (`7i` was a symbol); not `7in`, `\pi`.
_COEFF_I_RE = re.compile(r"(?<=\d)(?:\s|\\[,;:! ]|~)*i(?![A-Za-z])")
# Alternative connectives: `3 \vee 4` means "3 or 4" (math-verify 0.9.0 would read it as 4; hedging, C03).
_OR_RE = re.compile(r"\\(?:vee|lor)(?![A-Za-z])")
# Python/numpy function names (minerva `np.arcsin(10/13)`) -> the LaTeX function `\arcsin(10/13)`.
_NP_FUNC_RE = re.compile(
    r"(?<![\w.\\])(?:np|numpy|math)\.(arcsin|arccos|arctan|sinh|cosh|tanh|sin|cos|tan|exp|log|ln|pi)(?![A-Za-z])"
)
# Python float literal with a bare trailing dot (minerva `-1./3`) -> `-1/3`; `0.\overline{3}` is untouched.
_TRAILING_DOT_RE = re.compile(r"(?<=\d)\.(?=[\s/*)}\],]|$)")
# Operator names as subscript labels (`m_{\max}`, `M_{\odot}`) do not parse (latex2sympy2_extended 1.11.0): `M_{odot}`.
_SUB_CMD_RE = re.compile(
    r"_(?:\{\s*\\(max|min|odot|oplus|star|ast|bullet)\s*\}|\\(max|min|odot|oplus|star|ast|bullet)(?![A-Za-z]))"
)
# The word "or" / `\vee` / `\lor` anywhere in an answer, also inside \text{...} (hedging check, C03).
_HEDGE_RE = re.compile(r"(?i)(?<![A-Za-z])or(?![A-Za-z])|\\(?:vee|lor)(?![A-Za-z])")
# Unicode a model writes (`−√3`, `6r²−4r−24` were parse errors: latex2sympy2_extended 1.11.0 reads ASCII LaTeX only)
# -> its LaTeX command; superscripts -> `^{...}` (`x⁻¹` -> `x^{-1}`), subscript digits -> `_{...}`, `√3` -> `\sqrt{3}`.
_UNICODE_LATEX = {
    **{"\u2212": "-", "\ufe63": "-", "\uff0d": "-"},  # minus sign, small and full-width hyphen-minus (not a dash: 3–5)
    **{c: " " for c in "\u00a0\u2009\u202f\u2007\u200a\u2008"},  # no-break, thin, narrow, figure, hair, punct. spaces
    **{"∞": r"\infty ", "π": r"\pi ", "θ": r"\theta ", "α": r"\alpha ", "β": r"\beta ", "′": "'"},
    **{"×": r"\times ", "\u22c5": r"\cdot ", "\u00b7": r"\cdot ", "\u2219": r"\cdot ", "÷": r"\div "},  # ⋅ · ∙
    **{"≤": r"\le ", "≥": r"\ge ", "⩽": r"\le ", "⩾": r"\ge ", "≠": r"\ne ", "±": r"\pm ", "∓": r"\mp "},
    **{"∪": r"\cup ", "∩": r"\cap ", "∈": r"\in ", "∅": r"\emptyset "},
    **{"½": r"\frac{1}{2}", "⅓": r"\frac{1}{3}", "⅔": r"\frac{2}{3}", "¼": r"\frac{1}{4}", "¾": r"\frac{3}{4}"},
}
_UNICODE_RE = re.compile("|".join(map(re.escape, _UNICODE_LATEX)))
_SUPERSCRIPTS = dict(zip("⁰¹²³⁴⁵⁶⁷⁸⁹⁺⁻⁼⁽⁾ⁿ", "0123456789+-=()n"))
_SUBSCRIPTS = dict(zip("₀₁₂₃₄₅₆₇₈₉", "0123456789"))
_SUPER_RE = re.compile("[" + "".join(_SUPERSCRIPTS) + "]+")
_SUB_RE = re.compile("[" + "".join(_SUBSCRIPTS) + "]+")
# √ ∛ ∜ and a radicand (a number, letter, command, (...) or {...} group), else a bare `\sqrt` (LaTeX's argument rule).
_ROOT_RE = re.compile(r"([\u221a\u221b\u221c])\s*(\d+(?:\.\d+)?|[A-Za-z]|\\[A-Za-z]+|\([^()]*\)|\{[^{}]*\})?")
_ROOT_CMD = {"\u221a": r"\sqrt", "\u221b": r"\sqrt[3]", "\u221c": r"\sqrt[4]"}


def _root(m: re.Match) -> str:
    arg = m.group(2)
    if arg is None:
        return _ROOT_CMD[m.group(1)] + " "
    return _ROOT_CMD[m.group(1)] + "{" + (arg[1:-1] if arg.startswith("{") else arg) + "}"


def _unicode_to_latex(s: str) -> str:
    """Unicode math (``−√3``, ``(-∞,0]``, ``6r²−4r−24``, ``x⁻¹``, ``a₁``) as the LaTeX math-verify reads."""
    if s.isascii():
        return s
    s = _SUPER_RE.sub(lambda m: "^{" + "".join(_SUPERSCRIPTS[c] for c in m.group(0)) + "}", s)
    s = _SUB_RE.sub(lambda m: "_{" + "".join(_SUBSCRIPTS[c] for c in m.group(0)) + "}", s)
    # the space after a command only before a letter (`∞x` -> `\infty x`; `θ(t)` -> `\theta(t)`, not `\theta (t)`)
    s = _UNICODE_RE.sub(
        lambda m: (
            _UNICODE_LATEX[m.group(0)] if s[m.end() : m.end() + 1].isalpha() else _UNICODE_LATEX[m.group(0)].rstrip()
        ),
        s,
    )  # before the roots: `√π` -> `\sqrt{\pi}`
    return _ROOT_RE.sub(_root, s)


# Units (C10), trailing: a \text{...}-like group (^2, ^3), a degree mark, a unit word after a number (`10 \text{ m}/s`).
_TEXT_UNIT = (
    r"\\(?:text|textrm|textnormal|textit|textbf|mbox|mathrm)\s*\{[^{}]*[A-Za-z][^{}]*\}(?:\s*\^\s*\{?\s*[23]\s*\}?)?"
)
_DEGREE_UNIT = (
    r"(?:\^\s*\{?\s*\\circ\s*\}?|°|\\degree|\\textdegree)(?:\s*(?:\\(?:text|mathrm)\{\s*[CF]\s*\}|[CF](?![A-Za-z])))?"
)
_UNIT_WORDS = (
    "cm|mm|km|kg|mg|ml|ft|feet|foot|inch|inches|in\\.|meters?|metres?|miles?|mph|kmh|kph|secs?|seconds?|mins?|"
    "minutes?|hrs?|hours?|days?|weeks?|months?|years?|yrs?|dollars?|cents?|units?|degrees?|deg|sq|square|cubic|"
    "liters?|litres?|gallons?|pounds?|lbs?|ounces?|oz|grams?|kilograms?|acres?|yards?|tons?"
)
_TRAILING_UNIT_RE = re.compile(
    rf"(?:\s|\\[,;: ]|~)*(?:{_TEXT_UNIT}|{_DEGREE_UNIT}|(?<=[\d}})])\s*(?:{_UNIT_WORDS})"
    rf"(?:\s*\^\s*\{{?\s*[23]\s*\}}?)?)\s*\.?\s*$"
)
_UNIT_SEP_RE = re.compile(r"(?:\s|\\[,;: ]|~|/|\\cdot|\\times)+$")


def _strip_units(s: str) -> str:
    """Trailing units (_TRAILING_UNIT_RE) removed while what remains ends like a value (a letter, digit, ``}``, ``)``,
    ``]``, ``!``): ``x = \\text{red}`` and a lone ``\\text{Monday}`` keep their text."""
    for _ in range(4):
        m = _TRAILING_UNIT_RE.search(s)
        if m is None:
            break
        rest = _UNIT_SEP_RE.sub("", s[: m.start()])
        if not re.search(r"[\w})\]!]$", rest):
            break
        s = rest
    return s


# normalize_answer's rules, in order: each maps a str to a str (``functools.partial(pattern.sub, replacement)``)
_NORMALISATION = (
    _unicode_to_latex,  # −√3 -> -\sqrt{3}, r² -> r^{2}, ∞ -> \infty
    functools.partial(_STRAY_DOLLAR_RE.sub, " "),  # stray unescaped $
    functools.partial(_SPACE_RUN_RE.sub, " "),  # whitespace runs -> one space
    functools.partial(_SCI_RE.sub, r"\1\\times10^{\2}"),  # 4.5e33 -> 4.5\times10^{33}
    functools.partial(_THIN_SEP_RE.sub, ""),  # typeset thousands separators: 1\,000, 29,\!322
    functools.partial(_SPACE_SEP_RE.sub, lambda m: m.group(0).replace(" ", "")),  # 1 000 -> 1000
    functools.partial(_EDGE_SPACE_RE.sub, ""),  # spacing commands at either end: -10\,
    functools.partial(_THIN_SPACE_RE.sub, " "),  # other \, \; \: -> a space
    functools.partial(_SPACE_RUN_RE.sub, " "),
    str.strip,
    functools.partial(_END_PUNCT_RE.sub, ""),  # trailing sentence punctuation
    functools.partial(_COEFF_I_RE.sub, " i"),  # 7i, 7\,i -> 7 i
    functools.partial(_OR_RE.sub, r" \\text{ or } "),  # \vee, \lor -> \text{ or }
    functools.partial(_NP_FUNC_RE.sub, r"\\\1"),  # np.arcsin -> \arcsin
    functools.partial(_TRAILING_DOT_RE.sub, ""),  # -1./3 -> -1/3
    functools.partial(_SUB_CMD_RE.sub, lambda m: "_{" + (m.group(1) or m.group(2)) + "}"),  # m_{\max} -> m_{max}
    str.strip,
    _strip_units,  # 15\text{ cm}^2 -> 15, 30^\circ -> 30 (single-letter variables kept)
    str.strip,
)


def normalize_answer(s: str) -> str:
    r"""An answer (reference or box content) through ``_NORMALISATION``'s rules, the same on both sides; comma
    separators, leading zeros, ``\dfrac`` and percentages are left to math-verify. Raises ValueError: not a str."""
    if not isinstance(s, str):
        raise ValueError(f"answer must be a str, got {type(s).__name__}")
    for rule in _NORMALISATION:
        s = rule(s)
    return s


_DELIMS = ((r"\(", r"\)"), (r"\[", r"\]"), ("$$", "$$"), ("$", "$"))


def normalize_reference(reference: str) -> str:
    r"""A reference (e.g. a data/*.jsonl ``answer``) with one outer box or delimiter unwrapped (``\boxed{7}``, ``$7$``,
    ``\(7\)``, ``\[7\]`` -> ``7``), then :func:`normalize_answer`. Raises ValueError: not a str, or empty after it."""
    if not isinstance(reference, str):
        raise ValueError(f"reference must be a str, got {type(reference).__name__}")
    r = reference.strip()
    m = _BOX_RE.match(r)
    if m:
        j = m.end()
        while j < len(r) and r[j].isspace():
            j += 1
        found = _braced_content(r, j) if j < len(r) and r[j] == "{" else None
        if found is not None and found[1] == len(r) - 1:  # the box spans the whole reference
            r = found[0].strip()
    else:
        for left, right in _DELIMS:
            if len(r) > len(left) + len(right) and r.startswith(left) and r.endswith(right):
                r = r[len(left) : len(r) - len(right)].strip()
                break
    r = normalize_answer(r)
    if not r:
        raise ValueError(f"reference is empty after normalisation: {reference!r}")
    return r


def is_hedged(content: str, reference: str) -> bool:
    r"""True if the box content offers alternatives ("or", ``\vee``, ``\lor``) and the reference does not (C03); read
    on the raw strings (stripping units would hide ``\text{ (or 4)}``)."""
    return bool(_HEDGE_RE.search(content)) and not _HEDGE_RE.search(reference)


# ---- 3. Grading rules (pure: math-verify and sympy in the calling process, no time-out) ------------------------------
def _wrap(s: str) -> str:
    # Convention 1: never parse a bare string; `\boxed{...}` selects math-verify's boxed extraction.
    return "\\boxed{" + s + "}"


@functools.cache
def _latex_config():
    """math-verify's default LaTeX extraction, except ``units=False`` (units are stripped by _strip_units)."""
    from latex2sympy2_extended.latex2sympy2 import NormalizationConfig
    from math_verify import LatexExtractionConfig

    norm = NormalizationConfig(
        basic_latex=True, units=False, malformed_operators=True, nits=True, boxed="all", equations=False
    )
    return LatexExtractionConfig(normalization_config=norm)


@functools.cache
def _gold_config() -> list:
    """math-verify extraction config for the (wrapped) reference: LaTeX, then plain expressions."""
    from math_verify import ExprExtractionConfig

    return [_latex_config(), ExprExtractionConfig()]


@functools.cache
def _pred_config() -> list:
    """math-verify extraction config for the (wrapped) box content: LaTeX only, no number digging."""
    return [_latex_config()]


@functools.lru_cache(maxsize=GOLD_CACHE_SIZE)
def _parse_gold(reference: str) -> list:
    """``math_verify.parse`` of the wrapped reference; cached, as a group of G responses shares one reference."""
    from math_verify import parse

    return parse(_wrap(reference), extraction_config=_gold_config(), parsing_timeout=None, raise_on_error=True)


def _number(e) -> float | None:
    """The value of a variable-free real scalar sympy expression, else None."""
    from sympy import Basic, Set, Tuple
    from sympy.core.relational import Relational

    if not isinstance(e, Basic) or isinstance(e, (Set, Relational, Tuple)) or e.free_symbols:
        return None
    try:
        v = complex(e.evalf(30))
    except Exception:  # noqa: BLE001 - not a number
        return None
    return v.real if v.imag == 0 and math.isfinite(v.real) else None


def _relative_mismatch(g, x) -> bool:
    """True if gold ``g`` and prediction ``x`` are numbers more than :data:`REL_TOL` apart, relative to the larger
    (math-verify's 6 decimal places are an absolute tolerance: 2.88e-19 == 3.88e-19, minerva 264)."""
    a = _number(g)
    b = _number(x)
    if a is None or b is None:
        return False
    return abs(a - b) > REL_TOL * max(abs(a), abs(b))


def grade_answer(reference: str, prediction: str, hedged: bool) -> tuple[bool, str, str]:
    r"""The grading rules on a :func:`normalize_reference`'d reference and a non-empty :func:`normalize_answer`'d box,
    ``hedged`` = :func:`is_hedged` of the raw strings, in the caller without a time-out: ``(correct, reason, detail)``,
    reason "ok" (the verdict), "hedged", "parse_error" (detail: the side without a math object) or "error"."""
    from math_verify import parse
    from sympy import Set

    # math-verify's own signal.alarm time-outs are off (they raise off the main thread): the worker times us
    gold = _parse_gold(reference)
    if hedged and not any(isinstance(g, Set) for g in gold):
        # "3 (or 4)": alternatives can only match a reference that is itself a set of values (C03)
        return False, "hedged", ""
    pred = parse(_wrap(prediction), extraction_config=_pred_config(), parsing_timeout=None, raise_on_error=True)
    same, failure = _some_pair_verifies(gold, pred)
    if same:
        return True, "ok", ""
    if failure is not None:
        return False, "error", failure
    return (False, "parse_error", side) if (side := _unparsed_side(gold, pred)) else (False, "ok", "")


def _percent_free(g, x) -> list[tuple]:
    """The pair ``(g, x)``, and when exactly one side is a percentage, the pair with its bare number (C08): math-verify
    0.9.0 reads ``62.5\\%`` as ``62.5 * 1/100`` and takes the bare number of integers only (``9\\% == 9``)."""
    from math_verify.grader import get_pct_val

    pairs = [(g, x)]
    gp = _pct_val(g, get_pct_val)
    xp = _pct_val(x, get_pct_val)
    if gp is not None and xp is None:
        pairs.append((gp, x))
    elif xp is not None and gp is None:
        pairs.append((g, xp))
    return pairs


def _pct_val(e, get_pct_val):
    """math-verify's ``get_pct_val`` (the number of ``n * 1/100``), also for a negative one (``-8\\%`` is
    ``-1 * (8 * 1/100)``); None if ``e`` is not a percentage."""
    from sympy import Basic

    v = get_pct_val(e, None)
    if v is None and isinstance(e, Basic) and e.could_extract_minus_sign():
        v = get_pct_val(-e, None)
        v = None if v is None else -v
    return v


def _some_pair_verifies(gold: list, pred: list) -> tuple[bool, str | None]:
    """(True, None) if a (gold, prediction) pair (or its :func:`_percent_free` twin) verifies and passes the relative
    check; else (False, the last verify exception or None)."""
    from math_verify import verify as mv_verify

    failure = None
    for g, x in itertools.chain.from_iterable(_percent_free(g, x) for g, x in itertools.product(gold, pred)):
        try:
            # gold first (C12); allow_set_relation_comp: inequality prediction vs interval gold (C12 row 4);
            # raise_on_error: an internal error is reported as "error", not silently scored False
            same = mv_verify(g, x, timeout_seconds=None, allow_set_relation_comp=True, raise_on_error=True)
        except Exception as e:  # noqa: BLE001 - another pair may still verify
            failure = f"{type(e).__name__}: {e}"[:300]
            continue
        if same and not _relative_mismatch(g, x):
            return True, None
    return False, failure


def _unparsed_side(gold: list, pred: list) -> str:
    """``"reference"`` or ``"prediction"``: the side with no math object (compared as a string only), else ``""``."""
    from sympy import Basic, MatrixBase

    if not any(isinstance(g, (Basic, MatrixBase)) for g in gold):
        return "reference"
    if not any(isinstance(x, (Basic, MatrixBase)) for x in pred):
        return "prediction"
    return ""


# ---- 4. Public grading API (extract and normalise here; grade_answer in a worker, with a time-out) -------------------
def _grade_extracted(references, normalized, contents, timeout, num_workers=1, _soft_timer=True) -> list[tuple]:
    """Box contents (str or None) graded against the references (as given, and normalised): all pairs queued on the
    pool at once, collected in order, time-outs and errors logged. ``_soft_timer=False``: only the kill path (tests)."""
    jobs = []
    for reference, ref, content in zip(references, normalized, contents):
        pred = None if content is None else normalize_answer(content)
        if pred is None:
            jobs.append((ref, pred, (False, "no_box", "")))
        elif not pred:
            jobs.append((ref, pred, (False, "empty_box", "")))
        else:  # hedging is checked on the raw strings: units stripping may drop "(or 4)"
            hedged = is_hedged(content, reference)
            jobs.append((ref, pred, _submit(ref, pred, hedged, timeout, num_workers, _soft_timer)))
    results = []
    for ref, pred, job in jobs:
        correct, reason, detail = _collect(*job) if isinstance(job[0], Future) else job
        if reason in ("timeout", "error"):
            logger.warning("verify: %s (%s) for prediction %.80r vs reference %.80r", reason, detail, pred, ref)
        results.append((correct, reason))
    return results


def verify_with_reason(response: str, reference: str, timeout: float = DEFAULT_TIMEOUT) -> tuple[bool, str]:
    r"""``(correct, reason)`` of a response (its last ``\boxed{}`` is the answer) against a reference (bare or wrapped:
    ``$...$``, ``\boxed{}``), reason in :data:`REASONS`, within about ``timeout + KILL_GRACE`` s once a worker has it.
    Raises as :func:`grade_batch`; RuntimeError: the workers cannot start (math-verify missing)."""
    return grade_batch([response], [reference], timeout)[0]


def verify(response: str, reference: str, timeout: float = DEFAULT_TIMEOUT) -> bool:
    """True iff the last boxed answer of ``response`` equals ``reference`` (see :func:`verify_with_reason`)."""
    return verify_with_reason(response, reference, timeout)[0]


def reward(response: str, reference: str, timeout: float = DEFAULT_TIMEOUT) -> float:
    """Binary verifiable reward: 1.0 if :func:`verify` is True, else 0.0 (no box, time-out, error: 0.0)."""
    return 1.0 if verify(response, reference, timeout) else 0.0


def grade_batch(
    responses: Sequence[str], references: Sequence[str], timeout: float = DEFAULT_TIMEOUT, num_workers: int = 1
) -> list[tuple[bool, str]]:
    """N ``(correct, reason)`` in input order for N (response, reference) pairs, ``timeout`` s each, by ``num_workers``
    workers (the pool grows to the most asked for, and is kept). Raises ValueError before grading any: lengths differ,
    ``num_workers`` < 1, ``timeout`` <= 0, a non-str element, an empty reference."""
    if len(responses) != len(references):
        raise ValueError(f"responses and references differ in length: {len(responses)} != {len(references)}")
    if isinstance(num_workers, bool) or not isinstance(num_workers, int) or num_workers < 1:
        raise ValueError(f"num_workers must be an int >= 1, got {num_workers!r}")
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout > 0:
        raise ValueError(f"timeout must be a positive number of seconds, got {timeout!r}")
    for i, r in enumerate(responses):
        if not isinstance(r, str):
            raise ValueError(f"responses[{i}] must be a str, got {type(r).__name__}")
    normalized = []
    for i, r in enumerate(references):  # every reference checked before anything is graded
        try:
            normalized.append(normalize_reference(r))
        except ValueError as e:
            raise ValueError(f"references[{i}]: {e}") from None
    contents = [extract_boxed(r) for r in responses]
    return _grade_extracted(references, normalized, contents, float(timeout), num_workers)


def summarize(results: Sequence[tuple[bool, str]]) -> dict[str, int]:
    """``{"total", "correct", <every reason in REASONS>}`` counts of :func:`grade_batch` results (stable log columns).
    Raises ValueError: an element is not a ``(bool, reason)`` pair with a known reason."""
    out = {"total": 0, "correct": 0, **{r: 0 for r in REASONS}}
    for i, item in enumerate(results):
        try:
            correct, reason = item
        except (TypeError, ValueError):
            raise ValueError(f"results[{i}] must be a (correct, reason) pair, got {item!r}") from None
        if reason not in out or reason in ("total", "correct"):
            raise ValueError(f"results[{i}] has unknown reason {reason!r}; expected one of {REASONS}")
        out["total"] += 1
        out["correct"] += bool(correct)
        out[reason] += 1
    return out


# ---- 5. Process machinery: worker processes and time-outs (pebble.ProcessPool) ---------------------------------------
# One budget `timeout` per pair covers its parses and verify calls. Soft limit: the worker's own timer answers "timeout"
# and the worker stays warm. Hard limit: a worker silent at `timeout + KILL_GRACE` (stuck in C code) is killed by pebble
# (SIGTERM, SIGKILL 3 s later) and replaced. Workers are spawned, never forked (the trainer holds torch's threads),
# re-import the calling script (WORKER_MEMORY_LIMIT counts from there), start lazily, are reused, and stop at exit.


class _SoftTimeout(BaseException):
    """Raised by the worker's timer. A BaseException, so math-verify's ``except Exception`` can't eat it."""


def _raise_soft_timeout(signum, frame):
    raise _SoftTimeout()


def _start_worker() -> None:  # pragma: no cover - runs in the worker process
    """Pool initializer, run once in every new worker: memory limit, quiet logs, timer, imports."""
    try:  # RLIMIT_AS: WORKER_MEMORY_LIMIT on top of what the worker maps already (interpreter, caller's imports)
        import resource

        with open("/proc/self/statm") as f:
            limit = int(f.read().split()[0]) * os.sysconf("SC_PAGE_SIZE") + WORKER_MEMORY_LIMIT
        soft, hard = resource.getrlimit(resource.RLIMIT_AS)
        limit = limit if hard == resource.RLIM_INFINITY else min(limit, hard)
        if soft == resource.RLIM_INFINITY or soft > limit:
            resource.setrlimit(resource.RLIMIT_AS, (limit, hard))
    except (ImportError, OSError, ValueError):  # no /proc (not Linux): no limit
        pass
    logging.basicConfig(level=logging.ERROR)
    # math-verify logs a warning per call when its signal time-outs are off; we enforce our own.
    for name in ("math_verify", "latex2sympy2_extended"):
        logging.getLogger(name).setLevel(logging.ERROR)
    signal.signal(signal.SIGALRM, _raise_soft_timeout)
    _gold_config(), _pred_config()  # import math-verify and sympy now, not inside a pair's time budget


def _grade_in_worker(reference, prediction, hedged, timeout, soft_timer) -> tuple:  # pragma: no cover - in a worker
    """:func:`grade_answer` under the worker's own timer; every failure becomes a reason."""
    try:
        try:
            if soft_timer:
                signal.setitimer(signal.ITIMER_REAL, timeout)
            return grade_answer(reference, prediction, hedged)
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
    except _SoftTimeout:
        return False, "timeout", "worker timer"
    except Exception as e:  # noqa: BLE001 - reported to the parent and counted as "error"
        # only the type: str() of a sympy object can itself hang, and the timer is disarmed here
        return False, "error", type(e).__name__


_POOL_LOCK = threading.Lock()
_POOL: ProcessPool | None = None
_POOL_WORKERS = 0
_POOL_PID = 0


def _start_pool(workers: int) -> ProcessPool:
    """A pool of ``workers`` spawned workers, once one is up (else RuntimeError). They are spawned with SIGINT ignored
    (kept across exec): a terminal's Ctrl-C is the caller's to handle, not theirs to answer with a traceback each."""
    pool = ProcessPool(max_workers=workers, initializer=_start_worker, context=multiprocessing.get_context("spawn"))
    # a handler set outside Python (getsignal: None) could not be restored: then leave it alone
    previous = signal.getsignal(signal.SIGINT) if threading.current_thread() is threading.main_thread() else None
    if previous is not None:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        first = pool.schedule(os.getpid)  # starts the workers, in this thread
    finally:
        if previous is not None:
            signal.signal(signal.SIGINT, previous)
    try:
        first.result(timeout=STARTUP_TIMEOUT)
    except Exception as e:
        pool.stop()
        threading.Thread(target=pool.join, daemon=True).start()
        raise RuntimeError(  # their own error, if they ran, is on stderr; the usual causes:
            f"verify.py: grading workers failed to start ({type(e).__name__}: {e}): is math-verify installed, is the "
            "calling script's entry point guarded by `if __name__ == '__main__':` (a spawned worker re-imports it), "
            "and is this process allowed children (a multiprocessing.Pool worker is not)?"
        ) from e
    return pool


def _submit(reference, prediction, hedged, timeout, num_workers, soft_timer) -> tuple[Future, ProcessPool]:
    """Queue one pair on the pool (started, grown to ``num_workers`` or replaced when broken, here)."""
    global _POOL, _POOL_WORKERS, _POOL_PID
    with _POOL_LOCK:  # schedule under the lock: a pool being replaced never receives new pairs
        if _POOL_PID != os.getpid():  # first use, or a forked child: the parent's pool is not ours
            _POOL = None
            _POOL_WORKERS = 0
            _POOL_PID = os.getpid()
            atexit.register(shutdown)  # this process's workers stop at its exit
            # a multiprocessing child exits without atexit, waiting for these workers: its exit hook stops them (tied
            # to no object: tied to a pool, it would also run when a replaced pool is collected and stop its successor)
            multiprocessing.util.Finalize(None, shutdown, exitpriority=100)
        if _POOL is None or not _POOL.active or _POOL_WORKERS < num_workers:
            old = _POOL
            _POOL = None
            if old is not None:  # let it finish what it has, then stop, without blocking this call
                old.close()
                threading.Thread(target=old.join, daemon=True).start()
            _POOL_WORKERS = max(_POOL_WORKERS, num_workers)
            _POOL = _start_pool(_POOL_WORKERS)
        args = (reference, prediction, hedged, timeout, soft_timer)
        return _POOL.schedule(_grade_in_worker, args=args, timeout=timeout + KILL_GRACE), _POOL


def _collect(future: Future, pool: ProcessPool) -> tuple[bool, str, str]:
    """Wait for a pair's verdict; a worker killed at its time-out or dead becomes a reason."""
    while not wait([future], timeout=1.0).done:
        if not pool.active:  # stopped by shutdown() or broken: no worker will answer
            future.cancel()
            return False, "error", "grading pool stopped"
    try:
        return future.result()
    except concurrent.futures.TimeoutError:
        return False, "timeout", "worker killed"
    except ProcessExpired as e:
        return False, "error", f"worker died: {e}"
    except Exception as e:  # noqa: BLE001 - e.g. the pool broke while the pair waited
        return False, "error", f"{type(e).__name__}: {e}"[:300]


def shutdown() -> None:
    """Stop all grading workers now (they restart lazily on the next call, as many as it asks for); also at exit."""
    global _POOL, _POOL_WORKERS
    with _POOL_LOCK:
        pool = _POOL
        _POOL = None
        _POOL_WORKERS = 0
    if pool is not None and _POOL_PID == os.getpid():
        pool.stop()
        pool.join()
