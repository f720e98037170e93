"""Trainer → engine weight stream: per-round metadata, the bucket plan, and the packer.

A round is a :class:`RoundSource`: the metadata of every HF tensor (name, dtype, shape — known
without gathering anything) plus an iterator that produces the tensors one by one (on the
trainer, ``convert.iter_hf_tensors``: TP shards gathered per tensor, each PP stage contributing its
own layers). It has the two channels of vLLM's ``WeightSource`` (``metadata()`` of ``ParamMeta``-shaped
records, and iteration), all vLLM's own trainer engines (``nccl``, ``ipc``) read, without importing
vLLM: a run whose engine needs no vLLM never imports it on the trainer.

The bucket plan (:func:`plan_buckets`) is derived from the metadata alone, so the sender and every
receiver cut the stream identically without exchanging bucket boundaries (vLLM's packed protocol).
:class:`BucketPacker` copies each produced tensor straight into one of two reusable uint8 buffers
(the next bucket is packed while the previous one is in flight), so the sender's extra memory is
at most ``2 × bucket_bytes`` plus the tensor being produced — never the model.

:func:`push_inline` is the round of an engine that takes its buckets in the call itself (the vLLM
engines' in-process ``update_weights``): ``start_weight_update``, one ``update_weights`` per bucket
(each bucket a buffer of its own, ``reuse=False``: the receiver may keep views of it, see
:class:`BucketPacker`), ``finish_weight_update`` — the same lifecycle, and the same bucket size
(``rollout.bucket_mb``, :data:`DEFAULT_BUCKET_BYTES`), as every transport; never one buffer of the
whole model.
"""
from __future__ import annotations

import dataclasses
import socket
import time
from collections.abc import Iterable, Iterator

import torch

#: ``rollout.bucket_mb``'s default in bytes: the bucket of a push whose caller names none (the engines'
#: in-process ``update_weights``, ``SyncedPool``)
DEFAULT_BUCKET_BYTES = 256 << 20


def plan_buckets(sizes: list[int], bucket_bytes: int) -> list[tuple[int, int]]:
    """Split tensors ``0..n-1`` of byte ``sizes`` into consecutive ``[lo, hi)`` buckets.

    A bucket closes before the tensor that would overflow ``bucket_bytes``; a tensor larger than the
    budget gets a bucket of its own (so a bucket is ≤ max(bucket_bytes, largest tensor)).
    """
    if bucket_bytes <= 0:
        raise ValueError(f"bucket_bytes must be > 0, got {bucket_bytes}")
    out, lo, size = [], 0, 0
    for i, n in enumerate(sizes):
        if i > lo and size + n > bucket_bytes:
            out.append((lo, i))
            lo, size = i, 0
        size += n
    if lo < len(sizes):
        out.append((lo, len(sizes)))
    return out


def nbytes(shape, dtype: torch.dtype) -> int:
    return int(torch.Size(shape).numel()) * dtype.itemsize


@dataclasses.dataclass(frozen=True)
class ParamMeta:
    """Name / wire dtype / full (HF) shape of one tensor of a round (the fields of vLLM's ``ParamMeta``)."""

    name: str
    dtype: torch.dtype
    shape: tuple[int, ...]


class RoundSource:
    """One round's weights: ``metadata()`` (:class:`ParamMeta` list) and a single-pass iterator.

    Also times the producer: ``produce_s`` accumulates the seconds spent inside the iterator
    (gather over TP/PP + HF split on the trainer).
    """

    def __init__(self, meta: list, tensors: Iterable[tuple[str, torch.Tensor]]):
        self._meta, self._it, self.produce_s = list(meta), iter(tensors), 0.0

    @classmethod
    def from_tensors(cls, named: Iterable[tuple[str, torch.Tensor]]) -> RoundSource:
        """From already materialised tensors (tests, benchmarks, HF dirs)."""
        named = [(n, t.detach()) for n, t in named]
        return cls([param_meta(n, t.dtype, tuple(t.shape)) for n, t in named], named)

    def metadata(self) -> list:
        return self._meta

    def __iter__(self) -> Iterator[tuple[str, torch.Tensor]]:
        while True:
            t0 = time.perf_counter()
            try:
                item = next(self._it)
            except StopIteration:
                return
            finally:
                self.produce_s += time.perf_counter() - t0
            yield item

    def sizes(self) -> list[int]:
        return [nbytes(m.shape, m.dtype) for m in self._meta]

    def total_bytes(self) -> int:
        return sum(self.sizes())


