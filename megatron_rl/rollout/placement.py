"""``rollout.placement``: which devices the engines use, and the start-up rules of each value.

* ``colocated`` — the engines share the trainer's GPUs: engine ``i`` (``tp`` GPUs) sits on GPUs
  ``i·tp … (i+1)·tp − 1`` of the trainer's own, and the two take turns (``trainer/colocate.py``:
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


def engine_gpus(placement: str, trainer_gpus: int, num_engines: int, tp: int = 1) -> list[int]:
    """The node-local GPU indices the engines use, in engine order (``tp`` consecutive ones each)."""
    first = 0 if placement == "colocated" else trainer_gpus
    return list(range(first, first + num_engines * tp))


def check_placement(cfg, cuda: bool, visible_gpus: int, trainer_gpus: int, trainer_world: int, tp: int = 1) -> str:
    """``rollout.placement`` against this machine; returns the sync backend it will use, or raises a
    one-line ``ValueError``. ``trainer_gpus``: trainer processes on this node (torchrun's
    ``LOCAL_WORLD_SIZE``); ``trainer_world``: all of them (``WORLD_SIZE``)."""
    from .trainer_engines import resolve_backend

    r = cfg.rollout
    if r.placement not in PLACEMENTS:
        raise ValueError(f"rollout.placement must be {'|'.join(PLACEMENTS)}, got {r.placement!r}")
    if not cuda and r.placement == "colocated" and r.engine == "vllm":
        raise ValueError("rollout.placement=colocated with rollout.engine=vllm needs CUDA: vLLM-CPU has no sleep mode; "
                         "use rollout.placement=separate on CPU, or rollout.engine=hf (its sleep frees the weights)")
    backend = resolve_backend(r.sync_backend, r.engine, cuda, trainer_world, r.placement)
    if cuda:
        need = r.num_engines * tp
        if r.placement == "colocated" and need > trainer_gpus:
            raise ValueError(f"rollout.placement=colocated: {r.num_engines} engine(s) x {tp} GPU(s) = {need} GPUs, but the "
                             f"trainer has {trainer_gpus} on this node to share; lower rollout.num_engines or use separate")
        if r.placement == "separate" and not r.ray_address and trainer_gpus + need > visible_gpus:
            raise ValueError(f"rollout.placement=separate: the trainer's {trainer_gpus} GPU(s) + {r.num_engines} engine(s) "
                             f"x {tp} = {trainer_gpus + need} GPUs, but {visible_gpus} are visible; use "
                             "rollout.placement=colocated, fewer engines or fewer trainer processes")
    return backend
