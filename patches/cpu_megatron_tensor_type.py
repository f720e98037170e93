"""``Tensor.type()`` reports ``torch.cuda.<X>Tensor`` to megatron callers on CPU.

Replaces: ``torch.Tensor.type`` with a wrapper that, only when called with no arguments AND from a
module whose ``__name__`` starts with ``megatron``, returns the CUDA type string of a CPU tensor.
Why: megatron's optimizer dispatches on CUDA type strings (``distrib_optimizer`` param grouping, a
bare ``assert grad.type() == 'torch.cuda.FloatTensor'`` in ``clip_grads``); CPU tensors would be
rejected.
Otherwise unchanged: torch and user code (any other caller) see the true type; calls with arguments
(casts) are untouched. Only applied without CUDA.
Versions: megatron-core 0.16.0 .. <0.17.0.
"""
from __future__ import annotations

import sys

import torch

from megatron_rl.patches import Patch
from megatron_rl.patches._cpu_common import MEGATRON_MAX, MEGATRON_MIN, no_cuda


def _apply() -> None:
    orig = torch.Tensor.type
    if hasattr(orig, "_mrl_orig"):
        return

    def tensor_type(self, *args, **kwargs):
        if args or kwargs:
            return orig(self, *args, **kwargs)
        t = orig(self)
        caller = sys._getframe(1).f_globals.get("__name__", "")
        if caller.startswith("megatron") and t.startswith("torch.") and not t.startswith("torch.cuda."):
            return "torch.cuda." + t[len("torch."):].removeprefix("meta.")   # meta: the dry run's device memory
        return t

    tensor_type._mrl_orig = orig
    torch.Tensor.type = tensor_type


PATCH = Patch(
    name="cpu_megatron_tensor_type", group="megatron", package="megatron-core",
    min_version=MEGATRON_MIN, max_version=MEGATRON_MAX, needed=no_cuda, apply=_apply,
    symbols=(("torch:Tensor.type", None),
             ("megatron.core.optimizer.clip_grads:clip_grad_by_total_norm_fp32", None)),
)
