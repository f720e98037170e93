"""Test vectors of ../shared/specs/rlcsd_family_and_score.md Part 3 (float64, atol 1e-6)."""
from __future__ import annotations

import math

import pytest
import torch

from megatron_rl.algorithms import (aggregate, first_eos_mask, generalized_jsd, grpo_advantage, kl_penalty,
                                    opsd_ectr_loss, opsd_loss, plain_clip_loss, ppo_clip_loss, rlcsd_advantage,
                                    rlcsd_loss, rlcsd_signal, rlsd_advantage, rlsd_ectr_advantage, rlsd_lambda,
                                    score_loss_mat, score_stage1_loss, score_stage2_loss, sdpo_loss, shaped_reward,
                                    srpo_loss, topk_tail_support)
from megatron_rl.algorithms.distill import is_weight

D = torch.float64


def t(x):
    return torch.tensor(x, dtype=D)


def close(a, b, atol=1e-6):
    torch.testing.assert_close(a, t(b) if not isinstance(b, torch.Tensor) else b, atol=atol, rtol=0)


@pytest.mark.parametrize("r,a", [
    ([1, 0, 0, 0, 0, 0, 0, 0], [2.474867] + [-0.353552] * 7),
    ([1, 1, 1, 1, 0, 0, 0, 0], [0.935413] * 4 + [-0.935413] * 4),
    ([1, 1, 1, 1, 1, 1, 1, 0], [0.353552] * 7 + [-2.474867]),
    ([1] * 8, [0] * 8),
    ([0.25, 0.75, 1.0, 0.0], [-0.547721, 0.547721, 1.095443, -1.095443]),
], ids=["1of8", "4of8", "7of8", "all", "graded"])
def test_31_grpo(r, a):
    close(grpo_advantage(t(r), torch.zeros(len(r), dtype=torch.long)), a)


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


def _r1():
    mask = t([[1, 1, 1, 1], [1, 1, 1, 0]])
    lc = t([[-0.40, -1.00, -0.25, -1.00], [-0.70, -0.20, -1.40, 0.0]])
    lw = torch.zeros(2, 2, 4, dtype=D)
    lw[0, 0] = t([-0.60, -1.0005, -0.20, -3.00])
    lw[0, 1] = t([-0.50, -0.9990, -0.30, -2.00])
    lw[1, 0] = t([-0.68, -0.10, -1.50, 0.0])
    lw[1, 1] = 123.0  # invalid slot: must be ignored
    nm = torch.tensor([[True, True], [True, False]])
    a = t([2.474874, -0.353553])
    return mask, lc, lw, nm, a


def test_33_R1_signal_and_loss():
    mask, lc, lw, nm, a = _r1()
    e = rlcsd_signal(lc, lw, nm)
    close(lc - e, [[-0.548751, -0.999750, -0.248751, -2.379885], [-0.68, -0.10, -1.50, 0.0]])
    close(e, [[0.148751, -0.000250, -0.001249, 1.379885], [-0.02, -0.10, 0.10, 0.0]])
    close(torch.tanh(e / 0.02), [[0.999999, -0.012513, -0.062393, 1.0], [-0.761594, -0.999909, 0.999909, 0]])
    mod = rlcsd_advantage(a, e, mask)
    close(mod.residual, [[0.5, -0.006257, -0.031196, 0.5], [-0.380797, -0.499955, 0.499955, 0]])
    assert mod.gate.tolist() == [[True, False, True, True], [True, True, True, False]]
    sel = mod.gate
    close(mod.adv_hat[sel], [2.974874, 2.443678, 2.974874, -0.734350, -0.853508, 0.0])
    lp = torch.zeros(2, 4, dtype=D, requires_grad=True)
    out = rlcsd_loss(lp, lp.detach(), a, mod.adv_hat, mod.gate, mask)
    loss = aggregate(out.loss_mat, mask, "token-sum")
    close(loss, -3.609135)
    close(out.metrics["rlcsd_loss_non"], -2.474874)
    close(out.metrics["rlcsd_loss_sel"], -1.134261)
    loss.backward()
    close(lp.grad, [[-0.495812, -2.474874, -0.407280, -0.495812], [0.122392, 0.142251, 0, 0]])
    # the gate threshold: |e| > τ·atanh(δ/(βλ))
    assert math.isclose(0.02 * math.atanh(0.04), 0.000800427, abs_tol=1e-9)


