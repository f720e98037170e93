"""The ``gpqa`` letter reward against openai/simple-evals' GPQA scoring rule: the FIRST match of
``(?i)Answer[ \\t]*:[ \\t]*\\$?([A-D])\\$?`` compared verbatim with the correct letter."""
from __future__ import annotations

import re

import pytest

from megatron_rl.rewards.registry import get_reward

SIMPLE_EVALS_PATTERN = r"(?i)Answer[ \t]*:[ \t]*\$?([A-D])\$?"


def simple_evals_score(response: str, correct: str) -> float:
    """simple-evals ``gpqa_eval``: ``re.search`` of the pattern, exact letter equality."""
    m = re.search(SIMPLE_EVALS_PATTERN, response)
    return 1.0 if (m.group(1) if m else None) == correct else 0.0


CASES = [
    ("Thinking...\nAnswer: B", "B"),
    ("Answer:C", "C"),
    ("Answer: $D$", "D"),
    ("answer: b", "B"),                          # matches the pattern, but 'b' != 'B' (as simple-evals)
    ("Answer: A\nWait, no. Answer: B", "B"),    # the FIRST match counts
    ("Answer: A\nWait, no. Answer: B", "A"),
    ("The correct option is (B).", "B"),         # no answer line, no box -> 0
    ("Final Answer: E", "E"),                    # E is not an option
    ("Answer:\tA", "A"),
]


@pytest.mark.parametrize("response,correct", CASES)
def test_matches_simple_evals(response, correct):
    assert float(get_reward("gpqa")(response, correct)) == simple_evals_score(response, correct)


def test_boxed_letter_when_there_is_no_answer_line():
    gpqa = get_reward("gpqa")
    assert gpqa("so the answer is \\boxed{C}", "C") == 1.0
    assert gpqa("<think>\\boxed{A}</think> hence \\boxed{\\text{(B)}}", "B") == 1.0
    assert gpqa("\\boxed{B}", "C") == 0.0
    assert gpqa("\\boxed{BC}", "B") == 0.0
    assert gpqa("Answer: A then \\boxed{B}", "B") == 0.0    # the answer line wins
    assert gpqa("", "A").reason == "no answer found"
