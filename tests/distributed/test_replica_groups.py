"""Review row S3: the per-replica groups that carry a step's batch (``runtime/parallel.replica_groups``) are
gloo groups on every machine — created with ``backend="gloo"``, not inheriting the default backend (NCCL on a
GPU: an extra NCCL communicator per replica on rank 0, every tensor staged through the device, receivers
spinning inside NCCL) — and ``broadcast_object`` over one delivers host tensors. Real ``torchrun`` ranks
(``workers/replica_groups.py``): once on the project's gloo default group, once with the default group
registered under another backend name (a real gloo group named ``hostnet``), where a group that inherited
would report ``hostnet``. The ``new_group`` arguments themselves: ``tests/unit/test_replica_group_specs.py``."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.helpers.dist import torchrun

WORKER = Path(__file__).resolve().parent / "workers" / "replica_groups.py"


@pytest.mark.parametrize("default", ["gloo", "renamed"])
def test_replica_groups_are_gloo_whatever_the_default_backend(tmp_path, default):
    out = tmp_path / "rec.json"
    torchrun(WORKER, out, default, nproc=2, timeout=180)
    recs = json.loads(out.read_text())
    want_default = "gloo" if default == "gloo" else "hostnet"
    for r in recs:
        assert r["default"] == want_default and r["inherited"] == want_default, r   # new_group alone inherits
        assert r["replicas"] == [None, "gloo"] and r["members"] == [None, [0, 1]], r   # the driver alone: no group
        assert r["same_object"] and r["devices"] == ["cpu"] and r["cached"], r