def test_33_R2_off_policy_tis():
    mask, lc, lw, nm, a = _r1()
    mod = rlcsd_advantage(a, rlcsd_signal(lc, lw, nm), mask)
    lp = t([[-0.5, -1.0, -0.2, -2.0], [-0.7, -0.1, -1.5, 0.0]])
    old = t([[-0.8, -1.0, -0.2, -1.5], [-0.4, -0.1, -1.0, 0.0]])
    w = t([[1, 2, 0.5, 1], [1, 1, 1.2, 0]])
    close(torch.exp(lp - old), [[1.349859, 1, 1, 0.606531], [0.740818, 1, 0.606531, 1]])
    out = rlcsd_loss(lp, old, a, mod.adv_hat, mod.gate, mask, tis_weights=w)
    # per-token ℓ^sel (before the 1/N_sel share) = loss_mat·N_sel on selected tokens
    close(out.loss_mat[mod.gate] * 6, [-3.569848, -1.221839, -1.804352, 0.587480, 0.853508, 0.0])
    close(out.metrics["rlcsd_loss_non"], -4.949748)
    close(out.metrics["rlcsd_loss_sel"], -0.859175)
    close(aggregate(out.loss_mat, mask, "token-sum"), -5.808923)
    # the same number from the two paths with their own token-mean (global-normaliser form)
    from megatron_rl.algorithms import rlcsd_paths
    p = rlcsd_paths(lp, old, a, mod.adv_hat, mod.gate, mask, tis_weights=w)
    close(aggregate(p.loss_non, p.mask_non, "token-mean") + aggregate(p.loss_sel, p.mask_sel, "token-mean"),
          -5.808923)


def test_33_R3_sign_clamp_and_zero_adv():
    lc = t([[-1.0, -0.5, -0.7], [-0.3, -0.3, -0.3]])
    lw = t([[-0.5, -0.5, -0.7], [-0.9, -0.3, -0.2]])[:, None]
    mask = torch.ones(2, 3, dtype=D)
    e = rlcsd_signal(lc, lw, torch.ones(2, 1, dtype=torch.bool))
    close(e, [[-0.5, 0, 0], [0.6, 0, -0.1]])
    a = t([0.3, 0.0])
    mod = rlcsd_advantage(a, e, mask)
    close(mod.residual, [[-0.5, 0, 0], [0.5, 0, -0.499955]])
    assert mod.gate.tolist() == [[True, False, False], [True, False, True]]
    close(mod.adv_hat[mod.gate], [0.0, 0.0, 0.0])
    lp = torch.zeros(2, 3, dtype=D)
    out = rlcsd_loss(lp, lp, a, mod.adv_hat, mod.gate, mask)
    close(out.metrics["rlcsd_loss_non"], -0.2)
    close(out.metrics["rlcsd_loss_sel"], 0.0)
    close(aggregate(out.loss_mat, mask, "token-sum"), -0.2)


TEACHER = [[2, 1, 0.5, -1, -2], [0, 3, 0, -1, 1]]
STUDENT = [[1, 1.5, 0, 0, -1], [0.5, 2, 0.5, 0, 0.5]]


def test_34_opsd():
    pt, ps = topk_tail_support(t(TEACHER), t(STUDENT), k=3)
    # spec: row 1 → [1, 4, 2]; indices 0 and 2 tie (logit 0 in both models), we pick 0: same values
    idx = torch.sort(t(TEACHER), descending=True, stable=True).indices[:, :3]
    assert idx.tolist() == [[0, 1, 2], [1, 4, 0]]
    close(pt, torch.log(t([[0.602732, 0.221733, 0.134488, 0.041048], [0.797941, 0.107990, 0.039727, 0.054342]])),
          atol=1e-5)
    close(ps.exp(), [[0.284106, 0.468411, 0.104517, 0.142966], [0.554101, 0.123637, 0.123637, 0.198626]])
    close(pt.exp() * (pt - ps), [[0.453330, -0.165828, 0.033908, -0.051222],
                                 [0.291000, -0.014612, -0.045103, -0.070434]])
    mask = torch.ones(2, 1, dtype=D)
    out = opsd_loss(ps[:, None], pt[:, None], mask)
    close(out.loss_mat[:, 0], [-0.133143, -0.080149])
    close(opsd_loss(ps[:, None], pt[:, None], mask, clip=1e9).loss_mat[:, 0], [0.270188, 0.160851])
    close(aggregate(out.loss_mat, mask, "token-mean"), -0.106646)


