"""The engine side's adapter versions (``rollout/adapter_store.py``): atomic per-version PEFT dirs that PEFT's
own reader loads, and vLLM's ``max_lora_rank`` rounding against the values vLLM's config accepts."""
from __future__ import annotations

import typing

import pytest
import torch

from megatron_rl.rollout.adapter_store import (
    VLLM_LORA_RANKS,
    AdapterStore,
    vllm_max_lora_rank,
)


def test_versions_are_whole_peft_dirs_and_old_ones_go(tmp_path):
    from peft import PeftConfig
    from safetensors.torch import load_file

    store = AdapterStore(tmp_path / "store")
    cfg = {"peft_type": "LORA", "task_type": "CAUSAL_LM", "r": 4, "lora_alpha": 8, "target_modules": ["q_proj"]}
    t1 = {"base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight": torch.randn(4, 16)}
    p1 = store.write(1, cfg, t1)
    assert PeftConfig.from_pretrained(str(p1)).r == 4                  # PEFT reads the dir vLLM is given
    assert torch.equal(load_file(str(p1 / "adapter_model.safetensors"))[next(iter(t1))], next(iter(t1.values())))
    t2 = {k: v + 1 for k, v in t1.items()}
    store.write(2, cfg, t2)
    store.drop(1)
    assert store.versions() == [2] and torch.equal(store.read(2)[next(iter(t2))], next(iter(t2.values())))
    assert [p.name for p in (tmp_path / "store").iterdir()] == ["v2"]   # no temporary dir left behind
    with pytest.raises((AttributeError, TypeError)):   # a failed write leaves nothing behind
        store.write(3, cfg, {"x": "not a tensor"})
    assert store.versions() == [2] and [p.name for p in (tmp_path / "store").iterdir()] == ["v2"]
    store.close()
    assert not (tmp_path / "store").exists()


def test_max_lora_rank_is_the_smallest_vllm_accepts():
    from vllm.config.lora import MaxLoRARanks

    assert VLLM_LORA_RANKS == typing.get_args(MaxLoRARanks)      # the installed vLLM's own list
    assert [vllm_max_lora_rank(r) for r in (1, 4, 8, 9, 64, 300, 512)] == [1, 8, 8, 16, 64, 320, 512]
    with pytest.raises(ValueError, match="lora.rank=513 exceeds vLLM's largest max_lora_rank"):
        vllm_max_lora_rank(513)
