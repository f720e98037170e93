"""verl's rule rewards for the ``data_source`` names its ``default_compute_score`` scores (verl
``verl/utils/reward_score/``, read at verl 0.9.1 and verl-project/verl commit 0515376a; the verdicts of
``tests/unit/rewards/data/verl_verdicts.json`` come from verl 0.9.1 itself). Our code; the rules:

**GSM8K** (``openai/gsm8k``, verl ``gsm8k.py``; reward 1 / 0):

- only the last 300 characters of the response are read;
- strict mode (verl's default): the answer is the number of the LAST ``#### N`` (``#### `` then
  ``-?[0-9.,]+``) with ``,`` and ``$`` removed, compared as text with the ground truth; none -> 0;
- flexible mode (reward ``gsm8k_flexible``): the last ``-?[0-9.,]+`` that is not ``""`` / ``"."``.

Departure (reward ``gsm8k_strict``, the default for ``openai/gsm8k``; ``gsm8k_verl`` is verl's rule exactly):
a hedged final line — another digit after the number on the ``####`` line (``#### 63 or 72``, ``#### 63, 72``,
``#### 63 / 72``) — scores 0 ("hedged"); verl credits the first number of such a line.

**MATH** (``lighteval/MATH``, ``DigitalLearningGmbH/MATH-lighteval``, ``HuggingFaceH4/MATH-500``; verl
``math_reward.py``, the Hendrycks MATH grader; reward 1 / 0): the answer is the last ``\\boxed{…}``
(brace-matched; ``\\boxed X`` up to the next ``$`` when the response has that form anywhere; an ``\\fbox``
alone is no answer), compared with the ground truth after :func:`hendrycks_strip` of both; when the
normalisation fails on either side (``\\text{ `` twice, a bare trailing ``\\frac`` or ``\\sqrt``) the raw
strings are compared. Reward ``hendrycks_math``; no departure.

**math_dapo** (``math_dapo``, ``math``, ``math_dapo_reasoning`` and every name starting with ``aime``; verl
``math_dapo.py`` as of 0.9.1, reward +1 / −1): the last 300 characters; the last ``Answer: …`` line,
normalised as Minerva's ``normalize_final_answer`` on both sides (``rewards/dapo.py``); with no such line,
the last ``\\boxed{…}`` of the last 100 characters compared verbatim with the ground truth. Reward
``math_dapo``; ``dapo`` is the rule without the box fallback (verl before Aug 2026, the DAPO recipe).

**PRIME's math** (``numina_*``, verl ``prime_math``): reward ``prime_math`` (``rewards/prime_math.py``, with the
departures listed there).
"""
from __future__ import annotations

import re

from megatron_rl.rewards.dapo import dapo_verdict
from megatron_rl.rewards.extract import braced
from megatron_rl.rewards.verdict import Verdict

GSM8K_CLIP = 300
"""Characters of the response verl's GSM8K rule reads (its ``_SOLUTION_CLIP_CHARS``)."""
_HASH = re.compile(r"#### (-?[0-9.,]+)")
_NUMBER = re.compile(r"-?[0-9.,]+")


# ---------------------------------------------------------------- GSM8K

def gsm8k_answer(response: str, flexible: bool = False) -> tuple[str | None, str]:
    """``(answer, rest of its line)`` by verl's GSM8K rule (module docstring); answer None when absent."""
    text = response[-GSM8K_CLIP:]
    if flexible:
        nums = [m for m in _NUMBER.findall(text) if m not in ("", ".")]
        return (nums[-1] if nums else None), ""
    found = list(_HASH.finditer(text))
    if not found:
        return None, ""
    m = found[-1]
    return m.group(1).replace(",", "").replace("$", ""), text[m.end():].split("\n", 1)[0]


def gsm8k_verdict(response: str, ground_truth, flexible: bool = False, refuse_hedge: bool = True) -> Verdict:
    """1 / 0 by verl's GSM8K rule; ``refuse_hedge``: the hedged-line departure (module docstring)."""
    ans, rest = gsm8k_answer(response, flexible)
    if ans is None:
        return Verdict(0.0, "no answer found")
    if refuse_hedge and not flexible and any(ch.isdigit() for ch in rest):
        return Verdict(0.0, "hedged")
    ok = ans == str(ground_truth)
    return Verdict(1.0 if ok else 0.0, "matched" if ok else "mismatch")


def gsm8k_strict_reward(response: str, ground_truth) -> Verdict:
    """Registered as ``gsm8k_strict`` (the default for ``openai/gsm8k``): verl's strict rule, hedges refused."""
    return gsm8k_verdict(response, ground_truth)


def gsm8k_verl_reward(response: str, ground_truth) -> Verdict:
    """Registered as ``gsm8k_verl``: verl's strict rule exactly."""
    return gsm8k_verdict(response, ground_truth, refuse_hedge=False)


