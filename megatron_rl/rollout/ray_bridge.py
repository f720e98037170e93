"""Ray bridge: rollout engines as Ray actors, driven by the trainer's rank 0 (the Ray driver).

``RolloutClient`` starts (or joins) Ray, creates ``num_engines`` engine actors, splits each
``generate`` call across them (contiguous, equal shares; results in prompt order; per-prompt seeds
offset by the global prompt index so results do not depend on the number of engines), and pushes
weights after every optimizer step through the transport of ``rollout.sync_backend`` that the
engine class declares it accepts (``rollout/transport.py``: gloo | ray on CPU, nccl | ipc on GPU).
The control plane is :class:`ActorSyncClient` (vLLM's four-method ``VLLMWeightSyncClient`` over our
actors); the data plane is the transport's. The engine is named by ``rollout.engine``
(``rollout/registry.py``); the actors build it from its import path.

Faults: an actor that dies (``RayActorError``, e.g. killed mid-generation) is replaced by a new one
and its share is retried on an engine that holds the current weights. Nothing of the last push is
kept (no model copy in the object store): the replacement starts from the model dir, is marked
stale (no work) and receives the current weights with the next sync, for which the transfer group
is rebuilt with every engine. Restarts, retries and sync volume/time are counted in
:meth:`RolloutClient.stats` for the trainer's metrics.
"""
from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import signal
import threading
import time
import warnings
from collections.abc import Iterable

import torch

from .registry import caps, engine_path, make_engine
from .transport import resolve_backend, sender_opener
from ..runtime.device import gpu_count, has_cuda, pin_process
from ..runtime.launch_env import check_ray_address

from .engine import Completion, SamplingParams
from .weight_sync import RoundSource

log = logging.getLogger("megatron_rl.rollout.ray")

#: calls an in-flight engine's actor serves at once (generate / harvest / push steps / stats)
INFLIGHT_CONCURRENCY = 8


class _EngineActor:
    """Body of the Ray actor: one engine per process."""

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

    def sleep(self, level: int):
        self.engine.sleep(level)

    def wake(self, tags):
        self.engine.wake(tags)


class ActorSyncClient:
    """vLLM's ``VLLMWeightSyncClient`` protocol over our engine actors: every call fans out to all
    actors and blocks on all of them. ``init_weight_transfer_engine`` gives engine ``i`` its own
    ``rank_offset`` (``1 + i × ranks_per_engine``): our engines are independent ``LLM``s, each
    with its worker at rank 0 of its own parallel config (vLLM's ``RayVLLMWeightSyncClient`` sends
    one payload to all handles, which suits one multi-DP engine, not this)."""

    def __init__(self, actors: list, ranks_per_engine: int = 1, versioned: bool = False):
        import ray  # lazy: defers ray to the call

        self._ray, self.actors, self.ranks = ray, list(actors), ranks_per_engine
        self.versioned = versioned      # engines that label tokens with the version (in-flight updates)
        self.next_version: int | None = None   # the version the round being sent installs (RolloutClient sets it)

    def _all(self, method: str, per_actor=None, **kwargs):
        refs = [a.weight_transfer.remote(method, per_actor(i) if per_actor else kwargs) for i, a in enumerate(self.actors)]
        return self._ray.get(refs)

    def init_weight_transfer_engine(self, init_info: dict) -> None:
        def info(i):
            d = dict(init_info)
            if "rank_offset" in d:
                d["rank_offset"] = d["rank_offset"] + i * self.ranks
            return {"init_info": d}
        self._all("init_weight_transfer_engine", info)

    def shutdown_weight_transfer_engine(self) -> None:
        self._all("shutdown_weight_transfer_engine")

    def start_weight_update(self) -> None:
        self._all("start_weight_update")

    def update_weights(self, update_info) -> None:
        self._all("update_weights", update_info=update_info)

    def finish_weight_update(self, weight_version: str | None = None) -> None:
        v = self.next_version if weight_version is None else int(weight_version)
        self._all("finish_weight_update", **({"weight_version": v} if self.versioned and v is not None else {}))

    def submit_update(self, update_info: dict, buffer_ref) -> list:
        """``update_weights`` with a packed bucket in the object store (``ray`` backend); returns refs."""
        return [a.weight_transfer.remote("update_weights", {"update_info": update_info}, buffer_ref) for a in self.actors]

    def stats(self) -> list[dict]:
        """Each engine's transfer stage times since the last call (then reset)."""
        return self._all("stats")


