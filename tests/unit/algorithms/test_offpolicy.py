"""Off-policy correction (``algorithms/offpolicy.py``): w = min(exp(clip(prox − behav, ±20)), cap)·m.

Expected values are hand-computed (float64, printed to 1e-6) from the formula in the module docstring:

prox − behav, row 0 (staleness 1): [0.1, 0.0, 0.9]  → exp [1.105171, 1, 2.459603] → capped [1.105171, 1, 2]
              row 1 (staleness 2): [0.0, 0.8, −0.5] → exp [1, 2.225541, 0.606531] → [1, 2, 0 (masked)]
              row 2 (staleness 0): [0.1, −0.1, −0.3] → decoupled: [1, 1, 1]; tis: [1.105171, 0.904837, 0.740818]
decoupled metrics over the 5 weighted tokens: mean = (1.105171 + 1 + 2 + 1 + 2) / 5 = 1.421034, max 2,
clipped (log-ratio > ln 2 = 0.693147): 0.9 and 0.8 → 2/5; staleness mean 1, max 2, stale fraction 2/3.
"""
from __future__ import annotations

import pytest
import torch

from megatron_rl.algorithms import aggregate, ppo_clip_loss
from megatron_rl.algorithms.offpolicy import (
    behaviour_matrix,
    check_mode,
    off_policy_weights,
    staleness,
)

D = torch.float64


def t(x):
    return torch.tensor(x, dtype=D)


PROX = [[-1.0, -0.5, -2.0], [-0.3, -1.2, -0.7], [-0.4, -0.6, -0.8]]
BEHAV = [[-1.1, -0.5, -2.9], [-0.3, -2.0, -0.2], [-0.5, -0.5, -0.5]]
MASK = [[1, 1, 1], [1, 1, 0], [1, 1, 1]]
STALE = [1, 2, 0]


def close(a, b):
    torch.testing.assert_close(a, t(b) if not isinstance(b, torch.Tensor) else b, atol=1e-6, rtol=0)


def test_decoupled_hand_computed_batch():
    out = off_policy_weights(t(PROX), t(BEHAV), t(MASK), torch.tensor(STALE), mode="decoupled", cap=2.0)
    close(out.weights, [[1.105171, 1.0, 2.0], [1.0, 2.0, 0.0], [1.0, 1.0, 1.0]])
    assert torch.equal(out.weights[2], t([1.0, 1.0, 1.0])), "a staleness-0 row must be exactly 1"
    m = {k: float(v) for k, v in out.metrics.items()}
    assert m["offpolicy/is_mean"] == pytest.approx(7.105171 / 5, abs=1e-6)
    assert m["offpolicy/is_max"] == pytest.approx(2.0)
    assert m["offpolicy/is_clipped_frac"] == pytest.approx(0.4)
    assert (m["offpolicy/staleness_mean"], m["offpolicy/staleness_max"]) == (1.0, 2.0)
    assert m["offpolicy/stale_frac"] == pytest.approx(2 / 3)


def test_tis_mode_weights_every_sample_and_none_mode_none():
    out = off_policy_weights(t(PROX), t(BEHAV), t(MASK), torch.tensor(STALE), mode="tis", cap=2.0)
    close(out.weights[2], [1.105171, 0.904837, 0.740818])
    close(out.weights[:2], [[1.105171, 1.0, 2.0], [1.0, 2.0, 0.0]])
    none = off_policy_weights(t(PROX), t(BEHAV), t(MASK), torch.tensor(STALE), mode="none")
    assert none.weights is None and float(none.metrics["offpolicy/staleness_max"]) == 2.0


def test_staleness_zero_returns_no_weight_and_the_loss_is_bit_identical():
    """Sync path: every sample at staleness 0 → no weights (decoupled), the loss is untouched; in
    ``tis`` mode a behaviour equal to the proximal policy gives w == mask exactly."""
    prox, mask = t(PROX), t(MASK)
    lp = (prox + t([[0.05, -0.1, 0.3], [0.2, 0.0, -0.4], [0.0, 0.1, 0.1]])).requires_grad_(True)
    adv = t([1.5, -0.8, 0.3])
    out = off_policy_weights(prox, t(BEHAV), mask, torch.zeros(3, dtype=torch.long))
    assert out.weights is None and float(out.metrics["offpolicy/is_mean"]) == 1.0
    same = off_policy_weights(prox, prox.clone(), mask, torch.zeros(3, dtype=torch.long), mode="tis")
    assert torch.equal(same.weights, mask)
    base = ppo_clip_loss(lp, prox, adv, mask, dual_clip=3.0).loss_mat
    weighted = ppo_clip_loss(lp, prox, adv, mask, dual_clip=3.0, tis_weights=same.weights).loss_mat
    assert torch.equal(base, weighted)
    g0, = torch.autograd.grad(aggregate(base, mask, "token-mean"), lp)
    g1, = torch.autograd.grad(aggregate(weighted, mask, "token-mean"), lp)
    assert torch.equal(g0, g1)


def test_weighted_loss_matches_formula_and_no_gradient_through_the_weight():
    prox = t(PROX).requires_grad_(True)
    behav = t(BEHAV).requires_grad_(True)
    out = off_policy_weights(prox, behav, t(MASK), torch.tensor(STALE), cap=2.0)
    assert not out.weights.requires_grad
    lp = t(PROX).requires_grad_(True)                # ρ = 1 → loss = −A·w on the mask
    adv = t([1.5, -0.8, 0.3])
    loss = ppo_clip_loss(lp, prox.detach(), adv, t(MASK), tis_weights=out.weights).loss_mat
    close(loss, [[-1.5 * 1.105171, -1.5, -3.0], [0.8, 1.6, 0.0], [-0.3, -0.3, -0.3]])


@pytest.mark.parametrize("mode,cap", [("bogus", 2.0), ("tis", 0.5), ("tis", float("inf"))], ids=["mode", "cap<1", "inf"])
def test_bad_settings_raise(mode, cap):
    with pytest.raises(ValueError, match="off_policy|tis_cap"):
        check_mode(mode, cap)


def test_staleness_and_behaviour_matrix():
    assert staleness(3, torch.tensor([3, 2, 1])).tolist() == [0, 1, 2]
    with pytest.raises(ValueError, match="ahead"):
        staleness(1, torch.tensor([2]))
    like = torch.zeros(2, 3, dtype=D)
    close(behaviour_matrix([[-0.1, -0.2, -0.3, -0.4], [-0.5]], like), [[-0.1, -0.2, -0.3], [-0.5, 0.0, 0.0]])
