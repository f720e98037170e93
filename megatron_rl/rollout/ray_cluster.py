"""Ray bring-up for the rollout engine pool: join a cluster or start a Ray of this node, place the
engines (one placement-group bundle each), and the cluster facts the pool and its transports ask
(the driver's node address, the object store's use).

``ray.init`` installs its own SIGTERM handler; :func:`keep_signal_handlers` puts the caller's back as
soon as it returns (``trainer/loop/stop.py``: one line, exit 143, Ray's processes ended). A local Ray
started for a separate placement sees only the engines' GPUs (:func:`init_local_ray`).
"""
from __future__ import annotations

import contextlib
import logging
import os
import signal
import threading

from ..runtime.device import gpu_count
from ..runtime.launch_env import check_ray_address

log = logging.getLogger("megatron_rl.rollout.ray")


def start_ray(ray_address: str | None, num_cpus: int, engine_gpus: list[int] | None) -> None:
    """Join the Ray cluster at ``ray_address`` (else ``RAY_ADDRESS``, Ray's own variable: ``ray job submit``),
    or start a Ray of this node with ``num_cpus`` CPUs and the GPUs ``engine_gpus``; nothing when this
    process already runs one."""
    import ray  # lazy: defers ray to the call

    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    if ray.is_initialized():
        return
    ray_address = ray_address or os.environ.get("RAY_ADDRESS")
    if ray_address:
        check_ray_address(ray_address)   # ray.init retries an address nobody serves forever
        with keep_signal_handlers():
            ray.init(address=ray_address, log_to_driver=False, logging_level=logging.WARNING)
        log.info("rollout: joined the Ray cluster at %s", ray_address)
    else:
        init_local_ray(num_cpus, engine_gpus)


def placement_group(num_engines: int, cpus: float, gpus: float, timeout_s: float = 300.0):
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
def keep_signal_handlers():
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


def init_local_ray(num_cpus: int, engine_gpus: list[int] | None) -> None:
    """A Ray of this node; with ``engine_gpus`` it sees only those GPUs (Ray takes its GPU ids from
    ``CUDA_VISIBLE_DEVICES`` at start and hands them to the actors that ask for GPUs), so a separate
    placement's engines never land on a trainer GPU. The driver's own CUDA context is already bound."""
    import ray  # lazy: defers ray to the call

    saved = os.environ.get("CUDA_VISIBLE_DEVICES")
    if engine_gpus is not None:
        ids = saved.split(",") if saved else [str(i) for i in range(gpu_count())]
        os.environ["CUDA_VISIBLE_DEVICES"] = ",".join(ids[i] for i in engine_gpus)
    try:
        with keep_signal_handlers():   # "Started a local Ray instance" (INFO) stays off the console
            ray.init(num_cpus=num_cpus, include_dashboard=False, log_to_driver=False, logging_level=logging.WARNING)
    finally:
        if saved is None:
            os.environ.pop("CUDA_VISIBLE_DEVICES", None)
        else:
            os.environ["CUDA_VISIBLE_DEVICES"] = saved


def node_ip() -> str:
    """Address the engines reach the sender at: this node's IP in the Ray cluster."""
    import ray  # lazy: defers ray to the call

    return ray.util.get_node_ip_address()


def object_store_bytes() -> int:
    """Bytes in use in the Ray object store of this cluster (the GCS / raylet store stats)."""
    import ray  # lazy: defers ray to the call
    from ray._private.internal_api import get_memory_info_reply, get_state_from_address  # lazy: defers ray to the call

    reply = get_memory_info_reply(get_state_from_address(ray.get_runtime_context().gcs_address))
    return int(reply.store_stats.object_store_bytes_used)
