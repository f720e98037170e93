"""``train``'s start-up on a GPU refuses a config whose planned peak exceeds the device, in one line naming the
largest component and the keys that shrink it (``preflight_resources.check_device_memory``,
``planning/verdict.py``); the examples pass on an 80 GB GPU at their own world size."""
from __future__ import annotations

from pathlib import Path

import pytest

from megatron_rl.planning.memory import GIB
from megatron_rl.planning.verdict import KNOBS, refusal
from megatron_rl.trainer.loop.preflight import load_checked
from megatron_rl.trainer.loop.preflight_resources import check_device_memory

ROOT = Path(__file__).resolve().parents[3]
H100, H200 = 80 * 10**9, 141 * 10**9


def _cfg(name: str, model: str, *more: str):
    return load_checked(ROOT / f"examples/configs/{name}.yaml",
                        [f"model.hf_path={ROOT / 'tests/fixtures/hf_configs' / model}", *more])


@pytest.mark.parametrize("name,model,world", [("qwen3_8b_grpo", "qwen3_8b", 8), ("qwen2_5_14b_rlcsd", "qwen2_5_14b", 16),
                                              ("llama3_1_8b_dapo", "llama3_1_8b", 16)])
def test_examples_fit_an_80gb_gpu(monkeypatch, name, model, world):
    monkeypatch.setenv("WORLD_SIZE", str(world))
    check_device_memory(_cfg(name, model), H100)


def test_activations_over_the_device_are_refused_naming_recompute(monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "8")
    cfg = _cfg("qwen3_8b_grpo", "qwen3_8b", "model.recompute=none")   # 40960 tokens x 36 layers kept: ~51 GiB
    with pytest.raises(ValueError) as e:
        check_device_memory(cfg, H100)
    line = str(e.value)
    assert "\n" not in line and "the largest part is activations (50.8 GiB)" in line and "model.recompute=full" in line
    assert "exceed the device's 74.5 GiB" in line
    check_device_memory(cfg, H200)                                     # 141 GB holds it


def test_optimizer_of_one_replica_is_refused_naming_data_parallelism(monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "1")
    cfg = _cfg("qwen3_8b_grpo", "qwen3_8b", "parallel.tp=1", "parallel.sequence_parallel=false")
    with pytest.raises(ValueError, match=r"largest part is optimizer \(91\.5 GiB\): add data-parallel GPUs"):
        check_device_memory(cfg, H200)


def test_cpu_and_a_folder_without_config_json_pass(monkeypatch, tmp_path):
    monkeypatch.setenv("WORLD_SIZE", "1")
    check_device_memory(_cfg("qwen3_8b_grpo", "qwen3_8b", "parallel.tp=1", "parallel.sequence_parallel=false"), 0)
    cfg = _cfg("qwen3_8b_grpo", "qwen3_8b")
    object.__setattr__(cfg.model, "hf_path", str(tmp_path))             # the weights check reports the folder
    check_device_memory(cfg, 10**9)


def test_refusal_names_the_largest_component_and_fits_at_the_edge():
    parts = {"weights": 10 * GIB, "logits": 30 * GIB, "activations": 20 * GIB}
    assert refusal(parts, 60 * GIB, "x") is None
    line = refusal(parts, 59 * GIB, "x")
    assert line == f"x: 60.0 GiB per GPU exceed the device's 59.0 GiB; the largest part is logits (30.0 GiB): {KNOBS['logits']}"
