"""Test vectors of ../shared/specs/bicc_rcc_papo_and_verl_baselines.md §4 (float64, atol 1e-6)."""
from __future__ import annotations

import pytest
import torch

from megatron_rl.algorithms import (aggregate, bicc_advantage, dapo_overlong_penalty, grpo_advantage, kl_penalty,
                                    papo_components, ppo_clip_loss, rcc_advantage, rcc_delta,
                                    remax_token_advantage)

D = torch.float64


def t(x):
    return torch.tensor(x, dtype=D)


def close(a, b, atol=1e-6):
    torch.testing.assert_close(a, t(b) if not isinstance(b, torch.Tensor) else b, atol=atol, rtol=0)


def gid(n):
    return torch.zeros(n, dtype=torch.long)


T_B1 = [
    ([1, 0, 0, 0], [1.732051] + [-0.577350] * 3, [1.499997] + [-0.499999] * 3),
    ([1, 1, 0, 0], [1, 1, -1, -1], [0.866024] * 2 + [-0.866024] * 2),
    ([1, 1, 1, 0], [0.577350] * 3 + [-1.732051], [0.499999] * 3 + [-1.499997]),
    ([1, 1, 1, 1], [0] * 4, [0] * 4),
    ([1, 0, 0, 0, 0, 0, 0, 0], [2.645751] + [-0.377964] * 7, [2.474867] + [-0.353552] * 7),
]


@pytest.mark.parametrize("r,bicc,verl", T_B1, ids=["1of4", "2of4", "3of4", "4of4", "1of8"])
def test_TB1_bicc_vs_verl_grpo(r, bicc, verl):
    close(bicc_advantage(t(r), gid(len(r))), bicc)
    close(grpo_advantage(t(r), gid(len(r))), verl)
    close(grpo_advantage(t(r), gid(len(r)), scale="std_pop"), bicc)  # contrastive = population-std GRPO


def test_TB2_margin_identity():
    r = t([1, 1, 0, 0, 0, 0, 0, 0])
    rho = t([1.2, 1.0, 1.0, 0.9, 0.8, 1.0, 1.1, 0.8])
    a = bicc_advantage(r, gid(8))
    close((a * rho).mean(), 0.0721688)
    close((a * rho).mean(), (12 ** 0.5) / 8 * (1.1 - 0.9333333333333333))


T_B3 = [
    ([1, 0, 1, 0], [0.3, -0.1, 0.2, 0.0], [0.606217, -1.125831, 0.606217, -1.125831], [0.7, -1.3, 0.7, -1.3],
     [0.35, -0.65, 0.35, -0.65]),
    ([1, 0, 0, 0], [0.4, 0.1, 0.0, -0.1], [1.199998] + [-0.799998] * 3, [1.385641] + [-0.923760] * 3, None),
    ([1, 1, 1, 0, 0, 0, 0, 0], [0.30, 0.20, 0.25, 0.05, 0.00, -0.05, 0.10, 0.00],
     [0.999299] * 3 + [-0.932881] * 5, [1.068298] * 3 + [-0.997293] * 5, None),
]


@pytest.mark.parametrize("r,d,verl,pop,dr", T_B3, ids=["2of4", "1of4", "3of8"])
def test_TB3_rcc_given_delta(r, d, verl, pop, dr):
    close(rcc_advantage(t(r), t(d), gid(len(r)), base="grpo"), verl)
    close(rcc_advantage(t(r), t(d), gid(len(r)), base="bicc"), pop)
    if dr is not None:
        close(rcc_advantage(t(r), t(d), gid(len(r)), base="drgrpo"), dr)


def test_TB3_constant_delta_and_all_correct():
    r = t([1, 1, 0, 0])
    close(rcc_advantage(r, t([0.5] * 4), gid(4)), grpo_advantage(r, gid(4)))
    close(rcc_advantage(t([1, 1, 1, 1]), t([0.1, 0.2, 0.3, 0.4]), gid(4)), [0] * 4)


def _tb4():
    old = [[-0.1, -0.2, -0.05], [-0.5, -0.4], [-0.2, -0.1, -0.1, -0.3], [-0.6, -0.7]]
    ref = [[-0.2, -0.3, -0.1], [-0.5, -0.3], [-0.3, -0.1, -0.2, -0.3], [-0.5, -0.6]]
    T = 4
    o, f, m = torch.zeros(4, T, dtype=D), torch.zeros(4, T, dtype=D), torch.zeros(4, T, dtype=D)
    for i, (a, b) in enumerate(zip(old, ref)):
        o[i, :len(a)], f[i, :len(b)], m[i, :len(a)] = t(a), t(b), 1
    o[1, 2:] = 7.0  # garbage off-mask must not leak into δ
    return o, f, m


@pytest.mark.parametrize("mode,delta,adv", [
    ("sum", [0.25, -0.10, 0.20, -0.20], [0.541265, -1.190783, 0.541265, -1.190783]),
    ("mean", [0.083333, -0.05, 0.05, -0.10], [0.743337, -0.988711, 0.743337, -0.988711]),
])
def test_TB4_delta_from_token_logprobs(mode, delta, adv):
    o, f, m = _tb4()
    d = rcc_delta(o, f, m, mode)
    close(d, delta)
    close(rcc_advantage(t([1, 0, 1, 0]), d, gid(4)), adv)


