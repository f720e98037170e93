"""Review row S3, the unit half (the multi-rank half: ``tests/distributed/test_replica_groups.py``): the
arguments ``runtime/parallel.replica_groups`` hands ``dist.new_group`` for each data-parallel replica."""
from __future__ import annotations

from megatron_rl.runtime.parallel import REPLICA_BACKEND, replica_group_specs


def test_replica_group_specs_pass_backend_gloo():
    """The ``new_group`` arguments themselves: every replica's group is asked for with ``backend="gloo"``; its
    ranks are the replica's and the driver; a replica that is the driver alone gets none."""
    assert REPLICA_BACKEND == "gloo"
    # 8 ranks as TP 2 x DP 4 (dp rank of global rank r: r // 2): replica 0 holds the driver
    specs = replica_group_specs([r // 2 for r in range(8)], 4)
    assert specs == [{"ranks": [0, 1], "backend": "gloo"}, {"ranks": [0, 2, 3], "backend": "gloo"},
                     {"ranks": [0, 4, 5], "backend": "gloo"}, {"ranks": [0, 6, 7], "backend": "gloo"}]
    assert replica_group_specs([0, 1], 2) == [None, {"ranks": [0, 1], "backend": "gloo"}]
