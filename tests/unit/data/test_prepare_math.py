"""``data prepare`` of the math sources on small files in the upstream schemas (DeepMath-103K, NuminaMath,
MATH-500, AIME 2024 / 2025, AMC23, OlympiadBench, Hendrycks MATH, RLCSD's evaluation file): rows,
prompts, data sources, the reference reward (ground truth -> 1, a wrong answer -> 0), splits, skips."""
from __future__ import annotations

import pytest

from tests.helpers.prepare import run, score, user_text, write_jsonl, write_parquet

QWEN_MATH = "Please reason step by step, and put your final answer within \\boxed{}."


def deepmath_rows() -> list[dict]:
    """zwhe99/DeepMath-103K columns, with awkward rows."""
    def r(q, a, d, sol="Work.\n\nSo \\boxed{ANS}.", topic="Mathematics -> Algebra"):
        return {"question": q, "final_answer": a, "difficulty": d, "topic": topic,
                "r1_solution_1": sol.replace("ANS", str(a)), "r1_solution_2": "second", "r1_solution_3": "third"}
    return [
        r("Compute $\\int_0^1 x\\,dx$.", "\\frac{1}{2}", 7.0),                 # LaTeX answer with braces
        r("Évaluer la limite ∑ 1/n² pour n ≥ 1.", "\\frac{\\pi^2}{6}", 8.5),    # unicode problem
        r("Find all $x$ with $x^2=4$.", "\\{-2, 2\\}", 10.0),                  # escaped set braces
        r("Easy problem.", "3", 4.0),                                          # out of the band
        r("Compute $\\int_0^1 x\\,dx$.", "\\frac{1}{2}", 7.5),                 # duplicate
        r("", "1", 8.0),                                                       # empty question
        r("Null answer?", None, 8.0),                                          # null answer
        r("Unbalanced.", "\\frac{1}{2", 8.0),                                  # unparsable answer
        {**r("No first solution.", "5", 9.0), "r1_solution_1": None},           # falls back to r1_solution_2
        {**r("No solution at all.", "5", 9.0), "r1_solution_1": "", "r1_solution_2": None, "r1_solution_3": " "},
        {**r("Null difficulty.", "5", 9.0), "difficulty": None},
    ]


def test_deepmath_band_prompt_reward_and_counts(tmp_path):
    src = write_parquet(tmp_path / "deepmath" / "data" / "train-00000-of-00001.parquet", deepmath_rows())
    man, rows = run("deepmath_filtered_level7_10", src.parent.parent, tmp_path / "out", seed=3)
    train = rows["train"]
    assert set(rows) == {"train"} and len(train) == 4 == man["outputs"]["train"]["rows"]
    assert man["skipped"] == {"null or empty question": 1, "null or empty final_answer": 1, "unparsable answer": 1,
                              "null or empty r1_solution_1..3": 1, "null or empty difficulty": 1}
    assert man["left_out"] == {"difficulty outside level7_10": 1, "duplicate problem": 1}
    for row in train:
        q = row["extra_info"]["problem"]
        assert row["prompt"] == [{"role": "user", "content": f"Problem: {q}\n\n{QWEN_MATH}"}]
        assert row["data_source"] == "deepmath" and row["reward_model"]["style"] == "rule"
        assert row["extra_info"]["split"] == "train" and 7.0 <= float(row["extra_info"]["difficulty"]) <= 10.0
        gt = row["reward_model"]["ground_truth"]
        assert row["extra_info"]["reference_solution"]
        assert score(row, f"<think>ok</think> The answer is $\\boxed{{{gt}}}$.") == 1.0
        assert score(row, "The answer is $\\boxed{42}$.") == 0.0
    by_q = {r["extra_info"]["problem"]: r for r in train}
    assert by_q["No first solution."]["extra_info"]["reference_solution"] == "second"
    assert by_q["Évaluer la limite ∑ 1/n² pour n ≥ 1."]["reward_model"]["ground_truth"] == "\\frac{\\pi^2}{6}"
    assert [r["extra_info"]["index"] for r in train] == [0, 1, 2, 3]


