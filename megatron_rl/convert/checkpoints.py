"""Offline conversion between HF safetensors dirs and Megatron ``dist_checkpointing`` checkpoints.

Megatron checkpoint layout written here (the trainer's ``load_model_weights`` reads it too)::

    OUT/dist/        megatron-core dist_checkpointing (torch_dist), key "model" — loads at ANY TP/PP
    OUT/hf/          config.json (+ tokenizer files): what the model is
    OUT/COMPLETE     JSON marker, written last: {"step": 0, "tp": .., "pp": .., "source": ..}

HF -> Megatron streams by default (``stream.py``: no model, chunk-by-chunk byte copies, bounded memory;
under ``torchrun`` each rank writes a share of the chunks). The model-building path
(``engine="model"``) runs as one process or under ``torchrun`` (each rank builds and saves only its
TP/PP shard). Megatron -> HF streams tensor by tensor from the checkpoint files (``export.py``).
Weights are stored in the source's dtype (bf16 in, bf16 stored). Outputs are written to a temp dir
and renamed.
"""
from __future__ import annotations

import json
import logging
import os
import shutil
from pathlib import Path

import torch.distributed as dist

from megatron_rl.convert.atomic import check_out_dir, replace_dir
from megatron_rl.convert.export import mcore_to_hf_streaming
from megatron_rl.convert.hf_io import copy_tokenizer_files
from megatron_rl.convert.live import load_hf_into_model
from megatron_rl.convert.safetensors_index import SafetensorsIndex
from megatron_rl.convert.stream import hf_to_mcore_streaming, source_dtype
from megatron_rl.models.provider import (
    build_gpt_model,
    load_hf_config,
    model_arch_info,
    transformer_config_from_hf,
    validate_layout,
)
from megatron_rl.runtime.diskspace import check_free_on_rank0
from megatron_rl.runtime.out_dir import make_temp_dir
from megatron_rl.runtime.parallel import init_parallel

log = logging.getLogger("megatron_rl.convert")


def _init(tp: int, pp: int):
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world == 1 and (tp, pp) != (1, 1):
        log.info("single process: writing at TP=1/PP=1 (dist_checkpointing reshards to tp=%d pp=%d on load)", tp, pp)
        tp, pp = 1, 1
    if world % (tp * pp):
        raise ValueError(f"world size {world} is not a multiple of tp*pp={tp * pp}")
    return init_parallel(tp, pp, seed=0)


def _is_writer() -> bool:
    return not dist.is_initialized() or dist.get_rank() == 0


def _shared_tmp(out: Path, force: bool) -> Path:
    """Rank 0 checks ``out`` (``atomic.check_out_dir``) and creates the temp dir; every rank gets its path."""
    payload = [None]
    if _is_writer():
        try:
            check_out_dir(out, force)
            payload = [str(make_temp_dir(out))]
        except FileExistsError as e:
            payload = [f"ERROR:{e}"]
    if dist.is_initialized():
        dist.broadcast_object_list(payload, src=0)
    if payload[0].startswith("ERROR:"):
        raise FileExistsError(payload[0][6:])
    return Path(payload[0])


def hf_to_mcore(hf_dir: str | os.PathLike, out_dir: str | os.PathLike, tp: int = 1, pp: int = 1,
                force: bool = False, engine: str = "stream") -> Path:
    """Convert an HF checkpoint dir into a Megatron distributed checkpoint at ``out_dir``.

    ``engine="stream"`` (default, ``stream.py``): no model is built; chunks are copied straight from
    the safetensors files. ``engine="model"``: build the (TP/PP-sharded) GPTModel, load it and
    ``dist_checkpointing.save`` it (the reference the streaming path is tested against).
    """
    if engine == "stream":
        return hf_to_mcore_streaming(hf_dir, out_dir, tp=tp, pp=pp, force=force)
    if engine != "model":
        raise ValueError(f"unknown conversion engine {engine!r}; supported: stream, model")
    return _hf_to_mcore_via_model(hf_dir, out_dir, tp, pp, force)


def _hf_to_mcore_via_model(hf_dir, out_dir, tp: int, pp: int, force: bool) -> Path:
    from megatron.core import dist_checkpointing  # lazy: defers megatron to the call

    hf_dir, out = Path(hf_dir), Path(out_dir).resolve()
    cfg = load_hf_config(hf_dir)
    validate_layout(cfg, tp, pp)
    dtype = source_dtype(SafetensorsIndex(hf_dir), model_arch_info(cfg))  # stored as given, like ``stream``

    info = _init(tp, pp)
    check_free_on_rank0(out.parent, sum(f.stat().st_size for f in hf_dir.glob("*.safetensors")),
                        f"the Megatron checkpoint {out.name}")
    tmp = _shared_tmp(out, force)
    try:
        # every parameter is overwritten from the HF files: skip megatron's (slow) random init
        model = build_gpt_model(cfg, transformer_config_from_hf(cfg, tp=info.tp, pp=info.pp, params_dtype=dtype,
                                                                perform_initialization=False)).to(dtype)
        load_hf_into_model([model], hf_dir, info)
        if _is_writer():
            (tmp / "hf").mkdir(parents=True, exist_ok=True)
            (tmp / "dist").mkdir(parents=True, exist_ok=True)
            cfg.save_pretrained(str(tmp / "hf"))
            copy_tokenizer_files(hf_dir, tmp / "hf")
        if dist.is_initialized():
            dist.barrier()
        dist_checkpointing.save({"model": model.sharded_state_dict(prefix="")}, str(tmp / "dist"))
        if dist.is_initialized():
            dist.barrier()
        if _is_writer():
            (tmp / "COMPLETE").write_text(json.dumps({"step": 0, "tp": info.tp, "pp": info.pp, "source": str(hf_dir)}))
            replace_dir(tmp, out, force)
    except BaseException:
        if _is_writer():
            shutil.rmtree(tmp, ignore_errors=True)
        raise
    if dist.is_initialized():
        dist.barrier()
    return out


def mcore_to_hf(ckpt_dir: str | os.PathLike, out_dir: str | os.PathLike, force: bool = False,
                max_shard_bytes: int = 2 << 30, hf_config: str | None = None, dtype: str | None = None) -> Path:
    """Export a Megatron checkpoint (this module's layout, or a trainer ``checkpoints/step_N`` dir, at
    whatever TP / PP it was saved with) as an HF safetensors dir loadable by ``AutoModelForCausalLM``.

    Streams tensor by tensor without building a model (``export.py``). The architecture comes from
    ``CKPT/hf/config.json`` (both layouts write it); ``hf_config`` (a model dir or ``config.json``)
    stands in for checkpoints written without one. ``dtype``: the exported weights' dtype (default:
    the checkpoint's model dtype); ``config.json`` names it. ``--out`` is checked before anything is read."""
    return mcore_to_hf_streaming(ckpt_dir, out_dir, force=force, max_shard_bytes=max_shard_bytes,
                                 hf_config=hf_config, dtype=dtype)
