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
    ({"placement": "colocated", "num_engines": 4, "tensor_parallel_size": 2}, 8, 8, None),
    ({"placement": "colocated", "num_engines": 8, "tensor_parallel_size": 2}, 8, 8,
     "8 engine(s) x 2 GPU(s) = 16 GPUs, but the trainer has 8"),
    ({"placement": "separate", "num_engines": 2, "tensor_parallel_size": 2}, 8, 4, None),
    ({"placement": "separate", "num_engines": 3, "tensor_parallel_size": 2}, 8, 4, "+ 3 engine(s) x 2 = 10 GPUs"),
], ids=["colocated-fits", "colocated-too-many", "separate-fits", "separate-too-many", "separate-cluster",
        "separate-ipc", "colocated-ipc-8", "colocated-tp2-fits", "colocated-tp2-too-many", "separate-tp2-fits",
        "separate-tp2-too-many"])
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
    with pytest.raises(ValueError, match="rollout.engine=vllm needs CUDA: it has no sleep mode without it"):
        check_placement(_cfg(placement="colocated"), False, 0, 1, 1)


def test_engine_keys_resolve_per_machine_and_reach_the_engine_arguments():
    """null = auto: eager on CPU / CUDA graphs on GPU; 0.5 colocated / 0.9 separate; the values in force
    are what ``client_args`` hands the engines (``tests/e2e/test_rollout_vllm.py``: what vLLM records)."""
    from megatron_rl.trainer.loop.setup import client_args

    def kw(cuda, **rollout):
        return client_args(_cfg(**rollout), cuda=cuda)["engine_kwargs"]

    assert (kw(False)["enforce_eager"], kw(True)["enforce_eager"], kw(True, enforce_eager=True)["enforce_eager"]) == \
        (True, False, True)
    assert kw(True, placement="colocated")["gpu_memory_utilization"] == 0.5
    assert kw(True, placement="separate")["gpu_memory_utilization"] == 0.9
    assert kw(True, gpu_memory_utilization=0.8)["gpu_memory_utilization"] == 0.8
    assert kw(True, tensor_parallel_size=4)["tensor_parallel_size"] == 4
    assert "tensor_parallel_size" not in kw(False, engine="hf")      # the HF engine has no TP


@pytest.mark.parametrize("rollout,words", [
    ({"tensor_parallel_size": 2}, "rollout.tensor_parallel_size=2 needs CUDA GPUs"),
    ({"enforce_eager": False}, "rollout.enforce_eager=false (CUDA graphs) needs CUDA GPUs"),
])
def test_engine_keys_refused_on_cpu_in_one_line(rollout, words):
    check_placement(_cfg(**rollout), True, 8, 4, 4)                 # fine with GPUs
    with pytest.raises(ValueError, match=re.escape(words)) as e:
        check_placement(_cfg(**rollout), False, 0, 1, 1)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("rollout,words", [
    ({"tensor_parallel_size": 0}, "rollout.tensor_parallel_size must be >= 1"),
    ({"gpu_memory_utilization": 1.5}, "rollout.gpu_memory_utilization must be in (0, 1]"),
    ({"engine": "hf", "tensor_parallel_size": 2}, "needs rollout.engine=vllm"),
])
def test_engine_keys_bad_values(rollout, words):
    with pytest.raises(ValueError, match=re.escape(words)):
        _cfg(**rollout)


def test_colocated_engines_share_every_node_of_a_ray_cluster():
    """Two nodes of 8 (WORLD_SIZE 16): 8 engines x TP2 fit the trainer's 16 GPUs when a Ray cluster spans the
    nodes (the placement group spreads them); a Ray of one node has only its 8."""
    cfg = _cfg(placement="colocated", num_engines=8, tensor_parallel_size=2)
    assert check_placement(cfg, True, 8, 8, 16, cluster=True) == "ray"
    with pytest.raises(ValueError, match=re.escape("= 16 GPUs, but the trainer has 8 on this node to share")):
        check_placement(cfg, True, 8, 8, 16, cluster=False)
    with pytest.raises(ValueError, match=re.escape("= 32 GPUs, but the trainer has 16 in all its nodes' Ray cluster")):
        check_placement(_cfg(placement="colocated", num_engines=16, tensor_parallel_size=2), True, 8, 8, 16, cluster=True)
