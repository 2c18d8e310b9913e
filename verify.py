r"""Answer grader for RLVR rewards and evaluation, built on math-verify 0.9.0.

A response is graded in three steps:

1. **Extract** (here, pure string code): the content of the *last* ``\boxed{...}`` (or ``\fbox{...}``,
   or the brace-less ``\boxed 9``) in the response, braces matched by counting. No box -> score 0,
   reason ``"no_box"``; there is never a fallback to "some number in the text" (bug_cases C05).
   Only that box's content is passed on, so an earlier box can never be merged with the last one (C03 c/d).
2. **Normalise** both strings with the same rules (:func:`normalize_answer`; the reference additionally
   through :func:`normalize_reference`), then **wrap** each as ``\boxed{...}`` before ``math_verify.parse``.
   The bare reference string is never parsed: bare ``2x-y+5=0`` parses to ``0`` and bare
   ``\left( 2, \frac{\pi}{3} \right)`` to ``2`` (C06, C08, C11, C12, C13).
3. **Compare** with ``math_verify.verify(gold, pred)``, the reference (gold) ALWAYS first: verify is not
   symmetric by design (C12; Math-Verify #25).

Every parse/verify runs in a separate grading worker process with a wall-clock limit (below).

Reasons
-------
:func:`verify_with_reason` returns ``(correct, reason)``; ``reason`` is one of :data:`REASONS`:

``"ok"``           the grader ran normally; ``correct`` is its verdict (True or False).
``"no_box"``       no ``\boxed``/``\fbox`` in the response, or the last one is unclosed (cut-off output). False.
``"empty_box"``    the last box is empty (``\boxed{}``): never scores (C03 b). False.
``"hedged"``       the box offers alternatives ("3 or 4", ``3 \vee 4``) and the reference is not itself a
                   set/interval or "or" list (C03). False.
``"parse_error"``  the reference or the prediction gave no math object (only math-verify's raw-string
                   fallback) and the two strings differ. False. (Identical unparsable strings are "ok".)
``"timeout"``      the wall-clock limit was reached. False.
``"error"``        math-verify raised (it runs with ``raise_on_error=True``), or the worker died (counted;
                   details logged). False.

Every graded call is counted by reason in a process-wide counter (:func:`grader_stats`); time-outs and
errors are also logged at WARNING level, so they are never silently turned into a score.

Policy choices (each with the bug_cases.md case or data rule it comes from)
-------------------------------------------------------------------------
- **Last box wins**, anywhere in the text (no "last 300 characters" window); the brace-less ``\boxed 9``
  counts (C02). Two boxes are not "hedging": only the last counts, so ``\boxed{3} or maybe \boxed{8}``
  is graded as ``8`` (C03 c/d). A last box that is unclosed gives ``None`` / ``"no_box"``: a truncated
  answer does not fall back to an earlier box. No box at all scores 0, however right the text is (C05).
- **Hedging never scores** (C03). Several values in one box form a *set*, and a set never equals a single
  value: ``\boxed{1, 2, 3, 4, 5, 6}`` vs ``4`` is False (C03 a). A box that offers alternatives with the
  word "or" (also inside ``\text{...}``, e.g. ``3 \text{ (or 4)}``) or ``\vee``/``\lor`` gets reason
  ``"hedged"`` unless the reference itself says "or" or is a set/interval: ``\boxed{3 \text{ or } 4}``
  vs ``3, 4`` is True, vs ``3`` is hedged. An empty box never scores (C03 b). Nothing is ever compared by
  substring containment.
- **Equations vs values**: a prediction equation is judged by its last right-hand side when the reference
  is a value (``\boxed{x = 3}`` vs ``3`` is True; so is ``\boxed{2+2=4}`` vs ``4``), and a reference
  assignment ``x=3`` accepts ``3`` (C12 row 6; math-verify's rule). Two *different* equations never
  match, a rearranged copy does: ``y=2x+5`` vs ``2x-y+5=0`` is True, ``x+3y+7=0`` is False (C06). A value
  never matches a non-assignment equation reference (``1`` vs ``2x+z=1`` is False, gold first).
- **Percentages**: a reference ``50\%`` accepts ``50``, ``0.5`` and ``50\%`` (the Qwen2.5-Math
  ``include_percentage`` rule, C08). A reference ``0.5`` does not accept ``50``.
- **Units and degrees** (C10): ``15\text{ cm}^2`` == ``15``, ``30^\circ`` == ``30``, ``5\text{ apples}``
  == ``5``, ``10 \text{ m}/\text{s}`` == ``10``. Degrees are *not* converted to radians (``30^\circ`` !=
  ``\frac{\pi}{6}``). math-verify's own unit stripping is switched off (``units=False``) because it also
  strips single-letter variables that look like units: with it ``2t`` == ``2``, ``2t`` == ``2s`` and
  ``a+b+c`` == ``a+b+d`` all verify. We strip only a trailing ``\text{..}``/``\mbox{..}``/``\mathrm{..}``
  group (optionally squared/cubed), a degree mark, or a multi-letter unit word after a number (``10
  cm``). So a bare single-letter unit is a variable (``5 m`` != ``5``), and so is a bare noun (``5
  apples`` != ``5``): write units in ``\text{}``.
- **Sets vs tuples**: a parenthesised pair is an ordered point and its order matters:
  ``(\frac{\pi}{3}, 2)`` != ``\left( 2, \frac{\pi}{3} \right)`` (C11). A bare comma list (olympiadbench
  multi-answers such as ``69,84``; hmmt 10) is an unordered set: ``84, 69`` and ``\{69, 84\}`` match, a
  single ``69`` does not. Sets and tuples are not interchangeable (math-verify ``strict=True``).
- **Intervals vs inequalities**: interval endpoints must match exactly, ``[2,5)`` != ``(2,5)`` != ``[2,5]``
  (C12). An inequality in one variable matches the equivalent interval in *both* directions:
  ``t \geq \sqrt{3}`` vs reference ``[\sqrt{3}, \infty)`` is True. math-verify 0.9.0 only converts when
  the prediction is the set; we pass ``allow_set_relation_comp=True`` so the prediction's inequality is
  converted to a set when the reference is a set (C12 row 4), keeping gold first.
- **Thousands separators** (GSM8K and MATH data rules): ``1,450,000`` == ``1450000`` and
  ``\$32,\!348`` == ``32348``: math-verify reads ``d,ddd`` groups as one number, so a list whose later
  items all have exactly three digits (``5,125``) also reads as one number. Typeset separators
  ``1\,000``, ``1\ 000``, ``1~000``, ``1{,}000``, ``29,\!322`` are removed first (math-verify reads
  ``1\,000`` as ``1*0`` and misses ``,\!`` inside ``\frac``).
- **Leading zeros**: AIME ``025`` == ``25`` (data README, aime24).
- **Notation**: ``\dfrac`` and ``\tfrac`` == ``\frac``; reordered sums ``-2+e^{5}`` == ``e^{5}-2`` (C13);
  products in any order (hmmt ``2^{25} \cdot 26!``).
- **Fractions vs decimals**: a decimal matches a fraction when they agree after rounding to 6 decimal
  places (math-verify ``float_rounding=6``): ``\frac{1}{2}`` == ``0.5`` (C13), ``\frac{1}{3}`` ==
  ``0.333333`` but != ``0.333``.
- **Small magnitudes**: that 6-decimal rule is an absolute tolerance, so math-verify 0.9.0 finds all
  values below about 1e-7 equal (``2.88\times10^{-19}`` == ``3.88\times10^{-19}``; minerva 264, 265,
  267 in the oracle test). We add a relative check: two variable-free numbers more than
  :data:`REL_TOL` (0.1 %) apart never verify, whatever their size. Percentages are exempt (C08).
- **Reference/answer spellings** rewritten on both sides (minerva data): e-notation ``4.5e33`` ->
  ``4.5\times10^{33}`` (math-verify reads the ``e`` as Euler's number), ``np.arcsin(..)`` ->
  ``\arcsin(..)``, Python floats ``-1./3`` -> ``-1/3``, stray unescaped ``$`` removed (minerva 72),
  operator-name subscripts ``m_{\max}``/``M_{\odot}`` -> ``m_{max}``/``M_{odot}`` (they do not parse
  otherwise), trailing sentence punctuation dropped.
- The prediction is parsed with LaTeX extraction only; the reference also with math-verify's plain
  expression extraction. So math-verify never digs a number out of an unparsable prediction; such a
  prediction is compared as an exact string only, and reported as ``"parse_error"`` if it differs.

Time-outs
---------
Grading one (response, reference) pair - parse of the reference, parse of the prediction, every verify
call - has one wall-clock budget ``timeout`` (default :data:`DEFAULT_TIMEOUT` seconds). math-verify's own
``signal.alarm`` time-outs are disabled (``parsing_timeout=None``, ``timeout_seconds=None``) because they
raise off the main thread. Instead the work runs in a long-lived worker *process* (a fresh interpreter
started with ``subprocess``: no fork, so it is safe next to torch's threads, and unlike the
``multiprocessing`` "spawn" context it does not re-import the caller's ``__main__`` script). The worker
arms its own timer (``setitimer`` in its main thread) and answers ``"timeout"`` at ``timeout``; if the
worker does not answer within ``timeout + KILL_GRACE`` (e.g. stuck in C code), the parent kills it and a
new one is started lazily on the next call. So every call returns within about ``timeout + KILL_GRACE``
seconds plus one worker start-up, from any thread. Workers are started lazily, reused across calls and
batches, and shut down at interpreter exit.

Public API: :func:`extract_boxed`, :func:`normalize_answer`, :func:`normalize_reference`, :func:`verify`,
:func:`verify_with_reason`, :func:`reward`, :func:`grade_batch`, :func:`summarize`, :func:`grader_stats`,
:func:`reset_grader_stats`, :func:`shutdown`.
"""

