"""The (data_source, response, ground truth) corpus that ``tests/unit/rewards/test_verl_table.py`` scores, and the
script that records verl's own verdict for each case.

Each case names where it comes from: a verl unit test (``tests/utils/reward_score/...`` of verl-project/verl)
or the verl preprocessing script whose parquet layout the row has (``examples/data_preprocess/gsm8k.py`` ...,
or the released verl-format dataset verl's recipes download as it is). The ground truths are written exactly as
those scripts write them (GSM8K: the text after ``####`` with commas dropped; MATH: the content of the
solution's last box; DAPO / AIME / Eurus-2: the dataset's answer string).

Recording verl's verdicts (needs verl's ``verl/utils/reward_score`` importable, with sympy and pylatexenc;
verl itself is not a dependency of this project)::

    PYTHONPATH=/path/to/verl python tools/verl_reward_corpus.py tests/unit/rewards/data/verl_verdicts.json

The recorded file holds the verl version, and per case ``verl``: the float verl's
``default_compute_score(data_source, response, ground_truth)`` returned (its ``score`` for a dict), or
``"NotImplementedError"`` where verl has no scorer for the data_source.
"""
from __future__ import annotations

import json
import os
import sys

GSM8K = "examples/data_preprocess/gsm8k.py"
MATH = "examples/data_preprocess/math_dataset.py"
DAPO = ("BytedTsinghua-SIA/DAPO-Math-17k (verl recipe/dapo downloads it as it is; "
        "examples/data_preprocess/dapo_multiturn_w_tool.py)")
AIME = "examples/data_preprocess/aime2024_multiturn_w_tool.py (BytedTsinghua-SIA/AIME-2024)"
EURUS = "PRIME-RL/Eurus-2-RL-Data (verl recipe/prime downloads it as it is)"
T_GSM8K = "verl tests/utils/reward_score/test_gsm8k_on_cpu.py"
T_DEFAULT = "verl tests/utils/reward_score/test_default_compute_score_on_cpu.py"
T_DAPO = "verl tests/utils/reward_score/test_math_dapo_on_cpu.py"
T_FALLBACK = "verl tests/utils/reward_score/test_math_dapo_boxed_fallback_on_cpu.py"

FILLER = "the reasoning above confirms this result is consistent. "


