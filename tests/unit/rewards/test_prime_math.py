"""The ``papo_math`` rule check (``rewards/prime_math.py``) against cases nobody here wrote: the
Hendrycks MATH equivalence tests (hendrycks/math ``modeling/math_equivalence_test.py``, every case),
the rules PRM800K's ``grade_answer`` and verl's ``prime_math.math_equal`` state in their code
(unreduced fractions, integer strictness, tuples and intervals, the 1e-4 relative tolerance, the
percentage variants, the answer markers), plus the degenerate class no reference rejects and the
adversarial inputs that must each return at once."""
from __future__ import annotations

import time

import pytest

from megatron_rl.rewards.prime_math import (grade_answer, hendrycks_normalize, match_answer, math_equal,
                                            prime_math_score)

# hendrycks/math modeling/math_equivalence_test.py: (a, b, is_equiv)
HENDRYCKS = [
    ("\\tfrac{1}{2} + \\frac1{72}", "\\\\frac{1}{2} + 2/3", False),
    ("10, 4, -2", "4, 10, -2", False),
    ("10, 4, 2", "4, 12, 2", False),
    ("\\tfrac{1}{2} +\\! \\frac1{72}", "\\\\dfrac{1}{2} +\\frac{1}{72}", True),
    ("10\\text{ units}", "10 ", True),
    ("10\\text{ units}", "100 ", False),
    ("10", "\\$10", True),
    ("\\left(x-2\\right)\\left(x+2\\right)", "(x-2)(x+2)", True),
    ("0.1, 4, 2", "4, .1, 2", False),
    ("0.1", ".1", True),
    ("10\\%", "10", True),
    ("10\\sqrt{3} + \\sqrt4", "10\\sqrt3 + \\sqrt{4}", True),
    ("\\frac34i", "\\frac{3}{4}i", True),
    ("\\tfrac83", "\\frac{8}{3}", True),
    ("5x - 7y + 11z + 4 = 0", "x + y - z + 2 = 0", False),
    ("1/2", "\\frac{1}{2}", True),
]


@pytest.mark.parametrize("a,b,equiv", HENDRYCKS)
def test_hendrycks_equivalence_cases(a, b, equiv):
    if equiv:                                   # rule 2a alone already says equal
        assert hendrycks_normalize(a) == hendrycks_normalize(b)
    assert prime_math_score(f"\\boxed{{{a}}}", b) == float(equiv)   # and no later rule turns a "different" into "equal"


# the rules stated in PRM800K's grade_answer / verl prime_math's math_equal, one case each: (response, truth, score)
RULES = [
    ("\\boxed{2/4}", "1/2", 1.0),                    # grade_answer refuses the unreduced fraction, math_equal's sympy accepts
    ("\\boxed{3.00001}", "3", 1.0),                  # relative tolerance 1e-4
    ("\\boxed{3.001}", "3", 0.0),
    ("\\boxed{50}", "0.5", 1.0),                     # percentage variants: truth x 100
    ("\\boxed{0.5}", "50", 1.0),                     # truth / 100
    ("\\boxed{1,000,000}", "1000000", 1.0),          # thousands commas
    ("\\boxed{(1, 2)}", "(1,2)", 1.0),
    ("\\boxed{(2, 1)}", "(1,2)", 0.0),               # tuples element by element, in order
    ("\\boxed{[1, 2)}", "[1,2)", 1.0),
    ("\\boxed{(1, 2]}", "[1,2)", 0.0),               # interval ends must match
    ("\\boxed{(-\\infty, 3)}", "(-\\infty,3)", 1.0),  # an interval's infinity is compared as written
    ("\\boxed{x^2+2x+1}", "(x+1)^2", 1.0),           # sympy simplifies the difference to 0
    ("\\boxed{\\frac{\\sqrt{2}}{2}}", "\\frac{1}{\\sqrt{2}}", 1.0),
    ("\\boxed{\\dfrac{3}{2^{4}}}", "\\frac{3}{16}", 1.0),
    ("\\boxed{\\sqrt[3]{8}}", "2", 1.0),
    ("\\boxed{2\\pi}", "2\\pi", 1.0),
    ("\\boxed{6.28}", "2\\pi", 0.0),                 # not within 1e-4 of 2*pi
    ("\\boxed{5 \\text{ cm}}", "5", 1.0),            # units dropped
    ("\\boxed{30^\\circ}", "30", 1.0),
    ("\\boxed{\\$10}", "10", 1.0),
    ("\\boxed{x = 5}", "5", 1.0),
    ("The answer is 42.", "42", 1.0),                # "answer is" marker, no box
    ("So we get 17", "17", 1.0),                     # "get " marker
    ("Answer: 7\n", "7", 1.0),
    ("\\boxed{3} first, then \\boxed{4}", "4", 1.0), # the last box
    ("\\boxed{3} first, then \\boxed{4}", "3", 0.0),
    ("no number at all", "5", 0.0),
    ("\\boxed{}", "5", 0.0),
    ("\\boxed{a+b}", "b+a", 1.0),
    ("\\boxed{A}", "a", 1.0),                        # case-insensitive text answers
]


@pytest.mark.parametrize("resp,truth,score", RULES)
def test_prime_math_rules(resp, truth, score):
    assert prime_math_score(resp, truth) == score


def test_grade_answer_keeps_prm800k_fraction_and_integer_strictness():
    assert not grade_answer("2/4", "1/2")            # unreduced: grade_answer says no (math_equal decides later)
    assert grade_answer("\\frac{1}{2}", "1/2")
    assert math_equal("2/4", "1/2")


DEGENERATE = ["1/0", "0/0", "\\frac{1}{0}", "\\infty", "-\\infty", "oo", "nan", "NaN", "zoo", "\\log(0)", "\\log 0",
              "\\tan(\\pi/2)", "1e1000", "inf"]
TRUTHS = ["5", "-3", "\\frac{1}{2}", "0", "\\frac{\\pi}{2}", "\\sqrt{2}", "x+1", "2x", "[0, 1]", "(1, 2)"]


@pytest.mark.parametrize("bad", DEGENERATE)
def test_degenerate_answers_never_match_a_finite_truth(bad):
    for truth in TRUTHS:
        assert prime_math_score(f"\\boxed{{{bad}}}", truth) == 0.0, (bad, truth)


@pytest.mark.parametrize("resp", [
    "\\boxed{9^{9^{9^9}}}", "\\boxed{9^9^9^9}", "\\boxed{((((9^9)^9)^9)^9)^9}", "\\boxed{2^{100000}}", "\\boxed{1e1000000}",
    "\\boxed{" + "{" * 10000 + "1" + "}" * 10000 + "}", "\\boxed{" + "7" * 100000 + "}", "x" * 130000 + " \\boxed{3}",
    "\\boxed{" + "(" * 5000 + "1" + ")" * 5000 + "}", "\\boxed{__import__('os').system('echo pwned')}",
])
def test_adversarial_answers_return_at_once(resp):
    t0 = time.perf_counter()
    score = prime_math_score(resp, "3")
    assert time.perf_counter() - t0 < 2.0
    assert score == (1.0 if resp.endswith("\\boxed{3}") else 0.0)


def test_extraction_markers():
    assert match_answer("We have 2 apples. The answer is \\boxed{12}") == "12"
    assert match_answer("12 is the answer") == "12"
    assert match_answer("x = 3") == "3"
