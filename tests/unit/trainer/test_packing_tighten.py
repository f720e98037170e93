"""Tightened micro-batches (``packing.tighten``): without pipeline parallelism each micro-batch runs at
the shortest row length that still holds its sequences, so a rank's last, partly filled rows stop
paying for their empty tails; with it every micro-batch keeps L (one shape sizes the p2p buffers)."""
from __future__ import annotations

import math

import pytest
import torch

from megatron_rl.trainer.pipeline.batch import make_batch
from megatron_rl.trainer.pipeline.packing import (
    RankMicroBatches,
    TokenBudget,
    plan,
    seq_lengths,
    tighten,
)

LENS = [40, 30, 20, 12, 10, 9, 8, 5, 3, 3]           # 140 tokens


def test_last_micro_batch_runs_at_its_shortest_rows():
    # rows of 40: [40] [30 10] | [20 12 8] [9 5 3 3] (40 + 20 of 80 slots); the second micro-batch's 60 tokens
    # fit 2 rows of 32: [20 12] [9 8 5 3 3]
    p = plan(LENS, TokenBudget(80), dp=1)
    assert p.row_len == 40 and p.mb_row_len == [[40, 32]]
    assert p.ranks[0][1] == [[2, 3], [5, 6, 7, 8, 9]]
    assert math.isclose(p.pad_frac(), 1 - 140 / (80 + 64))                  # 12.5 % at L -> 2.8 %
    assert math.isclose(p.pad_frac(same_shape=True), 1 - 140 / 160)
    for r, rk in enumerate(p.ranks):
        for m, mb in enumerate(rk):
            assert all(sum(LENS[i] for i in row) <= p.row_len_of(r, m) for row in mb)
            assert len(mb) * p.row_len_of(r, m) <= 80
    assert sorted(i for rk in p.ranks for mb in rk for row in mb for i in row) == list(range(len(LENS)))


def test_tighten_keeps_full_rows_and_empty_micro_batches():
    assert tighten(LENS, [[0], [1, 4]], 40, 8) == ([[0], [1, 4]], 40)       # a 40-token sequence needs 40
    assert tighten(LENS, [], 40, 8) == ([], 40)                              # a filler copies row 0
    assert tighten([5, 5, 5], [[0, 1, 2]], 40, 8) == ([[0, 1, 2]], 16)      # rounded up to the multiple


def test_tightened_micro_batch_unpacks_to_each_sequence_and_pp_keeps_l():
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(1, 50, (2,), generator=g).tolist() for _ in LENS]
    resps = [torch.randint(1, 50, (n - 2,), generator=g).tolist() for n in LENS]
    b = make_batch(prompts, resps, seq_len=40)
    assert seq_lengths(b) == LENS
    p = plan(LENS, TokenBudget(80), dp=1)
    mbs = RankMicroBatches(b, p, dp_rank=0)
    assert [mb.seq_len for mb in mbs] == [40, 32] and [mb.num_samples for mb in mbs] == [2, 2]
    for mb in mbs:
        frame = mb.unpack(mb.batch.targets.float())
        own = torch.stack([b.targets[i].float() for i in mb.owner])
        assert torch.equal(frame * mb.valid, own * mb.valid)
        assert mb.valid.sum(1).tolist() == [LENS[i] - 1 for i in mb.owner]
    same = RankMicroBatches(b, p, dp_rank=0, same_shape=True)
    assert [mb.seq_len for mb in same] == [40, 40]
    # the schedule sizes its buffers from the plan, before any micro-batch is built; each is built on read
    for lazy in (mbs, same, RankMicroBatches(b, p, dp_rank=0, thd=True)):
        assert lazy.schedule_shapes == [mb.schedule_shape for mb in lazy]
        assert lazy[0] is not lazy[0] and torch.equal(lazy[-1].tokens, lazy[len(lazy) - 1].tokens)
    assert RankMicroBatches(b, p, dp_rank=0, thd=True).schedule_shapes == [(80, 1), (64, 1)]


@pytest.mark.parametrize("dp", [1, 2])
def test_long_tailed_batches_pad_at_most_5_percent(dp):
    """64 sequences, prompts 32..96, responses log-normal (median 100, sigma 1, longest 1024; the batch of
    benchmarks/bench_packing.py), 20 seeds: at most 5 % of the processed slots are padding at DP 1 and 2
    (at L for every micro-batch: up to 7.7 % at DP=1 and 14 % at DP=2)."""
    for seed in range(20):
        g = torch.Generator().manual_seed(seed)
        resp = (math.log(100) + torch.randn(64, generator=g)).exp().round().clamp(1, 1024).long()
        resp[resp.argmax()] = 1024
        lens = (resp + torch.randint(32, 97, (64,), generator=g)).tolist()
        p = plan(lens, TokenBudget(4 * (-(-max(lens) // 8) * 8)), dp)
        assert p.pad_frac() <= 0.05, (seed, p.pad_frac())
        assert max(p.rank_tokens()) / (sum(lens) / dp) <= 1.1
