"""A corpus of (response, ground truth, expected verdict) cases for the ``math`` reward.

Written for this project from the cases of the field's verifier test suites — Math-Verify
(huggingface/Math-Verify ``tests/test_all.py``: numbers, percent, LaTeX notation, sets, matrices,
equations, the "tests from qwen parser" block), the Hendrycks MATH equivalence tests
(hendrycks/math ``math_equivalence``: fractions, ``\\dfrac``/``\\tfrac``, units, decimals) and the
Qwen2.5-Math grader (QwenLM/Qwen2.5-Math ``evaluation/grader.py`` ``math_equal`` examples) — plus the
degenerate class of issue 35 (the ``\\boxed{1/0}`` reward hack). Each case names its ``source``; the
verdict is the careful human one (what a grader reading the answer would decide), not any
implementation's output, under the task's format rule: the final answer is the last ``\\boxed{}``
(GSM8K: the last ``#### N`` line), so a response that never states one scores 0. Responses are phrased as a model would write them, with the answer in the
LAST ``\\boxed{}`` unless the category is about extraction.

``CASES``: list of dicts {category, response, truth, expected (bool), source}.
"""
from __future__ import annotations

MV = "math-verify tests"
HM = "hendrycks-math equivalence"
QW = "qwen2.5-math grader"
IS = "issue 35 reward hack"

CASES: list[dict] = []


def _say(ans: str, lead: str = "Putting the pieces together, the final answer is") -> str:
    return f"Let me work through this carefully.\n\nAfter simplifying each step, {lead.lower()} $\\boxed{{{ans}}}$."


def add(category: str, source: str, pairs, wrap=_say) -> None:
    for pred, truth, ok in pairs:
        CASES.append({"category": category, "response": wrap(pred), "truth": truth, "expected": bool(ok), "source": source})


def add_raw(category: str, source: str, rows) -> None:
    for response, truth, ok in rows:
        CASES.append({"category": category, "response": response, "truth": truth, "expected": bool(ok), "source": source})


# ---------------------------------------------------------------- fractions (incl. braces inside)
add("fractions", HM, [
    ("\\frac{1}{2}", "\\frac{1}{2}", 1), ("\\dfrac{1}{2}", "\\frac{1}{2}", 1), ("\\tfrac{1}{2}", "\\frac12", 1),
    ("\\frac12", "\\frac{1}{2}", 1), ("1/2", "\\frac{1}{2}", 1), ("\\frac{2}{4}", "\\frac{1}{2}", 1),
    ("0.5", "\\frac{1}{2}", 1), ("\\frac{1}{3}", "\\frac{1}{2}", 0), ("\\frac{3}{2}", "1\\frac{1}{2}", 1),
    ("\\frac{10}{9}", "10/9", 1), ("-\\frac{10}{9}", "-10/9", 1), ("\\frac{-10}{9}", "-\\frac{10}{9}", 1),
    ("\\frac{10}{9}", "-10/9", 0), ("\\frac{7}{3}", "\\frac{3}{7}", 0), ("\\cfrac{1}{3}", "1/3", 1),
    ("\\frac13", "1/3", 1), ("\\frac3{3}", "1", 1), ("\\frac{14}{3}", "\\frac{14}{3}", 1), ("\\frac{14}{3}", "4\\frac{2}{3}", 1),
    ("\\frac{5}{6}", "\\frac{5}{7}", 0),
])
add("fractions", MV, [
    ("\\frac{\\pi^{2}}{6}", "\\frac{\\pi^2}{6}", 1), ("\\frac{3}{2^{4}}", "\\frac{3}{16}", 1),
    ("\\frac{\\sqrt{3}}{2}", "\\frac{\\sqrt3}{2}", 1), ("\\frac{x+2}{7}", "\\frac{x}{7}+\\frac{2}{7}", 1),
    ("\\frac{\\sqrt{\\sqrt{11}+\\sqrt{194}}}{2\\sqrt{33}+15}", "\\frac{\\sqrt{\\sqrt{11}+\\sqrt{194}}}{15+2\\sqrt{33}}", 1),
    ("\\frac{1}{2^{10}}", "\\frac{1}{1024}", 1), ("\\frac{2^{3}}{3^{2}}", "\\frac{8}{9}", 1), ("\\frac{2^{3}}{3^{2}}", "\\frac{9}{8}", 0),
    ("\\frac{1+\\sqrt{5}}{2}", "2", 0), ("\\frac{34}{16}+\\frac{\\sqrt{1358}}{16}", "4", 0),
])

