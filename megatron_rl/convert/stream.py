"""Streaming HF -> Megatron conversion: no model is built and the weights never pass through memory.

    1. index the safetensors headers (``SafetensorsIndex``); check names and shapes against the
       name map (``KeyError`` / ``ValueError`` naming the tensor, before anything is written);
    2. derive the Megatron dist-checkpoint layout from the config (``mcore_layout``);
    3. copy every chunk's bytes into ``.distcp`` files (``dcp_writer``; file-to-file, zero copy when
       the source dtype is the parameter dtype), ``n_files`` writer threads per process;
    4. write ``.metadata`` / ``common.pt`` / ``metadata.json``, ``hf/`` (config.json as given +
       tokenizer files) and ``COMPLETE``, then rename the temp dir onto ``out_dir``.

The model facts come from ``config.json`` without transformers (``config_json``): start-up cost is
the interpreter, torch and (for the metadata pickle) ``torch.distributed.checkpoint``. Importing
the latter in a thread during the copy was tried: on 2 cores it only moved the time (the copy
threads then wait for the GIL after every ``copy_file_range``).

Under ``torchrun`` (``WORLD_SIZE`` > 1, gloo) rank r writes its share of the chunks (greedy balance
by bytes) into ``__<r>_<i>.distcp``; rank 0 gathers the storage indices and writes the metadata. Any rank's error
is shared, so every rank raises and the temp dir is removed.

Dtype: the checkpoint stores the source's dtype (``source_dtype``: bf16 in, bf16 stored; a trainer
loading it into fp32 params casts on load, and fp32 main params are the optimizer's business), so
every chunk is a byte copy. Only a mixed-dtype source casts its minority tensors.

Peak memory: the interpreter + torch, plus one ``CAST_BLOCK`` (16 MiB) of source and its cast when
a tensor's dtype is not the stored dtype, and chunks under 1 MiB (norms) in memory.
Output is identical in content to ``dist_checkpointing.save`` of the built model at TP=PP=1
(checked in tests) and loads at any TP / PP.
"""
from __future__ import annotations

import json
import logging
import os
import shutil
import time
from pathlib import Path

import torch
import torch.distributed as dist

from megatron_rl.convert import name_maps
from megatron_rl.convert.atomic import check_out_dir, replace_dir
from megatron_rl.convert.config_json import arch_info
from megatron_rl.convert.dcp_writer import finish_checkpoint, write_files
from megatron_rl.convert.hf_io import copy_tokenizer_files
from megatron_rl.convert.live import check_hf_names, hf_shapes
from megatron_rl.convert.mcore_layout import mcore_layout
from megatron_rl.convert.safetensors_index import SafetensorsIndex
from megatron_rl.models.provider import load_hf_config, validate_layout
from megatron_rl.runtime.diskspace import DiskSpaceError, NotWritableError, check_free
from megatron_rl.runtime.launch_env import check_torch_env
from megatron_rl.runtime.out_dir import make_temp_dir, raise_if_disk_full

log = logging.getLogger("megatron_rl.convert")


def source_dtype(index, arch) -> torch.dtype:
    """The dtype the checkpoint stores: the source's (the dtype holding most of the HF tensors' bytes,
    so a bf16 model stays bf16; a mixed source is cast to it, logged)."""
    by: dict[torch.dtype, int] = {}
    for name in sorted(name_maps.expected_hf_names(arch)):
        loc = index[name]
        by[loc.dtype] = by.get(loc.dtype, 0) + loc.nbytes
    dtype = max(by, key=by.get)
    if not dtype.is_floating_point:
        raise ValueError(f"HF weights are {dtype}, not a floating-point dtype")
    if len(by) > 1:
        log.info("mixed source dtypes %s: storing every weight as %s", {str(k): v for k, v in by.items()}, dtype)
    return dtype


def _dist() -> tuple[int, int, bool]:
    """(rank, world, created) from torchrun's env; initialises a gloo group when world > 1 and
    none is up (``created``: this call did, so the converter tears it down again)."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    created = world > 1 and not dist.is_initialized()
    if created:
        check_torch_env()   # leftover torchrun variables: one line instead of a 30-min wait for absent ranks
        dist.init_process_group("gloo")
    return (dist.get_rank(), dist.get_world_size(), created) if world > 1 else (0, 1, False)


def _all(obj, world: int) -> list:
    if world == 1:
        return [obj]

    out = [None] * world
    dist.all_gather_object(out, obj)
    return out


def check_shapes(index, arch) -> None:
    """Every HF tensor the name map needs has its expected shape (``ValueError`` naming it)."""
    for rule in name_maps.expand(arch):
        for name, want in zip(rule.hf, hf_shapes(rule, arch)):
            got = index[name].shape
            if tuple(got) != tuple(want):
                raise ValueError(f"HF tensor {name!r} has shape {tuple(got)}, expected {tuple(want)} "
                                 f"for {arch.architecture}")


def _plan(hf_dir: Path, tp: int, pp: int):
    """(arch, config-from-JSON?, index, chunks, objects); raises before anything is written."""
    arch, from_json = arch_info(hf_dir)
    validate_layout(arch, tp, pp)
    index = SafetensorsIndex(hf_dir)
    check_hf_names(index.names(), arch)
    check_shapes(index, arch)
    chunks, objects = mcore_layout(arch, tp)
    return arch, from_json, index, chunks, objects, source_dtype(index, arch)


def _write_hf_dir(hf_dir: Path, dst: Path, from_json: bool) -> None:
    """``config.json`` (verbatim when it was read without transformers) + tokenizer files."""
    dst.mkdir()
    if from_json:
        shutil.copyfile(hf_dir / "config.json", dst / "config.json")
    else:
        load_hf_config(hf_dir).save_pretrained(str(dst))
    copy_tokenizer_files(hf_dir, dst)


def _share(items: list, rank: int, world: int, size) -> list:
    """This rank's items: greedy by size over ranks, deterministic on every rank."""
    if world == 1:
        return list(items)
    load, mine = [0] * world, []
    for n, it in sorted(enumerate(items), key=lambda p: -size(p[1])):
        r = load.index(min(load))
        load[r] += size(it)
        if r == rank:
            mine.append(n)
    return [items[n] for n in sorted(mine)]


