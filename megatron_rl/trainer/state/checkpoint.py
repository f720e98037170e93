"""Atomic, resumable checkpoints of a :class:`~megatron_rl.trainer.policy.actor.PolicyActor`.

Layout of ``<run_dir>/checkpoints/step_<N>/`` (complete checkpoints only)::

    dist/               megatron dist_checkpointing (torch_dist): model, optimizer (fully
                        reshardable over TP / PP / DP), LR scheduler, actor step counter
    rng/rank_<r>.pt     python / numpy / torch (CPU, and every GPU's default CUDA generator) RNG + megatron
                        RNG-tracker states of global rank r
    extra_state.pt      the caller's ``extra_state`` dict (sampler cursor, loop counters, algorithm state)
    teacher/            (self-distillation runs with shadow weights) the teacher θ̄ as a second
                        dist_checkpointing model, saved/loaded through ``TeacherWeights`` swaps
    COMPLETE            JSON marker {step, world_size, tp, pp, dp, files}; written last. ``files`` is
                        the manifest of every other file (size, CRC-32 for small ones;
                        ``ckpt_manifest.py``): a damaged checkpoint is skipped by
                        :func:`find_latest` with a warning naming the bad file

Protocol: every rank writes into ``checkpoints/.tmp-step_<N>``; after a barrier rank 0 writes
``COMPLETE`` and renames the directory to ``step_<N>`` (one atomic ``rename`` on the same file
system), then deletes the oldest complete checkpoints beyond ``keep_last``. A crash at any point
leaves either a ``.tmp-*`` directory or a ``step_*`` without ``COMPLETE``; :func:`find_latest`
ignores both.

Resharding: model and optimizer load into any TP / PP / DP layout. RNG states are restored only
when the layout (world size, TP, PP) is unchanged — otherwise they are skipped and the fact is
returned (``rng_restored=False``) and logged.
"""
from __future__ import annotations

import json
import logging
import os
import random
import re
import shutil
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import torch
import torch.distributed as dist

from megatron_rl.convert.hf_io import copy_tokenizer_files
from megatron_rl.runtime.device import cuda_rng_states, gpu_count, set_cuda_rng_states
from megatron_rl.runtime.diskspace import DiskSpaceError, check_free, free_bytes, human, is_disk_full, tree_bytes
from megatron_rl.trainer.state.ckpt_manifest import build_manifest, find_damage

log = logging.getLogger("megatron_rl.checkpoint")

_STEP_RE = re.compile(r"^step_(\d+)$")
_MARKER = "COMPLETE"


class LoadedCheckpoint(NamedTuple):
    """What :func:`load_checkpoint` restored."""

    step: int
    extra_state: dict
    rng_restored: bool
    path: Path


def checkpoints_dir(run_dir: str | os.PathLike) -> Path:
    return Path(run_dir) / "checkpoints"


def find_latest(run_dir: str | os.PathLike) -> Path | None:
    """Newest ``step_N`` directory that has its ``COMPLETE`` marker and whose files match the marker's
    manifest (half-written ones are ignored; damaged ones are skipped with a warning naming the file)."""
    root = checkpoints_dir(run_dir)
    if not root.is_dir():
        return None
    done = sorted(((int(m.group(1)), p) for p in root.iterdir()
                   if (m := _STEP_RE.match(p.name)) and (p / _MARKER).is_file()), reverse=True)
    for _, p in done:
        problem = _damage(p)
        if problem is None:
            return p
        if (str(p), problem) not in _WARNED:   # once per process: preflight and the resume both look
            _WARNED.add((str(p), problem))
            log.warning("skipping damaged checkpoint %s: %s; falling back to the previous complete one", p.name, problem)
    return None


_WARNED: set[tuple[str, str]] = set()


def _damage(path: Path) -> str | None:
    try:
        meta = json.loads((path / _MARKER).read_text())
    except (OSError, ValueError):
        return f"{path / _MARKER} is not valid JSON"
    return find_damage(path, meta.get("files") if isinstance(meta, dict) else None)


