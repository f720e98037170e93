"""Distillation baselines: OPSD, SDPO, SRPO, RLSD and the _ectr variants (opsd_ectr, rlsd_ectr).

Spec vectors §3.4-3.9 (../shared/specs/rlcsd_family_and_score.md), the registered kinds, the
top-k support chooser per loss, and the edges where the reference code and ours could part
(SRPO's global weight, OPSD clip <= 0, RLSD λ schedule)."""
from __future__ import annotations

import math

import pytest
import torch

import megatron_rl.algorithms as A
from megatron_rl.algorithms import (
    aggregate,
    generalized_jsd,
    opsd_ectr_loss,
    opsd_loss,
    plain_clip_loss,
    rlsd_advantage,
    rlsd_ectr_advantage,
    rlsd_lambda,
    sdpo_loss,
    srpo_loss,
    topk_tail_support,
)
from megatron_rl.algorithms.distill import is_weight, opsd_token_loss, srpo_log_u_mean
from tests.helpers.algo_builders import D, close, t


def test_opsd_empty_mask():
    s = torch.log_softmax(torch.randn(2, 3, 4, dtype=D), -1)
    out = opsd_loss(s, s.flip(-1), torch.zeros(2, 3, dtype=D))
    assert float(aggregate(out.loss_mat, torch.zeros(2, 3), "token-mean")) == 0.0


def _srpo_batch(seed=0, n=8, t=5):
    g = torch.Generator().manual_seed(seed)
    logp = (-torch.rand(n, t, generator=g) * 3).requires_grad_()
    old = logp.detach() + 0.05 * torch.randn(n, t, generator=g)
    adv = torch.tensor([1.0, -1.0, 0.0, 0.5, -0.5, 0.0, 2.0, -2.0])[:n]
    mask = torch.ones(n, t)
    mask[1, 3:] = 0
    mask[5, 1:] = 0
    jsd = torch.rand(n, t, generator=g)
    ent = torch.rand(n, t, generator=g) * 4
    return logp, old, adv, mask, jsd, ent


def _token_mean(out, mask):
    return (out.loss_mat * mask).sum() / mask.sum()


def test_srpo_weight_is_global_so_micro_batching_does_not_matter():
    logp, old, adv, mask, jsd, ent = _srpo_batch()
    lum = srpo_log_u_mean(adv, mask, ent, beta=1.0)
    full = _token_mean(srpo_loss(logp, old, adv, mask, jsd, ent, log_u_mean=lum), mask)
    parts = sum((srpo_loss(logp[s], old[s], adv[s], mask[s], jsd[s], ent[s], log_u_mean=lum).loss_mat * mask[s]).sum()
                for s in (slice(0, 3), slice(3, 8))) / mask.sum()
    assert torch.allclose(full, parts, atol=1e-7)
    # the reference normalises per micro-batch: a different number whenever the routed sets differ
    ref = sum((srpo_loss(logp[s], old[s], adv[s], mask[s], jsd[s], ent[s]).loss_mat * mask[s]).sum()
              for s in (slice(0, 3), slice(3, 8))) / mask.sum()
    assert not torch.allclose(full, ref, atol=1e-4)


def test_srpo_log_u_mean_formula():
    _, _, adv, mask, _, ent = _srpo_batch()
    routed = [(i, j) for i in range(8) for j in range(5) if mask[i, j] > 0 and not adv[i] > 0]
    u = [math.exp(-0.7 * float(ent[i, j])) for i, j in routed]
    assert float(srpo_log_u_mean(adv, mask, ent, beta=0.7)) == pytest.approx(math.log(sum(u) / len(u)), rel=1e-6)
    assert float(srpo_log_u_mean(torch.ones(8), mask, ent)) == 0.0    # nothing routed