def hf_to_mcore_streaming(hf_dir: str | os.PathLike, out_dir: str | os.PathLike, tp: int = 1, pp: int = 1,
                          force: bool = False, n_files: int = 2) -> Path:
    """Convert an HF safetensors dir into a Megatron dist checkpoint at ``out_dir`` without a model.

    ``tp`` / ``pp`` are validated against the model and recorded in ``COMPLETE``; the vocab is padded
    for ``tp`` (``padded_vocab_size``). The checkpoint loads at any TP / PP.
    """
    t0 = time.perf_counter()
    hf_dir, out = Path(hf_dir), Path(out_dir).resolve()
    rank, world, created = _dist()
    tmp, plan = None, None     # only a temp dir this call created is ever deleted
    try:
        err = None
        if rank == 0:
            try:
                check_out_dir(out, force)
                plan = _plan(hf_dir, tp, pp)
                check_free(out.parent, sum(f.stat().st_size for f in hf_dir.glob("*.safetensors")),
                           f"the Megatron checkpoint {out.name}")     # the weights are stored as given
                tmp = make_temp_dir(out)
                (tmp / "dist").mkdir()
            except Exception as e:
                err = e
        tmp = Path(_agree(err, world, str(tmp))[0])
        storage, err = {}, None
        try:
            arch, from_json, index, chunks, objects, dtype = plan if plan is not None else _plan(hf_dir, tp, pp)
            mine = _share(chunks, rank, world, lambda c: c.numel)
            t_plan = time.perf_counter()
            storage = write_files(tmp / "dist", rank, mine, objects if rank == 0 else [], index, dtype, n_files)
        except Exception as e:
            err = e
        gathered, err = _agree(err, world, storage), None
        t_copy = time.perf_counter()
        if rank == 0:
            try:
                _finish(hf_dir, tmp, out, (tp, pp, force), gathered, (chunks, objects, dtype, from_json))
            except Exception as e:
                err = e
        _agree(err, world, None)  # nobody returns before the rename (or the failure)
    except BaseException as e:
        if rank == 0 and tmp is not None:
            raise_if_disk_full(e, tmp, out)
            shutil.rmtree(tmp, ignore_errors=True)
        raise
    finally:
        if created:
            _leave_group()
    t1 = time.perf_counter()
    log.info("streamed %s -> %s in %.2f s (plan %.2f s, copy %.2f s, metadata %.2f s; %d chunks, %d ranks)",
             hf_dir, out, t1 - t0, t_plan - t0, t_copy - t_plan, t1 - t_copy, len(chunks), world)
    return out


def _finish(hf_dir: Path, tmp: Path, out: Path, layout: tuple, gathered: list, plan: tuple) -> None:
    """Rank 0, once every rank wrote its files: the checkpoint's metadata from the ranks' storage
    (``gathered``), the HF files beside it, ``COMPLETE``, then the temp dir renamed to ``out``."""
    (tp, pp, force), (chunks, objects, dtype, from_json) = layout, plan
    merged = {k: v for s in gathered for k, v in s.items()}
    finish_checkpoint(tmp / "dist", chunks, objects, merged, dtype)
    _write_hf_dir(hf_dir, tmp / "hf", from_json)
    (tmp / "COMPLETE").write_text(json.dumps({"step": 0, "tp": tp, "pp": pp, "source": str(hf_dir)}))
    replace_dir(tmp, out, force)


def _leave_group() -> None:
    """Tear down the process group this call created. Every rank leaves the last collective before any
    rank tears gloo down: a rank that closes its pairs while a peer's gloo thread still reads them aborts
    the peer ("terminate called without an active exception", seen once under load)."""
    try:
        dist.barrier()
    finally:
        dist.destroy_process_group()


def _agree(err: Exception | None, world: int, payload) -> list:
    """Collective: gather every rank's ``payload``; if any rank failed, raise on every rank (a rank
    re-raises its own error, the others an error of the same type and message)."""
    got = _all((payload, None if err is None else (type(err).__name__, str(err))), world)
    if err is not None:
        raise err
    for _, e in got:
        if e is not None:
            raise _rebuild(*e)
    return [p for p, _ in got]


def _rebuild(kind: str, msg: str) -> Exception:
    """Another rank's error, re-raised here with the same type where it is a plain one."""
    cls = {"FileExistsError": FileExistsError, "FileNotFoundError": FileNotFoundError, "KeyError": KeyError,
           "DiskSpaceError": DiskSpaceError, "NotWritableError": NotWritableError,
           "ValueError": ValueError}.get(kind, RuntimeError)
    return cls(msg.strip("'\"") if cls is KeyError else msg)
