"""GPU-only paths of the trainer and the engines (skipped without CUDA; the CPU rehearsal of the bring-up,
``tests/unit/test_gpu_bringup.py``, runs their CPU halves):

* a checkpoint's RNG states hold the default CUDA generator, so a resumed run draws what it would have;
* an engine's ``named_parameters`` are host copies: no second copy of the model on the GPU, and nothing
  CUDA for Ray to ship.
"""
from __future__ import annotations

import pytest
import torch


@pytest.mark.requires_gpus(1)
def test_checkpoint_rng_keeps_the_cuda_generator():
    from megatron_rl.trainer.state.checkpoint import _rng_state, _set_rng_state

    torch.cuda.manual_seed_all(3)
    saved = _rng_state()
    assert len(saved["cuda"]) == torch.cuda.device_count()
    want = torch.randn(8, device="cuda")
    torch.randn(1000, device="cuda")                  # the generator moves on
    _set_rng_state(saved)
    assert torch.equal(torch.randn(8, device="cuda"), want)


@pytest.mark.requires_gpus(1)
def test_engine_parameters_come_back_as_host_copies(tmp_path):
    from megatron_rl.rollout.hf_engine import HFEngine
    from tests.helpers.tiny_model import save_random_qwen3

    hf = save_random_qwen3(tmp_path / "hf", vocab_size=512, hidden_size=64, num_hidden_layers=1)
    eng = HFEngine(str(hf), max_model_len=64, device="cuda")
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    got = eng.named_parameters()
    assert torch.cuda.memory_allocated() == before
    assert got and all(t.device.type == "cpu" for t in got.values())
    live = dict(eng.model.named_parameters())
    assert all(torch.equal(t, live[n].cpu()) for n, t in got.items())
