"""Conversion against LIVE (sharded) Megatron models: load HF weights into this rank's chunks,
and gather full HF-named tensors back out (weight sync, HF export).

Both functions are collective over the model-parallel grid when ``torch.distributed`` is
initialised; they also work in a single process (TP = PP = 1).
"""
from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Iterable, Iterator

import torch
import torch.distributed as dist

from megatron_rl.convert import name_maps, transforms
from megatron_rl.convert.atomic import EXPORT_MARKER, atomic_dir
from megatron_rl.convert.config_json import with_dtype
from megatron_rl.convert.hf_io import HFReader, HFWriter, copy_tokenizer_files
from megatron_rl.models.lora import is_adapter_param, lora_modules
from megatron_rl.models.provider import ArchInfo, load_hf_config, model_arch_info, padded_vocab_size
from megatron_rl.runtime.diskspace import check_free_on_rank0, meta_bytes

log = logging.getLogger("megatron_rl.convert")


def _grid() -> tuple[int, int, int, int]:
    """(tp size, tp rank, pp size, pp rank) of this process."""
    from megatron.core import parallel_state as ps  # lazy: defers megatron to the call

    if not ps.model_parallel_is_initialized():
        return 1, 0, 1, 0
    return (ps.get_tensor_model_parallel_world_size(), ps.get_tensor_model_parallel_rank(),
            ps.get_pipeline_model_parallel_world_size(), ps.get_pipeline_model_parallel_rank())


def _layer_offset(model) -> int:
    layers = getattr(getattr(model, "decoder", None), "layers", None)
    return int(layers[0].layer_number) - 1 if layers is not None and len(layers) else 0


def local_params(model_chunks: Iterable[torch.nn.Module], arch: ArchInfo) -> dict[str, torch.nn.Parameter]:
    """``{global local-spec Megatron name: parameter}`` for this rank's chunks (the base model's: LoRA
    adapters, ``models/lora.py``, are no HF tensor and are left out)."""
    out = {}
    for m in model_chunks:
        off = _layer_offset(m)
        for name, p in m.named_parameters():
            if is_adapter_param(name):
                continue
            g = name_maps.canonical_local_name(name_maps.local_to_global(name, off))
            if arch.tied_embeddings and g == "output_layer.weight":
                g = "output_layer.weight(tied)"
            out[g] = p
    return out


def merged_local(model_chunks: Iterable[torch.nn.Module]) -> dict[str, torch.nn.Module]:
    """``{global Megatron weight name: LoRA module}`` of this rank's chunks: what :func:`local_weight` merges."""
    return {f"decoder.layers.{layer}.{module}.weight": m for c in model_chunks
            for layer, module, m in lora_modules(c, _layer_offset(c))}


def local_weight(params: dict, merged: dict, name: str) -> torch.Tensor:
    """This rank's tensor of ``name`` as the HF side sees it: with LoRA adapters, W + s·B·A of the shard
    (``models/lora.py``: the merge is shard-local, in the base's layout), else the parameter itself."""
    return merged[name].merged_weight() if name in merged else params[name].detach()


def build_full(rule: name_maps.Rule, tensors: list[torch.Tensor], arch: ArchInfo) -> torch.Tensor:
    """HF tensors of ``rule`` -> the full (TP=1) Megatron tensor."""
    if rule.transform == "qkv":
        return transforms.fuse_qkv(*tensors, arch.num_heads, arch.num_kv_heads, arch.head_dim)
    if rule.transform == "gate_up":
        return transforms.fuse_gate_up(*tensors)
    return tensors[0]


def split_full(rule: name_maps.Rule, full: torch.Tensor, arch: ArchInfo) -> list[torch.Tensor]:
    """Inverse of :func:`build_full`."""
    if rule.transform == "qkv":
        return list(transforms.split_qkv(full, arch.num_heads, arch.num_kv_heads, arch.head_dim))
    if rule.transform == "gate_up":
        return list(transforms.split_gate_up(full))
    return [full]


