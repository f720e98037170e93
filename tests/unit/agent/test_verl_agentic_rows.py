"""verl's agentic data (``tests/helpers/verl_agentic.py``: GSM8K with tools, the schema verl's preprocessing
writes) in a multi-turn run: the start-up check (``preflight_inputs.check_agent_rows``), the row's
``agent_name`` and ``tools_kwargs`` reaching the loop and the tools, prompts rendered with the tools' schemas.
Real parts: the tool model's tokenizer and HF engine (``tests/helpers/agent_fixture.py``), the built-in
``calc_gsm8k_reward`` tool."""
from __future__ import annotations

import pytest

from megatron_rl.agent.tools import ToolCall, ToolSet
from megatron_rl.config import from_dict
from megatron_rl.trainer.loop.preflight_inputs import check_agent_rows
from tests.helpers import verl_agentic as V


def _cfg(path, **mt):
    return from_dict({"data": {"train": str(path), "max_prompt_len": 1024},
                      "rollout": {"max_tokens": 16, "max_model_len": 1100},
                      "multi_turn": {"enable": True, "tools": ["calc_gsm8k_reward"], **mt}})


@pytest.mark.parametrize("rows, match", [
    (V.rows("nope"), "row 0 agent_name: unknown agent loop 'nope'.*register_agent_loop"),
    (V.rows(tools_kwargs={"calculator": {"create_kwargs": {"x": 1}}}), r"tools this run does not configure: \['calculator'\]"),
    (V.rows(tools_kwargs=None), "need_tools_kwargs but has no extra_info.tools_kwargs"),
    (V.rows(interaction_kwargs={"name": "nope", "query": "q", "ground_truth": "7"}),
     "row 0 extra_info.interaction_kwargs.name: unknown interaction 'nope'; valid: .*'gsm8k'.*register_interaction"),
    (V.rows(interaction_kwargs={"name": "self_correct"}),      # its start arguments are checked at start-up too
     "row 0 extra_info.interaction_kwargs: interaction self_correct needs its `instruction` text"),
], ids=["unknown_loop", "unconfigured_tool", "missing_tools_kwargs", "interaction", "interaction_arguments"])
def test_rows_naming_what_the_run_lacks_are_refused(tmp_path, rows, match):
    path = V.write(tmp_path / "train.parquet", rows)
    with pytest.raises(ValueError, match=match):
        check_agent_rows(_cfg(path))
    check_agent_rows(from_dict({"data": {"train": str(path)}}))      # single-turn runs read none of it


def test_held_out_rows_are_checked_as_training_rows_are(tmp_path):
    """The held-out evaluation runs ``data.val`` through the agent loops too (``eval/agent.py``): its rows are refused
    the same way, the line naming ``data.val``."""
    train, val = V.write(tmp_path / "train.parquet", V.rows()), V.write(tmp_path / "val.parquet", V.rows("nope"))
    cfg = _cfg(train)
    check_agent_rows(cfg)
    with pytest.raises(ValueError, match=rf"data.val={val}: row 0 agent_name: unknown agent loop 'nope'"):
        check_agent_rows(from_dict({**cfg.to_dict(), "data": {**cfg.to_dict()["data"], "val": str(val)}}))


def test_verl_gsm8k_tool_rows_roll_out_through_the_named_loop(tmp_path, tool_model):
    from megatron_rl.agent.run_config import template_kwargs
    from megatron_rl.data.dataset import PromptDataset
    from megatron_rl.data.tokenizer import load_tokenizer
    from megatron_rl.rollout.engine import SamplingParams
    from megatron_rl.rollout.hf_engine import HFEngine
    from megatron_rl.trainer.paths.agent_rollouts import AgentRollouts

    path = V.write(tmp_path / "train.parquet", V.rows())
    d = tool_model
    cfg = _cfg(path)
    check_agent_rows(cfg)
    tok = load_tokenizer(d, template_kwargs(cfg))
    ds = PromptDataset.from_parquet(path, tok, 1024)
    row = ds[0]
    assert row.agent_name == "tool_agent"
    text = tok.decode(row.prompt_ids)
    assert "<tools>" in text and '"name": "calc_gsm8k_reward"' in text      # the template listed the tool
    # the row's tools_kwargs are the tool's create arguments: the ground truth it grades against
    tools = ToolSet(cfg.multi_turn.tools)
    iid = tools.create(None, row.extra_info["tools_kwargs"])
    assert "reward=1.0" in tools.call(iid, ToolCall("calc_gsm8k_reward", {"answer": "7"})).text
    assert tools.rewards(iid) == {"calc_gsm8k_reward": 1.0}
    agent = AgentRollouts(cfg, tok)
    ro = agent.generate(HFEngine(str(d), max_model_len=1100), ds, [1, 0], SamplingParams(n=2, max_tokens=8, seed=0))
    assert len(ro) == 4 and ro.response_mask is not None and list(agent.runner.loops) == ["tool_agent"]
    assert len(ro.response_mask) == len(ro.response_ids) and ro.group_ids.tolist() == [0, 0, 1, 1]
    assert [r.index for r in ro.rows] == [1, 1, 0, 0]
    for key in ("multi_turn/turns_mean", "multi_turn/tool_calls_mean", "tool/calls", "tool/failed/malformed_call",
                "multi_turn/template_drift_tokens"):
        assert key in ro.stats


def test_struct_nulls_of_other_rows_tools_are_not_tools_kwargs(tmp_path, chat_tokenizer):
    """pyarrow reads a struct column's every field on every row: a row's ``tools_kwargs`` holds null for the tools
    only other rows name; those are no create arguments (``agent/rows.tools_kwargs``)."""
    from megatron_rl.agent.rows import tools_kwargs
    from megatron_rl.data.dataset import PromptDataset

    a, b = V.rows()
    b["extra_info"]["tools_kwargs"] = {"calculator": {"create_kwargs": {"x": 1}}}
    path = V.write(tmp_path / "train.parquet", [a, b])
    check_agent_rows(_cfg(path, tools=["calc_gsm8k_reward", "calculator"]))
    ds = PromptDataset.from_parquet(path, chat_tokenizer, 1024)
    assert ds[0].extra_info["tools_kwargs"]["calculator"] is None                  # what pyarrow hands over
    assert tools_kwargs(ds[0].extra_info) == {"calc_gsm8k_reward": {"create_kwargs": {"ground_truth": "7"}}}
    assert tools_kwargs(ds[1].extra_info) == {"calculator": {"create_kwargs": {"x": 1}}}
    ToolSet(["calc_gsm8k_reward", "calculator"]).create(None, tools_kwargs(ds[0].extra_info))  # the loop's call: accepted


def test_rows_naming_a_registered_interaction_pass(tmp_path):
    """verl's gsm8k_multiturn_w_interaction rows: ``interaction_kwargs`` {name: gsm8k, query, ground_truth}."""
    from megatron_rl.agent.rows import interaction_kwargs

    rows = V.rows(interaction_kwargs={"name": "gsm8k", "query": "q", "ground_truth": "7"})
    check_agent_rows(_cfg(V.write(tmp_path / "train.parquet", rows)))
    assert interaction_kwargs(rows[0]["extra_info"]) == {"name": "gsm8k", "query": "q", "ground_truth": "7"}
    assert interaction_kwargs(V.rows()[0]["extra_info"]) is None   # no name: none
