"""``rollout.placement``: which devices the engines use, the start-up rules of each value, and the
sync backend that fits (:func:`resolve_backend`; here rather than in ``trainer_engines`` so that the
start-up checks need no vLLM import).

* ``colocated`` — the engines share the trainer's GPUs: engine ``i`` (``tp`` GPUs) sits on GPUs
  ``i·tp … (i+1)·tp − 1`` of the trainer's own, and the two take turns (``trainer/loop/colocate.py``:
  engines sleep during the update). Needs ``num_engines × tp ≤`` the trainer's GPUs on the node,
  a sync backend that shares a GPU (``ipc`` / ``ray``, not ``nccl``) and synchronous rollouts.
* ``separate`` — the engines get GPUs of their own, after the trainer's: needs
  ``trainer GPUs + num_engines × tp ≤`` the visible GPUs; nothing sleeps.

On CPU there are no GPUs to share: ``separate`` is every CPU run (engine actors in their own
processes), ``colocated`` runs the same sleep/wake order and is accepted for the HF engine only,
whose sleep frees its weights (vLLM-CPU has no sleep mode: ``enable_sleep_mode`` fails there).

With ``rollout.ray_address`` (a Ray cluster of several nodes) the engines of a separate placement
may live on other nodes, so the count is left to Ray there.
"""
from __future__ import annotations

PLACEMENTS = ("colocated", "separate")
BACKENDS = ("auto", "ray", "gloo", "nccl", "ipc")   # rollout.sync_backend (senders: trainer_engines.py)


def resolve_backend(requested: str, engine_kind: str, cuda: bool, trainer_world: int = 1,
                    placement: str | None = None) -> str:
    """``rollout.sync_backend`` → the backend used; ``ValueError`` (one line) when impossible.

    auto: ``ray`` for the HF engine, ``gloo`` for vLLM on CPU; vLLM with CUDA: ``nccl`` for
    ``placement`` separate (or unstated), and for colocated ``ipc`` with one trainer process, else
    ``ray`` (NCCL refuses two ranks on one GPU, and vLLM's IPC engine needs the single sender).
    """
    if requested not in BACKENDS:
        raise ValueError(f"rollout.sync_backend must be one of {'|'.join(BACKENDS)}, got {requested!r}")
    if requested == "auto":
        if engine_kind != "vllm":
            return "ray"
        if not cuda:
            return "gloo"
        if placement == "colocated":
            return "ipc" if trainer_world == 1 else "ray"
        return "nccl"
    if placement == "colocated" and requested == "nccl":
        raise ValueError("rollout.sync_backend=nccl with rollout.placement=colocated: NCCL cannot put the sender and "
                         "an engine on one GPU; use ipc (one trainer process), ray or auto")
    if placement == "separate" and requested == "ipc":
        raise ValueError("rollout.sync_backend=ipc with rollout.placement=separate: CUDA IPC shares memory on one GPU; "
                         "use nccl or auto for engines on their own GPUs")
    if requested != "ray" and engine_kind != "vllm":
        raise ValueError(f"rollout.sync_backend={requested} needs rollout.engine=vllm (the {engine_kind} "
                         "engine only takes the ray backend)")
    if requested in ("nccl", "ipc") and not cuda:
        raise ValueError(f"rollout.sync_backend={requested} needs CUDA GPUs and none is visible; "
                         "use gloo (or ray) on CPU")
    if requested == "ipc" and trainer_world != 1:
        raise ValueError(f"rollout.sync_backend=ipc needs a single trainer process colocated with the engine "
                         f"(vLLM's IPC engine all-gathers handles over the trainer's group); got {trainer_world}")
    return requested


#: rollout.gpu_memory_utilization=null: vLLM's share of an engine GPU per placement
AUTO_MEMORY_UTILIZATION = {"colocated": 0.5, "separate": 0.9}


def engine_memory_utilization(value: float | None, placement: str) -> float:
    """``rollout.gpu_memory_utilization`` in force: the value, or the placement's auto share."""
    return float(value) if value is not None else AUTO_MEMORY_UTILIZATION[placement]