# ---------------------------------------------------------------- nested braces
add("nested braces", MV, [
    ("\\frac{1}{\\frac{1}{2}}", "2", 1), ("{{{3}}}", "3", 1), ("\\sqrt{\\frac{1}{4}}", "\\frac{1}{2}", 1),
    ("2^{2^{2}}", "16", 1), ("\\left\\{ 1, 2 \\right\\}", "\\{1,2\\}", 1), ("\\frac{\\frac{3}{4}}{\\frac{1}{2}}", "\\frac{3}{2}", 1),
    ("\\sqrt{\\sqrt{16}}", "2", 1), ("{\\frac{2}{3}}", "\\frac23", 1), ("\\frac{\\frac{3}{4}}{\\frac{1}{2}}", "\\frac{2}{3}", 0),
    ("2^{2^{3}}", "64", 0), ("\\frac{1}{1+\\frac{1}{1+\\frac{1}{2}}}", "\\frac{3}{5}", 1), ("\\{\\{1\\}\\}", "1", 0),
])

# ---------------------------------------------------------------- decimals
add("decimals", MV, [
    ("-5", "-5", 1), ("1000.0", "1000", 1), ("1,000.0", "1000.0", 1), ("0.4", ".4", 1), (".4", "0.4", 1),
    ("1{,}000.99", "1000.99", 1), ("7,425,000", "7425000", 1), ("1000.99", "1000.9", 0), ("0.0833333333333333", "\\frac{1}{12}", 1),
    ("3.14", "\\pi", 0), ("2.50", "2.5", 1), ("0.333", "\\frac{1}{3}", 0), ("16,\\!386.20", "16386.20", 1),
    ("12,\\!000,\\!023", "12000023", 1), ("14{,}916", "14916", 1), ("2.0", "2", 1), ("1.5", "1.05", 0),
    ("-0.5", "0.5", 0), ("0.125", "\\frac{1}{8}", 1), ("0.75", "\\frac{3}{4}", 1),
])
add("decimals", QW, [
    ("0.5", "1/2", 1), ("3.0", "3", 1), ("10.00", "10", 1), 
    ("0.1", "0.01", 0), ("7.", "7", 1),
])

# ---------------------------------------------------------------- percent
add("percent", MV, [
    ("28\\%", "28\\%", 1), ("28", "28\\%", 1), ("28 \\%", "28\\%", 1), ("28\\%", "28", 1), ("\\frac{28}{100}", "28", 0),
    ("28/100", "28", 0), ("28", "28/100", 0), ("28.0\\%", "28\\%", 1), ("29\\%", "28\\%", 0), ("50\\%", "50", 1),
    ("12.5\\%", "12.5", 1), ("12.5\\%", "125", 0),
])
add("percent", QW, [("40\\%", "40", 1), ("40", "40\\%", 1), ("4\\%", "40", 0)])

# ---------------------------------------------------------------- units
add("units", HM, [
    ("10\\text{ units}", "10", 1), ("10\\text{ cm}", "10", 1), ("10 \\text{cm}^2", "10", 1), ("5\\mbox{ cm}^2", "5", 1),
    ("90^\\circ", "90", 1), ("90^{\\circ}", "90^\\circ", 1), ("90", "90^\\circ", 1), ("45^\\circ", "90^\\circ", 0),
    ("\\$2.50", "2.50", 1), ("\\$18.90", "18.90", 1), ("\\$18.90", "18.9", 1), ("11\\text{ inches}", "11", 1),
    ("12\\text{ inches}", "11", 0), ("\\frac{1}{3} \\text{meters}", "\\frac{1}{3}", 1), ("\\frac{1}{3} \\textbf{meters}", "1/3", 1),
    ("20\\text{ dollars}", "20", 1), ("\\text{5 feet}", "5", 1), ("150\\text{ km}", "150", 1),
    ("150\\text{ km}", "15", 0), ("\\$10,\\!000", "10000", 1),
])