def gsm8k_flexible_reward(response: str, ground_truth) -> Verdict:
    """Registered as ``gsm8k_flexible``: verl's ``method="flexible"`` (the last number)."""
    return gsm8k_verdict(response, ground_truth, flexible=True)


# ---------------------------------------------------------------- MATH (Hendrycks)

class _Unnormalisable(ValueError):
    """The Hendrycks normalisation cannot read the string (verl then compares the raw strings)."""


def hendrycks_box(response: str) -> str | None:
    """The answer verl's MATH rule reads (module docstring), or None."""
    if "\\boxed " in response:
        return response.split("\\boxed ")[-1].split("$")[0]
    i = response.rfind("\\boxed")
    if i < 0:
        return None          # an \fbox is found by verl but then refused by its unwrapping: no answer
    return braced(response, i + len("\\boxed"))   # verl refuses a box whose group does not open right after it


def _sqrt_braces(s: str) -> str:
    if "\\sqrt" not in s:
        return s
    head, *parts = s.split("\\sqrt")
    for p in parts:
        if not p:
            raise _Unnormalisable("bare \\sqrt")
        head += "\\sqrt" + (p if p[0] == "{" else "{" + p[0] + "}" + p[1:])
    return head


def _frac_braces(s: str) -> str:
    head, *parts = s.split("\\frac")
    for p in parts:
        if not p:
            raise _Unnormalisable("bare \\frac")
        if p[0] == "{":
            head += "\\frac" + p
            continue
        if len(p) < 2:
            return s
        a, b, rest = p[0], p[1], p[2:]
        head += "\\frac{" + a + "}" + ("{" + b + "}" + rest if b != "{" else b + rest)
    return head


def _slash_fraction(s: str) -> str:
    parts = s.split("/")
    if len(parts) != 2:
        return s
    try:
        a, b = int(parts[0]), int(parts[1])
    except ValueError:
        return s
    return f"\\frac{{{a}}}{{{b}}}" if s == f"{a}/{b}" else s


def hendrycks_strip(s: str) -> str:
    """The Hendrycks MATH normalisation (verl's ``strip_string``): drop line breaks, ``\\!``, ``\\left`` /
    ``\\right``, degree marks, ``\\$``, a right-hand ``\\text{ unit}``, ``\\%``; ``\\\\`` -> ``\\``;
    ``tfrac`` / ``dfrac`` -> ``frac``; ``.5`` -> ``0.5``; a short ``k =`` prefix; ``\\sqrt3`` ->
    ``\\sqrt{3}``; spaces; ``\\frac12`` -> ``\\frac{1}{2}``; ``0.5`` -> ``\\frac{1}{2}``; ``a/b`` of
    integers -> ``\\frac{a}{b}``. Raises :class:`_Unnormalisable` where verl's would raise."""
    s = s.replace("\n", "").replace("\\!", "").replace("\\\\", "\\").replace("tfrac", "frac").replace("dfrac", "frac")
    s = s.replace("\\left", "").replace("\\right", "").replace("^{\\circ}", "").replace("^\\circ", "").replace("\\$", "")
    if "\\text{ " in s:
        units = s.split("\\text{ ")
        if len(units) != 2:
            raise _Unnormalisable("two \\text{ } units")
        s = units[0]
    s = s.replace("\\%", "").replace(" .", " 0.").replace("{.", "{0.")
    if not s:
        return s
    if s[0] == ".":
        s = "0" + s
    sides = s.split("=")
    if len(sides) == 2 and len(sides[0]) <= 2:
        s = sides[1]
    s = _frac_braces(_sqrt_braces(s).replace(" ", ""))
    if s == "0.5":
        s = "\\frac{1}{2}"
    return _slash_fraction(s)


def hendrycks_equiv(answer: str, truth: str) -> bool:
    """verl's ``is_equiv``: equal after :func:`hendrycks_strip`, else (unreadable) equal as written."""
    try:
        return hendrycks_strip(answer) == hendrycks_strip(truth)
    except _Unnormalisable:
        return answer == truth


def hendrycks_math_reward(response: str, ground_truth) -> Verdict:
    """Registered as ``hendrycks_math`` (module docstring)."""
    ans = hendrycks_box(response)
    if ans is None:
        return Verdict(0.0, "no answer found")
    ok = hendrycks_equiv(ans, str(ground_truth))
    return Verdict(1.0 if ok else 0.0, "matched" if ok else "mismatch")


# ---------------------------------------------------------------- math_dapo

def math_dapo_reward(response: str, ground_truth) -> Verdict:
    """Registered as ``math_dapo``: the ``Answer:`` line, else the last box of the last 100 characters
    verbatim (verl 0.9.1; module docstring)."""
    return dapo_verdict(response, ground_truth, box_fallback=True)
