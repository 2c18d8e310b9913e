r"""Answer grader for RLVR rewards and evaluation: is the last ``\boxed{}`` of a response the reference?

Built on math-verify 0.9.0 (sympy). A response is graded in three steps, in this file's order:

1. **Extract** (:func:`extract_boxed`): the content of the *last* ``\boxed{...}`` (or ``\fbox{...}``, or the
   brace-less ``\boxed 9``), braces matched by counting. No box -> reason ``"no_box"``; there is never a
   fallback to "some number in the text" (bug_cases C05), and an earlier box is never merged in (C03 c/d).
2. **Normalise** (:func:`normalize_answer`, the reference also through :func:`normalize_reference`): the same
   rules on both sides (units, thousands separators, e-notation, ...).
3. **Grade** (:func:`grade_answer`, a pure function): wrap each side as ``\boxed{...}`` (the bare reference is
   never parsed: bare ``2x-y+5=0`` parses to ``0``; C06, C08, C11-C13), ``math_verify.parse`` both and
   ``math_verify.verify(gold, pred)`` with the reference (gold) ALWAYS first (verify is not symmetric; C12,
   Math-Verify #25), plus a relative check for tiny numbers. The section *Grading rules* below lists every rule
   with the case it comes from; call :func:`grade_answer` directly to see how an answer is judged.

Step 3 runs in worker processes with a wall-clock limit per pair (:data:`DEFAULT_TIMEOUT` s): math-verify can
grind for minutes (``9^{9^{9}}`` vs ``2``), and its own ``signal.alarm`` time-outs only work on the main
thread. That machinery (a pebble ``ProcessPool``) is the last section of the file.

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

Grading rules
-------------
Each with the bug_cases.md case or data rule it comes from. The first and the unit and spelling rules are
applied by :func:`extract_boxed` and :func:`normalize_answer`, the others by :func:`grade_answer`.

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
  ``include_percentage`` rule, C08), and so does a decimal one: ``62.5\%`` accepts ``62.5`` and ``0.625``
  (olympiadbench; math-verify 0.9.0 takes the bare number for integers only, so when exactly one side is a
  percentage we also compare its bare number, :func:`_percent_free`). A reference ``0.5`` does not accept ``50``.
  A percentage in the box is read the same way: ``28\%``, ``$28$ \%``, ``28 percent``, ``28 pct`` all match a
  reference ``28``, ``28\%`` or ``0.28`` (issue 12: ``$28$ \%`` was a parse error). Two percentages compare
  by value only: ``0.5\%`` != ``50\%``.
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
  ``1\,000`` as ``1*0`` and misses ``,\!`` inside ``\frac``), and so are plain spaces between a 1-3 digit
  group and 3-digit groups: ``1 000`` == ``1000``, ``12 345 678`` == ``12345678`` (math-verify reads ``1 000``
  as ``1*0``; issue 12), while ``1 2 3``, ``12 34`` and ``12 345 6789`` keep their spaces. A comma is never
  a decimal point (``1000,99`` is not 1000.99).
- **Leading zeros**: AIME ``025`` == ``25`` (data README, aime24).
- **Notation**: ``\dfrac`` and ``\tfrac`` == ``\frac``; reordered sums ``-2+e^{5}`` == ``e^{5}-2`` (C13);
  products in any order (hmmt ``2^{25} \cdot 26!``). Unicode a model writes is read as its LaTeX (issue "Correct
  answers graded wrong": they were parse errors): ``−√3`` == ``-\sqrt{3}``, ``(-∞,0]``, ``6r²−4r−24`` ==
  ``6r^2-4r-24``, ``x⁻¹``, ``a₁``, ``×``, ``·``, ``≤``, ``±``, ``π``, ``½``; an en dash is not a minus (``3–5``
  stays a parse error). A coefficient and the imaginary unit are one spelling: ``-2 + 7 i`` == ``-2+7\,i`` ==
  ``-2 + 7i`` (math-verify reads only a standalone ``i`` as complex, so ``7i`` and ``7 i`` were two symbols).
  Spacing commands at either end are dropped: ``\boxed{-10\,}`` == ``-10`` (was ``-10\``, a parse error).
- **Fractions vs decimals**: a decimal matches a fraction when they agree after rounding to 6 decimal
  places (math-verify ``float_rounding=6``): ``\frac{1}{2}`` == ``0.5`` (C13), ``\frac{1}{3}`` ==
  ``0.333333`` but != ``0.333``.
- **Small magnitudes**: that 6-decimal rule is an absolute tolerance, so math-verify 0.9.0 finds all
  values below about 1e-7 equal (``2.88\times10^{-19}`` == ``3.88\times10^{-19}``; minerva 264, 265,
  267 in the oracle test). We add a relative check: two variable-free numbers more than
  :data:`REL_TOL` (0.1 %) apart never verify, whatever their size. Percentages are exempt (C08).
- **Reference/answer spellings** rewritten on both sides (minerva data): e-notation ``4.5e33`` ->
  ``4.5\times10^{33}`` (math-verify reads the ``e`` as Euler's number), ``np.arcsin(..)`` ->
  ``\arcsin(..)``, Python floats ``-1./3`` -> ``-1/3``, stray unescaped ``$`` removed (minerva 72) and
  whitespace runs made one space (issue 12),
  operator-name subscripts ``m_{\max}``/``M_{\odot}`` -> ``m_{max}``/``M_{odot}`` (they do not parse
  otherwise), trailing sentence punctuation dropped.
- The prediction is parsed with LaTeX extraction only; the reference also with math-verify's plain
  expression extraction. So math-verify never digs a number out of an unparsable prediction; such a
  prediction is compared as an exact string only, and reported as ``"parse_error"`` if it differs.

Left out on purpose
-------------------
- Partial credit, format rewards, length penalties: the reward is binary (1.0 iff correct).
- Answers outside a box ("Final Answer: **58**"), answer-extraction heuristics and LLM judges (C05).
- Unit conversion (``15\text{ cm}`` vs ``0.15\text{ m}``) and degrees-to-radians: units are stripped, not
  converted.
- A grading server or remote workers: one local process pool per trainer process.

Read next: ``docs/specs/bug_cases.md`` (the cases C01-C13, C28 cited here), ``tests/test_verify.py`` (every
rule as an example), ``tests/test_oracle.py`` (every benchmark reference), math-verify's README (its ``parse``
and ``verify`` options) and pebble's ``ProcessPool`` documentation (the time-outs).

How to call it from any trainer (this file plus ``pip install math-verify==0.9.0 antlr4-python3-runtime==4.13.2
pebble``; the
workers are spawned and re-import the calling script, so guard its entry point with ``if __name__ ==
"__main__":`` as for any multiprocessing program)::

    import verify
    graded = verify.grade_batch(responses, references)       # [(correct, reason)], one per response
    rewards = [1.0 if correct else 0.0 for correct, _ in graded]
    metrics = verify.summarize(graded)                        # {"total", "correct", "no_box", "timeout", ...}

    verify.reward(response, reference)                        # one response: 1.0 or 0.0
    verify.grade_answer("3", "x = 3", hedged=False)           # the rules alone, in-process: (True, "ok", "")
"""

