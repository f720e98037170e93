"""Ray bridge: rollout engines as Ray actors, driven by the trainer's rank 0 (the Ray driver).

``RolloutClient`` starts (or joins) Ray, creates ``num_engines`` engine actors, splits each
``generate`` call across them (contiguous, equal shares; results in prompt order; per-prompt seeds
offset by the global prompt index so results do not depend on the number of engines), and pushes
weights in buckets after every optimizer step (each bucket ``ray.put`` once, loaded by every actor).

Faults: an actor that dies (``RayActorError``, e.g. killed mid-generation) is replaced by a new one,
which loads the initial model dir and then replays the latest complete weight push (its bucket
refs are kept in the object store), and the failed share is retried. Restarts, retries and sync
volume/time are counted in :meth:`RolloutClient.stats` for the trainer's metrics.
"""
from __future__ import annotations

import dataclasses
import logging
import os
import time
from typing import Iterable

import torch

from .engine import Completion, SamplingParams
from .weight_sync import bucket_tensors, pack_bucket, unpack_bucket

log = logging.getLogger("megatron_rl.rollout.ray")


class _EngineActor:
    """Body of the Ray actor: one engine per process."""

    def __init__(self, kind: str, model_dir: str, engine_kwargs: dict):
        torch.set_num_threads(max(1, int(os.environ.get("OMP_NUM_THREADS", "1"))))
        from .hf_engine import make_engine

        self.engine = make_engine(kind, model_dir, **engine_kwargs)

    def ping(self) -> bool:
        return True

    def generate(self, prompts, sampling):
        return self.engine.generate(prompts, sampling)

    def score(self, seqs, lens, temperature):
        return self.engine.score(seqs, lens, temperature)

    def update_weights(self, metas, *flats) -> int:
        """``flats`` / ``metas``: buckets from ``weight_sync.pack_bucket`` (Ray resolves the top-level
        refs to zero-copy views of its shared memory)."""
        named = [nt for flat, meta in zip(flats, metas) for nt in unpack_bucket(flat, meta)]
        return self.engine.update_weights(named)

    def sleep(self):
        self.engine.sleep()

    def wake(self):
        self.engine.wake()


@dataclasses.dataclass
class RolloutStats:
    restarts: int = 0
    retries: int = 0
    sync_bytes: int = 0
    sync_seconds: float = 0.0
    weight_version: int = 0


class RolloutClient:
    """Trainer-side handle on a pool of engine actors (see module docstring)."""

    def __init__(self, engine_kind: str, model_dir: str, num_engines: int = 1, engine_kwargs: dict | None = None,
                 cpus_per_engine: float = 0.5, threads_per_engine: int = 1, max_restarts: int = 3,
                 sync_backend: str = "ray", ray_address: str | None = None):
        import ray

        if sync_backend != "ray":
            raise ValueError(f"sync_backend {sync_backend!r} is not available; supported here: 'ray' "
                             "(CUDA-IPC / NCCL weight sync is not implemented)")
        if num_engines < 1:
            raise ValueError(f"num_engines must be >= 1, got {num_engines}")
        os.environ.setdefault("RAY_AUTH_MODE", "disabled")
        if not ray.is_initialized():
            if ray_address:
                ray.init(address=ray_address, log_to_driver=False)
            else:
                ray.init(num_cpus=max(2, int(num_engines * cpus_per_engine + 1)), include_dashboard=False,
                         log_to_driver=False)
        self._ray = ray
        self.kind, self.model_dir = engine_kind, model_dir
        self.engine_kwargs = dict(engine_kwargs or {})
        self.cpus, self.threads = cpus_per_engine, threads_per_engine
        self.max_restarts = max_restarts
        self._latest: tuple = ()  # (metas, ObjectRefs) of the latest full weight push
        self._stats = RolloutStats()
        self.actors = [self._spawn() for _ in range(num_engines)]
        ray.get([a.ping.remote() for a in self.actors])

    def _spawn(self):
        cls = self._ray.remote(_EngineActor)
        env = {"OMP_NUM_THREADS": str(self.threads), "RAY_AUTH_MODE": "disabled", "TOKENIZERS_PARALLELISM": "false"}
        return cls.options(num_cpus=self.cpus, runtime_env={"env_vars": env}).remote(
            self.kind, self.model_dir, self.engine_kwargs)

    def _restart(self, i: int) -> None:
        if self._stats.restarts >= self.max_restarts:
            raise RuntimeError(f"rollout engine {i} died and the restart budget ({self.max_restarts}) is spent")
        log.warning("rollout engine %d died; restarting and re-syncing weights (version %d)", i,
                    self._stats.weight_version)
        self._stats.restarts += 1
        try:
            self._ray.kill(self.actors[i])
        except Exception:  # already dead
            pass
        self.actors[i] = self._spawn()
        if self._latest:
            metas, refs = self._latest
            self._ray.get(self.actors[i].update_weights.remote(metas, *refs))
        else:
            self._ray.get(self.actors[i].ping.remote())

    def _call_all(self, make_call, shares: list) -> list:
        """Run one call per actor share; restart + retry actors that die."""
        from ray.exceptions import RayActorError

        results: list = [None] * len(shares)
        pending = {i: make_call(self.actors[i], s) for i, s in enumerate(shares) if s is not None}
        while pending:
            for i, ref in list(pending.items()):
                try:
                    results[i] = self._ray.get(ref)
                    del pending[i]
                except RayActorError:
                    self._restart(i)
                    self._stats.retries += 1
                    pending[i] = make_call(self.actors[i], shares[i])
        return results

    def _split(self, n: int) -> list[tuple[int, int] | None]:
        k = len(self.actors)
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

    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]], bucket_bytes: int = 256 << 20) -> int:
        """Push a FULL set of HF-named weights to every engine; returns the new weight version."""
        t0 = time.perf_counter()
        refs, nbytes = [], 0
        for bucket in bucket_tensors(named_tensors, bucket_bytes):
            flat, meta = pack_bucket(bucket)
            nbytes += flat.nbytes
            refs.append((self._ray.put(flat), meta))
        shares = [True] * len(self.actors)
        metas, flat_refs = [m for _, m in refs], [r for r, _ in refs]
        self._call_all(lambda a, _s: a.update_weights.remote(metas, *flat_refs), shares)
        self._latest = (metas, flat_refs)
        self._stats.weight_version += 1
        self._stats.sync_bytes += nbytes
        self._stats.sync_seconds += time.perf_counter() - t0
        return self._stats.weight_version

    def kill_engine(self, i: int) -> None:
        """Kill actor ``i`` (fault-injection for tests and drills)."""
        self._ray.kill(self.actors[i], no_restart=True)

    def stats(self) -> dict[str, float]:
        return {f"rollout/{k}": float(v) for k, v in dataclasses.asdict(self._stats).items()}

    def shutdown(self) -> None:
        for a in self.actors:
            try:
                self._ray.kill(a)
            except Exception:
                pass
        self.actors = []