from __future__ import annotations

import atexit
import collections
import itertools
import logging
import math
import os
import re
import socket
import subprocess
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from multiprocessing.connection import Connection
from typing import Sequence

logger = logging.getLogger(__name__)

DEFAULT_TIMEOUT = 5.0
"""Default wall-clock limit, in seconds, for grading one (response, reference) pair."""

KILL_GRACE = 1.0
"""Seconds the parent waits beyond ``timeout`` before it kills an unresponsive worker."""

STARTUP_TIMEOUT = 120.0
"""Seconds allowed for a worker to start (import sympy and math-verify); not part of ``timeout``."""

WORKER_MEMORY_LIMIT = 4 << 30
"""Address-space limit (bytes) of a worker, so a pathological input fails instead of exhausting RAM."""

GOLD_CACHE_SIZE = 4096
"""Parsed references cached per worker (a group of G responses shares one reference)."""

REL_TOL = 1e-3
"""Two numbers further apart than this, relative to the larger, never verify (see the module docstring)."""

REASONS = ("ok", "no_box", "empty_box", "hedged", "parse_error", "timeout", "error")
"""Every reason :func:`verify_with_reason` can return; see the module docstring."""


# ----------------------------------------------------------------------------------------------
# 1. Extraction (pure string code, runs in the caller's process)
# ----------------------------------------------------------------------------------------------