from __future__ import annotations

import atexit
import collections
import concurrent.futures
import functools
import itertools
import logging
import math
import multiprocessing
import multiprocessing.util
import os
import re
import signal
import threading
from concurrent.futures import Future, wait
from typing import Sequence

from pebble import ProcessExpired, ProcessPool

logger = logging.getLogger(__name__)

DEFAULT_TIMEOUT = 5.0
"""Default wall-clock limit, in seconds, for grading one (response, reference) pair."""

KILL_GRACE = 1.0
"""Seconds beyond ``timeout`` after which an unresponsive worker is killed (and replaced)."""

STARTUP_TIMEOUT = 120.0
"""Seconds allowed for the first worker of a pool to start (import sympy and math-verify); not in ``timeout``."""

WORKER_MEMORY_LIMIT = 4 << 30
"""Address space (bytes) a worker may map beyond what it holds after start-up (RLIMIT_AS), so a pathological
input fails instead of exhausting RAM."""

GOLD_CACHE_SIZE = 4096
"""Parsed references cached per process (a group of G responses shares one reference)."""

REL_TOL = 1e-3
"""Two numbers further apart than this, relative to the larger, never verify (see :func:`grade_answer`)."""

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
# Whitespace runs: LaTeX reads any run as one space, math-verify does not (`$28$ \%` -> `28  \%` fails to parse).
_SPACE_RUN_RE = re.compile(r"\s+")
# Plain spaces between digit groups (`1 000`, `12 345 678`; SI style) -> one number: math-verify 0.9.0 reads `1 000`
# as 1*0. Only a 1-3 digit group, then groups of exactly 3 digits; not after a word character, `.` or `^`, not before
# a word character, and no digit one space beyond either end: `1 2 3`, `12 34`, `12 345 6789`, `0.5 000`, `x_1 000`
# and `2^1 000` keep their spaces (a decimal part may follow: `1 000.5`).
_SPACE_SEP_RE = re.compile(r"(?<![\w.^])(?<!\d )\d{1,3}(?: \d{3})+(?!\w| \d)")
# Sentence punctuation after the answer (`\text{(E)},`, `30^\circ.`); an ellipsis `...` is kept, and so is the `,`
# / `;` / `:` of a spacing command `\,` (stripped whole first, by _EDGE_SPACE_RE).
_END_PUNCT_RE = re.compile(r"(?<![.\\])[.,;:]\s*$")
# LaTeX spacing commands at either end of an answer (`\boxed{-10\,}`, `\boxed{\quad 5}`): they typeset nothing there,
# and a trailing `\,` lost its comma to the sentence-punctuation rule (`-10\` then fails to parse).
# A lone trailing `\` is a `\ ` whose space was stripped with the box's (`\boxed{5\ }`); `\\` is kept.
_EDGE_SPACE_RE = re.compile(
    r"^(?:\s|\\[,;:! ]|\\q?quad(?![A-Za-z])|~)+|(?:\s|\\[,;:! ]|\\q?quad(?![A-Za-z])|~)+$|(?<!\\)\\$"
)
# Any other `\,` `\;` `\:` (a thin space between symbols: `\frac{d\,x}{d\,t}`, `8\,\%`) -> a space, which math-verify
# reads as LaTeX does; between digit groups they were removed above (_THIN_SEP_RE).
_THIN_SPACE_RE = re.compile(r"\\[,;:]")
# A coefficient and the imaginary unit: `7i`, `7 i`, `7\,i` -> `7 i`. math-verify 0.9.0 reads `i` as a complex
# symbol only when it stands alone (its should_treat_as_complex: `\bi\b`), so `-2 + 7 i` and `-2 + 7i` gave two
# different symbols `i` and never matched. Not `7in` (a word) nor `\pi` (no digit before the `i`).
_COEFF_I_RE = re.compile(r"(?<=\d)(?:\s|\\[,;:! ]|~)*i(?![A-Za-z])")
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
_SUB_CMD_RE = re.compile(
    r"_(?:\{\s*\\(max|min|odot|oplus|star|ast|bullet)\s*\}|\\(max|min|odot|oplus|star|ast|bullet)(?![A-Za-z]))"
)
# The word "or" / `\vee` / `\lor` anywhere in an answer, also inside \text{...} (hedging check, C03).
_HEDGE_RE = re.compile(r"(?i)(?<![A-Za-z])or(?![A-Za-z])|\\(?:vee|lor)(?![A-Za-z])")


