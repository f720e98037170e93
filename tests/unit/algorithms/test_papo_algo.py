"""PAPO: outcome + process advantages, reward-mode ablations, the grader's score parsing (T-P6).

Spec vectors T-P1..T-P6 (../shared/specs/bicc_rcc_papo_and_verl_baselines.md §4), independently
derived cases and the vectorised estimator against the per-group loop."""
from __future__ import annotations

import pytest
import torch

import megatron_rl.algorithms as A
from megatron_rl.algorithms import grpo_advantage, papo_advantage, papo_components
from megatron_rl.algorithms.reference import papo_loop
from megatron_rl.rewards.grader import parse_score
from tests.helpers.algo_builders import close, gid, random_batch, t


def _papo(mode: str) -> torch.Tensor:
    # spec T-P1 inputs: r_out = [1,1,1,0], r_proc = [1,0.5,1,0] (T-P5 ablations)
    x = A.AlgoInputs(rewards=torch.tensor([1.0, 1, 1, 0], dtype=torch.float64), group_ids=torch.zeros(4, dtype=torch.long),
                     mask=torch.ones(4, 2), process=torch.tensor([1.0, 0.5, 1, 0], dtype=torch.float64),
                     correct=torch.tensor([True, True, True, False]))
    return A.compute_advantages("papo", x, A.PAPOHParams(reward_mode=mode))


@pytest.mark.parametrize("mode", ["mult", "prm_only"])
def test_papo_ablations_spec_t_p5(mode):
    want = torch.tensor([0.783348, -0.261116, 0.783348, -1.305580], dtype=torch.float64)
    assert torch.allclose(_papo(mode), want, atol=1e-6)


def test_papo_reward_mode_validation():
    with pytest.raises(ValueError, match="reward_mode 'both' invalid"):
        A.PAPOHParams(reward_mode="both")


def test_papo_all_correct_uses_process_only_and_single_correct_reduces_to_grpo():
    g = torch.zeros(4, dtype=torch.long)
    out = papo_components(t([1, 1, 1, 1]), t([1, 1, 0.5, 0.5]), None, g)
    assert out.outcome.tolist() == [0] * 4 and out.process.abs().sum() > 0
    one = papo_components(t([1, 0, 0, 0]), t([0.5, 0, 0, 0]), None, g)
    torch.testing.assert_close(one.total, grpo_advantage(t([1, 0, 0, 0]), g))


def test_papo_three_correct_graded():
    # all correct → A_out = 0; process [1, .5, 0]: mean .5, std_u = sqrt((.25+0+.25)/2) = .5
    # → A_proc = [.5/(.5+1e-6), 0, −.5/(.5+1e-6)] = [0.999998, 0, −0.999998].
    a = papo_advantage(t([1, 1, 1]), t([1, 0.5, 0]), None, torch.zeros(3, dtype=torch.long))
    v = 0.5 / (0.5 + 1e-6)
    torch.testing.assert_close(a, t([v, 0, -v]))


@pytest.mark.parametrize("text,want", [
    ("…Score: \\boxed{0.5}", 0.5),
    ("Overall Score: 1. Final: \\boxed{0.7}", 1.0),
    ("first \\boxed{0} then final \\boxed{1}", 1.0),
    ("The score is 0.7 … Score: 1 \\boxed{abc}", None),    # first regex match invalid: no retry -> 0.0
    ("no box and no pattern", None),
])
def test_parse_score_t_p6(text, want):
    assert parse_score(text) == want


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


def test_papo_matches_loop():
    r, ids, _, process = random_batch(4)
    correct = r > 0.5
    torch.testing.assert_close(papo_advantage(r, process * r, correct, ids),
                               papo_loop(r, process * r, correct, ids), atol=1e-9, rtol=1e-9)