# `\boxed` / `\fbox` as a whole control word (not `\boxedanswer`).
_BOX_RE = re.compile(r"\\(?:boxed|fbox)(?![A-Za-z])")
_TRAILING_PUNCT = ".,;:"  # not "!": `\boxed 5!` is a factorial


def _braced_content(text: str, open_pos: int) -> tuple[str, int] | None:
    r"""(content, index of the closing ``}``) for ``text[open_pos] == '{'``; None if unclosed.

    Braces are matched by counting; a backslash escapes the next character, so ``\{``/``\}`` (set braces)
    and ``\\`` do not count (C01: a ``[^}]*`` regex cuts ``\frac{2}{7}`` to ``\frac{2``).
    """
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
    r"""Argument of a brace-less ``\boxed 9``: one run of non-space text (C02 a/b).

    Stops at whitespace, ``$``, a non-letter control symbol such as ``\]`` or ``\)``, or an unmatched
    ``}``; control words (``\frac``) and balanced groups (``{1}{2}``) are kept. Trailing punctuation is
    dropped (``\boxed 9.`` -> ``9``).
    """
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
    r"""Return the content of the LAST ``\boxed{...}`` / ``\fbox{...}`` / ``\boxed 9`` in ``text``.

    Args:
        text: model response (str).

    Returns:
        The stripped content of the last box (``""`` for an empty box), or None when there is no box or
        the last box is unclosed (e.g. generation cut off inside it). Nested braces are matched by
        counting, so ``\boxed{\frac{\sqrt{2}}{2}}`` gives ``\frac{\sqrt{2}}{2}`` (C01). Only the last box
        counts, wherever it is (C02, C03 c/d); without a box there is no fallback (C05).

    Raises:
        ValueError: ``text`` is not a str.

    Source: bug_cases.md, Conventions 1 and cases C01, C02, C03, C05.
    """
    if not isinstance(text, str):
        raise ValueError(f"text must be a str, got {type(text).__name__}")
    last = None
    for last in _BOX_RE.finditer(text):
        pass
    if last is None:
        return None
    j = last.end()
    while j < len(text) and text[j].isspace():
        j += 1
    if j < len(text) and text[j] == "{":
        found = _braced_content(text, j)
        return None if found is None else found[0].strip()
    return _braceless_content(text, j).strip()


# ----------------------------------------------------------------------------------------------
# 2. Normalisation (same rules for reference and prediction)
# ----------------------------------------------------------------------------------------------

