"""The engine pool: rollout engines as Ray actors, one engine per actor process, driven by the trainer's
rank 0 (the Ray driver).

:class:`EnginePool` starts (or joins) Ray (``rollout/ray_cluster.py``), places ``num_engines`` actors
(one placement-group bundle each) and builds each engine from its import path (``rollout.engine``,
``rollout/registry.py``). It runs one call per share of work on the engines that hold the current
weights, sleeps and wakes them (colocated placement), and hands out their settings and parameters.

Faults: an actor that dies (``RayActorError``, e.g. killed mid-generation) is replaced by a new one
and its share is retried on an engine that holds the current weights. Nothing of the last push is
kept (no model copy in the object store): the replacement starts from the model dir and is marked
stale (no work) until the next sync (``rollout/pool_sync.py``, which rebuilds its transfer group when
an engine is replaced). Restarts, retries and sync volume/time are counted in :meth:`EnginePool.stats`
for the trainer's metrics.
"""
from __future__ import annotations

import dataclasses
import logging
import os
import time
import warnings

import torch

from ..runtime.device import pin_process
from .ray_cluster import placement_group, start_ray
from .registry import caps, engine_path, make_engine

log = logging.getLogger("megatron_rl.rollout.ray")

#: calls an in-flight engine's actor serves at once (generate / harvest / push steps / stats)
INFLIGHT_CONCURRENCY = 8


class _EngineActor:
    """Body of the Ray actor: one engine per process (the cluster tests find it in Ray's logs by this name)."""

    def __init__(self, impl: str, model_dir: str, engine_kwargs: dict):
        cores = os.environ.get("MEGATRON_RL_CPU_CORES")
        if cores:   # asynchronous runs: the engines' own cores, disjoint from the trainer's
            pin_process(int(c) for c in cores.split(","))
        torch.set_num_threads(max(1, int(os.environ.get("OMP_NUM_THREADS", "1"))))

        self.engine = make_engine(impl, model_dir, **engine_kwargs)

    def ping(self) -> bool:
        return True

    def generate(self, prompts, sampling):
        return self.engine.generate(prompts, sampling)

    def score(self, seqs, lens, temperature):
        return self.engine.score(seqs, lens, temperature)

    def submit(self, key, prompt, sampling):
        """Start a group under ``key`` (engines with in-flight updates: ``AsyncVLLMEngine.submit``)."""
        self.engine.submit(key, prompt, sampling)

    def harvest(self, wait_s: float, min_groups: int):
        return self.engine.harvest(wait_s, min_groups)

    def push_stats(self) -> dict:
        return self.engine.push_stats()

    def weight_transfer(self, method: str, kwargs: dict, *buffers):
        """A weight-transfer call on the engine (see ``VLLMEngine.weight_transfer``); a top-level
        ``buffers[0]`` (a Ray object: a zero-copy view of the object store) becomes the update's
        packed ``buffer`` (``ray`` backend)."""
        if buffers:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # the view is read-only; the engine only reads it
                buf = torch.frombuffer(buffers[0], dtype=torch.uint8) if len(buffers[0]) else torch.empty(0, dtype=torch.uint8)
            kwargs = {**kwargs, "update_info": {**kwargs["update_info"], "buffer": buf}}
        return self.engine.weight_transfer(method, **kwargs)

    def named_parameters(self) -> dict:
        return self.engine.named_parameters()

    def engine_config(self) -> dict:
        """The settings the engine was built with (vLLM's record; ``{}`` for an engine without one) and
        the Ray node this actor runs on."""
        import ray  # lazy: defers ray to the call

        cfg = getattr(self.engine, "engine_config", None)
        return {**(cfg() if cfg is not None else {}), "node_id": ray.get_runtime_context().get_node_id()}

    def hf_named_parameters(self) -> dict:
        return self.engine.hf_named_parameters()

    def load_adapter(self, version: int, config: dict, tensors: dict) -> dict:
        """``lora.push: adapter``: install adapter ``version`` (``VLLMEngine.load_adapter``)."""
        return self.engine.load_adapter(version, config, tensors)

    def adapter_tensors(self) -> dict:
        return self.engine.adapter_tensors()

    def adapter_versions(self) -> list[int]:
        """The adapter versions on this engine's disk (the current one only, between pushes)."""
        return self.engine.adapters.versions() if getattr(self.engine, "adapters", None) is not None else []

    def sleep(self, level: int):
        self.engine.sleep(level)

    def wake(self, tags):
        self.engine.wake(tags)


