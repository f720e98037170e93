"""The tool-use demo's pieces (``megatron-rl demo --task tools``, docs/tool-use-demo.md), without its training: the
warm-start traces are the tokens the agent loop builds (checked against the chat template's own rendering of the
conversation, by HF's ``apply_chat_template``), the calculator answers the traces' calls with the product (Python's
``*``), the rows' reward credits the right answer, and the example config passes the start-up checks on the demo's
files (the ``--check`` of ``examples/configs/tiny_cpu_grpo_tools.yaml``). The learning itself is measured in the docs.
``megatron-rl eval --config`` with that config: its refusals, and a multi-turn completions file's tool numbers."""
from __future__ import annotations

import json

import pytest

CONFIG = "examples/configs/tiny_cpu_grpo_tools.yaml"


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    return _build(tmp_path_factory.mktemp("tool_demo"))


def _build(tmp_path):
    from megatron_rl.agent.tools import ToolSet
    from megatron_rl.cli import demo_tools as D
    from megatron_rl.data import tool_task as T
    from megatron_rl.data.tokenizer import load_tokenizer

    sizes = {"train": 40, "val": 8}
    paths = T.write_task(tmp_path / "data", 0, sizes)
    pairs = T.split_pairs(0, sizes)["train"]
    hf = D.build_tiny_tool_model(tmp_path / "sft_hf", D.corpus(pairs), hidden=64)
    return paths, pairs, hf, load_tokenizer(hf, {"tools": ToolSet(["calculator"]).schemas()})


def test_traces_are_the_templates_rendering_and_the_tool_answers(built):
    from transformers import AutoTokenizer

    from megatron_rl.agent.tools import ToolSet
    from megatron_rl.agent.tools.types import ToolCall
    from megatron_rl.cli import demo_tools as D
    from megatron_rl.data import tool_task as T
    from megatron_rl.rewards.registry import get_reward

    _, pairs, hf, tok = built
    hf_tok, tools = AutoTokenizer.from_pretrained(str(hf)), ToolSet(["calculator"])
    convs = T.traces(pairs, 0.5, 0)
    assert {len(c) for c in convs} == {3, 5}                     # some traces call the tool, some answer directly
    for conv in convs[:8]:
        ids, mask = D.trace_ids(tok, conv)
        msgs = []
        for m in conv:
            if m["role"] == "assistant" and m["content"].startswith("<tool_call>"):
                call = json.loads(m["content"].split("\n")[1])
                msgs.append({"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function": call}]})
            else:
                msgs.append(m)
        text = hf_tok.apply_chat_template(msgs, tools=tools.schemas(), tokenize=False)
        assert text.endswith("<|im_end|>\n") and "<tools> calculator </tools>" in text
        assert ids == hf_tok.encode(text[:-1], add_special_tokens=False)   # the loop's tokens: the template's, to the end
        answers = [m["content"] for m in conv if m["role"] == "assistant"]
        assert hf_tok.decode([t for t, k in zip(ids, mask) if k]) == "<|im_end|>".join(answers) + "<|im_end|>"
    (a, b) = pairs[0]
    iid = tools.create()
    call = json.loads(T.call_text(a, b).split("\n")[1])
    assert tools.call(iid, ToolCall(call["name"], call["arguments"])).text == str(a * b)
    reward = get_reward(T.row(a, b, "train", 0)["reward_model"]["reward"])
    assert float(reward(f"#### {a * b}", str(a * b))) == 1.0 and float(reward(f"#### {a * b + 1}", str(a * b))) == 0.0


def test_the_example_config_passes_the_start_up_checks(built, tmp_path):
    from megatron_rl.cli import demo as demo_cli
    from megatron_rl.cli import demo_tools as D

    paths, _, hf, _ = built
    args = demo_cli.build_parser().parse_args(["--task", "tools", "--algo", "grpo", "--steps", "3"])
    cfg = D.tools_config(args, tmp_path / "run", paths, hf)
    assert cfg.multi_turn.enable and list(cfg.multi_turn.tools) == ["calculator"] and cfg.trainer.steps == 3
    assert cfg.data.val == str(paths["val"]) and cfg.trainer.eval_n >= 1


def test_eval_with_a_multi_turn_config_refuses_what_it_cannot_run(built, tmp_path, capsys):
    from megatron_rl.data import tool_task as T
    from megatron_rl.eval import main
    from tests.helpers import verl_agentic as V

    paths, pairs, hf, _ = built
    comp = tmp_path / "c.jsonl"
    comp.write_text("".join(json.dumps({"index": i, "response": "#### 1"}) + "\n" for i in range(8)))
    assert main(["--config", CONFIG, "--completions", str(comp), "--data", str(paths["val"]), "--out", str(tmp_path / "a")]) == 2
    assert "multi_turn.enable: the multi-turn evaluation generates from --model" in capsys.readouterr().err
    bad = V.write(tmp_path / "bad.parquet", [{**T.row(*pairs[0], "val", 0), "agent_name": "no_such_loop"}])
    assert main(["--config", CONFIG, "--model", str(hf), "--data", str(bad), "--out", str(tmp_path / "b"),
                 "--engine", "hf"]) == 2
    err = capsys.readouterr().err
    assert f"--data {bad}: row 0 agent_name" in err and "no_such_loop" in err and "register_agent_loop" in err


def test_a_multi_turn_completions_file_reports_its_tool_numbers(built, tmp_path):
    """``--completions`` of a file of trajectories: accuracy and tool numbers of the first n samples per row, counted
    by hand from the lines written here."""
    from megatron_rl.data import tool_task as T
    from megatron_rl.eval import run_eval

    paths, _, _, _ = built
    import pyarrow.parquet as pq

    truth = [r["reward_model"]["ground_truth"] for r in pq.read_table(paths["val"]).to_pylist()]
    lines = []
    for i, gt in enumerate(truth):     # sample 0: a call, right; sample 1: no call, wrong; sample 2 (cut by n=2): 2 calls
        lines += [{"index": i, "sample": 0, "response": f"<tool_call>..</tool_call>\n#### {gt}", "turns": 2,
                   "tool_calls": 1, "tool_errors": int(i == 0)},
                  {"index": i, "sample": 1, "response": "#### 7", "turns": 1, "tool_calls": 0, "tool_errors": 0},
                  {"index": i, "sample": 2, "response": "#### 7", "turns": 3, "tool_calls": 2, "tool_errors": 2}]
    comp = tmp_path / "c.jsonl"
    comp.write_text("".join(json.dumps(x) + "\n" for x in lines))
    s = run_eval(paths["val"], comp, 2, tmp_path / "out", n=2)
    rows = len(truth)
    assert s["mean@2"] == 0.5 and s["tool_call_rate"] == 0.5 and s["tool_calls_mean"] == 0.5
    assert s["tool_success_rate"] == pytest.approx(1 - 1 / rows) and s["turns_mean"] == 1.5
    assert T.SOURCE in s["by_source"]
