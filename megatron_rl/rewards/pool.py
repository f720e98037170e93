"""Reward scoring in worker processes, each task under a hard deadline.

:class:`RewardPool` runs ``target(*args)`` (``target`` = ``"module:function"``) for a list of argument
tuples on up to ``workers`` processes — by default one per CPU the driver may use
(``os.sched_getaffinity``) — and returns the results in order. It is the one place rewards are
guarded, the way Math-Verify's users guard it (a process that can be killed, not a thread):

- a task still running ``deadline_s`` after it started is killed with its worker (a fresh worker
  takes its place) and counts as a **timeout**; a result whose ``reason`` is ``"timeout"`` (the
  verifier's own alarm; or the first item of a tuple result) counts the same;
- a timeout is not a verdict: the task is run once more; a second timeout gives
  ``Verdict(0, "timeout")``, counted in :attr:`RewardPool.stats` (``reward/timeouts``);
- an exception raised by the reward function is re-raised here (same type when it pickles);
- a worker that dies on its own (a crash, the OOM killer) is replaced and its task retried once;
  a second death raises :class:`RewardPoolError` naming the task — never a hang.

Workers come from a ``forkserver`` (safe beside Ray / torch threads, unlike a bare fork) that
preloads the verifiers once; they ignore SIGINT (the driver's graceful stop owns Ctrl-C), the forkserver
from the first module it preloads on (``rewards/forkserver_signals.py`` says why).
"""
from __future__ import annotations

import atexit
import collections
import importlib
import multiprocessing as mp
import os
import signal
import threading
import time
import traceback
from multiprocessing.connection import wait

from megatron_rl.rewards.verdict import Verdict, reason_of

#: modules a worker imports once at start (the slow imports: sympy, math-verify's parser)
PRELOAD = ("megatron_rl.rewards.registry", "math_verify")
IN_WORKER = False
"""True inside a pool worker: the verifiers then run their checks in-process under their own alarm."""


class RewardPoolError(RuntimeError):
    """A reward worker died twice on the same task, or the pool could not start."""


#: preloaded first by the forkserver: it ignores SIGINT from then on (its docstring)
SIGNALS_MODULE = "megatron_rl.rewards.forkserver_signals"


