"""Independently derived cases (derivations in the comments; not taken from the spec tables)."""
from __future__ import annotations

import math

import torch

from megatron_rl.algorithms import (aggregate, bicc_advantage, grpo_advantage, kl_penalty, papo_advantage,
                                    ppo_clip_loss, rcc_advantage, rlcsd_advantage, rlcsd_signal, rloo_advantage,
                                    shaped_reward)

D = torch.float64


def t(x):
    return torch.tensor(x, dtype=D)


def test_rloo_three_samples():
    # r = [1, 0, 0]: A_0 = 1 − (0+0)/2 = 1; A_1 = 0 − (1+0)/2 = −0.5; A_2 = −0.5.
    torch.testing.assert_close(rloo_advantage(t([1, 0, 0]), torch.zeros(3, dtype=torch.long)), t([1, -0.5, -0.5]))


def test_grpo_interleaved_groups():
    # ids [7,3,7,3], r [1,0,0,1]: each group {1,0}: mean 0.5, std_u = sqrt(((.5)²+(.5)²)/1) = 0.707107;
    # A = ±0.5/(0.7071068 + 1e-6) = ±0.7071058.
    a = grpo_advantage(t([1, 0, 0, 1]), torch.tensor([7, 3, 7, 3]))
    v = 0.5 / (math.sqrt(0.5) + 1e-6)
    torch.testing.assert_close(a, t([v, -v, -v, v]))


def test_bicc_pair_is_plus_minus_one():
    # G = 2, one of each: n+ = n− = 1 → A = ±sqrt(1/1); the objective is ρ+ − ρ− (spec §1.2 with G = 2 …
    # (1/G)ΣAρ = (ρ+ − ρ−)/2 = sqrt(1·1)/2·(ρ+ − ρ−)).
    torch.testing.assert_close(bicc_advantage(t([0, 1]), torch.zeros(2, dtype=torch.long)), t([-1, 1]))


def test_rcc_two_samples_closed_form():
    # r = [1, 0], δ = [a, b]: r − r̄ = [½, −½], δ − δ̄ = [(a−b)/2, (b−a)/2] → Cov = (a−b)/4,
    # b_RCC = ½ + (a−b)/2. With a = 0.4, b = 0: Cov 0.1, baseline 0.7 → Dr.GRPO A = [0.3, −0.7];
    # std_p = ½ → A = [0.6, −1.4].
    g = torch.zeros(2, dtype=torch.long)
    torch.testing.assert_close(rcc_advantage(t([1, 0]), t([0.4, 0.0]), g, base="drgrpo"), t([0.3, -0.7]))
    torch.testing.assert_close(rcc_advantage(t([1, 0]), t([0.4, 0.0]), g, base="bicc"), t([0.6, -1.4]))
    # group sum is −2·G·Cov/s (spec property): −2·2·0.1/1 = −0.4
    assert math.isclose(float(rcc_advantage(t([1, 0]), t([0.4, 0.0]), g, base="drgrpo").sum()), -0.4)


def test_papo_three_correct_graded():
    # all correct → A_out = 0; process [1, .5, 0]: mean .5, std_u = sqrt((.25+0+.25)/2) = .5
    # → A_proc = [.5/(.5+1e-6), 0, −.5/(.5+1e-6)] = [0.999998, 0, −0.999998].
    a = papo_advantage(t([1, 1, 1]), t([1, 0.5, 0]), None, torch.zeros(3, dtype=torch.long))
    v = 0.5 / (0.5 + 1e-6)
    torch.testing.assert_close(a, t([v, 0, -v]))


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


def test_rlcsd_mixture_of_two_negatives():
    # ℓw = log .2, log .4 → uniform mixture log .3; ℓc = log .6 → e = log 2 = 0.693147;
    # tanh(0.693/0.02) ≈ 1 → r = βλ = 0.5; correct target A = 1 → Â = 1.5; wrong target A = −1 →
    # Ã = −0.5 → Â = −0.5.
    lc = torch.log(t([[0.6], [0.6]]))
    lw = torch.log(t([[[0.2], [0.4]], [[0.2], [0.4]]]))
    e = rlcsd_signal(lc, lw, torch.ones(2, 2, dtype=torch.bool))
    torch.testing.assert_close(e, torch.full((2, 1), math.log(2.0), dtype=D))
    mod = rlcsd_advantage(t([1.0, -1.0]), e, torch.ones(2, 1, dtype=D))
    torch.testing.assert_close(mod.adv_hat, t([[1.5], [-0.5]]))


def test_score_shaped_reward_can_be_negative():
    # r1 = 1, r2 = 0.5, α = 10: r̃2 = 0.5 + 10·(−0.5) = −4.5 (spec §2.4 example).
    torch.testing.assert_close(shaped_reward(t([1.0]), t([0.5])), t([-4.5]))


def test_aggregate_hand_computed():
    # L = [[1, 2, 3], [4, 0, 0]], m = [[1, 1, 0], [1, 0, 0]]: masked sum = 1 + 2 + 4 = 7 over 3 tokens;
    # per-seq sums [3, 4] → mean 3.5; per-seq means [1.5, 4] → 2.75; constant C = 10 → 0.7.
    lm, m = t([[1, 2, 3], [4, 0, 0]]), t([[1, 1, 0], [1, 0, 0]])
    assert math.isclose(float(aggregate(lm, m, "token-mean")), 7 / 3)
    assert math.isclose(float(aggregate(lm, m, "seq-mean-token-sum")), 3.5)
    assert math.isclose(float(aggregate(lm, m, "seq-mean-token-mean")), 2.75)
    assert math.isclose(float(aggregate(lm, m, "seq-mean-token-sum-norm", scale_factor=10)), 0.7)
    assert math.isclose(float(aggregate(lm, m, "token-sum")), 7.0)