# ---------------------------------------------------------------- scientific notation
add("sci-notation", MV, [
    ("1.5 \\times 10^{3}", "1500", 1), ("1.5\\times10^3", "1500", 1), ("3 \\cdot 10^{-2}", "0.03", 1), ("6.02\\times 10^{23}", "6.02\\times10^{23}", 1),
    ("2 \\times 10^{5}", "200000", 1), ("2 \\times 10^{5}", "20000", 0), ("10^{-3}", "0.001", 1), ("10^{3}", "1000", 1),
    ("1.2 \\times 10^{4}", "1.2 \\times 10^{5}", 0), ("5\\cdot 10^{2}", "500", 1),
])

# ---------------------------------------------------------------- sqrt / pi
add("sqrt-pi", MV, [
    ("\\sqrt{3}", "\\sqrt3", 1), ("\\sqrt{8}", "2\\sqrt{2}", 1), ("2\\sqrt{2}", "\\sqrt{8}", 1), ("\\sqrt{12}", "3\\sqrt{2}", 0),
    ("\\sqrt[3]{8}", "2", 1), ("\\sqrt[3]{27}", "3", 1), ("\\sqrt[3]{16}", "2\\sqrt[3]{2}", 1), ("\\pi r^2", "\\pi r^{2}", 1),
    ("2\\pi", "\\pi\\cdot 2", 1), ("\\frac{\\pi}{2}", "\\pi/2", 1), ("\\frac{\\pi}{3}", "\\frac{\\pi}{2}", 0), ("4\\pi", "4 \\pi", 1),
    ("\\frac{\\sqrt{2}}{2}", "\\frac{1}{\\sqrt{2}}", 1), ("3\\sqrt{3}", "\\sqrt{27}", 1), 
    ("1\\sqrt{19}", "1", 0),  ("36\\pi", "36 \\pi", 1), ("18\\pi", "36\\pi", 0),
])
add("sqrt-pi", QW, [
    ("\\tan^2(y)+1", "\\sec^2(y)", 1), ("\\sin x", "\\sin(x)", 1), ("\\log_2 8", "3", 1), ("\\log_{2} 8", "3", 1),
    ("\\ln e^2", "2", 1), ("5!", "120", 1), ("4!", "120", 0), ("\\binom{5}{2}", "10", 1), ("\\cos 0", "1", 1),
    ("\\sin\\frac{\\pi}{6}", "\\frac{1}{2}", 1), ("\\cos x", "\\sin x", 0), ("e^{i\\pi}", "-1", 1),
])

# ---------------------------------------------------------------- equations and inequalities
add("equations", MV, [
    ("x = 3", "3", 1), ("k = \\frac{1}{3}", "\\frac{1}{3}", 1), ("x=3", "4", 0), ("y = 2x + 1", "y=2x+1", 1),
    ("y = 2x + 1", "y = 1 + 2x", 1), ("y=2x+1", "y=2x-1", 0), ("34x+45y-20z+100=0", "-34x-45y+20z-100=0", 1),
    ("x \\geq 5", "x \\ge 5", 1), ("x \\geq 5", "x > 5", 0), ("x < 2", "x<2", 1), ("b = a", "a = b", 1), ("x \\le 3", "x \\geq 3", 0),
    ("x^2 + y^2 = 25", "x^2+y^2=25", 1), ("x^2 + y^2 = 25", "x^2+y^2=5", 0), ("3", "x=3", 1), ("a = 2", "2", 1),
    ("f(x) = x^2", "x^2", 1), ("-2 < x < 3", "(-2,3)", 1), ("x > 0", "(0, \\infty)", 1), ("x \\geq 0", "(0,\\infty)", 0),
])