def object_store_bytes() -> int:
    """Bytes in use in the Ray object store of this cluster (the GCS / raylet store stats)."""
    import ray  # lazy: defers ray to the call
    from ray._private.internal_api import get_memory_info_reply, get_state_from_address  # lazy: defers ray to the call

    reply = get_memory_info_reply(get_state_from_address(ray.get_runtime_context().gcs_address))
    return int(reply.store_stats.object_store_bytes_used)


@dataclasses.dataclass
class RolloutStats:
    restarts: int = 0
    retries: int = 0
    sync_bytes: int = 0
    sync_seconds: float = 0.0
    weight_version: int = 0
    sleeps: int = 0               # colocated placement: engine sleeps (one per step)
    sleep_seconds: float = 0.0    # ... and the seconds spent in sleep + wake calls


class RolloutClient:
    """Trainer-side handle on a pool of engine actors (see module docstring).

    ``engine_kind``: a registered engine name (``rollout/registry.py``). ``sync_backend``: auto | ray |
    gloo | nccl | ipc (``transport.resolve_backend``, from what the engine class accepts; an
    impossible choice raises here, at start-up). ``bucket_bytes``: packed bucket size.
    ``trainer_world``: trainer processes (ipc needs 1). ``gpus_per_engine`` / ``actor_env``: Ray
    placement of the engine actors on GPU machines. ``placement``: ``rollout.placement`` (it picks
    the auto backend; None: unstated, as before the key existed). ``engine_gpus``: the node-local
    GPU ids a Ray started here may hand to the engines (``rollout/placement.engine_gpus``).
    """

    def __init__(self, engine_kind: str, model_dir: str, num_engines: int = 1, engine_kwargs: dict | None = None,
                 cpus_per_engine: float = 0.5, threads_per_engine: int = 1, max_restarts: int = 3,
                 sync_backend: str = "auto", ray_address: str | None = None, bucket_bytes: int = 256 << 20,
                 trainer_world: int = 1, gpus_per_engine: float = 0.0, actor_env: dict | None = None,
                 placement: str | None = None, engine_gpus: list[int] | None = None):
        import ray  # lazy: defers ray to the call

        if num_engines < 1:
            raise ValueError(f"num_engines must be >= 1, got {num_engines}")
        if bucket_bytes <= 0:
            raise ValueError(f"bucket_bytes must be > 0, got {bucket_bytes}")
        self.backend = resolve_backend(sync_backend, engine_kind, has_cuda(), trainer_world, placement)
        self._opener = sender_opener(self.backend)   # the chosen transport's sender module, imported here
        os.environ.setdefault("RAY_AUTH_MODE", "disabled")
        if not ray.is_initialized():
            ray_address = ray_address or os.environ.get("RAY_ADDRESS")   # Ray's own variable (`ray job submit`)
            if ray_address:
                check_ray_address(ray_address)   # ray.init retries an address nobody serves forever
                with _keep_signal_handlers():
                    ray.init(address=ray_address, log_to_driver=False, logging_level=logging.WARNING)
                log.info("rollout: joined the Ray cluster at %s", ray_address)
            else:
                _init_local_ray(max(2, int(num_engines * cpus_per_engine + 1)), engine_gpus)
        self._ray = ray
        # absolute: an engine process on a cluster does not run in the trainer's working directory
        self.kind, self.model_dir = engine_kind, os.path.abspath(model_dir) if os.path.exists(model_dir) else model_dir
        self.engine_kwargs = dict(engine_kwargs or {})
        self.engine_kwargs["weight_transfer"] = caps(engine_kind).transports[self.backend]   # its receiving side
        self.tp = int(self.engine_kwargs.get("tensor_parallel_size", 1))   # worker ranks per engine (sync group)
        self.cpus, self.threads, self.gpus = cpus_per_engine, threads_per_engine, gpus_per_engine
        self._pg = _placement_group(num_engines, cpus_per_engine, gpus_per_engine)
        self.actor_env = dict(actor_env or {})
        self.max_restarts, self.bucket_bytes = max_restarts, bucket_bytes
        self.engine_impl = getattr(self, "engine_impl", None) or engine_path(engine_kind)   # what the actors build
        self._stats = RolloutStats()
        self._transfer = None     # the sender's TrainerWeightTransferEngine (opened at the first sync)
        self._stale: set[int] = set()  # replaced engines that have not received the current weights
        self._where: dict = {}         # submit(): key of a group in flight -> its engine
        self.last_sync: dict = {}
        self.actors = [self._spawn(i) for i in range(num_engines)]
        ray.get([a.ping.remote() for a in self.actors])
        log.info("rollout: %d %s engine(s), weight sync backend %s", num_engines, engine_kind, self.backend)

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
        self._close_transfer(reinit=True)

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

    def score(self, sequences: list[list[int]], prompt_lens: list[int], temperature: float = 1.0) -> list[list[float]]:
        shares = self._split(len(sequences))
        res = self._call_all(lambda a, s: a.score.remote(sequences[s[0]:s[1]], prompt_lens[s[0]:s[1]], temperature), shares)
        return [x for r in res if r is not None for x in r]

    def update_weights(self, named_tensors: RoundSource | Iterable[tuple[str, torch.Tensor]],
                       bucket_bytes: int | None = None) -> int:
        """Push a FULL set of HF-named weights to every engine; returns the new weight version.

        ``named_tensors``: a :class:`RoundSource` (metadata + streaming iterator: the trainer's
        path) or materialised ``(name, tensor)`` pairs. The first call (and the first after an
        engine was replaced) opens the transfer group with every engine (vLLM's rendezvous).
        """
        src = named_tensors if isinstance(named_tensors, RoundSource) else RoundSource.from_tensors(named_tensors)
        t0 = time.perf_counter()
        if bucket_bytes is not None and bucket_bytes != self.bucket_bytes:
            self.bucket_bytes = bucket_bytes
            self._close_transfer(reinit=True)
        if self._transfer is None:
            self._open_transfer()
        self._transfer.source = src
        self._sync_client.next_version = self._stats.weight_version + 1
        try:
            self._transfer.send_weights()
        except Exception as e:
            self._close_transfer(reinit=True)
            raise RuntimeError(f"weight sync ({self.backend}) failed: {e}") from e
        self._stale.clear()
        self.last_sync = dict(getattr(self._transfer, "last", {}))
        self._stats.weight_version += 1
        self._stats.sync_bytes += src.total_bytes()
        self._stats.sync_seconds += time.perf_counter() - t0
        return self._stats.weight_version

    def _open_transfer(self) -> None:
        self._sync_client = ActorSyncClient(self.actors, ranks_per_engine=self.tp,   # every engine TP rank receives
                                            versioned=caps(self.kind).inflight_updates)
        self._transfer = self._opener(self.backend, self._sync_client, self.bucket_bytes, 1 + len(self.actors) * self.tp,
                                      master_address=_node_ip())

    def _close_transfer(self, reinit: bool) -> None:
        """Tear the transfer group down on both sides (the next sync re-opens it with every engine)."""
        if self._transfer is None:
            return
        from ray.exceptions import RayError  # lazy: defers ray to the call

        try:
            self._transfer.shutdown()
            live = [a for i, a in enumerate(self.actors) if not self._ray_dead(i)]
            self._ray.get([a.weight_transfer.remote("shutdown_weight_transfer_engine", {}) for a in live])
        except (RayError, RuntimeError, OSError) as e:  # a half-broken group: engines are re-initialised anyway
            log.warning("closing the weight-transfer group: %s", e)
        self._transfer = None

    def engine_configs(self) -> list[dict]:
        """Each engine's settings as its engine recorded them (``VLLMEngine.engine_config``) and its Ray node."""
        return self._ray.get([a.engine_config.remote() for a in self.actors])

    def engine_transfer_stats(self) -> list[dict]:
        """Each engine's receive / load / finish seconds since the last call (benchmarks)."""
        return ActorSyncClient(self.actors).stats()

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

    def set_sync_backend(self, backend: str, trainer_world: int = 1) -> None:
        """Switch the weight transport without restarting the engines (e.g. gloo <-> ray, which
        share the engines' worker engine); the next sync opens the new one."""
        new = resolve_backend(backend, self.kind, has_cuda(), trainer_world)
        side = caps(self.kind).transports[new]
        if side != self.engine_kwargs["weight_transfer"]:
            raise ValueError(f"sync backend {new} needs engines built for {side!r}; these were built "
                             f"for {self.engine_kwargs['weight_transfer']!r}")
        self._close_transfer(reinit=True)
        self.backend, self._opener = new, sender_opener(new)

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
        if self._transfer is not None:
            try:
                self._transfer.shutdown()
            except (RuntimeError, OSError) as e:
                log.warning("closing the weight-transfer group at shutdown: %s", e)
            self._transfer = None
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