@dataclasses.dataclass
class RolloutStats:
    restarts: int = 0
    retries: int = 0
    sync_bytes: int = 0
    sync_seconds: float = 0.0
    weight_version: int = 0
    sleeps: int = 0               # colocated placement: engine sleeps (one per step)
    sleep_seconds: float = 0.0    # ... and the seconds spent in sleep + wake calls


class EnginePool:
    """The engine actors of one run (module docstring).

    ``engine_kind``: a registered engine name (``rollout/registry.py``). ``engine_kwargs``: what each
    actor builds its engine with. ``gpus_per_engine`` / ``actor_env``: Ray placement of the engine actors
    on GPU machines. ``engine_gpus``: the node-local GPU ids a Ray started here may hand to the engines
    (``rollout/placement.engine_gpus``).
    """

    def __init__(self, engine_kind: str, model_dir: str, num_engines: int = 1, engine_kwargs: dict | None = None,
                 cpus_per_engine: float = 0.5, threads_per_engine: int = 1, max_restarts: int = 3,
                 ray_address: str | None = None, gpus_per_engine: float = 0.0, actor_env: dict | None = None,
                 engine_gpus: list[int] | None = None):
        import ray  # lazy: defers ray to the call

        if num_engines < 1:
            raise ValueError(f"num_engines must be >= 1, got {num_engines}")
        start_ray(ray_address, max(2, int(num_engines * cpus_per_engine + 1)), engine_gpus)
        self._ray = ray
        # absolute: an engine process on a cluster does not run in the trainer's working directory
        self.kind, self.model_dir = engine_kind, os.path.abspath(model_dir) if os.path.exists(model_dir) else model_dir
        self.engine_kwargs = dict(engine_kwargs or {})
        self.cpus, self.threads, self.gpus = cpus_per_engine, threads_per_engine, gpus_per_engine
        self._pg = placement_group(num_engines, cpus_per_engine, gpus_per_engine)
        self.actor_env = dict(actor_env or {})
        self.max_restarts = max_restarts
        self.engine_impl = getattr(self, "engine_impl", None) or engine_path(engine_kind)   # what the actors build
        self._stats = RolloutStats()
        self._stale: set[int] = set()  # replaced engines that have not received the current weights
        self.actors = [self._spawn(i) for i in range(num_engines)]
        ray.get([a.ping.remote() for a in self.actors])

    def _spawn(self, i: int):
        """Engine ``i`` in bundle ``i`` of the pool's placement group (a replacement takes its bundle)."""
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy  # lazy: defers ray to the call

        cls = self._ray.remote(_EngineActor)
        env = {"OMP_NUM_THREADS": str(self.threads), "RAY_AUTH_MODE": "disabled", "TOKENIZERS_PARALLELISM": "false",
               **self.actor_env}
        where = PlacementGroupSchedulingStrategy(self._pg, placement_group_bundle_index=i)
        # an engine with in-flight updates takes a push (and harvests) while a generate call runs: threaded actor
        conc = INFLIGHT_CONCURRENCY if caps(self.kind).inflight_updates else 1
        return cls.options(num_cpus=self.cpus, num_gpus=self.gpus, runtime_env={"env_vars": env}, max_concurrency=conc,
                           scheduling_strategy=where).remote(self.engine_impl, self.model_dir, self.engine_kwargs)

    def _restart(self, i: int) -> None:
        if self._stats.restarts >= self.max_restarts:
            raise RuntimeError(f"rollout engine {i} died and the restart budget ({self.max_restarts}) is spent")
        log.warning("rollout engine %d died; replacing it (it gets weight version %d at the next sync)", i,
                    self._stats.weight_version)
        self._stats.restarts += 1
        try:
            self._ray.kill(self.actors[i])
        except Exception:  # already dead
            pass
        self.actors[i] = self._spawn(i)
        self._ray.get(self.actors[i].ping.remote())
        if self._stats.weight_version > 0:  # the model dir is not the current policy any more
            self._stale.add(i)
        self._engine_replaced(i)

    def _engine_replaced(self, i: int) -> None:
        """Called after engine ``i`` was replaced (the pool's weight sync rebuilds its transfer group)."""

    def _fresh(self) -> list[int]:
        fresh = [i for i in range(len(self.actors)) if i not in self._stale]
        if not fresh:
            raise RuntimeError("no rollout engine holds the current weights (all were replaced since the last sync)")
        return fresh

    def _call_all(self, make_call, shares: list) -> list:
        """Run one call per share on the fresh engines; a share whose engine died is retried on a
        fresh engine after the dead one is replaced."""
        from ray.exceptions import RayActorError  # lazy: defers ray to the call

        fresh = self._fresh()
        results: list = [None] * len(shares)
        where = {i: fresh[i] for i, s in enumerate(shares) if s is not None}
        pending = {i: make_call(self.actors[a], shares[i]) for i, a in where.items()}
        while pending:
            for i, ref in list(pending.items()):
                try:
                    results[i] = self._ray.get(ref)
                    del pending[i]
                except RayActorError:
                    if where[i] not in self._stale and self._ray_dead(where[i]):
                        self._restart(where[i])
                    self._stats.retries += 1
                    where[i] = self._fresh()[i % len(self._fresh())]
                    pending[i] = make_call(self.actors[where[i]], shares[i])
        return results

    def _ray_dead(self, a: int) -> bool:
        from ray.exceptions import RayError  # lazy: defers ray to the call

        try:
            self._ray.get(self.actors[a].ping.remote(), timeout=60)
            return False
        except RayError:  # dead actor, or no answer within a minute
            return True

    def engine_configs(self) -> list[dict]:
        """Each engine's settings as its engine recorded them (``VLLMEngine.engine_config``) and its Ray node."""
        return self._ray.get([a.engine_config.remote() for a in self.actors])

    def engine_parameters(self, i: int) -> dict[str, torch.Tensor]:
        """Copies of engine ``i``'s parameters (engine names) — verification in tests. Copied out
        of the object store at once, so nothing stays pinned there."""
        return {k: v.clone() for k, v in self._ray.get(self.actors[i].named_parameters.remote()).items()}

    def engine_hf_parameters(self) -> list[dict[str, torch.Tensor]]:
        """Every engine's parameters under the trainer's HF names (``hf_named_parameters``), one dict per
        engine holding the current weights (replaced engines waiting for a sync are left out): sync
        verification. Copied out of the object store one engine at a time."""
        return [{k: v.clone() for k, v in self._ray.get(self.actors[i].hf_named_parameters.remote()).items()}
                for i in self._fresh()]

    def engine_adapter_tensors(self) -> list[dict[str, torch.Tensor]]:
        """Every fresh engine's current adapter tensors (PEFT names, as vLLM loaded them): sync verification of
        ``lora.push: adapter``, one engine at a time, copied out of the object store."""
        return [{k: v.clone() for k, v in self._ray.get(self.actors[i].adapter_tensors.remote()).items()}
                for i in self._fresh()]

    def kill_engine(self, i: int) -> None:
        """Kill actor ``i`` (fault-injection for tests and drills)."""
        self._ray.kill(self.actors[i], no_restart=True)

    def sleep(self, level: int = 1) -> None:
        """Every engine sleeps (``RolloutEngine.sleep``; colocated placement, ``trainer/loop/colocate.py``)."""
        t0 = time.perf_counter()
        self._ray.get([a.sleep.remote(level) for a in self.actors])
        self._stats.sleeps += 1
        self._stats.sleep_seconds += time.perf_counter() - t0

    def wake(self, tags: tuple[str, ...] | None = None) -> None:
        """Every engine re-allocates ``tags`` (``("weights",)`` before a push, ``("kv_cache",)`` after)."""
        t0 = time.perf_counter()
        self._ray.get([a.wake.remote(tags) for a in self.actors])
        self._stats.sleep_seconds += time.perf_counter() - t0

    def stats(self) -> dict[str, float]:
        return {f"rollout/{k}": float(v) for k, v in dataclasses.asdict(self._stats).items()}

    def shutdown(self) -> None:
        """Kill every actor and free the placement group."""
        for a in self.actors:
            try:
                self._ray.kill(a)
            except Exception:
                pass
        self.actors = []
        if self._pg is not None:
            from ray.util import remove_placement_group  # lazy: defers ray to the call

            remove_placement_group(self._pg)
            self._pg = None
