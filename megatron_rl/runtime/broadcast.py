"""Rank ``src``'s object on every rank, its tensors out of the pickle.

:func:`broadcast_object` pickles the object's skeleton only: every CPU tensor inside it (at any depth —
the flat token buffers of ``rollout/rollouts.Rollouts``, per-sample rewards) is left out of the pickle
(``persistent_id``) and sent through ``dist.broadcast``: each tensor of at least :data:`BIG_BYTES` from its
own memory into a tensor of its dtype and shape on the receiving ranks, the smaller ones packed into one
buffer (one collective for all of them) and rebuilt as views of it. On a gloo group (the host) there is no
staging copy on either side. On an NCCL group every tensor is staged through the device
(``dist.get_backend(group)`` picks it): the sender copies it host -> device, each receiver receives into a
device buffer as large as the tensor and copies it device -> host. The default group is NCCL on a GPU, so
its broadcasts stage; the per-replica groups of a step's batch (``parallel.replica_groups``) are gloo
everywhere and never do. So a
step's batch costs one small pickle plus the bytes of its tensors on the wire, not a Python object per
token (the earlier ``broadcast_object_list`` of the whole object: seconds and gigabytes per rank at a
recipe's batch, ``benchmarks/bench_data_plane.py``).

From rank 0 (the driver, whose rollouts / evaluation the others wait for) the others first wait in the
c10d store (``runtime/driver_wait.py``) and join the collectives only once the object is ready, so a long
rank-0 phase never sits in an NCCL collective against ``parallel.timeout_s`` and its watchdog.
"""
from __future__ import annotations

import io
import pickle
from typing import Any

import torch
import torch.distributed as dist

from . import driver_wait
from .device import default_device

_ALIGN = 16   # each tensor's bytes start at a multiple of this in the flat buffer (any dtype's view)
#: tensors of at least this many bytes are broadcast one by one from their own memory; smaller ones travel
#: packed into one buffer (one collective for all of them, the copy is small)
BIG_BYTES = 1 << 20


class _Pickler(pickle.Pickler):
    def __init__(self, f, tensors: list):
        super().__init__(f, protocol=pickle.HIGHEST_PROTOCOL)
        self.tensors = tensors

    def persistent_id(self, obj):
        if isinstance(obj, torch.Tensor) and obj.device.type == "cpu" and not obj.requires_grad \
                and obj.layout == torch.strided:
            self.tensors.append(obj)
            return len(self.tensors) - 1
        return None


class _Unpickler(pickle.Unpickler):
    def __init__(self, f, tensors: list):
        super().__init__(f)
        self.tensors = tensors

    def persistent_load(self, pid):
        return self.tensors[pid]


def split_tensors(obj: Any) -> tuple[bytes, list[torch.Tensor]]:
    """``obj`` as (its pickle without its CPU tensors, those tensors in order)."""
    tensors: list[torch.Tensor] = []
    buf = io.BytesIO()
    _Pickler(buf, tensors).dump(obj)
    return buf.getvalue(), tensors


def join_tensors(skeleton: bytes, tensors: list[torch.Tensor]) -> Any:
    """The inverse of :func:`split_tensors`."""
    return _Unpickler(io.BytesIO(skeleton), tensors).load()


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def _bytes_view(t: torch.Tensor) -> torch.Tensor:
    """A contiguous tensor's memory as a flat uint8 tensor (no copy)."""
    return t.reshape(-1).view(torch.uint8)


