"""trainer.offload on one GPU (skipped without CUDA): the parked bytes leave ``memory_allocated``,
host copies are pinned, the round trip is bit for bit, and the steps after offload/onload match
those of an actor that never offloaded (to 1e-5: CUDA's atomic-add kernels, e.g. the embedding
backward, are not bitwise reproducible run to run; the CPU tests compare exactly) (worker ``tests/distributed/workers/actor_offload_cuda.py``)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.helpers.dist import torchrun

WORKERS = Path(__file__).resolve().parents[1] / "distributed" / "workers"


@pytest.mark.requires_gpus(1)
def test_offload_frees_gpu_memory_and_changes_no_step(tmp_path):
    from tests.helpers.actor_common import make_tiny_hf

    hf = make_tiny_hf(tmp_path / "hf")
    torchrun(WORKERS / "actor_offload_cuda.py", hf, tmp_path / "out.json", nproc=1, timeout=600)
    rec = json.loads((tmp_path / "out.json").read_text())
    for mode in ("optimizer", "all"):
        r = rec[mode]
        assert r["moved"] > 0 and r["freed"] >= 0.95 * r["moved"], r   # CPU-side step counters are the rest
        assert r["pinned"], r
        assert all(abs(a - b) <= 1e-5 * max(abs(b), 1.0) for a, b in zip(r["with"], r["without"])), r
    assert rec["all"]["moved"] > rec["optimizer"]["moved"]               # the weights too
