"""The dry run's device (``megatron-rl train --dry-run``, ``trainer/dryrun/``): device memory as meta tensors that
the code sees as ``cuda:0``, counted byte for byte, on a machine without a GPU and without the memory.

* **Devices.** Device memory is meta storage (shapes and dtypes, no bytes behind them), plus small real host
  tensors tagged as device memory. ``t.device`` / ``t.is_cuda`` answer as on a GPU for both (``t.type()`` to
  Megatron: ``patches/cpu_megatron_tensor_type.py``);
  ``runtime/device.default_device()`` answers ``cuda:0`` and the CPU patches keep CUDA devices
  (``patches/cpu_cuda_device.py``, ``cpu_cuda_factories.py``), as under the simulated GPU.
* **Values.** An op whose inputs are all real runs for real: host data (token ids, segment ids, ``cu_seqlens``,
  RNG states) and what is computed from it keep their values, so the packing, the THD layout and the RNG
  tracker's ``fork`` (its states are real CPU generator states, ``patches/cpu_cuda_rng.py``) work unchanged. An
  op with a meta input runs on meta (real operands moved to meta first, except index tensors); a write of meta
  values into a real tensor leaves it as it was. A host read of a meta value (``.item()``, ``.tolist()``,
  ``bool()``) answers 0 / False (:data:`PLACEHOLDER`); an op whose output size depends on meta values raises
  :class:`DataDependent` naming the op.
* **Allocation.** A factory on the device is meta above :data:`SMALL_BYTES` (and ``empty*``: no values to keep),
  else real and tagged (inside :meth:`FakeDevice.build`, a model built on the host, every host factory is meta);
  a host -> device copy stays real up to :data:`H2D_REAL_BYTES` (host data), else meta, and a parameter's is
  always meta (Megatron's DDP re-points parameters into its meta buffers); a device -> host copy of meta is a
  real tensor of zeros.
* **Collectives.** The fake process group (``torch.testing._internal.distributed.fake_pg``) for cpu and meta
  tensors (and cuda: what the view reports; :func:`init_fake_world`), with Meta kernels for the coalesced c10d ops that have none; object
  collectives leave each rank its own object (all-gather: this rank's in every slot).
* **Accounting.** Every device storage is counted when an op makes it and dropped when it is freed:
  :attr:`FakeDevice.bytes` now, :attr:`FakeDevice.peak` since :meth:`FakeDevice.reset_peak`, and
  :meth:`FakeDevice.storage_bytes` of given tensors (each storage once).

Why not ``FakeTensorMode``: on torch's CPU build a fake CUDA tensor reaches C++ code that asks for the CUDA
device guard (``Tensor.copy_``, indexing) and autograd's input buffer asks for the current accelerator's
stream, which a CPU build has not got (the backward aborts); and ``nn.Module._apply`` swaps FakeTensor
parameters with ``swap_tensors``, which drops the attributes Megatron sets on them (``tensor_model_parallel``,
``sequence_parallel``, ``shared``). Meta tensors are plain tensors to both.
"""
from __future__ import annotations

import contextlib
import threading
import weakref

import torch
import torch.distributed as dist
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten, tree_map

VIRTUAL = torch.device("cuda", 0)
HOST = torch.device("cpu")
META = torch.device("meta")
SMALL_BYTES = 1 << 20          #: device factories up to this size are real (flags, counters, RoPE tables)
H2D_REAL_BYTES = 256 << 20     #: host -> device copies up to this size keep their values (the batch's ids)
PLACEHOLDER = 0                #: what a host read of a meta value answers (False for bool)

_aten = torch.ops.aten
#: ops whose output size depends on the values: meta cannot answer them
DATA_DEPENDENT = {_aten.nonzero.default, _aten.masked_select.default, _aten._unique2.default,
                  _aten.unique_dim.default, _aten.unique_consecutive.default, _aten.nonzero_static.default}