def param_meta(name: str, dtype: torch.dtype, shape: tuple[int, ...]) -> ParamMeta:
    return ParamMeta(name, dtype, tuple(shape))


class BucketPacker:
    """Packs a :class:`RoundSource` bucket by bucket into two reusable uint8 buffers.

    ``buckets()`` yields ``(k, lo, hi, view)`` where ``view`` is the packed bytes of tensors
    ``lo:hi``; bucket ``k`` reuses bucket ``k - 2``'s buffer, so :meth:`buckets` calls
    ``release(k - 2)`` (the caller waits for that transfer) before packing bucket ``k``. Every
    produced tensor is checked against the metadata (name, dtype, shape) — the receivers sized
    their buffers from it, so a mismatch would otherwise hang or load garbage.
    ``alloc(nbytes)`` makes a buffer (torch by default; numpy-backed for Ray).

    ``reuse=False``: every bucket is a buffer of its own, exactly its size, which the packer keeps no
    reference to once yielded — for a receiver that holds the views it was handed past its call (vLLM's
    layerwise reload keeps each loaded tensor until its layer is complete, up to ``finish_weight_update``
    for a layer it defers, e.g. a padded vocabulary: a reused buffer would be overwritten under it).
    ``peak_buffer_bytes``: the most bytes of buffers the packer held at once (two slots when reused; the
    largest bucket otherwise).
    """

    def __init__(self, source: RoundSource, bucket_bytes: int, alloc=None, reuse: bool = True):
        self.source, self.bucket_bytes, self.reuse = source, bucket_bytes, reuse
        self.sizes = source.sizes()
        self.plan = plan_buckets(self.sizes, bucket_bytes)
        self._alloc = alloc or (lambda n: torch.empty(n, dtype=torch.uint8))
        self._bufs: list = [None, None]
        self.pack_s = 0.0
        self.peak_buffer_bytes = 0

    def _buffer(self, slot: int, n: int) -> torch.Tensor:
        if not self.reuse:
            self.peak_buffer_bytes = max(self.peak_buffer_bytes, n)
            return self._alloc(n)
        cur = self._bufs[slot]
        if cur is None or cur.numel() < n:
            self._bufs[slot] = None
            self._bufs[slot] = self._alloc(max(n, min(self.bucket_bytes, sum(self.sizes))))
        self.peak_buffer_bytes = max(self.peak_buffer_bytes, sum(b.numel() for b in self._bufs if b is not None))
        return self._bufs[slot]

    def buckets(self, release=lambda k: None) -> Iterator[tuple[int, int, int, torch.Tensor]]:
        meta, it = self.source.metadata(), iter(self.source)
        for k, (lo, hi) in enumerate(self.plan):
            if k >= 2:
                release(k - 2)
            n = sum(self.sizes[lo:hi])
            buf = self._buffer(k % 2, n)
            off = 0
            for i in range(lo, hi):
                name, t = next(it)
                m = meta[i]
                if name != m.name or t.dtype != m.dtype or tuple(t.shape) != tuple(m.shape):
                    raise ValueError(f"weight stream: tensor {i} is {name!r} {t.dtype} {tuple(t.shape)}, "
                                     f"metadata said {m.name!r} {m.dtype} {tuple(m.shape)}")
                t0 = time.perf_counter()
                _copy_into(buf, off, t)
                self.pack_s += time.perf_counter() - t0
                off += self.sizes[i]
                del t
            view = buf[:n]
            del buf
            yield k, lo, hi, view
            del view   # reuse=False: the receiver owns the bucket now
        if next(it, None) is not None:
            raise ValueError(f"weight stream yielded more tensors than its metadata ({len(meta)})")

    def close(self) -> None:
        self._bufs = [None, None]


