"""Streaming Megatron -> HF export of a checkpoint on disk: no model is built, tensor by tensor.

    1. the architecture from ``config.json`` (``config_json``; ``CKPT/hf`` or ``--hf-config``) and the
       DCP metadata of ``CKPT/dist`` (``dcp_reader``);
    2. per name-map rule, in HF order: read the full (TP=1) Megatron tensor from whatever chunks the
       checkpoint holds (a converted checkpoint's TP=1 chunks, a training checkpoint's TP shards and
       PP stages; the optimizer's keys are never touched), cut the vocab padding, un-fuse QKV and
       gate/up (``split_full``), cast to the export dtype;
    3. append each HF tensor to its safetensors shard as it comes (``hf_io.HFWriter``: headers planned
       from the shapes up front). Where the tensor's rows are plain byte ranges of the checkpoint's
       records in the export dtype (every tensor of a converted checkpoint; a training checkpoint's
       column-parallel and replicated ones), they are copied file to file (``copy_file_range``, as in
       the HF -> Megatron direction: on this machine a user-space ``write`` of fresh pages runs at a
       fraction of the kernel copy's speed); otherwise the tensor is assembled in memory (row-parallel
       TP shards, a dtype cast) and written;
    4. ``config.json`` naming the export dtype, tokenizer files, the export marker; rename into place.

Export dtype: ``dtype`` if given, else the checkpoint's stored model dtype (the model's training
dtype: bf16 for a bf16 source or a bf16 run), so an unchanged round trip is bit-identical per tensor.
Peak memory: nothing for byte-copied tensors; one rule's tensors (+ one chunk) for assembled ones;
never the model.
"""
from __future__ import annotations

import json
import logging
import os
import time
from pathlib import Path

import torch
import torch.distributed as dist

from megatron_rl.convert import name_maps
from megatron_rl.convert.atomic import EXPORT_MARKER, atomic_dir, check_out_dir
from megatron_rl.convert.config_json import arch_info, config_path, parse_dtype, read_config, with_dtype
from megatron_rl.convert.dcp_reader import DcpReader
from megatron_rl.convert.hf_io import HFWriter, copy_tokenizer_files
from megatron_rl.convert.live import full_shape, hf_shapes, hf_tensor_meta, split_full
from megatron_rl.convert.mcore_layout import rule_chunks, stacked_key
from megatron_rl.convert.stream import _agree, _dist
from megatron_rl.runtime.diskspace import check_free, meta_bytes

log = logging.getLogger("megatron_rl.convert")


def rule_box(rule, arch) -> tuple[str, tuple[int, ...], tuple[int, ...]]:
    """(DCP key, offsets, sizes) of the full unpadded Megatron tensor of a concrete rule."""
    shape = full_shape(rule, arch)
    if not rule.mcore.startswith("decoder.layers."):
        return rule.mcore, (0,) * len(shape), shape
    layer = int(rule.mcore.split(".")[2])
    return stacked_key(rule.mcore), (layer,) + (0,) * len(shape), (1, *shape)


def read_rule(reader, rule, arch, dtype: torch.dtype | None) -> list[tuple[str, torch.Tensor]]:
    """``(hf_name, tensor)`` of one rule from a checkpoint (``dtype``: cast to it; None keeps it)."""
    key, off, size = rule_box(rule, arch)
    full = reader.read(key, off, size).reshape(full_shape(rule, arch))
    parts = split_full(rule, full, arch) if rule.transform != "identity" else [full]
    return [(n, t if dtype is None or t.dtype == dtype else t.to(dtype)) for n, t in zip(rule.hf, parts)]


def hf_rows(rule, arch) -> dict[str, list[tuple[str, tuple[int, ...], int, int]]]:
    """Per HF tensor of a concrete rule: its rows in HF order as pieces ``(DCP key, leading index,
    first row, rows)`` of the full Megatron tensor (the inverse of ``mcore_layout.rule_chunks``'
    segments: QKV per KV group, gate / up halves, the vocab without its padding)."""
    ndim = len(full_shape(rule, arch))
    found: dict[str, list] = {h: [] for h in rule.hf}
    for c in rule_chunks(rule, arch, tp=1):
        k = len(c.offsets) - ndim
        m = c.offsets[k]
        for seg in c.segments:
            if seg.hf is not None:
                found[seg.hf].append((seg.row0, (c.key, tuple(c.offsets[:k]), m, seg.rows)))
            m += seg.rows
    return {h: [p for _, p in sorted(v)] for h, v in found.items()}