#: ops that take host index tensors beside device ones (CUDA does too): their real indices stay real
INDEXING = {_aten.index.Tensor, _aten.index_put_.default, _aten.index_put.default, _aten._index_put_impl_.default}
#: tensor methods that read values on the host
_READS = ("item", "tolist", "numpy", "__bool__", "__float__", "__int__", "__index__")
#: factories that build model weights on the host (Megatron's CPU initialisation): on the device while building
_BUILD_FACTORIES = ("empty", "zeros", "ones", "full", "rand", "randn", "empty_strided")
#: coalesced collectives without a Meta kernel in torch: given one that calls the fake group with empty tensors
_COALESCED = ("reduce_scatter_tensor_coalesced_", "allgather_into_tensor_coalesced_", "allreduce_coalesced_",
              "allgather_coalesced_")

_ACTIVE: FakeDevice | None = None


def active() -> FakeDevice | None:
    """The fake device in force in this process, or None."""
    return _ACTIVE


class DataDependent(RuntimeError):
    """An op whose output size depends on device values the dry run does not have."""


def is_cuda_spec(dev) -> bool:
    """Whether a ``device=`` argument names the GPU (a CUDA string or device, an index, or meta)."""
    if isinstance(dev, bool):
        return False
    if isinstance(dev, int):
        return True
    if isinstance(dev, str):
        return dev.startswith(("cuda", "meta"))
    return isinstance(dev, torch.device) and dev.type in ("cuda", "meta")


class _Ledger:
    """Device storages alive: storage key -> bytes; the real ones tagged as device memory."""

    def __init__(self):
        self.live: dict[int, int] = {}
        self.tagged: set[int] = set()
        self.bytes = self.peak = 0
        self._lock = threading.Lock()

    def add(self, t: torch.Tensor, tag: bool = False) -> None:
        if _key(t) is None or _key(t) in self.live:      # no storage (sparse, nested), or counted already
            return
        st = t.untyped_storage()
        key = st._cdata
        n = st.nbytes()
        with self._lock:
            self.live[key] = n
            self.bytes += n
            self.peak = max(self.peak, self.bytes)
            if tag:
                self.tagged.add(key)
        weakref.finalize(st, self._drop, key)

    def _drop(self, key: int) -> None:
        with self._lock:
            self.bytes -= self.live.pop(key, 0)
            self.tagged.discard(key)

    def is_device(self, t: torch.Tensor) -> bool:
        return t.is_meta or _key(t) in self.tagged


def _key(t: torch.Tensor) -> int | None:
    """The identity of ``t``'s storage (None without one: sparse, nested)."""
    try:
        return t.untyped_storage()._cdata
    except (RuntimeError, NotImplementedError):
        return None


def _is_method(func, name: str) -> bool:
    """Whether ``func`` is the tensor method ``name`` (torch's own, also under a patch's wrapper)."""
    return func is getattr(torch.Tensor, name, None) or func is getattr(torch._C.TensorBase, name, None)


def _placeholder(t: torch.Tensor):
    """A host read of meta tensor ``t``: zeros of its shape, as the method would return them."""
    return torch.zeros(t.shape, dtype=t.dtype)


