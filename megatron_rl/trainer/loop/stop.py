"""Graceful stop of a training run on SIGINT (Ctrl-C) or SIGTERM (Slurm preemption, ``kill``, and
torchrun, which forwards the signal it receives to its workers).

Why a flag and not Python's default ``KeyboardInterrupt``: an exception raised at an arbitrary
bytecode aborts whatever runs — a checkpoint half written (a ``.tmp-step_*`` directory left behind),
one rank leaving a collective its peers are still in (a hang until the collective timeout), a
73-line traceback. Instead the first signal only sets a flag; the loop finishes the step in flight
(a signal that lands during a checkpoint write lets the write finish), and at the step boundary
every rank agrees (:meth:`GracefulStop.agreed`: one small all-gather, so SPMD ranks take the same
decision even when only some of them got the signal), writes a checkpoint of that step, prints one
line saying how to resume and exits with :func:`exit_code` (128 + the signal number, as a shell
reports a process killed by that signal: **130** for SIGINT, **143** for SIGTERM; never 1 = runtime
error or 2 = usage/config error). The mismatch guard (``trainer/loop/guard.py``, ``rollout.mismatch_policy=stop``)
ends a run through the same boundary (checkpoint, one line) with status :data:`GUARD_EXIT` = 3.

A second signal stops at once: one short line, this process's own children ended (:func:`end_children`:
the local Ray's GCS, raylet and agents and the engine workers they started, which otherwise outlive
the driver -- two Ray agents were still alive 45 s after a SIGTERM during engine start-up), then
``os._exit`` — no other cleanup, no traceback (a checkpoint cut short leaves a ``.tmp-step_*``
directory that the next start removes, ``checkpoint.remove_stale_tmp``). Before the run is
:meth:`~GracefulStop.arm`-ed (start-up: nothing to save yet) the first signal already stops at once,
the same way. ``ray.init`` would replace the SIGTERM handler; ``rollout/ray_cluster.py`` puts it back
as soon as ``ray.init`` returns.

A rank that cannot reach the boundary (stuck in a collective with a dead peer) is ended by its
launcher's escalation (torchrun sends SIGKILL after its grace period; Slurm after ``KillWait``).

Handlers are installed only in the main thread (Python's rule), re-taken after ``ray.init`` (which
installs its own SIGTERM handler, ``sys.exit``) with :meth:`~GracefulStop.reclaim`, and the previous
ones are restored on exit: the demo and the tests run ``loop.run`` in-process.
"""
from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
from collections.abc import Callable

from megatron_rl.runtime.console import fresh_line  # imported now: a signal handler should not import

try:
    import psutil  # Ray's dependency: the process tree for end_children
except ImportError:  # pragma: no cover
    psutil = None

SIGNALS = (signal.SIGINT, signal.SIGTERM)


def exit_code(signum: int) -> int:
    """The process exit status of a run stopped by ``signum``: 128 + signum (130 SIGINT, 143 SIGTERM)."""
    return 128 + int(signum)


#: exit status of a run the mismatch guard stopped (``trainer/loop/guard.py``, ``rollout.mismatch_policy=stop``):
#: not 0 (done), 1 (runtime error), 2 (usage / config error) nor 128 + a signal
GUARD_EXIT = 3


class Stopped(SystemExit):
    """Raised by the loop after a graceful stop; a ``SystemExit`` so the process ends with
    :func:`exit_code` (a signal) or :data:`GUARD_EXIT` (``signum`` 0: a guard stopped the run,
    ``reason`` says why) and no traceback wherever ``loop.run`` was called from."""

    def __init__(self, signum: int, reason: str = ""):
        super().__init__(exit_code(signum) if signum else GUARD_EXIT)
        self.signum, self.reason = signum, reason


class Halted(SystemExit):
    """Raised by the loop when it stops itself at a step boundary for a reason of its own (a failed
    weight-sync verification), after checkpointing that step: exit status 1 and ``line`` on stderr —
    from the driver only (``say``), so a torchrun job prints it once — without a traceback."""

    def __init__(self, line: str, say: bool = True):
        super().__init__(line if say else 1)
        self.line = line


def _say(text: str) -> None:
    """Write one line to stderr from a signal handler (``print`` may be inside a write already), on a
    line of its own (``console.fresh_line``: not after the progress bar)."""
    with contextlib.suppress(OSError):
        os.write(2, (fresh_line() + text + "\n").encode())


def _kept(last_checkpoint: Callable[[], str | None], otherwise: str = "") -> str:
    """What a stop at once leaves: the newest complete checkpoint, or that none was written yet."""
    try:
        last = last_checkpoint()
    except Exception:  # noqa: BLE001 (said while leaving: must not raise)
        last = None
    return f"the last complete checkpoint is kept: {last}" if last else \
        "no checkpoint was written yet" + (f", {otherwise}" if otherwise else "")


def _leave_now(line: str, code: int) -> None:
    """Stop at once: ``line`` on stderr, this process's children ended, ``os._exit(code)`` (no other cleanup)."""
    _say(line)
    with contextlib.suppress(Exception):      # best effort: we are leaving
        sys.stdout.flush()
    with contextlib.suppress(Exception):
        end_children()
    os._exit(code)