def copy_rule(reader, writer, rule, arch, dtype: torch.dtype) -> bool:
    """Write the HF tensors of ``rule`` as byte copies from the checkpoint's files when every piece
    is a plain byte range in ``dtype`` (``DcpReader.row_ranges``); False (nothing written) otherwise."""
    plans = []
    for (name, pieces), shape in zip(hf_rows(rule, arch).items(), hf_shapes(rule, arch)):
        ranges = []
        for key, prefix, row0, rows in pieces:
            got = reader.row_ranges(key, prefix, row0, rows, dtype)
            if got is None:
                return False
            ranges += got
        plans.append((name, shape, ranges))
    for name, shape, ranges in plans:
        writer.copy(name, dtype, shape, ranges)
    return True


def mcore_to_hf_streaming(ckpt_dir: str | os.PathLike, out_dir: str | os.PathLike, force: bool = False,
                          max_shard_bytes: int = 2 << 30, hf_config: str | os.PathLike | None = None,
                          dtype: str | torch.dtype | None = None) -> Path:
    """Export a Megatron checkpoint (converted, or a trainer ``checkpoints/step_N``) as an HF
    safetensors dir at ``out_dir``. Under torchrun rank 0 writes; the others wait for it."""
    rank, world, created = _dist()
    err = None
    try:
        if rank == 0:
            try:
                _export(Path(ckpt_dir), Path(out_dir).resolve(), force, max_shard_bytes, hf_config, dtype)
            except Exception as e:  # noqa: BLE001 (shared with the other ranks by _agree, then re-raised)
                err = e
        _agree(err, world, None)
    finally:
        if created:
            dist.destroy_process_group()
    return Path(out_dir)


def _check_ckpt(ckpt: Path, hf_config) -> Path:
    """The config source; ``FileNotFoundError`` with a hint when ``ckpt`` is not a complete checkpoint."""
    if not (ckpt / "COMPLETE").is_file():
        hint = ""
        if (ckpt / "checkpoints").is_dir():
            hint = f" (a run directory? pass one of its checkpoints, e.g. {ckpt / 'checkpoints' / 'step_N'})"
        raise FileNotFoundError(f"{ckpt} is not a complete Megatron checkpoint (no COMPLETE marker){hint}")
    if not (ckpt / "dist").is_dir():
        raise FileNotFoundError(f"{ckpt}/dist missing: not a Megatron dist checkpoint")
    src = Path(hf_config) if hf_config else ckpt / "hf"
    if not config_path(src).is_file():
        raise FileNotFoundError(f"{src}/config.json missing: cannot tell the architecture; pass --hf-config "
                                "<the run's model.hf_path>")
    return src


def _export(ckpt: Path, out: Path, force: bool, max_shard_bytes: int, hf_config, dtype) -> None:
    t0 = time.perf_counter()
    src = _check_ckpt(ckpt, hf_config)
    check_out_dir(out, force)
    cfg_dir = config_path(src).parent   # tokenizer files sit beside the config
    arch, _ = arch_info(src)
    rules = name_maps.expand(arch)
    with DcpReader(ckpt / "dist") as reader:
        if any(".lora_A." in k or ".lora_B." in k for k in reader.tensor_keys()):
            raise ValueError(f"{ckpt} holds LoRA adapters (lora.enable): this exporter writes the base weights only; use "
                             "the run's merged export (trainer.export_hf: run_dir/hf) and its PEFT adapter (run_dir/adapter)")
        for r in rules:   # every key present before anything is written
            reader.shape(rule_box(r, arch)[0])
        want = parse_dtype(dtype) if isinstance(dtype, str) else dtype
        want = want or reader.dtype("embedding.word_embeddings.weight")
        check_free(out.parent, meta_bytes(hf_tensor_meta(arch, want)), f"the HF export {out.name}")
        with atomic_dir(out, force=force) as tmp:
            writer = HFWriter(tmp, hf_tensor_meta(arch, want), max_shard_bytes)
            copied = 0
            for rule in rules:
                if copy_rule(reader, writer, rule, arch, want):
                    copied += 1
                    continue
                for name, t in read_rule(reader, rule, arch, want):
                    writer.write(name, t)
            writer.close()
            (tmp / "config.json").write_text(json.dumps(with_dtype(read_config(src), want), indent=2) + "\n")
            copy_tokenizer_files(cfg_dir, tmp)
            (tmp / EXPORT_MARKER).write_text(json.dumps({"written_by": "megatron-rl", "source": str(ckpt),
                                                         "architecture": [arch.architecture], "dtype": str(want)}))
    log.info("exported %s -> %s (%s, %.2f GB; %d of %d Megatron tensors byte-copied, the rest assembled) in %.2f s",
             ckpt, out, want, writer.total_bytes / 1e9, copied, len(rules), time.perf_counter() - t0)