class _View(TorchFunctionMode):
    """Python-level view: device tensors report ``cuda:0``; factories, moves and host reads on the device."""

    def __init__(self, dev: FakeDevice):
        super().__init__()
        self.dev = dev

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        led, owner = self.dev.ledger, getattr(func, "__self__", None)
        if owner is torch.Tensor.device:
            return VIRTUAL if led.is_device(args[0]) else func(*args, **kwargs)
        if owner is torch.Tensor.is_cuda:
            return led.is_device(args[0])
        if owner is torch.Tensor.is_meta:
            return False
        name = getattr(func, "__name__", "")
        if func is torch.autograd.backward or (name == "backward" and _is_method(func, name)):
            return self._backward(*args, **kwargs)
        if args and isinstance(args[0], torch.Tensor) and _is_method(func, name):
            if name in ("to", "cuda", "cpu"):
                return self.dev.move(name, args, kwargs)
            if name == "pin_memory":
                return args[0]
            if name in _READS and args[0].is_meta:
                return getattr(_placeholder(args[0]), name)(*args[1:], **kwargs)
        kwargs.pop("pin_memory", None)
        if self.dev.building and name in _BUILD_FACTORIES and kwargs.get("device") in (None, "cpu", HOST):
            return func(*args, **{**kwargs, "device": META})
        if name in ("tensor", "as_tensor") and args:   # values of meta tensors in the data: read as on the host
            args = (tree_map(lambda t: _placeholder(t) if isinstance(t, torch.Tensor) and t.is_meta else t, args[0]),
                    *args[1:])
        if "device" in kwargs and is_cuda_spec(kwargs["device"]):
            return self.dev.factory(func, name, args, kwargs)
        return func(*args, **kwargs)

    def _backward(self, tensors, grad_tensors=None, retain_graph=None, create_graph=False, inputs=None,
                  gradient=None):
        """``torch.autograd.backward`` with this view in force: torch runs a function a mode intercepts with the
        mode off, and the backward's Python code (Megatron's autograd functions) allocates on the device too."""
        from torch.autograd import _make_grads, _tensor_or_tensors_to_tuple  # lazy: torch internals, backward only
        from torch.autograd.graph import _engine_run_backward  # lazy: as above

        tensors = (tensors,) if isinstance(tensors, torch.Tensor) else tuple(tensors)
        grads = _tensor_or_tensors_to_tuple(grad_tensors if gradient is None else gradient, len(tensors))
        inputs = (inputs,) if isinstance(inputs, torch.Tensor) else tuple(inputs or ())
        with self:
            grads = _make_grads(tensors, grads, is_grads_batched=False)
            _engine_run_backward(tensors, grads, create_graph if retain_graph is None else retain_graph, create_graph,
                                 inputs, allow_unreachable=True, accumulate_grad=True)


class _Ops(TorchDispatchMode):
    """aten-level (forward, backward, optimizer): meta or real, outputs counted."""

    def __init__(self, dev: FakeDevice):
        super().__init__()
        self.dev = dev

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        with torch._C.DisableTorchFunction():     # aten below the view: no second pass through it
            return self._dispatch(func, args, kwargs or {})

    def _dispatch(self, func, args, kwargs):
        led = self.dev.ledger
        tensors = [t for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)]
        if any(t.is_meta for t in tensors) or kwargs.get("device") == META:
            return self._on_meta(func, args, kwargs, tensors)
        out = func(*args, **kwargs)
        if any(led.is_device(t) for t in tensors):
            host = {_key(t) for t in tensors if not led.is_device(t)}
            for t in tree_flatten(out)[0]:
                if isinstance(t, torch.Tensor) and _key(t) not in host:
                    led.add(t, tag=True)
        return out

    def _on_meta(self, func, args, kwargs, tensors):
        if func is _aten._local_scalar_dense.default:
            return False if args[0].dtype == torch.bool else PLACEHOLDER
        if func in DATA_DEPENDENT:
            raise DataDependent(f"dry run: {func} needs device values the dry run does not have (meta tensors)")
        written = _written_real(func, args, kwargs)
        if written is not None:                 # meta values into a real tensor: it keeps its own
            return written
        indices = _real_indices(args[1]) if func in INDEXING else None

        def to_meta(t):
            if not isinstance(t, torch.Tensor) or t.is_meta or t.dim() == 0:
                return t
            return t.to(META)
        args, kwargs = tree_map(to_meta, (args, kwargs))
        if indices is not None:                 # host indices stay host indices (CUDA takes them too)
            args = (args[0], indices, *args[2:])
        out = func(*args, **kwargs)
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor) and t.is_meta:
                self.dev.ledger.add(t)
        return out


