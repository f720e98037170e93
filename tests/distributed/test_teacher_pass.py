"""Packed teacher passes == single-sequence computations (1e-5, fp32) at TP=1, TP=2 and PP=2; multi-turn
teacher sequences scored on the policy's tokens only == HF transformers there (1e-4), RLSD's loss on them ==
its formula over those tokens (``workers/teacher_pass.masked_against_hf``)."""
from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers.dist import torchrun

WORKERS = Path(__file__).parent / "workers"


LAYOUTS = [(1, 1, 1), (2, 2, 1), (2, 1, 2)]  # nproc, tp, pp


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """``{(tp, pp): that layout's stdout}``: one launch per world size, the layouts in turn inside it."""
    from tests.helpers.actor_common import make_tiny_hf

    hf = make_tiny_hf(tmp_path_factory.mktemp("teacher") / "hf")
    out = {}
    for nproc in sorted({n for n, _, _ in LAYOUTS}):
        cases = [(tp, pp) for n, tp, pp in LAYOUTS if n == nproc]
        p = torchrun(WORKERS / "teacher_pass.py", hf, *(f"{tp}:{pp}" for tp, pp in cases), nproc=nproc,
                     timeout=300 * len(cases))
        for part in p.stdout.split("CASE ")[1:]:
            head = part.split("\n", 1)[0].strip()
            out[tuple(int(x.split("=")[1]) for x in head.split())] = part
    return out


@pytest.mark.parametrize("nproc,tp,pp", LAYOUTS)
def test_packed_teacher_matches_single_sequences(runs, nproc, tp, pp):
    out = runs[(tp, pp)]
    assert "OK" in out, out
    print(out)
