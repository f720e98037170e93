"""Each DP replica its share of a step's batch (``trainer/pipeline/dispatch.py``, issue 41).

Oracles: the actor's own split of a batch — ``packing.plan`` (packed micro-batches) and
``TrainBatch.pad_rows_to_multiple`` + ``TrainBatch.shard`` (padded rows), the functions
``LogProbModel._packed`` / ``_local_batch`` call — and the whole batch itself: a share's rows, its
sequences and the engine frame the shares assemble are the whole batch's, bit for bit.
"""
from __future__ import annotations

import random
from types import SimpleNamespace

import pytest
import torch

from megatron_rl.algorithms.offpolicy import behaviour_matrix
from megatron_rl.rollout.rollouts import Rollouts, concat
from megatron_rl.trainer.pipeline import dispatch
from megatron_rl.trainer.pipeline.batch import make_batch, mini_batches
from megatron_rl.trainer.pipeline.packing import TokenBudget, plan
from megatron_rl.trainer.pipeline.sequences import engine_frame, rollout_sequences


def _batch(n: int, seed: int = 0, max_resp: int = 12) -> Rollouts:
    rng = random.Random(seed)
    prompts = [[rng.randrange(3, 50) for _ in range(rng.randint(1, 6))] for _ in range(n)]
    resps = [[rng.randrange(3, 50) for _ in range(rng.randint(1, max_resp))] for _ in range(n)]
    logps = [[-rng.random() * 4 for _ in r] for r in resps]
    return Rollouts.from_lists([{"row": i // 4} for i in range(n)], prompts, resps, logps,
                               ["stop"] * n, [i // 4 for i in range(n)], [f"t{i}" for i in range(n)],
                               rewards=torch.arange(n, dtype=torch.float32))


def _actor_rows(lengths: list[int], micro, dp: int) -> list[set[int]]:
    """The rows each DP rank runs, read off the actor's own functions (a ``row`` extra marks each row)."""
    if isinstance(micro, TokenBudget):
        p = plan(lengths, micro, dp)
        return [{i for mb in rk for row in mb for i in row} for rk in p.ranks]
    b = make_batch([[1] * (n - 1) for n in lengths], [[2] for _ in lengths],
                   extras={"row": torch.arange(len(lengths))})
    b = b.pad_rows_to_multiple(dp * micro)
    return [set(b.shard(r, dp).extras["row"].tolist()) for r in range(dp)]


@pytest.mark.parametrize("micro", [TokenBudget(64), TokenBudget(40), 1, 2, 3])
@pytest.mark.parametrize("dp", [2, 3, 4])
@pytest.mark.parametrize("n", [1, 5, 16])
def test_pass_rows_are_the_actors_split(micro, dp, n):
    lengths = [random.Random(n * 7 + dp).randint(2, 20) for _ in range(n)]
    got = [set(r) for r in dispatch.pass_rows(lengths, micro, dp)]
    for r in dispatch.filler_ranks(n, micro, dp):
        got[r].add(0)                      # the fillers are copies of row 0
    assert got == _actor_rows(lengths, micro, dp)


@pytest.mark.parametrize("micro", [TokenBudget(64), 2])
@pytest.mark.parametrize("rows_per_mb", [0, 4, 6, 16])
def test_step_rows_hold_every_pass_and_own_each_row_once(micro, rows_per_mb):
    lengths = [random.Random(3).randint(2, 30) for _ in range(16)]
    held, owned = dispatch.step_rows(lengths, micro, 2, rows_per_mb)
    assert sorted(i for o in owned for i in o) == list(range(16))     # each row owned by exactly one replica
    for r in range(2):
        assert set(owned[r]) <= set(held[r])
        for idx in mini_batches(16, rows_per_mb):                     # every optimizer step's rows are held
            sub = _actor_rows([lengths[i] for i in idx], micro, 2)[r]
            assert {idx[j] for j in sub} <= set(held[r])
    if rows_per_mb in (0, 16) and isinstance(micro, TokenBudget):    # one mini-batch: the passes' rows only
        assert held == owned


def test_share_holds_its_rows_and_refuses_the_others():
    ro = _batch(8)
    sh = ro.hold([1, 4, 6], [4, 6])
    for i in (1, 4, 6):
        assert sh.prompt(i) == ro.prompt(i) and sh.response(i) == ro.response(i)
        assert torch.equal(sh.held_tokens(i)[2], ro.held_tokens(i)[2])
    assert torch.equal(sh.prompt_lens, ro.prompt_lens) and torch.equal(sh.response_lens, ro.response_lens)
    assert torch.equal(sh.rewards, ro.rewards) and sh.finish == ro.finish and len(sh.texts) == 0
    assert sh.rows[0] is None and sh.rows[4] == ro.rows[4]
    assert len(sh.response_ids) == sum(len(ro.response(i)) for i in (1, 4, 6))
    with pytest.raises(KeyError, match="sample 2 is not held"):
        sh.response(2)
    for view in ("prompts", "responses", "rollout_logp"):
        with pytest.raises(RuntimeError, match="data-parallel share"):
            getattr(sh, view)
    with pytest.raises(ValueError, match="shares"):
        concat([sh, sh])
    sub = sh.select([6, 2, 4])                 # a mini-batch of a share: its held rows keep their tokens
    assert sub.held_rows() == [0, 2] and sub.response(0) == ro.response(6) and sub.response(2) == ro.response(4)
    assert sub.response_lens.tolist() == [len(ro.response(i)) for i in (6, 2, 4)]


def _shares(ro, **kw):
    """Each replica's share as the driver cuts it (``deliver``: ``share_plan``, then ``Rollouts.hold``), or None."""
    plan = dispatch.share_plan(ro, **kw)
    return None if plan is None else [ro.hold(h, o) for h, o in zip(*plan)]


def _ctx(pad_id=0, max_tokens=12):
    cfg = SimpleNamespace(rollout=SimpleNamespace(max_tokens=max_tokens))
    return SimpleNamespace(cfg=cfg, tok=SimpleNamespace(pad_id=pad_id), padded_len=lambda n: -(-n // 8) * 8)


def test_share_sequences_are_the_whole_batchs_on_its_rows():
    ro = _batch(10, seed=1)
    whole = rollout_sequences(_ctx(), ro)
    held = [0, 3, 4, 9]
    part = rollout_sequences(_ctx(), ro.hold(held, held))
    for name in ("loss_mask",):
        assert torch.equal(getattr(part.batch, name), getattr(whole.batch, name))
    assert torch.equal(part.resp_pos, whole.resp_pos) and torch.equal(part.resp_mask, whole.resp_mask)
    assert torch.equal(part.batch.tokens[held], whole.batch.tokens[held])
    others = [i for i in range(10) if i not in held]
    assert bool((part.batch.tokens[others] == 0).all())


@pytest.mark.parametrize("micro", [TokenBudget(64), 2])
def test_engine_frames_of_the_shares_sum_to_the_whole_batchs(micro):
    """What the DP all-reduce of ``engine_frame`` adds up: each row from its one owner, zeros elsewhere;
    the sum is ``behaviour_matrix`` of the whole batch bit for bit (x + 0 is exact)."""
    ro = _batch(16, seed=2)
    like = torch.zeros(16, 10)        # a frame shorter than some responses: they are cut as in behaviour_matrix
    parts = _shares(ro, micro=micro, dp=3, rows_per_mini_batch=4, shares_rows=True)
    total = sum(engine_frame(p, like) for p in parts)
    assert torch.equal(total, behaviour_matrix(ro.rollout_logp, like))


def test_batches_that_travel_whole():
    ro = _batch(8)
    kw = {"micro": TokenBudget(64), "rows_per_mini_batch": 0}
    assert _shares(ro, dp=1, shares_rows=True, **kw) is None            # one replica
    assert _shares(ro, dp=2, shares_rows=False, **kw) is None           # BiCC, teacher family, SCoRe
    assert _shares({"two": ro}, dp=2, shares_rows=True, **kw) is None   # not one batch
    ro.token_versions = torch.zeros(len(ro.response_ids), dtype=torch.int32)
    assert _shares(ro, dp=2, shares_rows=True, **kw) is None            # partial rollouts