def _written_real(func, args, kwargs):
    """The real tensor(s) ``func`` writes into (in place, ``out=``), as the op would return them; None if none."""
    schema = func._schema
    hits = []
    for i, a in enumerate(schema.arguments):
        v = args[i] if i < len(args) else kwargs.get(a.name)
        if a.alias_info is not None and a.alias_info.is_write and isinstance(v, torch.Tensor) and not v.is_meta:
            hits.append(v)
    if not hits:
        return None
    return hits[0] if len(schema.returns) <= 1 else tuple(hits)


def _real_indices(indices):
    """The index list of an indexing op with its real index tensors kept (a real bool mask as the long indices
    of its set elements: meta has no ``nonzero``); meta ones stay meta."""
    out = []
    for ix in indices:
        if isinstance(ix, torch.Tensor) and not ix.is_meta and ix.dtype == torch.bool:
            out.extend(ix.nonzero().unbind(1))
        else:
            out.append(ix)
    return out


class FakeDevice:
    """The fake device (module docstring): :meth:`start` enters it for this thread, :meth:`stop` leaves it."""

    def __init__(self):
        self.ledger = _Ledger()
        self.building = False
        self._modes = (_View(self), _Ops(self))

    @contextlib.contextmanager
    def build(self):
        """While active, host factories make meta tensors: a model built on the host to be moved to the GPU
        (Megatron's ``use_cpu_initialization``, the CPU build's choice, makes each full master weight on the host
        and keeps its shard) is built as it ends up, without the host memory."""
        self.building = True
        try:
            yield self
        finally:
            self.building = False

    # ----- accounting -----------------------------------------------------------------------
    @property
    def bytes(self) -> int:
        """Device bytes held now."""
        return self.ledger.bytes

    @property
    def peak(self) -> int:
        """The most device bytes held since :meth:`reset_peak`."""
        return self.ledger.peak

    def reset_peak(self) -> int:
        """Start a new peak window at the bytes held now; returns them."""
        self.ledger.peak = self.ledger.bytes
        return self.ledger.bytes

    def storage_bytes(self, tensors) -> int:
        """Bytes of the device storages under ``tensors`` (each storage counted once; host ones not at all)."""
        seen: dict[int, int] = {}
        with torch._C.DisableTorchFunction():      # the view answers is_meta False to the code
            for t in tensors:
                if isinstance(t, torch.Tensor) and self.ledger.is_device(t):
                    st = t.untyped_storage()
                    seen[st._cdata] = st.nbytes()
        return sum(seen.values())

    # ----- allocation -----------------------------------------------------------------------
    def factory(self, func, name: str, args, kwargs):
        """A factory called with a device: meta above :data:`SMALL_BYTES`, when it requires grad or when it is
        ``empty*``, else real and tagged (with data: ``torch.tensor`` / ``as_tensor``, always real)."""
        if name not in ("tensor", "as_tensor"):
            out = func(*args, **{**kwargs, "device": META})
            if (not isinstance(out, torch.Tensor) or out.nbytes > SMALL_BYTES or out.requires_grad
                    or name.startswith("empty")):  # an autograd leaf joins a meta graph; empty has no values to
                return out                       # keep, and Megatron re-points some (``out.data = meta``)
        out = func(*args, **{**kwargs, "device": HOST})
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor):
                self.ledger.add(t, tag=True)
        return out

    def move(self, name: str, args, kwargs):
        """``t.to(...)`` / ``t.cuda()`` / ``t.cpu()`` between the host and the device (module docstring)."""
        src, target, conv = args[0], *_target(name, args, kwargs)
        if isinstance(src, torch.nn.Parameter) and target is not None and target.type != "cpu" and not conv.is_meta:
            return conv.to(META)                 # a parameter joins Megatron's meta buffers: meta, whatever its size
        on_dev = self.ledger.is_device(src)
        if target is None or (target.type != "cpu") == on_dev:
            return conv
        if target.type != "cpu":                 # host -> device (a parameter: meta, as the buffers it joins)
            if conv.nbytes > H2D_REAL_BYTES:
                return conv.to(META)
            out = conv.clone() if _key(conv) == _key(src) else conv
            self.ledger.add(out, tag=True)
            return out
        if conv.is_meta:                         # device -> host: zeros, as the device holds no values here
            return torch.zeros(conv.shape, dtype=conv.dtype)
        return conv.clone() if _key(conv) == _key(src) else conv

    # ----- entry ----------------------------------------------------------------------------
    def start(self) -> FakeDevice:
        global _ACTIVE
        if _ACTIVE is not None:
            raise RuntimeError("a fake device is already active in this process")
        for m in self._modes:
            m.__enter__()
        _ACTIVE = self
        return self

    def stop(self) -> None:
        global _ACTIVE
        for m in reversed(self._modes):
            m.__exit__(None, None, None)
        _ACTIVE = None

    def __enter__(self) -> FakeDevice:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def _target(name: str, args, kwargs):
    """(target device or None, the tensor converted to the requested dtype / format) of a move call."""
    src = args[0]
    if name == "cuda":
        return VIRTUAL, src
    if name == "cpu":
        return HOST, src
    rest = [torch.device("cuda", a) if isinstance(a, int) and not isinstance(a, bool) else a for a in args[1:]]
    kw = {k: v for k, v in kwargs.items() if k != "copy"}
    if isinstance(kw.get("device"), int) and not isinstance(kw["device"], bool):
        kw["device"] = torch.device("cuda", kw["device"])
    other = rest[0] if rest and isinstance(rest[0], torch.Tensor) else None
    if other is not None:                        # t.to(other): other's device and dtype
        dev = VIRTUAL if (active() is not None and active().ledger.is_device(other)) else HOST
        return dev, src.to(other.dtype)
    dev, dtype, non_blocking, fmt = torch._C._nn._parse_to(*rest, **kw)
    keep = {"dtype": dtype, "memory_format": fmt}
    conv = src.to(**{k: v for k, v in keep.items() if v is not None}) if dtype is not None or fmt is not None else src
    return (VIRTUAL if dev is not None and dev.type in ("cuda", "meta") else dev), conv