def cpu_count() -> int:
    """CPUs this process may run on (its affinity mask, not the machine's count)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def _resolve(target: str):
    mod, _, fn = target.partition(":")
    return getattr(importlib.import_module(mod), fn)


def _worker_main(conn, preload) -> None:
    global IN_WORKER
    IN_WORKER = True
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    for m in preload:
        importlib.import_module(m)
    fns: dict = {}
    while True:
        try:
            msg = conn.recv()
        except (EOFError, OSError):
            return
        if msg is None:
            return
        tid, target, args = msg
        try:
            fn = fns.get(target) or fns.setdefault(target, _resolve(target))
            out = (tid, "ok", fn(*args), "")
        except BaseException as e:  # noqa: BLE001 -- reported to the driver, which re-raises
            out = (tid, "err", e, traceback.format_exc(limit=8))
        try:
            conn.send(out)
        except Exception:  # noqa: BLE001 -- an unpicklable exception: send its text
            conn.send((tid, "err", RuntimeError(repr(out[2])[:500]), out[3]))


class _Worker:
    def __init__(self, ctx, preload):
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=_worker_main, args=(child, preload), daemon=True, name="reward-worker")
        self.proc.start()
        child.close()
        self.task: int | None = None
        self.started = 0.0

    def kill(self) -> None:
        if self.proc.is_alive():
            self.proc.kill()
        self.proc.join(5)
        self.conn.close()

    def stop(self) -> None:
        try:
            self.conn.send(None)
        except (OSError, BrokenPipeError):
            pass
        self.proc.join(2)
        if self.proc.is_alive():
            self.proc.kill()
            self.proc.join(2)
        self.conn.close()


class RewardPool:
    """``map(target, args_list)`` on worker processes (module docstring). Thread-safe (one map at a time)."""

    def __init__(self, workers: int = 0, deadline_s: float = 10.0, preload=PRELOAD):
        self.size = workers if workers > 0 else cpu_count()
        self.deadline_s = float(deadline_s)
        self.preload = tuple(preload)
        self._workers: list[_Worker] = []
        self._lock = threading.Lock()
        self._ctx = None
        self.stats = {"timeouts": 0, "retries": 0, "killed": 0, "tasks": 0}

    def _context(self):
        if self._ctx is None:
            self._ctx = mp.get_context("forkserver")
            self._ctx.set_forkserver_preload([SIGNALS_MODULE, *self.preload])   # first: SIGINT ignored from here
        return self._ctx

    def _spawn(self) -> _Worker:
        try:
            return _Worker(self._context(), self.preload)
        except Exception as e:
            raise RewardPoolError(f"could not start a reward worker process: {e}") from e

    def _replace(self, w: _Worker) -> _Worker:
        w.kill()
        nw = self._spawn()
        self._workers[self._workers.index(w)] = nw
        return nw

    def map(self, target: str, args_list: list[tuple], deadline_s: float | None = None) -> list:
        """``[target(*a) for a in args_list]`` on the workers (module docstring for timeouts / failures)."""
        with self._lock:
            try:
                return self._map(target, list(args_list), self.deadline_s if deadline_s is None else deadline_s)
            except BaseException:
                for w in list(self._workers):   # tasks of this map still running: their replies must not leak
                    if w.task is not None:
                        w.task = None
                        self._replace(w)
                raise

    def _map(self, target: str, args_list: list[tuple], deadline: float) -> list:
        n = len(args_list)
        results: list = [None] * n
        attempts = [0] * n
        pending = collections.deque(range(n))
        while len(self._workers) < min(self.size, n):
            self._workers.append(self._spawn())
        self.stats["tasks"] += n
        done = 0
        while done < n:
            self._dispatch(target, args_list, pending, attempts)
            busy = [w for w in self._workers if w.task is not None]
            now = time.monotonic()
            wait_s = max(0.0, min(w.started + deadline for w in busy) - now) if busy else 0.0
            wait([x for w in busy for x in (w.conn, w.proc.sentinel)], timeout=wait_s + 0.01)
            for w in busy:
                done += self._collect(w, target, deadline, pending, attempts, results)
        return results

    def _dispatch(self, target: str, args_list: list[tuple], pending, attempts: list) -> None:
        """Hand the next pending task to each idle worker (a worker whose pipe broke is replaced and
        its task stays pending)."""
        for w in self._workers:
            if w.task is None and pending:
                i = pending.popleft()
                attempts[i] += 1
                try:
                    w.conn.send((i, target, args_list[i]))
                except (OSError, BrokenPipeError):
                    pending.appendleft(i)
                    attempts[i] -= 1
                    self._replace(w)
                    continue
                w.task, w.started = i, time.monotonic()

    def _collect(self, w, target: str, deadline: float, pending, attempts: list, results: list) -> int:
        """The outcome of busy worker ``w``'s task: its answer, its death or its deadline; a timed-out or
        crashed task is retried once. Returns 1 when the task's result is final, else 0."""
        i = w.task
        got = None
        try:
            if w.conn.poll():
                got = w.conn.recv()
        except (EOFError, OSError):
            got = None
        if got is not None and got[0] == i:
            w.task = None
            _, kind, val, tb = got
            if kind == "err":
                if isinstance(val, BaseException) and not isinstance(val, (KeyboardInterrupt, SystemExit)):
                    raise val from RuntimeError(f"in reward worker, task {i}:\n{tb}")
                raise RewardPoolError(f"reward task {i} failed: {val!r}\n{tb}")
            timed_out = reason_of(val[0] if isinstance(val, tuple) and val else val) == "timeout"
            if timed_out and attempts[i] < 2:
                self.stats["retries"] += 1
                pending.append(i)
                return 0
            if timed_out:
                self.stats["timeouts"] += 1
            results[i] = val
            return 1
        if not w.proc.is_alive():
            w.task = None
            code = w.proc.exitcode
            self._replace(w)
            if attempts[i] >= 2:
                raise RewardPoolError(f"reward worker died twice (exit code {code}) on task {i} of {target}; "
                                      "the reward function crashes its process on this input")
            pending.append(i)
            return 0
        if time.monotonic() - w.started > deadline:
            w.task = None
            self.stats["killed"] += 1
            self._replace(w)
            if attempts[i] < 2:
                self.stats["retries"] += 1
                pending.append(i)
                return 0
            self.stats["timeouts"] += 1
            results[i] = Verdict(0.0, "timeout")
            return 1
        return 0

    def close(self) -> None:
        for w in self._workers:
            w.stop()
        self._workers = []


_SHARED: dict = {}
_SHARED_LOCK = threading.Lock()


def shared_pool(workers: int = 0, deadline_s: float = 10.0) -> RewardPool:
    """The process-wide pool for (``workers``, ``deadline_s``), started on first use, closed at exit."""
    key = (workers, float(deadline_s))
    with _SHARED_LOCK:
        p = _SHARED.get(key)
        if p is None:
            p = _SHARED[key] = RewardPool(workers, deadline_s)
        return p


@atexit.register
def _close_all() -> None:
    for p in list(_SHARED.values()):
        p.close()
    _SHARED.clear()