def _layout() -> dict[str, int]:
    from megatron.core import parallel_state as ps  # lazy: defers megatron to the call

    cp = ps.get_context_parallel_world_size()    # recorded only when > 1: earlier checkpoints have no key
    return {"world_size": dist.get_world_size(), "tp": ps.get_tensor_model_parallel_world_size(),
            "pp": ps.get_pipeline_model_parallel_world_size(), "dp": ps.get_data_parallel_world_size(),
            **({"cp": cp} if cp > 1 else {})}


def _sharded_state(actor, is_loading: bool) -> dict[str, Any]:
    """The dist_checkpointing state dict: model (per chunk), optimizer, scheduler, counters."""
    models = actor.bare_models()
    if len(models) == 1:
        model_sd = {"model": models[0].sharded_state_dict(prefix="")}
    else:
        model_sd = {f"model{i}": m.sharded_state_dict(prefix="") for i, m in enumerate(models)}
    state = dict(model_sd)
    state["optimizer"] = actor.optimizer.sharded_state_dict(
        model_sd, is_loading=is_loading, metadata={
            "distrib_optim_sharding_type": "fully_reshardable",
            # gather the optimizer shards over the gloo DP group onto DP rank 0 only: without it megatron
            # all-gathers the full fp32 state (param, exp_avg, exp_avg_sq) into host memory on EVERY DP rank
            # (NCCL on CUDA; ~25 GB per rank for an 8B model). Saving is then written by DP rank 0's
            # process alone for that state, on CPU as on CUDA (megatron-core 0.16 distrib_optimizer.py)
            "distrib_optim_fully_reshardable_mem_efficient": True})
    state["scheduler"] = actor.scheduler.state_dict()
    state["actor_steps"] = actor.steps_done
    return state


def _rng_state() -> dict[str, Any]:
    from megatron.core import tensor_parallel  # lazy: defers megatron to the call

    cuda = cuda_rng_states()      # the default CUDA generators (dropout outside the tracker, torch.randn on GPU)
    return {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state(),
            "tracker": tensor_parallel.get_cuda_rng_tracker().get_states(), **({"cuda": cuda} if cuda else {})}


def _set_rng_state(st: dict[str, Any]) -> None:
    from megatron.core import tensor_parallel  # lazy: defers megatron to the call

    random.setstate(st["python"])
    np.random.set_state(st["numpy"])
    torch.set_rng_state(st["torch"])
    tensor_parallel.get_cuda_rng_tracker().set_states(st["tracker"])
    if st.get("cuda") is not None and len(st["cuda"]) == gpu_count():   # a CPU save or another GPU count: skipped
        set_cuda_rng_states(st["cuda"])


