"""The built-in tools: ``calculator`` (safe arithmetic), ``code_interpreter`` (Python in the process sandbox)
and ``calc_gsm8k_reward`` (verl's GSM8K answer tool), registered when the package is imported.

**calculator** parses the expression with :mod:`ast` and evaluates only numbers, ``+ - * / // % **``, unary
signs, the constants ``pi e tau`` and the whitelisted functions of :data:`FUNCTIONS`; no names, attributes,
subscripts, comprehensions or other calls are evaluated. Bounds (the adversarial inputs a policy finds):
:data:`MAX_CHARS` characters, :data:`MAX_NODES` syntax nodes, integer results of at most
:data:`MAX_INT_BITS` bits (checked *before* a power or product is computed, so ``9**9**9`` costs nothing),
``factorial`` of at most :data:`MAX_FACTORIAL`, finite floats. Departure: ``^`` is read as a power (as people
write it), not Python's xor.

**code_interpreter** (verl's name in its sandbox-fusion tool config; one parameter, ``code``) runs the code
in a fresh sandboxed interpreter per call (``tools/sandbox.py``): nothing survives between calls. The model
reads stdout, then stderr; a time-out is the ``timeout`` kind, a CPU-time, output or memory limit the
``resource_limit`` kind; the code's own exception is an ordinary result (the model reads the traceback).

**calc_gsm8k_reward** behaves as verl's ``Gsm8kTool`` (verl ``verl/tools/gsm8k_tool.py``, read at commit
2066bae): ``create(instance_id, ground_truth=...)`` stores the ground truth; ``execute({"answer": ...})``
scores ``"#### " + answer`` with verl's flexible GSM8K rule (the last number; here
``rewards/verl_rules.gsm8k_verdict``), reward 1.0 / 0.0, returns ``Current parsed answer='...' reward=...``,
and a step reward of 0.0 when the answer improved on the previous one, else -0.05; a non-string answer is
read as its ``str``, other keys are ignored (as verl); :meth:`~Gsm8kRewardTool.reward` is the last score.
"""
from __future__ import annotations

import ast
import math
import operator

from megatron_rl.agent.tools.registry import Tool, register_tool
from megatron_rl.agent.tools.sandbox import Sandbox, SandboxLimits
from megatron_rl.agent.tools.schema import check_arguments
from megatron_rl.agent.tools.types import ToolError, ToolResult
from megatron_rl.rewards.verl_rules import gsm8k_verdict

MAX_CHARS = 1000
MAX_NODES = 300
MAX_INT_BITS = 4096
"""About 1,233 decimal digits."""
MAX_FACTORIAL = 450

CONSTANTS = {"pi": math.pi, "e": math.e, "tau": math.tau}
FUNCTIONS = {
    "sqrt": math.sqrt, "exp": math.exp, "log": math.log, "log2": math.log2, "log10": math.log10,
    "sin": math.sin, "cos": math.cos, "tan": math.tan, "asin": math.asin, "acos": math.acos, "atan": math.atan,
    "atan2": math.atan2, "sinh": math.sinh, "cosh": math.cosh, "tanh": math.tanh, "degrees": math.degrees,
    "radians": math.radians, "abs": abs, "round": round, "floor": math.floor, "ceil": math.ceil,
    "gcd": math.gcd, "lcm": math.lcm, "min": min, "max": max, "hypot": math.hypot,
    "factorial": math.factorial, "comb": math.comb, "perm": math.perm,
}
_BINOPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
           ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod, ast.Pow: operator.pow, ast.BitXor: operator.pow}


def _bad(msg: str):
    raise ToolError(f"calculator: {msg}", "bad_arguments")


def _bits(x) -> int:
    return abs(x).bit_length() if isinstance(x, int) else 0


def _checked(v):
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        _bad(f"result is not a number: {type(v).__name__}")
    if isinstance(v, int) and v.bit_length() > MAX_INT_BITS:
        _bad(f"result too large (more than {MAX_INT_BITS} bits)")
    if isinstance(v, float) and not math.isfinite(v):
        _bad("result is not finite (overflow)")
    return v


