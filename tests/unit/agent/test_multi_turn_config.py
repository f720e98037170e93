"""``multi_turn.*`` at start-up (``preflight_rules.check_multi_turn``, ``config_features.MultiTurnConfig``): every
refusal one line naming the key and the fix; a multi-turn GRPO or self-distillation config passes; off, the dump
keeps its shape."""
from __future__ import annotations

import pytest

from megatron_rl.config import from_dict
from megatron_rl.trainer.loop.preflight_rules import check_config

ON = {"enable": True, "tools": ["calculator"]}


@pytest.mark.parametrize("tree, match", [
    ({"multi_turn": {**ON, "loop": "nope"}}, r"multi_turn.loop: unknown agent loop 'nope'; valid: \['single_turn_agent', 'tool_agent'\]; register one with @megatron_rl.agent.loop.register_agent_loop"),
    ({"multi_turn": {**ON, "tools": ["nope"]}}, "multi_turn.tools: unknown tool 'nope'.*register_tool"),
    ({"multi_turn": {**ON, "tools": {"calculator": {"wall_s": 3}}}}, "multi_turn.tools: function tool 'calculator' takes no config"),
    ({"multi_turn": {"enable": True}}, "multi_turn.loop=tool_agent with no multi_turn.tools"),
    ({"multi_turn": ON, "algo": {"kind": "score"}}, "algo.kind='score' .data path 'two_attempts'.: SCoRe's rollout is itself a two-turn interaction"),
    ({"multi_turn": ON, "algo": {"kind": "remax"}}, "data path 'greedy'.: ReMax's greedy baseline"),
    ({"multi_turn": ON, "algo": {"kind": "bicc"}}, "data path 'bicc_context'.: BiCC inserts"),
    ({"multi_turn": ON, "algo": {"kind": "papo"}, "reward": {"grader_url": "http://127.0.0.1:9/v1"}}, "data path 'process_reward'.: PAPO's rubric grader"),
    ({"multi_turn": ON, "rollout": {"engine": "vllm-async", "partial": {"enable": True}}}, "rollout.partial.enable=true: the partial pool"),
], ids=["loop", "tool", "tool_config", "no_tools", "score", "remax", "bicc", "papo", "partial"])
def test_refused_in_one_line(tree, match):
    with pytest.raises(ValueError, match=match) as e:
        check_config(from_dict(tree))
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("kind", ["grpo", "dapo", "drgrpo", "rloo", "gspo", "cispo",
                                  "rlcsd", "opsd", "sdpo", "srpo", "rlsd", "opsd_ectr", "rlsd_ectr"])
def test_grpo_and_self_distillation_families_take_it(kind):
    check_config(from_dict({"multi_turn": ON, "algo": {"kind": kind}, "rollout": {"max_tokens": 4096, "max_model_len": 8192}}))


@pytest.mark.parametrize("bad, match", [({"format": "xml"}, "multi_turn.format='xml' invalid; valid: \\['hermes'\\]"),
                                        ({"tokenization_check": "loud"}, "off\\|warn\\|strict"),
                                        ({"max_assistant_turns": 0}, "max_assistant_turns must be >= 1"),
                                        ({"tools": "calculator"}, "expected a list of tool names")])
def test_section_values(bad, match):
    with pytest.raises(ValueError, match=match):
        from_dict({"multi_turn": bad})


def test_off_by_default_and_absent_from_the_dump():
    cfg = from_dict({})
    assert not cfg.multi_turn.enable and "multi_turn" not in cfg.to_dict()
    on = from_dict({"multi_turn": ON})
    assert from_dict(on.to_dict()).multi_turn == on.multi_turn