# Unicode a model writes for LaTeX (issue: `−√3`, `(-∞,0]`, `6r²−4r−24` were parse errors in latex2sympy2_extended
# 1.11.0, which reads ASCII LaTeX only). Each symbol becomes its LaTeX command, with a space so that a letter after
# it stays apart (`∞x` -> `\infty x`); `√3`, `√x`, `√(x+1)` -> `\sqrt{3}`, `\sqrt{x}`, `\sqrt{(x+1)}`; a run of
# superscript characters -> `^{...}` (`r²` -> `r^{2}`, `x⁻¹` -> `x^{-1}`), of subscript digits -> `_{...}`.
_UNICODE_LATEX = {
    "\u2212": "-",
    "\ufe63": "-",
    "\uff0d": "-",  # minus sign, small and full-width hyphen-minus (not a dash: 3–5)
    "\u221e": r"\infty ",
    "\u03c0": r"\pi ",
    "\u00d7": r"\times ",
    "\u22c5": r"\cdot ",
    "\u00b7": r"\cdot ",
    "\u2219": r"\cdot ",
    "\u00f7": r"\div ",
    "\u2264": r"\le ",
    "\u2265": r"\ge ",
    "\u2a7d": r"\le ",
    "\u2a7e": r"\ge ",
    "\u2260": r"\ne ",
    "\u00b1": r"\pm ",
    "\u2213": r"\mp ",
    "\u222a": r"\cup ",
    "\u2229": r"\cap ",
    "\u2208": r"\in ",
    "\u2205": r"\emptyset ",
    "\u03b8": r"\theta ",
    "\u03b1": r"\alpha ",
    "\u03b2": r"\beta ",
    "\u2032": "'",
    "\u00a0": " ",
    "\u2009": " ",
    "\u202f": " ",
    "\u2007": " ",
    "\u200a": " ",
    "\u2008": " ",
    "\u00bd": r"\frac{1}{2}",
    "\u2153": r"\frac{1}{3}",
    "\u2154": r"\frac{2}{3}",
    "\u00bc": r"\frac{1}{4}",
    "\u00be": r"\frac{3}{4}",
}
_UNICODE_RE = re.compile("|".join(map(re.escape, _UNICODE_LATEX)))
_SUPERSCRIPTS = dict(
    zip(
        "\u2070\u00b9\u00b2\u00b3\u2074\u2075\u2076\u2077\u2078\u2079\u207a\u207b\u207c\u207d\u207e\u207f",
        "0123456789+-=()n",
    )
)
_SUBSCRIPTS = dict(zip("\u2080\u2081\u2082\u2083\u2084\u2085\u2086\u2087\u2088\u2089", "0123456789"))
_SUPER_RE = re.compile("[" + "".join(_SUPERSCRIPTS) + "]+")
_SUB_RE = re.compile("[" + "".join(_SUBSCRIPTS) + "]+")
# √ / ∛ / ∜ and the radicand a model writes after it: a number, one letter, a LaTeX command (`√\pi`), a (...) or
# {...} group without nested brackets; anything else gets a bare `\sqrt` and LaTeX's own argument rule.
_ROOT_RE = re.compile(r"([\u221a\u221b\u221c])\s*(\d+(?:\.\d+)?|[A-Za-z]|\\[A-Za-z]+|\([^()]*\)|\{[^{}]*\})?")
_ROOT_CMD = {"\u221a": r"\sqrt", "\u221b": r"\sqrt[3]", "\u221c": r"\sqrt[4]"}


