"""Every model the trainer builds lives on the GPU, built there (skipped without CUDA).

The same worker as ``tests/distributed/test_model_device.py`` (policy with the distributed optimizer
on and off, fp32 and bf16; the reference from the HF dir and from the actor, with a forward pass;
the teacher's snapshot / EMA shadows) on one GPU: every tensor on ``cuda:0`` and no
``use_cpu_initialization`` (no full fp32 host copy at build time). Not run on the development
machine (CPU only).
"""
from __future__ import annotations

import pytest

from tests.helpers.model_device import CASES, run_worker


@pytest.mark.requires_gpus(1)
def test_every_model_is_built_on_the_gpu(tmp_path):
    got = run_worker(tmp_path)
    assert got["device"].startswith("cuda")
    recs = {r["case"]: r for r in got["records"]}
    assert sorted(recs) == sorted(CASES)
    for case, rec in recs.items():
        assert rec["checked"] > 0 and rec["n_off"] == 0, (case, rec["off_device"])
        if "use_cpu_initialization" in rec:
            assert rec["use_cpu_initialization"] is False, case
    assert recs["reference[load_hf]"]["logp_sum"] < 0
    assert got["max_memory_allocated"] > 0
