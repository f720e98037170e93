"""The agent loop (megatron_rl/agent/loop.py) on a real engine (``HFEngine``) and a real tokenizer whose chat
template is a real tool template (``tests/helpers/agent_fixture.py``).

Oracles: the chat template (the trajectory's tokens must be the template's rendering of the conversation), the
engine's own scoring (``HFEngine.score`` of the final sequence gives the log-prob recorded for every sampled
token: the context each turn was sampled in is the one the trajectory records).
"""
from __future__ import annotations

import dataclasses

import pytest

from megatron_rl.agent.loop import (
    Budgets,
    agent_loop_class,
    agent_loop_names,
    loop_metrics,
    register_agent_loop,
)
from megatron_rl.agent.template_check import template_drift
from megatron_rl.agent.tools import ToolSet
from megatron_rl.rollout.engine import SamplingParams

CALL = '<tool_call>\n{"name": "calculator", "arguments": {"expression": "2 + 2"}}\n</tool_call>'
SYSTEM = {"role": "system", "content": "You are a helpful assistant."}
USER = {"role": "user", "content": "What is 2 + 2?"}


@pytest.fixture(scope="module")
def setup(tool_model):
    from megatron_rl.data.tokenizer import load_tokenizer
    from megatron_rl.rollout.hf_engine import HFEngine

    return load_tokenizer(tool_model, {"enable_thinking": True}), HFEngine(str(tool_model), max_model_len=512), tool_model


def _loop(tok, name="tool_agent", **budgets):
    return agent_loop_class(name)(tok, ToolSet(["calculator"]), Budgets(**{"max_response_tokens": 96, **budgets}))


def _prefilled(tok) -> list[int]:
    """[system, user] + generation prompt + an assistant turn begun with a thought and a calculator call."""
    head = tok.apply_chat_template([SYSTEM, USER], True)
    assert head.endswith("<|im_start|>assistant\n<think>\n")
    return tok.encode(head + "add them\n</think>\n\n" + CALL)


def test_prefilled_call_is_answered_as_the_chat_template_renders_it(setup):
    tok, eng, _ = setup
    every = tuple(range(eng.vocab_size))      # any token ends a turn: one real sampled token per turn
    sp = SamplingParams(greedy=True, max_tokens=96, stop_token_ids=every)
    prompt = _prefilled(tok)
    loop = _loop(tok)
    (t,) = loop.run(eng, [prompt], sp)
    assert (t.turns, t.tool_calls, t.tool_errors) == (2, 1, 0)
    x = t.response_ids[0]
    assert t.response_mask == [1] + [0] * (len(t.response_ids) - 2) + [1]
    assert all(lp == 0.0 for lp, m in zip(t.logprobs, t.response_mask) if not m)
    # the oracle: the template's rendering of [system, user, assistant(thought + call), tool("4")] + generation prompt
    convo = [SYSTEM, USER, {"role": "assistant", "content": "add them\n</think>\n\n",
                            "tool_calls": [{"type": "function", "function": {"name": "calculator",
                                                                             "arguments": {"expression": "2 + 2"}}}]},
             {"role": "tool", "content": "4"}]
    want = tok.encode(tok.apply_chat_template(convo, True))
    im_end = tok.encode("<|im_end|>")[0]
    got = prompt + t.response_ids[:-1] if x == im_end else prompt + t.response_ids[1:-1]
    assert got == want
    # every sampled token's log-prob is the engine's score of it in the recorded context (greedy: temperature 1)
    scored = eng.score([prompt + t.response_ids], [len(prompt)])[0]
    assert t.logprobs[0] == pytest.approx(scored[0], abs=1e-4) and t.logprobs[-1] == pytest.approx(scored[-1], abs=1e-4)
    assert loop_metrics([t])["multi_turn/tool_calls_mean"] == 1.0
    assert loop.tools.stats.metrics()["tool/calls/calculator"] == 1
    # the tokenization check: all of it is the template's but the sampled token after the call (text after the
    # last </tool_call> is no part of the parsed message), unless that token was <|im_end|>
    drift = template_drift(tok, [SYSTEM, USER] + t.messages, t.prompt_ids, t.response_ids, t.turn_starts)
    assert (drift.tokens, drift.at, drift.turn) == ((0, -1, 0) if x == im_end else (len(t.response_ids), len(prompt), 1))


