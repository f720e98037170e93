"""GRPO family: GRPO, DAPO (overlong penalty, dynamic sampling), Dr.GRPO, ReMax, RLOO.

Spec vectors (../shared/specs/bicc_rcc_papo_and_verl_baselines.md §4 T-V*, rlcsd_family_and_score.md §3.1),
independently derived cases, the vectorised estimators against the per-group loop
(megatron_rl.algorithms.reference) and the registered ReMax kind. Checks parametrized over every
estimator live in test_every_kind.py; the shared PPO-clip / aggregation / KL pieces in
test_objective_parts.py."""
from __future__ import annotations

import math

import pytest
import torch

import megatron_rl.algorithms as A
from megatron_rl.algorithms import (
    dapo_overlong_penalty,
    dynamic_sampling_keep,
    grpo_advantage,
    rcc_advantage,
    remax_token_advantage,
    rloo_advantage,
)
from megatron_rl.algorithms.reference import grpo_loop, rloo_loop
from tests.helpers.algo_builders import D, close, gid, random_batch, t


def test_bad_group_ids_and_shapes():
    with pytest.raises(ValueError, match="integer"):
        grpo_advantage(t([1, 0]), t([0, 0]))
    with pytest.raises(ValueError, match="2 samples, expected 3"):
        grpo_advantage(t([1, 0, 1]), torch.tensor([0, 0]))
    with pytest.raises(ValueError, match="valid"):
        grpo_advantage(t([1, 0]), torch.tensor([0, 0]), scale="bogus")
    with pytest.raises(ValueError, match="valid"):
        rcc_advantage(t([1, 0]), t([0, 0]), torch.tensor([0, 0]), base="bogus")


def test_dynamic_sampling_keeps_signal_and_singletons():
    keep = dynamic_sampling_keep(t([1, 1, 0, 1, 1, 1, 0]), torch.tensor([0, 0, 0, 1, 1, 2, 3]))
    assert keep.tolist() == [True, True, True, False, False, True, True]


def test_rloo_three_samples():
    # r = [1, 0, 0]: A_0 = 1 − (0+0)/2 = 1; A_1 = 0 − (1+0)/2 = −0.5; A_2 = −0.5.
    torch.testing.assert_close(rloo_advantage(t([1, 0, 0]), torch.zeros(3, dtype=torch.long)), t([1, -0.5, -0.5]))


def test_grpo_interleaved_groups():
    # ids [7,3,7,3], r [1,0,0,1]: each group {1,0}: mean 0.5, std_u = sqrt(((.5)²+(.5)²)/1) = 0.707107;
    # A = ±0.5/(0.7071068 + 1e-6) = ±0.7071058.
    a = grpo_advantage(t([1, 0, 0, 1]), torch.tensor([7, 3, 7, 3]))
    v = 0.5 / (math.sqrt(0.5) + 1e-6)
    torch.testing.assert_close(a, t([v, -v, -v, v]))


def test_dynamic_sampler_accumulates_and_raises_past_the_limit():
    s = A.DynamicSampler(train_prompts=3, max_num_gen_batches=2)
    kept = s.add(t([1, 0, 1, 1, 0, 0]), torch.tensor([0, 0, 1, 1, 2, 2]))  # only group 0 has signal
    assert kept.tolist() == [0, 1] and not s.ready and s.filtered_prompts == 2
    s.add(t([1, 0, 0, 1, 1, 1]), torch.tensor([3, 3, 4, 4, 5, 5]))
    assert s.ready and s.kept_prompts == 3 and s.take(2) == 6
    with pytest.raises(RuntimeError, match="max_num_gen_batches=2"):
        s.add(t([1, 0]), torch.tensor([6, 6]))


def test_remax_kind_uses_greedy_rewards():
    x = A.AlgoInputs(rewards=t([1, 0]), group_ids=torch.tensor([0, 0]), mask=torch.ones(2, 1, dtype=D),
                     greedy_rewards=t([0.5, 0.5]))
    torch.testing.assert_close(A.compute_advantages("remax", x), t([0.5, -0.5]))


def test_TV1_grpo_drgrpo_singleton():
    r = t([0.5, 1.0, 0.0, 0.25])
    close(grpo_advantage(r, gid(4)), [0.146385, 1.317462, -1.024693, -0.439154])
    close(grpo_advantage(r, gid(4), scale="none"), [0.0625, 0.5625, -0.4375, -0.1875])
    close(grpo_advantage(t([1.0]), gid(1)), [0.999999])


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


@pytest.mark.parametrize("r,a", [
    ([1, 0, 0, 0, 0, 0, 0, 0], [2.474867] + [-0.353552] * 7),
    ([1, 1, 1, 1, 0, 0, 0, 0], [0.935413] * 4 + [-0.935413] * 4),
    ([1, 1, 1, 1, 1, 1, 1, 0], [0.353552] * 7 + [-2.474867]),
    ([1] * 8, [0] * 8),
    ([0.25, 0.75, 1.0, 0.0], [-0.547721, 0.547721, 1.095443, -1.095443]),
], ids=["1of8", "4of8", "7of8", "all", "graded"])
def test_31_grpo(r, a):
    close(grpo_advantage(t(r), torch.zeros(len(r), dtype=torch.long)), a)


@pytest.mark.parametrize("binary", [True, False], ids=["binary", "graded"])
def test_grpo_family_matches_loop(binary):
    r, ids, _, _ = random_batch(1, binary=binary)
    assert torch.unique(ids).numel() >= 1000
    for scale in ("std", "none", "std_pop"):
        torch.testing.assert_close(grpo_advantage(r, ids, scale=scale), grpo_loop(r, ids, scale=scale),
                                   atol=1e-9, rtol=1e-9)
    torch.testing.assert_close(rloo_advantage(r, ids), rloo_loop(r, ids), atol=1e-9, rtol=1e-9)


def test_float32_agrees_with_float64():
    r, ids, _, _ = random_batch(5)
    torch.testing.assert_close(grpo_advantage(r.float(), ids).double(), grpo_advantage(r, ids), atol=1e-5, rtol=1e-5)
