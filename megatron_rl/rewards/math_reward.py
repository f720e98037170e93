"""The ``math`` reward: the RLCSD reference's verifier (THU-BPM/RLCSD) on the maintained
``math-verify`` library (huggingface/Math-Verify), reward 1 / 0.

Pipeline (:func:`math_verdict`):

1. **answer** = the content of the LAST ``\\boxed{…}`` / ``\\fbox{…}`` (brace-matched) after closed
   ``<think>`` blocks are dropped; none -> 0 ("no answer found"). Departure (``math`` only): without a
   box, the last ``<answer>…</answer>`` block, else a GSM8K ``#### N`` line is the answer.
2. **exact-decimal fast path**: strip ``$``, ``\\(…\\)``, ``\\[…\\]``, ``\\left``/``\\right``, degree
   marks, spaces, Unicode minus and thousands separators; two plain decimal numbers are compared
   exactly as ``Decimal`` (a 100k-digit number costs microseconds).
3. **math-verify**: ``verify(parse(truth), parse(answer))`` (both given as ``\\boxed{…}``), bounded by
   ``timeout`` seconds in all (one interval-timer alarm around the whole check) inside a reward
   worker process that the pool kills if even the alarm cannot interrupt it (``rewards/pool.py``).
4. if math-verify raises, the normalised strings are compared (``$`` and spaces dropped, lower-cased).

**Stricter than the reference** (the reference's exact behaviour is the reward ``math_rlcsd``):

- a degenerate answer never matches: one whose value is undefined (``1/0``, ``0/0``, ``nan``, ``zoo``,
  ``\\log 0``, ``\\tan(\\pi/2)``) matches nothing; one that is infinite (``\\infty``) matches only a
  truth that itself contains infinity (``\\infty``, ``[5, \\infty)``) — a non-finite or undefined
  comparison is a mismatch;
- the fast path drops only thousands separators (``1,234``), not every comma (the reference reads
  the tuple ``1,2`` as ``12``);
- answers longer than :data:`MAX_ANSWER_CHARS` skip the symbolic check (string comparison only).

A **timeout is not a verdict**: it gives ``Verdict(0, "timeout")``, which is never cached; the reward
pool runs the sample once more and counts a second timeout (``reward/timeouts``).
"""
from __future__ import annotations

import collections
import logging
import re
import signal
from decimal import Decimal, InvalidOperation

from megatron_rl.rewards import pool
from megatron_rl.rewards.extract import last_boxed, strip_think
from megatron_rl.rewards.verdict import Verdict

TIMEOUT_S = 5.0
"""Seconds for the math-verify check of one answer (the reference's 5 s); ``reward.timeout_s``."""
MAX_ANSWER_CHARS = 4096
_CACHE_SIZE = 65536
_cache: collections.OrderedDict = collections.OrderedDict()

_ANSWER = re.compile(r"<answer>(.*?)</answer>", re.S)
_HASH = re.compile(r"####\s*([^\n]+)")
_FAST_STRIP = re.compile(r"\\left|\\right|\^\s*\{?\\circ\}?|°|\\circ|\\degree|\\[()\[\]]|\$|\s")
_THOUSANDS = re.compile(r"^[+-]?\d{1,3}(,\d{3})+(\.\d*)?$")
_DECIMAL = re.compile(r"^[+-]?(\d+\.?\d*|\.\d+)$")


_BARE_BOX = re.compile(r"\\boxed[ \t]+([^\s${}\\]+)")


def extract_answer(response: str, fallbacks: bool = True) -> str | None:
    """Step 1: the last box (``fallbacks``: also TeX's brace-less ``\\boxed 5`` when it is the last
    box, else the last ``<answer>`` block, else ``#### N``)."""
    text = strip_think(response)
    b = last_boxed(text)
    if not fallbacks:
        return b
    bare = list(_BARE_BOX.finditer(text))
    if bare and bare[-1].start() > max(text.rfind("\\boxed{"), text.rfind("\\fbox{")):
        return bare[-1].group(1)
    if b is not None:
        return b
    tags = _ANSWER.findall(text)
    if tags:
        return last_boxed(tags[-1]) or tags[-1].strip()
    h = _HASH.findall(text)
    return h[-1].strip() if h else None


def truth_answer(ground_truth) -> str:
    """The ground truth as an answer string (its last box if boxed; the part after ``####`` if GSM8K)."""
    s = str(ground_truth).strip()
    b = last_boxed(s)
    if b is not None:
        return b.strip()
    if "####" in s:
        return s.rsplit("####", 1)[1].strip()
    return s


def fast_decimal(a: str, reference: bool = False) -> str | None:
    """Step 2's normal form of ``a`` when it is a plain decimal number, else None."""
    s = _FAST_STRIP.sub("", a.replace("\u2212", "-"))
    if reference:
        s = s.replace(",", "")
    elif _THOUSANDS.match(s):
        s = s.replace(",", "")
    return s if _DECIMAL.match(s) else None


def normalized_string(s: str) -> str:
    """Step 4's normal form: ``$`` and whitespace removed, lower-cased."""
    return re.sub(r"\s+", "", s.replace("$", "")).lower()


class _Alarm(BaseException):
    """Raised by the interval timer inside the symbolic check (BaseException: no ``except Exception``
    in math-verify or sympy swallows it)."""


def _on_alarm(signum, frame):
    raise _Alarm()


