"""Trainer -> engine weight push: byte-budgeted buckets of HF-named tensors.

CPU / this repo: each bucket is ``ray.put`` once and every engine actor loads it
(``engine.update_weights``). GPU deployments would send CUDA-IPC handles (colocated) or broadcast
over an NCCL group (separate GPUs) with the same bucket boundaries; that path is not implemented
here and ``RolloutClient`` refuses ``sync_backend`` values other than ``"ray"``.
"""
from __future__ import annotations

from typing import Iterable, Iterator

import torch


def bucket_tensors(named: Iterable[tuple[str, torch.Tensor]], bucket_bytes: int = 256 << 20) -> Iterator[list[tuple[str, torch.Tensor]]]:
    """Group ``(name, tensor)`` pairs into lists of at most ``bucket_bytes`` (a larger single tensor
    gets its own bucket). Tensors are detached, moved to CPU and made contiguous."""
    if bucket_bytes <= 0:
        raise ValueError(f"bucket_bytes must be > 0, got {bucket_bytes}")
    cur, size = [], 0
    for name, t in named:
        t = t.detach().to("cpu").contiguous()
        n = t.numel() * t.element_size()
        if cur and size + n > bucket_bytes:
            yield cur
            cur, size = [], 0
        cur.append((name, t))
        size += n
    if cur:
        yield cur
