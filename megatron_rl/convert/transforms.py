"""Named, tested tensor transforms between HF and Megatron layouts (pure torch).

QKV grouping (Megatron ``linear_qkv``): rows are grouped per KV head g = 0..G-1 as
``[q rows of the H/G query heads of group g; k rows of head g; v rows of head g]``, each head
``head_dim`` rows. Shape ``((H + 2G)·d, hidden)`` (or ``((H + 2G)·d,)`` for biases). Because groups
are contiguous, TP rank r's shard is exactly groups ``[r·G/tp, (r+1)·G/tp)`` = a dim-0 chunk.

Gate/up fusion (Megatron ``linear_fc1`` with ``gated_linear_unit``): ``[gate; up]`` on dim 0; TP rank
r holds ``[gate_r; up_r]``, so the full TP=1 matrix is NOT the concatenation of shards.
"""
from __future__ import annotations

import torch


def fuse_qkv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, num_heads: int, num_kv: int, head_dim: int) -> torch.Tensor:
    """HF q [H·d, ...], k [G·d, ...], v [G·d, ...] -> Megatron grouped QKV [(H+2G)·d, ...]."""
    rest = q.shape[1:]
    qg = q.reshape(num_kv, num_heads // num_kv * head_dim, *rest)
    kg = k.reshape(num_kv, head_dim, *rest)
    vg = v.reshape(num_kv, head_dim, *rest)
    return torch.cat([qg, kg, vg], dim=1).reshape(-1, *rest)


def split_qkv(qkv: torch.Tensor, num_heads: int, num_kv: int, head_dim: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Inverse of :func:`fuse_qkv`."""
    rest = qkv.shape[1:]
    per = num_heads // num_kv * head_dim
    g = qkv.reshape(num_kv, per + 2 * head_dim, *rest)
    q, k, v = g.split([per, head_dim, head_dim], dim=1)
    return (q.reshape(-1, *rest).contiguous(), k.reshape(-1, *rest).contiguous(), v.reshape(-1, *rest).contiguous())


def fuse_gate_up(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """HF gate [F, h], up [F, h] -> Megatron fc1 [2F, h] = [gate; up] (TP=1 layout)."""
    return torch.cat([gate, up], dim=0)


def split_gate_up(fc1: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Inverse of :func:`fuse_gate_up`."""
    gate, up = fc1.chunk(2, dim=0)
    return gate.contiguous(), up.contiguous()


def shard(full: torch.Tensor, kind: str, transform: str, tp: int, rank: int, padded_rows: int | None = None) -> torch.Tensor:
    """TP shard ``rank`` of a full (TP=1 layout) Megatron tensor.

    ``kind``: col | row | vocab | rep (see ``name_maps``). ``padded_rows``: full padded vocab for
    ``vocab`` tensors (zero rows appended before splitting).
    """
    if kind == "rep" or tp == 1 and kind != "vocab":
        return full
    if kind == "vocab":
        if padded_rows is not None and padded_rows > full.shape[0]:
            full = torch.cat([full, full.new_zeros(padded_rows - full.shape[0], *full.shape[1:])])
        return full.chunk(tp, dim=0)[rank] if tp > 1 else full
    if kind == "row":
        return full.chunk(tp, dim=1)[rank]
    if transform == "gate_up":
        gate, up = split_gate_up(full)
        return torch.cat([gate.chunk(tp)[rank], up.chunk(tp)[rank]])
    return full.chunk(tp, dim=0)[rank]


def unshard(shards: list[torch.Tensor], kind: str, transform: str, vocab_size: int | None = None) -> torch.Tensor:
    """Inverse of :func:`shard`: join the TP shards into the full TP=1 Megatron tensor
    (vocab tensors are cut back to ``vocab_size`` rows)."""
    if kind == "rep":
        return shards[0]
    if kind == "row":
        return torch.cat(shards, dim=1)
    if kind == "vocab":
        full = torch.cat(shards, dim=0)
        return full[:vocab_size] if vocab_size is not None else full
    if transform == "gate_up":
        halves = [s.chunk(2, dim=0) for s in shards]
        return torch.cat([h[0] for h in halves] + [h[1] for h in halves], dim=0)
    return torch.cat(shards, dim=0)
