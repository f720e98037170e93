"""Vocab-parallel log-probs + entropy at TP=2 (torchrun, gloo, 2 processes) vs full-vocab reference."""
from __future__ import annotations

from pathlib import Path

from tests.helpers.dist import torchrun

WORKERS = Path(__file__).parent / "workers"


def test_vocab_parallel_tp2_values_and_grads():
    p = torchrun(WORKERS / "actor_vocab_parallel.py", nproc=2, timeout=300)
    assert "OK" in p.stdout, p.stdout