def save_checkpoint(run_dir: str | os.PathLike, step: int, actor, extra_state: dict,
                    keep_last: int | None = 3, teacher=None, hf_dir: str | None = None,
                    tokenizer_dir: str | None = None) -> Path:
    """Collective: save ``actor`` (model, optimizer, scheduler), RNG and ``extra_state`` as step ``step``.

    ``hf_dir`` / ``tokenizer_dir``: the run's HF model / tokenizer dirs; their ``config.json`` and
    tokenizer files are copied into ``hf/`` so ``megatron-rl convert mcore-to-hf`` can export any step.
    Returns the final ``checkpoints/step_<step>`` path (on every rank).

    Free space is checked first (:func:`expected_bytes`; ``DiskSpaceError``, nothing written). Each
    phase ends with every rank learning whether any rank failed (:func:`_phase`, which doubles as
    the barrier): a failure, a full disk included, removes the temp dir on every rank's behalf and
    raises everywhere (a full disk as one ``DiskSpaceError`` line); earlier checkpoints are untouched.
    """
    from megatron.core import dist_checkpointing  # lazy: defers megatron to the call

    if step < 0:
        raise ValueError(f"save_checkpoint: step must be >= 0, got {step}")
    if getattr(actor, "offloaded", False):   # the optimizer state is in host buffers (trainer.offload)
        raise RuntimeError("save_checkpoint: the trainer is offloaded (trainer.offload); call onload() first")
    rank = dist.get_rank()
    root = checkpoints_dir(run_dir)
    tmp, final = root / f".tmp-step_{step}", root / f"step_{step}"
    rng = _rng_state()          # captured before anything below can touch the generators

    def start():
        if rank == 0:
            check_free(root, expected_bytes(run_dir, actor, teacher), f"checkpoint step_{step}")
            for stale in root.glob(".tmp-step_*") if root.is_dir() else ():   # left by crashed saves
                shutil.rmtree(stale, ignore_errors=True)
            (tmp / "dist").mkdir(parents=True)
            (tmp / "rng").mkdir()

    def shards():
        _materialize_fresh_optimizer_state(actor.optimizer)
        dist_checkpointing.save(_sharded_state(actor, is_loading=False), str(tmp / "dist"))
        if teacher is not None and teacher.has_shadow:
            if rank == 0:
                (tmp / "teacher").mkdir()
            dist.barrier()
            with teacher.swapped():
                dist_checkpointing.save(_model_state(actor), str(tmp / "teacher"))
        torch.save(rng, tmp / "rng" / f"rank_{rank}.pt")

    def finish():
        if rank == 0:
            _write_hf_files(tmp / "hf", hf_dir, tokenizer_dir)
            torch.save(dict(extra_state), tmp / "extra_state.pt")

            (tmp / _MARKER).write_text(json.dumps({"step": step, **_layout(), "files": build_manifest(tmp)}))
            if final.exists():                       # re-saving a step: replace the old copy
                shutil.rmtree(final)
            os.rename(tmp, final)
            _prune(root, keep_last)

    _phase(start, tmp, final, started=False)
    _phase(shards, tmp, final)
    _phase(finish, tmp, final)
    return final


def expected_bytes(run_dir: str | os.PathLike, actor, teacher=None) -> int:
    """The size a new checkpoint will take: the newest complete one's, else an estimate from the
    parameter count — weights in their dtype + fp32 main copy and two Adam moments (12 bytes), times
    the model-parallel size (this rank holds 1/(TP·PP) of the model), plus the teacher's weights."""
    root = checkpoints_dir(run_dir)
    done = sorted((int(m.group(1)), p) for p in root.iterdir()
                  if (m := _STEP_RE.match(p.name)) and (p / _MARKER).is_file()) if root.is_dir() else []
    if done:                    # the newest complete one (no manifest check: only its size matters)
        return tree_bytes(done[-1][1])
    params = [p for m in actor.bare_models() for p in m.parameters()]
    weights = sum(p.numel() * p.element_size() for p in params)
    total = weights + 12 * sum(p.numel() for p in params)
    if teacher is not None and getattr(teacher, "has_shadow", False):
        total += weights
    try:
        from megatron.core import parallel_state as ps  # lazy: defers megatron to the call

        total *= ps.get_tensor_model_parallel_world_size() * ps.get_pipeline_model_parallel_world_size()
    except (AssertionError, RuntimeError):
        pass
    return total


