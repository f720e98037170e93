"""Context parallelism's token split (``trainer/policy/context_parallel.py``): the load-balanced THD layout of
Megatron-core / Transformer Engine (each sequence padded to a multiple of 2·cp, cut into 2·cp chunks,
CP rank r keeps chunks r and 2·cp−1−r) and its inverse. The 2-process gloo half (a real CP group,
checked against Megatron-core's own ``get_batch_on_this_cp_rank``) is ``tests/distributed/test_context_parallel.py``;
the model half (CP=2 vs CP=1 on Transformer Engine) ``tests/gpu/test_context_parallel_te.py``.
"""
from __future__ import annotations

import pytest
import torch

from megatron_rl.config import ParallelConfig
from megatron_rl.models.provider import check_cp_backend
from megatron_rl.trainer.policy.context_parallel import (
    padded_cu_seqlens,
    padded_positions,
    partition_indices,
    unpartition,
)


def _cu(lens):
    return torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32)


def test_chunk_ownership_by_hand():
    # one sequence of 8 at cp=2: chunks of 2 -> rank 0 chunks 0 and 3, rank 1 chunks 1 and 2
    assert partition_indices(_cu([8]), 2, 0).tolist() == [0, 1, 6, 7]
    assert partition_indices(_cu([8]), 2, 1).tolist() == [2, 3, 4, 5]
    # two sequences (4, 8): per sequence in order, chunk r then chunk 2cp-1-r
    assert partition_indices(_cu([4, 8]), 2, 0).tolist() == [0, 3, 4, 5, 10, 11]
    assert partition_indices(_cu([4, 8]), 2, 1).tolist() == [1, 2, 6, 7, 8, 9]
    # cp=4, one sequence of 16 (chunks of 2): rank r holds chunks r and 7-r
    for r in range(4):
        assert partition_indices(_cu([16]), 4, r).tolist() == [2 * r, 2 * r + 1, 2 * (7 - r), 2 * (7 - r) + 1]


def test_padding_to_two_cp():
    cu = _cu([3, 8, 5, 1])
    pad = padded_cu_seqlens(cu, 2)
    assert pad.tolist() == [0, 4, 12, 20, 24] and pad.dtype == cu.dtype
    assert padded_positions(cu, pad).tolist() == [0, 1, 2, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 20]
    assert padded_cu_seqlens(cu, 4).tolist() == [0, 8, 16, 24, 32]
    assert padded_cu_seqlens(cu, 2, tp=2).tolist() == [0, 8, 16, 24, 32]      # sequence parallel: 2*cp*tp
    assert partition_indices(padded_cu_seqlens(_cu([3]), 2, tp=2), 2, 1).tolist() == [2, 3, 4, 5]


@pytest.mark.parametrize("cp", [2, 4])
def test_partition_and_unpartition_are_inverses_on_random_layouts(cp):
    g = torch.Generator().manual_seed(cp)
    for _ in range(25):
        lens = torch.randint(1, 60, (int(torch.randint(1, 9, (1,), generator=g)),), generator=g).tolist()
        cu_pad = padded_cu_seqlens(_cu(lens), cp)
        total = int(cu_pad[-1])
        x = torch.randn(total, 3, generator=g)
        parts = [x.index_select(0, partition_indices(cu_pad, cp, r)) for r in range(cp)]
        assert all(p.shape[0] == total // cp for p in parts)              # every rank the same share
        idx = torch.cat([partition_indices(cu_pad, cp, r) for r in range(cp)])
        assert sorted(idx.tolist()) == list(range(total))                 # a partition: each token once
        assert torch.equal(unpartition(parts, cu_pad), x)
        # load balance under causal attention: a token of chunk i attends to i + 1 chunks; every rank sums the same
        seq = torch.repeat_interleave(torch.arange(len(lens)), cu_pad[1:] - cu_pad[:-1])
        chunk_of = (torch.arange(total) - cu_pad[:-1].long()[seq]) // ((cu_pad[1:] - cu_pad[:-1]).long()[seq] // (2 * cp))
        work = [int((chunk_of[partition_indices(cu_pad, cp, r)] + 1).sum()) for r in range(cp)]
        assert len(set(work)) == 1, work
        # and along another dim
        y = torch.randn(2, total, generator=g)
        assert torch.equal(unpartition([y.index_select(1, partition_indices(cu_pad, cp, r)) for r in range(cp)],
                                       cu_pad, dim=1), y)


def test_unpartition_is_differentiable():
    cu_pad = padded_cu_seqlens(_cu([5, 9]), 2)
    x = torch.randn(int(cu_pad[-1]), requires_grad=True)
    parts = [x[partition_indices(cu_pad, 2, r)] for r in range(2)]
    w = torch.arange(x.numel(), dtype=torch.float32)
    (unpartition(parts, cu_pad) * w).sum().backward()
    assert torch.equal(x.grad, w)


def test_bad_layouts_are_refused():
    with pytest.raises(ValueError, match="not multiples of 2\\*cp=4"):
        partition_indices(_cu([6]), 2, 0)
    with pytest.raises(ValueError, match="rank 2 outside a context-parallel group of 2"):
        partition_indices(_cu([8]), 2, 2)
    with pytest.raises(ValueError, match="hold 4 tokens"):
        unpartition([torch.zeros(2), torch.zeros(2)], _cu([8]))


def test_cp_needs_cuda_and_te_in_one_line():
    for cuda, backend, why in ((False, "local", "no CUDA device"), (True, "local", "model.backend resolves to local")):
        with pytest.raises(ValueError, match=f"parallel.cp=2 needs CUDA \\+ Transformer Engine.*{why}") as e:
            check_cp_backend(2, backend, cuda=cuda)
        assert "\n" not in str(e.value)
    check_cp_backend(2, "te", cuda=True)          # the one accepted combination
    check_cp_backend(1, "local", cuda=False)
    with pytest.raises(ValueError, match="parallel.cp=2 with parallel.pp=2"):
        ParallelConfig(cp=2, pp=2)
    with pytest.raises(ValueError, match="parallel.cp must be >= 1"):
        ParallelConfig(cp=0)


def test_world_divides_by_tp_pp_cp_and_dp_excludes_cp():
    from megatron_rl.config import load_config, validate

    c = load_config(None, ["parallel.tp=2", "parallel.cp=2", "data.prompts_per_step=4", "rollout.n=2",
                           "trainer.micro_batch_size=2"])
    with pytest.raises(ValueError, match=r"world size 6 is not divisible by tp\*pp\*cp=4"):
        validate(c, world_size=6)
    validate(c, world_size=4)       # dp 1: 8 sequences over 1 x 2 rows
    odd = load_config(None, ["parallel.cp=2", "data.prompts_per_step=3", "rollout.n=2", "trainer.micro_batch_size=2"])
    with pytest.raises(ValueError, match="batch of 6 sequences .* not divisible by dp=2 x micro_batch_size=2"):
        validate(odd, world_size=4)      # DP = 4 / (1 x 1 x 2) = 2, without CP
