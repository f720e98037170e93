"""RLCSD: the contrastive signal e, the gated advantage Â, the two-path loss, hint selection
(boundary groups, K larger than the negatives, uniform sampling) and the teacher prompt template.

Spec vectors R1-R3 (../shared/specs/rlcsd_family_and_score.md §3.3), the registered kind and
independently derived cases."""
from __future__ import annotations

import math
import random

import pytest
import torch

import megatron_rl.algorithms as A
from megatron_rl.algorithms import (
    aggregate,
    hint_answer,
    last_boxed,
    rlcsd_advantage,
    rlcsd_loss,
    rlcsd_signal,
    rlcsd_teacher_prompt,
    select_rlcsd_hints,
    student_prompt,
)
from tests.helpers.algo_builders import D, close, t


def test_rlcsd_boundary_groups():
    # group 0: one correct (dropped, empty positive pool) + 3 boxed wrong (kept, positive = 0)
    # group 1: one boxed wrong (dropped, W empty) + 2 correct (kept, K = 1)
    # group 2: all correct → dropped; group 3: all wrong → dropped (self_rollout)
    rewards = [1, 0, 0, 0, 0, 1, 1, 1, 1, 0, 0]
    groups = [0, 0, 0, 0, 1, 1, 1, 2, 2, 3, 3]
    box = [True] * 11
    sel = select_rlcsd_hints(rewards, groups, box, rng=random.Random(3))
    by = {a.target: a for a in sel.assignments}
    assert sorted(by) == [1, 2, 3, 5, 6]
    assert all(by[i].positive == 0 for i in (1, 2, 3))
    assert sorted(by[1].negatives) == [2, 3] and by[5].negatives == (4,) and by[5].positive == 6
    assert sel.dropped_groups == 2 and sel.dropped_targets == 2
    gt = select_rlcsd_hints(rewards, groups, box, source="gt_cot")
    assert {a.target for a in gt.assignments} >= {9, 10, 0}  # all-wrong group kept under gt_cot
    assert all(a.positive is None for a in gt.assignments)


def test_rlcsd_sampling_is_uniform_over_the_pool():
    counts = {2: 0, 3: 0, 4: 0}
    rng = random.Random(0)
    for _ in range(3000):
        a = select_rlcsd_hints([1, 1, 0, 0, 0], [0] * 5, [True] * 5, k_max=1, rng=rng).assignments[0]
        counts[a.negatives[0]] += 1
    assert all(900 < c < 1100 for c in counts.values()), counts


def test_teacher_prompt_symmetry_and_answers():
    good = rlcsd_teacher_prompt("What is 2+2?", "2+2=4", "4")
    bad = rlcsd_teacher_prompt("What is 2+2?", "2+2=5", "5")
    assert good.startswith("Problem: What is 2+2?\n\n")
    assert "=== Reference Solution Begin ===" in good and "=== Reference Solution End ===" in good
    assert good.replace("2+2=4", "X").replace("answer: 4", "answer: Y") == \
        bad.replace("2+2=5", "X").replace("answer: 5", "answer: Y")
    assert "Correct final answer: 5" in bad  # wrong hints keep the same label
    assert good.endswith("\\boxed{}.") and student_prompt("Q").endswith("\\boxed{}.")
    assert student_prompt("Q").startswith("Problem: Q") and student_prompt("Q", train=False).startswith("Q")
    assert last_boxed(r"a \boxed{1} b \boxed{\frac{1}{2}} c") == r"\frac{1}{2}"
    assert hint_answer("no box here", "42") == "42" and hint_answer(r"\boxed{7}", "42") == "7"


def test_rlcsd_empty_paths_and_rows_without_negatives():
    lp = torch.zeros(1, 3, dtype=D)
    m = t([[1, 1, 0]])
    gate = torch.zeros(1, 3, dtype=torch.bool)  # empty selected path → contributes 0
    out = rlcsd_loss(lp, lp, t([0.5]), torch.zeros(1, 3, dtype=D), gate, m)
    assert float(aggregate(out.loss_mat, m, "token-sum")) == pytest.approx(-0.5)
    with pytest.raises(ValueError, match="row 1 has no valid negative"):
        rlcsd_signal(torch.zeros(2, 3), torch.zeros(2, 2, 3), torch.tensor([[True, False], [False, False]]))
    with pytest.raises(ValueError, match="unknown RLCSD hyper-parameter"):
        rlcsd_advantage(t([1.0]), torch.zeros(1, 3, dtype=D), m, temperature=1.0)


def test_k_larger_than_available_negatives():
    # group: 2 correct, 2 boxed incorrect, 1 unboxed incorrect; K_max = 4
    rewards, has_box = [1, 1, 0, 0, 0], [True, True, True, True, False]
    sel = select_rlcsd_hints(rewards, [0] * 5, has_box, k_max=4)
    by_target = {a.target: a for a in sel.assignments}
    assert sorted(by_target) == [0, 1, 2, 3, 4]
    assert sorted(by_target[0].negatives) == [2, 3]          # K_i = |W_i| = 2 < 4
    assert by_target[2].negatives == (3,)                     # self excluded → K = 1
    assert by_target[4].negatives in ((2, 3), (3, 2))         # unboxed wrong: target, never a hint
    # the signal over padded K-slots uses only the valid ones: log-mean-exp of 2 values
    lc = torch.log(t([[0.6]]))
    lw = torch.log(t([[[0.2], [0.4], [0.9], [0.9]]]))
    e = rlcsd_signal(lc, lw, torch.tensor([[True, True, False, False]]))
    torch.testing.assert_close(e, torch.log(t([[2.0]])))  # 0.6 / mean(0.2, 0.4) = 2


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


def test_rlcsd_kind_reproduces_R1():
    lw = torch.zeros(2, 2, 4, dtype=D)
    lw[0, 0], lw[0, 1] = t([-0.60, -1.0005, -0.20, -3.00]), t([-0.50, -0.9990, -0.30, -2.00])
    lw[1, 0] = t([-0.68, -0.10, -1.50, 0.0])
    x = A.AlgoInputs(rewards=t([1, 0]), group_ids=torch.tensor([0, 0]), mask=t([[1, 1, 1, 1], [1, 1, 1, 0]]),
                     logp=torch.zeros(2, 4, dtype=D), old_logp=torch.zeros(2, 4, dtype=D),
                     teacher_logp=t([[-0.40, -1.00, -0.25, -1.00], [-0.70, -0.20, -1.40, 0.0]]),
                     teacher_neg_logp=lw, teacher_neg_mask=torch.tensor([[True, True], [True, False]]))
    obj = A.compute_policy_loss("rlcsd", x, t([2.474874, -0.353553]))
    torch.testing.assert_close(obj.loss, t(-3.609135), atol=1e-6, rtol=0)


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
