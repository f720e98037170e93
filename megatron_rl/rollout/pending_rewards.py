"""Rewards off the critical path (issue 41): the driver scores a batch on a worker thread while every rank
runs the old / reference log-prob passes, which need only the tokens; the rewards join the batch after
them, in a second broadcast (the pattern of PAPO's rubric grader, ``trainer/paths/process_reward.py``).

    collect (driver):   generate -> start(rollouts, scorer)            returns at once, batch broadcast unscored
    update (every rank): old / ref log-prob passes -> finish(rollouts)  driver waits for the scores, applies
                                                                        them (and ``shape``), broadcasts
                                                                        rewards / correct / stats

The scores are the same numbers as scoring before the broadcast (the same reward manager on the same
texts); only when they are computed moves. A scorer that raises stops every rank at this step with the
driver's exception (not the driver alone: the others would wait in the broadcast).
"""
from __future__ import annotations

import pickle
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from ..runtime.broadcast import broadcast_object
from .rollouts import Rollouts, apply_scores


class PendingRewards:
    """One batch's scoring in flight on the driver (``start``) and its collective join (``finish``)."""

    def __init__(self):
        self.pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="rewards")
        self.future = None
        self.shape: Callable[[Rollouts], Rollouts] | None = None

    @property
    def pending(self) -> bool:
        return self.future is not None

    def start(self, rollouts: Rollouts, reward_manager, shape: Callable[[Rollouts], Rollouts] | None = None) -> None:
        """Driver: score ``rollouts`` (its rows and texts) on the worker thread; ``shape``: applied to the
        scored batch before it is broadcast (DAPO's overlong shaping)."""
        if self.future is not None:
            raise RuntimeError("PendingRewards.start: the previous batch's rewards were never joined")
        self.future = self.pool.submit(reward_manager.score, list(rollouts.rows), list(rollouts.texts))
        self.shape = shape

    def finish(self, rollouts: Rollouts, is_driver: bool) -> float:
        """Collective: ``rollouts.rewards`` / ``correct`` / ``stats`` on every rank; returns the seconds the
        driver waited for the scorer (0 elsewhere)."""
        t0 = time.perf_counter()
        msg = None
        if is_driver:
            future, shape, self.future, self.shape = self.future, self.shape, None, None
            try:
                ro = apply_scores(rollouts, future.result())
                if shape is not None:
                    ro = shape(ro)
                msg = (ro.rewards, ro.correct, ro.stats)
            except Exception as e:  # noqa: BLE001 - every rank raises it below, not the driver alone
                msg = _portable(e)
        msg = broadcast_object(msg)
        if isinstance(msg, BaseException):
            raise msg
        rollouts.rewards, rollouts.correct, rollouts.stats = msg
        return time.perf_counter() - t0 if is_driver else 0.0

    def close(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)


def _portable(e: Exception) -> Exception:
    """``e`` itself when it pickles (its type decides how the loop stops), else a RuntimeError naming it."""
    try:
        pickle.loads(pickle.dumps(e))
        return e
    except Exception:  # noqa: BLE001 - any failure to pickle: fall back to the message
        return RuntimeError(f"reward scoring failed: {type(e).__name__}: {e}")
