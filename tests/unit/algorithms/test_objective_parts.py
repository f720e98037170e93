"""The building blocks every method's objective goes through: PPO clip (dual clip, TIS),
loss aggregation modes, the KL estimators (loss and in-reward, adaptive controller).

Spec vectors T-V2/T-V3 and §3.2, independently derived cases and empty-mask edges."""
from __future__ import annotations

import math

import pytest
import torch

import megatron_rl.algorithms as A
from megatron_rl.algorithms import aggregate, kl_penalty, ppo_clip_loss
from tests.helpers.algo_builders import D, close, t


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-sum", "seq-mean-token-mean",
                                  "seq-mean-token-sum-norm", "token-sum"])
def test_empty_mask_gives_zero_loss_and_zero_grad(mode):
    lp = torch.full((2, 3), -1.0, dtype=D, requires_grad=True)
    old = lp.detach() + float("nan")  # garbage under the mask must not leak
    m = torch.zeros(2, 3, dtype=D)
    out = ppo_clip_loss(lp, old, t([1.0, -1.0]), m, dual_clip=3.0)
    loss = aggregate(out.loss_mat, m, mode)
    assert float(loss.detach()) == 0.0
    (g,) = torch.autograd.grad(loss, lp)
    assert float(g.abs().sum()) == 0.0 and not torch.isnan(g).any()
    assert all(float(v) == 0.0 for v in out.metrics.values())


def test_empty_rows_are_not_counted_by_seq_modes():
    lm, m = t([[2.0, 4.0], [9.0, 9.0]]), t([[1, 1], [0, 0]])
    assert float(aggregate(lm, m, "seq-mean-token-sum")) == 6.0
    assert float(aggregate(lm, m, "seq-mean-token-mean")) == 3.0


@pytest.mark.parametrize("kind", ["k1", "k2", "k3", "abs"])
def test_kl_gradcheck_and_ref_stop_gradient(kind):
    lp = (-torch.rand(3, 4, dtype=D) - 0.1).requires_grad_(True)
    ref = (-torch.rand(3, 4, dtype=D) - 0.1).requires_grad_(True)
    m = torch.ones(3, 4, dtype=D)
    assert torch.autograd.gradcheck(lambda x: aggregate(kl_penalty(x, ref, kind), m, "token-mean"), (lp,))
    g = torch.autograd.grad(kl_penalty(lp, ref, kind).sum(), ref, allow_unused=True)[0]
    assert g is None


def test_kl_straight_through_plus_has_k2_gradient_and_named_value():
    lp = torch.tensor([-1.0, -0.2, -3.0], dtype=D, requires_grad=True)
    ref = torch.tensor([-1.5, -0.2, -1.0], dtype=D)
    v = kl_penalty(lp, ref, "k3+")
    torch.testing.assert_close(v, kl_penalty(lp, ref, "k3"))
    (g,) = torch.autograd.grad(v.sum(), lp)
    torch.testing.assert_close(g, (lp - ref).detach())  # ∂k2/∂lp = lp − ref


def test_ppo_clip_positive_advantage_clipped_has_zero_gradient():
    # A = 2, lp − old = log 1.5: L1 = −3, L2 = −2·1.2 = −2.4, L = max = −2.4 (constant in lp → grad 0).
    lp = torch.tensor([[math.log(1.5)]], dtype=D, requires_grad=True)
    out = ppo_clip_loss(lp, torch.zeros(1, 1, dtype=D), t([2.0]), torch.ones(1, 1, dtype=D))
    torch.testing.assert_close(out.loss_mat, t([[-2.4]]))
    (g,) = torch.autograd.grad(out.loss_mat.sum(), lp)
    assert float(g) == 0.0
    # A = −1, ratio 5 with dual clip c = 3: L1 = 5, L2 = 1.2, Lc = 5 > L3 = 3 → L = 3, grad 0.
    lp2 = torch.tensor([[math.log(5.0)]], dtype=D, requires_grad=True)
    out2 = ppo_clip_loss(lp2, torch.zeros(1, 1, dtype=D), t([-1.0]), torch.ones(1, 1, dtype=D), dual_clip=3.0)
    torch.testing.assert_close(out2.loss_mat, t([[3.0]]))


def test_k3_at_log_two():
    # lp − ref = log 2 → x = −log 2: e^x − x − 1 = 0.5 + 0.693147 − 1 = 0.193147.
    v = kl_penalty(t([math.log(2.0)]), t([0.0]), "k3")
    torch.testing.assert_close(v, t([0.5 + math.log(2.0) - 1]))


def test_aggregate_hand_computed():
    # L = [[1, 2, 3], [4, 0, 0]], m = [[1, 1, 0], [1, 0, 0]]: masked sum = 1 + 2 + 4 = 7 over 3 tokens;
    # per-seq sums [3, 4] → mean 3.5; per-seq means [1.5, 4] → 2.75; constant C = 10 → 0.7.
    lm, m = t([[1, 2, 3], [4, 0, 0]]), t([[1, 1, 0], [1, 0, 0]])
    assert math.isclose(float(aggregate(lm, m, "token-mean")), 7 / 3)
    assert math.isclose(float(aggregate(lm, m, "seq-mean-token-sum")), 3.5)
    assert math.isclose(float(aggregate(lm, m, "seq-mean-token-mean")), 2.75)
    assert math.isclose(float(aggregate(lm, m, "seq-mean-token-sum-norm", scale_factor=10)), 0.7)
    assert math.isclose(float(aggregate(lm, m, "token-sum")), 7.0)


