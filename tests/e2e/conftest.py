"""Shared e2e fixtures."""
from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def plain_warm(tmp_path_factory) -> Path:
    """One plain warm-started tiny policy + task data (`megatron-rl demo --algo grpo --steps 1`), shared by
    the learning and resume tests (each warm start costs about a minute on 2 cores)."""
    from tests.e2e.test_learning import run_demo

    d = tmp_path_factory.mktemp("plain") / "warm"
    run_demo("grpo", d, 1)
    return d
