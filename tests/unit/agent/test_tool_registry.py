"""The tool registry (megatron_rl/agent/tools/registry.py, schema.py): schemas from type hints and docstrings,
strict registration, the verl-style create / execute / release life cycle, and bad calls that come back as
counted error results instead of exceptions."""
from __future__ import annotations

import asyncio
from typing import Literal

import pytest

from megatron_rl.agent.tools import (
    ERROR_KINDS,
    BadCall,
    Tool,
    ToolCall,
    ToolError,
    ToolResult,
    ToolSet,
    ToolTimeout,
    make_tool,
    register_tool,
    tool_names,
)
from megatron_rl.agent.tools.schema import (
    check_arguments,
    function_schema,
    parse_docstring,
)


def lookup(city: str, days: int, units: Literal["metric", "imperial"] = "metric", detail: bool | None = None,
           hours: list[int] | None = None, scale: float = 1.0) -> str:
    """Look up the weather
    for a city.

    Args:
        city: The city's name.
        days (int): Days ahead,
            0 for today.
        units: The unit system.
        detail: Add details.
        hours: Hours of the day.
        scale: A factor.

    Returns:
        The forecast.
    """
    return f"{city}:{days}:{units}"


def test_schema_from_hints_and_docstring():
    # the OpenAI function-tool form that Qwen2.5 / Qwen3 templates render inside <tools></tools>
    assert function_schema(lookup) == {"type": "function", "function": {
        "name": "lookup", "description": "Look up the weather for a city.",
        "parameters": {"type": "object", "required": ["city", "days"], "properties": {
            "city": {"type": "string", "description": "The city's name."},
            "days": {"type": "integer", "description": "Days ahead, 0 for today."},
            "units": {"type": "string", "enum": ["metric", "imperial"], "description": "The unit system."},
            "detail": {"type": "boolean", "description": "Add details."},
            "hours": {"type": "array", "items": {"type": "integer"}, "description": "Hours of the day."},
            "scale": {"type": "number", "description": "A factor."}}}}}
    assert parse_docstring("One line.") == ("One line.", {})


def _no_hint(x) -> str:
    """Doc."""


def _no_doc(x: int) -> str:
    pass


def _bad_type(x: set) -> str:
    """Doc."""


def _star(*xs: int) -> str:
    """Doc."""


@pytest.mark.parametrize("fn, err, match", [
    (_no_hint, TypeError, "parameter 'x': no type hint"), (_no_doc, ValueError, "needs a docstring"),
    (_bad_type, TypeError, "has no JSON-schema type"), (_star, TypeError, r"\*args / \*\*kwargs")],
    ids=["no_hint", "no_docstring", "set", "varargs"])
def test_registration_refuses_functions_without_a_schema(fn, err, match):
    with pytest.raises(err, match=match):
        register_tool(f"t{fn.__name__}")(fn)
    assert f"t{fn.__name__}" not in tool_names()


@pytest.mark.parametrize("args, reason", [
    ({"city": "Oslo"}, "missing required argument(s) ['days']"),
    ({"city": "Oslo", "days": 1, "when": 2}, "unknown argument(s) ['when']"),
    ({"city": "Oslo", "days": True}, "argument 'days' must be integer"),
    ({"city": "Oslo", "days": 1.5}, "argument 'days' must be integer"),
    ({"city": "Oslo", "days": 1, "units": "kelvin"}, "argument 'units' must be string in ['metric', 'imperial']"),
    ({"city": "Oslo", "days": 1, "hours": [1, "2"]}, "argument 'hours' must be array"),
    (["Oslo", 1], "arguments must be a JSON object, got list"),
    ({"city": "Oslo", "days": 1, "scale": 2}, None),          # an integer is a JSON number
], ids=["missing", "unknown", "bool_for_int", "float_for_int", "enum", "array_item", "not_object", "ok"])
def test_check_arguments(args, reason):
    got = check_arguments(function_schema(lookup), args)
    assert got == reason if reason is None else reason in got


@register_tool("test_registry_lookup")
def _registered_lookup(city: str, days: int = 0) -> str:
    """Look up a city.

    Args:
        city: The city.
        days: Days ahead.
    """
    if city == "boom":
        raise RuntimeError("backend down\nsecond line")
    if city == "slow":
        raise ToolTimeout("lookup: no answer in 2 s")
    return f"{city} in {days} days: sunny"


COUNTER_SCHEMA = {"type": "function", "function": {"name": "test_registry_counter", "description": "Count.",
                                                  "parameters": {"type": "object", "properties": {}}}}


