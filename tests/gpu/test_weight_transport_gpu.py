"""GPU weight transport through vLLM's own engines (not run on the CPU machine: skipped without CUDA).

* ``nccl`` (needs 2 GPUs): the test process is the sender on the LAST GPU; Ray gets the others and
  places one vLLM engine actor there. After a sync of perturbed weights every engine parameter
  equals the sent tensors (vLLM's fused qkv / gate_up rebuilt) bit for bit, the sender's extra
  device memory (``max_memory_allocated``) stays within vLLM's packed double buffer (2 buckets +
  the largest tensor), and a second sync after killing the engine re-syncs the replacement.
* ``ipc`` (1 GPU): the same with the engine colocated on the sender's GPU (CUDA IPC handles).

Each for both vLLM engines: ``vllm`` and the in-flight ``vllm-async`` (issue 50), whose worker sits in
``AsyncLLM``'s engine-core process (IPC handles reach it pickled through the worker extension,
``vllm_async_engine.core_payload``); with ``nccl`` the async engine's push is also taken while groups run,
and every response token carries the version that sampled it.

Both need Ray and vLLM importable (skipped with the import error otherwise, e.g. on the lent bring-up
machine, whose own IPC hand-off check is ``tools/gpu_check_moves.py`` stage ``ipc``).
"""
from __future__ import annotations

import pytest
import torch

from tests.gpu.stack_probe import needs

BUCKET = 4 << 20
pytestmark = needs("ray", "vllm")      # both transports go through Ray actors holding vLLM engines


def _make_hf(out):
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(0)
    cfg = Qwen3Config(vocab_size=256, hidden_size=256, intermediate_size=1024, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=64, max_position_embeddings=128,
                      tie_word_embeddings=False, architectures=["Qwen3ForCausalLM"])
    Qwen3ForCausalLM(cfg).float().save_pretrained(str(out))
    return out


def _to_engine_names(hf: dict) -> dict:
    out = {}
    for k, v in hf.items():
        if ".q_proj." in k:
            out[k.replace(".q_proj.", ".qkv_proj.")] = torch.cat(
                [v, hf[k.replace("q_proj", "k_proj")], hf[k.replace("q_proj", "v_proj")]])
        elif ".gate_proj." in k:
            out[k.replace(".gate_proj.", ".gate_up_proj.")] = torch.cat([v, hf[k.replace("gate_proj", "up_proj")]])
        elif not any(s in k for s in (".k_proj.", ".v_proj.", ".up_proj.")):
            out[k] = v
    return out


def _sync_and_check(client, hf_dir, device):
    from safetensors.torch import load_file

    from megatron_rl.runtime.device import max_memory_allocated
    from megatron_rl.rollout.weight_sync import RoundSource

    w = {k: (v * 0.5).to(device) for k, v in load_file(str(hf_dir / "model.safetensors")).items()}
    torch.cuda.reset_peak_memory_stats(device)
    base = torch.cuda.memory_allocated(device)
    client.update_weights(RoundSource.from_tensors(w.items()), bucket_bytes=BUCKET)
    extra = max_memory_allocated() - base
    largest = max(t.numel() * t.element_size() for t in w.values())
    assert extra <= 2 * (BUCKET + largest), f"sender extra device memory {extra} B"
    expected = {k: v.cpu() for k, v in _to_engine_names(w).items()}
    for i in range(len(client.actors)):
        got = client.engine_parameters(i)
        bad = [n for n, t in got.items() if n in expected and not torch.equal(t.cpu(), expected[n])]
        assert not bad, bad[:10]
        assert set(expected) - {"lm_head.weight"} <= set(got)


def _inflight(client, push) -> None:
    """``vllm-async``: groups submitted, ``push()`` while they run, harvested: none lost, versions monotone and
    the last one the push's."""
    from megatron_rl.rollout.engine import SamplingParams

    v = client.stats()["rollout/weight_version"]
    for k in range(4):
        client.submit(k, [1, 5 + k, 9, 17], SamplingParams(n=2, max_tokens=100, seed=k))
    push()
    got = client.harvest(wait_s=300, min_groups=4)
    assert sorted(k for k, _ in got) == list(range(4))
    for _k, comps in got:
        for c in comps:
            assert list(c.versions) == sorted(c.versions) and set(c.versions) <= {v, v + 1}, c.versions


@pytest.mark.requires_gpus(2)
@pytest.mark.parametrize("engine", ["vllm", "vllm-async"])
def test_nccl_sync_is_bit_exact_and_survives_an_engine_restart(tmp_path, engine):
    import ray

    from megatron_rl.rollout.client import RolloutClient

    n = torch.cuda.device_count()
    device = torch.device("cuda", n - 1)
    torch.cuda.set_device(device)
    hf = _make_hf(tmp_path / "hf")
    ray.init(num_cpus=4, num_gpus=n - 1, include_dashboard=False, log_to_driver=False)
    client = RolloutClient(engine, str(hf), 1, {"max_model_len": 128, "gpu_memory_utilization": 0.3},
                           cpus_per_engine=1, gpus_per_engine=1, sync_backend="nccl", bucket_bytes=BUCKET)
    try:
        assert client.backend == "nccl"
        _sync_and_check(client, hf, device)
        if engine == "vllm-async":
            _inflight(client, lambda: _sync_and_check(client, hf, device))
        client.kill_engine(0)
        client._restart(0)  # what a failed call does; the replacement is stale until the next sync
        _sync_and_check(client, hf, device)
    finally:
        client.shutdown()
        ray.shutdown()


@pytest.mark.requires_gpus(1)
@pytest.mark.parametrize("engine", ["vllm", "vllm-async"])
def test_ipc_sync_colocated_is_bit_exact(tmp_path, engine):
    import ray

    from megatron_rl.rollout.client import RolloutClient

    device = torch.device("cuda", 0)
    torch.cuda.set_device(device)
    hf = _make_hf(tmp_path / "hf")
    ray.init(num_cpus=4, num_gpus=1, include_dashboard=False, log_to_driver=False)
    client = RolloutClient(engine, str(hf), 1, {"max_model_len": 128, "gpu_memory_utilization": 0.3},
                           cpus_per_engine=1, gpus_per_engine=0.5, sync_backend="ipc", bucket_bytes=BUCKET)
    try:
        assert client.backend == "ipc"
        _sync_and_check(client, hf, device)
    finally:
        client.shutdown()
        ray.shutdown()