def init_fake_world(rank: int, world_size: int) -> None:
    """``torch.distributed`` as rank ``rank`` of ``world_size`` on torch's fake process group (collectives return
    at once, nothing is sent) for host and meta tensors, with Meta kernels for the coalesced collectives."""
    from torch.testing._internal.distributed.fake_pg import FakeStore  # lazy: torch's test utilities

    if not dist.is_initialized():
        dist.init_process_group("cpu:fake,cuda:fake,meta:fake", store=FakeStore(), rank=rank, world_size=world_size)
    _register_coalesced_meta()
    dist.all_gather_object, dist.broadcast_object_list = _all_gather_object, _broadcast_object_list


def _all_gather_object(object_list, obj, group=None):
    """The fake group carries no objects: every rank is taken to hold what this one holds (ranks of a role are
    alike)."""
    for i in range(len(object_list)):
        object_list[i] = obj


def _broadcast_object_list(object_list, src=None, group=None, device=None, group_src=None):
    """The fake group carries no objects: the list stays as this rank has it (right on the source)."""
    return None


@contextlib.contextmanager
def gloo_as_fake():
    """While active, ``dist.new_group(backend="gloo")`` makes a fake group too (Megatron's gloo groups, which its
    optimizer asks for, would wait for peers that do not exist)."""
    real = dist.new_group

    def new_group(*args, backend=None, **kwargs):
        return real(*args, backend=None if str(backend).lower() == "gloo" else backend, **kwargs)
    dist.new_group = new_group
    try:
        yield
    finally:
        dist.new_group = real


_LIB: list = []


def _register_coalesced_meta() -> None:
    if _LIB:
        return
    lib = torch.library.Library("c10d", "IMPL")
    for name in _COALESCED:
        op = getattr(torch.ops.c10d, name).default

        def impl(*args, _op=op):
            empty = [[torch.empty(0) for _ in a] if isinstance(a, (list, tuple)) else a for a in args]
            return _op(*empty)
        lib.impl(name, impl, "Meta")
    _LIB.append(lib)
