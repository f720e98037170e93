"""The ``gpqa`` reward: the chosen letter of a multiple-choice answer against the correct letter, as
openai/simple-evals' ``gpqa_eval.py`` scores GPQA (reward 1 / 0).

1. The answer is the FIRST match of ``(?i)Answer[ \\t]*:[ \\t]*\\$?([A-D])\\$?`` in the response
   (simple-evals' ``ANSWER_PATTERN_MULTICHOICE`` with ``re.search``); its letter is compared verbatim
   (a lower-case ``answer: b`` matches the pattern but not ``B``, as there).
2. Only when no such line exists: the content of the last ``\\boxed{}`` when it is one letter A-D
   (``\\text{}``, ``\\textbf{}`` and parentheses peeled) — for prompts in the boxed style.
3. reward = 1 iff the letter equals the ground truth (``A``..``D``), else 0; a ground truth that is not
   one of A-D scores 0 ("no answer found" reason for a response without a letter).
"""
from __future__ import annotations

import re

from megatron_rl.rewards.extract import last_boxed, strip_think
from megatron_rl.rewards.verdict import Verdict

ANSWER_PATTERN_MULTICHOICE = r"(?i)Answer[ \t]*:[ \t]*\$?([A-D])\$?"
_WRAP = re.compile(r"^\\(?:text|textbf|mathrm|mathbf)\{(.*)\}$")


def chosen_letter(response: str) -> str | None:
    """The letter the response chose (steps 1-2 of the module docstring), or None."""
    m = re.search(ANSWER_PATTERN_MULTICHOICE, response)
    if m:
        return m.group(1)
    box = last_boxed(strip_think(response))
    if box is None:
        return None
    s = box.strip()
    for _ in range(3):
        w = _WRAP.match(s)
        s = (w.group(1) if w else s).strip().strip("()").strip()
    return s if s in ("A", "B", "C", "D") else None


def gpqa_reward(response: str, ground_truth) -> Verdict:
    """Registered as ``gpqa`` (module docstring)."""
    letter = chosen_letter(str(response))
    if letter is None:
        return Verdict(0.0, "no answer found")
    return Verdict(1.0, "matched") if letter == str(ground_truth).strip() else Verdict(0.0, "mismatch")
