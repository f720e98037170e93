"""The packing plan (``trainer/pipeline/packing.py``) as pure functions: DP balance by tokens, first-fit
decreasing rows, equal micro-batch counts, the budget error, unpack / pack_target round trips and the
THD layout TE takes on GPU."""
from __future__ import annotations

import pytest
import torch

from megatron_rl.trainer.pipeline.batch import make_batch
from megatron_rl.trainer.pipeline.packing import (
    RankMicroBatches,
    TokenBudget,
    balance_dp,
    build_micro_batch,
    ffd_rows,
    plan,
    seq_lengths,
    thd_layout,
)


def test_seq_lengths_read_the_loss_mask():
    b = make_batch([[1, 2], [3], [4, 5, 6]], [[7, 8, 9], [1], [2]], seq_len=8)
    assert seq_lengths(b) == [5, 2, 4]


def test_dp_balance_is_by_tokens_not_counts():
    lens = [100, 10, 10, 10, 10, 10, 10, 10, 10, 10, 10]
    a = balance_dp(lens, 2)
    tok = [sum(lens[i] for i in r) for r in a]
    assert sorted(tok) == [100, 100] and a[0] == [0]                  # the long one alone, ten short ones together
    assert sorted(i for r in a for i in r) == list(range(len(lens)))


def test_ffd_fills_rows_and_plan_counts_match_across_ranks():
    lens = [40, 30, 20, 12, 10, 9, 8, 5, 3, 3]
    rows = ffd_rows(lens, list(range(len(lens))), 40)
    assert all(sum(lens[i] for i in r) <= 40 for r in rows) and len(rows) == 4     # 140 tokens in 4 rows of 40
    p = plan(lens, TokenBudget(80), dp=2)
    assert p.row_len == 40 and len({len(r) for r in p.ranks}) == 1           # same micro-batch count on every rank
    assert all(len(mb) * p.row_len <= 80 for r in p.ranks for mb in r)       # the budget holds
    assert sorted(i for r in p.ranks for mb in r for row in mb for i in row) == list(range(len(lens)))
    assert max(p.rank_tokens()) / (sum(lens) / 2) <= 1.1


def test_a_sequence_longer_than_the_budget_is_an_error_naming_both():
    with pytest.raises(ValueError, match=r"a sequence of 70 tokens \(row length 72\) does not fit "
                                         r"trainer.max_tokens_per_micro_batch=64"):
        plan([70, 3], TokenBudget(64), dp=1)


def test_unpack_and_pack_target_round_trip():
    prompts, resps = [[1, 2], [3], [4, 5, 6], [7]], [[8, 9, 10], [11], [12], [13, 14]]
    b = make_batch(prompts, resps, seq_len=8)
    lens = seq_lengths(b)
    mb = build_micro_batch(b, [[2, 1], [0, 3]], row_len=8, n_rows=2, lengths=lens)
    # every sequence's tokens sit in its segment with positions from 0; targets unpack to the own frame
    frame = mb.unpack(mb.batch.targets.float())
    own = torch.stack([b.targets[i].float() for i in mb.owner])
    assert torch.equal(frame * mb.valid, own * mb.valid)
    assert mb.batch.position_ids()[0, :4].tolist() == [0, 1, 2, 3] and mb.batch.position_ids()[0, 4:6].tolist() == [0, 1]
    x = torch.randn(len(mb.owner), 7)
    assert torch.equal(mb.unpack(mb.pack_target(x)), x * mb.valid)


def test_filler_micro_batch_contributes_no_mask():
    p = plan([8, 5, 5], TokenBudget(8), dp=2)        # rank 0: the 8-token one; rank 1: two rows -> 2 micro-batches
    assert p.micro_batches == 2 and p.ranks[0][1] == []
    b = make_batch([[1], [2], [3]], [[3, 4, 1, 1, 1, 1, 1], [5, 1, 1, 1], [6, 1, 1, 1]], seq_len=8,
                   extras={"resp_mask": torch.ones(3, 7)})
    mbs = RankMicroBatches(b, p, dp_rank=0)
    filler = mbs[1]
    assert filler.owner == [-1] and filler.seqs.extras["resp_mask"].sum() == 0 and filler.seqs.loss_mask.sum() == 0
    assert mbs[0].owner == [0]


def test_thd_layout_covers_every_token_with_segment_runs():
    b = make_batch([[1, 2], [3]], [[4], [5, 6]], seq_len=8)
    mb = build_micro_batch(b, [[0, 1]], row_len=8, n_rows=2, lengths=seq_lengths(b))
    tokens, pos, cu, longest = thd_layout(mb.batch)
    assert tokens.shape == (1, 16) and pos.shape == (1, 16)
    # row 0: seq 0 (3 tokens), seq 1 (3 tokens), padding (2); row 1: padding (8)
    assert cu.tolist() == [0, 3, 6, 8, 16] and longest == 8 and cu.dtype == torch.int32
