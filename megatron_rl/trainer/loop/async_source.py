"""Asynchronous rollouts (``rollout.max_staleness = k >= 1``): a producer thread on the driver.

While the trainer updates on the batch of step t, a background thread on global rank 0 (the Ray
driver) runs the data path's ``collect(j)`` for the next steps j = t+1..t+k with the weights the
engines hold. ``collect`` is driver-only and issues no ``torch.distributed`` collective (the loop
broadcasts what :meth:`AsyncProducer.get` returns), so the thread never races the trainer's
collectives.

Schedule (weight version v = optimizer steps in the engines' weights)::

    batch j is generated entirely with v = max(0, j - 1 - k)          (staleness of step j's update: min(j-1, k))

It is enforced, not timed: the producer starts batch j only once v >= j - 1 - k, and the weight
push that ends step t (v: t-1 -> t) first waits until batch t + k is finished
(:meth:`before_push`). So a push never cuts a generation in half — it waits at a batch boundary.
Engine calls are Ray actor methods, which run one at a time per actor, and no ``generate`` is
outstanding while the push runs; the push ends with the engines' cache reset
(``VLLMEngine.reset_caches``, which vLLM refuses while any request holds KV blocks), so no request
is served across a push and batch t+k+1 starts without a KV block of the old weights. We do NOT use vLLM's ``pause_generation(mode="keep")``: it exists
only on ``AsyncLLM`` (our engines are the synchronous in-process ``LLM``), and a request resumed on
new weights would mix weight versions inside one response at timing-dependent token positions,
which no resume could reproduce. The cost of waiting at the boundary is bounded by one batch's
generation time, which the step would have waited for anyway when generation is the longer stage.

Crash-consistent resume (see :meth:`state_dict`): a checkpoint is written after step s's weight
push, when batches s+1..s+k are finished (they were generated with v <= s-1, weights that no longer
exist anywhere) and batch s+k+1 may be in flight with v = s — exactly the checkpoint's weights. So
the checkpoint stores the FINISHED pending batches whole (token ids, behaviour log-probs, rewards,
weight version: small next to the model) and, for the in-flight one, only what regenerates it: the
sampler position after batch s+k (the sampling seeds derive from the step number, and its weights
are the checkpoint's). ``kill -9`` anywhere, then ``--resume auto``, reproduces the uninterrupted
run exactly on CPU. Storing old weight versions to regenerate the finished batches would cost k
extra model copies per checkpoint; draining (waiting for them) is free since the push already did.
"""
from __future__ import annotations

import dataclasses
import logging
import os
import threading
import time
from collections.abc import Callable
from typing import Any

from megatron_rl.rewards.judge_client import JudgeRejected

log = logging.getLogger("megatron_rl.trainer.async")

#: producer wait timeout: a wedged engine surfaces as an error instead of a silent hang
WAIT_S = 24 * 3600.0


@dataclasses.dataclass
class Tagged:
    """One step's collected batch with what produced it.

    ``step``: the RL step it is for (sampling seeds derive from it); ``weight_version``: optimizer
    steps in the weights it was sampled with; ``sampler_before`` / ``sampler_after``: the prompt
    sampler's state when its collection started / ended; ``gen_s``: wall seconds of the collection;
    ``data``: whatever ``collect(step)`` returned."""

    step: int
    weight_version: int
    sampler_before: dict | None
    sampler_after: dict | None
    data: Any
    gen_s: float = 0.0