def check_hf_names(names: Iterable[str], arch: ArchInfo) -> None:
    """Raise naming missing / unexpected HF tensors (``lm_head`` tolerated for tied models)."""
    names = set(names)
    expected = name_maps.expected_hf_names(arch)
    missing = sorted(expected - names)
    extra = sorted(names - expected - ({"lm_head.weight"} if arch.tied_embeddings else set()))
    if missing:
        raise KeyError(f"HF checkpoint is missing {len(missing)} tensor(s): {missing[:8]}")
    if extra:
        raise ValueError(f"HF checkpoint has {len(extra)} unexpected tensor(s) for {arch.architecture}: {extra[:8]}")


def load_hf_into_model(model_chunks, hf_dir, parallel_info=None) -> int:
    """Fill this rank's Megatron chunks from an HF safetensors dir, reading only needed tensors.

    Every parameter of the chunks must be covered and the checkpoint must hold exactly the
    architecture's tensors (else ``KeyError`` / ``ValueError`` naming them). Returns #params set.
    """
    arch = model_arch_info(load_hf_config(hf_dir))
    reader = HFReader(hf_dir)
    check_hf_names(reader.names(), arch)
    tp, tp_rank, _, _ = _grid()
    params = local_params(model_chunks, arch)
    by_name = {r.mcore: r for r in name_maps.expand(arch)}
    emb = by_name["embedding.word_embeddings.weight"]
    vpad = padded_vocab_size(arch, tp)
    done = 0
    with torch.no_grad():
        for g, p in params.items():
            rule = emb if g == "output_layer.weight(tied)" else by_name.get(g)
            if rule is None:
                raise KeyError(f"Megatron parameter {g!r} has no rule in the {arch.architecture} name map")
            parts = [reader.get(h) for h in rule.hf]
            for h, t, want in zip(rule.hf, parts, hf_shapes(rule, arch)):   # named as the user's files name it
                if tuple(t.shape) != tuple(want):
                    raise ValueError(f"{hf_dir}: HF tensor {h!r} has shape {tuple(t.shape)}, expected {tuple(want)} "
                                     f"for {arch.architecture} as its config.json describes it")
            full = build_full(rule, parts, arch)
            part = transforms.shard(full, rule.tp, rule.transform, tp, tp_rank, vpad)
            if part.shape != p.shape:
                raise ValueError(f"{g}: HF-derived shard {tuple(part.shape)} != Megatron {tuple(p.shape)}")
            p.copy_(part.to(p.dtype))
            done += 1
    return done


def full_shape(rule: name_maps.Rule, arch: ArchInfo) -> tuple[int, ...]:
    """Shape of the full (TP=1, unpadded) Megatron tensor of a rule."""
    h, d = arch.hidden_size, arch.head_dim
    qkv = (arch.num_heads + 2 * arch.num_kv_heads) * d
    m = rule.mcore
    if rule.tp == "vocab":
        return (arch.vocab_size, h)
    if m.endswith("linear_qkv.weight"):
        return (qkv, h)
    if m.endswith("linear_qkv.bias"):
        return (qkv,)
    if m.endswith("linear_proj.weight"):
        return (h, arch.num_heads * d)
    if m.endswith("linear_fc1.weight"):
        return (2 * arch.ffn_hidden_size, h)
    if m.endswith("linear_fc2.weight"):
        return (h, arch.ffn_hidden_size)
    if "q_layernorm" in m or "k_layernorm" in m:
        return (d,)
    return (h,)


