"""Knights & Knaves generator/verifier and the SCoRe format rewards (spec §3.11 vectors)."""
from __future__ import annotations

import itertools

import pytest

from megatron_rl.rewards.format import format_and_match, strict_format_and_match
from megatron_rl.rewards.knights_knaves import _truth, generate_puzzle, parse_roles, verify_kk


@pytest.mark.parametrize("n", [2, 3, 4, 5, 6, 7, 8, 9, 10, 11])
def test_every_puzzle_has_exactly_one_solution(n):
    for seed in range(3 if n < 9 else 1):
        p = generate_puzzle(n, seed)
        sols = [a for a in itertools.product((True, False), repeat=n)
                if all(_truth(s, a) == a[i] for i, s in enumerate(p["statements"]))]
        assert len(sols) == 1
        assert {p["names"][i]: "knight" if k else "knave" for i, k in enumerate(sols[0])} == p["solution"]


def test_verifier_accepts_paraphrases_rejects_partial():
    sol = {"Alice": "knight", "Bob": "knave", "Carol": "knight"}
    assert verify_kk("\\boxed{Alice is a knight, Bob is a knave, Carol is a knight}", sol) == 1.0
    assert verify_kk("<answer>bob: knave\nalice = knight\nCarol is a Knight</answer>", sol) == 1.0
    assert verify_kk("\\boxed{Alice is a knight, Bob is a knave}", sol) == 0.0           # partial
    assert verify_kk("\\boxed{Alice is a knight, Bob is a knight, Carol is a knight}", sol) == 0.0
    assert parse_roles("Alice is a knight. Alice is a knave.") == {"Alice": "knight"}     # first wins
    with pytest.raises(ValueError):
        verify_kk("x", {})


@pytest.mark.parametrize("pred,target,fm,strict", [
    ("<think>7-3=4</think>\n<answer>4</answer>", "4", 1.0, 1.0),
    ("<think>7-3=4</think> so <answer>4</answer> done", "4", 1.0, 0.5),
    ("<think>7-3=5</think><answer>5</answer>", "4", 0.5, 0.5),
    ("The answer is 4", "4", 0.5, 0.5),
    ("<think>a</think><answer>4</answer><answer>4</answer>", "4", 0.75, 0.5),
    ("<think>x</think><answer>1,234.</answer>", "#### 1234", 1.0, 1.0),
    ("<think>unclosed <answer>4</answer>", "4", 0.75, 0.5),
])
def test_score_rewards_spec_vectors(pred, target, fm, strict):
    assert format_and_match(pred, target) == fm
    assert strict_format_and_match(pred, target) == strict


def test_kk_parquet_round_trip(tmp_path):
    import pyarrow.parquet as pq

    from megatron_rl.data.synthetic import write_knights_knaves
    from megatron_rl.rewards.manager import RewardManager

    p = write_knights_knaves(tmp_path / "kk9.parquet", 9, count=2, seed=1, split="ood")
    rows = pq.read_table(p).to_pylist()
    assert [r["extra_info"]["n_people"] for r in rows] == [9, 9]
    gt = rows[0]["reward_model"]["ground_truth"]
    from megatron_rl.rewards.manager import get_reward
    assert get_reward(RewardManager().name_of("knights_knaves"))("\\boxed{" + gt + "}", gt) == 1.0
