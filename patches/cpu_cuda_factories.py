"""Tensor factories called with ``device="cuda"`` (or a CUDA index) -> allocate on the CPU.

Replaces: ``torch.zeros``, ``torch.tensor``, ``torch.ones``, ``torch.empty``, ``torch.full``,
``torch.arange`` and the ``*_like`` variants, with wrappers that rewrite a CUDA ``device=`` keyword
(``"cuda"``, ``"cuda:N"``, a CUDA ``torch.device`` or an int) to ``"cpu"``.
Why: megatron hard-codes ``device="cuda"`` in the pipeline schedules (token counters), the optimizer
(``found_inf`` etc.), grad clipping and the multi-tensor l2 norm fallback.
Otherwise unchanged: every other argument is passed through, and ``with torch.device(...)`` still reaches
the factories (:func:`_keep_device_context`); only applied without CUDA, where a CUDA device argument could
only raise.
Versions: megatron-core 0.16.0 .. <0.17.0.
"""
from __future__ import annotations

import functools

import torch

from megatron_rl.patches import Patch
from megatron_rl.patches._cpu_common import MEGATRON_MAX, MEGATRON_MIN, no_cuda

FACTORIES = ("zeros", "ones", "empty", "full", "tensor", "arange",
             "zeros_like", "ones_like", "empty_like", "full_like")


def to_cpu_device(dev):
    """Map a CUDA device spec to ``"cpu"``; leave anything else as is."""
    if isinstance(dev, bool):
        return dev
    if isinstance(dev, int):
        return "cpu"
    if isinstance(dev, str) and dev.startswith("cuda"):
        return "cpu"
    if isinstance(dev, torch.device) and dev.type == "cuda":
        return "cpu"
    return dev


def _simulating() -> bool:
    from megatron_rl.runtime import fake_device, simulated_gpu   # patches load before the package's runtime is needed

    return simulated_gpu.active() is not None or fake_device.active() is not None   # (the dry run's device)


def _wrap(fn):
    @functools.wraps(fn)
    def factory(*args, **kwargs):
        if "device" in kwargs and not _simulating():   # the simulated GPU tags device allocations itself
            kwargs["device"] = to_cpu_device(kwargs["device"])
        return fn(*args, **kwargs)

    factory._mrl_orig = fn
    return factory


def _apply() -> None:
    originals = []
    for name in FACTORIES:
        fn = getattr(torch, name)
        if not hasattr(fn, "_mrl_orig"):
            setattr(torch, name, _wrap(fn))
        originals.append(getattr(fn, "_mrl_orig", fn))
    _keep_device_context(originals)


def _keep_device_context(originals) -> None:
    """``with torch.device(d):`` (torch's ``DeviceContext`` mode) gives ``device=d`` to calls of the functions in
    ``torch.utils._device._device_constructors()``, a set cached from the ``torch`` namespace at its first use.
    Taken after this patch it holds the wrappers, and the original factories they call would escape the
    context: transformers' meta-device init then made real, never-filled CPU buffers (an HF model loaded in
    a patched process had garbage RoPE frequencies). The originals are added to that set."""
    from torch.utils import _device

    ctors = getattr(_device, "_device_constructors", None)
    if ctors is not None:
        ctors().update(originals)


PATCH = Patch(
    name="cpu_cuda_factories", group="megatron", package="megatron-core",
    min_version=MEGATRON_MIN, max_version=MEGATRON_MAX, needed=no_cuda, apply=_apply,
    symbols=tuple((f"torch:{n}", None) for n in FACTORIES),
)