def _root(m: re.Match) -> str:
    arg = m.group(2)
    if arg is None:
        return _ROOT_CMD[m.group(1)] + " "
    return _ROOT_CMD[m.group(1)] + "{" + (arg[1:-1] if arg.startswith("{") else arg) + "}"


def _unicode_to_latex(s: str) -> str:
    """Unicode math (``−√3``, ``(-∞,0]``, ``6r²−4r−24``, ``x⁻¹``, ``a₁``) as the LaTeX math-verify reads; ASCII is
    left as it is. Source: the issue's parse errors; latex2sympy2_extended 1.11.0's grammar is ASCII LaTeX."""
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


# Units (C10). math-verify's own unit stripping (NormalizationConfig.units) also strips single-letter
# *variables* that look like units (t, h, s, m, c, d, g, l, o, ...): with it `2t` == `2`, `2t` == `2s` and
# `a+b+c` == `a+b+d` all verify True. We switch it off and strip only unambiguous trailing units:
#   a \text{...}-like group (with an optional ^2 / ^3), a degree mark, or a multi-letter unit word after
#   a number; repeated for compound units (`10 \text{ m}/\text{s}`), never leaving an empty answer.
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
    r"""Normalise one answer string (reference or box content) before it is wrapped and parsed.

    Applied identically to both sides (the reference after :func:`normalize_reference` unwraps it), so it
    never favours one side. In order: unicode math as LaTeX (``−√3`` -> ``-\sqrt{3}``, ``r²`` -> ``r^{2}``,
    ``∞`` -> ``\infty``); stray unescaped ``$`` removed; whitespace runs -> one space (math-verify
    cannot read ``28  \%``); e-notation ``4.5e33`` -> ``4.5\times10^{33}``; typeset thousands separators
    removed (``1\,000``, ``29,\!322``), and plain spaces between digit groups (``1 000``); spacing commands
    at either end (``-10\,``) and trailing sentence punctuation dropped; other ``\,`` ``\;`` ``\:`` -> a space;
    ``7i``, ``7\,i`` -> ``7 i``; ``\vee``/``\lor`` -> ``\text{ or }``; ``np.arcsin`` -> ``\arcsin``;
    ``-1./3`` -> ``-1/3``; ``m_{\max}`` -> ``m_{max}``; trailing units stripped (``15\text{ cm}^2`` -> ``15``,
    ``30^\circ`` -> ``30``; single-letter variables are kept). Comma thousands separators
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
    for rule in _NORMALISATION:  # the docstring's rules, in its order
        s = rule(s)
    return s


_DELIMS = ((r"\(", r"\)"), (r"\[", r"\]"), ("$$", "$$"), ("$", "$"))


def normalize_reference(reference: str) -> str:
    r"""Normalise a reference answer: unwrap one outer box or math delimiter, then :func:`normalize_answer`.

    A reference given as ``\boxed{7}``, ``$7$``, ``\(7\)`` or ``\[7\]`` becomes ``7``; the result is always
    re-wrapped as ``\boxed{...}`` before parsing, never parsed bare (C06, C08, C11, C12, C13).

    Args:
        reference: reference answer (str), e.g. an ``answer`` field of data/*.jsonl.

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


def is_hedged(content: str, reference: str) -> bool:
    r"""True if the box content offers alternatives ("or", ``\vee``, ``\lor``) and the reference does not (C03).

    Checked on the raw strings, before normalisation (stripping ``\text{ (or 4)}`` as a unit would hide the
    hedge); :func:`grade_answer` then rejects a hedged answer unless the reference parses to a set.
    """
    return bool(_HEDGE_RE.search(content)) and not _HEDGE_RE.search(reference)


# ----------------------------------------------------------------------------------------------
# 3. Grading rules (pure: math-verify and sympy in the calling process, no time-out)
# ----------------------------------------------------------------------------------------------


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
    """True if gold ``g`` and prediction ``x`` are numbers more than :data:`REL_TOL` apart, relative to the larger.

    math-verify compares numbers to 6 decimal places (or chops tiny differences), an *absolute* tolerance:
    every value below ~1e-7 equals every other (2.88e-19 == 3.88e-19, minerva 264).
    """
    a = _number(g)
    b = _number(x)
    if a is None or b is None:
        return False
    return abs(a - b) > REL_TOL * max(abs(a), abs(b))


def grade_answer(reference: str, prediction: str, hedged: bool) -> tuple[bool, str, str]:
    r"""Judge one prediction against one reference: the grading rules, as a pure function.

    No time-out, no process: runs in the caller for as long as math-verify takes (seconds to minutes on a
    pathological input). :func:`verify_with_reason` runs this same function in a worker with a wall-clock
    limit. To judge a response by hand::

        content = extract_boxed(response)
        grade_answer(normalize_reference(reference), normalize_answer(content), is_hedged(content, reference))

    Args:
        reference: the normalised reference (:func:`normalize_reference`), e.g. ``"3"``.
        prediction: the normalised, non-empty box content (:func:`normalize_answer`), e.g. ``"x = 3"``.
        hedged: :func:`is_hedged` of the raw box content and the raw reference.

    Returns:
        ``(correct, reason, detail)``: reason ``"ok"`` (``correct`` is the verdict), ``"hedged"``,
        ``"parse_error"`` (detail ``"reference"`` or ``"prediction"``: that side gave no math object) or
        ``"error"`` (detail: math-verify's exception while verifying). ``correct`` is True only with ``"ok"``.

    Raises:
        Whatever ``math_verify.parse`` raises (it runs with ``raise_on_error=True``); the worker reports it
        as reason ``"error"``.

    The rules it applies are listed in the module docstring, section *Grading rules*.
    """
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
    """The pair ``(g, x)``, then, when exactly one side is a percentage, the pair with that side's bare number.

    math-verify 0.9.0 reads ``62.5\\%`` as ``62.5 * 1/100`` (an unevaluated ``1/100``) and accepts the bare number
    for integers only (``9\\% == 9``: its ``sympy_numeric_eq``); the bare-number pair, built with its own
    ``get_pct_val``, extends that rule to decimals (``62.5\\%`` == ``62.5``; olympiadbench's ``17.5%``, C08).
    When both sides are percentages only their values are compared (``0.625\\%`` != ``62.5\\%``).
    """
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
    """(True, None) if some (gold, prediction) pair verifies, as ``math_verify.verify(gold_list, pred_list)`` does
    (each pair also with a percentage's bare number, :func:`_percent_free`), and passes the relative check; else
    (False, the last verify exception or None)."""
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
    """``"reference"`` or ``"prediction"`` if that side gave no math object (math-verify then compared it as an
    exact string only: reported as "parse_error"), else ``""``."""
    from sympy import Basic, MatrixBase

    if not any(isinstance(g, (Basic, MatrixBase)) for g in gold):
        return "reference"
    if not any(isinstance(x, (Basic, MatrixBase)) for x in pred):
        return "prediction"
    return ""


# ----------------------------------------------------------------------------------------------
# 4. Public grading API (extract and normalise here; grade_answer in a worker, with a time-out)
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
    references: Sequence[str],
    normalized: Sequence[str],
    contents: Sequence[str | None],
    timeout: float,
    num_workers: int = 1,
    _soft_timer: bool = True,
) -> list[tuple[bool, str]]:
    """Grade box contents (already extracted) against references (as given, and ``normalize_reference``'d); count
    every reason, log time-outs and errors.

    All pairs are queued on the worker pool at once and collected in order. ``_soft_timer=False`` turns the
    worker's own timer off so that only the kill path can stop it (tests).
    """
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
        with _STATS_LOCK:
            _STATS[reason] += 1
        results.append((correct, reason))
    return results


def verify_with_reason(response: str, reference: str, timeout: float = DEFAULT_TIMEOUT) -> tuple[bool, str]:
    r"""Grade a response against a reference and say why.

    Args:
        response: model response text (str); its last ``\boxed{}`` is the answer.
        reference: reference answer (str), bare (``\frac{2}{7}``) or wrapped (``$...$``, ``\boxed{}``).
        timeout: wall-clock limit in seconds for grading this pair (default :data:`DEFAULT_TIMEOUT`);
            the call returns within about ``timeout + KILL_GRACE`` s once a worker has taken it (section 5).

    Returns:
        ``(correct, reason)``, reason in :data:`REASONS` (module docstring). ``correct`` is True only with
        reason ``"ok"``.

    Raises:
        ValueError: ``response`` or ``reference`` is not a str, ``reference`` is empty, ``timeout`` <= 0.
        RuntimeError: the grading workers cannot start (math-verify missing; section 5).

    Source: bug_cases.md Conventions 1; C01-C13.
    """
    if not isinstance(response, str):
        raise ValueError(f"response must be a str, got {type(response).__name__}")
    timeout = _check_timeout(timeout)
    return _grade_extracted([reference], [normalize_reference(reference)], [extract_boxed(response)], timeout)[0]


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
    """Grade many (response, reference) pairs in parallel in the grading worker(s).

    Args:
        responses: N response strings.
        references: N reference strings (e.g. each prompt's reference repeated G times).
        timeout: per-pair wall-clock limit in seconds (see :func:`verify_with_reason`).
        num_workers: worker processes to grade with (1 for the trainer's ~128 responses per step; up to the
            CPU count for evaluate.py). The pool grows to the largest number asked for and is kept for
            later calls, so a later call may use more workers than it asks for.

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
    normalized = []
    for i, r in enumerate(references):  # every reference checked before anything is graded
        try:
            normalized.append(normalize_reference(r))
        except ValueError as e:
            raise ValueError(f"references[{i}]: {e}") from None
    return _grade_extracted(references, normalized, [extract_boxed(r) for r in responses], timeout, num_workers)


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


# ----------------------------------------------------------------------------------------------
# 5. Process machinery: worker processes and time-outs (pebble.ProcessPool)
# ----------------------------------------------------------------------------------------------
# One wall-clock budget `timeout` per pair covers both parses and every verify call. math-verify's own
# signal.alarm time-outs are off (they raise off the main thread); grade_answer runs in a pebble worker:
# - soft limit: the worker's own timer (setitimer, its main thread) answers "timeout"; the worker stays warm.
# - hard limit: a worker silent at `timeout + KILL_GRACE` (stuck in C code) is killed by pebble (SIGTERM, then
#   SIGKILL 3 s later) and replaced; the other workers keep running. So a call returns within about
#   timeout + KILL_GRACE (+3 s for a worker deaf to SIGTERM) once a worker has taken it, from any thread.
# Workers are spawned, never forked (the trainer holds torch's threads). Spawn re-imports the calling script
# as `__mp_main__` (its `if __name__ == "__main__":` block does not run), so a worker also holds the script's
# imports (torch); WORKER_MEMORY_LIMIT counts from there. Workers start lazily, are reused, and stop at exit.


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


def _grade_in_worker(
    reference: str, prediction: str, hedged: bool, timeout: float, soft_timer: bool
) -> tuple[bool, str, str]:  # pragma: no cover - runs in the worker process
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
    """A pool of ``workers`` spawned workers, once one of them is up (else RuntimeError, like a missing import).

    The workers ignore SIGINT: a Ctrl-C in a terminal reaches the whole process group, and it is the caller's to
    handle (its exit stops them, ``shutdown``), not theirs to answer with a traceback each. pebble's worker loop
    ignores it once running; before that, a spawned worker imports the caller's script (seconds, for a trainer that
    imports torch), so the workers are spawned with SIGINT ignored (kept across exec: Python then installs no
    KeyboardInterrupt handler), for the milliseconds ``schedule`` takes to start them, when called from the main
    thread (the caller's handler is put back at once)."""
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


def _submit(
    reference: str, prediction: str, hedged: bool, timeout: float, num_workers: int, soft_timer: bool
) -> tuple[Future, ProcessPool]:
    """Queue one pair on the pool (started, grown to ``num_workers`` or replaced when broken, here)."""
    global _POOL, _POOL_WORKERS, _POOL_PID
    with _POOL_LOCK:  # schedule under the lock: a pool being replaced never receives new pairs
        if _POOL_PID != os.getpid():  # first use, or a forked child: the parent's pool is not ours
            _POOL = None
            _POOL_WORKERS = 0
            _POOL_PID = os.getpid()
            atexit.register(shutdown)  # this process's workers stop at its exit
            # A multiprocessing child (a Pool or ProcessPoolExecutor worker that grades) exits without atexit
            # handlers, after waiting for its non-daemonic children, these workers among them: its exit hook stops
            # them first. A finalizer runs only in the process that registered it, so each owner registers one,
            # once, tied to no object (tied to a pool, it would also run when a replaced pool is collected and stop
            # the pool that replaced it mid-batch).
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
    """Stop all grading workers now (they restart lazily on the next call, as many as it asks for). Also runs
    at exit."""
    global _POOL, _POOL_WORKERS
    with _POOL_LOCK:
        pool = _POOL
        _POOL = None
        _POOL_WORKERS = 0
    if pool is not None and _POOL_PID == os.getpid():
        pool.stop()
        pool.join()