def _phase(fn, tmp: Path, final: Path, started: bool = True) -> None:
    """Collective: run ``fn`` on this rank, then every rank learns whether any rank failed (the
    gather is also the phase's barrier). On a failure rank 0 removes ``tmp`` (when ``started``) and
    every rank raises: the same ``DiskSpaceError`` line for a full disk, else the error."""
    err = None
    try:
        fn()
    except (KeyboardInterrupt, SystemExit):
        raise
    except BaseException as e:  # noqa: BLE001 (torch's CheckpointException is a BaseException; shared, re-raised)
        err = e
    mine = None
    if err is not None:
        own = isinstance(err, DiskSpaceError)        # the free-space check's line, shared as is
        mine = (own or (started and is_disk_full(err, tmp.parent)), str(err) if own else f"{type(err).__name__}: {err}")
    got = [mine]
    if dist.is_initialized() and dist.get_world_size() > 1:
        got = [None] * dist.get_world_size()
        dist.all_gather_object(got, mine)
    bad = [g for g in got if g is not None]
    if not bad:
        return
    if started and dist.get_rank() == 0:
        shutil.rmtree(tmp, ignore_errors=True)
    if isinstance(err, DiskSpaceError):
        raise err
    if not started and bad[0][0]:
        raise DiskSpaceError(bad[0][1])
    if any(full for full, _ in bad):
        free = free_bytes(tmp.parent)
        raise DiskSpaceError(f"disk full while writing checkpoint {final.name} in {tmp.parent} ({free} bytes "
                             f"({human(free)}) free now): the partial checkpoint was removed, the earlier ones are "
                             "intact; free some space, then resume with --resume auto") from err
    if err is not None:
        raise err
    raise RuntimeError(f"checkpoint {final.name}: another rank failed: {bad[0][1]}")


def remove_stale_tmp(run_dir: str | os.PathLike) -> list[Path]:
    """Remove the ``checkpoints/.tmp-step_*`` directories a crashed or killed save left behind (they
    are never resumed from and may hold gigabytes); one warning line naming them. Call on rank 0 at
    start-up; returns what was removed."""
    root = checkpoints_dir(run_dir)
    stale = sorted(p for p in root.glob(".tmp-step_*") if p.is_dir()) if root.is_dir() else []
    for p in stale:
        shutil.rmtree(p, ignore_errors=True)
    if stale:
        log.warning("removed %d unfinished checkpoint dir(s) left by an interrupted save: %s",
                    len(stale), ", ".join(str(p) for p in stale))
    return stale


def _write_hf_files(dst: Path, hf_dir: str | None, tokenizer_dir: str | None) -> None:
    """``hf/config.json`` (+ tokenizer files): what the checkpoint's model is, for the exporter."""
    if not hf_dir or not (Path(hf_dir) / "config.json").is_file():
        return
    dst.mkdir()
    shutil.copyfile(Path(hf_dir) / "config.json", dst / "config.json")
    copy_tokenizer_files(tokenizer_dir or hf_dir, dst)


def _prune(root: Path, keep_last: int | None) -> None:
    if not keep_last:
        return
    done = sorted((int(m.group(1)), p) for p in root.iterdir()
                  if (m := _STEP_RE.match(p.name)) and (p / _MARKER).is_file())
    for _, p in done[:-keep_last]:
        shutil.rmtree(p, ignore_errors=True)
        log.info("pruned old checkpoint %s (keep_last=%d)", p, keep_last)


def _ensure_optimizer_state(optimizer) -> None:
    """A fresh DistributedOptimizer has no Adam state yet, and its ``state_dict`` (needed to build
    the load-time sharded state dict) asserts on it. Megatron's own remedy: one dummy step with zero
    grads; every tensor it touches (params, moments, step) is then overwritten by the load."""
    for o in getattr(optimizer, "chained_optimizers", [optimizer]):
        if hasattr(o, "_init_optimizer_states_with_dummy_values") and len(o.optimizer.state) == 0:
            o._init_optimizer_states_with_dummy_values()


def _materialize_fresh_optimizer_state(optimizer) -> None:
    """Saving before the first optimizer step (e.g. every update of a self-distillation run was
    skipped because hint selection dropped every group): give a stateless DistributedOptimizer the
    state of a fresh Adam (moments 0, step 0) without changing any parameter, so ``state_dict``
    works and a resume behaves exactly like the uninterrupted run's first real step."""
    for o in getattr(optimizer, "chained_optimizers", [optimizer]):
        if not hasattr(o, "_init_optimizer_states_with_dummy_values") or len(o.optimizer.state):
            continue
        params = [p for g in o.optimizer.param_groups for p in g["params"]]
        saved = [p.detach().clone() for p in params]
        o._init_optimizer_states_with_dummy_values()
        with torch.no_grad():
            for p, v in zip(params, saved):
                p.copy_(v)
            for st in o.optimizer.state.values():
                for k, v in st.items():
                    if torch.is_tensor(v):
                        v.zero_()
                    elif k == "step":
                        st[k] = 0


