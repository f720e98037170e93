"""Colocated placement on ONE GPU (skipped without CUDA: ``requires_gpus`` of tests/conftest.py).

The Megatron actor and a rollout engine share the GPU and take turns as ``trainer/loop/colocate.py``
orders (worker: ``tests/distributed/workers/colocated_gpu.py``): vLLM's own sleep mode where vLLM is
installed, else the HF engine on the GPU. Shows: during the colocated update the trainer's
``torch.cuda.memory_allocated`` peak stays below (its peak alone + what the slept engine still
holds); the sleep releases most of the engine's device memory; greedy generations and log-probs after
wake + push of the same weights equal those before the sleep; the engine generates after the step.
Not run on the development machine (CPU only): docs/gpu-status.md.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.gpu.stack_probe import missing
from tests.helpers.dist import torchrun
from tests.helpers.tiny_model import save_random_qwen3

WORKER = Path(__file__).resolve().parents[1] / "distributed" / "workers" / "colocated_gpu.py"
ENGINES = ["hf"] + ([] if missing("vllm") else ["vllm"])   # vLLM where it imports (with CUDA)
SLACK = 2 << 20   # allocator rounding of the step's temporaries


@pytest.mark.requires_gpus(1)
@pytest.mark.parametrize("engine", ENGINES)
def test_engine_and_actor_take_turns_on_one_gpu(tmp_path, engine):
    hf = save_random_qwen3(tmp_path / "hf")     # ~128 MB fp32: the engine's share stands out
    out = tmp_path / "rec.json"
    torchrun(WORKER, hf, out, engine, nproc=1, timeout=600)
    r = json.loads(out.read_text())
    assert r["ids_after"] == r["ids_before"] and r["logp_after"] == r["logp_before"]
    assert r["update_peak"] <= r["trainer_peak"] + max(r["slept_engine"], 0) + SLACK, r
    awake = r["used_engine_awake"] - r["used_before_engine"]
    slept = r["used_slept"] - r["used_before_engine"]
    assert awake > 100e6 and slept < 0.2 * awake, f"device bytes of the engine: awake {awake}, asleep {slept}"
    assert len(r["ids_next"]) == 2 and all(1 <= len(x) <= 6 for x in r["ids_next"])   # generates after the step
