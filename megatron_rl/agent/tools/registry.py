"""The tool registry: typed function tools and stateful tools by name, strict at both ends, and the
:class:`ToolSet` a multi-turn rollout calls.

Two kinds of tool, one protocol (:class:`Tool`, verl's ``BaseTool`` life cycle, synchronous):

- ``create(instance_id, **create_kwargs)`` once per trajectory (e.g. the GSM8K tool stores the ground truth),
- ``execute(instance_id, arguments) -> ToolResult | str`` per call,
- ``reward(instance_id) -> float`` the trajectory's tool reward so far (verl's ``calc_reward``),
- ``release(instance_id)`` when the trajectory ends.

A **function tool** is a plain typed function (``@register_tool("name")`` on it): its schema comes from its
hints and docstring (``tools/schema.py``), its arguments are checked against that schema before the call,
and it keeps no state. A **stateful tool** subclasses :class:`Tool` (``@register_tool("name")`` on the class);
it is built with the keyword arguments of its config entry and checks its own arguments (verl's tools read
a raw dict: :func:`~megatron_rl.agent.tools.schema.check_arguments` is there to use).

Registration: a name twice raises; an unknown name raises with the sorted list of names and how to add one
(a module that calls ``register_tool``, named under the config's top-level ``plugins:``).

Failures never raise out of :meth:`ToolSet.call`: an unknown tool, a malformed call, bad arguments, the
tool's exception or its time-out become a :class:`ToolResult` whose ``text`` the model reads and whose
``error`` kind is counted in :class:`ToolStats`. Tools are synchronous; an asyncio rollout awaits
:meth:`ToolSet.acall` (the call in a worker thread).
"""
from __future__ import annotations

import abc
import asyncio
import threading
import uuid
from collections import Counter
from collections.abc import Callable

from megatron_rl.agent.tools.schema import check_arguments, function_schema
from megatron_rl.agent.tools.types import (
    ERROR_KINDS,
    BadCall,
    ToolCall,
    ToolError,
    ToolResult,
)

_HOW = ("register one with @megatron_rl.agent.tools.register_tool(name) in a module named under the "
        "config's top-level `plugins:` key")


class Tool(abc.ABC):
    """A tool with per-trajectory state (module docstring). Subclasses set ``name`` and :meth:`schema`
    (or ``SCHEMA``: :func:`register_tool` refuses a class with neither) and implement :meth:`execute`; the default
    ``create`` / ``release`` keep a dict of ``create_kwargs`` per instance in ``self.instances``."""

    name: str = ""
    SCHEMA: dict | None = None

    def __init__(self, **config):
        if config:
            raise TypeError(f"tool {self.name!r} takes no config, got {sorted(config)}")
        self.instances: dict[str, dict] = {}

    def schema(self) -> dict:
        """The OpenAI function-tool schema (``{"type": "function", "function": {...}}``)."""
        return self.SCHEMA

    def create(self, instance_id: str, **create_kwargs) -> None:
        self.instances[instance_id] = dict(create_kwargs)

    @abc.abstractmethod
    def execute(self, instance_id: str, arguments: dict) -> ToolResult | str:
        """Run one call of the trajectory ``instance_id``: its result, or the text the model reads."""

    def reward(self, instance_id: str) -> float:
        return 0.0

    def release(self, instance_id: str) -> None:
        self.instances.pop(instance_id, None)


class FunctionTool(Tool):
    """A stateless tool around a typed function (schema from its hints and docstring)."""

    def __init__(self, fn: Callable, name: str):
        super().__init__()
        self.fn, self.name = fn, name
        self.SCHEMA = function_schema(fn, name)

    def execute(self, instance_id: str, arguments: dict) -> ToolResult | str:
        bad = check_arguments(self.SCHEMA, arguments)
        if bad:
            raise ToolError(bad, "bad_arguments")
        return self.fn(**arguments)


_TOOLS: dict[str, Callable[..., Tool]] = {}


def register_tool(name: str):
    """Decorator: register a typed function (a :class:`FunctionTool`) or a :class:`Tool` subclass (built with
    its config entry's keyword arguments) under ``name``. Registering a name twice raises."""

    def deco(obj):
        if not isinstance(name, str) or not name.isidentifier():
            raise ValueError(f"tool name {name!r}: use letters, digits and _ (the model writes it in JSON)")
        if name in _TOOLS:
            raise ValueError(f"tool {name!r} registered twice")
        if isinstance(obj, type) and issubclass(obj, Tool):
            if obj.SCHEMA is None and obj.schema is Tool.schema:
                raise TypeError(f"tool {name!r}: {obj.__name__} defines neither SCHEMA nor schema()")
            obj.name = name

            def factory(**config):
                return obj(**config)
        elif callable(obj):
            function_schema(obj, name)      # a missing hint or docstring fails at registration, not at the first call

            def factory(**config):
                if config:
                    raise TypeError(f"function tool {name!r} takes no config, got {sorted(config)}")
                return FunctionTool(obj, name)
        else:
            raise TypeError(f"register_tool({name!r}) decorates a function or a Tool subclass, got {obj!r}")
        _TOOLS[name] = factory
        return obj
    return deco


