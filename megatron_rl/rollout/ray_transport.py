"""The ``ray`` weight transport's sender, and the round every sender shares — without any engine library.

:class:`TimedSender` is one round of a trainer-side sender (vLLM's ``TrainerWeightTransferEngine``
surface: ``client``, ``source``, ``is_sender``, ``send_weights``, ``shutdown``): non-senders only
drain their stream (PP stages send their layers to the sender inside it); the sender opens the
update, streams the buckets (each transport's ``_send``), closes it, and records the stage times.
The vLLM-backed senders (``rollout/trainer_engines.py``) add vLLM's base class to it.

:class:`RaySender` (``rollout.sync_backend=ray``): each packed bucket is ``ray.put`` once and
loaded by every engine actor (``ActorSyncClient.submit_update``; the actor hands the object-store
view to the engine's ``weight_transfer("update_weights", update_info={..., "buffer": ...})``); at
most two buckets are in the object store at any time and nothing is kept after the round (a
restarted engine is re-synced by the next round). The engines' receiving side unpacks the bucket
(vLLM: our worker engine's inline path; HF: ``unpack_update`` + an in-process copy).
"""
from __future__ import annotations

import time

from .weight_sync import BucketPacker, update_info


class TimedSender:
    """Per-round stage times of the sender (seconds): produce, pack, transfer (waiting on the wire /
    the engines), total — in ``last`` after each round."""

    def __init__(self, *, client, source=None, is_sender: bool = True) -> None:
        self.client, self.source, self.is_sender = client, source, is_sender

    def _record(self, t0: float, packer: BucketPacker, source) -> None:
        total = time.perf_counter() - t0
        self.last = {"produce_s": source.produce_s, "pack_s": packer.pack_s, "total_s": total,
                     "transfer_s": max(0.0, total - source.produce_s - packer.pack_s),
                     "bytes": source.total_bytes(), "buffer_bytes": packer.peak_buffer_bytes}

    def send_weights(self) -> None:
        """One round (module docstring)."""
        source, t0 = self.source, time.perf_counter()
        if not self.is_sender:
            for _ in source:
                pass
            return
        meta = source.metadata()
        self.client.start_weight_update()
        packer = self._send(source, meta)
        self.client.finish_weight_update()
        self._record(t0, packer, source)

    def _send(self, source, meta) -> BucketPacker:
        """Stream ``source``'s buckets to the engines; returns the (closed) packer. Each subclass's own."""
        raise TypeError(f"{type(self).__name__} defines no _send")

    def shutdown(self) -> None:
        """Nothing held between rounds by default."""


class RaySender(TimedSender):
    """See module docstring; ``client.submit_update(info, ref)`` returns Ray refs to wait on."""

    def __init__(self, *, client, source=None, is_sender: bool = True, bucket_bytes: int) -> None:
        super().__init__(client=client, source=source, is_sender=is_sender)
        self.bucket_bytes = bucket_bytes

    def _send(self, source, meta) -> BucketPacker:
        import numpy as np  # lazy: defers numpy to the call
        import ray  # lazy: defers ray to the call
        import torch  # lazy: defers torch to the call

        packer = BucketPacker(source, self.bucket_bytes, alloc=lambda n: torch.from_numpy(np.empty(n, np.uint8)))
        pending: dict[int, list] = {}
        for k, lo, hi, view in packer.buckets(release=lambda k: ray.get(pending.pop(k))):
            ref = ray.put(view.numpy())  # one copy into the object store; the buffer is free again
            pending[k] = self.client.submit_update(update_info(meta, lo, hi), ref)
            del ref  # only the in-flight calls hold the bucket: freed once every engine loaded it
        for k in sorted(pending):
            ray.get(pending.pop(k))
        packer.close()
        return packer


def open_sender(name: str, client, bucket_bytes: int, world_size: int, master_address: str = "127.0.0.1") -> RaySender:
    """The ``ray`` transport's opener (``rollout/transport.py``): no rendezvous, an empty init payload
    (the engines' receiving side takes buckets carried in the call)."""
    if name != "ray":
        raise ValueError(f"ray_transport opens the ray transport, not {name!r}")
    client.init_weight_transfer_engine({})
    return RaySender(client=client, bucket_bytes=bucket_bytes)