def pad(n: int) -> str:
    """``n`` characters of digit-free filler (verl's test helper's idea)."""
    return (FILLER * (n // len(FILLER) + 1))[:n]


def _gsm8k() -> list[tuple]:
    ds, c = "openai/gsm8k", []
    for n in (0, 1, 299, 300, 4000):
        c.append((T_GSM8K, ds, f"2 + 40 = 42.\n#### 42\n{pad(n)}", "42", f"trailing_{n}"))
    for n in (0, 300, 4000):
        c.append((T_GSM8K, ds, pad(n) + "#### 7\nwait, let me redo that.\n#### 42\n" + pad(n), "42", f"last_marker_{n}"))
    c.append((T_GSM8K, ds, pad(300 + 10 - 9) + "#### 1234567890123456789", "1234567890123456789", "straddling_window"))
    c += [(T_GSM8K, ds, "no number here at all", "42", "no_number"), (T_GSM8K, ds, pad(4000), "42", "filler_only"),
          (T_GSM8K, ds, "the answer is 42", "42", "no_marker"),
          (T_GSM8K, ds, "2 + 40 = 41.\n#### 41\n" + pad(4000), "42", "wrong_answer"),
          (T_GSM8K, ds, "#### 1,234\n" + pad(4000), "1234", "thousands"),
          (T_DEFAULT, ds, "The answer is 42", "42", "default_strict_no_marker"),
          (T_DEFAULT, ds, "reasoning... #### 42", "42", "default_strict")]
    awkward = {
        "wrong_box_then_hash": ("So \\boxed{41}. Wait, 2 + 40 = 42.\n#### 42", "42"),
        "box_only": ("The total is \\boxed{42}.", "42"),
        "think_only": ("<think>2 + 40 = 42\n#### 42</think>I am not sure.", "42"),
        "think_then_other": ("<think>#### 42</think>\nThe answer is 41", "42"),
        "hash_trailing_period": ("2 + 40 = 42.\n#### 42.", "42"),
        "hash_decimal_zero": ("#### 42.0", "42"),
        "hash_dollar": ("#### $42", "42"),
        "hash_no_space": ("####42", "42"),
        "hash_two_spaces": ("####  42", "42"),
        "hash_negative": ("#### -5", "-5"),
        "hash_negative_wrong": ("#### 5", "-5"),
        "hash_comma_list": ("#### 63, 72", "63"),
        "hedge_or": ("#### 63 or 72", "63"),
        "hedge_or_second": ("#### 72 or 63", "63"),
        "hedge_slash": ("#### 63 / 72", "63"),
        "hash_units": ("#### 18 dollars", "18"),
        "hash_then_text_number": ("#### 18\nThat is 3 more than 15.", "18"),
        "empty": ("", "18"),
        "whitespace": ("   \n ", "18"),
        "answer_then_301": ("#### 18\n" + pad(301), "18"),
        "answer_then_292": ("#### 18\n" + pad(292), "18"),
        "answer_then_500_digits": ("#### 18\n" + "1" * 500, "18"),
        "hash_in_latex": ("$\\#\\#\\#\\# 18$", "18"),
        "hash_twice_same_line": ("#### 17 #### 18", "18"),
        "big_number": ("#### 1000000", "1000000"),
        "leading_zero": ("#### 018", "18"),
        "plus_sign": ("#### +18", "18"),
        "fraction": ("#### 3/4", "0.75"),
        "decimal": ("#### 0.75", "0.75"),
        "decimal_missing_zero": ("#### .75", "0.75"),
        "dots": ("#### ...", "18"),
        "multiline_answer": ("#### \n18", "18"),
        "boxed_hash": ("\\boxed{#### 18}", "18"),
        "answer_colon": ("Answer: 18", "18"),
    }
    c += [(GSM8K, ds, r, gt, k) for k, (r, gt) in awkward.items()]
    return c


def _math() -> list[tuple]:
    c = []
    pairs = {
        "frac_short": ("\\frac12", "\\frac{1}{2}"), "dfrac": ("\\dfrac{1}{2}", "\\frac{1}{2}"),
        "tfrac": ("\\tfrac{1}{2}", "\\frac{1}{2}"), "half_decimal": ("0.5", "\\frac{1}{2}"),
        "slash": ("1/2", "\\frac{1}{2}"), "slash_reduced_no": ("2/4", "\\frac{1}{2}"),
        "text_units": ("5\\text{ cm}", "5"), "text_units_twice": ("5\\text{ cm}\\text{ m}", "5"),
        "degrees": ("90^\\circ", "90"), "degrees_braced": ("90^{\\circ}", "90"), "dollar": ("\\$18", "18"),
        "percent": ("50\\%", "50"), "x_equals": ("x = 5", "5"), "k_equals_long": ("abc = 5", "5"),
        "spaces": ("1 + \\sqrt{2}", "1+\\sqrt{2}"), "sqrt_short": ("\\sqrt3", "\\sqrt{3}"),
        "left_right": ("\\left( 1, 2 \\right)", "(1,2)"), "tuple_spaces": ("(1, 2)", "(1,2)"),
        "trailing_period": ("5.", "5"), "leading_dot": (".5", "0.5"), "int_vs_float": ("5.0", "5"),
        "thousands": ("1,000", "1000"), "text_word": ("\\text{Monday}", "\\text{Monday}"),
        "text_vs_bare": ("Monday", "\\text{Monday}"), "pi": ("2\\pi", "2\\pi"), "pi_order": ("\\pi 2", "2\\pi"),
        "matrix": ("\\begin{pmatrix} 1 \\\\ 2 \\end{pmatrix}", "\\begin{pmatrix} 1 \\\\ 2 \\end{pmatrix}"),
        "neg_frac": ("-\\frac{1}{2}", "-\\frac{1}{2}"), "frac_neg_inside": ("\\frac{-1}{2}", "-\\frac{1}{2}"),
        "inverse_space": ("1,\\!000", "1000"), "wrong": ("7", "5"), "empty_box": ("", "5"),
        "frac_trailing": ("\\frac", "\\frac{1}{2}"), "interval": ("[1, 2)", "[1,2)"),
    }
    for i, (k, (a, gt)) in enumerate(pairs.items()):
        ds = ("DigitalLearningGmbH/MATH-lighteval", "lighteval/MATH", "HuggingFaceH4/MATH-500")[i % 3]
        c.append((MATH, ds, f"Let's compute. The answer is $\\boxed{{{a}}}$.", gt, k))
    ds = "DigitalLearningGmbH/MATH-lighteval"
    shapes = {
        "no_box": ("The answer is 5.", "5"), "two_boxes_last": ("\\boxed{4} then \\boxed{5}", "5"),
        "two_boxes_first_right": ("\\boxed{5} then \\boxed{4}", "5"), "fbox": ("\\fbox{5}", "5"),
        "boxed_space": ("so \\boxed 5$ done", "5"), "boxed_space_eol": ("so \\boxed 5", "5"),
        "nested": ("\\boxed{\\frac{\\sqrt{3}}{2}}", "\\frac{\\sqrt{3}}{2}"), "unclosed": ("\\boxed{5", "5"),
        "think_only": ("<think>\\boxed{5}</think> I give up.", "5"), "empty": ("", "5"),
        "answer_then_2000": ("\\boxed{5}" + pad(2000), "5"), "hash_only": ("#### 5", "5"),
        "answer_line": ("Answer: 5", "5"), "box_in_text": ("\\text{\\boxed{5}}", "5"),
    }
    c += [(MATH, ds, r, gt, k) for k, (r, gt) in shapes.items()]
    return c


def _dapo() -> list[tuple]:
    c = []
    x = "x" * 151
    c += [(T_DAPO, "math_dapo", f"\\boxed{{{x}}}", x, "documented_length_box"),
          (T_DAPO, "math_dapo", "reasoning only", "42", "no_box")]
    equiv = [("5", "5"), ("1,000", "1000"), (" 5 ", "5"), ("x = 5", "5"), ("90^\\circ", "90"), ("\\$18", "18"),
             ("18 \\text{ dollars}", "18")]
    for i, (a, gt) in enumerate(equiv):
        c.append((T_FALLBACK, "math_dapo", "Some reasoning.\nAnswer: " + a, gt, f"minerva_{i}"))
        c.append((T_FALLBACK, "math_dapo", "Some reasoning, so the result is \\boxed{" + a + "}.", gt, f"boxed_{i}"))
    c.append((T_FALLBACK, "math_dapo", "So the result is \\boxed{1,001}.", "1000", "boxed_wrong"))
    shapes = {
        "answer": ("...\nAnswer: 34", "34"), "answer_lower": ("answer: 34", "34"), "answer_wrong": ("Answer: 35", "34"),
        "answer_period": ("Answer: 34.", "34"), "answer_dollars": ("Answer: $34$", "34"),
        "answer_dollar_period": ("Answer: $34$.", "34"), "answer_text_unit": ("Answer: 34\\text{ cm}", "34"),
        "answer_units_word": ("Answer: 34 degrees", "34"), "answer_then_box": ("Answer: 35 \\boxed{34}", "34"),
        "box_then_answer": ("\\boxed{35}\nAnswer: 34", "34"), "two_answers": ("Answer: 35\nAnswer: 34", "34"),
        "answer_then_301": ("Answer: 34\n" + pad(301), "34"), "answer_then_250": ("Answer: 34\n" + pad(250), "34"),
        "box_then_150": ("\\boxed{34}" + pad(150), "34"), "box_then_50": ("\\boxed{34}" + pad(50), "34"),
        "think_only_answer": ("<think>Answer: 34</think> no idea", "34"), "empty": ("", "34"),
        "hedge_or": ("Answer: 34 or 35", "34"), "hedge_equals": ("Answer: 35 = 34", "34"),
        "answer_frac": ("Answer: \\frac{1}{2}", "\\frac{1}{2}"), "answer_frac_short": ("Answer: \\frac12", "\\frac{1}{2}"),
        "answer_boxed_inside": ("Answer: \\boxed{34}", "34"), "answer_a": ("Answer: a 34", "34"),
        "hash_only": ("#### 34", "34"), "answer_comma_num": ("Answer: 1,000", "1000"),
        "answer_space_colon": ("Answer : 34", "34"), "answer_no_space": ("Answer:34", "34"),
        "fbox": ("\\fbox{34}", "34"), "box_spaces": ("\\boxed{ 34 }", "34"),
    }
    names = ("math_dapo", "math", "aime24", "aime25", "aime_2025", "aime2024", "math_dapo_reasoning")
    for i, (k, (r, gt)) in enumerate(shapes.items()):
        ds = names[i % len(names)]
        c.append((AIME if ds.startswith("aime") else DAPO, ds, r, gt, k))
    return c


def _eurus() -> list[tuple]:
    c = []
    names = ("numina_aops_forum", "numina_synthetic_math", "numina_amc_aime", "numina_synthetic_amc", "numina_cn_k12",
             "numina_olympiads")
    pairs = {
        "box": ("\\boxed{5}", "5"), "box_wrong": ("\\boxed{6}", "5"), "answer_is": ("The answer is 5", "5"),
        "frac": ("\\boxed{\\frac{1}{2}}", "\\frac{1}{2}"), "frac_decimal": ("\\boxed{0.5}", "\\frac{1}{2}"),
        "frac_unreduced": ("\\boxed{\\frac{2}{4}}", "\\frac{1}{2}"), "slash_unreduced": ("\\boxed{2/4}", "1/2"),
        "percent": ("\\boxed{50\\%}", "50"), "percent_decimal": ("\\boxed{0.5}", "50\\%"),
        "sqrt": ("\\boxed{\\sqrt{8}}", "2\\sqrt{2}"), "pi": ("\\boxed{2\\pi}", "2\\pi"),
        "tuple": ("\\boxed{(1, 2)}", "(1,2)"), "tuple_swapped": ("\\boxed{(2, 1)}", "(1,2)"),
        "interval_open_closed": ("\\boxed{(1, 2]}", "(1,2)"), "degrees": ("\\boxed{90^\\circ}", "90"),
        "text": ("\\boxed{\\text{B}}", "B"), "x_equals": ("\\boxed{x=5}", "5"), "thousands": ("\\boxed{1,000}", "1000"),
        "empty": ("", "5"), "think_only": ("<think>\\boxed{5}</think>", "5"), "last_number": ("so we get 5", "5"),
        "expression": ("\\boxed{x^2+2x+1}", "(x+1)^2"), "neg": ("\\boxed{-3}", "-3"),
        "scientific": ("\\boxed{1000000}", "10^6"), "two_boxes": ("\\boxed{4} or \\boxed{5}", "5"),
        "trailing_period": ("The answer is 5.", "5"), "million": ("\\boxed{2 million}", "2000000"),
        "mixed_number": ("\\boxed{7 3/4}", "31/4"), "hedge_comma": ("\\boxed{4, 5}", "5"),
        "dfrac": ("\\boxed{\\dfrac{3}{4}}", "\\frac{3}{4}"), "infinity": ("\\boxed{\\infty}", "\\infty"),
        "div_zero": ("\\boxed{1/0}", "5"),
    }
    for i, (k, (r, gt)) in enumerate(pairs.items()):
        c.append((EURUS, names[i % len(names)], r, gt, k))
    return c


def _unscored() -> list[tuple]:
    return [("verl's table has no Rowan/hellaswag scorer", "Rowan/hellaswag", "2", "2", "hellaswag")]


def cases() -> list[dict]:
    """Every case, with a readable unique id ``<source family>/<name>``."""
    out = []
    for fam, group in (("gsm8k", _gsm8k()), ("math", _math()), ("dapo", _dapo()), ("prime", _eurus()),
                       ("none", _unscored())):
        for source, ds, resp, gt, name in group:
            out.append({"id": f"{fam}/{name}", "from": source, "data_source": ds, "response": resp, "ground_truth": gt})
    ids = [c["id"] for c in out]
    assert len(ids) == len(set(ids)), "case ids must be unique"
    return out


def main(path: str) -> None:
    from verl.utils.reward_score import default_compute_score  # the oracle: verl itself (not a dependency here)

    try:
        from importlib.metadata import version
        ver = version("verl")
    except Exception:  # noqa: BLE001 -- a source tree on PYTHONPATH has no distribution metadata
        ver = os.environ.get("VERL_VERSION", "unknown")
    out = []
    for c in cases():
        try:
            v = default_compute_score(c["data_source"], c["response"], c["ground_truth"], None)
            v = float(v["score"] if isinstance(v, dict) else v)
        except NotImplementedError:
            v = "NotImplementedError"
        out.append({**c, "verl": v})
    with open(path, "w") as f:
        json.dump({"verl_version": ver, "cases": out}, f, indent=0, ensure_ascii=False)
        f.write("\n")
    print(f"{len(out)} cases -> {path}")


if __name__ == "__main__":
    main(sys.argv[1])
