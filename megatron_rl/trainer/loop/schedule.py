"""Glue between the actor and megatron-core's pipeline schedules + parallel groups.

* :class:`Groups` — this rank's TP / PP / DP / CP groups and positions (read from ``parallel_state``).
* :func:`run_schedule` — one ``get_forward_backward_func()`` call over a list of micro-batches
  (PP=1 no-pipelining, PP>=2 1F1B), returning the last stage's ``forward_data_store``.
* :func:`from_last_stage` / :func:`gather_dp` — make last-stage, per-DP-shard results available on
  every rank.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable, Sequence

import torch
import torch.distributed as dist

from megatron_rl.runtime.device import default_device
from megatron_rl.trainer.pipeline.batch import TrainBatch


@dataclasses.dataclass(frozen=True)
class Groups:
    """Process groups of this rank (megatron ``parallel_state`` must be initialised)."""

    tp: Any
    pp: Any
    dp: Any
    tp_size: int
    pp_size: int
    dp_size: int
    dp_rank: int
    is_first_stage: bool
    is_last_stage: bool
    pp_last_global_rank: int
    cp: Any = None          # context-parallel group (``cp_size`` 1: no split); ``dp`` excludes it
    cp_size: int = 1
    cp_rank: int = 0

    @classmethod
    def current(cls) -> "Groups":
        from megatron.core import parallel_state as ps

        if not ps.model_parallel_is_initialized():
            raise RuntimeError("megatron model parallel is not initialised: call megatron_rl.runtime.parallel.init_parallel() first")
        return cls(
            tp=ps.get_tensor_model_parallel_group(), pp=ps.get_pipeline_model_parallel_group(),
            dp=ps.get_data_parallel_group(), tp_size=ps.get_tensor_model_parallel_world_size(),
            pp_size=ps.get_pipeline_model_parallel_world_size(), dp_size=ps.get_data_parallel_world_size(),
            dp_rank=ps.get_data_parallel_rank(), is_first_stage=ps.is_pipeline_first_stage(),
            is_last_stage=ps.is_pipeline_last_stage(), pp_last_global_rank=ps.get_pipeline_model_parallel_last_rank(),
            cp=ps.get_context_parallel_group(), cp_size=ps.get_context_parallel_world_size(),
            cp_rank=ps.get_context_parallel_rank())


def run_schedule(chunks: Sequence[torch.nn.Module], micro_batches: Sequence[TrainBatch],
                 forward_step: Callable, forward_only: bool) -> list:
    """Run megatron's forward(-backward) schedule over ``micro_batches``.

    ``forward_step(data_iterator, model) -> (output, loss_func)`` follows megatron's contract.
    With pipeline parallelism all micro-batches must share their shape (it sizes the p2p buffers);
    without, shapes may differ (packed micro-batches of different row counts).
    Returns the list the loss functions produced (non-empty on the last stage only).
    """
    from megatron.core.pipeline_parallel import get_forward_backward_func

    if not micro_batches:
        raise ValueError("run_schedule: no micro-batches")
    from megatron.core import parallel_state as ps

    shapes = getattr(micro_batches, "schedule_shapes", None) or \
        [getattr(mb, "schedule_shape", (mb.seq_len, mb.num_samples)) for mb in micro_batches]
    seq, mbs = max(s for s, _ in shapes), max(b for _, b in shapes)
    if ps.get_pipeline_model_parallel_world_size() > 1 and any(sh != (seq, mbs) for sh in shapes):
        raise ValueError("run_schedule: with pipeline parallelism the micro-batches must share their shape "
                         "(it sizes the p2p buffers)")
    data_iter = [iter(micro_batches) for _ in chunks] if len(chunks) > 1 else iter(micro_batches)
    fb = get_forward_backward_func()
    return fb(forward_step_func=forward_step, data_iterator=data_iter,
              model=list(chunks) if len(chunks) > 1 else chunks[0],
              num_microbatches=len(micro_batches), seq_length=seq, micro_batch_size=mbs,
              forward_only=forward_only)


def from_last_stage(g: Groups, obj: Any) -> Any:
    """Python object ``obj`` from the last pipeline stage, returned on every stage."""
    if g.pp_size == 1:
        return obj
    box = [obj if g.is_last_stage else None]
    dist.broadcast_object_list(box, src=g.pp_last_global_rank, group=g.pp)
    return box[0]


def tensor_from_last_stage(g: Groups, t: torch.Tensor | None, shape: tuple[int, ...], dtype=torch.float32) -> torch.Tensor:
    """Tensor of known ``shape`` from the last pipeline stage onto every stage."""
    if g.pp_size == 1:
        return t
    buf = t.contiguous() if g.is_last_stage else torch.empty(shape, dtype=dtype, device=default_device())
    dist.broadcast(buf, src=g.pp_last_global_rank, group=g.pp)
    return buf


def gather_dp(g: Groups, t: torch.Tensor) -> torch.Tensor:
    """Concatenate each DP rank's rows (dim 0) in DP-rank order."""
    if g.dp_size == 1:
        return t
    parts = [torch.empty_like(t) for _ in range(g.dp_size)]
    dist.all_gather(parts, t.contiguous(), group=g.dp)
    return torch.cat(parts, dim=0)


def sum_dp(g: Groups, t: torch.Tensor) -> torch.Tensor:
    """All-reduce SUM over the data-parallel group (in place; returns ``t``)."""
    if g.dp_size > 1:
        dist.all_reduce(t, group=g.dp)
    return t
