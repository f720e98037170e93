"""The built-in tools (megatron_rl/agent/tools/builtin.py): the calculator's arithmetic and its refusals of
the adversarial inputs a policy finds, verl's GSM8K tool behaviour, the code interpreter through a ToolSet."""
from __future__ import annotations

import math
import time

import pytest

from megatron_rl.agent.tools import ToolCall, ToolSet
from megatron_rl.agent.tools.builtin import MAX_INT_BITS, calculator

CALC = ToolSet(["calculator"])


def calc(expression: str):
    return CALC.call("t", ToolCall("calculator", {"expression": expression}))


# expected values by hand / Python's own arithmetic on the literal
@pytest.mark.parametrize("expr, want", [
    ("2 + 3 * 4", "14"), ("(2 + 3) * 4", "20"), ("2 ** 10", "1024"), ("2^10", "1024"), ("-3 ** 2", "-9"),
    ("7 / 2", "3.5"), ("7 // 2", "3"), ("-7 % 3", "2"), ("10 / 4 * 2", "5"), ("1e3 + 1", "1001"),
    ("sqrt(16) + abs(-2)", "6"), ("factorial(10)", "3628800"), ("round(pi, 4)", "3.1416"),
    ("max(3, 9, 4) - min(2, 5)", "7"), ("log(e ** 2)", "2"), ("gcd(12, 18)", "6"), ("3 × 4 ÷ 6", "2"),
    ("0.1 + 0.2", "0.3"), ("2 ** 100", str(2**100)), ("48 / 2 = ", "24"), ("1/3", "0.333333333333"),
], ids=lambda v: v if isinstance(v, str) and len(v) < 20 else None)
def test_calculator_values(expr, want):
    r = calc(expr)
    assert (r.error, r.text) == (None, want)


# the adversarial class: code execution, attribute walks, huge results, malformed input; each refused fast
@pytest.mark.parametrize("expr, says", [
    ("__import__('os').system('echo hi')", "only these functions may be called"),
    ("().__class__.__bases__[0].__subclasses__()", "only these functions may be called"),
    ("pi.real", "Attribute is not allowed"), ("(1).__class__", "Attribute is not allowed"),
    ("open('/etc/passwd')", "only these functions may be called"),
    ("(lambda: 1)()", "only these functions may be called"), ("x + 1", "unknown name 'x'"),
    ("'a' * 10", "only numbers are allowed"), ("True + 1", "only numbers are allowed"), ("[1] * 10", "List is not allowed"),
    ("1 if 1 else 2", "IfExp is not allowed"), ("1 < 2", "Compare is not allowed"), ("sqrt(x=4)", "keyword arguments"),
    ("9 ** 9 ** 9", "too large"), ("10 ** 5000", "too large"), ("2 ** 4095 * 2 ** 4095", "too large"),
    ("factorial(100000)", "arguments above"), ("comb(10**6, 5000)", "arguments above"),
    ("1e308 * 10", "not finite"), ("exp(1000)", "OverflowError"), ("2.0 ** 5000", "OverflowError"),
    ("1 / 0", "ZeroDivisionError"), ("sqrt(-1)", "sqrt: ValueError"), ("(-8) ** (1/3)", "not a number: complex"),
    ("factorial(2.5)", "factorial: TypeError"), ("1 +", "cannot parse"), ("(" * 300 + "1" + ")" * 300, "cannot parse"),
    ("-" * 400 + "1", "more than 300 parts"), ("1+" * 600 + "1", "longer than 1000 characters"),
], ids=lambda v: v[:24] if isinstance(v, str) else None)
def test_calculator_refuses(expr, says):
    t0 = time.perf_counter()
    r = calc(expr)
    assert r.error == "bad_arguments" and says in r.text and r.text.startswith("Error: calculator:"), r
    assert time.perf_counter() - t0 < 0.5


