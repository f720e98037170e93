"""Hermes-format tool calls: read them from the assistant's text, write the tool responses back as the chat
template renders them (the format of Qwen2.5 / Qwen3 chat templates and of vLLM's ``hermes`` parser).

**Calls.** The model writes one block per call, several in one turn for parallel calls::

    <tool_call>
    {"name": "calculator", "arguments": {"expression": "2 + 2"}}
    </tool_call>

:func:`parse_tool_calls` returns the text before the first block (the turn's ``content``, as vLLM's hermes
parser) and one :class:`~megatron_rl.agent.tools.types.ToolCall` per block, in order. A block that cannot be
read is a :class:`~megatron_rl.agent.tools.types.BadCall` with the reason (the model reads it as the call's
error result), never an exception: JSON that does not parse, JSON that is not an object, no string ``name``,
``arguments`` that are not an object, or a ``<tool_call>`` never closed (the generation stopped inside it).
``arguments`` given as a string holding a JSON object (OpenAI's wire form) are read as that object; missing
``arguments`` are ``{}``.

**Responses.** The templates render each ``{"role": "tool", "content": ...}`` message as
``\\n<tool_response>\\n{content}\\n</tool_response>``, consecutive tool messages inside one ``user`` turn
(``<|im_start|>user`` ... ``<|im_end|>\\n``). :func:`tool_messages` gives the messages for
``apply_chat_template``; :func:`render_tool_responses` the same text directly, for a rollout that appends
token ids turn by turn without re-rendering the conversation. :func:`render_tool_calls` writes calls the way
the templates render an assistant message's ``tool_calls`` (the arguments with ``json.dumps``, as the
templates' ``tojson``).
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass

from megatron_rl.agent.tools.types import BadCall, ToolCall, ToolResult

OPEN, CLOSE = "<tool_call>", "</tool_call>"
_BLOCK = re.compile(re.escape(OPEN) + r"(.*?)" + re.escape(CLOSE), re.DOTALL)
IM_START, IM_END = "<|im_start|>", "<|im_end|>"
GENERATION_PROMPT = f"{IM_START}assistant\n"
"""What the templates append with ``add_generation_prompt`` (Qwen3 with thinking off adds ``<think>\\n\\n</think>\\n\\n``)."""


@dataclass(frozen=True)
class ParsedTurn:
    """An assistant turn read for tool calls: its ``content`` and its ``calls`` in order."""

    content: str
    calls: tuple[ToolCall | BadCall, ...]


def _read_call(raw: str) -> ToolCall | BadCall:
    body = raw.strip()
    try:
        obj = json.loads(body)
    except json.JSONDecodeError as e:
        return BadCall(raw, f"malformed JSON in <tool_call>: {e.msg} (line {e.lineno}, column {e.colno})")
    except RecursionError:
        return BadCall(raw, "malformed JSON in <tool_call>: nested too deeply")
    if not isinstance(obj, dict):
        return BadCall(raw, f"<tool_call> must hold a JSON object with \"name\" and \"arguments\", got {type(obj).__name__}")
    name = obj.get("name")
    if not isinstance(name, str) or not name:
        return BadCall(raw, "<tool_call> has no \"name\" string")
    args = obj.get("arguments", {})
    if isinstance(args, str):
        try:
            args = json.loads(args) if args.strip() else {}
        except json.JSONDecodeError as e:
            return BadCall(raw, f"{name}: \"arguments\" is a string that is not JSON: {e.msg}", name)
    if not isinstance(args, dict):
        return BadCall(raw, f"{name}: \"arguments\" must be a JSON object, got {type(args).__name__}", name)
    return ToolCall(name, args, raw)


def parse_tool_calls(text: str) -> ParsedTurn:
    """The assistant turn's content and tool calls (module docstring)."""
    first = text.find(OPEN)
    if first < 0:
        return ParsedTurn(text, ())
    calls: list[ToolCall | BadCall] = []
    end = first
    for m in _BLOCK.finditer(text, first):
        calls.append(_read_call(m.group(1)))
        end = m.end()
    rest = text.find(OPEN, end)
    if rest >= 0:
        calls.append(BadCall(text[rest:], "unterminated <tool_call> block (no </tool_call>)"))
    return ParsedTurn(text[:first].strip(), tuple(calls))


def tool_messages(calls, results: list[ToolResult]) -> list[dict]:
    """``{"role": "tool", "name": ..., "content": result.text}`` per call, in order, for ``apply_chat_template``."""
    calls, results = list(calls), list(results)
    if len(calls) != len(results):
        raise ValueError(f"tool_messages: {len(calls)} calls but {len(results)} results")
    return [{"role": "tool", "name": c.name, "content": r.text} for c, r in zip(calls, results)]


def render_tool_responses(texts, generation_prompt: str | None = GENERATION_PROMPT) -> str:
    """The text the templates render for consecutive tool messages with these contents, then the generation
    prompt (``None``: none). Empty ``texts`` render nothing."""
    texts = list(texts)
    if not texts:
        return ""
    body = "".join(f"\n<tool_response>\n{t}\n</tool_response>" for t in texts)
    return f"{IM_START}user{body}{IM_END}\n" + (generation_prompt or "")


def render_tool_calls(calls) -> str:
    """The ``<tool_call>`` blocks of an assistant message's ``tool_calls`` as Qwen2.5's template renders them
    after the message's content (each preceded by a newline; no ``<|im_end|>``). Qwen3's template leaves out
    the newline before the first block when the message has no content."""
    return "".join('\n<tool_call>\n{"name": "' + c.name + '", "arguments": '
                   + json.dumps(c.arguments, ensure_ascii=False) + "}\n</tool_call>" for c in calls)
