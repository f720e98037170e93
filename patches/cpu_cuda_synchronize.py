"""``torch.cuda.synchronize`` -> no-op on a machine without CUDA.

Replaces: ``torch.cuda.synchronize``.
Why: megatron calls it unconditionally in ``dist_checkpointing`` (``filesystem_async.preload_tensors``,
every save) and in pipeline p2p shape exchange with variable sequence lengths. On CPU every op is
already synchronous, so there is nothing to wait for.
Otherwise unchanged: CPU-only. Versions: megatron-core 0.16.0 .. <0.17.0.
"""
from __future__ import annotations

import torch

from megatron_rl.patches import Patch
from megatron_rl.patches._cpu_common import MEGATRON_MAX, MEGATRON_MIN, no_cuda


def _apply() -> None:
    torch.cuda.synchronize = lambda *args, **kwargs: None


PATCH = Patch(
    name="cpu_cuda_synchronize", group="megatron", package="megatron-core",
    min_version=MEGATRON_MIN, max_version=MEGATRON_MAX, needed=no_cuda, apply=_apply,
    symbols=(("torch.cuda:synchronize", ("device",)),),
)