def end_children(grace_s: float = 3.0) -> int:
    """End every descendant process of this one (SIGTERM, then SIGKILL after ``grace_s``); returns how
    many there were. Collected before any is signalled, so the grandchildren of a child that dies
    first (the raylet's agents and workers) are still known."""
    if psutil is None:
        return 0
    try:
        kids = psutil.Process().children(recursive=True)
    except psutil.Error:
        return 0
    for k in kids:
        with contextlib.suppress(psutil.Error):
            k.terminate()
    _, alive = psutil.wait_procs(kids, timeout=grace_s)
    for k in alive:
        with contextlib.suppress(psutil.Error):
            k.kill()
    psutil.wait_procs(alive, timeout=grace_s)
    return len(kids)


class GracefulStop:
    """Context manager: while inside, SIGINT / SIGTERM set :attr:`signum` (first) or end the
    process at once (second, or any before :meth:`arm`). Previous handlers are restored on exit."""

    def __init__(self):
        self.signum = 0                 # the first signal received (0: none)
        self.armed = False
        self.active = False
        self.last_checkpoint: Callable[[], str | None] = lambda: None   # what a stop at once leaves (arm)
        self._previous: dict[int, object] = {}

    # ---- handler state machine --------------------------------------------------------------
    def _handler(self, signum, frame) -> None:
        name = signal.Signals(signum).name
        if self.signum or not self.armed:
            if not self.armed:
                said = "stopping now (nothing to save yet): start-up, nothing trained"
            else:
                said = "stopping now (second signal); " + _kept(self.last_checkpoint,
                                                                "so the steps trained so far are lost")
            _leave_now(f"[megatron-rl] {name}: {said}", exit_code(signum))
        self.signum = signum
        if os.environ.get("RANK", "0") == "0":    # one acknowledgement per run, not one per rank
            _say(f"[megatron-rl] {name}: finishing the current step, then checkpoint and stop "
                 "(send it again to stop at once)")

    def __enter__(self):
        self.active = threading.current_thread() is threading.main_thread()
        if self.active:
            for s in SIGNALS:
                self._previous[s] = signal.signal(s, self._handler)
        return self

    def reclaim(self) -> None:
        """Take the signals back from a library that replaced our handler (``ray.init`` does, for
        SIGTERM); its handler becomes the one restored on exit."""
        if not self.active:
            return
        for s in SIGNALS:
            cur = signal.getsignal(s)
            if cur != self._handler:
                self._previous[s] = cur
                signal.signal(s, self._handler)

    def arm(self, last_checkpoint: Callable[[], str | None] | None = None) -> None:
        """From now on the first signal means "finish the step, checkpoint, stop"; ``last_checkpoint``
        names the newest complete checkpoint at any moment (said by a stop at once; none: nothing saved)."""
        self.armed = True
        if last_checkpoint is not None:
            self.last_checkpoint = last_checkpoint

    def __exit__(self, *exc) -> None:
        if self.active:
            for s, h in self._previous.items():
                signal.signal(s, h)
            self._previous.clear()
            self.active = False

    # ---- step boundary ---------------------------------------------------------------------
    def agreed(self) -> int:
        """Collective (every rank, at the same step boundary): the signal to stop on, the largest
        one any rank received (0: go on). Without torch.distributed: this process's flag."""
        import torch.distributed as dist  # lazy: defers torch to the call

        if not dist.is_initialized() or dist.get_world_size() == 1:
            return self.signum
        got = [0] * dist.get_world_size()
        dist.all_gather_object(got, self.signum)
        return max(got)


class StepWatchdog:
    """A bound on the time of one step (``trainer.step_timeout_s``): a step still running past it ends the
    process -- one line naming the step and the newest complete checkpoint, this process's children ended
    (:func:`end_children`: the local Ray, its engines, the reward workers), exit status 1 -- from a timer
    thread, since the main thread is the one that is stuck (a grader that never answers, an engine that
    hangs, a collective with a dead peer). Why not an exception: a stuck thread cannot be interrupted
    from outside, and the launcher's own time limits (Slurm's ``--time``) end the job hours later without
    a word. ``timeout_s`` 0: no bound."""

    def __init__(self, timeout_s: float, last_checkpoint: Callable[[], str | None] = lambda: None):
        self.timeout_s, self.last_checkpoint = float(timeout_s), last_checkpoint

    @contextlib.contextmanager
    def step(self, step: int):
        if not self.timeout_s:
            yield
            return
        done = threading.Event()
        t = threading.Thread(target=self._watch, args=(step, done), name=f"step-watchdog-{step}", daemon=True)
        t.start()
        try:
            yield
        finally:
            done.set()

    def _watch(self, step: int, done: threading.Event) -> None:
        if done.wait(self.timeout_s):
            return
        _leave_now(f"[megatron-rl] step {step} has run for more than trainer.step_timeout_s={self.timeout_s:g} s: "
                   f"stopping the run and its engines; {_kept(self.last_checkpoint)}", 1)