# ---------------------------------------------------------------- intervals and sets
add("intervals-sets", MV, [
    ("[0,1)", "[0,1)", 1), ("[0,1)", "[0,9)", 0), ("[0,9)", "(0,9)", 0), ("-[0,1)", "1", 0), ("(1,2]", "(1, 2]", 1),
    ("[0,\\infty)", "[0, \\infty)", 1), ("(-\\infty, 3)", "(-\\infty,3)", 1), ("(0, 1)", "[0,1)", 0),
    ("(-\\infty, -3] \\cup [2, \\infty)", "[-3,2]", 0), ("(-\\infty, -3] \\cup [2, \\infty)", "(-\\infty,-3]\\cup[2,\\infty)", 1),
    ("[2, \\infty) \\cup (-\\infty, -3]", "(-\\infty,-3]\\cup[2,\\infty)", 1), ("(-\\infty,0)\\cup(0,\\infty)", "(-\\infty,0)\\cup(0,\\infty)", 1),
    ("\\{1,2,3\\}", "\\{3,2,1\\}", 1), ("\\{1,2\\}", "\\{1,3\\}", 0), ("\\{1, 2, 3\\}", "\\{1,2\\}", 0), ("(\\frac{3}{5},\\frac{8}{3}]", "(\\frac35, \\frac83]", 1),
    ("\\emptyset", "\\emptyset", 1), ("\\varnothing", "\\emptyset", 1), ("\\mathbb{R}", "(-\\infty, \\infty)", 1),
    ("[1, 5]", "[1, 5)", 0),
])
add("intervals-sets", QW, [("[-3, 2]", "[-3,2]", 1), ("\\pm 2", "\\pm2", 1),
                           ("\\pm 2", "2", 0), ("\\pm \\sqrt{3}", "\\pm\\sqrt3", 1)])

# ---------------------------------------------------------------- tuples
add("tuples", MV, [
    ("(3, \\frac{\\pi}{2})", "(3,\\frac{\\pi}{2})", 1), ("\\left( 3, \\frac{\\pi}{2} \\right)", "(3, \\frac{\\pi}{2})", 1),
    ("(7, 6)", "(7,6)", 1), ("(6, 7)", "(7,6)", 0), ("(1,4.5)", "(1,\\frac{9}{2})", 1), ("(3,-4)", "(3, -4)", 1),
    ("(3,-4)", "(-4,3)", 0), ("\\left( \\frac{1}{5}, \\frac{1}{6} \\right)", "\\left(\\frac{1}{5},\\frac{1}{6}\\right)", 1),
    ("\\left(\\frac{4}{5},\\frac{1}{5}\\right)", "(\\frac{4}{5}, \\frac{1}{5})", 1), ("(1,2,3)", "(1,2)", 0),
    ("(2, 3, -1)", "(2,3,-1)", 1), ("(2, 3, 1)", "(2,3,-1)", 0), ("(0, 0)", "(0,0)", 1), ("(a, b) = (1, 2)", "(1,2)", 1),
])

# ---------------------------------------------------------------- matrices / vectors
add("matrices", MV, [
    ("\\begin{pmatrix} 0 & 3 \\\\ 0 & -1 \\end{pmatrix}", "\\begin{pmatrix}0&3\\\\0&-1\\end{pmatrix}", 1),
    ("\\begin{bmatrix} 0 & 3 \\\\ 0 & -1 \\end{bmatrix}", "\\begin{pmatrix}0&3\\\\0&-1\\end{pmatrix}", 1),
    ("\\begin{pmatrix}1 & 2 \\\\ 3 & 5\\end{pmatrix}", "\\begin{pmatrix}1 & 2 \\\\ 3 & 4\\end{pmatrix}", 0),
    ("\\begin{pmatrix} 3 \\\\ 2 \\\\ -6 \\end{pmatrix}", "\\begin{pmatrix}3\\\\2\\\\-6\\end{pmatrix}", 1),
    ("\\begin{pmatrix} 3 \\\\ 2 \\\\ 6 \\end{pmatrix}", "\\begin{pmatrix}3\\\\2\\\\-6\\end{pmatrix}", 0),
    ("\\begin{pmatrix}-\\frac{7}{4}&-2\\\\4&\\frac{1}{4}\\end{pmatrix}", "\\begin{pmatrix}-7/4&-2\\\\4&1/4\\end{pmatrix}", 1),
    ("\\begin{pmatrix}1&0\\\\0&1\\end{pmatrix}", "\\begin{pmatrix}1&0\\\\0&1\\end{pmatrix}", 1),
    ("\\begin{pmatrix}0.5\\\\0.2\\end{pmatrix}", "\\begin{pmatrix}\\frac{1}{2}\\\\\\frac{1}{5}\\end{pmatrix}", 1),
    ("\\begin{pmatrix}2&1\\\\1&2\\end{pmatrix}", "\\begin{pmatrix}1&2\\\\2&1\\end{pmatrix}", 0),
    ("\\begin{pmatrix} 1 \\\\ -1 \\end{pmatrix}", "\\begin{pmatrix} -1 \\\\ 1 \\end{pmatrix}", 0),
])

