"""TrainBatch layout, slicing, padding and validation."""
from __future__ import annotations

import pytest
import torch

from megatron_rl.trainer.pipeline.batch import TrainBatch, make_batch


def test_make_batch_mask_aligned_with_targets():
    b = make_batch([[5, 6, 7], [8]], [[1, 2], [3, 4, 9]], pad_id=0,
                   extras={"adv": torch.tensor([1.0, -1.0])})
    assert b.tokens.tolist() == [[5, 6, 7, 1, 2], [8, 3, 4, 9, 0]]
    # targets = tokens[:, 1:]; mask 1 exactly on response targets
    assert b.targets.tolist() == [[6, 7, 1, 2], [3, 4, 9, 0]]
    assert b.loss_mask.tolist() == [[0, 0, 1, 1], [1, 1, 1, 0]]
    am = b.attention_mask()
    assert am.shape == (1, 1, 5, 5) and am[0, 0, 0, 1] and not am[0, 0, 1, 0]


def test_slice_shard_micro_batches():
    b = make_batch([[1]] * 8, [[2, 3]] * 8, extras={"i": torch.arange(8), "tok": torch.ones(8, 2)})
    parts = b.shard(1, 2).micro_batches(2)
    assert [p.extras["i"].tolist() for p in parts] == [[4, 5], [6, 7]]
    with pytest.raises(ValueError, match="micro_batch_size=3"):
        b.micro_batches(3)
    with pytest.raises(ValueError, match="3 data-parallel"):
        b.shard(0, 3)


def test_pad_to_multiple_pads_per_token_extras():
    b = make_batch([[1, 2]], [[3, 4, 5]], extras={"old": torch.ones(1, 4), "adv": torch.ones(1)})
    p = b.pad_to_multiple(4)
    assert p.seq_len == 8 and p.loss_mask.shape == (1, 7)
    assert p.extras["old"].shape == (1, 7) and p.extras["adv"].shape == (1,)
    assert p.loss_mask.sum() == b.loss_mask.sum()


@pytest.mark.parametrize("kw,msg", [
    (dict(tokens=torch.zeros(2, 4, dtype=torch.long), loss_mask=torch.zeros(2, 4)), "loss_mask must be"),
    (dict(tokens=torch.zeros(2, 4), loss_mask=torch.zeros(2, 3)), "integer ids"),
    (dict(tokens=torch.zeros(2, 4, dtype=torch.long), loss_mask=torch.zeros(2, 3),
          extras={"adv": torch.zeros(3)}), "extras\\['adv'\\]"),
], ids=["mask-shape", "float-tokens", "extra-leading-dim"])
def test_validation_names_the_field(kw, msg):
    with pytest.raises((ValueError, TypeError), match=msg):
        TrainBatch(**kw)

