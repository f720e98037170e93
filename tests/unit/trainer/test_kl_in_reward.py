"""In-reward KL (``algo.<kind>.kl_reward_coef``; the BiCC recipe's ``use_kl_in_reward``, β 0.001):
the sequence reward loses β·Σ_t KL_t(old, ref), on the sampling paths only."""
from __future__ import annotations

import pytest
import torch

from megatron_rl.algorithms import kind_required_inputs
from megatron_rl.config import load_config
from megatron_rl.trainer.loop.preflight import load_checked
from megatron_rl.rollout.rollouts import Rollouts
from megatron_rl.trainer.pipeline.rows import kl_in_reward


def test_sequence_reward_loses_beta_times_summed_k1():
    old = torch.tensor([[-1.0, -2.0, -0.5], [-0.3, -0.3, -9.0]])
    ref = torch.tensor([[-1.5, -1.0, -0.5], [-0.1, -0.4, -1.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
    ro = Rollouts.from_lists([None] * 2, [[1]] * 2, [[], []], [[], []], ["stop"] * 2, torch.zeros(2, dtype=torch.long), rewards=torch.tensor([1.0, 0.0]))
    m = kl_in_reward(ro, old, ref, mask, 0.1, "k1")
    # k1 = old - ref: row 0: 0.5 - 1.0 + 0 = -0.5; row 1: -0.2 + 0.1 (third token masked) = -0.1
    torch.testing.assert_close(ro.rewards, torch.tensor([1.0 + 0.05, 0.0 + 0.01]))
    # mean_kl = mean over rows of per-row masked means: (-0.5/3 + -0.1/2) / 2
    assert m["reward/kl_in_reward"] == pytest.approx((-0.5 / 3 - 0.05) / 2)


def test_on_for_sampling_paths_refused_elsewhere():
    cfg = load_config(None, ["algo.kind=bicc_rcc", "algo.bicc_rcc.kl_reward_coef=0.001"])
    assert "ref_logp" in kind_required_inputs("bicc_rcc", cfg.algo.hparams)   # the reference policy is built
    with pytest.raises(ValueError, match="has no in-reward KL"):
        load_checked(None, ["algo.kind=rlcsd", "algo.rlcsd.kl_reward_coef=0.001"])
    with pytest.raises(ValueError, match="kl_reward_type"):
        load_config(None, ["algo.kind=grpo", "algo.grpo.kl_reward_type=k9"])