def _power(a, b):
    # |a| ** b has more than (bits(a) - 1) * b bits: refuse before computing; what passes has at most
    # 2 * MAX_INT_BITS bits (cheap), and _checked refuses it if above MAX_INT_BITS
    if isinstance(a, int) and isinstance(b, int) and b > 0 and (_bits(a) - 1) * b > MAX_INT_BITS:
        _bad(f"{str(a)[:40]} ** {b} is too large (more than {MAX_INT_BITS} bits)")
    return a ** b


def _eval(node):
    if isinstance(node, ast.Expression):
        return _eval(node.body)
    if isinstance(node, ast.Constant):
        if isinstance(node.value, bool) or not isinstance(node.value, (int, float)):
            _bad(f"only numbers are allowed, got {node.value!r:.40}")
        return _checked(node.value)
    if isinstance(node, ast.Name):
        if node.id in CONSTANTS:
            return CONSTANTS[node.id]
        _bad(f"unknown name {node.id!r}; constants: {sorted(CONSTANTS)}")
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.UAdd, ast.USub)):
        v = _eval(node.operand)
        return v if isinstance(node.op, ast.UAdd) else -v
    if isinstance(node, ast.BinOp) and type(node.op) in _BINOPS:
        a, b = _eval(node.left), _eval(node.right)
        if isinstance(node.op, (ast.Pow, ast.BitXor)):
            return _checked(_power(a, b))
        if isinstance(node.op, ast.Mult) and _bits(a) + _bits(b) > MAX_INT_BITS + 1:
            _bad(f"result too large (more than {MAX_INT_BITS} bits)")
        return _checked(_BINOPS[type(node.op)](a, b))
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in FUNCTIONS:
        if node.keywords:
            _bad(f"{node.func.id}: keyword arguments are not allowed")
        args = [_eval(a) for a in node.args]
        if node.func.id in ("factorial", "comb", "perm") and any(isinstance(a, int) and a > MAX_FACTORIAL for a in args):
            _bad(f"{node.func.id}: arguments above {MAX_FACTORIAL} are not allowed")
        try:
            return _checked(FUNCTIONS[node.func.id](*args))
        except (ArithmeticError, ValueError, TypeError) as e:     # sqrt(-1), factorial(2.5), log(0), min()
            _bad(f"{node.func.id}: {type(e).__name__}: {e}")
    if isinstance(node, ast.Call):
        _bad(f"only these functions may be called: {sorted(FUNCTIONS)}")
    _bad(f"{type(node).__name__} is not allowed (numbers, + - * / // % **, and the listed functions only)")


def _format(v) -> str:
    if isinstance(v, float) and v.is_integer() and abs(v) < 1e15:
        return str(int(v))
    return f"{v:.12g}" if isinstance(v, float) else str(v)


