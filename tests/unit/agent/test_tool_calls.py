"""Hermes-format tool calls (megatron_rl/agent/tool_calls.py).

The expected strings follow the ``chat_template`` of Qwen2.5-*-Instruct's ``tokenizer_config.json`` (Qwen3's is
the same in these branches): an assistant message's ``tool_calls`` render as
``'\\n<tool_call>\\n{"name": "' + name + '", "arguments": ' + (arguments | tojson) + '}\\n</tool_call>'`` each;
a ``tool`` message as ``'\\n<tool_response>\\n' + content + '\\n</tool_response>'``, with ``'<|im_start|>user'``
before the first of consecutive tool messages and ``'<|im_end|>\\n'`` after the last; the generation prompt is
``'<|im_start|>assistant\\n'``. The repository's test fixtures hold no Qwen tokenizer to render them with.
"""
from __future__ import annotations

import pytest

from megatron_rl.agent.tool_calls import (
    ParsedTurn,
    parse_tool_calls,
    render_tool_calls,
    render_tool_responses,
    tool_messages,
)
from megatron_rl.agent.tools import BadCall, ToolCall, ToolResult, ToolSet

# what Qwen2.5-7B-Instruct writes for two parallel calls (the template's own rendering of tool_calls)
QWEN_TURN = ('Let me compute both.\n<tool_call>\n{"name": "calculator", "arguments": {"expression": "2 + 2"}}\n</tool_call>'
             '\n<tool_call>\n{"name": "calc_gsm8k_reward", "arguments": {"answer": "72"}}\n</tool_call>')


def test_parses_parallel_calls_in_order_and_the_content_before_them():
    turn = parse_tool_calls(QWEN_TURN)
    assert turn.content == "Let me compute both."
    assert [(c.name, c.arguments) for c in turn.calls] == [("calculator", {"expression": "2 + 2"}),
                                                           ("calc_gsm8k_reward", {"answer": "72"})]
    assert parse_tool_calls("The answer is 4.") == ParsedTurn("The answer is 4.", ())


def test_render_of_calls_is_the_templates_and_parses_back():
    calls = [ToolCall("calculator", {"expression": "2 + 2"}), ToolCall("calc_gsm8k_reward", {"answer": "72"})]
    assert "Let me compute both." + render_tool_calls(calls) == QWEN_TURN
    assert [(c.name, c.arguments) for c in parse_tool_calls(render_tool_calls(calls)).calls] == [
        (c.name, c.arguments) for c in calls]
    uni = ToolCall("lookup", {"city": "Zürich"})       # tojson keeps non-ASCII characters as they are
    assert render_tool_calls([uni]) == '\n<tool_call>\n{"name": "lookup", "arguments": {"city": "Zürich"}}\n</tool_call>'


@pytest.mark.parametrize("block, reason, name", [
    ('{"name": "calculator", "arguments": {"expression": "1+1"}', "malformed JSON in <tool_call>: Expecting ',' delimiter", ""),
    ("{'name': 'calculator'}", "malformed JSON in <tool_call>: Expecting property name enclosed in double quotes", ""),
    ('["calculator", {}]', 'must hold a JSON object with "name" and "arguments", got list', ""),
    ('{"arguments": {}}', 'has no "name" string', ""),
    ('{"name": "calculator", "arguments": [1, 2]}', '"arguments" must be a JSON object, got list', "calculator"),
    ('{"name": "calculator", "arguments": "{oops"}', '"arguments" is a string that is not JSON', "calculator"),
    ("", "malformed JSON in <tool_call>: Expecting value", ""),
], ids=["unclosed_brace", "single_quotes", "list", "no_name", "args_list", "args_bad_string", "empty"])
def test_malformed_blocks_are_bad_calls_not_exceptions(block, reason, name):
    turn = parse_tool_calls(f"<tool_call>\n{block}\n</tool_call>\n<tool_call>\n"
                            '{"name": "calculator", "arguments": {"expression": "3*3"}}\n</tool_call>')
    bad, good = turn.calls
    assert isinstance(bad, BadCall) and reason in bad.reason and bad.name == name
    assert isinstance(good, ToolCall) and good.arguments == {"expression": "3*3"}   # the next call still counts


def test_openai_string_arguments_missing_arguments_and_an_unterminated_block():
    turn = parse_tool_calls('<tool_call>{"name": "calculator", "arguments": "{\\"expression\\": \\"1+2\\"}"}</tool_call>'
                            '<tool_call>{"name": "now"}</tool_call><tool_call>\n{"name": "calculator", "argu')
    a, b, c = turn.calls
    assert (a.name, a.arguments, b.name, b.arguments) == ("calculator", {"expression": "1+2"}, "now", {})
    assert isinstance(c, BadCall) and "unterminated <tool_call> block" in c.reason


def test_tool_responses_render_as_the_template_groups_them():
    assert render_tool_responses(["4", "Current parsed answer='72' reward=1.0"]) == (
        "<|im_start|>user\n<tool_response>\n4\n</tool_response>\n<tool_response>\n"
        "Current parsed answer='72' reward=1.0\n</tool_response><|im_end|>\n<|im_start|>assistant\n")
    assert render_tool_responses(["x"], generation_prompt=None) == "<|im_start|>user\n<tool_response>\nx\n</tool_response><|im_end|>\n"
    assert render_tool_responses([]) == ""


def test_a_turn_from_text_to_responses_never_raises():
    ts = ToolSet(["calculator"])
    iid = ts.create()
    turn = parse_tool_calls('<tool_call>{"name": "calculator", "arguments": {"expression": "6*7"}}</tool_call>'
                            '<tool_call>{"name": "calculator", "arguments": {"expression": "6*"}}</tool_call>'
                            "<tool_call>{not json}</tool_call>")
    results = [ts.call(iid, c) for c in turn.calls]
    assert [r.error for r in results] == [None, "bad_arguments", "malformed_call"]
    msgs = tool_messages(turn.calls, results)
    assert [m["role"] for m in msgs] == ["tool"] * 3 and msgs[0] == {"role": "tool", "name": "calculator", "content": "42"}
    text = render_tool_responses(m["content"] for m in msgs)
    assert text.count("<tool_response>") == 3 and "\n42\n" in text and "Error: malformed JSON" in text
    with pytest.raises(ValueError, match="2 calls but 1 results"):
        tool_messages(turn.calls[:2], [ToolResult("x")])