def load_model_weights(path: str | os.PathLike, model) -> int:
    """Collective: load only the model weights of checkpoint ``path`` into ``model`` (a PolicyActor
    or ReferencePolicy) — e.g. to start RL from an SFT run's Megatron checkpoint. Optimizer,
    scheduler and RNG are left untouched (an actor's fp32 main params are refreshed). Returns the step.
    """
    from megatron.core import dist_checkpointing  # lazy: defers megatron to the call

    path, meta = _complete(path)
    models = model.bare_models()
    req = {"model": models[0].sharded_state_dict(prefix="")} if len(models) == 1 else \
        {f"model{i}": m.sharded_state_dict(prefix="") for i, m in enumerate(models)}
    state = dist_checkpointing.load(req, str(path / "dist"))
    for i, m in enumerate(models):
        m.load_state_dict(state["model"] if len(models) == 1 else state[f"model{i}"], strict=True)
    if getattr(model, "optimizer", None) is not None:
        model.optimizer.reload_model_params()
    dist.barrier()
    return int(meta["step"])


def _complete(path: str | os.PathLike) -> tuple[Path, dict]:
    path = Path(path)
    marker = path / _MARKER
    if not marker.is_file():
        raise FileNotFoundError(f"{path} is not a complete checkpoint (no {_MARKER} marker)")
    problem = _damage(path)
    if problem is not None:
        raise ValueError(f"checkpoint {path} is damaged: {problem}")
    return path, json.loads(marker.read_text())


def _model_state(actor) -> dict[str, Any]:
    models = actor.bare_models()
    return {f"model{i}": m.sharded_state_dict(prefix="") for i, m in enumerate(models)}


def load_checkpoint(path: str | os.PathLike, actor, restore_rng: bool = True, teacher=None) -> LoadedCheckpoint:
    """Collective: restore ``actor`` from a complete checkpoint directory ``step_<N>``.

    Any TP / PP / DP layout can load any checkpoint; RNG states only when the layout matches.
    """
    from megatron.core import dist_checkpointing  # lazy: defers megatron to the call

    path, meta = _complete(path)
    _ensure_optimizer_state(actor.optimizer)
    state = dist_checkpointing.load(_sharded_state(actor, is_loading=True), str(path / "dist"))
    models = actor.bare_models()
    for i, m in enumerate(models):
        m.load_state_dict(state["model"] if len(models) == 1 else state[f"model{i}"], strict=True)
    actor.optimizer.load_state_dict(state["optimizer"])
    actor.scheduler.load_state_dict(state["scheduler"])
    actor.steps_done = int(state["actor_steps"])
    if teacher is not None and teacher.has_shadow:
        if not (path / "teacher").is_dir():
            raise FileNotFoundError(f"{path} has no teacher/ weights but this run's teacher_mode={teacher.mode!r} "
                                    "needs them (was it written by a run of another algorithm?)")
        with teacher.loading():
            tstate = dist_checkpointing.load(_model_state(actor), str(path / "teacher"))
            for i, m in enumerate(models):
                m.load_state_dict(tstate[f"model{i}"], strict=True)
    extra = torch.load(path / "extra_state.pt", weights_only=False)
    same = all(meta.get(k) == v for k, v in _layout().items())
    rng_file = path / "rng" / f"rank_{dist.get_rank()}.pt"
    restored = bool(restore_rng and same and rng_file.is_file())
    if restored:
        _set_rng_state(torch.load(rng_file, weights_only=False))
    elif restore_rng:
        log.warning("checkpoint %s was saved with layout %s; now %s: RNG states not restored",
                    path, {k: meta.get(k) for k in _layout()}, _layout())
    dist.barrier()
    return LoadedCheckpoint(step=int(meta["step"]), extra_state=extra, rng_restored=restored, path=path)
