"""Offline conversion between HF safetensors dirs and Megatron ``dist_checkpointing`` checkpoints.

Megatron checkpoint layout written here (the trainer's ``load_model_weights`` reads it too)::

    OUT/dist/        megatron-core dist_checkpointing (torch_dist), key "model" — loads at ANY TP/PP
    OUT/hf/          config.json (+ tokenizer files): what the model is
    OUT/COMPLETE     JSON marker, written last: {"step": 0, "tp": .., "pp": .., "source": ..}

HF -> Megatron streams by default (``stream.py``: no model, chunk-by-chunk byte copies, bounded memory;
under ``torchrun`` each rank writes a share of the chunks). The model-building path
(``engine="model"``) and Megatron -> HF run as one process or under ``torchrun`` (each rank builds
and saves only its TP/PP shard). Outputs are written to a temp dir and renamed.
"""
from __future__ import annotations

import json
import logging
import os
from pathlib import Path

import torch.distributed as dist

log = logging.getLogger("megatron_rl.convert")


def _init(tp: int, pp: int):
    from megatron_rl.parallel import init_parallel

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
    from megatron_rl.convert.atomic import check_out_dir, make_temp_dir

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
        from megatron_rl.convert.stream import hf_to_mcore_streaming

        return hf_to_mcore_streaming(hf_dir, out_dir, tp=tp, pp=pp, force=force)
    if engine != "model":
        raise ValueError(f"unknown conversion engine {engine!r}; supported: stream, model")
    return _hf_to_mcore_via_model(hf_dir, out_dir, tp, pp, force)


def _hf_to_mcore_via_model(hf_dir, out_dir, tp: int, pp: int, force: bool) -> Path:
    import shutil

    from megatron.core import dist_checkpointing

    from megatron_rl.convert.atomic import replace_dir
    from megatron_rl.convert.hf_io import copy_tokenizer_files
    from megatron_rl.convert.live import load_hf_into_model
    from megatron_rl.models.provider import (
        build_gpt_model,
        load_hf_config,
        transformer_config_from_hf,
        validate_layout,
    )

    hf_dir, out = Path(hf_dir), Path(out_dir).resolve()
    cfg = load_hf_config(hf_dir)
    validate_layout(cfg, tp, pp)
    info = _init(tp, pp)
    tmp = _shared_tmp(out, force)
    try:
        # every parameter is overwritten from the HF files: skip megatron's (slow) random init
        model = build_gpt_model(cfg, transformer_config_from_hf(cfg, tp=info.tp, pp=info.pp, perform_initialization=False))
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
                max_shard_bytes: int = 2 << 30, tp: int = 1, pp: int = 1, hf_config: str | None = None) -> Path:
    """Convert a Megatron checkpoint (this module's layout, or a trainer ``checkpoints/step_N`` dir)
    into an HF safetensors dir loadable by ``AutoModelForCausalLM``.

    The architecture comes from ``CKPT/hf/config.json`` (both layouts write it); ``hf_config`` (a
    model dir or ``config.json``) stands in for checkpoints written without one. ``--out`` is checked
    before the model is built (``atomic.check_out_dir``)."""
    from megatron_rl.convert.atomic import check_out_dir

    ckpt = Path(ckpt_dir)
    if not (ckpt / "COMPLETE").is_file():
        hint = ""
        if (ckpt / "checkpoints").is_dir():
            hint = f" (a run directory? pass one of its checkpoints, e.g. {ckpt / 'checkpoints' / 'step_N'})"
        raise FileNotFoundError(f"{ckpt} is not a complete Megatron checkpoint (no COMPLETE marker){hint}")
    if not (ckpt / "dist").is_dir():
        raise FileNotFoundError(f"{ckpt}/dist missing: not a Megatron dist checkpoint")
    src = Path(hf_config) if hf_config else ckpt / "hf"
    if not ((src / "config.json").is_file() or (src.is_file() and src.name.endswith(".json"))):
        raise FileNotFoundError(f"{src}/config.json missing: cannot tell the architecture; pass --hf-config "
                                "<the run's model.hf_path>")
    check_out_dir(out_dir, force)
    from megatron.core import dist_checkpointing

    from megatron_rl.convert.live import export_hf
    from megatron_rl.models.provider import build_gpt_model, load_hf_config

    cfg = load_hf_config(src)
    _init(tp, pp)
    model = build_gpt_model(cfg)
    state = dist_checkpointing.load({"model": model.sharded_state_dict(prefix="")}, str(ckpt / "dist"))
    model.load_state_dict(state["model"], strict=True)
    tok_dir = src if src.is_dir() else src.parent
    export_hf([model], cfg, out_dir, force=force, tokenizer_dir=tok_dir, max_shard_bytes=max_shard_bytes)
    return Path(out_dir)