T_P = [  # (outcome, process, correct or None, lam, A_out, A_proc, A_total)
    ("P1", [1, 1, 1, 0], [1, 0.5, 1, 0], None, 1.0, [0.499999] * 3 + [-1.499997],
     [0.577348, -1.154697, 0.577348, 0], [1.077347, -0.654698, 1.077347, -1.499997]),
    ("P1-lam0.6", [1, 1, 1, 0], [1, 0.5, 1, 0], None, 0.6, None, None, [0.846408, -0.192819, 0.846408, -1.499997]),
    ("P2", [1, 1, 1, 1], [1, 0.5, 0.5, 0], None, 1.0, [0] * 4, [1.224742, 0, 0, -1.224742],
     [1.224742, 0, 0, -1.224742]),
    ("P3a", [1, 0, 0, 0], [1, 0, 0, 0], None, 1.0, None, [0] * 4, [1.499997] + [-0.499999] * 3),
    ("P3b", [1, 1, 0, 0], [1, 1, 0, 0], None, 1.0, None, [0] * 4, [0.866024] * 2 + [-0.866024] * 2),
    ("P3c", [1, 1, 0, 0], [1, 0.5, 0, 0], None, 1.0, None, [0.707105, -0.707105, 0, 0],
     [1.573129, 0.158919, -0.866024, -0.866024]),
    ("P4", [1, 1, 1, 1, 0, 0, 0, 0], [1, 1, 0.5, 0, 0, 0, 0, 0], None, 1.0, [0.935413] * 4 + [-0.935413] * 4,
     [0.783348, 0.783348, -0.261116, -1.305580] + [0] * 4, [1.718760, 1.718760, 0.674297, -0.370167] + [-0.935413] * 4),
    ("P5-dapo", [1, 0.6, 1, 0], [1, 0.5, 1, 0], [True, True, True, False], 1.0,
     [0.740611, -0.105802, 0.740611, -1.375421], [0.577348, -1.154697, 0.577348, 0],
     [1.317960, -1.260498, 1.317960, -1.375421]),
]


@pytest.mark.parametrize("case", T_P, ids=[c[0] for c in T_P])
def test_TP_papo(case):
    _, ro, rp, c, lam, a_out, a_proc, total = case
    out = papo_components(t(ro), t(rp), None if c is None else torch.tensor(c), gid(len(ro)), lam=lam)
    close(out.total, total)
    if a_out is not None:
        close(out.outcome, a_out)
    if a_proc is not None:
        close(out.process, a_proc)


def test_TP5_fullnorm_mult_prm_only():
    out = papo_components(t([1, 1, 1, 0]), t([1, 0.5, 1, 0]), None, gid(4), process_norm="full")
    close(out.process, [0.783348, -0.261116, 0.783348, -1.305580])
    close(out.total, [1.283347, 0.238883, 1.283347, -2.805577])
    mult = grpo_advantage(t([1, 1, 1, 0]) * t([1, 0.5, 1, 0]), gid(4))
    close(mult, [0.783348, -0.261116, 0.783348, -1.305580])
    close(grpo_advantage(t([1, 0.5, 1, 0]), gid(4)), mult)  # PRM-only


def test_TV1_grpo_drgrpo_singleton():
    r = t([0.5, 1.0, 0.0, 0.25])
    close(grpo_advantage(r, gid(4)), [0.146385, 1.317462, -1.024693, -0.439154])
    close(grpo_advantage(r, gid(4), scale="none"), [0.0625, 0.5625, -0.4375, -0.1875])
    close(grpo_advantage(t([1.0]), gid(1)), [0.999999])


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


def test_TV4_remax_token_returns():
    out = remax_token_advantage(t([[0, -0.01, 0.98, 0]]), t([0.5]), t([[1, 1, 1, 0]]))
    close(out.returns, [[0.97, 0.97, 0.98, 0]])
    close(out.advantages, [[0.47, 0.47, 0.48, 0]])


@pytest.mark.parametrize("lmax,buf,lengths,expected", [
    (3072, 1700, [1000, 1372, 2000, 3072], [0, 0, -0.369412, -1.0]),
    (8192, 4096, [4096, 6144, 8192], [0, -0.5, -1.0]),
])
def test_TV5_dapo_overlong(lmax, buf, lengths, expected):
    close(dapo_overlong_penalty(torch.tensor(lengths), lmax, buf), expected)


def test_TB5_released_dpo_variant_sign_is_not_reproduced():
    """T-B5 documents the sign issue of the released ``format_grpo_as_contrastive``; we recompute
    its numbers here (test-only, from the spec's description) and check that our BiCC estimator
    gives correct samples positive advantages instead."""
    r = t([1, 0, 1, 0])
    s, s_ref = t([-50, -60, -55, -40]), t([-52, -58, -55, -45])
    delta = (s - torch.logsumexp(s, 0)) - (s_ref - torch.logsumexp(s_ref, 0))
    beta, adv, cnt = 0.1, torch.zeros(4, dtype=D), torch.zeros(4, dtype=D)
    for i in (0, 2):
        for j in (1, 3):
            g = torch.sigmoid(beta * (delta[i] - delta[j])) - 1
            adv[i] += beta * g
            adv[j] -= beta * g
            cnt[i] += 1
            cnt[j] += 1
    close(adv / cnt, [-0.048788, 0.042574, -0.053631, 0.059845])
    ours = bicc_advantage(r, gid(4))
    assert bool((ours[r > 0.5] > 0).all()) and bool((ours[r < 0.5] < 0).all())
