"""vLLM 0.32's own top-k / top-p implementations, run on this CPU as test oracles (nothing copied:
both come from the installed ``vllm`` package).

* :func:`sort_path`: ``vllm/v1/sample/ops/topk_topp_sampler.py`` ``apply_top_k_top_p_pytorch`` (the CPU
  build's sampler; the GPU engines are pinned to it by ``patches/vllm_gpu_sort_sampler.py``).
* :func:`kernel_path`: the Triton kernel a CUDA build would run (``ops/topk_topp_triton.py``
  ``_topk_topp_kernel``, the monolithic one), under Triton's interpreter (``TRITON_INTERPRET=1`` runs
  a kernel on CPU tensors with numpy; it must be set before ``triton`` is first imported, so the kernel
  runs in a child process, all cases in one call). Two things are in the way and are bypassed: (1) on a CPU build
  ``vllm.triton_utils`` hands out placeholders for ``triton`` / ``tl``, so the module's file is executed
  again as a fresh module with the real ones; (2) its JIT warm-up dispatcher, so the kernel is launched
  directly with the arguments the dispatcher computes on CUDA (``BLOCK_SIZE`` 8192,
  ``BLOCK_SIZE_TRUNC`` 4096, 8 warps, one program per row). The interpreter yields plain ints from
  ``tl.range`` where the kernel calls ``row_id.to(tl.int64)``: during the launch ``tl.range`` yields an
  int that accepts ``.to`` (the row index's type, nothing else changes). Not covered: the split-row
  top-p path (``_apply_topp_split``) a CUDA build takes for batches of at most 64 rows without top-k.
"""
from __future__ import annotations

import contextlib
import functools
import importlib.util
import os
import subprocess
import sys

import torch


def sort_path(z: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    """vLLM's sort-based top-k / top-p of rows ``z`` [B, V] (fp32, after temperature and min-p)."""
    from vllm.v1.sample.ops.topk_topp_sampler import apply_top_k_top_p_pytorch

    b = z.shape[0]
    k = torch.full((b,), top_k, dtype=torch.long) if top_k > 0 else None
    p = torch.full((b,), top_p, dtype=torch.float32) if top_p < 1.0 else None
    return apply_top_k_top_p_pytorch(z.clone(), k, p)


class _Index(int):
    """A row index from the interpreter's ``tl.range`` that takes the kernel's ``.to(tl.int64)``."""

    def to(self, *args, **kwargs) -> int:
        return int(self)


@contextlib.contextmanager
def _interpreted_range():
    from triton.runtime import interpreter

    orig = interpreter._patch_lang_core

    def patched(lang, scope):
        orig(lang, scope)
        rng = lang.range
        scope.set_attr(lang, "range", lambda *a, **k: (_Index(i) for i in rng(*a, **k)))

    interpreter._patch_lang_core = patched
    try:
        yield
    finally:
        interpreter._patch_lang_core = orig


@functools.cache
def _kernel_module():
    import triton
    import triton.language as tl
    import vllm.triton_utils as tu
    from vllm.v1.sample.ops import topk_topp_triton

    saved = tu.triton, tu.tl
    tu.triton, tu.tl = triton, tl
    try:
        spec = importlib.util.spec_from_file_location("_vllm_topk_topp_interpreted", topk_topp_triton.__file__)
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
    finally:
        tu.triton, tu.tl = saved
    return mod


def _kernel_path(mod, z: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    x = z.float().contiguous().clone()
    b, v = x.shape
    k = torch.full((b,), top_k, dtype=torch.int32) if top_k > 0 else None
    p = torch.full((b,), top_p, dtype=torch.float32) if top_p < 1.0 else None
    programs = 1
    with _interpreted_range():
        mod._topk_topp_kernel[(programs,)](
            x, x.stride(0), x.new_empty((programs, v)), x.new_tensor(mod._PERCENTILE_TO_STD_TABLE),
            x.new_tensor(mod._NORMAL_CDF_TO_SIGMA_TABLE), k if k is not None else x, p if p is not None else x, b,
            VOCAB_SIZE=v, MASK_VALUE=float("-inf"), BLOCK_SIZE=8192, BLOCK_SIZE_TRUNC=4096,
            TOPK_ENABLED=k is not None, TOPP_ENABLED=p is not None, SPLIT_COVERS_PONLY=False, num_warps=8)
    return x


def kernel_paths(cases: list[tuple[torch.Tensor, int, float]], tmp_path) -> list[torch.Tensor]:
    """vLLM's Triton top-k / top-p kernel on each case's rows ``z`` [B, V] (fp32; top_k <= 0 / top_p = 1:
    off), as a CUDA build launches it for a batch the split path does not take; dropped entries −inf.
    One child process under ``TRITON_INTERPRET=1`` for all cases."""
    src, dst = tmp_path / "kernel_in.pt", tmp_path / "kernel_out.pt"
    torch.save(cases, src)
    env = dict(os.environ, TRITON_INTERPRET="1", OMP_NUM_THREADS="1")
    proc = subprocess.run([sys.executable, __file__, str(src), str(dst)], env=env, capture_output=True, text=True,
                          timeout=600, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return torch.load(dst)


if __name__ == "__main__":
    assert os.environ.get("TRITON_INTERPRET") == "1"
    torch.set_num_threads(1)
    module = _kernel_module()
    torch.save([_kernel_path(module, *case) for case in torch.load(sys.argv[1])], sys.argv[2])