def test_35_sdpo():
    ps, pt = topk_tail_support(t(STUDENT), t(TEACHER), k=3)
    idx = torch.sort(t(STUDENT), descending=True, stable=True).indices[:, :3]
    assert idx.tolist() == [[1, 0, 2], [1, 0, 2]]  # spec's student top-3
    close(generalized_jsd(ps, pt, 0.5), [0.067689, 0.038209])
    close(generalized_jsd(ps, pt, 0.0), [0.270188, 0.141643])
    close(generalized_jsd(ps, pt, 1.0), [0.288682, 0.174487])
    lp, old = t([[-0.2], [-1.0]]), t([[-0.5], [-0.2]])
    close(is_weight(lp, old), [[1.349859], [0.449329]])
    mask = torch.ones(2, 1, dtype=D)
    out = sdpo_loss(ps[:, None], pt[:, None], lp, old, mask)
    close(aggregate(out.loss_mat, mask, "token-mean"), 0.054270)


def test_36_srpo():
    a = t([1.0, -1.0, 0.0])
    mask = t([[1, 1], [1, 0], [1, 1]])
    lp = t([[-0.5, -0.3], [-1.0, -2.0], [-0.4, -0.6]])
    old = t([[-0.7, -0.3], [-1.0, -2.0], [-0.4, -0.4]])
    jsd = t([[0.30, 0.10], [0.20, 0.50], [0.05, 0.40]])
    h = t([[1, 2], [0.5, 3], [1, 0]])
    out = srpo_loss(lp, old, a, mask, jsd, h)
    close(out.loss_mat[0], [-1.2, -1.0])
    # d on routed tokens, recovered as loss/(jsd·IS)
    close(out.loss_mat[1, 0] / 0.2, 0.921588)
    close(out.loss_mat[2, 0] / 0.05, 0.558971)
    close(out.loss_mat[2, 1] / (0.4 * math.exp(-0.2)), 1.519441)
    close(aggregate(out.loss_mat, mask, "token-mean"), -0.298026)


RLSD_A, RLSD_LP = [1.5, -0.5], [[-1.0, -0.2, -0.7], [-0.3, -2.0, -0.1]]


@pytest.mark.parametrize("lam,a_hat,loss", [
    (0.5, [[1.65, 1.428628, 1.5], [-0.55, -0.476209, -0.5]], -0.508736),
    (0.25, [[1.575, 1.464314, 1.5], [-0.525, -0.488105, -0.5]], -0.504368),
    (0.0, [[1.5] * 3, [-0.5] * 3], -0.5),
])
def test_37_rlsd(lam, a_hat, loss):
    lp, lt, m = t(RLSD_LP), t([[-0.5, -0.3, -0.7], [-1.0, -1.9, -0.1]]), torch.ones(2, 3, dtype=D)
    ah = rlsd_advantage(t(RLSD_A), lt, lp, lam=lam)
    close(ah, a_hat)
    close(aggregate(plain_clip_loss(lp, lp, ah, m).loss_mat, m, "token-mean"), loss)


def test_37_rlsd_schedule_and_off_policy():
    got = [rlsd_lambda(s, 0.5, 50, decay=True) for s in (1, 2, 26, 50, 51, 100)]
    assert got == pytest.approx([0.5, 0.49, 0.25, 0.01, 0, 0], abs=1e-12)
    assert rlsd_lambda(100, 0.5, 50, decay=False) == 0.5  # the reference runs' effective behaviour
    lp, lt, m = t(RLSD_LP), t([[-0.5, -0.3, -0.7], [-1.0, -1.9, -0.1]]), torch.ones(2, 3, dtype=D)
    old = t([[-1.3, -0.2, -0.7], [-0.3, -1.5, -0.1]])
    out = plain_clip_loss(lp, old, rlsd_advantage(t(RLSD_A), lt, lp, lam=0.5), m)
    close(out.loss_mat, [[-1.98, -1.428628, -1.5], [0.55, 0.380967, 0.5]])
    close(aggregate(out.loss_mat, m, "token-mean"), -0.579610)


def test_38_rlsd_ectr():
    lc = t([[-0.5, -0.3, -0.7], [-1.0, -1.9, -0.1]])
    lw = t([[-0.6, -100, -0.2], [-0.2, -2.0, -0.1]])
    ah = rlsd_ectr_advantage(t(RLSD_A), lc, lw, lam=0.5)
    close(ah, [[1.578878, 1.65, 1.35], [-0.55, -0.476209, -0.5]])
    lp, m = t(RLSD_LP), torch.ones(2, 3, dtype=D)
    close(aggregate(plain_clip_loss(lp, lp, ah, m).loss_mat, m, "token-mean"), -0.508778)