def engine_eager(value: bool | None, cuda: bool) -> bool:
    """``rollout.enforce_eager`` in force: the value, or auto = eager without CUDA, CUDA graphs with it."""
    return (not cuda) if value is None else bool(value)


def check_engine_keys(cfg, cuda: bool) -> None:
    """The engine keys against this machine, one-line ``ValueError``: on CPU, vLLM-CPU's engines are
    TP 1 (its worker binds one NUMA node's cores per rank and asserts with more ranks than the node
    split gives; not supported here) and eager (no CUDA graphs)."""
    r = cfg.rollout
    if not cuda and r.engine == "vllm" and r.tensor_parallel_size > 1:
        raise ValueError(f"rollout.tensor_parallel_size={r.tensor_parallel_size} needs CUDA GPUs: vLLM-CPU engines run "
                         "tensor parallel 1 here (its CPU worker's NUMA binding); use rollout.num_engines for more engines")
    if not cuda and r.enforce_eager is False:
        raise ValueError("rollout.enforce_eager=false (CUDA graphs) needs CUDA GPUs; leave it null (auto: eager on CPU)")


def engine_gpus(placement: str, trainer_gpus: int, num_engines: int, tp: int = 1) -> list[int]:
    """The node-local GPU indices the engines use, in engine order (``tp`` consecutive ones each)."""
    first = 0 if placement == "colocated" else trainer_gpus
    return list(range(first, first + num_engines * tp))


def check_placement(cfg, cuda: bool, visible_gpus: int, trainer_gpus: int, trainer_world: int, tp: int | None = None,
                    cluster: bool | None = None) -> str:
    """``rollout.placement`` against this machine; returns the sync backend it will use, or raises a
    one-line ``ValueError``. ``trainer_gpus``: trainer processes on this node (torchrun's
    ``LOCAL_WORLD_SIZE``); ``trainer_world``: all of them (``WORLD_SIZE``)."""
    r = cfg.rollout
    tp = r.tensor_parallel_size if tp is None else tp
    cluster = bool(r.ray_address) if cluster is None else cluster   # a Ray cluster over the nodes (RAY_ADDRESS too)
    if r.placement not in PLACEMENTS:
        raise ValueError(f"rollout.placement must be {'|'.join(PLACEMENTS)}, got {r.placement!r}")
    if not cuda and r.placement == "colocated" and r.engine == "vllm":
        raise ValueError("rollout.placement=colocated with rollout.engine=vllm needs CUDA: vLLM-CPU has no sleep mode; "
                         "use rollout.placement=separate on CPU, or rollout.engine=hf (its sleep frees the weights)")
    backend = resolve_backend(r.sync_backend, r.engine, cuda, trainer_world, r.placement)
    check_engine_keys(cfg, cuda)
    if cuda:
        need = r.num_engines * tp
        # colocated over several nodes: the engines' placement group spreads them over the Ray cluster's nodes,
        # so they share all the trainer's GPUs; with a Ray of this node only, this node's
        share = trainer_world if cluster and trainer_world > trainer_gpus else trainer_gpus
        where = f"{share} in all its nodes' Ray cluster" if share != trainer_gpus else f"{trainer_gpus} on this node"
        if r.placement == "colocated" and need > share:
            raise ValueError(f"rollout.placement=colocated: {r.num_engines} engine(s) x {tp} GPU(s) = {need} GPUs, but the "
                             f"trainer has {where} to share; lower rollout.num_engines or use separate")
        if r.placement == "separate" and not r.ray_address and trainer_gpus + need > visible_gpus:
            raise ValueError(f"rollout.placement=separate: the trainer's {trainer_gpus} GPU(s) + {r.num_engines} engine(s) "
                             f"x {tp} = {trainer_gpus + need} GPUs, but {visible_gpus} are visible; use "
                             "rollout.placement=colocated, fewer engines or fewer trainer processes")
    return backend
