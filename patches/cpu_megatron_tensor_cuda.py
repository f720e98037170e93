"""``Tensor.cuda()`` called from megatron code is the identity on a machine without CUDA.

Replaces: ``torch.Tensor.cuda`` with a wrapper that, only when CUDA is absent AND the caller's
module name starts with ``megatron``, returns the tensor itself.
Why: with tied embeddings and pipeline parallelism, ``LanguageModule.setup_embeddings_and_output_layer``
moves the shared embedding to the GPU (``weight.data = weight.data.cuda()``) before the first/last
stage all-reduce; on CPU that raises "Torch not compiled with CUDA enabled". The all-reduce itself
works on CPU tensors over gloo.
Otherwise unchanged: non-megatron callers get the original method (and its error); only applied
without CUDA, where no megatron ``.cuda()`` call could have succeeded.
Versions: megatron-core 0.16.0 .. <0.17.0.
"""
from __future__ import annotations

import sys

import torch

from megatron_rl.patches import Patch
from megatron_rl.patches._cpu_common import MEGATRON_MAX, MEGATRON_MIN, no_cuda


def _apply() -> None:
    orig = torch.Tensor.cuda
    if hasattr(orig, "_mrl_orig"):
        return

    def cuda(self, *args, **kwargs):
        if sys._getframe(1).f_globals.get("__name__", "").startswith("megatron"):
            return self
        return orig(self, *args, **kwargs)

    cuda._mrl_orig = orig
    torch.Tensor.cuda = cuda


PATCH = Patch(
    name="cpu_megatron_tensor_cuda", group="megatron", package="megatron-core",
    min_version=MEGATRON_MIN, max_version=MEGATRON_MAX, needed=no_cuda, apply=_apply,
    symbols=(("torch:Tensor.cuda", None),
             ("megatron.core.models.common.language_module.language_module:LanguageModule.setup_embeddings_and_output_layer",
              ("self",))),
)
