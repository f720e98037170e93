"""Trainer offload for colocated rollouts: what the policy keeps on the GPU while the engines generate.

``trainer.offload`` (:data:`OFFLOAD_MODES`):

``none``       everything stays on the device (weights, grads, optimizer state).
``optimizer``  the optimizer's state (Adam ``exp_avg`` / ``exp_avg_sq``, step counters), the fp32
               main-param copies and the DDP gradient buffers go to host memory; the weights stay.
``all``        ``optimizer`` plus the model parameters (the DDP parameter buffers).

Every ``offload`` (``none`` too) also drops megatron's persistent score buffer (:func:`drop_score_buffer`:
local attention's b·heads·s·s scratch, which would otherwise stay on the GPU while the engines generate) and
hands the allocator's cached blocks back to the driver.

Mechanism (:class:`HostStash`): every tensor's *storage* is copied to a host buffer (pinned when
CUDA is present, reused across cycles) and the device storage is resized to 0 bytes; ``restore``
resizes it back and copies the bytes in. Tensors keep their identity, shape and every view — the
optimizer's param groups, ``param.main_grad`` (a view of the DDP grad buffer), the fp32 main shards
of the distributed optimizer that *are* views of the parameter buffer when params are fp32 — so
nothing has to be re-pointed and the round trip is bit for bit. Storages are grouped, so a buffer
seen through many views is copied once. On CPU the "device" is host memory: the copy still goes
into separate buffers and the original storage is still released, so the same path runs in tests.

Why not Megatron-core's own hooks (0.16.1): ``MegatronOptimizer.offload_to_cpu`` /
``restore_from_cpu`` rebind ``p.data = p.data.cpu()`` — that breaks the view between fp32 main
shards and the DDP parameter buffer (the optimizer would then update a detached copy), does not pin,
and skips non-CUDA tensors (so it cannot be tested on CPU); ``DistributedDataParallel.
offload_grad_buffers`` discards the gradients (zeroed on restore) and calls ``torch.cuda``
unconditionally; ``_ParamAndGradBuffer.offload_to_cpu(move_params=True)`` on a CPU tensor keeps
``.cpu()``'s alias of the storage it then frees. Their mechanism (``storage().resize_(0)`` and
back) is the one used here, applied to whole storages.
"""
from __future__ import annotations

from collections.abc import Iterable

import torch

from megatron_rl.runtime.device import has_cuda, release_cached_memory, synchronize

OFFLOAD_MODES = ("none", "optimizer", "all")


def check_offload_mode(mode: str, where: str = "trainer.offload") -> str:
    """``mode`` if it is one of :data:`OFFLOAD_MODES`, else a one-line ``ValueError``."""
    if mode not in OFFLOAD_MODES:
        raise ValueError(f"{where} must be one of {'|'.join(OFFLOAD_MODES)}, got {mode!r}")
    return mode


class HostStash:
    """Device storages parked in host buffers (module docstring). ``offload`` then ``restore``."""

    def __init__(self) -> None:
        self._parked: list[tuple[torch.UntypedStorage, torch.Tensor]] = []   # (device storage, host bytes)
        self._host: dict[int, torch.Tensor] = {}                            # reused host buffers, by slot

    @property
    def offloaded(self) -> bool:
        return bool(self._parked)

    @property
    def nbytes(self) -> int:
        """Bytes currently parked on the host."""
        return sum(h.numel() for _, h in self._parked)

    def offload(self, tensors: Iterable[torch.Tensor], keep: Iterable[torch.Tensor] = ()) -> int:
        """Park the storages of ``tensors`` except those shared with ``keep``; returns the bytes moved.
        May be called again before :meth:`restore` (a later stage: storages already parked have 0
        bytes and are skipped; the new ones take the next host slots, so buffers stay reused when
        every cycle parks in the same order)."""
        kept = {t.untyped_storage().data_ptr() for t in keep}
        seen: dict[int, torch.UntypedStorage] = {}
        for t in tensors:
            s = t.untyped_storage()
            if s.nbytes() and s.data_ptr() not in kept:
                seen.setdefault(s.data_ptr(), s)
        pin = has_cuda()
        first, before = len(self._parked), self.nbytes
        for slot, s in enumerate(seen.values(), start=first):
            host = self._host.get(slot)
            if host is None or host.numel() != s.nbytes():
                host = self._host[slot] = torch.empty(s.nbytes(), dtype=torch.uint8, pin_memory=pin)
            host.untyped_storage().copy_(s, non_blocking=pin)
            self._parked.append((s, host))
        synchronize()                       # copies done before the device bytes are freed
        for s, _ in self._parked[first:]:
            s.resize_(0)
        release_cached_memory()
        return self.nbytes - before

    def restore(self) -> int:
        """Re-allocate every parked storage and copy its bytes back; returns the bytes moved."""
        n = self.nbytes
        for s, host in self._parked:
            s.resize_(host.numel())
            s.copy_(host.untyped_storage(), non_blocking=has_cuda())
        synchronize()
        self._parked = []
        return n


def drop_score_buffer() -> int:
    """Release megatron's persistent global memory buffer (``parallel_state.get_global_memory_buffer``: local
    attention's ``baddbmm`` input, b·heads·s·s elements of the largest pass so far, kept across steps, and the
    sequence-parallel gather scratch); it is allocated again by the next pass that needs it. Returns its bytes
    (0 when megatron has none). Views handed out earlier keep their storage alive until they are dropped."""
    from megatron.core import parallel_state as ps  # lazy: defers megatron to the call

    holder = getattr(ps, "_GLOBAL_MEMORY_BUFFER", None)
    if holder is None or not getattr(holder, "buffer", None):
        return 0
    n = sum(t.numel() * t.element_size() for t in holder.buffer.values() if isinstance(t, torch.Tensor))
    holder.buffer.clear()
    return n


def optimizer_tensors(optimizer) -> list[torch.Tensor]:
    """Main params (the inner optimizer's param groups) and every tensor of its state, over the
    chained optimizers Megatron may return."""
    out: list[torch.Tensor] = []
    for opt in getattr(optimizer, "chained_optimizers", [optimizer]):
        inner = getattr(opt, "optimizer", None)
        if inner is None:
            continue
        out += [p for g in inner.param_groups for p in g["params"] if isinstance(p, torch.Tensor)]
        out += [v for st in inner.state.values() for v in st.values() if isinstance(v, torch.Tensor)]
    return out


def grad_buffer_tensors(chunks) -> list[torch.Tensor]:
    """The DDP gradient buffers (``param.main_grad`` are views of them)."""
    return [b.grad_data for c in chunks for b in [*c.buffers, *getattr(c, "expert_parallel_buffers", [])]
            if b.grad_data is not None]


def param_tensors(chunks) -> list[torch.Tensor]:
    """The model parameters (views of the DDP parameter buffers where those exist)."""
    return [p for c in chunks for p in c.parameters()]


def trainer_tensors(mode: str, optimizer, chunks) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """(tensors to park, tensors to keep) for ``mode``: with ``optimizer`` the weights are kept,
    which also keeps fp32 main shards that are views of them."""
    check_offload_mode(mode)
    if mode == "none":
        return [], []
    moved = optimizer_tensors(optimizer) + grad_buffer_tensors(chunks)
    if mode == "all":
        return moved + param_tensors(chunks), []
    return moved, param_tensors(chunks)
