"""Packed policy passes on Transformer Engine run as THD (``packing.thd_layout`` -> ``PackedSeqParams``):
per-sequence log-probs and one train step equal the padded path's on the same weights (skipped without
CUDA + Transformer Engine; not run on the CPU development machine — docs/gpu-status.md). The CPU twin of this check (local spec, block-diagonal masks) is
``tests/distributed/test_packing.py``."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from tests.gpu.stack_probe import TE, needs
from tests.helpers.dist import torchrun

WORKERS = Path(__file__).resolve().parents[1] / "distributed" / "workers"


@pytest.mark.requires_gpus(1)
@needs(TE)
def test_thd_packed_passes_equal_padded_on_te(tmp_path):
    from tests.helpers.actor_common import make_tiny_hf

    hf = make_tiny_hf(tmp_path / "hf")
    torchrun(WORKERS / "actor_packing.py", str(hf), str(tmp_path), "te:1:1:0:te", nproc=1, timeout=900)
    r = json.loads((tmp_path / "te.json").read_text())
    for key in ("logp", "entropy"):
        diff = (torch.tensor(r["packed"][key]) - torch.tensor(r["padded"][key])).abs().max().item()
        assert diff <= 1e-3, (key, diff)          # TE kernels: TF32 / fused softmax rounding
    for kind in ("grpo", "rlcsd", "score", "sdpo"):
        a, b = r["padded"][kind], r["packed"][kind]
        assert abs(a["loss"] - b["loss"]) <= 1e-3 * max(abs(a["loss"]), 1.0), (kind, a, b)
