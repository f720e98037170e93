"""Math answer verifier: extract, normalise, decide equivalence — never evaluating model text.

Pipeline (score 1/0 with a reason):
1. extract the final answer (``extract.extract_answer``: last box, ``<answer>``, ``#### N``) -> "no answer found";
2. normalise both sides (LaTeX fractions incl. ``\\dfrac``, ``\\text{}``/units, degrees, percent, thousands
   separators, ``x = 3`` -> ``3``, spacing, unicode minus);
3. equal strings, equal decimals (trailing zeros irrelevant), intervals (bracket types must match),
   tuples and sets (element-wise; sets unordered) -> "matched";
4. otherwise a symbolic check — both sides parsed by the safe recursive-descent parser
   (``safe_expr``), ``simplify(a - b) == 0`` or agreement at random points — in a forked worker
   process killed after ``timeout`` seconds -> "timeout". Results are cached per (answer, truth).
"""
from __future__ import annotations

import dataclasses
import functools
import multiprocessing as mp
import re
from decimal import Decimal, InvalidOperation

from megatron_rl.rewards.extract import extract_answer, strip_think

MAX_ANSWER_CHARS = 1000


@dataclasses.dataclass(frozen=True)
class VerifyResult:
    score: float
    reason: str  # matched | no answer found | mismatch | timeout | unparsable


def _unwrap(s: str, cmd: str) -> str:
    """Replace ``\\cmd{X}`` by ``X`` (brace-matched)."""
    out, i = [], 0
    key = "\\" + cmd + "{"
    while True:
        j = s.find(key, i)
        if j < 0:
            return "".join(out) + s[i:]
        out.append(s[i:j])
        depth, k = 1, j + len(key)
        while k < len(s) and depth:
            depth += {"{": 1, "}": -1}.get(s[k], 0)
            k += 1
        out.append(s[j + len(key):k - 1])
        i = k


def _frac(s: str) -> str:
    """``\\frac{a}{b}`` -> ``((a)/(b))`` and ``\\frac12`` -> ``((1)/(2))`` (innermost first)."""
    for _ in range(50):
        m = re.search(r"\\frac\s*\{([^{}]*)\}\s*\{([^{}]*)\}", s) or re.search(r"\\frac\s*(\d)\s*(\d)", s)
        if not m:
            return s
        s = s[:m.start()] + f"(({m.group(1)})/({m.group(2)}))" + s[m.end():]
    return s


def normalize(s: str) -> str:
    s = s.strip().replace("\u2212", "-").replace("\\!", "").replace("\\,", "").replace("\\;", "").replace("\\ ", "")
    for a in ("\\$", "$", "\\(", "\\)", "\\[", "\\]", "\\left", "\\right", "\\displaystyle"):
        s = s.replace(a, "")
    s = s.replace("{,}", ",")
    s = s.replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac")
    for cmd in ("boxed", "text", "textbf", "mathrm", "mbox", "operatorname"):
        s = _unwrap(s, cmd)
    s = re.sub(r"\^\s*\{?\\circ\}?|°|\\circ|\\degree", "", s)
    s = s.replace("\\%", "").replace("%", "")
    s = re.sub(r"^\s*[a-zA-Z]\s*=\s*", "", s)
    s = re.sub(r"\s*(degrees?|cm|m|km|kg|g|units?|dollars?|cents?|inches|feet|hours?|minutes?|seconds?|meters?)\s*$", "", s)
    if re.fullmatch(r"-?\d{1,3}(,\d{3})+(\.\d+)?", s.replace(" ", "")):
        s = s.replace(",", "")
    for _ in range(20):  # innermost-first until stable: \frac{\sqrt{2}}{2}
        prev = s
        s = re.sub(r"\\sqrt\s*\{([^{}]*)\}", r"sqrt(\1)", s)
        s = re.sub(r"\\sqrt\s*(\d+)", r"sqrt(\1)", s)
        s = _frac(s)
        if s == prev:
            break
    s = re.sub(r"\\(sin|cos|tan|log|ln|exp)\b", r"\1", s)
    s = s.replace("\\pi", "pi").replace("\\cdot", "*").replace("\\times", "*").replace("\\infty", "inf")
    s = s.replace("{", "(").replace("}", ")") if not s.startswith("\\{") else s
    s = s.replace("\\{", "{").replace("\\}", "}")
    s = re.sub(r"\s+", "", s).rstrip(".")
    return s


