"""Shared pytest setup: hardware markers and environment for real (not mocked) components."""
from __future__ import annotations

import os

import pytest

os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("WANDB_MODE", "offline")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


def pytest_configure(config):
    config.addinivalue_line("markers", "requires_gpus(n): needs n CUDA devices (skipped otherwise)")
    config.addinivalue_line("markers", "slow: long end-to-end test")


def pytest_collection_modifyitems(config, items):
    import torch

    n = torch.cuda.device_count() if torch.cuda.is_available() else 0
    for item in items:
        m = item.get_closest_marker("requires_gpus")
        if m is not None and n < int(m.args[0] if m.args else 1):
            item.add_marker(pytest.mark.skip(reason=f"needs {m.args[0] if m.args else 1} GPU(s), found {n}"))
