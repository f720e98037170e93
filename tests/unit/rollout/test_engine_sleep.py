"""The HF engine's sleep releases its weights for real, and wake + push gives the same outputs.

In-process: the test process is the process that holds the engine, and its RSS (``/proc/self/status``
VmRSS) is what the trainer sharing the machine would see. The model is a random Qwen3 of ~128 MB so the
release stands far above allocator noise. Level 2 (what the colocated loop uses: the push re-sends every
weight) is followed by the push a trainer would make — here the same weights read from the model dir.
"""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

from megatron_rl.rollout.engine import SamplingParams
from megatron_rl.rollout.hf_engine import HFEngine
from tests.helpers.tiny_model import save_random_qwen3

PROMPTS = [[5, 17, 301, 42], [7, 7, 1000, 9, 3]]


def _rss() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS in /proc/self/status")


def _outputs(eng: HFEngine):
    comps = eng.generate(PROMPTS, SamplingParams(n=1, max_tokens=6, greedy=True))
    seqs = [list(c.prompt_ids) + list(c.response_ids) for c in comps]
    return ([c.response_ids for c in comps], [c.logprobs for c in comps],
            eng.score(seqs, [len(p) for p in PROMPTS]))


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return save_random_qwen3(tmp_path_factory.mktemp("qwen3_128mb"))


@pytest.fixture(scope="module")
def eng(model_dir):
    """One engine for both tests (each leaves it awake with the model dir's weights)."""
    return HFEngine(str(model_dir), max_model_len=64)


def test_level2_sleep_frees_the_weights_and_push_then_wake_restores_identical_outputs(model_dir, eng):
    from safetensors.torch import load_file

    weight_bytes = sum(p.numel() * p.element_size() for p in eng.model.parameters())
    assert weight_bytes > 100e6
    before = _outputs(eng)
    rss_awake = _rss()
    eng.sleep(level=2)
    freed = rss_awake - _rss()
    assert freed >= 0.8 * weight_bytes, f"sleep freed {freed / 1e6:.1f} MB of {weight_bytes / 1e6:.1f} MB of weights"
    with pytest.raises(RuntimeError, match="asleep"):
        eng.generate(PROMPTS, SamplingParams(max_tokens=2, greedy=True))
    eng.wake(("weights",))
    with pytest.raises(RuntimeError, match="not pushed since a level-2 sleep"):
        eng.generate(PROMPTS, SamplingParams(max_tokens=2, greedy=True))
    eng.update_weights(load_file(str(Path(model_dir) / "model.safetensors")).items())   # the trainer's push
    eng.wake(("kv_cache",))
    assert _outputs(eng) == before


def test_level1_sleep_keeps_a_host_copy_and_wake_restores_it(eng):
    """On CPU the weights already are host memory, so level 1 releases only the per-call cache; the
    round trip must still give the very same tensors and outputs without a push."""
    ref = {n: p.detach().clone() for n, p in eng.model.named_parameters()}
    before = _outputs(eng)
    eng.sleep(level=1)
    assert all(p.numel() == 0 for p in eng.model.parameters())
    eng.wake()
    assert all(torch.equal(p, ref[n]) for n, p in eng.model.named_parameters())
    assert _outputs(eng) == before
    with pytest.raises(ValueError, match="sleep level must be 1 or 2"):
        eng.sleep(level=3)
    with pytest.raises(ValueError, match="wake tags must be weights and/or kv_cache"):
        eng.wake(("kv",))