@pytest.mark.parametrize("clip", [0.0, -1.0])
def test_opsd_clip_le_zero_means_no_clip(clip):
    g = torch.Generator().manual_seed(1)
    s = torch.log_softmax(torch.randn(2, 3, 4, generator=g), -1)
    t = torch.log_softmax(3 * torch.randn(2, 3, 4, generator=g), -1)
    unclipped = (t.exp() * (t - s)).sum(-1)
    assert torch.allclose(opsd_token_loss(s, t, clip), unclipped)
    assert not torch.allclose(opsd_token_loss(s, t, 0.05), unclipped)


@pytest.mark.parametrize("step,want", [(0, 0.5), (1, 0.5), (2, 0.49), (26, 0.25), (51, 0.0), (None, 0.5)])
def test_rlsd_lambda_never_exceeds_lambda0(step, want):
    assert rlsd_lambda(step, 0.5, 50, decay=True) == pytest.approx(want)


def test_rlsd_kind_reproduces_37_with_and_without_decay():
    base = dict(rewards=t([1, 0]), group_ids=torch.tensor([0, 1]), mask=torch.ones(2, 3, dtype=D),
                logp=t([[-1.0, -0.2, -0.7], [-0.3, -2.0, -0.1]]), old_logp=t([[-1.0, -0.2, -0.7], [-0.3, -2.0, -0.1]]),
                teacher_logp=t([[-0.5, -0.3, -0.7], [-1.0, -1.9, -0.1]]))
    adv = t([1.5, -0.5])
    obj = A.compute_policy_loss("rlsd", A.AlgoInputs(**base, step=26), adv)
    torch.testing.assert_close(obj.loss, t(-0.508736), atol=1e-6, rtol=0)  # constant λ = 0.5 by default
    obj = A.compute_policy_loss("rlsd", A.AlgoInputs(**base, step=26), adv, A.RLSDHParams(lam_decay=True))
    torch.testing.assert_close(obj.loss, t(-0.504368), atol=1e-6, rtol=0)  # λ_26 = 0.25


def test_opsd_kind_reproduces_34():
    pt, ps = A.topk_tail_support(t([[2, 1, 0.5, -1, -2], [0, 3, 0, -1, 1]]),
                                 t([[1, 1.5, 0, 0, -1], [0.5, 2, 0.5, 0, 0.5]]), k=3)
    x = A.AlgoInputs(rewards=t([1, 0]), group_ids=torch.tensor([0, 0]), mask=torch.ones(2, 1, dtype=D),
                     student_topk=ps[:, None], teacher_topk=pt[:, None])
    torch.testing.assert_close(A.compute_policy_loss("opsd", x, torch.zeros(2, dtype=D)).loss, t(-0.106646),
                               atol=1e-6, rtol=0)


def test_distill_support_fields_pick_the_right_chooser():
    teacher = t([[[2, 1, 0.5, -1, -2], [0, 3, 0, -1, 1]]])
    student = t([[[1, 1.5, 0, 0, -1], [0.5, 2, 0.5, 0, 0.5]]])
    f = A.distill_support_fields("opsd", student, teacher, k=3)
    torch.testing.assert_close(f["teacher_topk"][0, 0, :3].exp(), t([0.602732, 0.221733, 0.134488]), atol=1e-6,
                               rtol=0)  # teacher's own top-3 = its three largest probabilities
    g = A.distill_support_fields("sdpo", student, teacher, teacher_neg_logits=teacher, k=3)
    torch.testing.assert_close(A.generalized_jsd(g["student_topk"], g["teacher_topk"])[0], t([0.067689, 0.038209]),
                               atol=1e-6, rtol=0)
    assert set(g) == {"student_topk", "teacher_topk", "teacher_neg_topk"}
    with pytest.raises(KeyError, match="valid"):
        A.distill_support_fields("rlsd", student, teacher)
    h = A.full_entropy(teacher)
    p = torch.softmax(teacher, -1)
    torch.testing.assert_close(h, -(p * p.log()).sum(-1))


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
