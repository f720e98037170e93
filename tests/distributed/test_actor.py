"""PolicyActor end to end at TP=2 + SP in bf16 (torchrun, gloo, 2 processes): broadcast_batch,
a short SFT run whose loss must drop, a frozen ReferencePolicy, and clear batch-size errors."""
from __future__ import annotations

from pathlib import Path

from tests.helpers.dist import torchrun

WORKERS = Path(__file__).parent / "workers"


def test_actor_bf16_tp2_sp(tmp_path):
    from tests.helpers.actor_common import make_tiny_hf

    hf = make_tiny_hf(tmp_path / "hf")
    p = torchrun(WORKERS / "actor_misc.py", hf, nproc=2, timeout=300)
    assert "OK" in p.stdout, p.stdout