def test_tokenization_check_names_qwen3s_dropped_think_block(setup):
    """Thinking off, Qwen3's template opens each generation with an empty think block and drops it from the
    earlier turns when the conversation is rendered again: the check finds it, strict stops naming it."""
    from types import SimpleNamespace

    from megatron_rl.config import from_dict
    from megatron_rl.data.tokenizer import load_tokenizer
    from megatron_rl.trainer.paths.agent_rollouts import AgentRollouts

    _, eng, d = setup
    tok = load_tokenizer(d)                                    # the template's default: thinking off
    head = tok.apply_chat_template([SYSTEM, USER], True)
    assert head.endswith("<think>\n\n</think>\n\n")
    prompt = tok.encode(head + CALL)
    sp = SamplingParams(greedy=True, max_tokens=96, stop_token_ids=tuple(range(eng.vocab_size)))
    (t,) = _loop(tok).run(eng, [prompt], sp)
    drift = template_drift(tok, [SYSTEM, USER] + t.messages, t.prompt_ids, t.response_ids, t.turn_starts)
    assert drift.tokens > 0 and drift.turn == 0 and drift.at < len(prompt)     # the prompt's empty think block
    assert tok.decode(prompt[drift.at:drift.at + 1]) == "<think>"
    rows = [SimpleNamespace(messages=(SYSTEM, USER))]
    for mode, frac in (("warn", 1.0), ("off", None)):
        cfg = from_dict({"rollout": {"max_tokens": 96}, "multi_turn": {"enable": True, "tools": ["calculator"],
                                                                       "tokenization_check": mode}})
        assert AgentRollouts(cfg, tok).drift(rows, [t]).get("multi_turn/template_drift_frac") == frac
    strict = from_dict({"rollout": {"max_tokens": 96}, "multi_turn": {"enable": True, "tools": ["calculator"],
                                                                      "tokenization_check": "strict"}})
    with pytest.raises(RuntimeError, match=r"tokenization_check=strict: sample 0/0 turn 0: token \d+ differs"):
        AgentRollouts(strict, tok).drift(rows, [t])


def test_budgets_cut_the_loop(setup):
    tok, eng, _ = setup
    sp = SamplingParams(greedy=True, max_tokens=96, stop_token_ids=tuple(range(eng.vocab_size)))
    (t,) = _loop(tok, max_assistant_turns=1).run(eng, [_prefilled(tok)], sp)
    assert (t.turns, t.tool_calls, t.response_mask) == (1, 0, [1])      # the call is never executed
    (t,) = _loop(tok, max_user_turns=0).run(eng, [_prefilled(tok)], sp)
    assert (t.turns, t.tool_calls) == (1, 0)
    (t,) = _loop(tok, max_response_tokens=10).run(eng, [_prefilled(tok)], sp)   # the tool response would not fit
    assert (t.turns, t.tool_calls, t.finish_reason, len(t.response_ids)) == (1, 1, "length", 1)


def test_bad_and_parallel_calls(setup):
    tok, eng, _ = setup
    sp = SamplingParams(greedy=True, max_tokens=96, stop_token_ids=tuple(range(eng.vocab_size)))
    head = tok.apply_chat_template([SYSTEM, USER], True)
    bad = '<tool_call>\n{"name": "nope", "arguments": {}}\n</tool_call>\n' + CALL + "\n" + CALL
    loop = _loop(tok, max_parallel_calls=2, max_response_tokens=256)
    (t,) = loop.run(eng, [tok.encode(head + "x\n</think>\n\n" + bad)], sp)
    assert (t.tool_calls, t.tool_errors) == (2, 1)                       # the third call is over the limit
    assert [m["content"] for m in t.messages if m["role"] == "tool"][1] == "4"
    assert "unknown tool 'nope'" in t.messages[1]["content"]
    assert loop.tools.stats.metrics()["tool/failed/unknown_tool"] == 1


