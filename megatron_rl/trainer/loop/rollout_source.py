"""Where a step's rollout batch comes from: one interface for synchronous and asynchronous collection,
so ``loop.rl_step`` reads as its diagram with no branch on the mode.

Per step t, every rank makes the same calls (:class:`RolloutSource`)::

    data, meta = source.next(t)      # collective: the batch (collected on the driver) and {gen_s, ...}
    ... update ...
    source.before_push(t)            # async: the driver waits for the batches due before the push
    ... weight push ...
    source.pushed(t)                 # async: the producer may sample with the new weights
    source.metrics(t0, t1, meta)     # time/gen_batch, perf/trainer_idle_frac, perf/engine_idle_frac
    source.state(t)                  # a checkpoint's ``async`` entry (driver; None when synchronous)
    source.close()

:class:`SyncRollouts` collects the batch when asked (generation and training alternate);
``rollout.max_staleness`` > 0 gives :class:`~megatron_rl.trainer.loop.async_source.AsyncRollouts`, whose
producer runs up to k batches ahead; ``rollout.partial`` gives
:class:`~megatron_rl.trainer.loop.partial_source.PartialRollouts` (groups in flight across pushes).
"""
from __future__ import annotations

import functools
import time
from collections.abc import Callable
from typing import Any, Protocol

from megatron_rl.rewards.judge_client import JudgeRejected
from megatron_rl.trainer.loop.async_source import AsyncRollouts, sync_metrics
from megatron_rl.trainer.loop.partial_source import PartialRollouts
from megatron_rl.runtime.broadcast import broadcast_object
from megatron_rl.trainer.pipeline import dispatch


class RolloutSource(Protocol):
    """Where a step's batch comes from (module docstring): :class:`SyncRollouts`, ``AsyncRollouts``
    (``async_source.py``) and ``PartialRollouts`` (``partial_source.py``) implement it; every call is made
    by every rank in the same order, ``next`` is collective."""

    def next(self, step: int) -> tuple[Any, dict]: ...

    def before_push(self, step: int) -> None: ...

    def pushed(self, step: int) -> None: ...

    def state(self, step: int) -> dict | None: ...

    def metrics(self, t0: float, t1: float, gen_s: float) -> dict: ...

    def close(self) -> None: ...


class SyncRollouts:
    """Collect on the driver when the step asks, deliver to every rank (``deliver``: whole, or each
    data-parallel replica its share, ``trainer/pipeline/dispatch.py``)."""

    def __init__(self, collect: Callable[[int], Any], *, is_driver: bool, deliver: Callable[[Any], Any] = broadcast_object):
        self.collect, self.is_driver, self.deliver = collect, is_driver, deliver

    def next(self, step: int) -> tuple[Any, dict]:
        t0 = time.perf_counter()
        data = None
        if self.is_driver:
            try:
                data = self.collect(step)
            except JudgeRejected as e:     # every rank stops on it, not the driver alone (the others would wait)
                data = e
        data = self.deliver(data)
        if isinstance(data, JudgeRejected):
            raise data
        return data, {"gen_s": time.perf_counter() - t0}

    def before_push(self, step: int) -> None:
        return None

    def pushed(self, step: int) -> None:
        return None

    def state(self, step: int) -> dict | None:
        return None

    def metrics(self, t0: float, t1: float, gen_s: float) -> dict:
        return sync_metrics(gen_s, t1 - t0)

    def close(self) -> None:
        return None


def open_source(run) -> RolloutSource:
    """The rollout source of ``run`` (after ``setup_run``: its step, sampler and restored in-flight batches)."""
    cfg, st = run.cfg, run.state
    if cfg.rollout.partial.enable:
        return PartialRollouts(run, resume=st.partial_resume)
    collect = functools.partial(run.path.collect, run.collect_context())   # collect(step): the path's, driver-side
    deliver = functools.partial(dispatch.deliver, info=run.info, micro=run.micro, shares_rows=run.path.shares_rows,
                                rows_per_mini_batch=cfg.trainer.mini_batch_prompts * cfg.rollout.n)
    if cfg.rollout.max_staleness == 0:
        return SyncRollouts(collect, is_driver=run.info.is_driver, deliver=deliver)
    return AsyncRollouts(collect, is_driver=run.info.is_driver, deliver=deliver, first_step=st.step + 1,
                         last_step=cfg.trainer.steps, max_staleness=cfg.rollout.max_staleness, version=st.step,
                         sampler=run.sampler, pending=st.async_pending)
