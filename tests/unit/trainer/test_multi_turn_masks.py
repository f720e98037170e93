"""Multi-turn rollouts in the update pipeline: the agent loop's response mask leaves tool / template tokens out
of the loss mask, the response-frame mask (advantages, the loss aggregation, the engine-mismatch metrics) and
nothing else (``pipeline/sequences.policy_tokens_only``, docs/multi-turn.md).

Oracles: the batch built without a mask (``rollout_sequences`` of the same rows as plain rollouts) — every
tensor equal except the masks, which are its masks times the response mask — and the token-mean aggregation
written out over the policy tokens.
"""
from __future__ import annotations

import pickle
from types import SimpleNamespace

import pytest
import torch

from megatron_rl.agent.loop import Trajectory
from megatron_rl.algorithms.losses import aggregate
from megatron_rl.rollout import rollouts as R
from megatron_rl.trainer.contract import UpdateContext
from megatron_rl.trainer.pipeline import dispatch
from megatron_rl.trainer.pipeline.logprobs import logprob_gap
from megatron_rl.trainer.pipeline.sequences import rollout_sequences

MASKS = [[1, 1, 0, 0, 0, 1, 1], [1, 1, 1], [1, 0, 1, 1, 0, 0, 1, 1, 1]]
FLAT = [b for m in MASKS for b in m]


def _trajs():
    out = []
    for i, m in enumerate(MASKS):
        ids = [10 + i * 10 + k for k in range(len(m))]
        lps = [-0.5 - 0.1 * k if b else 0.0 for k, b in enumerate(m)]
        out.append(Trajectory(i, 0, (1, 2 + i, 3), ids, lps, m))
    return out


def _ctx(max_resp=8):
    return UpdateContext(None, SimpleNamespace(tp=1), 0, None, SimpleNamespace(rollout=SimpleNamespace(max_tokens=max_resp)),
                         SimpleNamespace(pad_id=0))


def test_tool_tokens_leave_the_masks_and_nothing_else():
    ro = R.from_completions([None] * 3, _trajs(), None)
    assert ro.response_mask.dtype == torch.uint8 and ro.response_mask.tolist() == FLAT
    plain = R.from_completions([None] * 3, [SimpleNamespace(**{k: v for k, v in vars(t).items() if k != "response_mask"},
                                                              ) for t in _trajs()], None)
    assert plain.response_mask is None
    got, want = rollout_sequences(_ctx(), ro), rollout_sequences(_ctx(), plain)
    assert torch.equal(got.batch.tokens, want.batch.tokens) and torch.equal(got.resp_pos, want.resp_pos)
    for i, m in enumerate(MASKS):
        k = min(len(m), 8)
        assert got.resp_mask[i, :k].tolist() == [float(x) for x in m[:k]]
        assert got.resp_mask[i, k:].sum() == 0
        a = 3                                          # prompt length: target t = a - 1 + r predicts response token r
        assert got.batch.loss_mask[i, a - 1:a - 1 + len(m)].tolist() == [float(x) for x in m]
        assert got.batch.loss_mask[i].sum() == sum(m)
    assert torch.equal(got.batch.extras["resp_mask"], got.resp_mask)
    # token-mean over the policy tokens only: the loss at a tool token changes nothing
    loss = torch.rand(got.resp_mask.shape)
    poisoned = loss + 100.0 * (1 - got.resp_mask)
    want_mean = (loss * got.resp_mask).sum() / got.resp_mask.sum()
    assert aggregate(poisoned, got.resp_mask, "token-mean") == pytest.approx(float(want_mean))
    # the engine / trainer gap over policy tokens only (the engine's 0 at a tool token is no "gap")
    engine = torch.tensor([[lp for lp in t.logprobs[:8]] + [0.0] * (8 - min(8, len(t.logprobs))) for t in _trajs()])
    trainer = engine + 0.25 * got.resp_mask + 7.0 * (1 - got.resp_mask)
    assert logprob_gap(trainer, engine, got.resp_mask) == pytest.approx(0.25)


def test_the_mask_travels_with_the_batch():
    ro = R.from_completions([None] * 3, _trajs(), None)
    assert R.Rollouts.select(ro, [2, 0]).response_mask.tolist() == MASKS[2] + MASKS[0]
    assert R.concat([ro, ro]).response_mask.tolist() == FLAT * 2
    assert pickle.loads(pickle.dumps(ro)).response_mask.tolist() == FLAT
    assert ro.hold([1], [1]).response_mask.tolist() == MASKS[1]
    # a masked batch is not shared out over data-parallel ranks: each rank's masks cover every row
    assert dispatch.share_plan(ro, micro=2, dp=2, rows_per_mini_batch=0, shares_rows=True) is None
