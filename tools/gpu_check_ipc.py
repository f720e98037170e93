"""The bring-up's hand-off of packed weight buckets to a second process (``tools/gpu_check_run.py``, stage ``ipc``).

The trainer packs its HF weights into reusable byte buckets (``rollout/weight_sync.py`` ``BucketPacker``, on the
device) and passes each bucket through a ``torch.multiprocessing`` queue to a spawned process: on CUDA the
queue carries a CUDA IPC handle of the bucket's device memory (no copy through the host), on CPU a shared-memory
segment. The receiver maps the bucket, takes its :func:`fingerprint` on its side and answers; the sender compares
it with its own before the buffer is reused (bucket k + 2 packs into bucket k's buffer). Only torch is imported
here: the spawned process must start on the lent machine as it is.
"""
from __future__ import annotations

import torch

CHUNK = 1 << 24   # elements per step of fingerprint's int64 arithmetic (128 MiB of temporaries)


def fingerprint(buf: torch.Tensor) -> tuple[int, int]:
    """Two integer sums of the bytes of ``buf`` (uint8, any device), plain and position-weighted, in int64:
    equal bytes give equal results on any device; a changed, dropped or moved byte changes them."""
    flat = buf.reshape(-1)
    plain = weighted = 0
    for lo in range(0, flat.numel(), CHUNK):
        x = flat[lo:lo + CHUNK].to(torch.int64)
        w = torch.arange(lo, lo + x.numel(), device=x.device, dtype=torch.int64) % 65521 + 1
        plain += int(x.sum())
        weighted += int((x * w).sum())
    return plain, weighted


def receiver(inbox, outbox) -> None:
    """The second process: for each ``(k, bucket)`` answer ``(k, fingerprint, device)`` and drop the mapping
    before answering (the sender then reuses the memory); ``None`` ends it."""
    while True:
        item = inbox.get()
        if item is None:
            return
        k, bucket = item
        fp, where = fingerprint(bucket), str(bucket.device)
        if bucket.is_cuda:
            torch.cuda.synchronize(bucket.device)
        del bucket, item
        outbox.put((k, fp, where))