def _degenerate(pred_parsed: list, gold_parsed: list) -> bool:
    """True when the answer's value is undefined, or infinite while the truth has no infinity."""
    import sympy  # lazy: defers sympy to the call
    from sympy import MatrixBase  # lazy: defers sympy to the call

    def bad(expr, kinds) -> bool:
        if not isinstance(expr, (sympy.Basic, MatrixBase)):
            return False
        if any(expr.has(k) for k in kinds):
            return True
        try:
            done = expr.doit()
        except Exception:  # noqa: BLE001 -- an expression sympy cannot evaluate is not thereby degenerate
            return False
        return isinstance(done, (sympy.Basic, MatrixBase)) and any(done.has(k) for k in kinds)

    undefined = (sympy.nan, sympy.zoo)
    infinite = (sympy.oo, -sympy.oo)
    if any(bad(p, undefined) for p in pred_parsed):
        return True
    gold_inf = any(bad(g, infinite) for g in gold_parsed) or any(
        isinstance(g, str) and "infty" in g for g in gold_parsed)
    return not gold_inf and any(bad(p, infinite) for p in pred_parsed)


#: undefined values written out in an answer (``1/0``, ``\frac{1}{0}``, ``nan``, ``zoo``, ``\log 0``): rejected
#: before any parsing (LaTeX reads ``nan`` as the product n·a·n, which would match a truth "nan")
_DEGENERATE_TEXT = re.compile(r"(^|[^a-z])(nan|zoo|undefined)([^a-z]|$)|/0(?![\d.])|frac\{[^{}]*\}\{0\}|frac[^{]0|"
                              r"\\(log|ln)\(?0(?![\d.])", re.I)


def _symbolic(pred: str, gold: str, timeout: float, reference: bool) -> Verdict:
    """Steps 3-4 under an interval-timer alarm of ``timeout`` seconds (main thread of a worker)."""
    from math_verify import parse, verify  # heavy (sympy, antlr): imported where used

    logging.getLogger("math_verify").setLevel(logging.ERROR)
    old = signal.signal(signal.SIGALRM, _on_alarm)
    signal.setitimer(signal.ITIMER_REAL, timeout)
    try:
        try:
            g = parse("\\boxed{" + gold + "}", parsing_timeout=None, raise_on_error=True)
            p = parse("\\boxed{" + pred + "}", parsing_timeout=None, raise_on_error=True)
            ok = verify(g, p, timeout_seconds=None, raise_on_error=True)
            if ok and not reference and _degenerate(p, g):
                return Verdict(0.0, "degenerate")
        except _Alarm:
            raise
        except Exception:  # noqa: BLE001 -- the reference's rule: math-verify raised -> compare strings
            ok = normalized_string(pred) == normalized_string(gold)
        return Verdict(1.0 if ok else 0.0, "matched" if ok else "mismatch")
    except _Alarm:
        return Verdict(0.0, "timeout")
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def symbolic_check(pred: str, gold: str, timeout: float, reference: bool = False) -> Verdict:
    """Steps 3-4, cached for definite verdicts; runs in a reward worker (directly when already in
    one, else on the shared pool, so a check that hangs in C code can be killed)."""
    key = (pred, gold, reference)
    hit = _cache.get(key)
    if hit is not None:
        _cache.move_to_end(key)
        return hit
    if pool.IN_WORKER:
        v = _symbolic(pred, gold, timeout, reference)
    else:
        v = pool.shared_pool(0, deadline_for(timeout)).map(
            "megatron_rl.rewards.math_reward:symbolic_check", [(pred, gold, timeout, reference)])[0]
    if v.reason != "timeout":
        _cache[key] = v
        if len(_cache) > _CACHE_SIZE:
            _cache.popitem(last=False)
    return v


def deadline_for(timeout: float) -> float:
    """The pool's hard deadline for a task whose symbolic check has ``timeout`` seconds."""
    return 1.5 * timeout + 2.0


def math_verdict(response: str, ground_truth, timeout: float | None = None, reference: bool = False) -> Verdict:
    """The ``math`` reward with its reason (module docstring); ``reference``: the RLCSD reference's
    exact rules (``math_rlcsd``)."""
    ans = extract_answer(response, fallbacks=not reference)
    if ans is None:
        return Verdict(0.0, "no answer found")
    pred, gold = ans.strip(), truth_answer(ground_truth)
    if not reference and _DEGENERATE_TEXT.search(normalized_string(pred)):
        return Verdict(0.0, "degenerate")
    da, db = fast_decimal(pred, reference), fast_decimal(gold, reference)
    if da is not None and db is not None:
        try:
            ok = Decimal(da) == Decimal(db)
        except InvalidOperation:
            ok = False
        return Verdict(1.0 if ok else 0.0, "matched" if ok else "mismatch")
    if len(pred) > MAX_ANSWER_CHARS and not reference:
        ok = normalized_string(pred) == normalized_string(gold)
        return Verdict(1.0 if ok else 0.0, "matched" if ok else "mismatch")
    return symbolic_check(pred, gold, TIMEOUT_S if timeout is None else timeout, reference)


def math_reward(response: str, ground_truth) -> Verdict:
    """Registered as ``math`` (module docstring)."""
    return math_verdict(response, ground_truth)


def math_rlcsd_reward(response: str, ground_truth) -> Verdict:
    """Registered as ``math_rlcsd``: the RLCSD reference's verifier exactly (box only, every comma
    dropped in the fast path, no degenerate-answer rule)."""
    return math_verdict(response, ground_truth, reference=True)
