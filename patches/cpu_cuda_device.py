"""``torch.cuda.current_device`` -> ``"cpu"`` on a machine without CUDA.

Replaces: ``torch.cuda.current_device``.
Why: megatron-core allocates with ``device=torch.cuda.current_device()`` in rotary embeddings, a few
layers and the optimizer; without CUDA that call raises ``Torch not compiled with CUDA enabled``.
Returning the string ``"cpu"`` makes those allocations land on the CPU; under the simulated GPU
(``megatron_rl/runtime/simulated_gpu.py``) it returns 0, the device index, so they land in simulated device memory.
Otherwise unchanged: only used when no CUDA device exists, so no code path could have used a GPU.
Versions: megatron-core 0.16.0 .. <0.17.0 (checked on 0.16.1, torch 2.13.0+cpu).
"""
from __future__ import annotations

import torch

from megatron_rl.patches import Patch
from megatron_rl.patches._cpu_common import MEGATRON_MAX, MEGATRON_MIN, no_cuda


def _current_device():
    from megatron_rl.runtime import fake_device, simulated_gpu   # patches load before the package's runtime is needed

    virtual = simulated_gpu.active() is not None or fake_device.active() is not None
    return 0 if virtual else "cpu"   # the simulated GPU / the dry run's fake device: device 0, tagged on use


def _apply() -> None:
    torch.cuda.current_device = _current_device


PATCH = Patch(
    name="cpu_cuda_device", group="megatron", package="megatron-core",
    min_version=MEGATRON_MIN, max_version=MEGATRON_MAX, needed=no_cuda, apply=_apply,
    symbols=(("torch.cuda:current_device", ()),),
)
