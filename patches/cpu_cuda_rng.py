"""CUDA RNG calls used by megatron's RNG tracker -> the CPU default generator.

Replaces: ``torch.cuda.get_rng_state``, ``torch.cuda.random.get_rng_state``, ``torch.cuda.manual_seed``,
and megatron's ``tensor_parallel.random._get_cuda_rng_state`` / ``_set_cuda_rng_state``.
Why: ``model_parallel_cuda_manual_seed`` and ``CudaRNGStatesTracker.fork()`` (used for TP weight init
and dropout) read, seed and restore the CUDA generator. On CPU we route them to the CPU default
generator. ``manual_seed`` seeds ``torch.default_generator`` directly (NOT a no-op, which would leave
init non-reproducible, and NOT ``torch.manual_seed``, which calls ``torch.cuda.manual_seed_all`` and
recursed in a probe).
Caveat: on CPU the tracker's "cuda" states and the global CPU state are the same generator, so a
``tracker.fork()`` swaps the global CPU RNG state for its duration (restored on exit).
Otherwise unchanged: only applied without CUDA. Versions: megatron-core 0.16.0 .. <0.17.0.
"""
from __future__ import annotations

import torch

from megatron_rl.patches import Patch
from megatron_rl.patches._cpu_common import MEGATRON_MAX, MEGATRON_MIN, no_cuda


def _get_state(*_args, **_kwargs) -> torch.Tensor:
    return torch.get_rng_state()


def _set_state(new_state, *_args, **_kwargs) -> None:
    torch.set_rng_state(new_state)


def _manual_seed(seed) -> None:
    torch.default_generator.manual_seed(int(seed))


def _apply() -> None:
    from megatron.core.tensor_parallel import random as tp_random

    torch.cuda.get_rng_state = _get_state
    torch.cuda.random.get_rng_state = _get_state
    torch.cuda.manual_seed = _manual_seed
    tp_random._get_cuda_rng_state = _get_state
    tp_random._set_cuda_rng_state = _set_state


PATCH = Patch(
    name="cpu_cuda_rng", group="megatron", package="megatron-core",
    min_version=MEGATRON_MIN, max_version=MEGATRON_MAX, needed=no_cuda, apply=_apply,
    symbols=(
        ("torch.cuda:get_rng_state", ("device",)),
        ("torch.cuda.random:get_rng_state", ("device",)),
        ("torch.cuda:manual_seed", ("seed",)),
        ("megatron.core.tensor_parallel.random:_get_cuda_rng_state", ("device", "clone", "graph_safe")),
        ("megatron.core.tensor_parallel.random:_set_cuda_rng_state", ("new_state", "device", "graph_safe")),
    ),
)