def _placement_group(num_engines: int, cpus: float, gpus: float, timeout_s: float = 300.0):
    """One Ray placement-group bundle per engine (its CPUs and its ``gpus`` = TP GPUs, so an engine's
    TP ranks share a node), strategy SPREAD: engines over the cluster's nodes rather than all on
    the driver's. A cluster that cannot hold the bundles within ``timeout_s`` is one line, not a hang."""
    import ray  # lazy: defers ray to the call
    from ray.util import placement_group, remove_placement_group  # lazy: defers ray to the call

    bundle = {"CPU": cpus, **({"GPU": gpus} if gpus else {})}
    pg = placement_group([dict(bundle) for _ in range(num_engines)], strategy="SPREAD")
    if not pg.wait(timeout_seconds=timeout_s):
        remove_placement_group(pg)
        raise RuntimeError(f"rollout: Ray cannot place {num_engines} engine(s) of {bundle} within {timeout_s:.0f} s "
                           f"(cluster resources {ray.cluster_resources()}); lower rollout.num_engines or "
                           "rollout.tensor_parallel_size, or add nodes")
    return pg


@contextlib.contextmanager
def _keep_signal_handlers():
    """``ray.init`` installs its own SIGTERM handler first thing (``sys.exit(15)``: exit status 15, no
    line, Ray's processes left running while engines start); the caller's handlers (``trainer/loop/stop.py``:
    one line, 143, Ray's processes ended) are put back as soon as it returns, and a SIGTERM that Ray's
    handler turned into ``SystemExit(15)`` meanwhile is handed to the caller's handler."""
    main = threading.current_thread() is threading.main_thread()
    saved = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)} if main else {}
    try:
        yield
    except SystemExit as e:
        ours = saved.get(signal.SIGTERM)
        if e.code != signal.SIGTERM or not callable(ours):
            raise
        ours(signal.SIGTERM, None)   # e.g. GracefulStop's: one line, Ray's processes ended, exit 143
        raise
    finally:
        for s, h in saved.items():
            if h is not None and signal.getsignal(s) != h:
                signal.signal(s, h)