# ---------------------------------------------------------------- multiple answers
add("multiple answers", MV, [
    ("1, 2", "1,2", 1), ("2, 1", "1, 2", 1), ("1, 2, 3", "1, 2", 0), ("-1, 3", "3, -1", 1), ("3, -1", "-3, 1", 0),
    ("x = 1, x = 2", "1, 2", 1), ("1 \\text{ and } 2", "1, 2", 1), ("\\frac{1}{2}, 2", "2, \\frac12", 1),
    ("0, 1", "0, 2", 0), ("\\text{A, C}", "\\text{A, C}", 1), ("12\\text{ and }13", "12 \\text{ and } 13", 1),
])

# ---------------------------------------------------------------- text answers (MATH has them)
add("text answers", HM, [
    ("\\text{Evelyn}", "\\text{Evelyn}", 1), ("\\text{(C)}", "\\text{(C)}", 1), ("\\text{odd}", "\\text{odd}", 1),
    ("\\text{even}", "\\text{odd}", 0), ("\\text{Monday}", "\\text{Monday}", 1), ("\\text{Tuesday}", "\\text{Monday}", 0),
])

# ---------------------------------------------------------------- integers and expressions (the bulk of real answers)
add("integers", HM, [(str(v), str(v), 1) for v in (0, 7, 12, 42, 120, 2016, -3, 1000000)]
    + [(str(v), str(v + 1), 0) for v in (0, 7, 12, 42, 120, 2016, -3, 999999)])
add("expressions", QW, [
    ("x^2+2x+1", "(x+1)^2", 1), ("2x+2", "2(x+1)", 1), ("a+b", "b+a", 1), ("a-b", "b-a", 0), ("x^2", "2x", 0),
    ("(a+5)(b+2)", "(+5)(b+2)", 0), ("x+2n+1", "x+1", 0), ("\\frac{x}{2}", "0.5x", 1), ("3x^2 - 2x", "x(3x-2)", 1),
    ("2^{10}", "1024", 1), ("2^{11}", "1024", 0), ("e^0", "1", 1), ("\\sin(0)", "0", 1), ("(2x-1)(x+3)", "2x^2+5x-3", 1),
    ("(2x+1)(x+3)", "2x^2+5x-3", 0), ("4x^3", "4x^{3}", 1),
])

# ---------------------------------------------------------------- GSM8K "####"
add_raw("gsm8k ####", QW, [
    ("Natalia sold 48/2 = 24 clips in May.\nNatalia sold 48+24 = 72 clips altogether.\n#### 72", "72", 1),
    ("She earns 12/60 = 0.2 per minute, so 0.2*50 = 10.\n#### 10", "#### 10", 1),
    ("Total is 5 + 6 = 11 apples.\n#### 11", "12", 0),
    ("The cost is 1,200 dollars.\n#### 1,200", "1200", 1),
    ("So he has 3 boxes.\n#### 3", "The answer: 3 #### 3", 1),
    ("First, 3*4 = 12.\n#### 12\nWait, I should add 2, so 14.\n#### 14", "14", 1),
    ("First, 3*4 = 12.\n#### 12\nWait, I should add 2, so 14.\n#### 14", "12", 0),
    ("The answer is 18, so \\boxed{18}.", "#### 18", 1),
    ("Adding gives 150.\n#### 150", "#### 150", 1),
    ("Half of 9 is 4.5.\n#### 4.5", "4.5", 1),
])

