"""Trainer-side (sender) weight-transfer engines of the vLLM-backed transports (``gloo``, ``nccl``, ``ipc``).

Each is a vLLM ``TrainerWeightTransferEngine`` driven through a ``VLLMWeightSyncClient`` (the
four-method control plane; here :class:`megatron_rl.rollout.pool_sync.ActorSyncClient` over our
engine actors), opened by :func:`trainer_init` (the opener ``rollout/transport.py`` names for them;
this module is imported only when one of them is used, so it may import vLLM at the top):

* ``nccl`` / ``ipc`` — vLLM's own ``NCCLTrainerWeightTransferEngine`` /
  ``IPCTrainerWeightTransferEngine``; this module only builds their init info (rendezvous address,
  group size ``1 + engines × ranks per engine``, packed buffer = ``rollout.bucket_mb``) and hands
  them the round's :class:`~megatron_rl.rollout.weight_sync.RoundSource`.
* ``gloo`` — :class:`GlooTrainerEngine`, the CPU twin of vLLM's NCCL trainer engine: same
  rendezvous (worker init runs on a side thread while the sender opens rank 0 of a stateless
  group), same round (``start_weight_update``; ``update_weights(metadata)`` on a side thread while
  the packed buckets are broadcast; ``finish_weight_update``). Departure: buckets are packed into
  two reusable buffers (:class:`~megatron_rl.rollout.weight_sync.BucketPacker`) and broadcast
  asynchronously, instead of ``packed_nccl_broadcast_producer`` (CUDA streams, and one
  ``torch.cat`` per bucket on top of the gathered tensors).

The ``ray`` transport needs no vLLM on the trainer: ``rollout/ray_transport.py``.
"""
from __future__ import annotations

import dataclasses
import socket
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from typing import ClassVar

from vllm.distributed.weight_transfer.base import (
    TrainerInitInfo,
    TrainerWeightTransferEngine,
)

from .ray_transport import TimedSender
from .transfer_engines import GLOO, broadcast_async
from .weight_sync import BucketPacker, RoundSource, free_port, update_info


def _listen(host: str, port: int):
    """A listening TCP socket on ``host:port`` (port 0: any free one) for the sender's store."""
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind((host, port))
    s.listen()
    return s


@dataclasses.dataclass
class GlooTrainerInitInfo(TrainerInitInfo):
    """Sender-side init info of the ``gloo`` backend (mirrors ``NCCLTrainerInitInfo``)."""

    backend: ClassVar[str] = GLOO
    master_address: str
    master_port: int
    world_size: int
    bucket_bytes: int
    timeout_s: float = 600.0


class GlooTrainerEngine(TimedSender, TrainerWeightTransferEngine):
    """See module docstring. ``self.source`` is replaced by each round's ``RoundSource``."""

    init_info_cls = GlooTrainerInitInfo

    @classmethod
    def trainer_init(cls, init_info: GlooTrainerInitInfo, *, client, source=None):
        from vllm.distributed.utils import (  # lazy: this vLLM submodule loads only when the call needs it
            stateless_init_torch_distributed_process_group,
        )

        eng = cls(client=client, source=source, is_sender=init_info.is_sender)
        eng.bucket_bytes, eng.group = init_info.bucket_bytes, None
        if not eng.is_sender:
            return eng
        # The sender owns the store: a pre-bound listening socket (vLLM's ``listen_socket`` path)
        # skips torch's rendezvous, which under torchrun (TORCHELASTIC_USE_AGENT_STORE) would
        # otherwise join the elastic agent's store as a client and never serve the engines.
        sock = _listen(init_info.master_address, init_info.master_port)
        worker = {"master_address": init_info.master_address, "master_port": sock.getsockname()[1],
                  "rank_offset": 1, "world_size": init_info.world_size, "bucket_bytes": init_info.bucket_bytes,
                  "timeout_s": init_info.timeout_s}
        with ThreadPoolExecutor(max_workers=1) as exe:  # workers block in the rendezvous: run it beside ours
            fut = exe.submit(client.init_weight_transfer_engine, worker)
            eng.group = stateless_init_torch_distributed_process_group(
                init_info.master_address, worker["master_port"], 0, init_info.world_size, "gloo",
                listen_socket=sock, timeout=timedelta(seconds=init_info.timeout_s))
            fut.result()
        return eng

    def _send(self, source, meta) -> BucketPacker:
        packer, works = BucketPacker(source, self.bucket_bytes), {}
        exe = ThreadPoolExecutor(max_workers=1)
        try:
            fut = exe.submit(self.client.update_weights, update_info(meta))  # receivers enter the broadcasts
            for k, _lo, _hi, view in packer.buckets(release=lambda k: works.pop(k).wait()):
                if fut.done():
                    fut.result()  # an engine failed before receiving: raise instead of hanging
                works[k] = broadcast_async(self.group, view)
            for k in sorted(works):
                works.pop(k).wait()
            fut.result()
        finally:
            exe.shutdown(wait=False)  # never join a thread stuck in a broken collective
            packer.close()
        return packer

    def shutdown(self) -> None:
        if getattr(self, "group", None) is not None:
            from vllm.distributed.utils import (  # lazy: this vLLM submodule loads only when the call needs it
                stateless_destroy_torch_distributed_process_group,
            )

            stateless_destroy_torch_distributed_process_group(self.group)
            self.group = None


def register() -> None:
    """Register the trainer engines in vLLM's ``WeightTransferTrainerFactory`` (idempotent)."""
    from vllm.distributed.weight_transfer.factory import (
        WeightTransferTrainerFactory,  # lazy: this vLLM submodule loads only when the call needs it
    )

    try:
        WeightTransferTrainerFactory.register_engine(GLOO, __name__, "GlooTrainerEngine")
    except ValueError:  # already registered in this process
        pass


def make_init_info(backend: str, bucket_bytes: int, world_size: int, master_address: str = "127.0.0.1",
                   master_port: int | None = None):
    """The sender's (rank 0) init info for ``backend``; ``world_size`` = 1 + all engine workers."""
    if backend == "gloo":  # port 0: the sender binds a free one itself (no race)
        return GlooTrainerInitInfo(master_address, master_port or 0, world_size, bucket_bytes, rank=0)
    port = master_port or free_port(master_address)
    if backend == "nccl":
        from vllm.distributed.weight_transfer.nccl_engine import (
            NCCLTrainerInitInfo,  # lazy: this vLLM submodule loads only when the call needs it
        )

        return NCCLTrainerInitInfo(master_address, port, world_size, packed=True,
                                   packed_buffer_size_bytes=bucket_bytes, rank=0)
    if backend == "ipc":
        from vllm.distributed.weight_transfer.ipc_engine import (
            IPCTrainerInitInfo,  # lazy: this vLLM submodule loads only when the call needs it
        )

        return IPCTrainerInitInfo(packed=True, packed_buffer_size_bytes=bucket_bytes, rank=0)
    raise ValueError(f"unknown weight-sync backend {backend!r}")


def trainer_init(backend: str, client, bucket_bytes: int, world_size: int, master_address: str = "127.0.0.1"):
    """Rendezvous with every engine and return the ready sender engine (vLLM's factory)."""
    from vllm.distributed.weight_transfer.factory import (
        WeightTransferTrainerFactory,  # lazy: this vLLM submodule loads only when the call needs it
    )

    register()
    info = make_init_info(backend, bucket_bytes, world_size, master_address)

    # vLLM's nccl/ipc engines insist on a source at init; each round replaces it (engine.source = ...)
    return WeightTransferTrainerFactory.trainer_init(info, client=client, source=RoundSource([], []))
