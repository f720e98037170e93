"""Ranks 1..N wait for global rank 0 (the Ray driver) outside NCCL.

Rank 0 alone generates, scores and evaluates (``rollout/rollouts.py``, distributed by ``runtime/broadcast.py``: minutes to an hour on a
reasoning model's start-up eval) while the other ranks wait for its result. Waiting inside a
collective of the default group (``broadcast_object_list`` on NCCL) would meet the collective timeout
(``parallel.timeout_s``) and NCCL's watchdog, and the pending kernels would hold SMs a colocated
engine needs. So each broadcast from rank 0 is preceded by a wait in the c10d store the process group
was built on (``TCPStore``: no GPU, no watchdog):

* rank 0, once its data is ready: sets ``<prefix>/ready/<n>`` (``n`` counts the broadcasts, the same
  on every rank since every rank calls them in the same order) and then joins the broadcast;
* every other rank: polls ``store.check`` for that key (back-off up to ``poll_s``) and joins the
  broadcast once the key is there, so the collective itself starts only when its data is ready.

A dead rank 0 must not turn into a hang: rank 0 runs a daemon thread that bumps ``<prefix>/beat``
every ``beat_s`` seconds, and a waiter that sees the beat stand still for ``timeout_s`` (its own
clock; no clock skew between nodes matters) raises one line naming rank 0. A store that vanished (rank
0's process hosts it outside torchrun) raises at once.
"""
from __future__ import annotations

import logging
import threading
import time

log = logging.getLogger("megatron_rl.runtime.driver_wait")

#: the keys' root. Not torchrun's restart count: after one node's worker dies, that node's agent counts a
#: restart and the other nodes' agents restart on the membership change without counting one, so the
#: count differs between nodes (measured: a 2-node job's rank 1 then waited on keys rank 0 never set).
#: torch gives every rendezvous round a new agent TCPStore (``rendezvous._create_c10d_store``), so a
#: restarted worker group never sees an earlier round's keys anyway.
PREFIX = "megatron_rl/driver"


class DriverSilentError(RuntimeError):
    """Rank 0's heartbeat stopped for longer than ``parallel.timeout_s`` while this rank waited."""


class DriverWait:
    """Store-side rendezvous before each rank-0 broadcast (see module docstring)."""

    def __init__(self, store, rank: int, timeout_s: float, poll_s: float | None = None, beat_s: float | None = None,
                 prefix: str = PREFIX):
        if not timeout_s > 0:
            raise ValueError(f"timeout_s must be > 0, got {timeout_s}")
        self.store, self.rank, self.timeout_s, self.prefix = store, rank, float(timeout_s), prefix
        self.poll_s = float(poll_s) if poll_s else min(1.0, max(0.05, self.timeout_s / 8))
        self.beat_s = float(beat_s) if beat_s else min(10.0, max(0.1, self.timeout_s / 8))
        self.round = 0
        self.waited_s = 0.0          # total seconds this rank spent waiting (metrics, tests)
        self._stop = threading.Event()
        self._thread = None
        if rank == 0:
            self.store.add(f"{self.prefix}/beat", 1)
            self._thread = threading.Thread(target=self._beat, name="megatron-rl-driver-beat", daemon=True)
            self._thread.start()

    def _beat(self) -> None:
        while not self._stop.wait(self.beat_s):
            try:
                self.store.add(f"{self.prefix}/beat", 1)
            except Exception as e:   # the store is gone: the job is ending
                log.debug("driver heartbeat stopped: %s", e)
                return

    def stop(self) -> None:
        """Stop the heartbeat (shutdown; tests simulate a hung rank 0 with it)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def sync(self) -> None:
        """Rank 0: announce that round ``n``'s data is ready. Others: return once it is (see module
        docstring); :class:`DriverSilentError` when rank 0's heartbeat stood still for ``timeout_s``."""
        key = f"{self.prefix}/ready/{self.round}"
        self.round += 1
        if self.rank == 0:
            self.store.set(key, b"1")
            return
        t0 = time.monotonic()
        last, seen_at, nap = self._beats(), t0, 0.005
        while not self.store.check([key]):   # non-blocking (a timed store.wait logs two lines per timeout)
            time.sleep(nap)
            nap = min(self.poll_s, nap * 2)
            now, beats = time.monotonic(), self._beats()
            if beats != last:
                last, seen_at = beats, now
            elif now - seen_at > self.timeout_s:
                raise DriverSilentError(
                    f"rank {self.rank}: global rank 0 (the rollout driver) gave no sign of life for "
                    f"{now - seen_at:.0f} s (parallel.timeout_s={self.timeout_s:g}) while this rank waited for its "
                    f"broadcast #{self.round - 1}; see rank 0's log")
        self.waited_s += time.monotonic() - t0

    def _beats(self) -> int:
        return int(self.store.add(f"{self.prefix}/beat", 0))


_CURRENT: DriverWait | None = None
_STARTS = 0   # process groups started in this process: the same count on every rank, so a store that outlives
              # a group (torchrun's agent store) never shows a new group the old group's keys


def start(timeout_s: float | None) -> DriverWait | None:
    """Called by ``parallel.init_distributed`` right after the process group exists: rank 0's heartbeat
    runs from then on. None in a one-process world."""
    global _CURRENT, _STARTS
    import torch.distributed as dist  # lazy: defers torch to the call

    if _CURRENT is not None or not dist.is_initialized() or dist.get_world_size() == 1:
        return _CURRENT
    from torch.distributed.distributed_c10d import _get_default_store  # lazy: defers torch to the call

    _STARTS += 1
    _CURRENT = DriverWait(_get_default_store(), dist.get_rank(), timeout_s or 1800.0, prefix=f"{PREFIX}/{_STARTS}")
    return _CURRENT


def current() -> DriverWait | None:
    """The process's :class:`DriverWait` (None before :func:`start` or in a one-process world)."""
    return _CURRENT


def stop() -> None:
    """Stop rank 0's heartbeat and forget the instance (``parallel.destroy_parallel``)."""
    global _CURRENT
    if _CURRENT is not None:
        _CURRENT.stop()
    _CURRENT = None