class AsyncProducer:
    """Background ``collect`` for steps ahead of the trainer (module docstring for the schedule).

    ``collect(step)``: the data path's driver-side collection. ``first_step`` / ``last_step``: the
    steps this run trains. ``version``: weight version the engines hold now (the resumed step).
    ``sampler_state``: returns the prompt sampler's state (recorded around each collection).
    ``pending``: finished batches restored from a checkpoint (:meth:`state_dict`).
    """

    def __init__(self, collect: Callable[[int], Any], *, first_step: int, last_step: int, max_staleness: int,
                 version: int, sampler_state: Callable[[], dict | None] = lambda: None, pending: list | tuple = ()):
        if max_staleness < 1:
            raise ValueError(f"AsyncProducer needs max_staleness >= 1, got {max_staleness}")
        self._collect, self._sampler_state = collect, sampler_state
        self.k, self.last, self.version = max_staleness, last_step, version
        self._ready: dict[int, Tagged] = {t.step: t for t in pending}
        bad = [s for s in self._ready if not first_step <= s <= first_step + max_staleness - 1]
        if bad:
            raise ValueError(f"pending batches for steps {bad} do not follow a checkpoint of step {first_step - 1} "
                             f"with max_staleness={max_staleness}")
        self._next = max([first_step - 1, *self._ready]) + 1
        self._after: dict[int, dict | None] = {}
        self._busy: list[tuple[float, float]] = []
        self._running: float | None = None
        self._error: BaseException | None = None
        self._closed = False
        self._cond = threading.Condition()
        self._thread = threading.Thread(target=self._run, name="async-rollout", daemon=True)
        self._thread.start()

    # ---- producer thread -------------------------------------------------------------------
    def _allowed(self, j: int) -> bool:
        return self.version >= max(0, j - 1 - self.k)

    def _run(self) -> None:
        try:
            while True:
                with self._cond:
                    while not self._closed and self._next <= self.last and not self._allowed(self._next):
                        self._cond.wait()
                    if self._closed or self._next > self.last:
                        return
                    j, v = self._next, self.version
                    t0 = self._running = time.perf_counter()
                before = self._sampler_state()
                data = self._collect(j)
                t1 = time.perf_counter()
                tag = Tagged(j, v, before, self._sampler_state(), data, t1 - t0)
                with self._cond:
                    self._ready[j], self._after[j] = tag, tag.sampler_after
                    self._busy.append((t0, t1))
                    self._running, self._next = None, j + 1
                    self._cond.notify_all()
        except BaseException as e:  # noqa: BLE001 (re-raised on the trainer's thread)
            with self._cond:
                self._error, self._running = e, None
                self._cond.notify_all()

    # ---- trainer (main) thread -------------------------------------------------------------
    def _wait(self, cond: Callable[[], bool], what: str) -> float:
        t0 = time.perf_counter()
        with self._cond:
            while not cond():
                if self._error is not None:
                    raise RuntimeError(f"asynchronous rollout failed while {what}: {self._error}") from self._error
                if not self._thread.is_alive() and not cond():
                    raise RuntimeError(f"asynchronous rollout thread ended while {what}")
                if not self._cond.wait(timeout=WAIT_S):
                    raise TimeoutError(f"asynchronous rollout: no progress in {WAIT_S:.0f} s while {what}")
        return time.perf_counter() - t0

    def get(self, step: int) -> tuple[Tagged, float]:
        """The batch of ``step`` (waiting for it) and the seconds the trainer waited."""
        waited = self._wait(lambda: step in self._ready, f"waiting for the batch of step {step}")
        with self._cond:
            return self._ready.pop(step), waited

    def before_push(self, step: int) -> float:
        """Before the weight push that ends ``step``: wait until every batch that must be generated
        with the current weights (up to step + k) is finished; returns the seconds waited."""
        upto = min(step + self.k, self.last)
        return self._wait(lambda: self._next > upto, f"draining the batches up to step {upto} before the weight push")

    def pushed(self, version: int) -> None:
        """The engines now hold weight version ``version``: the producer may start the next batch."""
        with self._cond:
            self.version = version
            self._cond.notify_all()

    def state_dict(self, step: int) -> dict:
        """What a checkpoint after ``step`` (after its weight push) records: the finished pending
        batches (steps step+1..step+k) and the sampler position the in-flight batch started from."""
        upto = min(step + self.k, self.last)
        with self._cond:
            missing = [j for j in range(step + 1, upto + 1) if j not in self._ready]
            if missing or self._next <= upto:
                raise RuntimeError(f"checkpoint of step {step}: pending batches {missing} are not finished "
                                   "(checkpoint only after the step's weight push)")
            sampler = self._after.get(upto)
            pending = [self._ready[j] for j in range(step + 1, upto + 1)]
        return {"max_staleness": self.k, "version": self.version, "pending": pending, "sampler": sampler}

    def engine_busy(self, t0: float, t1: float) -> float:
        """Seconds within [t0, t1] during which a collection was running (engines busy)."""
        with self._cond:
            spans = list(self._busy) + ([(self._running, time.perf_counter())] if self._running is not None else [])
            self._busy = [s for s in self._busy if s[1] > t0]     # older spans can never overlap a later window
        return overlap(spans, t0, t1)

    def close(self, timeout: float = 5.0) -> None:
        """Stop after the collection in flight (if any); the thread is a daemon, so a wedged engine
        call cannot keep the process alive."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        self._thread.join(timeout=timeout)


def overlap(spans: list[tuple[float, float]], t0: float, t1: float) -> float:
    """Total length of the (disjoint) intervals ``spans`` inside the window [t0, t1]."""
    return sum(max(0.0, min(b, t1) - max(a, t0)) for a, b in spans)


def resume_refusal(state: dict | None, max_staleness: int, partial: bool) -> str | None:
    """Why a checkpoint's ``async`` entry cannot continue in a run with ``rollout.max_staleness`` and
    ``rollout.partial.enable`` (one line), or None. The start-up checks ask it before anything starts
    (``preflight_resume.check_resume_state``), so ``--check`` refuses what the resume itself would."""
    state = state or {}
    if state.get("pending") and state["max_staleness"] != max_staleness:
        return (f"the checkpoint holds {len(state['pending'])} rollout batch(es) generated ahead with "
                f"rollout.max_staleness={state['max_staleness']}; resume with the same value (got {max_staleness}) so "
                "they are consumed as the uninterrupted run would")
    if state.get("partial") and not partial:
        return (f"the checkpoint holds {len(state['partial']['pending'])} partial-rollout group(s) in flight: resume "
                "with rollout.partial.enable=true (only the partial source regenerates them)")
    return None


def restore_state(state: dict | None, max_staleness: int) -> tuple[list, dict | None]:
    """(pending batches, sampler state) from a checkpoint's ``async`` entry for a run with
    ``max_staleness``; a checkpoint with batches in flight resumes only with the same value."""
    if not state or not state.get("pending"):
        return [], None if not state else state.get("sampler")
    if state["max_staleness"] != max_staleness:
        raise ValueError(resume_refusal(state, max_staleness, True))
    return list(state["pending"]), state["sampler"]


@dataclasses.dataclass(frozen=True)
class CorePlan:
    """Disjoint CPU sets: ``trainer[r]`` for trainer rank r (local), ``engines`` for the engine actors."""

    trainer: tuple[frozenset, ...]
    engines: frozenset


#: the cores this process could use when it started (before any pinning narrowed them)
_BOOT_CORES = tuple(sorted(os.sched_getaffinity(0))) if hasattr(os, "sched_getaffinity") else (0,)


def local_plan() -> CorePlan | None:
    """This node's split for its ``LOCAL_WORLD_SIZE`` trainer processes (torchrun; 1 otherwise), or None when
    nothing is pinned (CUDA present: :func:`core_split`).

    Why pin at all: measured here, a vLLM-CPU ``generate`` (64 samples, <= 96 tokens) took 0.40 s
    alone and 0.44 s beside a busy trainer thread when engine and trainer had disjoint cores, but
    3.7 – 24 s when both floated over the same two cores (``benchmarks/bench_async.py``'s setup)."""
    from megatron_rl.runtime.device import has_cuda  # lazy: defers torch to the call

    return core_split(has_cuda(), _BOOT_CORES, int(os.environ.get("LOCAL_WORLD_SIZE", "1")))


#: the line a trainer rank logs when an overlapped run (async / partial) pins nothing
PINNING_OFF = ("asynchronous rollouts: trainer and engines not pinned to cores (CUDA present: the engines run on "
               "GPUs, and a first-half / second-half split of the cores would ignore NUMA and GPU affinity)")


def core_split(cuda: bool, cores, trainer_procs: int) -> CorePlan | None:
    """Whether an overlapped run (``rollout.max_staleness`` > 0 or ``rollout.partial``) pins the trainer
    and the engines to disjoint cores, and how: None (no pinning, no core environment for the engines)
    when CUDA is present, else :func:`core_plan` of ``cores``.

    Why not on a GPU node (review row S4): the split was measured for CPU engines competing with the
    trainer for the same cores. With CUDA the engines generate on GPUs, and the split — every trainer
    rank, all its threads (NCCL's proxy threads included) and torch's intra-op pool on a round-robin slice
    of the first half of the node's cores — ignores NUMA and GPU affinity: on a two-socket node the ranks
    whose GPUs hang off socket 1 would run on socket 0."""
    return None if cuda else core_plan(list(cores), trainer_procs)


def core_plan(cores: list[int], trainer_procs: int, engine_share: float = 0.5) -> CorePlan:
    """Split the visible ``cores``: the last ``max(1, round(share·n))`` go to the engines, the rest
    are dealt round-robin to the ``trainer_procs`` local trainer ranks. With one core there is
    nothing to split (both get it)."""
    cores = sorted(cores)
    if len(cores) < 2:
        return CorePlan(tuple(frozenset(cores) for _ in range(trainer_procs)), frozenset(cores))
    n_eng = min(len(cores) - 1, max(1, round(engine_share * len(cores))))
    eng, rest = cores[len(cores) - n_eng:], cores[:len(cores) - n_eng]
    per = [frozenset(rest[r::trainer_procs]) or frozenset(rest) for r in range(trainer_procs)]
    return CorePlan(tuple(per), frozenset(eng))


def pin_trainer(plan: CorePlan, local_rank: int) -> frozenset:
    """Pin this trainer process (every thread, and torch's intra-op pool) to its cores; returns them."""
    from megatron_rl.runtime.device import pin_process  # lazy: defers torch to the call

    mine = plan.trainer[local_rank % len(plan.trainer)]
    pin_process(mine)
    return mine


def pin_local_trainer(plan: CorePlan | None, local_rank: int) -> frozenset | None:
    """An overlapped run's trainer rank ``local_rank`` on its cores of ``plan`` (:func:`local_plan`), one log
    line saying which; ``plan`` None (CUDA: :func:`core_split`): nothing pinned, one line saying so and why."""
    if plan is None:
        log.info(PINNING_OFF)
        return None
    mine = pin_trainer(plan, local_rank)
    log.info("asynchronous rollouts: trainer on cores %s, engines on %s", sorted(mine), sorted(plan.engines))
    return mine


def engine_env(plan: CorePlan | None) -> dict | None:
    """Environment of the engine actors: their core set (applied in the actor, ``rollout/engine_pool.py``) and
    as many intra-op threads as cores; None without a plan (CUDA: :func:`core_split`)."""
    if plan is None:
        return None
    return {"MEGATRON_RL_CPU_CORES": ",".join(str(c) for c in sorted(plan.engines)),
            "OMP_NUM_THREADS": str(len(plan.engines))}


def check_async(kind: str, path_cls, max_staleness: int, off_policy: str) -> None:
    """Start-up rule: a data path that cannot run asynchronously (its class sets
    ``DataPath.async_unsupported`` to the reason) fails here, naming the combination; so does
    ``algo.off_policy`` other than decoupled / none on such a path (its loss takes no importance
    weight, and ``bypass`` would drop the old-log-prob pass its own metrics read)."""
    why = getattr(path_cls, "async_unsupported", "")
    if not why:
        return
    name = getattr(path_cls, "name", path_cls.__name__)
    if max_staleness > 0:
        raise ValueError(f"algo.kind={kind!r} (data path {name!r}) cannot run with rollout.max_staleness="
                         f"{max_staleness}: {why}; use rollout.max_staleness=0")
    if off_policy not in ("decoupled", "none"):
        raise ValueError(f"algo.kind={kind!r} (data path {name!r}) cannot run with algo.off_policy={off_policy}: its "
                         "registered loss takes no importance weight; use algo.off_policy=decoupled or none")


class AsyncRollouts:
    """The loop's handle on asynchronous collection; every rank makes the same calls, only the
    driver (global rank 0) owns an :class:`AsyncProducer`.

    Per step t: ``data, meta = next(t)`` (collective: the batch and its tag, broadcast) → update →
    ``before_push(t)`` (driver waits for the batches due before the push) → weight push →
    ``pushed(t)``. ``state(t)`` is the checkpoint's ``async`` entry (driver), ``metrics`` the step's
    ``time/gen_batch`` and idle fractions.
    """

    def __init__(self, collect: Callable[[int], Any], *, is_driver: bool, first_step: int, last_step: int,
                 max_staleness: int, version: int, sampler=None, pending: list | tuple = (), deliver=None):
        self.is_driver, self.k = is_driver, max_staleness
        self.deliver = deliver       # the batch to every rank (``trainer/pipeline/dispatch.deliver``); None: broadcast
        self.producer = None
        if is_driver:
            self.producer = AsyncProducer(collect, first_step=first_step, last_step=last_step,
                                          max_staleness=max_staleness, version=version,
                                          sampler_state=(sampler.state_dict if sampler is not None else lambda: None),
                                          pending=pending)
        self.waited = 0.0

    def next(self, step: int) -> tuple[Any, dict]:
        """Collective: the batch of ``step`` and ``{weight_version, staleness, gen_s}`` (the latter broadcast
        first: a grader's refusal stops every rank there; then the batch, through ``deliver``)."""
        from megatron_rl.runtime.broadcast import broadcast_object  # lazy: defers torch to the call

        head, data = None, None
        if self.is_driver:
            try:
                tag, self.waited = self.producer.get(step)
            except RuntimeError as e:   # the producer's grader refused its requests: every rank stops on it
                if not isinstance(e.__cause__, JudgeRejected):
                    raise
                tag, head = None, e.__cause__
            if tag is not None:
                if hasattr(tag.data, "weight_version"):   # Rollouts: each sample carries its weight version
                    tag.data.weight_version = tag.weight_version
                data = tag.data
                head = {"weight_version": tag.weight_version, "staleness": step - 1 - tag.weight_version,
                        "gen_s": tag.gen_s}
        head = broadcast_object(head)
        if isinstance(head, JudgeRejected):
            raise head
        return (self.deliver or broadcast_object)(data), head

    def before_push(self, step: int) -> None:
        if self.is_driver:
            self.waited += self.producer.before_push(step)

    def pushed(self, step: int) -> None:
        if self.is_driver:
            self.producer.pushed(step)

    def state(self, step: int) -> dict | None:
        """Driver: the in-flight state a checkpoint after ``step`` records (``AsyncProducer.state_dict``)."""
        return self.producer.state_dict(step) if self.is_driver else None

    def metrics(self, t0: float, t1: float, gen_s: float) -> dict:
        """Step window [t0, t1]: trainer idle = its waits for data; engines idle = no collection running."""
        dt = max(t1 - t0, 1e-9)
        busy = self.producer.engine_busy(t0, t1) if self.is_driver else 0.0
        return {"time/gen_batch": gen_s, "perf/trainer_idle_frac": self.waited / dt,
                "perf/engine_idle_frac": max(0.0, 1.0 - busy / dt)}

    def close(self) -> None:
        if self.producer is not None:
            self.producer.close()


def sync_metrics(t_gen: float, t_step: float) -> dict:
    """The same step metrics for a synchronous step (generation and training alternate)."""
    dt = max(t_step, 1e-9)
    return {"time/gen_batch": t_gen, "perf/trainer_idle_frac": t_gen / dt,
            "perf/engine_idle_frac": max(0.0, 1.0 - t_gen / dt)}
