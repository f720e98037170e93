"""Sequence parallel with megatron's torch-norm wrapper (no apex / TE), params tagged for SP.

Replaces: ``megatron.core.transformer.torch_norm.WrappedTorchNorm.__new__``.
Why: without apex/TE the local spec builds norms through ``WrappedTorchNorm``, which asserts
``not config.sequence_parallel``. RMSNorm/LayerNorm act per token, so they are exact under SP; the
wrapper clears the flag while the original constructs the norm, restores it, and sets
``param.sequence_parallel = True`` on the norm's parameters — what apex's fused norm does — so that
``finalize_model_grads`` all-reduces their gradients over TP. Without the tag the norm gradients stay
partial: a SILENT ~6e-3 gradient error measured on CPU.
Otherwise unchanged: the same norm class and arguments are used. Applied only without CUDA (GPU
runs use the TE spec).
Versions: megatron-core 0.16.0 .. <0.17.0.
"""
from __future__ import annotations

from megatron_rl.patches import Patch
from megatron_rl.patches._cpu_common import MEGATRON_MAX, MEGATRON_MIN, no_cuda


def _apply() -> None:
    from megatron.core.transformer import torch_norm

    orig = torch_norm.WrappedTorchNorm.__new__
    if hasattr(orig, "_mrl_orig"):
        return

    def new(cls, config, *args, **kwargs):
        sp = config.sequence_parallel
        config.sequence_parallel = False
        try:
            module = orig(cls, config, *args, **kwargs)
        finally:
            config.sequence_parallel = sp
        for p in module.parameters():
            p.sequence_parallel = sp
        return module

    new._mrl_orig = orig
    torch_norm.WrappedTorchNorm.__new__ = staticmethod(new)


PATCH = Patch(
    name="cpu_megatron_norm_sp", group="megatron", package="megatron-core",
    min_version=MEGATRON_MIN, max_version=MEGATRON_MAX, needed=no_cuda, apply=_apply,
    symbols=(("megatron.core.transformer.torch_norm:WrappedTorchNorm.__new__",
              ("cls", "config", "hidden_size", "eps", "persist_layer_norm", "zero_centered_gamma",
               "normalization")),),
)
