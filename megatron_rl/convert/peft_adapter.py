"""LoRA adapters of a live Megatron policy <-> a PEFT adapter (``adapter_config.json`` + ``adapter_model.safetensors``).

PEFT's names: ``base_model.model.model.layers.{i}.self_attn.q_proj.lora_A.weight`` ([r, in]) and
``...lora_B.weight`` ([out, r]), one pair per targeted HF projection. Megatron's fused modules hold one adapter
per projection (``models/lora.py``), so both directions are exact copies: a part's full tensor is its shards
joined over TP (column B by rows, row A by columns; the rest replicated) and gathered over PP.

The merged checkpoint (W + s·B·A) is ``convert.live.export_hf`` of the same chunks: its tensors are read
through ``live.local_weight``, which merges each shard in place of the base weight.
"""
from __future__ import annotations

import json
from pathlib import Path
from collections.abc import Iterable

import torch
import torch.distributed as dist

from megatron_rl.convert.atomic import atomic_dir
from megatron_rl.models.lora import MODULES, LoraSpec, lora_modules, tp_shard

ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"


def peft_name(layer: int, hf_module: str, which: str) -> str:
    """PEFT's saved key of one adapter matrix (``which``: A | B)."""
    return f"base_model.model.model.layers.{layer}.{hf_module}.lora_{which}.weight"


def _tp() -> tuple[int, int, object]:
    from megatron.core import parallel_state as ps  # lazy: defers megatron to the call

    if not ps.model_parallel_is_initialized():
        return 1, 0, None
    return (ps.get_tensor_model_parallel_world_size(), ps.get_tensor_model_parallel_rank(),
            ps.get_tensor_model_parallel_group())


def _layer_offset(model) -> int:
    layers = model.decoder.layers
    return int(layers[0].layer_number) - 1 if len(layers) else 0


def _bare(chunks: Iterable[torch.nn.Module]) -> list[torch.nn.Module]:
    out = []
    for m in chunks:
        while hasattr(m, "module"):
            m = m.module
        out.append(m)
    return out


def gather_adapters(chunks: Iterable[torch.nn.Module], grad: bool = False) -> dict[str, torch.Tensor]:
    """Collective over the trainer: ``{PEFT name: full tensor}`` (fp32, CPU, owned copies: a snapshot, not views into
    Megatron's parameter buffer) of every adapter, on global rank 0 (``{}`` elsewhere). ``grad``: the adapters'
    gradients (``main_grad`` under megatron DDP, else ``.grad``)."""
    from megatron.core import parallel_state as ps  # lazy: defers megatron to the call

    tp, _, group = _tp()
    mine: dict[str, torch.Tensor] = {}
    for model in _bare(chunks):
        for layer, module, m in lora_modules(model, _layer_offset(model)):
            hf = dict(MODULES[module][1])
            for k in m.lora_parts:
                for which, p in (("A", m.lora_A[k]), ("B", m.lora_B[k])):
                    t = (getattr(p, "main_grad", None) if grad else None)
                    t = (t if t is not None else p.grad) if grad else p.detach()
                    t = t.detach().float()
                    if tp > 1 and (m.lora_kind, which) in (("col", "B"), ("row", "A")):
                        shards = [torch.empty_like(t) for _ in range(tp)]
                        dist.all_gather(shards, t.contiguous(), group=group)
                        t = torch.cat(shards, dim=0 if which == "B" else 1)
                    mine[peft_name(layer, hf[k], which)] = t.to("cpu", copy=True)   # not a view of DDP's buffer
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return mine
    first = ps.get_tensor_model_parallel_rank() == 0 and ps.get_data_parallel_rank() == 0 \
        and ps.get_context_parallel_rank() == 0
    got = [None] * dist.get_world_size() if dist.get_rank() == 0 else None
    dist.gather_object(mine if first else {}, got, dst=0)
    return {k: v for d in (got or []) for k, v in d.items()}


@torch.no_grad()
def load_adapters(chunks: Iterable[torch.nn.Module], tensors: dict[str, torch.Tensor]) -> int:
    """Fill this rank's adapters from full PEFT-named tensors (every rank passes the same dict); a missing
    or wrong-shaped tensor raises naming it. Returns the number of tensors set."""
    tp, rank, _ = _tp()
    n = 0
    for model in _bare(chunks):
        for layer, module, m in lora_modules(model, _layer_offset(model)):
            hf = dict(MODULES[module][1])
            for k in m.lora_parts:
                for which, p in (("A", m.lora_A[k]), ("B", m.lora_B[k])):
                    name = peft_name(layer, hf[k], which)
                    if name not in tensors:
                        raise KeyError(f"adapter tensor {name!r} missing")
                    part = tp_shard(tensors[name], m.lora_kind, which, tp, rank)
                    if tuple(part.shape) != tuple(p.shape):
                        raise ValueError(f"{name}: shard {tuple(part.shape)} != Megatron {tuple(p.shape)}")
                    p.copy_(part.to(p.dtype))
                    n += 1
    return n


def adapter_config(lora: LoraSpec, base_model: str = "") -> dict:
    """PEFT's ``adapter_config.json`` of ``lora`` (dropout 0; no bias; causal LM)."""
    return {"peft_type": "LORA", "task_type": "CAUSAL_LM", "base_model_name_or_path": base_model,
            "r": lora.rank, "lora_alpha": lora.alpha, "lora_dropout": 0.0, "target_modules": list(lora.targets),
            "bias": "none", "fan_in_fan_out": False, "use_rslora": False, "init_lora_weights": True,
            "modules_to_save": None, "inference_mode": True}


def export_peft(chunks: Iterable[torch.nn.Module], lora: LoraSpec, out_dir: str | Path, base_model: str = "",
                dtype: torch.dtype = torch.float32, force: bool = True) -> None:
    """Collective: write the adapters as a PEFT adapter dir (rank 0 writes, atomically)."""
    from safetensors.torch import save_file  # lazy: defers safetensors to the call

    tensors = gather_adapters(chunks)
    writer = not dist.is_initialized() or dist.get_rank() == 0
    with atomic_dir(out_dir, force=force, enabled=writer) as tmp:
        if writer:
            save_file({k: v.to(dtype).contiguous() for k, v in sorted(tensors.items())}, str(tmp / ADAPTER_WEIGHTS),
                      metadata={"format": "pt"})
            (tmp / ADAPTER_CONFIG).write_text(json.dumps(adapter_config(lora, base_model), indent=2) + "\n")
    if dist.is_initialized():
        dist.barrier()


def read_peft(adapter_dir: str | Path) -> tuple[dict, dict[str, torch.Tensor]]:
    """(adapter_config.json, tensors) of a PEFT adapter dir."""
    from safetensors.torch import load_file  # lazy: defers safetensors to the call

    d = Path(adapter_dir)
    return json.loads((d / ADAPTER_CONFIG).read_text()), load_file(str(d / ADAPTER_WEIGHTS))
