"""Context parallelism on Transformer Engine (skipped without 2 GPUs and TE): CP=2 (DP 1) reproduces
CP=1 (DP 2) — packed log-probs, padded masked support (the teacher passes), the loss, its normaliser and
the grad norm of one packed ``train_step`` (``workers/context_parallel_te.py``). The CPU half (the split,
the CP gather, the actor's per-token path on a real gloo CP group) is ``tests/distributed/test_context_parallel.py``.
Not run on the development machine (CPU only)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from tests.gpu.stack_probe import TE, needs
from tests.helpers.dist import torchrun

WORKERS = Path(__file__).resolve().parents[1] / "distributed" / "workers"


@pytest.mark.requires_gpus(2)
@needs(TE)
def test_cp2_matches_cp1_on_te(tmp_path):
    from tests.helpers.actor_common import make_tiny_hf

    hf = make_tiny_hf(tmp_path / "hf")
    torchrun(WORKERS / "context_parallel_te.py", hf, tmp_path / "rec.json", nproc=2, timeout=600)
    rec = json.loads((tmp_path / "rec.json").read_text())
    a, b = rec["cp1"], rec["cp2"]
    for key in ("logp", "support_logp"):        # fp32; TE's attention kernels differ between the THD + CP ring and THD
        assert float((torch.tensor(a[key]) - torch.tensor(b[key])).abs().max()) <= 1e-4, key
    assert a["normaliser"] == b["normaliser"]
    assert abs(a["loss"] - b["loss"]) <= 1e-4 * max(1.0, abs(a["loss"]))
    assert abs(a["grad_norm"] - b["grad_norm"]) <= 1e-4 * max(1.0, a["grad_norm"])
