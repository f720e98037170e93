"""The rule check of PAPO's outcome reward, with the semantics of verl's ``prime_math`` scorer
(``verl/utils/reward_score/prime_math``: PRM800K's ``grade_answer`` then the ToRA-style ``math_equal``).
Our code; the rules:

1. **Extraction** (``match_answer``): after the last "answer:" / "answer is" / "answers are", before
   the last "is answer" / "is the answer" / "are the answers", then the last ``\\boxed{}``/``\\fbox{}``
   (brace counting), cut before the last ". ", then after the last "be " / "is " / "are " / "=" / ": " /
   "get ". The response itself when none applies.
2. **Equal** when any of, in order:
   a. the Hendrycks MATH normalisations are equal (``\\dfrac``/``\\tfrac`` -> ``\\frac``, ``\\left``/
      ``\\right``, degrees, ``\\$``, ``\\%``, units after ``\\text{ ``, leading ``0`` of ``.5``,
      ``x =`` prefix, ``\\sqrt3``, ``\\frac12``, ``0.5`` -> ``\\frac{1}{2}``, ``a/b`` -> ``\\frac{a}{b}``,
      spaces);
   b. the PRM800K normalisations are equal (``\\text{}`` unwrapped, ``$``/``%`` dropped, " or " /
      " and " -> ",", million / billion / trillion, units, ``^\\circ``, outer braces, thousands
      commas, integral floats -> ints, LaTeX -> plain text, mixed numbers ``7 3/4`` -> ``7+3/4``,
      lower case); then element-wise over tuples / intervals (same brackets, same length): two
      fractions must be written identically (unreduced ``2/4`` is not ``1/2``), an integer only
      matches an integer string, else sympy simplifies ``(truth) - (given)`` to 0;
   c. ``math_equal``: numbers within relative 1e-4 of the truth, of truth/100 or truth·100
      (percentages); equal strings ignoring case / spaces / brackets; intervals and tuples element by
      element; sympy ``simplify(a - b) == 0`` or ``N(a) ≈ N(b)`` (1e-4).

Departures, each stricter than the reference (no reward hack survives): a non-finite or undefined
value (``1/0``, ``0/0``, ``oo``, ``nan``, ``zoo``, ``\\log 0``, ``1e1000``) never equals a truth
that has none (an interval's ``\\infty`` is compared as written), and sympy never calls such a
value equal; sympy only ever sees a short string of digits, at most two
distinct letters, ``+-*/^().,`` and at most three single-digit exponents (the reference's own
"sympy might hang" guards, extended to the ``math_equal`` path, and its ``eval`` of the text replaced
by sympy's parser on that alphabet only), so a hostile answer (``9^{9^{9^9}}``, 100k digits) costs
microseconds instead of the reference's 10 s signal timeout (which a worker thread cannot use);
LaTeX goes through our small converter, not pylatexenc / sympy's ANTLR LaTeX parser (neither is a
dependency here), so an exotic macro is a mismatch for the rule and is left to the LLM verifier.
"""
from __future__ import annotations

import math
import re

from megatron_rl.rewards.extract import last_boxed

_SYMPY_MAX_CHARS = 120
_NUM_MAX_CHARS = 60
_UNITS = ("degree", "cm", "centimeter", "meter", "mile", "second", "minute", "hour", "day", "week", "month",
          "year", "foot", "feet", "inch", "yard", "liter")


# ---------------------------------------------------------------- extraction

def match_answer(response: str) -> str:
    """The answer span of ``response`` (rule 1 of the module docstring)."""
    text = response
    low = lambda: text.lower()  # noqa: E731
    for marker in ("answer:", "answer is", "answers are"):
        i = low().rfind(marker)
        if i != -1:
            text = text[i + len(marker):].strip()
    for marker in ("is answer", "is the answer", "are answers", "are the answers"):
        i = low().rfind(marker)
        if i != -1:
            text = text[:i].strip()
    box = last_boxed(text)
    if box:
        text = box
    if ". " in text:
        text = text[:text.rfind(". ")].strip()
    for marker in ("be ", "is ", "are ", "=", ": ", "get ", "be\n", "is\n", "are\n", ":\n", "get\n"):
        i = low().rfind(marker)
        if i != -1:
            text = text[i + len(marker):].strip()
    return text


# ---------------------------------------------------------------- Hendrycks MATH normalisation

def _fix_fracs(s: str) -> str:
    parts = s.split("\\frac")
    out = parts[0]
    for p in parts[1:]:
        out += "\\frac"
        if p[:1] == "{" or len(p) < 2:
            out += p
            continue
        a, b, rest = p[0], p[1], p[2:]
        out += "{" + a + "}" + ("{" + b + "}" + rest if b != "{" else b + rest)
    return out


