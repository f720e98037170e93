"""BiCC on every base (spec §1.6): the advantage is the base estimator's, the BiCC contexts only change
the ratio's inputs; RCC composes with each base. Vectors computed by hand."""
from __future__ import annotations

import math

import pytest
import torch

from megatron_rl import algorithms as A

R = torch.tensor([1.0, 0.0, 0.0, 0.0, 1.0, 1.0, 0.0, 1.0], dtype=torch.float64)
G = torch.tensor([0, 0, 0, 0, 1, 1, 1, 1])
M = torch.ones(8, 3)


def adv(base: str, greedy=None) -> torch.Tensor:
    hp = A.BiCCHParams(base=base)
    x = A.AlgoInputs(rewards=R, group_ids=G, mask=M, greedy_rewards=greedy)
    return A.compute_advantages("bicc", x, hp)


def test_bicc_base_grpo_and_dapo_are_std_scaled():
    # group 0: mean 0.25, unbiased std sqrt(0.25) = 0.5 -> (1 - 0.25) / 0.5 = 1.5, (0 - 0.25)/0.5 = -0.5
    s = math.sqrt(1 / 3 * (0.75 ** 2 + 3 * 0.25 ** 2))
    want0 = [0.75 / (s + 1e-6)] + [-0.25 / (s + 1e-6)] * 3
    for base in ("grpo", "dapo"):
        assert torch.allclose(adv(base)[:4], torch.tensor(want0, dtype=torch.float64))


def test_bicc_base_drgrpo_is_unscaled():
    assert torch.allclose(adv("drgrpo"), torch.tensor([0.75, -0.25, -0.25, -0.25, 0.25, 0.25, -0.75, 0.25],
                                                      dtype=torch.float64))


def test_bicc_base_bicc_is_the_released_form():
    # group 0: n+ = 1, n- = 3 -> +sqrt(3), -sqrt(1/3)
    a = adv("bicc")
    assert math.isclose(a[0], math.sqrt(3)) and math.isclose(a[1], -math.sqrt(1 / 3))


def test_bicc_base_remax_needs_greedy_rewards():
    greedy = torch.tensor([0.0] * 4 + [1.0] * 4, dtype=torch.float64)
    assert torch.allclose(adv("remax", greedy), R - greedy)
    assert "greedy_rewards" in A.kind_required_inputs("bicc", A.BiCCHParams(base="remax"))
    with pytest.raises(ValueError, match="greedy_rewards"):
        adv("remax")


def test_bicc_base_validation_and_dapo_switches():
    with pytest.raises(ValueError, match="bicc base 'ppo' invalid"):
        A.BiCCHParams(base="ppo")
    hp = A.BiCCHParams(base="dapo", overlong_enable=True, overlong_buffer_len=2, filter_groups=True)
    assert hp.overlong_enable and hp.filter_groups


@pytest.mark.parametrize("base", ["grpo", "dapo", "drgrpo", "bicc", "remax"])
def test_rcc_composes_with_every_base(base):
    greedy = torch.zeros(8, dtype=torch.float64)
    delta = torch.zeros(8, dtype=torch.float64)       # δ constant -> Cov = 0 -> RCC baseline = base baseline
    hp = A.BiCCRCCHParams(base=base)
    x = A.AlgoInputs(rewards=R, group_ids=G, mask=M, greedy_rewards=greedy, delta=delta,
                     old_logp=torch.zeros(8, 3), ref_logp=torch.zeros(8, 3))
    a = A.compute_advantages("bicc_rcc", x, hp)
    assert torch.isfinite(a).all() and a.shape == (8,)


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
