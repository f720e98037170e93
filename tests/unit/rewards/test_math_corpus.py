"""The ``math`` reward against the corpus written from the field's verifier suites (``tests/helpers/math_corpus.py``):
right on >= 97% of >= 300 cases, every degenerate answer rejected. Scored through the reward manager,
so the cases run on the reward pool as training scores them."""
from __future__ import annotations

import collections

from megatron_rl.rewards.manager import RewardManager
from tests.helpers.math_corpus import CASES

CATEGORIES = {"fractions", "nested braces", "decimals", "percent", "units", "sci-notation", "sqrt-pi", "equations",
              "intervals-sets", "tuples", "matrices", "multiple answers", "gsm8k ####", "first vs last box",
              "no answer", "very long responses", "degenerate"}


def test_corpus_shape():
    assert len(CASES) >= 300
    assert CATEGORIES <= {c["category"] for c in CASES}
    assert all(c["source"] and isinstance(c["expected"], bool) for c in CASES)
    assert {c["source"] for c in CASES} >= {"math-verify tests", "hendrycks-math equivalence", "qwen2.5-math grader"}
    assert sum(c["expected"] for c in CASES) >= 100 and sum(not c["expected"] for c in CASES) >= 100


def test_math_reward_on_the_corpus():
    vals, _ = RewardManager(default="math").values(["math"] * len(CASES), [c["response"] for c in CASES],
                                                   [c["truth"] for c in CASES])
    wrong = collections.defaultdict(list)
    for c, v in zip(CASES, vals):
        if (float(v) > 0.5) != c["expected"]:
            wrong[c["category"]].append((c["response"][-60:], c["truth"], c["expected"], getattr(v, "reason", "")))
    n_wrong = sum(len(w) for w in wrong.values())
    assert not wrong.get("degenerate"), wrong["degenerate"]
    assert 1 - n_wrong / len(CASES) >= 0.97, dict(wrong)
