"""Rank ``src``'s object on every rank, its tensors out of the pickle.

:func:`broadcast_object` pickles the object's skeleton only: every CPU tensor inside it (at any depth —
the flat token buffers of ``rollout/rollouts.Rollouts``, per-sample rewards) is left out of the pickle
(``persistent_id``) and sent as bytes of ONE flat buffer through ``dist.broadcast``, then rebuilt on the
receiving ranks as views of that buffer. So a step's batch costs one small pickle plus one memory copy
of its tensors, not a Python object per token (the earlier ``broadcast_object_list`` of the whole
object: seconds and gigabytes per rank at a recipe's batch, ``benchmarks/bench_data_plane.py``).

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


def _layout(tensors: list[torch.Tensor]) -> list[tuple[torch.dtype, tuple, int]]:
    """(dtype, shape, byte offset) of each tensor in the flat buffer."""
    out, off = [], 0
    for t in tensors:
        out.append((t.dtype, tuple(t.shape), off))
        off += -(-t.numel() * t.element_size() // _ALIGN) * _ALIGN
    return out


def pack(tensors: list[torch.Tensor]) -> tuple[torch.Tensor, list]:
    """The tensors' bytes in one uint8 buffer (each at an aligned offset) and its layout."""
    spec = _layout(tensors)
    end = spec[-1][2] + tensors[-1].numel() * tensors[-1].element_size() if tensors else 0
    flat = torch.empty(end, dtype=torch.uint8)
    for t, (_, _, off) in zip(tensors, spec):
        n = t.numel() * t.element_size()
        if n:
            flat[off:off + n] = t.contiguous().reshape(-1).view(torch.uint8)
    return flat, spec


def unpack(flat: torch.Tensor, spec: list) -> list[torch.Tensor]:
    """Views of ``flat`` as the tensors of ``spec`` (:func:`pack`)."""
    out = []
    for dtype, shape, off in spec:
        n = torch.Size(shape).numel() * torch.empty((), dtype=dtype).element_size()
        out.append(flat[off:off + n].view(dtype).reshape(shape))
    return out


def broadcast_object(obj: Any, src: int = 0, group=None) -> Any:
    """Rank ``src``'s ``obj`` on every rank of ``group`` (module docstring): its skeleton through
    ``broadcast_object_list``, its CPU tensors as one flat buffer through ``broadcast``."""
    if not dist.is_initialized() or dist.get_world_size(group) == 1:
        return obj
    waiter = driver_wait.current()
    if src == 0 and waiter is not None and group is None:
        waiter.sync()
    me = dist.get_rank() == src
    if me:
        skeleton, tensors = split_tensors(obj)
        flat, spec = pack(tensors)
        box = [(skeleton, spec, flat.numel())]
    else:
        box = [None]
    dist.broadcast_object_list(box, src=src, group=group)
    skeleton, spec, nbytes = box[0]
    if me and not nbytes:
        return obj
    if nbytes:
        dev = default_device() if dist.get_backend(group) == "nccl" else torch.device("cpu")
        buf = flat.to(dev) if me else torch.empty(nbytes, dtype=torch.uint8, device=dev)
        dist.broadcast(buf, src=src, group=group)
        if me:
            return obj
        tensors = unpack(buf.cpu(), spec)
    else:
        tensors = []
    return join_tensors(skeleton, tensors)
