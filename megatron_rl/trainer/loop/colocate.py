"""Colocated placement: the order in which engines and trainer take turns on the same GPUs.

With ``rollout.placement=colocated`` every step runs (:data:`ORDER`)::

    generate -> engines sleep -> trainer onload -> update -> trainer offload
             -> engines wake (weights) -> push -> engines wake (KV cache) -> next generate

``trainer.offload=all`` offloads in two stages: the optimizer state and gradients before the push,
the weights right after it (the push reads them), before the KV cache comes back. The set-up push
and start-up gate read the weights too, so set-up offloads the first stage only.

so the engines' KV cache never coexists with the trainer's optimizer state and gradients, and the
push holds only the engines' weights beside the trainer's. The engines sleep at level 2
(:data:`SLEEP_LEVEL`: weights and KV cache discarded) because the push re-sends every weight right
after the update — a level-1 host copy would be overwritten unread. ``rollout.placement=separate``:
none of it (:meth:`Colocation.separate`). Asynchronous rollouts (``rollout.max_staleness`` > 0)
overlap generation with the update, which one GPU cannot hold both of: refused at start-up.

Every rank calls the three hooks; the engines are driven from the Ray driver only (rank 0 holds the
``RolloutClient``), and a barrier after each engine change keeps a trainer rank from loading onto a
GPU whose engine has not released it yet. The trainer side is two callables, ``offload_trainer`` /
``onload_trainer`` (``trainer.offload``: the actor's ``offload`` / ``onload``), and
``offload_weights`` for the second stage; without them only the engines take turns. A checkpoint or
export in between runs inside :meth:`Colocation.trainer_loaded`. The hooks keep the turn they hand
over (:attr:`Colocation.turn`) and refuse one called out of :data:`ORDER` with a one-line error: a
loop that updated with the engines awake, or pushed into sleeping engines, would fail on a GPU with
an out-of-memory error far from its cause.
"""
from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Iterator
from typing import Any

#: vLLM's sleep level used between generation and the push (see the module docstring)
SLEEP_LEVEL = 2

#: one colocated step, as the loop runs it (``tests/unit/trainer/test_colocate.py`` records it)
ORDER = ("generate", "engines.sleep", "trainer.onload", "update", "trainer.offload", "engines.wake(weights)", "push",
         "trainer.offload(weights)", "engines.wake(kv_cache)")


def _noop() -> None:
    return None


def _barrier() -> None:
    import torch.distributed as dist  # lazy: defers torch to the call

    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.barrier()


@dataclasses.dataclass
class Colocation:
    """The colocated turn-taking of one rank; inactive for the separate placement.

    ``engines``: anything with ``sleep(level)`` / ``wake(tags)`` (the ``RolloutClient`` on the driver,
    an engine in tests); None on the other ranks."""

    engines: Any = None
    offload_trainer: Callable[[], None] = _noop
    onload_trainer: Callable[[], None] = _noop
    offload_weights: Callable[[], None] = _noop
    barrier: Callable[[], None] = _barrier
    active: bool = True
    #: whose turn it is: ``engines`` (generate; from :meth:`start`), ``trainer`` (update), ``push``
    turn: str = "engines"

    @classmethod
    def separate(cls) -> Colocation:
        return cls(active=False)

    def start(self) -> None:
        """At set-up, before the engines start: the trainer leaves the GPUs to them (their start-up
        sizes the KV cache from the free memory) and stays offloaded through the first push, the
        start-up gate and the first generate — the state every step's generate runs in."""
        if self.active:
            self.offload_trainer()
            self.barrier()

    def after_generate(self) -> None:
        """Engines sleep, then (every engine released) the trainer loads for the update."""
        if not self.active:
            return
        self._hand_over("engines", "trainer", "after_generate")
        if self.engines is not None:
            self.engines.sleep(SLEEP_LEVEL)
        self.barrier()
        self.onload_trainer()

    def before_push(self) -> None:
        """The trainer offloads, then the engines re-allocate their weights (not the KV cache)."""
        if not self.active:
            return
        self._hand_over("trainer", "push", "before_push")
        self.offload_trainer()
        self.barrier()
        if self.engines is not None:
            self.engines.wake(("weights",))

    def after_push(self) -> None:
        """The pushed weights are in: the trainer parks its weights (``all``), then the engines
        re-allocate their KV cache for the next generate."""
        if not self.active:
            return
        self._hand_over("push", "engines", "after_push")
        self.offload_weights()
        self.barrier()
        if self.engines is not None:
            self.engines.wake(("kv_cache",))

    def _hand_over(self, expected: str, nxt: str, hook: str) -> None:
        if self.turn != expected:
            raise RuntimeError(f"colocated placement: {hook}() in the {self.turn} turn, expected the {expected} "
                               f"turn (the step's order: {' -> '.join(ORDER)})")
        self.turn = nxt

    @contextlib.contextmanager
    def trainer_loaded(self) -> Iterator[None]:
        """The trainer on the device for a checkpoint or an export between two steps (engines awake:
        they keep their memory; a checkpoint is rare), parked again as it was afterwards."""
        if not self.active:
            yield
            return
        self.onload_trainer()
        try:
            yield
        finally:
            self.offload_trainer()
            self.offload_weights()


def build_colocation(cfg, actor, engines=None) -> Colocation:
    """``cfg.rollout.placement`` -> this rank's :class:`Colocation` (``engines``: the pool on the driver,
    None elsewhere — set by ``setup_run`` once the pool exists; the actor's ``offload`` / ``onload``
    when it has them)."""
    if cfg.rollout.placement != "colocated":
        return Colocation.separate()
    if not hasattr(actor, "offload"):
        return Colocation(engines=engines)
    two_stage = actor.offload_mode == "all"
    return Colocation(engines=engines,
                      offload_trainer=(lambda: actor.offload("optimizer")) if two_stage else actor.offload,
                      onload_trainer=actor.onload,
                      offload_weights=(lambda: actor.offload("all")) if two_stage else _noop)
