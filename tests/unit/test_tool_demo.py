"""The tool-use demo's pieces (``megatron-rl demo --task tools``, docs/tool-use-demo.md), without its training: the
warm-start traces are the tokens the agent loop builds (checked against the chat template's own rendering of the
conversation, by HF's ``apply_chat_template``), the calculator answers the traces' calls with the product (Python's
``*``), the rows' reward credits the right answer, and the example config passes the start-up checks on the demo's
files (the ``--check`` of ``examples/configs/tiny_cpu_grpo_tools.yaml``). The learning itself is measured in the docs."""
from __future__ import annotations

import json


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


def test_traces_are_the_templates_rendering_and_the_tool_answers(tmp_path):
    from transformers import AutoTokenizer

    from megatron_rl.agent.tools import ToolSet
    from megatron_rl.agent.tools.types import ToolCall
    from megatron_rl.cli import demo_tools as D
    from megatron_rl.data import tool_task as T
    from megatron_rl.rewards.registry import get_reward

    paths, pairs, hf, tok = _build(tmp_path)
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


def test_the_example_config_passes_the_start_up_checks(tmp_path):
    from megatron_rl.cli import demo as demo_cli
    from megatron_rl.cli import demo_tools as D

    paths, _, hf, _ = _build(tmp_path)
    args = demo_cli.build_parser().parse_args(["--task", "tools", "--algo", "grpo", "--steps", "3"])
    cfg = D.tools_config(args, tmp_path / "run", paths, hf)
    assert cfg.multi_turn.enable and list(cfg.multi_turn.tools) == ["calculator"] and cfg.trainer.steps == 3
    assert cfg.data.val == str(paths["val"]) and cfg.trainer.eval_n >= 1
