"""Shared pytest setup: hardware markers and environment for real (not mocked) components."""
from __future__ import annotations

import os
from pathlib import Path

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


@pytest.fixture(scope="session")
def plain_warm(tmp_path_factory) -> Path:
    """One plain warm-started tiny policy + task data (`megatron-rl demo --algo grpo --steps 1`), shared by
    the learning, resume and multi-node tests (each warm start costs about a minute on 2 cores).
    ``MEGATRON_RL_TEST_WARM=DIR`` reuses a finished ``megatron-rl demo --algo grpo`` run dir instead."""
    from tests.e2e.test_learning import run_demo

    if os.environ.get("MEGATRON_RL_TEST_WARM"):
        d = Path(os.environ["MEGATRON_RL_TEST_WARM"])
        assert (d / "sft_hf" / "config.json").is_file(), f"MEGATRON_RL_TEST_WARM={d}: no sft_hf/ there"
        return d

    d = tmp_path_factory.mktemp("plain") / "warm"
    run_demo("grpo", d, 1)
    return d


@pytest.fixture(scope="session")
def chat_tokenizer(tmp_path_factory):
    """The chat fixture's HF tokenizer alone (BPE + Qwen specials + ChatML template; ~2 s), wrapped
    in megatron_rl's tokenizer protocol."""
    from megatron_rl.data.chat_fixture import train_tokenizer
    from megatron_rl.data.tokenizer import load_tokenizer

    d = tmp_path_factory.mktemp("chat_tok")
    train_tokenizer(d)
    return load_tokenizer(d)


@pytest.fixture(scope="session")
def chat_fixture(tmp_path_factory) -> dict:
    """The warm-started tiny chat model + task (``megatron_rl.data.chat_fixture``), built once per session."""
    from megatron_rl.data.chat_fixture import build_chat_fixture

    return build_chat_fixture(tmp_path_factory.mktemp("chat_fixture"))