# ---------------------------------------------------------------- first vs last box
add_raw("first vs last box", MV, [
    ("A first guess is $\\boxed{3}$, but checking, it fails. The correct value is $\\boxed{5}$.", "5", 1),
    ("A first guess is $\\boxed{3}$, but checking, it fails. The correct value is $\\boxed{5}$.", "3", 0),
    ("$\\boxed{2}$ ... recomputing ... $\\boxed{\\frac{1}{2}}$", "\\frac{1}{2}", 1),
    ("$\\boxed{2}$ ... recomputing ... $\\boxed{\\frac{1}{2}}$", "2", 0),
    ("Option $\\boxed{A}$ is wrong; final: $\\boxed{B}$", "B", 1),
    ("Thus $x=\\boxed{2-2p}$.", "2-2p", 1),
    ("We get $\\boxed{10}$ then $\\boxed{10}$ again.", "10", 1),
    ("Candidates: $\\boxed{4}$ and $\\boxed{-4}$; only the positive one works, so the answer is $\\boxed{4}$.", "4", 1),
    ("The answer is $\\boxed{7}$. Hmm, actually let me recheck: it is $\\boxed{8}$.", "7", 0),
    ("The answer is $\\boxed{7}$. Hmm, actually let me recheck: it is $\\boxed{8}$.", "8", 1),
    ("\\boxed 5", "5", 1),
    ("so the result is \\fbox{12}", "12", 1),
])

# ---------------------------------------------------------------- no answer
add_raw("no answer", MV, [
    ("I think the answer is 5.", "5", 0), ("The final answer is $5$. I hope it is correct.", "5", 0),
    ("", "5", 0), ("\\boxed{}", "5", 0), ("Therefore the answer is \\boxed{", "5", 0),
    ("<think>The answer should be \\boxed{5}</think> I could not finish.", "5", 0),
    ("The result follows, $x = 12$.", "12", 0), ("Answer: 42", "42", 0),
])

# ---------------------------------------------------------------- very long responses
_FILL = "We expand the product, collect like terms and check each case against the constraints. "
add_raw("very long responses", MV, [
    (_FILL * 1500 + "Therefore the answer is $\\boxed{\\frac{7}{3}}$.", "\\frac{7}{3}", 1),
    (_FILL * 1500 + "Therefore the answer is $\\boxed{\\frac{7}{3}}$.", "\\frac{3}{7}", 0),
    ("$\\boxed{9}$ " + _FILL * 1500 + " so, in the end, $\\boxed{11}$.", "11", 1),
    ("$\\boxed{9}$ " + _FILL * 1500 + " so, in the end, $\\boxed{11}$.", "9", 0),
    (_FILL * 1500 + "no final answer was reached", "11", 0),
    ("x" * 130_000 + " $\\boxed{2}$", "2", 1),
    ("\\boxed{1}" + _FILL * 1500, "1", 1),
    (_FILL * 1500 + "$\\boxed{(-\\infty,-3]\\cup[2,\\infty)}$", "(-\\infty, -3] \\cup [2, \\infty)", 1),
])

# ---------------------------------------------------------------- degenerate answers vs numeric, symbolic, interval truths
_DEGENERATE = ["1/0", "0/0", "\\frac{1}{0}", "\\frac{0}{0}", "\\infty", "-\\infty", "nan", "\\text{nan}", "zoo",
               "\\log 0", "\\log(0)", "\\ln 0", "\\tan(\\pi/2)", "\\tan\\frac{\\pi}{2}", "\\infty-\\infty", "0\\cdot\\infty",
               "\\frac{\\infty}{\\infty}", "x/0"]
_TRUTHS = ["3", "-\\frac{1}{2}", "\\sqrt{2}", "x+1", "2\\pi r", "(0,1)", "[2,5]", "(-\\infty, 0)", "\\{1,2\\}", "(1,2)"]
for _i, _d in enumerate(_DEGENERATE):
    for _t in (_TRUTHS[_i % len(_TRUTHS)], _TRUTHS[(_i + 3) % len(_TRUTHS)], _TRUTHS[(_i + 7) % len(_TRUTHS)]):
        CASES.append({"category": "degenerate", "response": _say(_d), "truth": _t, "expected": False, "source": IS})