def _aligned(sizes: list[int]) -> list[int]:
    """Byte offsets of buffers of ``sizes`` bytes placed back to back, each at a multiple of ``_ALIGN``."""
    out, off = [], 0
    for n in sizes:
        out.append(off)
        off += -(-n // _ALIGN) * _ALIGN
    return out


def _layout(tensors: list[torch.Tensor]) -> list[tuple[torch.dtype, tuple, int]]:
    """(dtype, shape, byte offset) of each tensor in the flat buffer."""
    return [(t.dtype, tuple(t.shape), o) for t, o in zip(tensors, _aligned([_nbytes(t) for t in tensors]))]


def pack(tensors: list[torch.Tensor]) -> tuple[torch.Tensor, list]:
    """The tensors' bytes in one uint8 buffer (each at an aligned offset) and its layout."""
    spec = _layout(tensors)
    end = spec[-1][2] + _nbytes(tensors[-1]) if tensors else 0
    flat = torch.empty(end, dtype=torch.uint8)
    for t, (_, _, off) in zip(tensors, spec):
        n = _nbytes(t)
        if n:
            flat[off:off + n] = _bytes_view(t.contiguous())
    return flat, spec


def unpack(flat: torch.Tensor, spec: list) -> list[torch.Tensor]:
    """Views of ``flat`` as the tensors of ``spec`` (:func:`pack`)."""
    out = []
    for dtype, shape, off in spec:
        n = torch.Size(shape).numel() * dtype.itemsize
        out.append(flat[off:off + n].view(dtype).reshape(shape))
    return out


def _send_tensors(tensors: list[torch.Tensor], src: int, group, dev: torch.device) -> None:
    """Rank ``src``'s side of :func:`_recv_tensors`: the small tensors packed into one buffer, each large
    one broadcast from its own memory (a non-contiguous one is made contiguous first). ``dev`` CPU (a gloo
    group): no staging copy; CUDA (an NCCL group): each is copied to the device first."""
    flat = pack([t for t in tensors if _nbytes(t) < BIG_BYTES])[0]
    if flat.numel():
        dist.broadcast(flat.to(dev), src=src, group=group)
    for t in tensors:
        if _nbytes(t) >= BIG_BYTES:
            dist.broadcast(_bytes_view(t.contiguous()).to(dev), src=src, group=group)


def _recv_tensors(spec: list[tuple[torch.dtype, tuple]], src: int, group, dev: torch.device) -> list[torch.Tensor]:
    """The tensors of ``spec`` (dtype, shape) from rank ``src``: the small ones as views of one packed
    buffer, each large one received into a tensor of its own dtype and shape (``dev`` CUDA, an NCCL
    group: through a device buffer of its size, then copied to the host)."""
    sizes = [torch.Size(shape).numel() * dtype.itemsize for dtype, shape in spec]
    small = [i for i, n in enumerate(sizes) if n < BIG_BYTES]
    out: list = [None] * len(spec)
    if small:
        offs = _aligned([sizes[i] for i in small])
        buf = torch.empty(offs[-1] + sizes[small[-1]], dtype=torch.uint8, device=dev)
        if buf.numel():   # (pack's size on the sending side; nothing is sent for empty tensors only)
            dist.broadcast(buf, src=src, group=group)
        for i, t in zip(small, unpack(buf.cpu(), [(*spec[i], o) for i, o in zip(small, offs)])):
            out[i] = t
    for i, (dtype, shape) in enumerate(spec):
        if sizes[i] >= BIG_BYTES:
            t = torch.empty(shape, dtype=dtype)
            if dev.type == "cpu":
                dist.broadcast(_bytes_view(t), src=src, group=group)
            else:
                buf = torch.empty(sizes[i], dtype=torch.uint8, device=dev)
                dist.broadcast(buf, src=src, group=group)
                _bytes_view(t).copy_(buf)
            out[i] = t
    return out


def broadcast_object(obj: Any, src: int = 0, group=None) -> Any:
    """Rank ``src``'s ``obj`` on every rank of ``group`` (module docstring): its skeleton and its
    tensors' (dtype, shape) through ``broadcast_object_list``, then the tensors through ``broadcast``:
    those under :data:`BIG_BYTES` packed into one buffer, each larger one straight from (into) its own
    memory — on the host for a gloo group, staged through the device for an NCCL one."""
    if not dist.is_initialized() or dist.get_world_size(group) == 1:
        return obj
    waiter = driver_wait.current()
    if src == 0 and waiter is not None and group is None:
        waiter.sync()
    me = dist.get_rank() == src
    if me:
        skeleton, tensors = split_tensors(obj)
        box = [(skeleton, [(t.dtype, tuple(t.shape)) for t in tensors])]
    else:
        box = [None]
    dist.broadcast_object_list(box, src=src, group=group)
    skeleton, spec = box[0]
    if not spec:
        return obj if me else join_tensors(skeleton, [])
    dev = default_device() if dist.get_backend(group) == "nccl" else torch.device("cpu")
    if me:
        _send_tensors(tensors, src, group, dev)
        return obj
    return join_tensors(skeleton, _recv_tensors(spec, src, group, dev))
