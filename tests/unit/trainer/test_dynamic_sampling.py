"""DAPO dynamic sampling's batch completion and the rollout concat (issue 9 fixes 4 and 7)."""
from __future__ import annotations

import pytest
import torch

from megatron_rl import algorithms as A
from megatron_rl.rollout import rollouts as R
from megatron_rl.trainer.paths.plain import fill as _fill


def _ro(groups: list[int], n: int = 2, greedy: bool = True) -> R.Rollouts:
    """One generation batch; sample i of group g has prompt [g] and response [g, i]."""
    gids = [g for g in groups for _ in range(n)]
    resp = [[g, i % n] for i, g in enumerate(gids)]
    rw = torch.tensor([float(i % 2) for i in range(len(gids))])
    return R.Rollouts.from_lists([None] * len(gids), [[g] for g in gids], resp, [[0.0, 0.0]] * len(gids), ["stop"] * len(gids),
                                torch.tensor(gids), [], rewards=rw, correct=rw > 0.5,
                                greedy_rewards=rw.clone() if greedy else None)


def test_fill_completes_with_uniform_groups_never_twice():
    kept = [_ro([10]), _ro([])]
    spare = [_ro([11, 12]), _ro([20, 21])]
    ds = A.DynamicSampler(3)
    ds.batches, ds.filtered_prompts = 2, 4
    ro = _fill(kept, spare, need=3, n=2, ds=ds)
    keys = [tuple(p) for p in ro.prompts]
    assert keys == [(10,), (10,), (11,), (11,), (12,), (12,)]
    assert len(set(map(tuple, ro.responses))) == len(ro)          # no sample appears twice
    assert ro.stats["dynamic/padded_groups"] == 2 and ro.stats["dynamic/gen_rounds"] == 2
    assert ro.group_ids.tolist() == [0, 0, 1, 1, 2, 2]
    assert ro.greedy_rewards is not None and len(ro.greedy_rewards) == 6


def test_fill_takes_the_first_kept_groups_when_enough():
    ro = _fill([_ro([1, 2]), _ro([3])], [_ro([4])], need=2, n=2, ds=A.DynamicSampler(2))
    assert [p[0] for p in ro.prompts] == [1, 1, 2, 2] and ro.stats["dynamic/padded_groups"] == 0


def test_concat_keeps_greedy_rewards_and_rejects_partial_fields():
    a, b = _ro([1]), _ro([2])
    out = R.concat([a, b])
    assert torch.equal(out.greedy_rewards, torch.cat([a.greedy_rewards, b.greedy_rewards]))
    with pytest.raises(ValueError, match="greedy_rewards"):
        R.concat([a, _ro([3], greedy=False)])


def test_dynamic_sampler_cap_semantics():
    ds = A.DynamicSampler(4, max_num_gen_batches=1)
    ds.add(torch.tensor([0.0, 1.0, 1.0, 1.0]), torch.tensor([0, 0, 1, 1]))
    assert ds.kept_prompts == 1 and not ds.ready
    with pytest.raises(RuntimeError, match="max_num_gen_batches=1"):
        ds.add(torch.tensor([0.0, 1.0]), torch.tensor([0, 0]))


def test_at_cap_is_validated():
    with pytest.raises(ValueError, match="at_cap"):
        A.DAPOHParams(at_cap="pad")
