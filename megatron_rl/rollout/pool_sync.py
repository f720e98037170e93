"""Weight sync to the engine pool: after every optimizer step the trainer pushes a full set of HF-named
weights to every engine actor through the transport of ``rollout.sync_backend`` that the engine class
declares it accepts (``rollout/transport.py``: gloo | ray on CPU, nccl | ipc on GPU).

The control plane is :class:`ActorSyncClient` (vLLM's four-method ``VLLMWeightSyncClient`` over our
actors); the data plane is the transport's sender. :class:`SyncedPool` is the engine pool
(``rollout/engine_pool.py``) with its transport: the backend is resolved before any engine starts (an
impossible choice is refused at start-up), the engines are built for its receiving side, and the
transfer group is opened at the first sync and rebuilt with every engine after one was replaced.
"""
from __future__ import annotations

import logging
import time
from collections.abc import Iterable

import torch

from ..runtime.device import has_cuda
from .engine_pool import EnginePool
from .ray_cluster import node_ip
from .registry import caps
from .transport import resolve_backend, sender_opener
from .weight_sync import DEFAULT_BUCKET_BYTES, RoundSource

log = logging.getLogger("megatron_rl.rollout.ray")


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
        self.next_version: int | None = None   # the version the round being sent installs (SyncedPool sets it)

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


class SyncedPool(EnginePool):
    """The engine pool with its weight transport (module docstring).

    ``sync_backend``: auto | ray | gloo | nccl | ipc (``transport.resolve_backend``, from what the engine
    class accepts; an impossible choice raises here, at start-up). ``bucket_bytes``: packed bucket size.
    ``trainer_world``: trainer processes (ipc needs 1). ``placement``: ``rollout.placement`` (it picks the
    auto backend; None: unstated, as before the key existed). The rest: :class:`EnginePool`'s.
    """

    def __init__(self, engine_kind: str, model_dir: str, num_engines: int = 1, engine_kwargs: dict | None = None,
                 cpus_per_engine: float = 0.5, threads_per_engine: int = 1, max_restarts: int = 3,
                 sync_backend: str = "auto", ray_address: str | None = None, bucket_bytes: int = DEFAULT_BUCKET_BYTES,
                 trainer_world: int = 1, gpus_per_engine: float = 0.0, actor_env: dict | None = None,
                 placement: str | None = None, engine_gpus: list[int] | None = None):
        if num_engines < 1:
            raise ValueError(f"num_engines must be >= 1, got {num_engines}")
        if bucket_bytes <= 0:
            raise ValueError(f"bucket_bytes must be > 0, got {bucket_bytes}")
        self.backend = resolve_backend(sync_backend, engine_kind, has_cuda(), trainer_world, placement)
        self._opener = sender_opener(self.backend)   # the chosen transport's sender module, imported here
        engine_kwargs = {**(engine_kwargs or {}), "weight_transfer": caps(engine_kind).transports[self.backend]}
        self.tp = int(engine_kwargs.get("tensor_parallel_size", 1))   # worker ranks per engine (sync group)
        self.bucket_bytes = bucket_bytes
        self._transfer = None     # the sender's TrainerWeightTransferEngine (opened at the first sync)
        self.last_sync: dict = {}
        super().__init__(engine_kind, model_dir, num_engines, engine_kwargs, cpus_per_engine=cpus_per_engine,
                         threads_per_engine=threads_per_engine, max_restarts=max_restarts, ray_address=ray_address,
                         gpus_per_engine=gpus_per_engine, actor_env=actor_env, engine_gpus=engine_gpus)
        log.info("rollout: %d %s engine(s), weight sync backend %s", num_engines, engine_kind, self.backend)

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

    def update_adapter(self, tensors: dict[str, torch.Tensor], config: dict) -> int:
        """``lora.push: adapter``: send only the LoRA adapters (PEFT names and ``adapter_config.json``) to every
        engine, which installs them as the next version through vLLM's LoRA support (``VLLMEngine.load_adapter``);
        the weight-transfer group is not used. The tensors go into Ray's object store once, whatever the number
        of engines, each as an owned copy (a view would carry its whole storage: measured, 112 adapter views into
        Megatron's 11.5 MB parameter buffer pickled 1.3 GB and took 1.7-5.9 s). Returns the new weight version; ``last_sync`` holds the bytes and seconds (the slowest
        engine's load)."""
        t0 = time.perf_counter()
        version = self._stats.weight_version + 1
        nbytes = sum(t.numel() * t.element_size() for t in tensors.values())
        # owned copies: a view (an adapter inside DDP's contiguous parameter buffer) would pickle its whole storage
        ref = self._ray.put({k: v.detach().to("cpu", copy=True) for k, v in tensors.items()})
        t_put = time.perf_counter() - t0
        try:
            loads = self._ray.get([a.load_adapter.remote(version, config, ref) for a in self.actors])
        except Exception as e:
            raise RuntimeError(f"adapter push (version {version}) failed: {e}") from e
        self._stale.clear()
        self._stats.weight_version = version
        self._stats.sync_bytes += nbytes
        self._stats.sync_seconds += time.perf_counter() - t0
        self.last_sync = {"bytes": nbytes, "tensors": len(tensors), "seconds": time.perf_counter() - t0,
                          "put_s": t_put, "engine_load_s": max(d["seconds"] for d in loads),
                          "engine_stages": loads[0].get("stages", {})}
        return version

    def _open_transfer(self) -> None:
        self._sync_client = ActorSyncClient(self.actors, ranks_per_engine=self.tp,   # every engine TP rank receives
                                            versioned=caps(self.kind).inflight_updates)
        self._transfer = self._opener(self.backend, self._sync_client, self.bucket_bytes, 1 + len(self.actors) * self.tp,
                                      master_address=node_ip())

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

    def _engine_replaced(self, i: int) -> None:
        self._close_transfer(reinit=True)

    def engine_transfer_stats(self) -> list[dict]:
        """Each engine's receive / load / finish seconds since the last call (benchmarks)."""
        return ActorSyncClient(self.actors).stats()

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

    def shutdown(self) -> None:
        """Close the transfer group, then the pool."""
        if self._transfer is not None:
            try:
                self._transfer.shutdown()
            except (RuntimeError, OSError) as e:
                log.warning("closing the weight-transfer group at shutdown: %s", e)
            self._transfer = None
        super().shutdown()
