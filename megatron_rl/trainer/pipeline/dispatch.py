"""Each data-parallel replica its share of a step's batch (issue 41): metadata to every rank, token rows
only where a policy pass runs them.

    driver: the batch (Rollouts)                    lengths = prompt + response of every sample
      -> the rows each DP replica's passes run      the actor's own split of those lengths: the old / ref
                                                    log-prob passes over the batch, then every mini-batch's
                                                    optimizer step (``pass_rows``: packed -> ``packing.balance_dp``,
                                                    padded -> contiguous shards, fillers = copies of row 0)
      -> replica d: ``Rollouts.hold(held_d, owned_d)``   every sample's metadata (lengths, groups, rewards,
                                                    finish reasons), the token fields of ``held_d`` (the
                                                    union of its passes' rows), no texts
      -> one broadcast per replica                  from the driver to that replica's ranks (its TP / CP / PP
                                                    ranks: one group per replica, the driver in each)

Every pack plan is a function of the lengths alone, so the driver computes each replica's rows without
the model, and each rank then runs exactly the rows it ran when it received the whole batch: the same
micro-batches, the same sums, the same bits. What a replica needs of rows it does not hold comes through
the frames the replicas assemble together: the old / ref log-probs (``gather_dp``, as before) and the
engines' log-probs (``sequences.engine_frame``: each row filled by the one replica that owns it, a sum
over DP).

A path shares rows out only when it says so (``DataPath.shares_rows``): the plain sampling family (GRPO,
DAPO, Dr.GRPO, RLOO, ReMax, PAPO …). A path whose hooks read other rows of a group (BiCC's opposite-
correctness contexts, the teacher family's sibling hints, SCoRe's two attempts) gathers what it needs by
taking the whole batch, as before; so do partial rollouts (per-token weight versions travel whole) and
DP = 1. The driver, which collected the batch, keeps all of it.

The dense frames the update builds from a share (``[N, S]`` tokens, ``[N, R]`` masks and log-probs) still
span the whole batch on every rank (``docs/architecture.md``).
"""
from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from megatron_rl.rollout.rollouts import Rollouts, Share
from megatron_rl.runtime.broadcast import broadcast_object
from megatron_rl.runtime.parallel import replica_groups
from megatron_rl.trainer.pipeline.batch import mini_batches
from megatron_rl.trainer.pipeline.packing import TokenBudget, balance_dp


def pass_rows(lengths: list[int], micro: TokenBudget | int, dp: int) -> list[list[int]]:
    """The rows each DP rank runs in one policy pass over sequences of ``lengths`` (sorted per rank), as
    the actor splits them: packed micro-batches (a ``TokenBudget``) by ``packing.balance_dp``; padded rows
    (``micro`` rows a micro-batch) in contiguous shards of the batch padded to a multiple of DP x
    ``micro`` (``LogProbModel._local_batch``). Each row is in one rank's list; a rank whose shard ends in
    filler rows (zero-mask copies of row 0, ``TrainBatch.pad_rows_to_multiple``) also runs row 0's tokens:
    :func:`filler_ranks`."""
    if isinstance(micro, TokenBudget):
        return balance_dp(lengths, dp)
    n, per = len(lengths), _padded_shard(len(lengths), micro, dp)
    return [list(range(r * per, min((r + 1) * per, n))) for r in range(dp)]


def filler_ranks(n: int, micro: TokenBudget | int, dp: int) -> list[int]:
    """The DP ranks whose padded shard of ``n`` rows holds fillers (copies of row 0); none when packed."""
    if isinstance(micro, TokenBudget):
        return []
    per = _padded_shard(n, micro, dp)
    return [r for r in range(dp) if (r + 1) * per > n]


def _padded_shard(n: int, micro: int, dp: int) -> int:
    """Rows per DP rank of ``n`` rows padded to a multiple of DP x ``micro`` (``pad_rows_to_multiple``)."""
    return (n + (-n) % (dp * micro)) // dp


def step_rows(lengths: list[int], micro: TokenBudget | int, dp: int,
              rows_per_mini_batch: int) -> tuple[list[list[int]], list[list[int]]]:
    """(held, owned) per DP rank for one RL step over sequences of ``lengths``: ``owned`` = its rows of the
    log-prob passes (each row owned by exactly one rank); ``held`` = those and its rows of every mini-batch's
    optimizer step (``batch.mini_batches``: consecutive chunks of ``rows_per_mini_batch``, 0 = one), and
    the first row of a pass or mini-batch whose fillers copy it onto this rank."""
    owned = pass_rows(lengths, micro, dp)
    held = [set(rows) for rows in owned]
    for idx in mini_batches(len(lengths), rows_per_mini_batch):
        for r, rows in enumerate(pass_rows([lengths[i] for i in idx], micro, dp)):
            held[r].update(idx[j] for j in rows)
        for r in filler_ranks(len(idx), micro, dp):
            held[r].add(idx[0])
    for r in filler_ranks(len(lengths), micro, dp):
        held[r].add(0)
    return [sorted(h) for h in held], owned


def share_plan(data: Any, *, micro: TokenBudget | int, dp: int, rows_per_mini_batch: int,
               shares_rows: bool) -> tuple[list[list[int]], list[list[int]]] | None:
    """Driver: (held, owned) per DP replica for ``data`` (:func:`step_rows`), or None when it travels whole
    (DP = 1, a path that does not share rows out, not a batch, per-token weight versions, a multi-turn response
    mask: every rank's masks then cover every row, ``sequences.policy_tokens_only``). Metric
    ``data/held_frac``: the largest share's token data (ids and log-probs) over the batch's (1/DP at best)."""
    if dp == 1 or not shares_rows or not isinstance(data, Rollouts) or data.token_versions is not None \
            or data.response_mask is not None or not len(data):
        return None
    lengths = (data.prompt_lens + data.response_lens).tolist()
    held, owned = step_rows(lengths, micro, dp, rows_per_mini_batch)
    tokens = (data.prompt_lens + 2 * data.response_lens).double()     # ids, and a log-prob per response token
    data.stats = {**data.stats, "data/held_frac": max(float(tokens[h].sum() / tokens.sum()) for h in held)}
    return held, owned


class _Shared:
    """The world broadcast's word that the batch comes in shares (each replica's on its own group)."""


def deliver(obj: Any, *, info, micro: TokenBudget | int, rows_per_mini_batch: int, shares_rows: bool) -> Any:
    """Collective: the driver's ``obj`` on every rank — whole (``broadcast_object``), or, for a batch its
    path shares out, each replica its share (module docstring); the driver keeps the whole batch, marked
    with the rows its replica owns."""
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return obj
    plan = share_plan(obj, micro=micro, dp=info.dp, rows_per_mini_batch=rows_per_mini_batch,
                      shares_rows=shares_rows) if info.is_driver else None
    head = broadcast_object(_Shared() if plan is not None else obj)
    if not isinstance(head, _Shared):
        return head
    groups = replica_groups(info)
    if not info.is_driver:
        return broadcast_object(None, src=0, group=groups[info.dp_rank])
    for rep, (held, owned) in enumerate(zip(*plan)):
        if groups[rep] is not None:      # (the driver alone in its replica: nothing to send)
            broadcast_object(obj.hold(held, owned), src=0, group=groups[rep])
    obj.share = Share(None, torch.as_tensor(plan[1][info.dp_rank], dtype=torch.long))
    return obj