def _copy_into(buf: torch.Tensor, off: int, t: torch.Tensor) -> None:
    n = t.numel() * t.element_size()
    dst = buf[off:off + n]
    if off % t.element_size() == 0:
        dst.view(t.dtype).view(t.shape).copy_(t)  # one copy, also from non-contiguous views
    else:
        dst.copy_(t.contiguous().view(-1).view(torch.uint8))


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that is free on ``host`` now (rendezvous of the transfer group)."""
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def update_info(meta, lo: int = 0, hi: int | None = None) -> dict:
    """The per-round metadata of tensors ``lo:hi`` (names, dtype names, shapes): vLLM's packed update info."""
    meta = meta[lo:hi]
    return {"names": [m.name for m in meta], "dtype_names": [str(m.dtype).removeprefix("torch.") for m in meta],
            "shapes": [list(m.shape) for m in meta]}


def push_inline(call, named_tensors, bucket_bytes: int = DEFAULT_BUCKET_BYTES, **finish_kwargs) -> dict:
    """One push of ``named_tensors`` (a :class:`RoundSource`, or ``(name, tensor)`` pairs) through
    ``call(method, **kwargs)`` — an engine's ``weight_transfer`` — with every bucket carried in its
    ``update_weights`` call (``update_info`` plus ``buffer``: the ``ray`` transport's payload).

    ``start_weight_update``, one ``update_weights`` per bucket of ``bucket_bytes`` (a tensor larger than
    that is a bucket of its own), ``finish_weight_update(**finish_kwargs)`` — also after a failed bucket,
    so the engine leaves its update (an in-flight engine resumes) and the error is raised. Each bucket is
    a buffer of its own that this function drops once its call returned (``BucketPacker(reuse=False)``),
    so the host memory a push adds here is one bucket, never the model.

    Returns ``{"tensors", "buckets", "bytes", "buffer_bytes" (the largest bucket), "seconds"}``.
    """
    t0 = time.perf_counter()
    src = named_tensors if isinstance(named_tensors, RoundSource) else RoundSource.from_tensors(named_tensors)
    meta = src.metadata()
    packer = BucketPacker(src, bucket_bytes, reuse=False)
    call("start_weight_update")
    try:
        for _k, lo, hi, view in packer.buckets():
            call("update_weights", update_info={**update_info(meta, lo, hi), "buffer": view})
            del view
    finally:
        call("finish_weight_update", **finish_kwargs)
    return {"tensors": len(meta), "buckets": len(packer.plan), "bytes": src.total_bytes(),
            "buffer_bytes": packer.peak_buffer_bytes, "seconds": time.perf_counter() - t0}


def unpack_update(info: dict) -> list[tuple[str, torch.Tensor]]:
    """``(name, view)`` pairs of one packed update (``names``/``dtype_names``/``shapes``/``buffer``),
    the layout of vLLM's ``packed_tensor.unpack_tensor`` (tensors back to back), without vLLM."""
    buf, out, off = info["buffer"], [], 0
    for name, d, shape in zip(info["names"], info["dtype_names"], info["shapes"]):
        dt = getattr(torch, d)
        n = nbytes(shape, dt)
        piece = buf[off:off + n]
        if off % dt.itemsize:  # mixed dtypes: an unaligned slice cannot be viewed in place
            piece = piece.clone()
        out.append((name, piece.view(dt).view(shape)))
        off += n
    return out