def test_deepmath_bands_cap_and_seeded_shuffle(tmp_path):
    recs = [{"question": f"Problem {i}?", "final_answer": str(i), "difficulty": 5.0 + (i % 6) * 0.5, "topic": "t",
             "r1_solution_1": f"\\boxed{{{i}}}", "r1_solution_2": "", "r1_solution_3": ""} for i in range(40)]
    src = write_jsonl(tmp_path / "dm.jsonl", recs)
    bands = {}
    for band, (lo, hi) in {"level5_7": (5, 7), "level6_8": (6, 8), "level7_10": (7, 10)}.items():
        _, rows = run(f"deepmath_filtered_{band}", src, tmp_path / band)
        bands[band] = {r["extra_info"]["problem"] for r in rows["train"]}
        assert bands[band] == {r["question"] for r in recs if lo <= r["difficulty"] <= hi}
    _, a = run("deepmath_filtered_level5_7", src, tmp_path / "a", seed=1, max_rows=10)
    _, b = run("deepmath_filtered_level5_7", src, tmp_path / "b", seed=1, max_rows=10)
    _, c = run("deepmath_filtered_level5_7", src, tmp_path / "c", seed=2, max_rows=10)
    assert a == b and len(a["train"]) == 10 and a != c
    assert (tmp_path / "a" / "train.parquet").read_bytes() == (tmp_path / "b" / "train.parquet").read_bytes()
    _, v = run("deepmath_filtered_level5_7", src, tmp_path / "v", seed=1, val_rows=3)
    probs = [r["extra_info"]["problem"] for r in v["val"] + v["train"]]
    assert len(v["val"]) == 3 and len(set(probs)) == len(probs) and {r["extra_info"]["split"] for r in v["val"]} == {"val"}


def test_deepmath_default_cap_is_rlcsd_60000():
    from megatron_rl.data.prepare.registry import get_source

    assert get_source("deepmath_filtered_level6_8").max_rows == 60000


def test_numinamath_papo_prompt_reference_solution_and_reward(tmp_path):
    recs = [{"problem": "Let $a+b=3$ and $ab=2$. Find $a^2+b^2$.", "solution": "$(a+b)^2-2ab = 5$, so $\\boxed{5}$.",
             "answer": "5", "problem_type": "Algebra", "question_type": "math-word-problem", "source": "olympiads"},
            {"problem": "Prove that $\\sqrt{2}$ is irrational.", "solution": "Suppose...", "answer": "proof",
             "problem_type": "Number Theory", "question_type": "proof", "source": "olympiads"},
            {"problem": "Find $x$: $2x = \\{3\\}$ ∈ ℝ.", "solution": "x = 3/2", "answer": "\\frac{3}{2}",
             "problem_type": "Algebra", "question_type": "math-word-problem", "source": "cn_k12"},
            {"problem": "No solution text.", "solution": None, "answer": "1", "problem_type": "Algebra",
             "question_type": "math-word-problem", "source": "amc_aime"}]
    man, rows = run("numinamath_20k_stratified", write_parquet(tmp_path / "n.parquet", recs), tmp_path / "out")
    train = rows["train"]
    assert len(train) == 2 and man["skipped"] == {"no verifiable answer": 1, "null or empty solution": 1}
    for row in train:
        q = row["extra_info"]["question"]
        text = user_text(row)
        assert text.startswith("You are a knowledgeable math assistant.") and q in text and "\\boxed{}" in text
        assert row["data_source"] == "numina_math_process" and row["extra_info"]["reference_solution"]
        assert score(row, f"so \\boxed{{{row['reward_model']['ground_truth']}}}") == 1.0
        assert score(row, "so \\boxed{7}") == 0.0


AIME_VARIANTS = {
    "aime24": [("Maxwell-Jia/AIME_2024", {"ID": "2024-I-1", "Problem": "Find $m+n$ where ...", "Solution": "s",
                                          "Answer": 204}),
               ("HuggingFaceH4/aime_2024", {"id": 60, "problem": "Find $m+n$ where ...", "solution": "s",
                                            "answer": "204", "url": "u", "year": "2024"})],
    "aime25": [("math-ai/aime25", {"id": "0", "problem": "Find the sum of all integer bases $b>9$ ...", "answer": "70"}),
               ("opencompass/AIME2025", {"question": "Find the sum of all integer bases $b>9$ ...", "answer": "70"})],
    "amc23": [("math-ai/amc23", {"id": 0, "question": "What is $2^{10}$?", "answer": 1024.0, "url": "u"}),
              ("AI-MO/aimo-validation-amc", {"id": 1, "problem": "What is $2^{10}$?", "answer": 1024.0, "url": "u"})],
}