@register_tool("test_registry_counter")
class _Counter(Tool):
    """A stateful tool: counts per trajectory from a start given at create time."""

    SCHEMA = COUNTER_SCHEMA

    def __init__(self, step: int = 1):
        super().__init__()
        self.step = step

    def create(self, instance_id, start: int = 0):
        self.instances[instance_id] = {"n": start}

    def execute(self, instance_id, arguments):
        self.instances[instance_id]["n"] += self.step
        return ToolResult(str(self.instances[instance_id]["n"]), reward=0.5)

    def reward(self, instance_id):
        return float(self.instances[instance_id]["n"])


def test_registering_a_name_twice_raises():
    with pytest.raises(ValueError, match="tool 'test_registry_lookup' registered twice"):
        register_tool("test_registry_lookup")(_registered_lookup)
    with pytest.raises(ValueError, match="use letters, digits and _"):
        register_tool("my tool")(_registered_lookup)


def test_unknown_name_lists_the_valid_ones_and_how_to_register():
    with pytest.raises(KeyError) as e:
        ToolSet(["calculator", "no_such_tool"])
    msg = str(e.value)
    assert "unknown tool 'no_such_tool'" in msg and str(tool_names()) in msg and "plugins:" in msg
    assert tool_names() == sorted(tool_names()) and {"calculator", "code_interpreter", "calc_gsm8k_reward"} <= set(tool_names())
    with pytest.raises(TypeError, match="takes no config"):
        make_tool("test_registry_lookup", depth=3)


def test_stateful_tool_lifecycle_with_verl_tools_kwargs():
    ts = ToolSet({"test_registry_counter": {"step": 2}, "test_registry_lookup": {}})
    a = ts.create("traj-a", tools_kwargs={"test_registry_counter": {"create_kwargs": {"start": 10}}})
    b = ts.create()                                           # a fresh id, the default start
    call = ToolCall("test_registry_counter", {})
    assert [ts.call(a, call).text for _ in range(2)] == ["12", "14"] and ts.call(b, call).text == "2"
    assert ts.call(a, call).reward == 0.5
    assert ts.rewards(a) == {"test_registry_counter": 16.0, "test_registry_lookup": 0.0}
    ts.release(a)
    assert a not in ts.tools["test_registry_counter"].instances and b in ts.tools["test_registry_counter"].instances
    with pytest.raises(KeyError, match="tools_kwargs names tools this run does not have: \\['calculator'\\]"):
        ts.create(tools_kwargs={"calculator": {"create_kwargs": {}}})
    assert [s["function"]["name"] for s in ts.schemas()] == ["test_registry_counter", "test_registry_lookup"]


def test_every_bad_call_comes_back_as_counted_error_text():
    ts = ToolSet(["test_registry_lookup"])
    iid = ts.create()
    cases = [
        (ToolCall("test_registry_lookup", {"city": "Oslo", "days": 2}), None, "Oslo in 2 days: sunny"),
        (ToolCall("weather", {"city": "Oslo"}), "unknown_tool", "unknown tool 'weather'; available: ['test_registry_lookup']"),
        (BadCall("<tool_call>{oops</tool_call>", "malformed JSON in <tool_call>: Expecting property name"),
         "malformed_call", "Error: malformed JSON in <tool_call>"),
        (ToolCall("test_registry_lookup", {"town": "Oslo"}), "bad_arguments", "missing required argument(s) ['city']"),
        (ToolCall("test_registry_lookup", {"city": "boom"}), "tool_exception",
         "Error: test_registry_lookup raised RuntimeError: backend down"),
        (ToolCall("test_registry_lookup", {"city": "slow"}), "timeout", "Error: lookup: no answer in 2 s"),
    ]
    for call, kind, text in cases:
        r = ts.call(iid, call)
        assert r.error == kind and text in r.text and "\n" not in r.text, (call, r)
    m = ts.stats.metrics()
    assert m["tool/calls"] == 6 and m["tool/calls/test_registry_lookup"] == 4
    assert m["tool/calls/<unknown>"] == 1 and m["tool/calls/<unparsed>"] == 1     # the model's spelling is no key
    assert {k: m[f"tool/failed/{k}"] for k in ERROR_KINDS} == {
        "unknown_tool": 1, "malformed_call": 1, "bad_arguments": 1, "tool_exception": 1, "timeout": 1, "resource_limit": 0}
    r = asyncio.run(ts.acall(iid, ToolCall("test_registry_lookup", {"city": "Rome"})))
    assert r.text == "Rome in 0 days: sunny" and ts.stats.metrics()["tool/calls"] == 7


def test_result_and_error_kinds_are_checked():
    with pytest.raises(ValueError, match="ToolResult.error: 'oops' is not one of"):
        ToolResult("x", "oops")
    with pytest.raises(ValueError, match="ToolError kind 'oops'"):
        ToolError("x", "oops")
