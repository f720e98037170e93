"""Run a function of one vocabulary shard on every shard of a row at once, in lock-step threads whose
:class:`~megatron_rl.algorithms.sampling.Collectives` meet at a barrier (the shape of an all-reduce /
all-gather), so the code path is the tensor-parallel one without processes."""
from __future__ import annotations

import threading

import torch

from megatron_rl.algorithms.sampling import Collectives


def run_sharded(fn, z: torch.Tensor, bounds: list[int]) -> list:
    """``[fn(z[..., lo:hi], col_r) for each shard r]`` with the shards' collectives joined."""
    n = len(bounds) - 1
    barrier = threading.Barrier(n)
    slots: list = [None] * n
    out: list = [None] * n
    errors: list = []

    def reducer(rank, op):
        def f(t):
            slots[rank] = t
            barrier.wait()
            vals = list(slots)
            barrier.wait()
            if op == "cat":
                return torch.cat(vals, -1)
            stacked = torch.stack(vals)
            return stacked.amax(0) if op == "max" else stacked.sum(0)
        return f

    def work(rank):
        try:
            col = Collectives(reducer(rank, "max"), reducer(rank, "sum"), reducer(rank, "cat"))
            out[rank] = fn(z[..., bounds[rank]:bounds[rank + 1]], col)
        except BaseException as e:   # noqa: BLE001 - re-raised below
            errors.append(e)
            barrier.abort()

    threads = [threading.Thread(target=work, args=(r,)) for r in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return out
