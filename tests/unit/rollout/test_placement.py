"""``rollout.placement`` against a machine's GPUs (``rollout/placement.py``), as numbers: the GPU side of
the start-up check runs here without GPUs (the CPU refusals run through the CLI in test_bad_inputs)."""
from __future__ import annotations

import re

import pytest

from megatron_rl.config import from_dict
from megatron_rl.rollout.placement import check_placement, engine_gpus, resolve_backend


def _cfg(**rollout):
    return from_dict({"rollout": rollout})


@pytest.mark.parametrize("placement,engine,cuda,world,expected", [
    ("colocated", "vllm", True, 1, "ipc"),       # one trainer process: CUDA IPC on the shared GPU
    ("colocated", "vllm", True, 8, "ray"),       # NCCL refuses two ranks on one GPU; IPC needs the single sender
    ("separate", "vllm", True, 4, "nccl"),
    (None, "vllm", True, 4, "nccl"),             # unstated (a bare RolloutClient): as before the key existed
    ("separate", "vllm", False, 1, "gloo"), ("colocated", "hf", False, 1, "ray"), ("colocated", "hf", True, 8, "ray"),
], ids=["colocated-1", "colocated-8", "separate", "unstated", "cpu", "hf-cpu", "hf-gpu"])
def test_auto_backend_fits_the_placement(placement, engine, cuda, world, expected):
    assert resolve_backend("auto", engine, cuda, world, placement) == expected


@pytest.mark.parametrize("rollout,gpus,trainer,words", [
    ({"placement": "colocated", "num_engines": 8}, 8, 8, None),
    ({"placement": "colocated", "num_engines": 9}, 16, 8, "9 engine(s) x 1 GPU(s) = 9 GPUs, but the trainer has 8"),
    ({"placement": "separate", "num_engines": 4}, 8, 4, None),
    ({"placement": "separate", "num_engines": 5}, 8, 4, "the trainer's 4 GPU(s) + 5 engine(s) x 1 = 9 GPUs, but 8 are"),
    ({"placement": "separate", "num_engines": 8, "ray_address": "10.0.0.1:6379"}, 8, 8, None),  # engines elsewhere
    ({"placement": "separate", "sync_backend": "ipc"}, 8, 4, "CUDA IPC shares memory on one GPU"),
    ({"placement": "colocated", "sync_backend": "ipc"}, 8, 8, "ipc needs a single trainer process"),
], ids=["colocated-fits", "colocated-too-many", "separate-fits", "separate-too-many", "separate-cluster",
        "separate-ipc", "colocated-ipc-8"])
def test_gpu_counts(rollout, gpus, trainer, words):
    cfg = _cfg(**rollout)
    if words is None:
        assert check_placement(cfg, True, gpus, trainer, trainer) in ("ipc", "ray", "nccl")
        return
    with pytest.raises(ValueError, match=re.escape(words)) as e:
        check_placement(cfg, True, gpus, trainer, trainer)
    assert "\n" not in str(e.value)


def test_engine_gpus_are_the_trainers_or_the_ones_after_them():
    assert engine_gpus("colocated", 8, 4) == [0, 1, 2, 3]
    assert engine_gpus("separate", 4, 4) == [4, 5, 6, 7]
    assert engine_gpus("separate", 2, 2, tp=2) == [2, 3, 4, 5]


def test_cpu_colocated_is_for_the_hf_engine_only():
    assert check_placement(_cfg(placement="colocated", engine="hf"), False, 0, 1, 1) == "ray"
    assert check_placement(_cfg(placement="separate"), False, 0, 1, 1) == "gloo"
    with pytest.raises(ValueError, match="vLLM-CPU has no sleep mode"):
        check_placement(_cfg(placement="colocated"), False, 0, 1, 1)
