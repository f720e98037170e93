"""SCoRe: shaped reward, the stage-1 / stage-2 losses (sequence and constant length norm), the
first-EOS mask, the registered kind, and the answer extraction / matching its rewards use.

Spec vectors §3.10 (../shared/specs/rlcsd_family_and_score.md) and the reference-order edges."""
from __future__ import annotations

import pytest
import torch

import megatron_rl.algorithms as A
from megatron_rl.algorithms import (
    aggregate,
    first_eos_mask,
    score_loss_mat,
    score_stage1_loss,
    score_stage2_loss,
    shaped_reward,
)
from megatron_rl.rewards.extract import gsm8k_hash, math_final_answer
from megatron_rl.rewards.format import format_and_match, strict_format_and_match
from tests.helpers.algo_builders import close, t


def test_score_shaped_reward_can_be_negative():
    # r1 = 1, r2 = 0.5, α = 10: r̃2 = 0.5 + 10·(−0.5) = −4.5 (spec §2.4 example).
    torch.testing.assert_close(shaped_reward(t([1.0]), t([0.5])), t([-4.5]))


@pytest.mark.parametrize("text,want", [
    ("reasoning... #### 42 apples", "42"),          # the number after ####, not the rest of the line
    ("#### 1,234.", "1234"),
    ("<answer> 5., </answer>", "5."),                # reference order: strip '.' first, then commas
    ("<answer>1,234.</answer>", "1234"),
    ("no digits here", ""),
    ("<answer>7</answer> then #### 9", "7"),
])
def test_gsm8k_hash_reference_order(text, want):
    assert gsm8k_hash(text) == want


@pytest.mark.parametrize("text,want", [
    ("<answer>$\\boxed{42}$</answer>", "42"),
    ("<answer>\\[\\frac{1}{2}\\]</answer>", "\\frac{1}{2}"),
    ("first \\boxed{3} then \\boxed{4}", "3"),       # the FIRST box
    ("The final answer is $x+1$.", "x+1"),
    ("The final answer is: 3.5. Done", "3.5"),
    ("nothing", ""),
])
def test_math_final_answer(text, want):
    assert math_final_answer(text) == want


def test_match_is_plain_equality_empty_included():
    # reference: normalise(extract(pred)) == normalise(extract(target)); two empty extractions match
    assert format_and_match("no number", "none either") == 0.5
    assert strict_format_and_match("<think>a</think><answer>x</answer>", "<answer>X</answer>") == 1.0


def test_registered_math_extractor_variant():
    from megatron_rl.rewards.manager import get_reward

    assert get_reward("format_and_match_math")("<think>x</think><answer>\\boxed{12}</answer>", "\\boxed{12}") == 1.0
    assert get_reward("format_and_match")("<think>x</think><answer>12</answer>", "#### 12 eggs") == 1.0


@pytest.mark.parametrize("stage,expected", [(1, 0.292023), (2, 1.449235)])
def test_score_kind_reproduces_310(stage, expected):
    x = A.AlgoInputs(
        rewards=t([1.0, 0.25]), group_ids=torch.tensor([0, 1]), mask=t([[1, 1, 1, 1], [1, 1, 0, 0]]),
        logp=t([[-0.2, -0.6, -0.4, -0.3], [-1.0, -0.5, 0, 0]]), ref_logp=t([[-0.3, -0.6, -0.5, -0.3], [-0.8, -0.9, 0, 0]]),
        first_logp=t([[-0.5, -1.0, -0.2, 0.0], [-0.1, -0.3, -2.0, -0.4]]),
        first_ref_logp=t([[-0.7, -1.0, -0.1, 0.0], [-0.1, -0.2, -1.0, -0.9]]),
        first_mask=t([[1, 1, 1, 0], [1, 1, 1, 1]]), first_rewards=t([0.5, 0.25]))
    hp = A.ScoreHParams(stage=stage)
    adv = A.compute_advantages("score", x, hp)
    torch.testing.assert_close(A.compute_policy_loss("score", x, adv, hp).loss, t(expected), atol=1e-6, rtol=0)


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
