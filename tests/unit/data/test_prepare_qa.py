"""``data prepare gsm8k`` (SCoRe) and ``gpqa_diamond`` (options shuffled per row with a fixed seed, the
``gpqa`` letter reward) on small files in the upstream schemas."""
from __future__ import annotations

import re

from tests.helpers.prepare import run, score, user_text, write_jsonl, write_parquet


def test_gsm8k_hash_answer_prompt_and_score_reward(tmp_path):
    recs = [{"question": "Natalia sold clips to 48 friends in April, and half as many in May. How many in all?",
             "answer": "In May she sold 48/2 = <<48/2=24>>24 clips.\nAltogether 48+24 = <<48+24=72>>72 clips.\n#### 72"},
            {"question": "A big number?", "answer": "It is 1,234 + 1 = 1,235.\n#### 1,235"},
            {"question": "Negative?", "answer": "5 - 8 = -3\n#### -3"},
            {"question": "No hash.", "answer": "The answer is 5."},
            {"question": None, "answer": "#### 1"},
            {"question": "A big number?", "answer": "dup\n#### 1,235"}]
    man, rows = run("gsm8k", write_parquet(tmp_path / "test-00000-of-00001.parquet", recs), tmp_path / "out")
    test = rows["test"]
    assert [r["reward_model"]["ground_truth"] for r in test] == ["72", "1235", "-3"]
    assert man["skipped"] == {"unparsable answer": 1, "null or empty question": 1}
    assert man["left_out"] == {"duplicate problem": 1}
    row = test[0]
    assert row["data_source"] == "score_gsm8k" and row["prompt"][0]["role"] == "system"
    assert user_text(row) == "Question:\n" + recs[0]["question"]
    assert row["extra_info"]["reference_solution"].endswith("72 clips.")
    assert score(row, "<think>48+24</think><answer>72</answer>") == 1.0
    assert score(row, "<think>48+24</think><answer>73</answer>") == 0.0
    assert score(test[1], "<answer>1,235</answer>") == 1.0
    _, first = run("gsm8k", tmp_path / "test-00000-of-00001.parquet", tmp_path / "first2", max_rows=2)
    assert first["test"] == test[:2]   # SCoRe's held-out set: the first N test items, in file order


def gpqa_records(n: int) -> list[dict]:
    """Idavidrein/gpqa (gpqa_diamond) columns."""
    return [{"Record ID": f"rec{i}", "Question": f"Which compound {i} has the lowest pKa? Consider ∆G° = −RT ln K.",
             "Correct Answer": f"right {i}", "Incorrect Answer 1": f"wrong {i}a", "Incorrect Answer 2": f"wrong {i}b",
             "Incorrect Answer 3": f"wrong {i}c", "Explanation": "because", "High-level domain": "Chemistry",
             "Subdomain": "Organic Chemistry"} for i in range(n)]


def _options(row: dict) -> dict[str, str]:
    return dict(re.findall(r"^([ABCD])\) (.*)$", user_text(row), re.M))


def test_gpqa_shuffle_seeded_per_row_and_letter_reward(tmp_path):
    recs = gpqa_records(40)
    recs.append({**gpqa_records(1)[0], "Record ID": "bad", "Question": "Q bad", "Incorrect Answer 3": None})
    src = write_jsonl(tmp_path / "gpqa_diamond.jsonl", recs)
    man, rows = run("gpqa_diamond", src, tmp_path / "a", seed=0)
    test = rows["test"]
    assert len(test) == 40 and man["skipped"] == {"null or empty Incorrect Answer 3": 1}
    letters = set()
    for rec, row in zip(recs, test):
        opts, gt = _options(row), row["reward_model"]["ground_truth"]
        assert sorted(opts.values()) == sorted([rec["Correct Answer"], *(rec[f"Incorrect Answer {k}"] for k in (1, 2, 3))])
        assert opts[gt] == rec["Correct Answer"] and row["data_source"] == "gpqa_diamond"
        assert user_text(row).startswith("Answer the following multiple choice question.")
        assert score(row, f"Reasoning...\nAnswer: {gt}") == 1.0
        assert score(row, f"Answer: {'A' if gt != 'A' else 'B'}") == 0.0
        letters.add(gt)
    assert letters == set("ABCD")
    _, again = run("gpqa_diamond", write_jsonl(tmp_path / "rev.jsonl", recs[::-1]), tmp_path / "b", seed=0)
    by_id = {r["extra_info"]["record_id"]: r for r in again["test"]}
    assert all(by_id[r["extra_info"]["record_id"]]["prompt"] == r["prompt"] for r in test)   # order-independent
    _, other = run("gpqa_diamond", src, tmp_path / "c", seed=1)
    assert [r["reward_model"] for r in other["test"]] != [r["reward_model"] for r in test]
