"""The ``dapo`` reward: verl's ``math_dapo`` semantics (verl ``verl/utils/reward_score/math_dapo.py``,
the DAPO recipe's outcome reward on DAPO-Math-17k), reward **+1 / −1**.

1. Only the last 300 characters of the response are read (verl: "the longest answer in MATH-500 has
   159 characters").
2. The answer is the capture of the LAST match of ``(?i)Answer\\s*:\\s*([^\\n]+)`` (DAPO's prompt asks
   for "Answer: $Answer" on the last line); none -> ``[INVALID]``. A ``\\boxed{}`` alone is not an answer.
3. Both sides are normalised as Minerva's ``normalize_final_answer`` (verl's table, see
   :func:`normalize_final_answer`) and compared as strings: equal -> +1, else −1.

With ``algo.<kind>.overlong_enable`` the sampling path adds DAPO's soft overlong penalty to this value
(``rollout/rollouts.overlong_shaping``), as the recipe's reward manager does; ``correct`` stays the
binary outcome (reward > 0.5). ``strict_box`` (reward ``dapo_strict_box``): verl's
``strict_box_verify`` — the last box of the last 100 characters, compared verbatim with the truth.
"""
from __future__ import annotations

import re

from megatron_rl.rewards.verdict import Verdict

_ANSWER = re.compile(r"(?i)Answer\s*:\s*([^\n]+)")
#: (before, after) replacements, in verl's order (note: "an " / "a " are removed anywhere, as there)
SUBSTITUTIONS = [("an ", ""), ("a ", ""), (".$", "$"), ("\\$", ""), ("\\ ", ""), (" ", ""), ("mbox", "text"),
                 (",\\text{and}", ","), ("\\text{and}", ","), ("\\text{m}", "\\text{}")]
#: substrings deleted, in verl's order (unit words, ``\\text{}`` forms, degree marks, spacing commands)
REMOVED_EXPRESSIONS = ["square", "ways", "integers", "dollars", "mph", "inches", "hours", "km", "units", "\\ldots", "sue",
                       "points", "feet", "minutes", "digits", "cents", "degrees", "cm", "gm", "pounds", "meters", "meals",
                       "edges", "students", "childrentickets", "multiples", "\\text{s}", "\\text{.}", "\\text{\ns}",
                       "\\text{}^2", "\\text{}^3", "\\text{\n}", "\\text{}", r"\mathrm{th}", r"^\circ", r"^{\circ}", r"\;",
                       r",\!", "{,}", '"', "\\dots"]


def normalize_final_answer(s: str) -> str:
    """Minerva normalisation as verl applies it: keep what follows the last ``=``; apply
    :data:`SUBSTITUTIONS` then delete :data:`REMOVED_EXPRESSIONS`; keep the first ``$…$`` span; unwrap
    ``\\text{}``, ``\\textbf{}``, ``\\overline{}``, ``\\boxed{}``; ``\\fracab`` -> ``\\frac{a}{b}``,
    ``\\sqrta`` -> ``\\sqrt{a}``; drop ``$``; a comma-grouped integer loses its commas; strip."""
    s = s.split("=")[-1]
    for before, after in SUBSTITUTIONS:
        s = s.replace(before, after)
    for expr in REMOVED_EXPRESSIONS:
        s = s.replace(expr, "")
    s = re.sub(r"(.*?)(\$)(.*?)(\$)(.*)", "$\\3$", s)
    s = re.sub(r"(\\text\{)(.*?)(\})", "\\2", s)
    s = re.sub(r"(\\textbf\{)(.*?)(\})", "\\2", s)
    s = re.sub(r"(\\overline\{)(.*?)(\})", "\\2", s)
    s = re.sub(r"(\\boxed\{)(.*)(\})", "\\2", s)
    s = re.sub(r"(frac)([^{])(.)", "frac{\\2}{\\3}", s)
    s = re.sub(r"(sqrt)([^{])", "sqrt{\\2}", s)
    s = s.replace("$", "")
    if s.replace(",", "").isdigit():
        s = s.replace(",", "")
    return s.strip()


def _last_box(text: str) -> str | None:
    """verl's ``last_boxed_only_string`` + ``remove_boxed``: the last ``\\boxed{`` brace-matched."""
    i = text.rfind("\\boxed{")
    if i < 0:
        return None
    depth = 0
    for k in range(i, len(text)):
        if text[k] == "{":
            depth += 1
        elif text[k] == "}":
            depth -= 1
            if depth == 0:
                return text[i + len("\\boxed{"):k]
    return None


def dapo_verdict(response: str, ground_truth, strict_box: bool = False) -> Verdict:
    """+1 / −1 as verl's ``math_dapo.compute_score`` (module docstring)."""
    gt = str(ground_truth)
    if strict_box:
        pred = _last_box(response[-300:][-100:])
        ok = pred is not None and pred == gt
    else:
        m = _ANSWER.findall(response[-300:])
        if not m:
            return Verdict(-1.0, "no answer found")
        ok = normalize_final_answer(m[-1]) == normalize_final_answer(gt)
    return Verdict(1.0 if ok else -1.0, "matched" if ok else "mismatch")


def dapo_reward(response: str, ground_truth) -> Verdict:
    """Registered as ``dapo`` (module docstring)."""
    return dapo_verdict(response, ground_truth)


def dapo_strict_box_reward(response: str, ground_truth) -> Verdict:
    """Registered as ``dapo_strict_box``: verl's ``strict_box_verify=True`` variant."""
    return dapo_verdict(response, ground_truth, strict_box=True)