def tool_names() -> list[str]:
    """The registered names, sorted."""
    return sorted(_TOOLS)


def make_tool(name: str, **config) -> Tool:
    """A new tool of the registered ``name``; ``KeyError`` listing the valid names otherwise."""
    try:
        factory = _TOOLS[name]
    except KeyError:
        raise KeyError(f"unknown tool {name!r}; valid: {tool_names()}; {_HOW}") from None
    return factory(**config)


class ToolStats:
    """Counters of one :class:`ToolSet`: calls per tool, failures per kind (:data:`ERROR_KINDS`); thread-safe."""

    def __init__(self):
        self._lock = threading.Lock()
        self.calls: Counter = Counter()
        self.failures: Counter = Counter({k: 0 for k in ERROR_KINDS})

    def count(self, tool: str, result: ToolResult) -> None:
        with self._lock:
            self.calls[tool] += 1
            if result.error is not None:
                self.failures[result.error] += 1

    def metrics(self, prefix: str = "tool/") -> dict[str, int]:
        """Flat counters for the logger: ``tool/calls``, ``tool/calls/<tool>``, ``tool/failed/<kind>``."""
        with self._lock:
            out = {f"{prefix}calls": sum(self.calls.values())}
            out |= {f"{prefix}calls/{k}": v for k, v in sorted(self.calls.items())}
            out |= {f"{prefix}failed/{k}": v for k, v in self.failures.items()}
        return out


def _first_line(e: BaseException) -> str:
    return (str(e).splitlines() or [""])[0][:300]


class ToolSet:
    """The tools of one run (built once per rollout worker) and their counters.

    ``ToolSet({"calculator": {}, "code_interpreter": {"wall_s": 5}})`` or ``ToolSet(["calculator"])``; an
    unknown name raises at construction (module docstring)."""

    def __init__(self, tools: dict[str, dict] | list[str] | tuple[str, ...]):
        spec = {n: {} for n in tools} if isinstance(tools, (list, tuple)) else dict(tools)
        self.tools: dict[str, Tool] = {n: make_tool(n, **(cfg or {})) for n, cfg in spec.items()}
        self.stats = ToolStats()

    def schemas(self) -> list[dict]:
        """The schemas for ``apply_chat_template(tools=...)``, in configuration order."""
        return [t.schema() for t in self.tools.values()]

    def create(self, instance_id: str | None = None, tools_kwargs: dict | None = None) -> str:
        """Start a trajectory: ``create`` on every tool; ``tools_kwargs`` is verl's per-sample
        ``{tool: {"create_kwargs": {...}}}`` (e.g. the GSM8K ground truth). Returns the instance id."""
        instance_id = instance_id or uuid.uuid4().hex
        tools_kwargs = tools_kwargs or {}
        unknown = sorted(set(tools_kwargs) - set(self.tools))
        if unknown:
            raise KeyError(f"tools_kwargs names tools this run does not have: {unknown}; configured: {sorted(self.tools)}")
        for n, t in self.tools.items():
            t.create(instance_id, **(tools_kwargs.get(n) or {}).get("create_kwargs", {}))
        return instance_id

    def release(self, instance_id: str) -> None:
        for t in self.tools.values():
            t.release(instance_id)

    def rewards(self, instance_id: str) -> dict[str, float]:
        """Each tool's reward for the trajectory (verl's ``calc_reward``)."""
        return {n: float(t.reward(instance_id)) for n, t in self.tools.items()}

    def call(self, instance_id: str, call: ToolCall | BadCall) -> ToolResult:
        """Run one parsed call; never raises for a bad call (module docstring); counts the outcome."""
        result = self._run(instance_id, call)
        # a name the run lacks is counted as "<unknown>": the model's spelling must not grow the metric keys
        key = call.name if call.name in self.tools else ("<unparsed>" if isinstance(call, BadCall) else "<unknown>")
        self.stats.count(key, result)
        return result

    async def acall(self, instance_id: str, call: ToolCall | BadCall) -> ToolResult:
        return await asyncio.to_thread(self.call, instance_id, call)

    def _run(self, instance_id: str, call: ToolCall | BadCall) -> ToolResult:
        if isinstance(call, BadCall):
            return ToolResult(f"Error: {call.reason}", "malformed_call")
        tool = self.tools.get(call.name)
        if tool is None:
            return ToolResult(f"Error: unknown tool {call.name!r}; available: {sorted(self.tools)}", "unknown_tool")
        if not isinstance(call.arguments, dict):
            return ToolResult(f"Error: {call.name}: arguments must be a JSON object", "bad_arguments")
        try:
            out = tool.execute(instance_id, call.arguments)
        except ToolError as e:
            return ToolResult(f"Error: {_first_line(e)}", e.kind)
        except Exception as e:  # noqa: BLE001 (the tool's own failure goes back to the model as text, counted)
            return ToolResult(f"Error: {call.name} raised {type(e).__name__}: {_first_line(e)}", "tool_exception")
        return out if isinstance(out, ToolResult) else ToolResult(str(out))