def test_sampled_turns_keep_tokens_and_logprobs_as_sampled(setup):
    """Sampled multi-token turns (temperature 1, no truncation): the recorded log-probs are the engine's
    scores of the final sequences; single_turn_agent is the plain generate call, token for token."""
    tok, eng, _ = setup
    prompts = [tok.encode(tok.apply_chat_template([SYSTEM, {"role": "user", "content": q}], True)) for q in ("1+1?", "7*6?")]
    sp = SamplingParams(n=1, temperature=1.0, max_tokens=6, seed=3)
    trajs = _loop(tok).run(eng, prompts, sp)
    assert [(t.prompt_index, t.sample_index) for t in trajs] == [(0, 0), (1, 0)]
    scored = eng.score([list(t.prompt_ids) + t.response_ids for t in trajs], [len(t.prompt_ids) for t in trajs])
    for t, s in zip(trajs, scored):
        assert len(t.response_ids) == len(t.logprobs) == len(t.response_mask) <= 6
        assert [a for a, m in zip(t.logprobs, t.response_mask) if m] == pytest.approx(
            [b for b, m in zip(s, t.response_mask) if m], abs=1e-4)
    plain = eng.generate(prompts, sp)
    single = agent_loop_class("single_turn_agent")(tok, None, Budgets(6)).run(eng, prompts, sp)
    assert [list(c.response_ids) for c in plain] == [t.response_ids for t in single]
    assert all(t.response_mask == [1] * len(t.response_ids) for t in single)


def test_registry_names_and_how_to_add_one():
    assert {"single_turn_agent", "tool_agent"} <= set(agent_loop_names())
    with pytest.raises(KeyError, match="unknown agent loop 'nope'.*register_agent_loop.*plugins"):
        agent_loop_class("nope")
    with pytest.raises(ValueError, match="registered twice"):
        register_agent_loop("tool_agent")(type("X", (agent_loop_class("tool_agent"),), {}))
    assert dataclasses.is_dataclass(Budgets)


def test_interaction_answers_turns_without_a_call(setup):
    """verl's ``gsm8k`` interaction: a wrong answer gets "incorrect, try again" as a user turn (the template's
    rendering of that user message, mask 0) until max_user_turns; a right one ends the conversation."""
    from megatron_rl.agent.interactions import make_interaction

    tok, eng, _ = setup
    sp = SamplingParams(greedy=True, max_tokens=96, stop_token_ids=tuple(range(eng.vocab_size)))
    prompt = tok.encode(tok.apply_chat_template([SYSTEM, USER], True))
    (t,) = _loop(tok, max_user_turns=2, max_response_tokens=256).run(eng, [prompt], sp, None,
                                                                      [{"name": "gsm8k", "ground_truth": "4"}])
    assert (t.turns, t.interaction_turns, t.tool_calls) == (3, 2, 0)
    k = len(t.response_ids)
    starts = t.turn_starts
    assert [t.response_mask[s] for s in starts] == [1, 1, 1] and sum(t.response_mask) == 3
    # the appended user turn is the template's rendering of the feedback message after the first assistant turn
    x = tok.tok.decode(t.response_ids[:1], skip_special_tokens=False)
    fb = [m["content"] for m in t.messages if m["role"] == "user"]
    assert fb == ["Your response is incorrect! You need to reflect on your answer and try again."] * 2
    convo = [SYSTEM, USER, {"role": "assistant", "content": x}, {"role": "user", "content": fb[0]}]
    want = tok.apply_chat_template(convo, True)
    got = tok.tok.decode(prompt + t.response_ids[:starts[1]], skip_special_tokens=False)
    assert got.endswith(want[want.index(fb[0]) - len("<|im_start|>user\n"):])
    assert k < 256
    right = make_interaction("gsm8k")
    right.start("a", ground_truth="4")
    assert right.respond("a", [{"role": "assistant", "content": "2 + 2 = 4\n#### 4"}]).stop
    assert not right.respond("a", [{"role": "assistant", "content": "#### 5"}]).stop
