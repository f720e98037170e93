"""Stage helpers that only the e2e runs exercised before: concat, bicc_inputs, TrainBatch.pad_rows_to_multiple,
rlcsd_counts (in-process, no model)."""
from __future__ import annotations

import pytest
import torch

from megatron_rl import algorithms as A
from megatron_rl.rollout import rollouts as R
from megatron_rl.trainer.pipeline.batch import TrainBatch
from megatron_rl.algorithms.builtin import rlcsd_counts
from megatron_rl.trainer.paths.bicc import BiccLayout, bicc_inputs

EOS = 99


def _ro(prompts, responses, rewards, gids) -> R.Rollouts:
    n = len(prompts)
    rw = torch.tensor(rewards, dtype=torch.float32)
    return R.Rollouts.from_lists([None] * n, prompts, responses, [[0.0] * len(r) for r in responses], ["stop"] * n,
                                torch.tensor(gids), [f"t{i}" for i in range(n)], rewards=rw, correct=rw > 0.5)


def test_concat_offsets_group_ids_and_keeps_order():
    a = _ro([[1], [1]], [[5], [6]], [1.0, 0.0], [0, 0])
    b = _ro([[2], [2], [3], [3]], [[7], [8], [9], [10]], [0.0, 0.0, 1.0, 1.0], [0, 0, 1, 1])
    c = R.concat([a, b])
    assert c.group_ids.tolist() == [0, 0, 1, 1, 2, 2]
    assert c.responses == [[5], [6], [7], [8], [9], [10]] and c.texts == ["t0", "t1", "t0", "t1", "t2", "t3"]
    assert c.rewards.tolist() == [1.0, 0.0, 0.0, 0.0, 1.0, 1.0] and c.greedy_rewards is None


def test_bicc_inputs_condition_mixed_groups_only_and_keep_targets():
    """Group 0 is mixed (one right, one wrong): each target gets the OPPOSITE response (without its
    EOS) after BOS (template-less layout, insert at 1); group 1 is uniform and stays plain."""
    ro = _ro([[0, 1, 2], [0, 1, 2], [0, 3], [0, 3]], [[4, 4, EOS], [5, 5, 5, EOS], [6, EOS], [7, EOS]],
             [1.0, 0.0, 1.0, 1.0], [0, 0, 1, 1])
    hp = A.BiCCHParams(context_frac=0.5)
    layout = BiccLayout(header=(), sep=(8,), at=1)
    prompts, n_cond, n_fb = bicc_inputs(ro, hp, l_max=40, max_total_len=64, layout=layout, eos_id=EOS)
    assert (n_cond, n_fb) == (2, 0)
    assert prompts[0][:1] == [0] and prompts[0][-2:] == [1, 2] and [5, 5, 5] == prompts[0][1:4]
    assert prompts[1][1:3] == [4, 4] and prompts[1][-2:] == [1, 2]
    assert prompts[2:] == [[0, 3], [0, 3]]
    assert EOS not in prompts[0] and EOS not in prompts[1]      # context traces are stripped of EOS
    # a zero-token budget (floor(0.01 * 40) = 0) fits no trace: both targets fall back to the plain prompt
    prompts, n_cond, n_fb = bicc_inputs(ro, A.BiCCHParams(context_frac=0.01), l_max=40, max_total_len=64,
                                        layout=layout, eos_id=EOS)
    assert (n_cond, n_fb) == (0, 2) and prompts == [list(p) for p in ro.prompts]


def _train_batch(n: int, k: int = 2) -> TrainBatch:
    g = torch.Generator().manual_seed(0)
    ex = {"resp_mask": torch.ones(n, 4), "first_mask": torch.ones(n, 4), "teacher_neg_mask": torch.ones(n, k, dtype=torch.bool),
          "advantages": torch.randn(n, generator=g), "rewards": torch.ones(n)}
    return TrainBatch(torch.arange(n * 6).view(n, 6), torch.ones(n, 5), ex)


def test_pad_rows_appends_zero_mask_copies():
    b = _train_batch(5).pad_rows_to_multiple(4)
    assert b.num_samples == 8
    assert b.loss_mask[5:].abs().sum() == 0 and b.extras["resp_mask"][5:].abs().sum() == 0
    assert b.extras["first_mask"][5:].abs().sum() == 0 and b.extras["first_mask"][:5].all()   # SCoRe's attempt 1
    assert torch.equal(b.tokens[5:], b.tokens[:1].expand(3, -1))               # copies of row 0
    assert b.extras["teacher_neg_mask"][5:, 0].all() and not b.extras["teacher_neg_mask"][5:, 1:].any()
    assert torch.equal(b.extras["advantages"][:5], _train_batch(5).extras["advantages"])
    assert _train_batch(8).pad_rows_to_multiple(4).num_samples == 8                  # already a multiple


def test_rlcsd_counts_split_the_mask_by_the_gate():
    g = torch.Generator().manual_seed(3)
    n, t = 6, 7
    ex = {"teacher_logp": -torch.rand(n, t, generator=g), "teacher_neg_logp": -torch.rand(n, 2, t, generator=g) * 3,
          "teacher_neg_mask": torch.ones(n, 2, dtype=torch.bool), "advantages": torch.randn(n, generator=g),
          "resp_mask": (torch.rand(n, t, generator=g) > 0.3).float()}
    hp = A.RLCSDHParams()
    n_non, n_sel = rlcsd_counts(ex, hp)
    e = A.rlcsd_signal(ex["teacher_logp"], ex["teacher_neg_logp"], ex["teacher_neg_mask"])
    gate = A.rlcsd_advantage(ex["advantages"], e, ex["resp_mask"], **hp.signal_kwargs()).gate
    m = ex["resp_mask"] > 0
    assert (n_non, n_sel) == (float((m & ~gate).sum()), float((m & gate).sum()))
    assert n_non + n_sel == float(ex["resp_mask"].sum()) and n_sel > 0
    field = A.loss_batch_stats("rlcsd")["rlcsd_counts"](ex, hp)
    assert field.shape == (n, 2) and field[:, 0].eq(n_non).all() and field[:, 1].eq(n_sel).all()


def test_logprob_gate_default_follows_the_trainer_precision():
    """rollout.logprob_gate null: 1e-2 in fp32, 5e-2 with bf16 (bf16 trainer vs bf16 engine differ by ~1e-2);
    a value set wins in either precision."""
    from megatron_rl.config import load_config
    from megatron_rl.trainer.loop.sync_stage import gate_threshold

    assert gate_threshold(load_config(None, [])) == 1e-2
    assert gate_threshold(load_config(None, ["model.bf16=true"])) == 5e-2
    assert gate_threshold(load_config(None, ["model.bf16=true", "rollout.logprob_gate=0.003"])) == 0.003
    with pytest.raises(ValueError, match="rollout.logprob_gate must be > 0 or null"):
        load_config(None, ["rollout.logprob_gate=0"])
