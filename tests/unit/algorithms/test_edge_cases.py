"""Edge cases: singleton / all-correct / all-wrong groups, NaN/inf rewards, empty masks,
K larger than the available negatives, bad arguments."""
from __future__ import annotations

import pytest
import torch

from megatron_rl.algorithms import (aggregate, bicc_advantage, drgrpo_advantage, dynamic_sampling_keep,
                                    grpo_advantage, opsd_loss, papo_components, ppo_clip_loss, rcc_advantage,
                                    remax_advantage, rlcsd_advantage, rlcsd_loss, rlcsd_signal, rloo_advantage,
                                    select_rlcsd_hints)

D = torch.float64


def t(x):
    return torch.tensor(x, dtype=D)


ESTIMATORS = {
    "grpo": lambda r, g: grpo_advantage(r, g),
    "drgrpo": lambda r, g: drgrpo_advantage(r, g),
    "rloo": lambda r, g: rloo_advantage(r, g),
    "bicc": lambda r, g: bicc_advantage(r, g),
    "rcc": lambda r, g: rcc_advantage(r, r * 0.3 + 0.1, g),
    "rcc_bicc": lambda r, g: rcc_advantage(r, r * 0.3 + 0.1, g, base="bicc"),
    "papo": lambda r, g: papo_components(r, r * 0.5, None, g).total,
}


UNIFORM = {"all-correct": [1.0, 1, 1, 1], "all-wrong": [0.0, 0, 0, 0], "uniform-graded": [0.3, 0.3, 0.3]}
# PAPO all-correct groups carry A_proc (tested below), so that one combination is excluded
UNIFORM_CASES = [(n, c) for n in sorted(ESTIMATORS) for c in UNIFORM if not (n == "papo" and c == "all-correct")]


@pytest.mark.parametrize("name,case", UNIFORM_CASES)
def test_uniform_groups_give_exact_zero(name, case):
    r = UNIFORM[case]
    a = ESTIMATORS[name](t(r), torch.zeros(len(r), dtype=torch.long))
    assert a.tolist() == [0.0] * len(r)


@pytest.mark.parametrize("name,expected", [
    ("grpo", [1 / (1 + 1e-6), 0.0]),   # verl: μ = 0, σ = 1 for a singleton
    ("drgrpo", [1.0, 0.0]),
    ("rloo", [0.0, 0.0]),              # no leave-one-out baseline
    ("bicc", [0.0, 0.0]),              # degenerate partition
    ("rcc", [1 / (1 + 1e-6), 0.0]),    # base (grpo) singleton rule
    ("rcc_bicc", [0.0, 0.0]),
    ("papo", [0.0, 0.0]),              # A_out gated on G > 1
])
def test_singleton_groups(name, expected):
    a = ESTIMATORS[name](t([1.0, 0.0]), torch.tensor([10, 20]))
    torch.testing.assert_close(a, t(expected))


def test_papo_all_correct_uses_process_only_and_single_correct_reduces_to_grpo():
    g = torch.zeros(4, dtype=torch.long)
    out = papo_components(t([1, 1, 1, 1]), t([1, 1, 0.5, 0.5]), None, g)
    assert out.outcome.tolist() == [0] * 4 and out.process.abs().sum() > 0
    one = papo_components(t([1, 0, 0, 0]), t([0.5, 0, 0, 0]), None, g)
    torch.testing.assert_close(one.total, grpo_advantage(t([1, 0, 0, 0]), g))


@pytest.mark.parametrize("name", sorted(ESTIMATORS))
@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
def test_non_finite_rewards_name_the_sample(name, bad):
    r = t([1.0, 0.0, bad, 0.0])
    with pytest.raises(ValueError, match=r"sample 2 \(group 5\)"):
        ESTIMATORS[name](r, torch.tensor([4, 4, 5, 5]))


def test_non_finite_side_inputs_are_named():
    g = torch.zeros(3, dtype=torch.long)
    with pytest.raises(ValueError, match="greedy_rewards.*sample 1"):
        remax_advantage(t([1, 0, 1]), t([0.5, float("nan"), 0.5]))
    with pytest.raises(ValueError, match="process.*sample 0"):
        papo_components(t([1, 1, 0]), t([float("nan"), 1, 0]), None, g)
    with pytest.raises(ValueError, match="delta.*sample 2"):
        rcc_advantage(t([1, 0, 1]), t([0, 0, float("inf")]), g)


def test_bad_group_ids_and_shapes():
    with pytest.raises(ValueError, match="integer"):
        grpo_advantage(t([1, 0]), t([0, 0]))
    with pytest.raises(ValueError, match="2 samples, expected 3"):
        grpo_advantage(t([1, 0, 1]), torch.tensor([0, 0]))
    with pytest.raises(ValueError, match="valid"):
        grpo_advantage(t([1, 0]), torch.tensor([0, 0]), scale="bogus")
    with pytest.raises(ValueError, match="valid"):
        rcc_advantage(t([1, 0]), t([0, 0]), torch.tensor([0, 0]), base="bogus")


def test_empty_batch():
    e = torch.zeros(0, dtype=D)
    g = torch.zeros(0, dtype=torch.long)
    for f in (grpo_advantage, rloo_advantage, bicc_advantage):
        assert f(e, g).shape == (0,)


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


def test_dynamic_sampling_keeps_signal_and_singletons():
    keep = dynamic_sampling_keep(t([1, 1, 0, 1, 1, 1, 0]), torch.tensor([0, 0, 0, 1, 1, 2, 3]))
    assert keep.tolist() == [True, True, True, False, False, True, True]


def test_opsd_empty_mask():
    s = torch.log_softmax(torch.randn(2, 3, 4, dtype=D), -1)
    out = opsd_loss(s, s.flip(-1), torch.zeros(2, 3, dtype=D))
    assert float(aggregate(out.loss_mat, torch.zeros(2, 3), "token-mean")) == 0.0
