"""What a dry-run rank holds, from the storages the code allocated (``runtime/fake_device.py``'s ledger): the
static components by owner, and the working set of a phase by its peak.

Static (each storage counted once, under the first owner that holds it)::

    weights     the policy's parameters (Megatron DDP's param buffers, padding included)
    grads       their ``main_grad`` (DDP's fp32 grad buffers)
    optimizer   the distributed optimizer's fp32 main-parameter shards and Adam's state (exp_avg, exp_avg_sq)
    reference   the reference policy's parameters
    teacher     the teacher's shadow (fp32 copy of this rank's shard)
    other       the rest the device holds (RoPE tables, flags, Megatron's buffers)

A phase's working set is its peak minus what was held when it started (:func:`phase`).
"""
from __future__ import annotations

import contextlib
import time

import torch


def optimizer_tensors(optimizer) -> list[torch.Tensor]:
    """The tensors Megatron's (chained, distributed) optimizer holds: the inner optimizers' parameters (the fp32
    main shards), their state, and the fp32 shard lists of the distributed optimizer."""
    out: list[torch.Tensor] = []
    for opt in getattr(optimizer, "chained_optimizers", [optimizer]):
        inner = getattr(opt, "optimizer", None)
        if inner is not None:
            out += [p for g in inner.param_groups for p in g["params"]]
            out += [v for st in inner.state.values() for v in st.values() if isinstance(v, torch.Tensor)]
        for name in ("shard_fp32_from_float16_groups", "shard_fp32_groups", "fp32_from_float16_groups"):
            out += [t for g in getattr(opt, name, None) or [] for t in g if isinstance(t, torch.Tensor)]
    return out


def static_bytes(dev, models) -> dict[str, int]:
    """The static components (module docstring), in bytes."""
    params = [p for c in models.actor.chunks for p in c.parameters()]
    owners = {
        "weights": params,
        "grads": [g for p in params if (g := getattr(p, "main_grad", None)) is not None],
        "optimizer": optimizer_tensors(models.actor.optimizer),
        "reference": [p for c in models.ref.chunks for p in c.parameters()] if models.ref else [],
        "teacher": list(models.teacher.shadow) if models.teacher else [],
    }
    out, counted = {}, 0
    for name, tensors in owners.items():
        out[name] = dev.storage_bytes(tensors) - _overlap(dev, owners, name)
        counted += out[name]
    out["other"] = dev.bytes - counted
    return out


def _overlap(dev, owners: dict, name: str) -> int:
    """Bytes of ``name``'s storages already counted under an earlier owner (0 unless they share storage)."""
    names = list(owners)
    earlier = [t for n in names[: names.index(name)] for t in owners[n]]
    if not earlier:
        return 0
    both = dev.storage_bytes(earlier + owners[name])
    return dev.storage_bytes(earlier) + dev.storage_bytes(owners[name]) - both


@contextlib.contextmanager
def phase(dev, into: dict, name: str):
    """Measure the block as phase ``name``: ``into[name] = {"start", "peak", "working", "seconds"}`` (bytes held
    when it started, its peak, peak − start)."""
    start = dev.reset_peak()
    t0 = time.perf_counter()
    try:
        yield
    finally:
        into[name] = {"start": start, "peak": dev.peak, "working": dev.peak - start,
                      "seconds": round(time.perf_counter() - t0, 2)}


def param_counts(models, tp: int, padded_vocab: int, vocab: int) -> dict[str, int]:
    """This rank's parameters: ``local`` (what it holds), and ``unique`` — its share of the model's count, summed
    over the roles to the HF count: TP-sharded tensors times TP, replicated ones once, the tied embedding's copy
    on the last stage left out, the vocabulary padding taken off; ``adapters`` — this rank's LoRA adapter parameters
    (``lora.enable``), counted in neither (transformers' model has none)."""
    local = unique = adapters = 0
    for chunk in models.actor.chunks:
        for name, p in chunk.named_parameters():
            if ".lora_A." in name or ".lora_B." in name:
                adapters += p.numel()
                continue
            local += p.numel()
            if getattr(p, "shared_embedding", False) and "output_layer" in name:
                continue                                 # the tied copy (megatron's shared_embedding)
            n = p.numel() * (tp if getattr(p, "tensor_model_parallel", False) else 1)
            if ("word_embeddings" in name or "output_layer" in name) and p.shape[0] * tp == padded_vocab:
                n = n // padded_vocab * vocab           # embedding / output layer rows: the padding off
            unique += n
    return {"local": local, "unique": unique, "adapters": adapters}