def _decimal(s: str) -> Decimal | None:
    try:
        return Decimal(s)
    except (InvalidOperation, ValueError):
        return None


def _split_top(s: str) -> list[str]:
    parts, depth, cur = [], 0, ""
    for c in s:
        if c in "([{":
            depth += 1
        elif c in ")]}":
            depth -= 1
        if c == "," and depth == 0:
            parts.append(cur)
            cur = ""
        else:
            cur += c
    return parts + [cur]


def _symbolic_equal(a: str, b: str) -> bool:
    import random

    import sympy

    from megatron_rl.rewards.safe_expr import parse

    x, y = parse(a), parse(b)
    d = sympy.simplify(x - y)
    if d == 0:
        return True
    syms = sorted(d.free_symbols, key=str)
    rng = random.Random(0)
    for _ in range(5):
        val = complex(d.subs({s: rng.uniform(0.5, 2.0) for s in syms}).evalf(30))
        if abs(val) > 1e-9:
            return False
    return True


def _worker(a, b, q):
    try:
        q.put(("ok", _symbolic_equal(a, b)))
    except Exception as e:  # unparsable / sympy failure
        q.put(("err", str(e)[:200]))


@functools.lru_cache(maxsize=1)
def _ctx():
    """A forkserver context (safe beside Ray / gRPC / torch threads, unlike a bare fork)."""
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(["sympy", "megatron_rl.rewards.safe_expr"])
    return ctx


def _bounded_symbolic(a: str, b: str, timeout: float) -> str:
    ctx = _ctx()
    q = ctx.Queue()
    p = ctx.Process(target=_worker, args=(a, b, q), daemon=True)
    p.start()
    p.join(timeout)
    if p.is_alive():
        p.kill()
        p.join()
        return "timeout"
    try:
        kind, val = q.get(timeout=1)
    except Exception:
        return "unparsable"
    if kind == "err":
        return "unparsable"
    return "matched" if val else "mismatch"


def _equivalent(a: str, b: str, timeout: float) -> str:
    if a == b:
        return "matched"
    da, db = _decimal(a), _decimal(b)
    if da is not None and db is not None:
        return "matched" if da == db else "mismatch"
    iv = re.compile(r"^([\(\[])(.*),(.*)([\)\]])$")
    ma, mb = iv.match(a), iv.match(b)
    if ma and mb and len(_split_top(a[1:-1])) == 2 and len(_split_top(b[1:-1])) == 2:
        if (ma.group(1), ma.group(4)) != (mb.group(1), mb.group(4)) and not (a[0] == "(" and a[-1] == ")"):
            return "mismatch"
    for op, cl, ordered in (("(", ")", True), ("[", "]", True), ("{", "}", False)):
        if a.startswith(op) and a.endswith(cl) and b[:1] in "([{" and "," in a:
            pa, pb = _split_top(a[1:-1]), _split_top(b[1:-1])
            if len(pa) != len(pb) or len(pa) < 2:
                return "mismatch"
            if a[0] + a[-1] != b[0] + b[-1]:
                return "mismatch"
            if not ordered:
                pa, pb = sorted(pa), sorted(pb)
            res = [_equivalent(x, y, timeout) for x, y in zip(pa, pb)]
            return "matched" if all(r == "matched" for r in res) else ("timeout" if "timeout" in res else "mismatch")
    return _bounded_symbolic(a, b, timeout)


@functools.lru_cache(maxsize=65536)
def verify_answer(pred: str, truth: str, timeout: float = 2.0) -> VerifyResult:
    """Compare an already extracted answer with the ground truth."""
    if len(pred) > MAX_ANSWER_CHARS:
        return VerifyResult(0.0, "unparsable")
    r = _equivalent(normalize(pred), normalize(str(truth)), timeout)
    if r == "unparsable":
        r = "mismatch"
    return VerifyResult(1.0 if r == "matched" else 0.0, r)


def verify_math(response: str, ground_truth: str, timeout: float = 2.0) -> VerifyResult:
    """Score a full model response against the ground truth (see module docstring)."""
    ans = extract_answer(strip_think(response))
    if ans is None:
        return VerifyResult(0.0, "no answer found")
    return verify_answer(ans.strip(), str(ground_truth), timeout)


def math_reward(response: str, ground_truth) -> float:
    return verify_math(response, str(ground_truth)).score
