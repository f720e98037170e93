"""Every ``algo.kind`` on the chat-template fixture through vLLM (CPU) + Ray, and the sequences each
data path puts in front of the loss, decoded with special tokens (``logging.dump_samples``).

One worker process runs all kinds for 2 steps with one engine pool; the PAPO grader is a real HTTP
server on 127.0.0.1 whose received requests are checked.
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

from megatron_rl.algorithms import ALGO_KINDS
from megatron_rl.data import chat
from megatron_rl.data.chat_fixture import SCORE_INSTRUCTION, SYSTEM
from tests.helpers.fake_openai_server import requests_seen, start_server

KINDS = sorted(ALGO_KINDS)
ASYNC_KINDS = ["grpo@async"]   # the one-step-off producer on the chat model (issue 14)
ROOT = Path(__file__).resolve().parents[2]
Q = r"Which is larger, (\d\d) or (\d\d)\? Put the final answer in \\boxed\{\}\."


@pytest.fixture(scope="module")
def runs(chat_fixture, tmp_path_factory):
    proc, url = start_server(1500)
    out = tmp_path_factory.mktemp("chat_kinds")
    try:
        p = subprocess.run([sys.executable, str(ROOT / "tests/e2e/workers/chat_kinds.py"), str(Path(chat_fixture["hf_path"]).parent),
                            str(out), url, *KINDS, *ASYNC_KINDS], capture_output=True, text=True, timeout=1500, cwd=ROOT,
                           env={**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "2"})
        assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-5000:]
        seen = requests_seen(url)
    finally:
        proc.kill()
    res = json.loads((out / "results.json").read_text())["kinds"]
    print({k: v["secs"] for k, v in res.items()})
    return out, res, seen


def _samples(out: Path, kind: str, name: str) -> list[dict]:
    rows = [json.loads(x) for x in (out / kind / "samples.jsonl").read_text().splitlines()]
    return [r for r in rows if r["name"] == name]


@pytest.mark.parametrize("kind", KINDS)
def test_kind_trains_on_chat_model(runs, kind):
    out, res, _ = runs
    assert res[kind]["ok"], res[kind].get("error")
    rows = [json.loads(x) for x in (out / kind / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2]
    for r in rows:
        assert r.get("actor/update_skipped", 0.0) == 1.0 or math.isfinite(r["actor/loss"]), r
        # trainer (Megatron) and engine (vLLM) agree on the chat model's sampled-token log-probs
        assert r["rollout/logprob_gap"] < 1e-4, r["rollout/logprob_gap"]
        if kind.endswith("_ectr"):   # the _ectr plug-ins on the RLCSD hint path: a single negative (K_max = 1)
            assert r["teacher/k_mean"] == 1.0 and 0.0 <= r["teacher/kept_frac"] <= 1.0, r
    policy = _samples(out, kind, "policy") or _samples(out, kind, "score_second")
    assert policy and policy[0]["text"].startswith(f"<|im_start|>system\n{SYSTEM}<|im_end|>\n<|im_start|>user\n")


def test_bicc_contexts_sit_inside_the_user_turn(runs):
    out, _, _ = runs
    got = _samples(out, "bicc", "bicc_conditioned") + _samples(out, "bicc_rcc", "bicc_conditioned")
    assert got, "no BiCC-conditioned sequence was built"
    head, delim = re.escape(chat.BICC_HEADER), re.escape(chat.BICC_DELIMITER)
    pat = re.compile(rf"<\|im_start\|>system\n{re.escape(SYSTEM)}<\|im_end\|>\n<\|im_start\|>user\n{Q}{head}"
                     r"(?P<ctx>(?:(?!<\|im_).)+)<\|im_end\|>\n<\|im_start\|>assistant\n(?P<o>(?:(?!<\|im_).)*)<\|im_end\|>$", re.S)
    for s in got:
        m = pat.fullmatch(s["text"])
        assert m, s["text"]
        # opposite traces: whole ones each followed by the delimiter, at most the last cut by the budget
        parts = re.split(delim, m.group("ctx"))
        assert all(p.startswith("<think>") for p in parts if p), parts


def test_score_second_attempt_is_a_chat_turn(runs):
    out, _, _ = runs
    got = _samples(out, "score", "score_second")
    assert got
    pat = re.compile(rf"<\|im_start\|>system\n{re.escape(SYSTEM)}<\|im_end\|>\n<\|im_start\|>user\n{Q}<\|im_end\|>\n"
                     r"<\|im_start\|>assistant\n(?P<y1>(?:(?!<\|im_).)*)<\|im_end\|>\n"
                     rf"<\|im_start\|>user\n{re.escape(SCORE_INSTRUCTION)}<\|im_end\|>\n<\|im_start\|>assistant\n"
                     r"(?P<y2>(?:(?!<\|im_start).)*)$", re.S)
    for s in got:
        assert pat.fullmatch(s["text"]), s["text"]


def test_rlcsd_teacher_prompt_is_the_spec_template(runs):
    out, _, _ = runs
    got = _samples(out, "rlcsd", "teacher")
    assert got
    for s in got:
        t = s["text"]
        assert re.match(rf"<\|im_start\|>user\nProblem: {Q}\n", t), t
        assert "=== Reference Solution Begin ===" in t and "=== Reference Solution End ===" in t
        assert re.search(r"<\|im_end\|>\n<\|im_start\|>assistant\n(?:(?!<\|im_start).)*$", t, re.S), t


def test_papo_grader_gets_the_question_text(runs):
    _, _, seen = runs
    assert seen, "the rubric grader was never called"
    for body in seen:
        assert body["max_tokens"] == 16384
        content = body["messages"][0]["content"]
        problem = content.split("## Problem\n", 1)[1].split("\n\n## Reference solution", 1)[0]
        assert re.fullmatch(Q, problem), problem


@pytest.mark.parametrize("kind", ASYNC_KINDS)
def test_async_kind_trains_on_chat_model(runs, kind):
    """max_staleness=1: batch j is sampled by the weights of step j-2 (batch 1 by the initial ones), so
    step 1 trains on-policy and steps 2-3 one step off, with finite IS weights; the chat template holds."""
    out, res, _ = runs
    assert res[kind]["ok"], res[kind].get("error")
    rows = [json.loads(x) for x in (out / kind / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3]
    assert [r["offpolicy/staleness_max"] for r in rows] == [0, 1, 1]
    for r in rows:
        assert math.isfinite(r["actor/loss"]) and 0 < r["offpolicy/is_mean"] <= r["offpolicy/is_max"] < math.inf, r
    policy = _samples(out, kind, "policy")
    assert policy and policy[0]["text"].startswith(f"<|im_start|>system\n{SYSTEM}<|im_end|>\n<|im_start|>user\n")
