"""What the tool-call parser, the tool registry and a multi-turn rollout exchange (a leaf: standard library only).

- :class:`ToolCall`: one parsed call, ``name`` + ``arguments`` (a dict);
- :class:`BadCall`: a ``<tool_call>`` block that could not be read (malformed JSON, no name); dispatching
  it gives an error result, never an exception;
- :class:`ToolResult`: what goes back to the model (``text``), the failure kind (``error``, one of
  :data:`ERROR_KINDS`, ``None`` when the call succeeded), a step reward and metrics;
- :class:`ToolError` / :class:`ToolTimeout`: what a tool raises to report a failure of a given kind.
"""
from __future__ import annotations

from dataclasses import dataclass, field

ERROR_KINDS = ("unknown_tool", "malformed_call", "bad_arguments", "tool_exception", "timeout", "resource_limit")
"""Failure kinds a call is counted under: ``unknown_tool`` (a name the run did not configure),
``malformed_call`` (a ``<tool_call>`` block that is not JSON, or has no ``name``), ``bad_arguments`` (arguments
that are not an object, miss a required field, name an unknown one or have the wrong type), ``tool_exception``
(the tool raised), ``timeout`` (the tool's wall clock ran out), ``resource_limit`` (the sandbox killed the
code at its CPU-time or output limit)."""


@dataclass(frozen=True)
class ToolCall:
    """One call the model made: the tool's ``name`` and its ``arguments`` (a JSON object)."""

    name: str
    arguments: dict
    raw: str = ""
    """The text of the block it was parsed from ("" when built directly)."""


@dataclass(frozen=True)
class BadCall:
    """A ``<tool_call>`` block that could not be read as a call; ``reason`` says why (one line)."""

    raw: str
    reason: str
    name: str = ""
    """The name when one could be read (arguments that are not an object), else ""."""


@dataclass(frozen=True)
class ToolResult:
    """The outcome of one call.

    ``text`` is what the model reads in its ``<tool_response>`` (the error message on failure);
    ``error`` is ``None`` on success, else one of :data:`ERROR_KINDS`; ``reward`` is the call's step
    reward (verl's ``tool_reward``; 0.0 for most tools); ``metrics`` are numbers the tool reports.
    """

    text: str
    error: str | None = None
    reward: float = 0.0
    metrics: dict = field(default_factory=dict)

    def __post_init__(self):
        if self.error is not None and self.error not in ERROR_KINDS:
            raise ValueError(f"ToolResult.error: {self.error!r} is not one of {list(ERROR_KINDS)}")

    @property
    def ok(self) -> bool:
        return self.error is None


class ToolError(Exception):
    """Raised by a tool to fail a call with a kind from :data:`ERROR_KINDS` (default ``bad_arguments``);
    the message is what the model reads."""

    def __init__(self, message: str, kind: str = "bad_arguments"):
        if kind not in ERROR_KINDS:
            raise ValueError(f"ToolError kind {kind!r} is not one of {list(ERROR_KINDS)}")
        super().__init__(message)
        self.kind = kind


class ToolTimeout(ToolError):
    """A tool ran out of its wall-clock budget."""

    def __init__(self, message: str):
        super().__init__(message, "timeout")