def hf_shapes(rule: name_maps.Rule, arch: ArchInfo) -> tuple[tuple[int, ...], ...]:
    """Expected shapes of the HF tensors of ``rule`` (same order as ``rule.hf``)."""
    full = full_shape(rule, arch)
    if rule.transform == "qkv":
        q, kv = arch.num_heads * arch.head_dim, arch.num_kv_heads * arch.head_dim
        return ((q, *full[1:]), (kv, *full[1:]), (kv, *full[1:]))
    if rule.transform == "gate_up":
        return ((full[0] // 2, *full[1:]),) * 2
    return (full,)


def _owner_stage(rule: name_maps.Rule, arch: ArchInfo, pp: int, vpp: int = 1) -> int:
    """The pipeline rank holding ``rule``'s tensor. With ``vpp`` virtual stages (interleaved 1F1B) Megatron
    gives virtual chunk v of rank r the layers from v·L/vpp + r·L/(pp·vpp) (``get_transformer_layer_offset``),
    so layer l lives on rank (l mod L/vpp) // (L/(pp·vpp))."""
    if rule.per_layer or rule.mcore.startswith("decoder.layers."):
        layer = int(rule.mcore.split(".")[2])
        return (layer % (arch.num_layers // vpp)) // (arch.num_layers // (pp * vpp))
    return 0 if rule.mcore.startswith("embedding") else pp - 1


def _vpp() -> int:
    from megatron.core import parallel_state as ps  # lazy: defers megatron to the call

    return (ps.get_virtual_pipeline_model_parallel_world_size() or 1) if ps.model_parallel_is_initialized() else 1


def iter_hf_tensors(model_chunks, hf_cfg) -> Iterator[tuple[str, torch.Tensor]]:
    """Collective: yield ``(hf_name, full tensor)`` for the whole model, in HF order, ON EVERY RANK.

    Per tensor: the owning pipeline stage all-gathers the TP shards and joins them
    (``transforms.unshard``), then broadcasts the full Megatron tensor over the pipeline group;
    HF tensors are split out of it (``split_qkv``, ``split_gate_up``). Peak extra memory: one
    layer's largest tensor. All ranks must consume the iterator completely.
    """
    from megatron.core import parallel_state as ps  # lazy: defers megatron to the call

    arch = model_arch_info(hf_cfg)
    tp, _, pp, pp_rank = _grid()
    model_chunks = list(model_chunks)
    params, merged = local_params(model_chunks, arch), merged_local(model_chunks)
    vpp = _vpp()
    for rule in name_maps.expand(arch):
        owner = _owner_stage(rule, arch, pp, vpp)
        dtype = next(iter(params.values())).dtype
        full = None
        if pp_rank == owner:
            local = local_weight(params, merged, rule.mcore)
            dtype = local.dtype
            if tp > 1:
                group = ps.get_tensor_model_parallel_group()
                shards = [torch.empty_like(local) for _ in range(tp)]
                dist.all_gather(shards, local.contiguous(), group=group)
            else:
                shards = [local]
            full = transforms.unshard(shards, rule.tp, rule.transform, arch.vocab_size)
        if pp > 1:
            group = ps.get_pipeline_model_parallel_group()
            if full is None:
                full = torch.empty(full_shape(rule, arch), dtype=dtype, device=local_device(params))
            full = full.contiguous()
            dist.broadcast(full, src=dist.get_process_group_ranks(group)[owner], group=group)
        for hf_name, t in zip(rule.hf, split_full(rule, full, arch)):
            yield hf_name, t


def hf_tensor_meta(hf_cfg, dtype: torch.dtype) -> list[tuple[str, torch.dtype, tuple[int, ...]]]:
    """``(hf_name, dtype, shape)`` of every tensor :func:`stream_hf_tensors` yields, in order, computed
    on the meta device (no gather, no memory): the weight-sync metadata sent before any bytes."""
    arch = model_arch_info(hf_cfg)
    out = []
    for rule in name_maps.expand(arch):
        full = torch.empty(full_shape(rule, arch), dtype=dtype, device="meta")
        out.extend((n, dtype, tuple(t.shape)) for n, t in zip(rule.hf, split_full(rule, full, arch)))
    return out


def stream_hf_tensors(model_chunks, hf_cfg, sender: int = 0) -> Iterator[tuple[str, torch.Tensor]]:
    """Collective over the trainer: yield ``(hf_name, full tensor)`` ON GLOBAL RANK ``sender`` only.

    Weight-sync producer (unlike :func:`iter_hf_tensors`, which gives every rank every tensor):
    per tensor, only the data-parallel replica of ``sender`` works. The owning pipeline stage
    all-gathers the TP shards (``transforms.unshard``); if that stage is not the sender's, its TP-rank-0
    sends the full tensor point-to-point to the sender — each PP stage contributes its own layers
    and no other rank receives anything. Peak extra memory on any rank: one full tensor (+ its
    TP shards). Other ranks yield nothing but must run the iterator to the end.
    """
    from megatron.core import parallel_state as ps  # lazy: defers megatron to the call

    arch = model_arch_info(hf_cfg)
    tp, _, pp, pp_rank = _grid()
    me = dist.get_rank() if dist.is_initialized() else 0
    if me != sender and ps.model_parallel_is_initialized() and (ps.get_data_parallel_rank() != 0
                                                                or ps.get_context_parallel_rank() != 0):
        return        # another DP / CP replica of the weights (a whole TP group leaves together)
    model_chunks = list(model_chunks)
    params, merged = local_params(model_chunks, arch), merged_local(model_chunks)
    dtype = next(iter(params.values())).dtype
    pp_ranks = dist.get_process_group_ranks(ps.get_pipeline_model_parallel_group()) if pp > 1 else [me]
    on_sender_column = sender in pp_ranks
    vpp = _vpp()
    for rule in name_maps.expand(arch):
        owner = _owner_stage(rule, arch, pp, vpp)
        full = None
        if pp_rank == owner:
            local = local_weight(params, merged, rule.mcore)
            shards = [local]
            if tp > 1:
                shards = [torch.empty_like(local) for _ in range(tp)]
                dist.all_gather(shards, local.contiguous(), group=ps.get_tensor_model_parallel_group())
            full = transforms.unshard(shards, rule.tp, rule.transform, arch.vocab_size)
            del shards
            if me != sender and on_sender_column:
                dist.send(full.contiguous(), dst=sender)
                full = None
        elif me == sender:
            full = torch.empty(full_shape(rule, arch), dtype=dtype, device=local_device(params))
            dist.recv(full, src=pp_ranks[owner])
        if me == sender:
            yield from zip(rule.hf, split_full(rule, full, arch))
        full = None


def local_device(params: dict) -> torch.device:
    return next(iter(params.values())).device


def export_hf(model_chunks, hf_cfg, out_dir, *, force: bool = True, tokenizer_dir=None,
              max_shard_bytes: int = 2 << 30, dtype: torch.dtype | None = None) -> None:
    """Collective: write an HF checkpoint (safetensors shards + config.json [+ tokenizer files]) of
    the live model to ``out_dir`` (rank 0 writes, atomically).

    The tensors come from :func:`stream_hf_tensors` (the weight-sync reader: per tensor, the owning
    stage gathers its TP shards and sends it to rank 0) and go straight into their shard
    (``hf_io.HFWriter``, headers planned from :func:`hf_tensor_meta`): peak extra memory one full
    tensor, never a shard or a model copy. ``dtype``: the exported weights' dtype (default: the
    model's training dtype, i.e. its parameters'); ``config.json`` names it."""
    cfg = load_hf_config(hf_cfg)
    writer_rank = not dist.is_initialized() or dist.get_rank() == 0
    dtype = dtype or next(p for m in model_chunks for p in m.parameters()).dtype

    check_free_on_rank0(Path(out_dir).resolve().parent, meta_bytes(hf_tensor_meta(cfg, dtype)),
                        f"the HF export {Path(out_dir).name}")
    with atomic_dir(out_dir, force=force, enabled=writer_rank) as tmp:
        writer = HFWriter(tmp, hf_tensor_meta(cfg, dtype), max_shard_bytes) if writer_rank else None
        for name, t in stream_hf_tensors(model_chunks, cfg, sender=0):
            writer.write(name, t.to("cpu", dtype))
        if writer_rank:
            writer.close()
            cfg.save_pretrained(str(tmp))
            conf = tmp / "config.json"
            conf.write_text(json.dumps(with_dtype(json.loads(conf.read_text()), dtype), indent=2) + "\n")
            if tokenizer_dir is not None:
                copy_tokenizer_files(tokenizer_dir, tmp)
            (tmp / EXPORT_MARKER).write_text(json.dumps({"written_by": "megatron-rl", "architecture": cfg.architectures,
                                                         "dtype": str(dtype)}))
    if dist.is_initialized():
        dist.barrier()