def _init_local_ray(num_cpus: int, engine_gpus: list[int] | None) -> None:
    """A Ray of this node; with ``engine_gpus`` it sees only those GPUs (Ray takes its GPU ids from
    ``CUDA_VISIBLE_DEVICES`` at start and hands them to the actors that ask for GPUs), so a separate
    placement's engines never land on a trainer GPU. The driver's own CUDA context is already bound."""
    import ray  # lazy: defers ray to the call

    saved = os.environ.get("CUDA_VISIBLE_DEVICES")
    if engine_gpus is not None:
        ids = saved.split(",") if saved else [str(i) for i in range(gpu_count())]
        os.environ["CUDA_VISIBLE_DEVICES"] = ",".join(ids[i] for i in engine_gpus)
    try:
        with _keep_signal_handlers():   # "Started a local Ray instance" (INFO) stays off the console
            ray.init(num_cpus=num_cpus, include_dashboard=False, log_to_driver=False, logging_level=logging.WARNING)
    finally:
        if saved is None:
            os.environ.pop("CUDA_VISIBLE_DEVICES", None)
        else:
            os.environ["CUDA_VISIBLE_DEVICES"] = saved


def _node_ip() -> str:
    """Address the engines reach the sender at: this node's IP in the Ray cluster."""
    import ray  # lazy: defers ray to the call

    return ray.util.get_node_ip_address()
