"""``dapo`` = verl's ``math_dapo`` (verl/utils/reward_score/math_dapo.py): "Answer:" extraction from the
last 300 characters, Minerva normalisation, +1 / −1; combined with DAPO's overlong shaping on the
sampling path as the recipe does. Expected values follow math_dapo's rules and its normalisation table."""
from __future__ import annotations

import types

import pytest
import torch

from megatron_rl.rewards.dapo import dapo_verdict, normalize_final_answer
from megatron_rl.rewards.manager import RewardManager, get_reward

WORK = "Let me compute. 17 + 17 = 34, and checking the constraint it holds.\n"


@pytest.mark.parametrize("response,truth,expected", [
    (WORK + "Answer: 34", "34", 1), (WORK + "Answer: 33", "34", -1),
    (WORK + "answer: 34", "34", 1), (WORK + "ANSWER:34", "34", 1), (WORK + "Answer : 34", "34", 1),
    (WORK + "Answer:\n34", "34", 1),                               # \s* after the colon crosses the newline
    (WORK + "Answer: 3\nOn reflection that is wrong.\nAnswer: 5", "5", 1),   # the last "Answer:" line wins
    (WORK + "Answer: 3\nOn reflection that is wrong.\nAnswer: 5", "3", -1),
    (WORK + "So the result is $\\boxed{34}$.", "34", -1),          # boxed only: no "Answer:" line
    (WORK + "Answer: $\\boxed{34}$", "34", 1), (WORK + "Answer: $34$", "34", 1), (WORK + "Answer: 34.", "34", -1),
    (WORK + "Answer: 1,000", "1000", 1), (WORK + "Answer: x = 5", "5", 1), (WORK + "Answer: 5 dollars", "5", 1),
    (WORK + "Answer: \\frac12", "\\frac{1}{2}", 1), (WORK + "Answer: \\sqrt2", "\\sqrt{2}", 1),
    (WORK + "Answer: 90^\\circ", "90", 1), (WORK + "Answer: \\text{Monday}", "Monday", 1),
    (WORK + "Answer: 0.5", "\\frac{1}{2}", -1),                   # string semantics: no numeric equivalence
    (WORK + "Answer: 10\\text{ cm}", "10", 1), (WORK + "Answer: \\$18.90", "18.90", 1),
    (WORK + "Answer: 1/0", "34", -1), (WORK + "Answer: \\infty", "34", -1),
    ("Answer: 34\n" + "x" * 400, "34", -1),                       # outside the last 300 characters
    ("x" * 5000 + "\nAnswer: 34", "34", 1), ("", "34", -1), ("Answer:", "34", -1),
])
def test_dapo_reward(response, truth, expected):
    assert get_reward("dapo")(response, truth) == expected


@pytest.mark.parametrize("raw,norm", [
    ("x = \\frac{1}{2}", "\\frac{1}{2}"), ("\\text{(A)}", "(A)"), ("p \\text{ and } q", "p,q"), ("12 \\text{ and } 5", "125"), ("1,234", "1234"),
    ("1,2", "12"), ("5 \\mbox{ cm}", "5"), ("45^{\\circ}", "45"), ("\\fracab", "\\frac{a}{b}"), ("\\sqrt3x", "\\sqrt{3}x"),
    ("$\\overline{12}$", "12"), ("an apple", "apple"), ("banana split", "banansplit"), ("\\$ 7", "7"), ("10\\;000", "10000"),
])
def test_normalize_final_answer_table(raw, norm):
    """math_dapo's normalisation, quirks included (``"an "``/``"a "`` removed anywhere; ``1,2`` -> ``12``)."""
    assert normalize_final_answer(raw) == norm


def test_strict_box_variant():
    r = get_reward("dapo_strict_box")
    assert r(WORK + "so $\\boxed{34}$", "34") == 1.0
    assert r(WORK + "Answer: 34", "34") == -1.0
    assert r("$\\boxed{34}$" + " " * 150, "34") == -1.0           # strict box: only the last 100 characters
    assert dapo_verdict(WORK + "Answer: 34", "34").reason == "matched"


def test_dapo_with_overlong_shaping_and_correct_flag():
    """The recipe's reward: +1/−1 plus the soft overlong penalty (buffer 4 of max 10 tokens, factor 1);
    ``correct`` is the binary outcome; the DAPO-Math-17k data source maps to ``dapo``."""
    from megatron_rl.data.dataset import PromptRow
    from megatron_rl.rollout import rollouts as R

    lens = [3, 6, 8, 10, 10]
    texts = ["Answer: 34", "Answer: 34", "Answer: 34", "Answer: 34", "Answer: 7"]
    rows = [PromptRow(i, (1,), "math_dapo", "34", {}) for i in range(5)]
    ro = R.Rollouts.from_lists(rows, [[1]] * 5, [[2] * n for n in lens], [[0.0] * n for n in lens], ["stop"] * 5,
                    torch.arange(5), texts)
    ro = R.score(ro, RewardManager())
    assert ro.rewards.tolist() == [1, 1, 1, 1, -1] and ro.correct.tolist() == [True] * 4 + [False]
    ro = R.overlong_shaping(ro, types.SimpleNamespace(overlong_buffer_len=4, overlong_penalty_factor=1.0), 10)
    assert ro.rewards.tolist() == pytest.approx([1.0, 1.0, 0.5, 0.0, -2.0])
    assert ro.correct.tolist() == [True] * 4 + [False]
