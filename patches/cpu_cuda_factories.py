"""Tensor factories called with ``device="cuda"`` (or a CUDA index) -> allocate on the CPU.

Replaces: ``torch.zeros``, ``torch.tensor``, ``torch.ones``, ``torch.empty``, ``torch.full``,
``torch.arange`` and the ``*_like`` variants, with wrappers that rewrite a CUDA ``device=`` keyword
(``"cuda"``, ``"cuda:N"``, a CUDA ``torch.device`` or an int) to ``"cpu"``.
Why: megatron hard-codes ``device="cuda"`` in the pipeline schedules (token counters), the optimizer
(``found_inf`` etc.), grad clipping and the multi-tensor l2 norm fallback.
Otherwise unchanged: every other argument is passed through; only applied without CUDA, where a
CUDA device argument could only raise.
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


def _wrap(fn):
    @functools.wraps(fn)
    def factory(*args, **kwargs):
        if "device" in kwargs:
            kwargs["device"] = to_cpu_device(kwargs["device"])
        return fn(*args, **kwargs)

    factory._mrl_orig = fn
    return factory


def _apply() -> None:
    for name in FACTORIES:
        fn = getattr(torch, name)
        if not hasattr(fn, "_mrl_orig"):
            setattr(torch, name, _wrap(fn))


PATCH = Patch(
    name="cpu_cuda_factories", group="megatron", package="megatron-core",
    min_version=MEGATRON_MIN, max_version=MEGATRON_MAX, needed=no_cuda, apply=_apply,
    symbols=tuple((f"torch:{n}", None) for n in FACTORIES),
)