def _fix_sqrt(s: str) -> str:
    return re.sub(r"\\sqrt(\w)", r"\\sqrt{\1}", s)


def hendrycks_normalize(s: str) -> str:
    """The MATH dataset's answer normalisation (rule 2a)."""
    s = s.replace("\n", "").replace("\\!", "").replace("\\\\", "\\")
    s = s.replace("tfrac", "frac").replace("dfrac", "frac").replace("\\left", "").replace("\\right", "")
    s = s.replace("^{\\circ}", "").replace("^\\circ", "").replace("\\$", "")
    if "\\text{ " in s:
        s = s.split("\\text{ ")[0]
    s = s.replace("\\%", "").replace("%", "")
    s = s.replace(" .", " 0.").replace("{.", "{0.")
    if s.startswith("."):
        s = "0" + s
    left = s.split("=")
    if len(left) == 2 and len(left[0]) <= 2:
        s = left[1]
    s = _fix_sqrt(s).replace(" ", "")
    s = _fix_fracs(s)
    if s == "0.5":
        s = "\\frac{1}{2}"
    m = re.fullmatch(r"(-?\d+)/(\d+)", s)
    if m:
        s = "\\frac{" + m.group(1) + "}{" + m.group(2) + "}"
    return s


# ---------------------------------------------------------------- LaTeX -> plain text

def _braced(s: str, i: int) -> tuple[str, int] | None:
    """(content, index after) of the ``{...}`` group starting at ``s[i]``, or None."""
    if i >= len(s) or s[i] != "{":
        return None
    depth = 0
    for j in range(i, len(s)):
        depth += {"{": 1, "}": -1}.get(s[j], 0)
        if depth == 0:
            return s[i + 1:j], j + 1
    return None


def _arg(s: str, i: int) -> tuple[str, int] | None:
    while i < len(s) and s[i] == " ":
        i += 1
    got = _braced(s, i)
    if got is not None:
        return got
    return (s[i], i + 1) if i < len(s) else None


def latex_to_text(s: str) -> str:
    """A small LaTeX -> plain-text converter (``\\frac{a}{b}`` -> ``(a)/(b)``, ``\\sqrt[n]{x}``,
    ``\\pi``, ``\\cdot``, ``^{}``; see the module docstring for why not pylatexenc)."""
    s = s.replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac").replace("\\left", "").replace("\\right", "")
    s = re.sub(r"\\(?:text|mathrm|textbf|mbox|operatorname)\s*{([^{}]*)}", r"\1", s)
    out, i = [], 0
    while i < len(s):
        if s.startswith("\\frac", i):
            a = _arg(s, i + 5)
            b = _arg(s, a[1]) if a else None
            if not b:
                return s
            out.append(f" ({latex_to_text(a[0])})/({latex_to_text(b[0])})")
            i = b[1]
        elif s.startswith("\\sqrt", i):
            j, root = i + 5, None
            if j < len(s) and s[j] == "[":
                k = s.find("]", j)
                if k == -1:
                    return s
                root, j = s[j + 1:k], k + 1
            a = _arg(s, j)
            if not a:
                return s
            inner = latex_to_text(a[0])
            out.append(f"sqrt({inner})" if root is None else f"({inner})^(1/({latex_to_text(root)}))")
            i = a[1]
        elif s[i] == "^" and i + 1 < len(s) and s[i + 1] == "{":
            a = _braced(s, i + 1)
            if not a:
                return s
            out.append(f"^({latex_to_text(a[0])})")
            i = a[1]
        elif s[i] == "\\":
            m = re.match(r"\\([A-Za-z]+|.)", s[i:])
            name = m.group(1)
            out.append({"pi": "pi", "cdot": "*", "times": "*", "infty": "inf", "cup": "U", "div": "/", "le": "<=",
                        "ge": ">=", "leq": "<=", "geq": ">=", "ne": "!=", ",": "", ";": "", " ": "", "!": "",
                        "{": "{", "}": "}", "%": "%", "$": "$"}.get(name, name))
            i += len(m.group(0))
        elif s[i] in "{}":
            i += 1
        else:
            out.append(s[i])
            i += 1
    return "".join(out).strip()


# ---------------------------------------------------------------- PRM800K normalisation

def _strip_thousands(s: str) -> str:
    prev = None
    while prev != s:
        prev, s = s, re.sub(r"(\d),(\d\d\d)($|\D)", r"\1\2\3", s)
    return s


