"""Helpers shared by the CPU patches (not a patch itself)."""
from __future__ import annotations

MEGATRON_MIN = "0.16.0"
MEGATRON_MAX = "0.17.0"  # exclusive: re-check the catalogue before widening


def no_cuda() -> bool:
    """CPU patches are needed exactly when no CUDA device is usable."""
    from megatron_rl.runtime.device import has_cuda

    return not has_cuda()
