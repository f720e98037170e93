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


# ---- the in-process push: buckets stream, never one whole-model buffer (issue 50, review row S2) ----------

class _Receiver:
    """An engine's ``weight_transfer`` as the in-process push drives it: records the calls, checks that the
    pusher keeps no earlier bucket alive (a weak reference to each bucket it was handed), and unpacks."""

    def __init__(self, fail_at: int | None = None):
        self.calls, self.sizes, self.loaded, self._refs, self.fail_at = [], [], [], [], fail_at

    def __call__(self, method: str, **kw):
        import weakref

        self.calls.append(method)
        if method != "update_weights":
            return
        import gc

        gc.collect()
        assert all(r() is None for r in self._refs), "the pusher still holds an earlier bucket"
        info = kw["update_info"]
        if self.fail_at is not None and len(self.sizes) == self.fail_at:
            raise RuntimeError("bucket refused")
        self.sizes.append(info["buffer"].numel())
        self.loaded += [(n, t.clone()) for n, t in unpack_update(info)]
        self._refs.append(weakref.ref(info["buffer"]))


def test_inline_push_streams_buckets_bounded_by_the_bucket_not_the_model():
    from megatron_rl.rollout.weight_sync import push_inline

    g = torch.Generator().manual_seed(1)
    named = [(f"layer{i}.{k}", torch.randn(16, 16, generator=g)) for i in range(8) for k in ("q", "k", "mlp")]
    named.append(("embed", torch.randn(40, 16, generator=g)))   # 2560 B: larger than the bucket, a bucket of its own
    model = sum(t.numel() * t.element_size() for _, t in named)
    bucket = 2048
    rec = _Receiver()
    rec_out = push_inline(rec, named, bucket)
    assert rec.calls[0] == "start_weight_update" and rec.calls[-1] == "finish_weight_update"
    assert rec.calls[1:-1] == ["update_weights"] * rec_out["buckets"] and rec_out["buckets"] >= 10
    assert max(rec.sizes) == rec_out["buffer_bytes"] == 2560 <= max(bucket, 2560) < model / 10
    assert sum(rec.sizes) == rec_out["bytes"] == model and rec_out["tensors"] == len(named)
    assert [n for n, _ in rec.loaded] == [n for n, _ in named]
    assert all(torch.equal(a, b) for (_, a), (_, b) in zip(rec.loaded, named))


def test_inline_push_finishes_the_update_when_a_bucket_fails():
    """A failed bucket still ends the engine's update (an in-flight engine resumes generation), and raises."""
    from megatron_rl.rollout.weight_sync import push_inline

    rec = _Receiver(fail_at=1)
    with pytest.raises(RuntimeError, match="bucket refused"):
        push_inline(rec, [(f"t{i}", torch.zeros(64)) for i in range(4)], 256, weight_version=7)
    assert rec.calls == ["start_weight_update", "update_weights", "update_weights", "finish_weight_update"]


def test_inline_push_peak_host_memory_is_one_bucket_not_the_model():
    """Measured, not reported: the peak private RSS a push adds over its tensors (a receiver that copies each
    bucket into the 'engine's' parameters, as vLLM's loader does), with 40 MB buckets and with one whole-model
    bucket (the old ``pack_round``'s buffer; the measurement must see it). Buckets above glibc's 32 MB ceiling
    of its dynamic mmap threshold are mappings of their own, returned at free, so the RSS shows exactly the
    buckets alive (smaller ones may be served from, and freed back into, the heap: RSS then keeps some)."""
    from megatron_rl.rollout.weight_sync import push_inline
    from megatron_rl.runtime.memwatch import PeakRSS

    named = [(f"w{i}", torch.full((2 << 20,), float(i))) for i in range(48)]   # 48 x 8 MB = 384 MB
    params = {n: torch.zeros_like(t) for n, t in named}
    model, bucket = sum(t.numel() * t.element_size() for _, t in named), 40 << 20

    def load(method, **kw):
        if method == "update_weights":
            for n, t in unpack_update(kw["update_info"]):
                params[n].copy_(t)

    extra = {}
    for label, size in (("whole", model), ("streamed", bucket)):
        with PeakRSS() as m:
            out = push_inline(load, named, size)
        extra[label] = m.extra
        assert all(torch.equal(params[n], t) for n, t in named) and out["bytes"] == model
        params = {n: torch.zeros_like(t) for n, t in named}
    assert extra["whole"] >= 0.95 * model, extra
    assert extra["streamed"] <= bucket + (8 << 20), extra   # one bucket (+ sampler / allocator slack)


