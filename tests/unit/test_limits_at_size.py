"""Integer limits at the examples' sizes: DAPO's step (512 prompts x 16 samples of up to 2048 + 20480 tokens:
~185 M tokens) and the 8-way split vocabularies. What is int32 stays bounded by one micro-batch or by the
vocabulary; what counts a whole step is int64 (``rollout/rollouts.py``'s offsets); a budget past int32's range is
refused at config load."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

from megatron_rl.recipes import load
from megatron_rl.rollout.rollouts import _offsets
from megatron_rl.trainer.pipeline.batch import TrainBatch
from megatron_rl.trainer.pipeline.packing import thd_layout

REPO = Path(__file__).resolve().parents[2]
LARGE = sorted(p.stem for p in (REPO / "examples/configs").glob("*.yaml") if not p.stem.startswith("tiny_cpu_"))
INT32 = 2**31 - 1


def test_dapo_step_counts_past_int32_in_int64_offsets():
    cfg = load("llama3_1_8b_dapo")
    step = cfg.data.prompts_per_step * cfg.rollout.n * (cfg.data.max_prompt_len + cfg.rollout.max_tokens)
    assert step == 512 * 16 * 22528 and step > 1.8e8                   # the ~160-185 M tokens of a DAPO step
    # the offsets of a step whose responses sum past 2**31 (lengths only: nothing of that size is allocated)
    off = _offsets([INT32, INT32, 5])
    assert off.dtype == torch.int64 and off.tolist() == [0, INT32, 2 * INT32, 2 * INT32 + 5]


@pytest.mark.parametrize("name", LARGE)
def test_what_is_int32_is_bounded_by_a_micro_batch_or_the_vocabulary(name):
    from megatron_rl.models.provider import padded_vocab_size

    cfg = load(name)
    tokens = cfg.trainer.max_tokens_per_micro_batch or cfg.trainer.rows_per_micro_batch * (
        cfg.data.max_prompt_len + cfg.rollout.max_tokens)
    assert tokens < 2**31                                              # cu_seqlens (int32) of a micro-batch
    fixture = next(d for d in sorted((REPO / "tests/fixtures/hf_configs").iterdir(), key=lambda d: -len(d.name))
                   if name.startswith(d.name))
    assert padded_vocab_size(str(fixture), cfg.parallel.tp) < 2**31   # token ids (int32 in the rollouts)


def test_thd_cu_seqlens_end_at_the_micro_batch_tokens():
    seg = torch.tensor([[0, 0, 1, 1, 1, 2], [3, 3, 3, 3, 4, 4]])
    batch = TrainBatch(torch.zeros(2, 6, dtype=torch.long), torch.ones(2, 5), extras={"segment_ids": seg})
    _, _, cu, longest = thd_layout(batch)
    assert cu.dtype == torch.int32 and cu.tolist() == [0, 2, 5, 6, 10, 12] and longest == 4


def test_a_budget_past_int32_is_refused_at_load():
    from megatron_rl.config import load_config

    with pytest.raises(ValueError, match=r"must be < 2\*\*31: a packed micro-batch's cu_seqlens are int32"):
        load_config(REPO / "examples/configs/llama3_1_8b_dapo.yaml", [f"trainer.max_tokens_per_micro_batch={2**31}"])
