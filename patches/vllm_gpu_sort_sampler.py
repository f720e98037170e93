"""vLLM on CUDA: top-k / top-p through the sort path, the rule the trainer reproduces.

Replaces: ``apply_top_k_top_p`` where vLLM's samplers look it up — ``vllm.v1.sample.ops.topk_topp_sampler``
(the V1 runner's ``TopKTopPSampler``), ``vllm.v1.worker.gpu.sample.sampler`` and ``.states`` (Model
Runner V2, the default on CUDA in 0.32) and ``vllm.v1.sample.rejection_sampler`` (speculative decoding)
— with ``apply_top_k_top_p_pytorch`` (``allow_cpu_sync=False``: a sort also for top-k alone).
Why: with Triton present, ``apply_top_k_top_p`` runs the Triton kernel ``ops/topk_topp_triton.py``,
whose rule is not the sort path's: top-k keeps exactly k, cutting the tokens tied at the k-th value
by vocabulary index; its top-p pivot search ends after 18 steps or a 1e-9 range; batches of at most
64 rows without top-k take another search. bf16 logits tie often near rank 20, so the trainer's μ
(``algorithms/sampling.py``, the sort rule) would sit ~1e-2 nats off the engine's at high-entropy
positions, and the small-batch path depends on the decode batch size, which the trainer cannot
know. ``tests/unit/algorithms/test_sampling_vllm_oracle.py`` runs both vLLM paths on CPU against μ.
Otherwise unchanged: the same function the CPU build always runs (its kept sets are those of the sort).
Cost: one sort of the [batch, vocab] fp32 logits per decode step. Not measured: no GPU has been lent (the
CPU build takes this path anyway, so a CPU figure says nothing of the kernel it replaces). An estimate, by
bandwidth: a segmented sort of 256 × 152k fp32 is of the order of a millisecond on an H200, against tens of
milliseconds for an 8B decode step; to be measured at the GPU bring-up.
Versions: vllm 0.32.0 .. <0.33.0 (checked on 0.32.0; another 0.32.x is a start-up warning,
``rollout/vllm_engine.py``). Needed on CUDA only (the CPU build has no Triton backend and takes the
sort path already).
"""
from __future__ import annotations

import importlib

from megatron_rl.patches import Patch

#: modules that call ``apply_top_k_top_p`` through their own name for it
_USERS = ("vllm.v1.sample.ops.topk_topp_sampler", "vllm.v1.worker.gpu.sample.sampler",
          "vllm.v1.worker.gpu.sample.states", "vllm.v1.sample.rejection_sampler")


def _needed() -> bool:
    from megatron_rl.runtime.device import has_cuda

    return has_cuda()


def _apply() -> None:
    ops = importlib.import_module("vllm.v1.sample.ops.topk_topp_sampler")
    if getattr(ops.apply_top_k_top_p, "_mrl_sort", False):
        return
    sort_path = ops.apply_top_k_top_p_pytorch

    def apply_top_k_top_p(logits, k, p):
        if p is None and k is None:
            return logits
        return sort_path(logits, k, p, allow_cpu_sync=False)

    apply_top_k_top_p._mrl_sort = True
    for name in _USERS:
        importlib.import_module(name).apply_top_k_top_p = apply_top_k_top_p


PATCH = Patch(
    name="vllm_gpu_sort_sampler", group="vllm", package="vllm",
    min_version="0.32.0", max_version="0.33.0", needed=_needed, apply=_apply,
    symbols=(("vllm.v1.sample.ops.topk_topp_sampler:apply_top_k_top_p", ("logits", "k", "p")),
             ("vllm.v1.sample.ops.topk_topp_sampler:apply_top_k_top_p_pytorch", ("logits", "k", "p", "allow_cpu_sync")),
             ("vllm.v1.worker.gpu.sample.sampler:apply_top_k_top_p", ("logits", "k", "p")),
             ("vllm.v1.worker.gpu.sample.states:apply_top_k_top_p", ("logits", "k", "p")),
             ("vllm.v1.sample.rejection_sampler:apply_top_k_top_p", ("logits", "k", "p"))),
)
