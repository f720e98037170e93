"""Activation recompute on Transformer Engine layers (skipped without 2 GPUs and TE): the worker of
``tests/distributed/test_recompute.py`` with ``backend=te`` on CUDA; selective / full recompute give the
loss and gradients of no recompute. Not run on the development machine (CPU only)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.gpu.stack_probe import TE, needs
from tests.helpers.dist import torchrun

WORKERS = Path(__file__).resolve().parents[1] / "distributed" / "workers"


@pytest.mark.requires_gpus(2)
@needs(TE)
def test_recompute_on_te_matches_no_recompute(tmp_path):
    from tests.helpers.actor_common import make_tiny_hf

    hf = make_tiny_hf(tmp_path / "hf")
    torchrun(WORKERS / "recompute.py", hf, tmp_path / "rec.json", "te", nproc=2, timeout=600)
    rec = json.loads((tmp_path / "rec.json").read_text())
    for key, r in rec.items():
        assert abs(r["loss"] - r["base_loss"]) <= 1e-5, (key, r)       # TE kernels: fused, fp32 here
        assert r["max_grad_diff"] <= 1e-5, (key, r)
        if key.endswith("full_uniform"):
            assert r["calls"]["mlp"] == 2 * r["base_calls"]["mlp"], (key, r)