@register_tool("calculator")
def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression and return its value.

    Args:
        expression: Numbers, + - * / // % ** (or ^), parentheses, the constants pi, e, tau and the functions
            sqrt, exp, log, log2, log10, sin, cos, tan, floor, ceil, round, abs, min, max, gcd, lcm,
            factorial, comb, perm. Example: "sqrt(2) * (3 + 4) ** 2".
    """
    text = expression.strip().rstrip("=").replace("×", "*").replace("÷", "/")
    if len(text) > MAX_CHARS:
        _bad(f"expression longer than {MAX_CHARS} characters")
    try:
        tree = ast.parse(text, mode="eval")
    except (SyntaxError, ValueError, RecursionError, MemoryError) as e:
        _bad(f"cannot parse {text[:80]!r}: {type(e).__name__}")
    if sum(1 for _ in ast.walk(tree)) > MAX_NODES:
        _bad(f"expression has more than {MAX_NODES} parts")
    try:
        return _format(_eval(tree))
    except ToolError:
        raise
    except (ArithmeticError, ValueError, TypeError) as e:    # 1/0, sqrt(-1), factorial(2.5), log(0)
        _bad(f"{type(e).__name__}: {e}")


_CODE_SCHEMA = {"type": "function", "function": {
    "name": "code_interpreter",
    "description": "Run Python 3 code in a fresh sandboxed interpreter (no network, no state kept between "
                   "calls) and return what it prints to stdout and stderr. Use print() to see values.",
    "parameters": {"type": "object", "properties": {"code": {"type": "string", "description": "The Python code to run."}},
                   "required": ["code"]}}}


@register_tool("code_interpreter")
class CodeInterpreter(Tool):
    """Python in the process sandbox (module docstring); config: the :class:`SandboxLimits` fields and ``python``."""

    SCHEMA = _CODE_SCHEMA

    def __init__(self, python: str | None = None, **limits):
        super().__init__()
        self.limits = SandboxLimits(**limits)
        self.sandbox = Sandbox(self.limits, python=python)
        self.sandbox.probe()          # a host that cannot isolate fails when the tool set is built

    def execute(self, instance_id: str, arguments: dict) -> ToolResult:
        bad = check_arguments(self.SCHEMA, arguments)
        if bad:
            raise ToolError(bad, "bad_arguments")
        r = self.sandbox.run(arguments["code"])
        text = r.stdout + r.stderr
        lim, error, note = self.limits, None, ""
        if r.timed_out:
            error, note = "timeout", f"Error: time-out: the code ran past {lim.wall_s:g} s (wall clock) and was stopped"
        elif r.truncated:
            error, note = "resource_limit", f"[output truncated at {lim.output_bytes} bytes; the code was stopped]"
        elif r.cpu_limited:
            error, note = "resource_limit", f"Error: the code used its {lim.cpu_s} s of CPU time and was stopped"
        elif r.returncode and r.stderr.rstrip().rsplit("\n", 1)[-1].startswith("MemoryError"):
            error = "resource_limit"
        text = "\n".join(s for s in (text.rstrip("\n"), note) if s) or "(no output)"
        return ToolResult(text, error, metrics={"seconds": r.seconds, "returncode": r.returncode})


_GSM8K_SCHEMA = {"type": "function", "function": {
    "name": "calc_gsm8k_reward",
    "description": "Check an answer to the GSM8K problem: returns the answer as parsed and its reward "
                   "(1.0 correct, 0.0 otherwise).",
    "parameters": {"type": "object", "properties": {
        "answer": {"type": "string", "description": "The final answer to the problem, a number."}},
        "required": ["answer"]}}}

NO_IMPROVEMENT_PENALTY = -0.05
"""verl's step reward for an answer that does not improve on the previous one."""


@register_tool("calc_gsm8k_reward")
class Gsm8kRewardTool(Tool):
    """verl's GSM8K tool (module docstring)."""

    SCHEMA = _GSM8K_SCHEMA

    def create(self, instance_id: str, ground_truth=None, **_ignored) -> None:
        self.instances[instance_id] = {"ground_truth": ground_truth, "reward": 0.0}

    def execute(self, instance_id: str, arguments: dict) -> ToolResult:
        state = self.instances.get(instance_id)
        if state is None:
            raise ToolError(f"calc_gsm8k_reward: no trajectory {instance_id!r} (create() it first)", "tool_exception")
        answer = arguments.get("answer", "")
        answer = answer if isinstance(answer, str) else str(answer)
        response = answer if answer.startswith("#### ") else "#### " + answer
        reward = float(gsm8k_verdict(response, state["ground_truth"], flexible=True))
        step = 0.0 if reward > state["reward"] else NO_IMPROVEMENT_PENALTY
        state["reward"] = reward
        return ToolResult(f"Current parsed answer={answer!r} reward={reward!r}", reward=step)

    def reward(self, instance_id: str) -> float:
        return self.instances[instance_id]["reward"]