def _float(s: str) -> float | None:
    """A finite float of ``s`` (thousands commas allowed), else None (non-finite: None)."""
    if len(s) > _NUM_MAX_CHARS:
        return None
    try:
        v = float(_strip_thousands(s.replace("{,}", ",")).replace(",", "")) if re.search(r"\d", s) else None
    except ValueError:
        return None
    return v if v is not None and math.isfinite(v) else None


def _is_int_str(s: str) -> bool:
    v = _float(s)
    return v is not None and abs(v - round(v)) <= 1e-7


def prm_normalize(s: str) -> str:
    """PRM800K's answer normalisation (rule 2b)."""
    m = re.fullmatch(r"\\text\{(.+?)\}", s)
    if m:
        s = m.group(1)
    s = s.replace("\\%", "%").replace("\\$", "$").replace("$", "").replace("%", "")
    s = s.replace(" or ", " , ").replace(" and ", " , ")
    s = s.replace("million", "*10^6").replace("billion", "*10^9").replace("trillion", "*10^12")
    for unit in _UNITS:
        s = re.sub(f"{unit}(es)?(s)? *(\\^[0-9]+)?", "", s)
    s = re.sub(r"\^ *\\circ", "", s)
    if s[:1] == "{" and s[-1:] == "}":
        s = s[1:-1]
    s = re.sub(r",\\! *", "", s)
    v = _float(s) if re.fullmatch(r"[-+]?[\d.,eE+-]+", s.strip()) else None
    if v is not None and abs(v - round(v)) <= 1e-7:
        s = str(int(round(v)))
    if "\\" in s:
        s = latex_to_text(s)
    s = re.sub("- *", "-", s)
    s = re.sub(r"([0-9]) +([0-9])", r"\1+\2", s)
    s = s.lower()
    if _is_int_str(s):
        s = str(int(round(_float(s))))
    return s


# ---------------------------------------------------------------- sympy, guarded

_SAFE = re.compile(r"[0-9a-z+\-*/^(). ]*")
#: the only exponents sympy gets: one digit or letter, or a parenthesised small fraction (1/3, -1/2),
#: not followed by another ``^`` (PRM800K's guard against 9^9^9 and 2^{100000}, made exact)
_SMALL_EXP = re.compile(r"(-?[0-9a-z]|\(-?\d{1,2}(/\(?\d{1,2}\)?)?\))(?![0-9^])")


def _sympy_value(expr: str):
    """sympy's value of a guarded plain-text expression, or None (refused, unparsable, non-finite)."""
    import sympy  # lazy: defers sympy to the call
    from sympy.parsing import sympy_parser  # lazy: defers sympy to the call

    e = expr.strip().replace("sqrt", "\x00").replace("pi", "\x01")
    letters = {c for c in e if c.isalpha()}
    e = e.replace("\x00", "sqrt").replace("\x01", "pi")
    e = re.sub(r"(?<![a-z])\((-?\w)\)", r"\1", e.replace(" ", ""))   # (4) -> 4 (not sqrt(4)): 2^(4) passes the guard
    if (not e or len(e) > _SYMPY_MAX_CHARS or len(letters) > 2 or not _SAFE.fullmatch(e) or e.count("^") > 3
            or any(not _SMALL_EXP.match(e, i + 1) for i, c in enumerate(e) if c == "^")
            or re.search(r"\d{40,}|\de[+-]?\d{3,}", e)):          # a huge literal or exponent (1e1000000)
        return None
    try:
        v = sympy_parser.parse_expr(e.replace("^", "**"), evaluate=True, transformations=(
            sympy_parser.standard_transformations + (sympy_parser.implicit_multiplication_application,)))
    except Exception:          # sympy's parser raises anything from SyntaxError to TypeError
        return None
    if not isinstance(v, sympy.Basic) or v.has(sympy.zoo, sympy.nan, sympy.oo, -sympy.oo):
        return None
    return v


def _sympy_equal(a: str, b: str) -> bool:
    import sympy  # lazy: defers sympy to the call

    va, vb = _sympy_value(a), _sympy_value(b)
    if va is None or vb is None:
        return False
    try:
        d = sympy.simplify(va - vb)
        if d.has(sympy.zoo, sympy.nan, sympy.oo, -sympy.oo):
            return False
        if d == 0:
            return True
        if not d.free_symbols:
            na, nb = complex(sympy.N(va)), complex(sympy.N(vb))
            return all(map(math.isfinite, (na.real, na.imag, nb.real, nb.imag))) and \
                abs(na - nb) <= 1e-4 * max(abs(na), abs(nb))
    except Exception:          # sympy: TypeError for relations, ValueError / RecursionError on odd input
        return False
    return False


