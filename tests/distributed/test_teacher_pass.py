"""Packed teacher passes == single-sequence computations (1e-5, fp32) at TP=1, TP=2 and PP=2."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tests.helpers.dist import torchrun

WORKERS = Path(__file__).parent / "workers"


@pytest.mark.parametrize("nproc,tp,pp", [(1, 1, 1), (2, 2, 1), (2, 1, 2)])
def test_packed_teacher_matches_single_sequences(tmp_path, nproc, tp, pp):
    sys.path.insert(0, str(WORKERS))
    from actor_common import make_tiny_hf

    hf = make_tiny_hf(tmp_path / "hf")
    p = torchrun(WORKERS / "teacher_pass.py", hf, tp, pp, nproc=nproc, timeout=300)
    assert "OK" in p.stdout, p.stdout
    print(p.stdout)
