"""The trainer's rollout client: generation on the engine pool, driven by the trainer's rank 0 (the Ray driver).

:class:`RolloutClient` is the engine pool (``rollout/engine_pool.py``: the Ray actors, restarts, sleep /
wake) with its weight sync (``rollout/pool_sync.py``); this module adds what the trainer asks of it per
step. ``generate`` splits each call across the engines that hold the current weights (contiguous, equal
shares; results in prompt order; per-prompt seeds offset by the global prompt index so results do not
depend on the number of engines), as ``score`` does; engines with in-flight updates also take groups one
by one (``submit`` / ``harvest``, ``rollout/partial_pool.py``). A share whose engine died is retried on a fresh
one (``EnginePool._call_all``).
"""
from __future__ import annotations

import dataclasses
import time

from .engine import Completion, SamplingParams
from .pool_sync import SyncedPool
from .registry import caps


class RolloutClient(SyncedPool):
    """Trainer-side handle on a pool of engine actors (module docstring). The arguments are
    :class:`~megatron_rl.rollout.pool_sync.SyncedPool`'s: the engine, its model dir and count, the weight
    transport (``rollout.sync_backend``) and the actors' Ray placement. A subclass may name another engine
    implementation in ``engine_impl`` (``module:Class``: the test helpers' faulty engines).
    """

    def __init__(self, *args, **kwargs):
        self._where: dict = {}         # submit(): key of a group in flight -> its engine
        super().__init__(*args, **kwargs)

    def _split(self, n: int) -> list[tuple[int, int] | None]:
        k = len(self._fresh())
        bounds = [round(j * n / k) for j in range(k + 1)]
        return [(bounds[j], bounds[j + 1]) if bounds[j + 1] > bounds[j] else None for j in range(k)]

    def generate(self, prompts: list[list[int]], sampling: SamplingParams) -> list[Completion]:
        """All completions, ordered by (prompt_index, sample_index) over the whole prompt list."""
        if not prompts:
            raise ValueError("generate() called with no prompts")
        shares = self._split(len(prompts))

        def call(actor, share):
            lo, hi = share
            sp = sampling if sampling.seed is None else dataclasses.replace(sampling, seed=sampling.seed + lo)
            return actor.generate.remote(prompts[lo:hi], sp)

        out = []
        for share, res in zip(shares, self._call_all(call, shares)):
            if share is not None:
                out.extend(dataclasses.replace(c, prompt_index=c.prompt_index + share[0]) for c in res)
        return out

    def score(self, sequences: list[list[int]], prompt_lens: list[int], temperature: float = 1.0) -> list[list[float]]:
        shares = self._split(len(sequences))
        res = self._call_all(lambda a, s: a.score.remote(sequences[s[0]:s[1]], prompt_lens[s[0]:s[1]], temperature), shares)
        return [x for r in res if r is not None for x in r]

    def submit(self, key, prompt: list[int], sampling: SamplingParams) -> None:
        """Start one group (``sampling.n`` samples of ``prompt``) under ``key`` on the engine with the
        fewest groups in flight (engines with in-flight updates); :meth:`harvest` returns it finished."""
        if not caps(self.kind).inflight_updates:
            raise ValueError(f"the {self.kind} engine takes no groups in flight (its CAPS.inflight_updates is False)")
        if key in self._where:
            raise ValueError(f"a group with key {key!r} is already in flight")
        load = {i: 0 for i in self._fresh()}
        for i in self._where.values():
            load[i] = load.get(i, 0) + 1
        i = min(load, key=lambda j: (load[j], j))
        self._ray.get(self.actors[i].submit.remote(key, prompt, sampling))
        self._where[key] = i

    def harvest(self, wait_s: float = 0.0, min_groups: int = 1) -> list[tuple]:
        """Finished groups ``(key, [Completion per sample])`` from every engine, waiting up to ``wait_s``
        for ``min_groups`` of them (fewer when fewer are in flight)."""
        deadline, out = time.monotonic() + wait_s, []
        while True:
            busy = sorted(set(self._where.values()))
            left = max(0.0, deadline - time.monotonic())
            want = min(min_groups, len(self._where) + len(out)) - len(out)
            slice_s = min(left, 0.5) if want > 0 else 0.0
            for res in self._ray.get([self.actors[i].harvest.remote(slice_s, 1) for i in busy]):
                for key, comps in res:
                    del self._where[key]
                    out.append((key, comps))
            if len(out) >= min(min_groups, len(out) + len(self._where)) or time.monotonic() >= deadline:
                return out

    def in_flight(self) -> list:
        """Keys of the groups submitted and not harvested yet."""
        return list(self._where)

    def push_stats(self) -> list[dict]:
        """Each in-flight engine's pushes, paused seconds and cache resets (``AsyncVLLMEngine.push_stats``)."""
        return self._ray.get([a.push_stats.remote() for a in self.actors])