def test_calculator_bit_bound_is_exact_at_the_limit():
    assert calculator(f"2 ** {MAX_INT_BITS - 1}") == str(2 ** (MAX_INT_BITS - 1))     # MAX_INT_BITS bits: allowed
    assert "too large" in calc(f"2 ** {MAX_INT_BITS}").text                               # one more bit: refused
    assert float(calculator("sin(pi / 6)")) == pytest.approx(0.5, abs=1e-12) and calculator("tau") == f"{math.tau:.12g}"


def test_gsm8k_tool_matches_verl():
    """verl ``verl/tools/gsm8k_tool.py`` (commit 2066bae): the answer prefixed with "#### " unless it has it,
    scored by verl's GSM8K rule in flexible mode (last number, compared as text), reward 1.0 / 0.0, step
    reward 0.0 if better than the previous answer else -0.05, text f"Current parsed {answer=} {reward=}"."""
    ts = ToolSet(["calc_gsm8k_reward"])
    a = ts.create(tools_kwargs={"calc_gsm8k_reward": {"create_kwargs": {"ground_truth": "72"}}})
    b = ts.create(tools_kwargs={"calc_gsm8k_reward": {"create_kwargs": {"ground_truth": "1000"}}})

    def ans(iid, value):
        r = ts.call(iid, ToolCall("calc_gsm8k_reward", {"answer": value}))
        assert r.error is None
        return r.text, r.reward

    answer, reward = "70", 0.0
    assert ans(a, "70") == (f"Current parsed {answer=} {reward=}", -0.05)      # not better than the start (0.0)
    answer, reward = "72", 1.0
    assert ans(a, "72") == (f"Current parsed {answer=} {reward=}", 0.0)        # improved
    assert ans(a, "#### 72") == ("Current parsed answer='#### 72' reward=1.0", -0.05)   # same score again
    assert ans(a, 72) == ("Current parsed answer='72' reward=1.0", -0.05)      # a number is read as its str
    assert ts.rewards(a)["calc_gsm8k_reward"] == 1.0
    assert ans(b, "It is 1000 dollars") == ("Current parsed answer='It is 1000 dollars' reward=1.0", 0.0)  # last number
    assert ans(b, "1,000")[0].endswith("reward=0.0")     # flexible mode keeps the comma: "1,000" != "1000"
    assert ts.rewards(b)["calc_gsm8k_reward"] == 0.0
    ts.release(a)
    r = ts.call(a, ToolCall("calc_gsm8k_reward", {"answer": "72"}))
    assert r.error == "tool_exception" and "create() it first" in r.text


def test_code_interpreter_through_a_toolset():
    ts = ToolSet({"code_interpreter": {"wall_s": 1.0, "cpu_s": 1, "output_bytes": 2000}})
    iid = ts.create()

    def run(code):
        return ts.call(iid, ToolCall("code_interpreter", {"code": code}))

    r = run("import math\nprint(math.comb(10, 3))\nx = 5")
    assert (r.text, r.error) == ("120", None)
    assert run("print(x)").text.endswith("NameError: name 'x' is not defined")     # no state between calls
    r = run("print('before')\nraise ValueError('bad input')")
    assert r.error is None and r.text.startswith("before\nTraceback") and r.text.endswith("ValueError: bad input")
    assert run("pass").text == "(no output)"
    r = run("import time\ntime.sleep(10)")
    assert r.error == "timeout" and "ran past 1 s (wall clock)" in r.text
    r = run("while True:\n    print('spam' * 100)")
    assert r.error == "resource_limit" and r.text.endswith("[output truncated at 2000 bytes; the code was stopped]")
    r = run("b = bytearray(64 * 2**30)")
    assert r.error == "resource_limit" and r.text.endswith("MemoryError")
    r = ts.call(iid, ToolCall("code_interpreter", {"source": "print(1)"}))
    assert r.error == "bad_arguments" and "missing required argument(s) ['code']" in r.text
    m = ts.stats.metrics()
    assert (m["tool/failed/timeout"], m["tool/failed/resource_limit"], m["tool/failed/bad_arguments"]) == (1, 2, 1)