def test_kl_in_reward_and_adaptive_controller():
    # k1 = old − ref = [0.5, 0.1 | 0.2, (off-mask)]; β = 0.1 → rewards − 0.1·k1·m
    out = A.apply_kl_in_reward(t([[0, 1], [0, 0]]), t([[-1.0, -0.4], [-0.3, -9.0]]), t([[-1.5, -0.5], [-0.5, 0.0]]),
                               t([[1, 1], [1, 0]]), beta=0.1)
    torch.testing.assert_close(out.token_rewards, t([[-0.05, 0.99], [-0.02, 0.0]]))
    torch.testing.assert_close(out.mean_kl, t((0.3 + 0.2) / 2))  # mean of per-sequence masked means
    c = A.AdaptiveKLController(value=0.1, target=0.05, horizon=100)
    assert c.update(0.5, 10) == pytest.approx(0.1 * (1 + 0.2 * 10 / 100))  # error clipped at +0.2


def test_TV2_kl_estimators():
    lp, ref = t([-1.0, -0.2, -3.0, -30.0]), t([-1.5, -0.2, -1.0, -2.0])
    close(kl_penalty(lp, ref, "k1"), [0.5, 0, -2, -28])
    close(kl_penalty(lp, ref, "k2"), [0.125, 0, 2, 392])
    close(kl_penalty(lp, ref, "k3"), [0.106531, 0, 4.389056, 10.0])
    close(kl_penalty(lp, ref, "low_var_kl"), kl_penalty(lp, ref, "k3"))
    close(kl_penalty(lp, ref, "abs"), [0.5, 0, 2, 28])


def _tv3():
    lp = t([[-1.0, -0.5, -2.0], [-0.3, 0.0, -0.2]])
    old = t([[-1.2, -1.0, -1.0], [-0.5, -2.0, -0.2]])
    a = t([[1, 1, 1], [-0.5, -0.5, -0.5]])
    m = t([[1, 1, 1], [1, 1, 0]])
    return lp, old, a, m


def test_TV3_vanilla_loss_and_aggregation():
    lp, old, a, m = _tv3()
    out = ppo_clip_loss(lp, old, a, m, clip_low=0.2, clip_high=0.28, dual_clip=3.0)
    close(torch.exp(lp - old), [[1.221403, 1.648721, 0.367879], [1.221403, 7.389056, 1.0]])
    close(out.loss_mat, [[-1.221403, -1.28, -0.367879], [0.610701, 1.5, 0.0]])  # (1,2) is off-mask → 0
    close(aggregate(out.loss_mat, m, "token-mean"), -0.151716)
    close(aggregate(out.loss_mat, m, "seq-mean-token-sum"), -0.379290)
    close(aggregate(out.loss_mat, m, "seq-mean-token-mean"), 0.049462)
    close(aggregate(out.loss_mat, m, "seq-mean-token-sum-norm"), -0.252860)
    close(aggregate(out.loss_mat, m, "seq-mean-token-sum-norm", scale_factor=3.0), -0.252860)
    # unmasked value of the off-mask token is 0.5 (= −A·1): check by widening the mask
    full = ppo_clip_loss(lp, old, a, torch.ones_like(m), clip_low=0.2, clip_high=0.28, dual_clip=3.0)
    close(full.loss_mat[1, 2], 0.5)
    # metrics: clipfrac = tokens with L2 > L1 among 5 valid: (0,1) ratio 1.6487 > 1.28 with A>0 → L2 > L1;
    # (1,1): −A·clip = 0.5·1.28 = 0.64 < L1 = 3.69 → not; (1,0): L2 = 0.6107 = L1 → not. → 1/5.
    close(out.metrics["pg_clipfrac"], 0.2)
    close(out.metrics["pg_clipfrac_lower"], 0.2)  # the dual-clipped token (1,1)


def test_32_dual_clip_k3_tis():
    lp = t([[-1.0, -0.5, -2.0], [-0.3, -1.2, -0.7]])
    old = t([[-1.2, -0.5, -1.0], [-0.3, -2.5, -0.2]])
    a = t([1.5, -0.8])
    m = t([[1, 1, 1], [1, 1, 0]])
    ref = t([[-1.1, -0.4, -1.5], [-0.5, -1.0, -0.9]])
    out = ppo_clip_loss(lp, old, a, m, dual_clip=3.0)
    close(torch.exp(lp - old), [[1.221403, 1.0, 0.367879], [1.0, 3.669297, 0.606531]])
    close(out.loss_mat, [[-1.8, -1.5, -0.551819], [0.8, 2.4, 0.0]])
    pg = aggregate(out.loss_mat, m, "token-mean")
    close(pg, -0.130364)
    k3 = kl_penalty(lp, ref, "k3")
    close(k3, [[0.004837, 0.005171, 0.148721], [0.018731, 0.021403, 0.018731]])
    close(aggregate(k3, m, "token-mean"), 0.039773)
    close(pg + 0.001 * aggregate(k3, m, "token-mean"), -0.130324)
    from megatron_rl.algorithms import tis_weights
    w = tis_weights(t([[-0.1, 0.0, 0.9]]), t([[0.0, 0.0, 0.0]]), t([[1, 1, 1]]))
    close(w, [[0.904837, 1.0, 2.0]])
