"""The one place that asks about CUDA (STYLE.md §14: no bare ``torch.cuda`` elsewhere)."""
from __future__ import annotations

import os

import torch

from megatron_rl.runtime import fake_device, simulated_gpu


def has_cuda() -> bool:
    """True when a usable CUDA device is present."""
    return torch.cuda.is_available() and torch.cuda.device_count() > 0


def default_device() -> torch.device:
    """``cuda:<local rank>`` on a GPU machine, ``cuda:0`` under the simulated GPU (``runtime/simulated_gpu.py``:
    host storage tagged as device memory), else ``cpu``."""
    if has_cuda():
        return torch.device("cuda", torch.cuda.current_device())
    if simulated_gpu.active() is not None or fake_device.active() is not None:   # (the dry run's: trainer/dryrun)
        return simulated_gpu.VIRTUAL
    return torch.device("cpu")


def dist_backend() -> str:
    """``nccl`` with CUDA, ``gloo`` on CPU."""
    return "nccl" if has_cuda() else "gloo"


def set_device(local_rank: int) -> None:
    """Bind this process to its GPU (no-op on CPU)."""
    if has_cuda():
        torch.cuda.set_device(local_rank)


def synchronize() -> None:
    """Wait for queued device work (no-op on CPU)."""
    if has_cuda():
        torch.cuda.synchronize()


def release_cached_memory() -> None:
    """Hand the caching allocator's free blocks back to the driver, so that another user of the
    GPU (a colocated rollout engine) can take them after an offload (no-op on CPU)."""
    if has_cuda():
        torch.cuda.empty_cache()


def max_memory_allocated() -> int:
    """Peak device bytes (0 on CPU; use RSS there)."""
    return torch.cuda.max_memory_allocated() if has_cuda() else 0


def total_memory() -> int:
    """Bytes of memory of this process's GPU (0 on CPU)."""
    return torch.cuda.get_device_properties(torch.cuda.current_device()).total_memory if has_cuda() else 0


def peak_memory(reset: bool = False) -> dict[str, int]:
    """This process's device peaks since the last reset: ``allocated`` (tensors) and ``reserved`` (the caching
    allocator's hold: what other processes cannot have); ``reset``: start a new window. Zeros on CPU."""
    if not has_cuda():
        return {"allocated": 0, "reserved": 0}
    out = {"allocated": torch.cuda.max_memory_allocated(), "reserved": torch.cuda.max_memory_reserved()}
    if reset:
        torch.cuda.reset_peak_memory_stats()
    return out


def memory_allocated() -> int:
    """Device bytes held by tensors now (0 on CPU)."""
    return torch.cuda.memory_allocated() if has_cuda() else 0


def cuda_rng_states() -> list | None:
    """Every visible GPU's default RNG state (None on CPU)."""
    return torch.cuda.get_rng_state_all() if has_cuda() else None


def set_cuda_rng_states(states: list) -> None:
    """Restore :func:`cuda_rng_states` (same device count)."""
    torch.cuda.set_rng_state_all(states)


def gpu_count() -> int:
    """Visible CUDA devices (0 on CPU)."""
    return torch.cuda.device_count() if has_cuda() else 0


def empty_cache() -> None:
    """Return the caching allocator's free blocks to the driver (no-op on CPU): after an engine's sleep."""
    if has_cuda():
        torch.cuda.empty_cache()


def pin_process(cores) -> None:
    """Pin every thread of this process (and threads it starts later) to ``cores`` and size torch's
    intra-op pool to match. ``os.sched_setaffinity(0, ...)`` alone binds only the calling thread;
    an OpenMP pool started earlier would keep running on every core, so each task id is set."""
    cores = {int(c) for c in cores}
    if not cores:
        return
    for tid in os.listdir("/proc/self/task") if os.path.isdir("/proc/self/task") else ["0"]:
        try:
            os.sched_setaffinity(int(tid), cores)
        except (ProcessLookupError, PermissionError):  # a thread that ended meanwhile
            pass
    torch.set_num_threads(len(cores))


def nccl_version() -> tuple | None:
    """The NCCL version torch links, as a tuple (None without CUDA)."""
    return tuple(torch.cuda.nccl.version()) if has_cuda() else None