# Unescaped `$` (math delimiters left inside an answer, minerva 72). `\$` (currency) is kept.
_STRAY_DOLLAR_RE = re.compile(r"(?<!\\)\$")
# 4.5e33, 1.24e-8, 9.35E+5 -> 4.5\times10^{33}; not inside a word or a command (`\theta2e5`, `2ex`).
_SCI_RE = re.compile(r"(?<![\w.\\])(\d+(?:\.\d*)?|\.\d+)[eE]([+-]?\d+)(?![\w.])")
# Typeset thousands separators between digit groups: 1\,000 / 1\ 000 / 1~000 / 1{,}000 / 29,\!322 (the
# last is unambiguous, unlike a bare comma, and math-verify misses it inside \frac{1}{29,\!322,\!216}).
_THIN_SEP_RE = re.compile(r"(?<=\d)(?:\\,|\\ |\\;|~|\{,\}|,\\!)(?=\d{3}(?!\d))")
# Sentence punctuation after the answer (`\text{(E)},`, `30^\circ.`); an ellipsis `...` is kept.
_END_PUNCT_RE = re.compile(r"(?<!\.)[.,;:]\s*$")
# Alternative connectives: `3 \vee 4` means "3 or 4" (math-verify 0.9.0 would read it as 4; hedging, C03).
_OR_RE = re.compile(r"\\(?:vee|lor)(?![A-Za-z])")
# Python/numpy function names (minerva `np.arcsin(10/13)`) -> the LaTeX function `\arcsin(10/13)`.
_NP_FUNC_RE = re.compile(
    r"(?<![\w.\\])(?:np|numpy|math)\.(arcsin|arccos|arctan|sinh|cosh|tanh|sin|cos|tan|exp|log|ln|pi)(?![A-Za-z])"
)
# Python float literal with a bare trailing dot (minerva `-1./3`) -> `-1/3`; `0.\overline{3}` is untouched.
_TRAILING_DOT_RE = re.compile(r"(?<=\d)\.(?=[\s/*)}\],]|$)")
# Operator names used as subscript labels (`m_{\max}`, `M_{\odot}`) do not parse in latex2sympy2_extended
# 1.11.0; as labels they only name a symbol, so `M_{\odot}` -> `M_{odot}` (both sides alike).
_SUB_CMD_RE = re.compile(r"_(?:\{\s*\\(max|min|odot|oplus|star|ast|bullet)\s*\}|\\(max|min|odot|oplus|star|ast|bullet)(?![A-Za-z]))")
# The word "or" / `\vee` / `\lor` anywhere in an answer, also inside \text{...} (hedging check, C03).
_HEDGE_RE = re.compile(r"(?i)(?<![A-Za-z])or(?![A-Za-z])|\\(?:vee|lor)(?![A-Za-z])")


# Units (C10). math-verify's own unit stripping (NormalizationConfig.units) also strips single-letter
# *variables* that look like units (t, h, s, m, c, d, g, l, o, ...): with it `2t` == `2`, `2t` == `2s` and
# `a+b+c` == `a+b+d` all verify True. We switch it off and strip only unambiguous trailing units:
#   a \text{...}-like group (with an optional ^2 / ^3), a degree mark, or a multi-letter unit word after
#   a number; repeated for compound units (`10 \text{ m}/\text{s}`), never leaving an empty answer.
_TEXT_UNIT = r"\\(?:text|textrm|textnormal|textit|textbf|mbox|mathrm)\s*\{[^{}]*[A-Za-z][^{}]*\}(?:\s*\^\s*\{?\s*[23]\s*\}?)?"
_DEGREE_UNIT = r"(?:\^\s*\{?\s*\\circ\s*\}?|°|\\degree|\\textdegree)(?:\s*(?:\\(?:text|mathrm)\{\s*[CF]\s*\}|[CF](?![A-Za-z])))?"
_UNIT_WORDS = (
    "cm|mm|km|kg|mg|ml|ft|feet|foot|inch|inches|in\\.|meters?|metres?|miles?|mph|kmh|kph|secs?|seconds?|mins?|"
    "minutes?|hrs?|hours?|days?|weeks?|months?|years?|yrs?|dollars?|cents?|units?|degrees?|deg|sq|square|cubic|"
    "liters?|litres?|gallons?|pounds?|lbs?|ounces?|oz|grams?|kilograms?|acres?|yards?|tons?"
)
_TRAILING_UNIT_RE = re.compile(
    rf"(?:\s|\\[,;: ]|~)*(?:{_TEXT_UNIT}|{_DEGREE_UNIT}|(?<=[\d}})])\s*(?:{_UNIT_WORDS})(?:\s*\^\s*\{{?\s*[23]\s*\}}?)?)\s*\.?\s*$"
)
_UNIT_SEP_RE = re.compile(r"(?:\s|\\[,;: ]|~|/|\\cdot|\\times)+$")


def _strip_units(s: str) -> str:
    """Remove trailing units (see _TRAILING_UNIT_RE) while a value remains before them.

    The rest must end like a value (a letter, digit, ``}``, ``)``, ``]``, ``!``), so ``x = \\text{red}`` or
    ``\\text{A} + \\text{B}`` keep their text, and a lone ``\\text{Monday}`` is never stripped.
    """
    for _ in range(4):
        m = _TRAILING_UNIT_RE.search(s)
        if m is None:
            break
        rest = _UNIT_SEP_RE.sub("", s[: m.start()])
        if not re.search(r"[\w})\]!]$", rest):
            break
        s = rest
    return s


