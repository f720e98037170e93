"""Shared fixture of the conversion tests."""
from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def hf_dir(tmp_path_factory) -> Path:
    """A tiny random Qwen3 saved as an HF dir (config.json + safetensors)."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    d = tmp_path_factory.mktemp("hf")
    cfg = Qwen3Config(vocab_size=100, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, head_dim=16, architectures=["Qwen3ForCausalLM"])
    Qwen3ForCausalLM(cfg).save_pretrained(str(d))
    return d
