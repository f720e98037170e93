"""``data prepare dapo_math_17k`` (verl columns upstream, repeated rows de-duplicated, DAPO's "Answer:"
prompt paired with the ``dapo`` reward) and ``verl`` (a released verl parquet checked and copied as it is)."""
from __future__ import annotations

from tests.helpers.prepare import run, score, user_text, write_parquet

#: the user turn of BytedTsinghua-SIA/DAPO-Math-17k, verbatim
DAPO_TURN = ("Solve the following math problem step by step. The last line of your response should be of the form "
             "Answer: $Answer (no quotes) where $Answer is the answer to the problem.\n\n{}\n\n"
             "Remember to put your answer on its own line after \"Answer:\".")


def dapo_record(problem: str, gt, uid: str) -> dict:
    return {"data_source": "math_dapo", "prompt": [{"content": DAPO_TURN.format(problem), "role": "user"}],
            "ability": "MATH", "reward_model": {"ground_truth": gt, "style": "rule-lighteval/MATH_v2"},
            "extra_info": {"index": uid}}


def test_dapo_dedupes_the_repeated_release_and_pairs_with_dapo_reward(tmp_path):
    problems = [("In triangle $ABC$, $\\sin \\angle A = \\frac{4}{5}$ ... Find $m+n$.", "34"),
                ("Let $f(x)=x^2$. Compute $f(f(2))$ — ünïcode.", "16"),
                ("How many integers $n$ satisfy $|n| < 3$?", "5")]
    recs = [dapo_record(p, gt, f"uid-{i}") for _ in range(3) for i, (p, gt) in enumerate(problems)]   # repeated x3
    recs.append(dapo_record("Null truth.", None, "uid-x"))
    recs.append({**dapo_record("ignored", "1", "uid-y"), "prompt": []})
    man, rows = run("dapo_math_17k", write_parquet(tmp_path / "dapo-math-17k.parquet", recs), tmp_path / "out", seed=5)
    train = rows["train"]
    assert len(train) == 3 and man["left_out"] == {"duplicate problem": 6}
    assert man["skipped"] == {"null or empty reward_model.ground_truth": 1, "null or empty prompt": 1}
    by_problem = dict(problems)
    for row in train:
        assert row["data_source"] == "math_dapo"
        assert user_text(row) == DAPO_TURN.format(row["extra_info"]["problem"])   # the upstream turn, byte for byte
        gt = by_problem[row["extra_info"]["problem"]]
        assert row["reward_model"]["ground_truth"] == gt and row["extra_info"]["uid"].startswith("uid-")
        assert score(row, f"Thinking...\nAnswer: {gt}") == 1.0
        assert score(row, "Thinking...\nAnswer: 999") == -1.0        # DAPO's +1 / -1
        assert score(row, f"\\boxed{{{gt}}}") == -1.0               # a box alone is not DAPO's answer
    _, again = run("dapo_math_17k", tmp_path / "dapo-math-17k.parquet", tmp_path / "again", seed=5)
    assert again == rows


def kk_record(i: int, **kw) -> dict:
    """A Logic-RL K&K row (zhiyuanhubj/Logic-RL ``examples/data_preprocess/kk.py`` columns)."""
    return {"data_source": "kk_logic", "prompt": [{"content": f"<|im_start|>system ... puzzle {i}", "role": "user"}],
            "ability": "logic", "reward_model": {"ground_truth": {"solution_text_format": "(1) Zoey is a knight",
                                                                  "statements": "(('telling-truth', 0),)"},
                                                 "style": "rule"},
            "extra_info": {"split": "train", "index": i}, **kw}


def test_verl_passthrough_keeps_rows_as_they_are(tmp_path):
    good = [kk_record(i) for i in range(3)]
    bad = [kk_record(10, data_source=None), kk_record(11, prompt=None),
           kk_record(12, reward_model={"ground_truth": None, "style": "rule"})]
    src = write_parquet(tmp_path / "kk" / "train.parquet", good + bad)
    man, rows = run("verl", src, tmp_path / "out")
    assert rows == {"train": good}
    assert man["skipped"] == {"null or empty data_source": 1, "null or empty prompt": 1,
                              "null or empty reward_model.ground_truth": 1}
    _, test = run("verl", src, tmp_path / "out_test", split="kk_4to8_test")
    assert list(test) == ["kk_4to8_test"]


def test_verl_passthrough_refuses_unmapped_sources_unless_a_reward_is_named(tmp_path):
    """Issue 40: a passthrough row whose data_source has no reward is refused (one line, its count, nothing
    written); ``--reward-by-source SRC=NAME`` writes the choice into those rows' ``reward_model.reward``."""
    import pytest

    src = write_parquet(tmp_path / "mine.parquet", [kk_record(i, data_source="mydata") for i in range(3)]
                        + [kk_record(9, data_source="openai/gsm8k")])
    with pytest.raises(ValueError, match=r"data prepare verl: no reward for data_source 'mydata' \(3 rows, verl has no "
                                         r"scorer for it either\); choose one: --reward-by-source mydata=NAME"):
        run("verl", src, tmp_path / "out")
    assert not (tmp_path / "out").exists()
    _, rows = run("verl", src, tmp_path / "out", reward_by_source={"mydata": "kk"})
    named = {r["data_source"]: r["reward_model"].get("reward") for r in rows["train"]}
    assert named == {"mydata": "kk", "openai/gsm8k": None}   # verl's own name keeps verl's rule (no reward written)