def normalize_answer(s: str) -> str:
    r"""Normalise one answer string (reference or box content) before it is wrapped and parsed.

    Applied identically to both sides (the reference after :func:`normalize_reference` unwraps it), so it
    never favours one side. In order: stray unescaped ``$`` removed; e-notation ``4.5e33`` ->
    ``4.5\times10^{33}``; typeset thousands separators removed (``1\,000``, ``29,\!322``); trailing
    sentence punctuation dropped; ``\vee``/``\lor`` -> ``\text{ or }``; ``np.arcsin`` -> ``\arcsin``;
    ``-1./3`` -> ``-1/3``; ``m_{\max}`` -> ``m_{max}``; trailing units stripped (``15\text{ cm}^2`` ->
    ``15``, ``30^\circ`` -> ``30``; single-letter variables are kept). Comma thousands separators
    (``1,450,000``), leading zeros (``025``), ``\dfrac`` and percentages are left to math-verify, which
    handles them. The module docstring gives each rule's case.

    Args:
        s: answer string (str).

    Returns:
        The normalised string, stripped.

    Raises:
        ValueError: ``s`` is not a str.
    """
    if not isinstance(s, str):
        raise ValueError(f"answer must be a str, got {type(s).__name__}")
    s = _STRAY_DOLLAR_RE.sub(" ", s)
    s = _SCI_RE.sub(r"\1\\times10^{\2}", s)
    s = _THIN_SEP_RE.sub("", s)
    s = _END_PUNCT_RE.sub("", s.strip())
    s = _OR_RE.sub(r" \\text{ or } ", s)
    s = _NP_FUNC_RE.sub(r"\\\1", s)
    s = _TRAILING_DOT_RE.sub("", s)
    s = _SUB_CMD_RE.sub(lambda m: "_{" + (m.group(1) or m.group(2)) + "}", s)
    s = _strip_units(s.strip())
    return s.strip()


_DELIMS = ((r"\(", r"\)"), (r"\[", r"\]"), ("$$", "$$"), ("$", "$"))


def normalize_reference(reference: str) -> str:
    r"""Normalise a reference answer: unwrap one outer box or math delimiter, then :func:`normalize_answer`.

    A reference given as ``\boxed{7}``, ``$7$``, ``\(7\)`` or ``\[7\]`` becomes ``7``; the result is always
    re-wrapped as ``\boxed{...}`` before parsing, never parsed bare (C06, C08, C11, C12, C13).

    Args:
        reference: reference answer (str), e.g. a ``answer`` field of shared/data/*.jsonl.

    Returns:
        The normalised reference (non-empty str).

    Raises:
        ValueError: ``reference`` is not a str, or is empty after normalisation.
    """
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


def _wrap(s: str) -> str:
    # Convention 1: never parse a bare string; `\boxed{...}` selects math-verify's boxed extraction.
    return "\\boxed{" + s + "}"


# ----------------------------------------------------------------------------------------------
# 3. Grading worker (a separate interpreter; the only place math-verify is imported)
# ----------------------------------------------------------------------------------------------


def _latex_config():
    """math-verify's default LaTeX extraction, except ``units=False`` (units are stripped by _strip_units)."""
    from latex2sympy2_extended.latex2sympy2 import NormalizationConfig
    from math_verify import LatexExtractionConfig

    norm = NormalizationConfig(
        basic_latex=True, units=False, malformed_operators=True, nits=True, boxed="all", equations=False
    )
    return LatexExtractionConfig(normalization_config=norm)


def _gold_config() -> list:
    """math-verify extraction config for the (wrapped) reference: LaTeX, then plain expressions."""
    from math_verify import ExprExtractionConfig

    return [_latex_config(), ExprExtractionConfig()]


def _pred_config() -> list:
    """math-verify extraction config for the (wrapped) box content: LaTeX only, no number digging."""
    return [_latex_config()]


def _is_hedged(pred: str, ref: str) -> bool:
    """True if the prediction offers alternatives ("or", ``\\vee``, ``\\lor``) and the reference does not."""
    return bool(_HEDGE_RE.search(pred)) and not _HEDGE_RE.search(ref)


class _SoftTimeout(BaseException):
    """Raised by the worker's timer. A BaseException, so math-verify's ``except Exception`` can't eat it."""