def test_async_engine_takes_the_sync_engines_transports_and_cpu_refuses_the_cuda_ones(tmp_path):
    """``vllm-async`` declares vLLM's ``nccl`` / ``ipc`` beside ``gloo`` / ``ray`` (the sync engine's very
    table); with CUDA, auto picks nccl for its separate GPUs; without CUDA, choosing either is refused at
    start-up in one line — by the run's start-up check and by the pool before any engine or Ray starts."""
    from megatron_rl.config import from_dict
    from megatron_rl.rollout.client import RolloutClient
    from megatron_rl.rollout.placement import check_placement
    from megatron_rl.rollout.registry import caps
    from megatron_rl.rollout.transport import resolve_backend
    from megatron_rl.rollout.vllm_engine import VLLM_TRANSPORTS

    assert caps("vllm-async").transports == caps("vllm").transports == VLLM_TRANSPORTS
    assert set(VLLM_TRANSPORTS) == {"gloo", "ray", "nccl", "ipc"} and VLLM_TRANSPORTS["nccl"] == "nccl"
    assert VLLM_TRANSPORTS["ipc"] == "ipc"
    assert resolve_backend("auto", "vllm-async", True, 1, "separate") == "nccl"
    assert resolve_backend("nccl", "vllm-async", True, 4, "separate") == "nccl"
    assert resolve_backend("ipc", "vllm-async", True, 1, None) == "ipc"     # a bare client sharing one GPU
    assert resolve_backend("auto", "vllm-async", False, 1, "separate") == "gloo"
    for req, placement in (("nccl", "separate"), ("nccl", None), ("ipc", None)):
        with pytest.raises(ValueError, match=f"rollout.sync_backend={req} needs CUDA GPUs and none is visible; "
                                             "use gloo \\(or ray\\) on CPU") as e:
            resolve_backend(req, "vllm-async", False, 1, placement)
        assert "\n" not in str(e.value)

    cfg = from_dict({"rollout": {"engine": "vllm-async", "partial": {"enable": True}, "sync_backend": "nccl"}})
    with pytest.raises(ValueError, match="rollout.sync_backend=nccl needs CUDA GPUs and none is visible") as e:
        check_placement(cfg, cuda=False, visible_gpus=0, trainer_gpus=1, trainer_world=1)
    assert "\n" not in str(e.value)
    assert check_placement(cfg, cuda=True, visible_gpus=2, trainer_gpus=1, trainer_world=1) == "nccl"
    for backend in ("nccl", "ipc"):
        with pytest.raises(ValueError, match=f"rollout.sync_backend={backend} needs CUDA GPUs") as e:
            RolloutClient("vllm-async", str(tmp_path), sync_backend=backend)
        assert "\n" not in str(e.value)


def test_what_crosses_into_the_async_engine_core():
    """``core_payload``: a bucket goes as a byte view of itself (no copy), CUDA IPC handles (rebuild arguments
    holding classes, which vLLM's msgpack refuses) go pickled to the worker extension, everything else as is.
    (That vLLM's encoder refuses the raw handles and takes the adapted payloads is checked with vLLM itself in
    ``tests/e2e/test_streamed_push.py``.)"""
    import pickle

    from megatron_rl.rollout.vllm_async_engine import core_payload

    meta = {"names": ["a"], "dtype_names": ["float32"], "shapes": [[2]]}
    buf = torch.arange(8, dtype=torch.uint8)
    method, kw = core_payload("update_weights", {"update_info": {**meta, "buffer": buf}})
    assert method == "update_weights" and isinstance(kw["update_info"]["buffer"], memoryview)
    assert bytes(kw["update_info"]["buffer"]) == bytes(range(8)) and kw["update_info"]["names"] == ["a"]
    handles = {"GPU-uuid": (torch.Tensor, torch.Size([4]), (1,), 0, torch.UntypedStorage, torch.float32, 0, b"h", 16)}
    method, kw = core_payload("update_weights", {"update_info": {**meta, "ipc_handles": handles, "tensor_sizes": [8]}})
    assert method == "mrl_update_weights" and set(kw) == {"payload"}
    assert pickle.loads(kw["payload"]) == {**meta, "ipc_handles": handles, "tensor_sizes": [8]}
    nccl = {"update_info": dict(meta)}
    assert core_payload("update_weights", nccl) == ("update_weights", nccl)
    init = {"init_info": {"master_address": "10.0.0.1", "master_port": 1, "rank_offset": 1, "world_size": 2}}
    assert core_payload("init_weight_transfer_engine", init) == ("init_weight_transfer_engine", init)
