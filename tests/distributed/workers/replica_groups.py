"""Worker (2 ranks): the replica groups of ``runtime/parallel.replica_groups`` are gloo groups whatever the
default group's backend is, and ``broadcast_object`` over one stays on the host.

    torchrun --nproc_per_node=2 replica_groups.py OUT_JSON DEFAULT_BACKEND

``DEFAULT_BACKEND``: ``gloo`` (the project's ``init_distributed`` on a CPU machine), or ``renamed``: the
default group is a real gloo process group registered with torch under another name (``hostnet``), so the
default backend is not ``gloo``, as NCCL's is not on a GPU; a ``new_group`` without ``backend`` inherits
that name, so a replica group reporting ``gloo`` was created with ``backend="gloo"`` explicitly.
With DP = 2 at TP = 1: replica 0 is the driver alone (no group), replica 1 is ranks [0, 1].
"""
from __future__ import annotations

import json
import sys


def _hostnet(store, rank, size, timeout):
    import torch.distributed as dist

    return dist.ProcessGroupGloo(store, rank, size, timeout)


def main(out: str, default_backend: str) -> None:
    import torch
    import torch.distributed as dist

    from megatron_rl.runtime import parallel
    from megatron_rl.runtime.broadcast import BIG_BYTES, broadcast_object

    if default_backend == "renamed":
        dist.Backend.register_backend("hostnet", _hostnet, devices=["cpu"])
        dist.init_process_group("hostnet")
    else:
        parallel.init_distributed(timeout_s=120)
    rank, world = dist.get_rank(), dist.get_world_size()
    info = parallel.ParallelInfo(rank=rank, world=world, tp=1, pp=1, dp=world, tp_rank=0, pp_rank=0, dp_rank=rank)
    groups = parallel.replica_groups(info)
    inherited = dist.new_group([0, 1])                      # the control: what new_group without backend makes
    obj = {"big": torch.arange(BIG_BYTES // 4 + 5, dtype=torch.float32), "small": torch.tensor([1, 2, 3]), "n": 7}
    got = broadcast_object(obj if rank == 0 else None, src=0, group=groups[1])
    rec = {"rank": rank, "default": dist.get_backend(), "inherited": dist.get_backend(inherited),
           "replicas": [None if g is None else dist.get_backend(g) for g in groups],
           "members": [None if g is None else dist.get_process_group_ranks(g) for g in groups],
           "same_object": all(torch.equal(got[k], obj[k]) for k in ("big", "small")) and got["n"] == 7,
           "devices": sorted({str(got[k].device) for k in ("big", "small")}),
           "cached": parallel.replica_groups(info) is groups}
    recs: list = [None] * world
    dist.all_gather_object(recs, rec)
    if rank == 0:
        with open(out, "w") as f:
            json.dump(recs, f)
    parallel._REPLICA_GROUPS.clear()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