def _worker_main(fd: int) -> None:  # pragma: no cover - runs in the child process
    """Grading worker loop: receive ("grade", id, ref, pred, hedged, timeout, soft_timer) or ("exit",);
    reply ("done", id, correct, reason, detail). Runs as ``python verify.py --grading-worker FD``."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's business
    try:
        import resource

        soft, hard = resource.getrlimit(resource.RLIMIT_AS)
        limit = WORKER_MEMORY_LIMIT if hard == resource.RLIM_INFINITY else min(WORKER_MEMORY_LIMIT, hard)
        if soft == resource.RLIM_INFINITY or soft > limit:
            resource.setrlimit(resource.RLIMIT_AS, (limit, hard))
    except (ImportError, ValueError, OSError):
        pass

    conn = Connection(fd)
    logging.basicConfig(level=logging.ERROR)
    # math-verify logs a warning per call when its signal time-outs are off; we enforce our own.
    for name in ("math_verify", "latex2sympy2_extended"):
        logging.getLogger(name).setLevel(logging.ERROR)
    from math_verify import parse
    from math_verify import verify as mv_verify
    from sympy import Basic, MatrixBase, Set, Tuple
    from sympy.core.relational import Relational

    gold_cfg, pred_cfg = _gold_config(), _pred_config()
    gold_cache: collections.OrderedDict[str, list] = collections.OrderedDict()

    def on_alarm(signum, frame):
        raise _SoftTimeout()

    signal.signal(signal.SIGALRM, on_alarm)

    def number(e) -> float | None:
        """The value of a variable-free real scalar expression, else None."""
        if not isinstance(e, Basic) or isinstance(e, (Set, Relational, Tuple)) or e.free_symbols:
            return None
        try:
            v = complex(e.evalf(30))
        except Exception:  # noqa: BLE001 - not a number
            return None
        return v.real if v.imag == 0 and math.isfinite(v.real) else None

    def _relative_mismatch(g, x) -> bool:
        # math-verify compares numbers to 6 decimal places (or chops tiny differences), an *absolute*
        # tolerance: every value below ~1e-7 equals every other (2.88e-19 == 3.88e-19, minerva 264).
        # Two numbers more than REL_TOL apart (relative) are never equal.
        a, b = number(g), number(x)
        if a is None or b is None:
            return False
        return abs(a - b) > REL_TOL * max(abs(a), abs(b))

    def grade(ref: str, pred: str, hedged: bool) -> tuple[bool, str, str]:
        gold = gold_cache.get(ref)
        if gold is None:
            gold = parse(_wrap(ref), extraction_config=gold_cfg, parsing_timeout=None, raise_on_error=True)
            if any(isinstance(g, (Basic, MatrixBase)) for g in gold):
                gold_cache[ref] = gold
                if len(gold_cache) > GOLD_CACHE_SIZE:
                    gold_cache.popitem(last=False)
        else:
            gold_cache.move_to_end(ref)
        if hedged and not any(isinstance(g, Set) for g in gold):
            # "3 (or 4)": alternatives can only match a reference that is itself a set of values (C03)
            return False, "hedged", ""
        p = parse(_wrap(pred), extraction_config=pred_cfg, parsing_timeout=None, raise_on_error=True)
        # gold first (C12); allow_set_relation_comp: inequality prediction vs interval gold (C12 row 4)
        pct = "%" in ref or "%" in pred  # C08: 50\% == 50 is intended, exempt from the relative check
        failure = None
        for g, x in itertools.product(gold, p):  # what math_verify.verify(gold_list, pred_list) does
            try:
                # raise_on_error: an internal error is reported as "error", not silently scored False
                same = mv_verify(g, x, timeout_seconds=None, allow_set_relation_comp=True, raise_on_error=True)
            except Exception as e:  # noqa: BLE001 - another pair may still verify
                failure = f"{type(e).__name__}: {e}"[:300]
                continue
            if same and (pct or not _relative_mismatch(g, x)):
                return True, "ok", ""
        if failure is not None:
            return False, "error", failure
        # A side without any math object was compared as an exact string only: report it.
        if not any(isinstance(g, (Basic, MatrixBase)) for g in gold):
            return False, "parse_error", "reference"
        if not any(isinstance(x, (Basic, MatrixBase)) for x in p):
            return False, "parse_error", "prediction"
        return False, "ok", ""

    conn.send(("ready", os.getpid()))
    while True:
        try:
            msg = conn.recv()
        except (EOFError, OSError):
            return  # parent gone
        if msg[0] == "exit":
            return
        _, req_id, ref, pred, hedged, timeout, soft_timer = msg
        try:
            try:
                if soft_timer:
                    signal.setitimer(signal.ITIMER_REAL, timeout)
                result = grade(ref, pred, hedged)
            finally:
                signal.setitimer(signal.ITIMER_REAL, 0)
        except _SoftTimeout:
            result = (False, "timeout", "worker timer")
        except Exception as e:  # noqa: BLE001 - reported to the parent and counted as "error"
            # only the type: str() of a sympy object can itself hang, and the timer is disarmed here
            result = (False, "error", type(e).__name__)
        try:
            conn.send(("done", req_id, *result))
        except (BrokenPipeError, OSError):
            return


class _WorkerDied(Exception):
    pass


class _HardTimeout(Exception):
    pass


class _Worker:
    """Parent-side handle of one grading worker process."""

    def __init__(self) -> None:
        parent_sock, child_sock = socket.socketpair()
        try:
            self.proc = subprocess.Popen(
                [sys.executable, os.path.abspath(__file__), "--grading-worker", str(child_sock.fileno())],
                pass_fds=(child_sock.fileno(),),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
            )
        finally:
            child_sock.close()
        self.conn = Connection(parent_sock.detach())
        self._next_id = 0
        if not self.conn.poll(STARTUP_TIMEOUT):
            self.kill()
            raise RuntimeError(f"verify.py grading worker did not start within {STARTUP_TIMEOUT} s")
        try:
            msg = self.conn.recv()
        except (EOFError, OSError) as e:
            self.kill()
            raise RuntimeError("verify.py grading worker failed to start (is math-verify installed? see stderr)") from e
        if msg[0] != "ready":
            self.kill()
            raise RuntimeError(f"verify.py grading worker sent {msg!r} instead of 'ready'")

    @property
    def alive(self) -> bool:
        return self.proc.poll() is None and not self.conn.closed

    def grade(
        self, ref: str, pred: str, hedged: bool, timeout: float, soft_timer: bool = True
    ) -> tuple[bool, str, str]:
        self._next_id += 1
        req_id = self._next_id
        try:
            self.conn.send(("grade", req_id, ref, pred, hedged, float(timeout), soft_timer))
            deadline = timeout + KILL_GRACE
            while True:
                if not self.conn.poll(deadline):
                    raise _HardTimeout()
                msg = self.conn.recv()
                if msg[0] == "done" and msg[1] == req_id:
                    return bool(msg[2]), msg[3], msg[4]
        except (EOFError, OSError, BrokenPipeError) as e:
            self.kill()
            raise _WorkerDied(str(e)) from e
        except _HardTimeout:
            self.kill()
            raise

    def kill(self) -> None:
        try:
            self.proc.kill()
            self.proc.wait(timeout=10)
        except Exception:  # noqa: BLE001 - best effort
            pass
        try:
            self.conn.close()
        except OSError:
            pass

    def close(self) -> None:
        if self.alive:
            try:
                self.conn.send(("exit",))
                self.proc.wait(timeout=2)
            except Exception:  # noqa: BLE001 - fall through to kill
                pass
        self.kill()


class _WorkerPool:
    """Lazily started, reused workers; at most ``limit`` at a time; safe from any thread."""

    def __init__(self) -> None:
        self._cv = threading.Condition()
        self._idle: list[_Worker] = []
        self._all: set[_Worker] = set()
        self._n = 0  # started + starting
        self._pid = os.getpid()

    def acquire(self, limit: int) -> _Worker:
        with self._cv:
            while True:
                if self._idle:
                    return self._idle.pop()
                if self._n < limit:
                    self._n += 1
                    break
                self._cv.wait()
        try:
            w = _Worker()
        except BaseException:
            with self._cv:
                self._n -= 1
                self._cv.notify()
            raise
        with self._cv:
            self._all.add(w)
        return w

    def release(self, w: _Worker) -> None:
        with self._cv:
            if w.alive:
                self._idle.append(w)
            else:  # killed after a time-out or crash: a fresh one starts on the next acquire
                self._all.discard(w)
                self._n -= 1
            self._cv.notify()

    def close(self) -> None:
        with self._cv:
            workers = list(self._all)
            self._idle.clear()
            self._all.clear()
            self._n = 0
        if os.getpid() != self._pid:
            return  # forked copy: the workers belong to the parent
        for w in workers:
            w.close()


_POOL_LOCK = threading.Lock()
_POOL: _WorkerPool | None = None


def _pool() -> _WorkerPool:
    global _POOL
    with _POOL_LOCK:
        if _POOL is None or _POOL._pid != os.getpid():  # new, or we are a forked child
            _POOL = _WorkerPool()
        return _POOL


def shutdown() -> None:
    """Stop all grading workers now (they restart lazily on the next call). Also runs at exit."""
    global _POOL
    with _POOL_LOCK:
        pool, _POOL = _POOL, None
    if pool is not None:
        pool.close()


atexit.register(shutdown)


# ----------------------------------------------------------------------------------------------
# 4. Public grading API
# ----------------------------------------------------------------------------------------------

_STATS: collections.Counter[str] = collections.Counter()
_STATS_LOCK = threading.Lock()


def grader_stats() -> collections.Counter[str]:
    """Counts of every reason returned since the last reset, in this process (a copy)."""
    with _STATS_LOCK:
        return collections.Counter(_STATS)


def reset_grader_stats() -> None:
    """Reset the counter returned by :func:`grader_stats`."""
    with _STATS_LOCK:
        _STATS.clear()


def _check_timeout(timeout: float) -> float:
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout > 0:
        raise ValueError(f"timeout must be a positive number of seconds, got {timeout!r}")
    return float(timeout)


def _grade_extracted(
    reference: str, content: str | None, timeout: float, max_workers: int = 1, _soft_timer: bool = True
) -> tuple[bool, str]:
    """Grade box content (already extracted) against a reference; counts and logs the reason.

    ``_soft_timer=False`` disables the worker's own timer so the parent's kill path is exercised (tests).
    """
    ref = normalize_reference(reference)
    if content is None:
        result = (False, "no_box")
    else:
        pred = normalize_answer(content)
        if not pred:
            result = (False, "empty_box")
        else:
            pool = _pool()
            w = pool.acquire(max_workers)
            try:
                hedged = _is_hedged(content, reference)  # on the raw strings: units stripping may drop "(or 4)"
                correct, reason, detail = w.grade(ref, pred, hedged, timeout, soft_timer=_soft_timer)
                result = (correct, reason)
                if reason in ("timeout", "error"):
                    logger.warning("verify: %s (%s) for prediction %.80r vs reference %.80r", reason, detail, pred, ref)
            except _HardTimeout:
                result = (False, "timeout")
                logger.warning("verify: timeout (worker killed) for prediction %.80r vs reference %.80r", pred, ref)
            except _WorkerDied as e:
                result = (False, "error")
                logger.warning("verify: grading worker died (%s) for prediction %.80r", e, pred)
            finally:
                pool.release(w)
    with _STATS_LOCK:
        _STATS[result[1]] += 1
    return result


def verify_with_reason(response: str, reference: str, timeout: float = DEFAULT_TIMEOUT) -> tuple[bool, str]:
    r"""Grade a response against a reference and say why.

    Args:
        response: model response text (str); its last ``\boxed{}`` is the answer.
        reference: reference answer (str), bare (``\frac{2}{7}``) or wrapped (``$...$``, ``\boxed{}``).
        timeout: wall-clock limit in seconds for grading this pair (default :data:`DEFAULT_TIMEOUT`);
            the call returns within about ``timeout + KILL_GRACE`` s (plus one worker start-up).

    Returns:
        ``(correct, reason)``, reason in :data:`REASONS` (module docstring). ``correct`` is True only with
        reason ``"ok"``.

    Raises:
        ValueError: ``response`` or ``reference`` is not a str, ``reference`` is empty, ``timeout`` <= 0.
        RuntimeError: the grading worker cannot start (math-verify missing).

    Source: bug_cases.md Conventions 1; C01-C13.
    """
    if not isinstance(response, str):
        raise ValueError(f"response must be a str, got {type(response).__name__}")
    timeout = _check_timeout(timeout)
    return _grade_extracted(reference, extract_boxed(response), timeout)


def verify(response: str, reference: str, timeout: float = DEFAULT_TIMEOUT) -> bool:
    """True iff the last boxed answer of ``response`` equals ``reference`` (see :func:`verify_with_reason`)."""
    return verify_with_reason(response, reference, timeout)[0]


def reward(response: str, reference: str, timeout: float = DEFAULT_TIMEOUT) -> float:
    """Binary verifiable reward: 1.0 if :func:`verify` is True, else 0.0 (no box, time-out, error: 0.0)."""
    return 1.0 if verify(response, reference, timeout) else 0.0


def grade_batch(
    responses: Sequence[str],
    references: Sequence[str],
    timeout: float = DEFAULT_TIMEOUT,
    num_workers: int = 1,
) -> list[tuple[bool, str]]:
    """Grade many (response, reference) pairs, reusing the grading worker(s).

    Args:
        responses: N response strings.
        references: N reference strings (e.g. each prompt's reference repeated G times).
        timeout: per-pair wall-clock limit in seconds (see :func:`verify_with_reason`).
        num_workers: worker processes used in parallel (1 for the trainer's ~128 responses per step; up to
            the CPU count for evaluate.py). Workers are kept for later calls.

    Returns:
        N ``(correct, reason)`` tuples in input order; aggregate them with :func:`summarize`.

    Raises:
        ValueError: lengths differ, ``num_workers`` < 1, bad ``timeout``, a non-str element, or an empty
            reference (checked for all pairs before any is graded).
    """
    if len(responses) != len(references):
        raise ValueError(f"responses and references differ in length: {len(responses)} != {len(references)}")
    if isinstance(num_workers, bool) or not isinstance(num_workers, int) or num_workers < 1:
        raise ValueError(f"num_workers must be an int >= 1, got {num_workers!r}")
    timeout = _check_timeout(timeout)
    for i, r in enumerate(responses):
        if not isinstance(r, str):
            raise ValueError(f"responses[{i}] must be a str, got {type(r).__name__}")
    for i, r in enumerate(references):  # validate every reference before grading anything
        try:
            normalize_reference(r)
        except ValueError as e:
            raise ValueError(f"references[{i}]: {e}") from None
    contents = [extract_boxed(r) for r in responses]

    def one(i: int) -> tuple[bool, str]:
        return _grade_extracted(references[i], contents[i], timeout, max_workers=num_workers)

    if num_workers == 1 or len(responses) <= 1:
        return [one(i) for i in range(len(responses))]
    with ThreadPoolExecutor(max_workers=num_workers) as ex:
        return list(ex.map(one, range(len(responses))))


def summarize(results: Sequence[tuple[bool, str]]) -> dict[str, int]:
    """Aggregate :func:`grade_batch` results: ``{"total", "correct", <each reason in REASONS>}`` counts.

    Every reason key is present (0 if unused), so logs have stable columns.

    Raises:
        ValueError: an element is not a ``(bool, reason)`` pair with a known reason.
    """
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


if __name__ == "__main__" and len(sys.argv) == 3 and sys.argv[1] == "--grading-worker":
    # The grading worker: `python verify.py --grading-worker FD` (started by _Worker, never by hand).
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != os.path.dirname(os.path.abspath(__file__))]
    _worker_main(int(sys.argv[2]))