@pytest.mark.parametrize("name", sorted(AIME_VARIANTS))
def test_competition_column_variants(tmp_path, name):
    for k, (dataset, rec) in enumerate(AIME_VARIANTS[name]):
        extra = [{**rec, **{c: None for c in rec if c.lower() in ("answer",)}}]   # a null answer row
        man, rows = run(name, write_jsonl(tmp_path / f"{k}.jsonl", [rec] + extra), tmp_path / f"out{k}")
        (row,) = rows["test"]
        assert man["skipped"] == {"null or empty answer": 1}, dataset
        assert row["data_source"] == name and row["reward_model"]["ground_truth"] in ("204", "70", "1024"), dataset
        assert user_text(row) == f"{row['extra_info']['problem']}\n\n{QWEN_MATH}"
        assert score(row, f"\\boxed{{{row['reward_model']['ground_truth']}}}") == 1.0
        assert score(row, "\\boxed{1}") == 0.0


def test_math500_keeps_file_order_and_fields(tmp_path):
    recs = [{"problem": f"P{i}: what is ${i}+{i}$?", "solution": f"\\boxed{{{2 * i}}}", "answer": str(2 * i),
             "subject": "Prealgebra", "level": 1 + i % 5, "unique_id": f"test/prealgebra/{i}.json"} for i in range(6)]
    recs.append({**recs[0], "answer": "\\left( 3, \\frac{\\pi}{2} \\right)", "problem": "Convert to polar."})
    man, rows = run("math500", write_parquet(tmp_path / "test.parquet", recs), tmp_path / "out")
    test = rows["test"]
    assert [r["extra_info"]["unique_id"] for r in test] == [r["unique_id"] for r in recs]
    assert test[-1]["reward_model"]["ground_truth"] == "\\left( 3, \\frac{\\pi}{2} \\right)"
    assert score(test[-1], "\\boxed{(3, \\frac{\\pi}{2})}") == 1.0 and score(test[-1], "\\boxed{(3, \\pi)}") == 0.0
    assert all(r["data_source"] == "math500" for r in test) and man["outputs"]["test"]["rows"] == 7


def test_olympiadbench_text_only_english_math_and_lists(tmp_path):
    base = {"id": 1606, "question": "Find all $n$ such that ...", "context": None, "final_answer": ["$3$"],
            "solution": ["Since ...", "hence 3."], "is_multiple_answer": False, "unit": None, "answer_type": "Numerical",
            "subfield": "Number Theory", "subject": "Math", "language": "English", "modality": "Text-only",
            "image_1": None, "image_2": None, "image_3": None, "image_4": None, "image_5": None}
    recs = [base,
            {**base, "id": 2, "question": "Pairs?", "final_answer": ["$(1,2)$", "$(2,1)$"], "is_multiple_answer": True},
            {**base, "id": 3, "question": "Chinese", "language": "Chinese"},
            {**base, "id": 4, "question": "Physics", "subject": "Physics"},
            {**base, "id": 5, "question": "Figure", "modality": "Multimodal", "image_1": "<img>"},
            {**base, "id": 6, "question": "Empty answer", "final_answer": []}]
    man, rows = run("olympiadbench", write_parquet(tmp_path / "ob.parquet", recs), tmp_path / "out")
    test = rows["test"]
    assert [r["extra_info"]["id"] for r in test] == ["1606", "2"]
    assert man["left_out"] == {"not text-only English math": 3} and man["skipped"] == {"null or empty final_answer": 1}
    assert test[0]["reward_model"]["ground_truth"] == "3" and test[1]["reward_model"]["ground_truth"] == "(1,2), (2,1)"
    assert test[0]["extra_info"]["reference_solution"] == "Since ...\n\nhence 3."
    assert score(test[0], "\\boxed{3}") == 1.0 and score(test[0], "\\boxed{4}") == 0.0


def test_hendrycks_math_answer_is_last_box(tmp_path):
    recs = [{"problem": "Simplify $\\frac{2}{4}$.", "level": "Level 1", "type": "Prealgebra",
             "solution": "First \\boxed{2/4} is not simplified; it is $\\boxed{\\frac{1}{2}}$."},
            {"problem": "No box.", "level": "Level 2", "type": "Algebra", "solution": "The answer is 4."},
            {"problem": "Nested.", "level": "Level 5", "type": "Algebra", "solution": "$\\boxed{\\{1, \\{2\\}\\}}$"}]
    man, rows = run("math", write_jsonl(tmp_path / "m.jsonl", recs), tmp_path / "out")
    test = rows["test"]
    assert len(test) == 2 and man["skipped"] == {"unparsable answer": 1}
    row = test[0]
    assert row["reward_model"]["ground_truth"] == "\\boxed{\\frac{1}{2}}" and row["data_source"] == "score_math"
    assert row["prompt"][0]["role"] == "system" and "<answer>" in row["prompt"][0]["content"]
    assert row["prompt"][1] == {"role": "user", "content": "Question:\nSimplify $\\frac{2}{4}$."}
    assert score(row, "<think>halve</think><answer>\\frac{1}{2}</answer>") == 1.0
    assert score(row, "<think>halve</think><answer>\\frac{2}{4}</answer>") == 0.0
    assert score(row, "") == 0.0


