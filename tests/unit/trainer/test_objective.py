"""partial_aggregate: summing (S, D) over any split of the batch reproduces aggregate() on the whole."""
from __future__ import annotations

import pytest
import torch

from megatron_rl.algorithms.losses import AGG_MODES, aggregate
from megatron_rl.trainer.pipeline.objective import partial_aggregate


@pytest.mark.parametrize("mode", AGG_MODES)
@pytest.mark.parametrize("split", [1, 2, 3, 6], ids=lambda s: f"chunks{s}")
def test_split_sums_equal_whole_batch(mode, split):
    torch.manual_seed(0)
    loss = torch.randn(6, 5, dtype=torch.float64, requires_grad=True)
    mask = (torch.rand(6, 5) > 0.4).double()
    mask[2] = 0.0                                   # a row with no response token
    whole = aggregate(loss, mask, mode, scale_factor=4.0)
    parts = [partial_aggregate(l, m, mode, scale_factor=4.0)
             for l, m in zip(loss.chunk(split), mask.chunk(split))]
    num = sum(p.loss_sum for p in parts)
    den = None if parts[0].normaliser is None else sum(p.normaliser for p in parts)
    total = num / den if den is not None else num
    torch.testing.assert_close(total, whole, rtol=1e-12, atol=1e-12)
    g1, = torch.autograd.grad(total, loss)
    g2, = torch.autograd.grad(whole, loss)
    torch.testing.assert_close(g1, g2, rtol=1e-12, atol=1e-12)


def test_normaliser_carries_no_gradient():
    loss = torch.randn(2, 3, requires_grad=True)
    p = partial_aggregate(loss, torch.ones(2, 3), "token-mean")
    assert not p.normaliser.requires_grad and p.normaliser.item() == 6


def test_unknown_mode_names_choices():
    with pytest.raises(ValueError, match="token-mean"):
        partial_aggregate(torch.zeros(1, 1), torch.ones(1, 1), "mean")