def test_39_opsd_ectr():
    wrong = [[1, 2, 0.5, -1, -2], TEACHER[1]]
    pc, pw, ps = topk_tail_support(t(TEACHER), t(wrong), t(STUDENT), k=3)
    close(pw[0].exp(), [0.221733, 0.602732, 0.134488, 0.041048])
    mask = torch.ones(2, 1, dtype=D)
    out = opsd_ectr_loss(ps[:, None], pc[:, None], pw[:, None], mask)
    q0 = torch.softmax(1.5 * pc[0] - 0.5 * torch.clamp(pw[0], min=-5.0), -1)
    close(q0, [0.762209, 0.103154, 0.103154, 0.031484])
    no_w = opsd_ectr_loss(ps[:, None], pc[:, None], pw[:, None], mask, cw_tau=0.0)
    close(no_w.loss_mat[:, 0], [-0.155078, -0.080149])
    close(out.metrics["ectr_weight"], (0.275887 + 0) / 2)
    close(aggregate(out.loss_mat, mask, "token-mean"), -0.021392)


def _score_inputs():
    lp1 = t([[-0.5, -1.0, -0.2, 0.0], [-0.1, -0.3, -2.0, -0.4]])
    ref1 = t([[-0.7, -1.0, -0.1, 0.0], [-0.1, -0.2, -1.0, -0.9]])
    m1 = t([[1, 1, 1, 0], [1, 1, 1, 1]])
    lp2 = t([[-0.2, -0.6, -0.4, -0.3], [-1.0, -0.5, 0, 0]])
    ref2 = t([[-0.3, -0.6, -0.5, -0.3], [-0.8, -0.9, 0, 0]])
    m2 = t([[1, 1, 1, 1], [1, 1, 0, 0]])
    return lp1, ref1, m1, lp2, ref2, m2, t([0.5, 0.25]), t([1.0, 0.25])


def test_310_score_sequence_mode():
    lp1, ref1, m1, lp2, ref2, m2, r1, r2 = _score_inputs()
    lp1.requires_grad_(True)
    lp2.requires_grad_(True)
    from megatron_rl.algorithms import score_k3
    close(score_k3(lp1, ref1) * m1, [[0.018731, 0, 0.005171, 0], [0, 0.005171, 0.718282, 0.106531]])
    close(score_k3(lp2, ref2) * m2, [[0.004837, 0, 0.004837, 0], [0.021403, 0.070320, 0, 0]])
    close(shaped_reward(r1, r2), [6.0, 0.25])
    l1 = score_stage1_loss(lp1, ref1, m1, lp2, m2, r2)
    close(l1, 0.292023)
    g1 = torch.autograd.grad(l1, lp1)[0]
    close(g1, [[0.003021, 0, -0.001753, 0], [0, -0.001315, -0.021479, 0.004918]])
    l2 = score_stage2_loss(lp1, ref1, m1, lp2, ref2, m2, r1, r2)
    close(l2, 1.449235)
    g2 = torch.autograd.grad(l2, lp2)[0]
    close(g2, [[-0.749881, -0.75, -0.749881, -0.75], [-0.063054, -0.061676, 0, 0]])
    # the per-token matrix form aggregates to the same scalars
    out = score_loss_mat(1, lp1, ref1, m1, lp2, ref2, m2, r1, r2)
    close(aggregate(out.loss_mat, out.mask, "seq-mean-token-sum"), 0.292023)


def test_310_score_constant_mode():
    lp1, ref1, m1, lp2, ref2, m2, r1, r2 = _score_inputs()
    kw = dict(length_norm="constant", max_new=(4, 4))
    close(score_stage1_loss(lp1, ref1, m1, lp2, m2, r2, **kw), 0.245049)
    close(score_stage2_loss(lp1, ref1, m1, lp2, ref2, m2, r1, r2, **kw), 1.366819)


def test_310_eos_mask():
    ids = torch.tensor([[5, 7, 2, 2, 2], [5, 7, 9, 4, 2], [5, 7, 2, 0, 0]])
    assert first_eos_mask(ids, 2, quirk=True).long().tolist() == [[1, 1, 1, 0, 0], [1] * 5, [1] * 5]
    assert first_eos_mask(ids, 2).long().tolist() == [[1, 1, 1, 0, 0], [1] * 5, [1, 1, 1, 0, 0]]