def test_rlcsd_math_eval_concatenates_the_three_benchmarks(tmp_path):
    amc = write_jsonl(tmp_path / "amc.jsonl", [{"id": 0, "question": "AMC q?", "answer": 27.0, "url": "u"}])
    a24 = write_jsonl(tmp_path / "a24.jsonl", [{"ID": "2024-I-1", "Problem": "AIME24 q?", "Solution": "s", "Answer": 204}])
    a25 = write_jsonl(tmp_path / "a25.jsonl", [{"id": "0", "problem": "AIME25 q?", "answer": "70"},
                                               {"id": "1", "problem": "AIME25 r?", "answer": "588"}])
    inputs = [("aime25", a25), ("amc23", amc), ("aime24", a24)]
    man, rows = run("rlcsd_math_eval", inputs, tmp_path / "out")
    val = rows["val"]
    assert set(rows) == {"val"} and [r["data_source"] for r in val] == ["amc23", "aime24", "aime25", "aime25"]
    assert [r["reward_model"]["ground_truth"] for r in val] == ["27", "204", "70", "588"]
    assert user_text(val[0]) == f"AMC q?\n\n{QWEN_MATH}"   # evaluation rows: no "Problem: " prefix
    assert all(score(r, f"\\boxed{{{r['reward_model']['ground_truth']}}}") == 1.0 for r in val)
    with pytest.raises(ValueError, match="aime24"):
        run("rlcsd_math_eval", [("amc23", amc), ("aime25", a25)], tmp_path / "out2")


def test_template_dapo_asks_a_benchmark_in_dapos_format(tmp_path):
    """DAPO's AIME validation: the problem in DAPO-Math-17k's "Answer:" turn, data_source ``math_dapo``,
    scored by the ``dapo`` reward (+1 / -1) whatever the config's default."""
    src = write_jsonl(tmp_path / "aime.jsonl", [{"id": 60, "problem": "Find $m+n$.", "solution": "s", "answer": "204"}])
    man, rows = run("aime24", src, tmp_path / "out", template="dapo")
    (row,) = rows["test"]
    assert user_text(row) == ("Solve the following math problem step by step. The last line of your response should be "
                              "of the form Answer: $Answer (no quotes) where $Answer is the answer to the problem.\n\n"
                              "Find $m+n$.\n\nRemember to put your answer on its own line after \"Answer:\".")
    assert row["data_source"] == "math_dapo" and row["extra_info"]["benchmark"] == "aime24" and man["template"] == "dapo"
    assert score(row, "...\nAnswer: 204", default="exact") == 1.0 and score(row, "\\boxed{204}", default="exact") == -1.0
    _, boxed = run("aime24", src, tmp_path / "boxed")
    assert boxed["test"][0]["data_source"] == "aime24"
    with pytest.raises(ValueError, match="math benchmarks only"):
        run("gsm8k", write_jsonl(tmp_path / "g.jsonl", [{"question": "q", "answer": "#### 1"}]), tmp_path / "g", template="dapo")
    with pytest.raises(ValueError, match="valid: boxed"):
        run("aime24", src, tmp_path / "bad", template="nosuch")


def test_malformed_fields_are_counted_bad_rows(tmp_path):
    """Wrong types in the upstream columns (a text difficulty, a dict problem) are skipped and counted."""
    rec = {"question": "Q?", "final_answer": "1", "difficulty": 8.0, "topic": "t", "r1_solution_1": "s"}
    recs = [rec, {**rec, "question": "Q2?", "difficulty": "hard"}, {**rec, "question": {"text": "Q3"}},
            {**rec, "question": "Q4?", "r1_solution_1": 5}]
    man, rows = run("deepmath_filtered_level7_10", write_jsonl(tmp_path / "d.jsonl", recs), tmp_path / "out")
    assert len(rows["train"]) == 2 and man["skipped"] == {"unparsable difficulty": 1, "question is a dict, not text": 1}
    with pytest.raises(ValueError, match=r"d.jsonl:2: unparsable difficulty"):
        run("deepmath_filtered_level7_10", tmp_path / "d.jsonl", tmp_path / "strict", strict=True)