def _split_tuple(s: str) -> list[str]:
    s = _strip_thousands(s)
    if len(s) > 2 and s[0] in "([" and s[-1] in ")]" and not any(c in s[1:-1] for c in "()[]"):
        return [x.strip() for x in s[1:-1].split(",")]
    return [s] if s else []


def _is_frac(s: str) -> bool:
    return bool(re.fullmatch(r"-?[0-9]+.?/0*[1-9][0-9]*.?", s))


def grade_answer(given: str, truth: str) -> bool:
    """Rules 2a and 2b of the module docstring."""
    if hendrycks_normalize(given) == hendrycks_normalize(truth):
        return True
    t, g = prm_normalize(truth), prm_normalize(given)
    if t == g:
        return True
    if not g:
        return False
    te, ge = _split_tuple(t), _split_tuple(g)
    if len(te) > 1 and (t[0] != g[0] or t[-1] != g[-1]):
        return False
    if len(te) != len(ge):
        return False
    for a, b in zip(te, ge):
        if _is_frac(a) and _is_frac(b):
            ok = a == b
        elif _is_int_str(a) != _is_int_str(b):
            ok = False
        else:
            ok = _sympy_equal(a, b)
        if not ok:
            return False
    return True


def _plain(s: str) -> str:
    s = s.strip()
    if re.fullmatch(r"\$\d+(\.\d+)?", s) or re.fullmatch(r"\d+(\.\d+)?\\?%", s):
        s = s.lstrip("$").replace("\\%", "").replace("%", "")
    return latex_to_text(s) if "\\" in s else s


def math_equal(pred: str, ref: str, depth: int = 0) -> bool:
    """Rule 2c of the module docstring."""
    pred, ref = _plain(pred)[:1000], _plain(ref)
    if pred.lower() == ref.lower() or pred.replace(" ", "") == ref.replace(" ", ""):
        return bool(pred.strip())
    p, r = _float(pred), _float(ref)
    if p is not None and r is not None:
        return any(math.isclose(x, p, rel_tol=1e-4) for x in (r / 100, r, r * 100))
    if not pred or depth > 2:
        return False
    ps, rs = pred, ref
    if (pred[:1] == "[" and pred[-1:] == "]" and ref[:1] != "(") or (pred[:1] == "(" and pred[-1:] == ")" and ref[:1] != "["):
        ps, rs = ps.strip("[]()"), rs.strip("[]()")
    ps, rs = re.sub(r"[{}()]", "", ps), re.sub(r"[{}()]", "", rs)
    if ps == rs:
        return True
    if pred[0] in "([" and pred[-1] in ")]" and pred[0] == ref[:1] and pred[-1] == ref[-1:]:
        pp, rp = pred[1:-1].split(","), ref[1:-1].split(",")
        if len(pp) == len(rp) and all(math_equal(a, b, depth + 1) for a, b in zip(pp, rp)):
            return True
    if "," in pred and "," in ref:
        pp, rp = [x.strip() for x in pred.split(",")], [x.strip() for x in ref.split(",")]
        if len(pp) == len(rp):
            return all(math_equal(a, b, depth + 1) for a, b in zip(pp, rp))
    return _sympy_equal(pred.lower(), ref.lower())


def _finite_text(s: str) -> bool:
    """False for the spellings of a non-finite or undefined value (the anti-hack rule)."""
    return not re.search(r"inf|nan|zoo|∞|\boo\b|/ *0+(?![0-9.])", s.lower().replace(" ", "") + " ")


def degenerate(answer: str, truth) -> bool:
    """A non-finite / undefined answer (``1/0``, ``\\infty``, ``nan``, ``zoo``) against a truth that has
    none (an interval's ``\\infty`` stays comparable): a mismatch for the rule and for the LLM verifier."""
    forms = lambda s: (s, prm_normalize(s), latex_to_text(s))  # noqa: E731
    truth = str(truth)
    return not all(map(_finite_text, forms(answer))) and all(map(_finite_text, forms(truth)))


def prime_math_score(response: str, ground_truth) -> float:
    """1.0 when the answer of ``response`` equals ``ground_truth`` by the rules of the module docstring, else 0.0."""
    truth = str(ground_truth).strip()
    given = match_answer(str(response))
    if not truth or not given.strip():
        return 0.0
    if degenerate(given, truth):
        return 0.0
    try:
        return 1.0 if grade_answer(given, truth) or math_equal(given, truth) else 0.0
    except RecursionError:
        return 0.0
