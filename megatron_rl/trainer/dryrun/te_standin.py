"""Transformer Engine's memory in megatron's local layer spec: the dry run's layers hold what the GPU build's
TE layers hold, with none of their arithmetic (the values are meta anyway).

The GPU build runs TE's layer spec (``model.backend`` te / auto); this CPU has no Transformer Engine, so the dry
run builds megatron's local spec and swaps, in every chunk, the modules whose memory differs:

* ``core_attention`` (no parameters) -> :class:`FlashStandIn`. TE's fused (flash) attention keeps no S x S
  scores: its forward saves q, k and v (GQA's kv heads unexpanded), the output and the fp32 log-sum-exp of every
  query row and head; its backward makes dq, dk, dv and an fp32 dq accumulator. Layouts as megatron hands them
  to the core attention: sbhd ``[s, b, heads, d]`` (padded rows; out ``[s, b, heads x d]``) and THD
  ``[t, heads, d]`` (packed rows, ``packed_seq_params``; out ``[t, heads, d]``).
* every RMSNorm (the layers' two, the final one, Qwen3's q/k norms) -> :class:`FusedNormStandIn` on the same
  weight (its Parameter object: DDP's buffers and hooks keep it). TE's fused norm saves its input and an fp32
  rsigma per row; torch's ``rms_norm`` (the local spec's) saves two fp32 copies of the input as well (measured:
  4 of every 10 activation bytes of a layer on Llama-3.1-8B at TP 4), which no GPU run holds.

Left as the local spec runs them: RoPE (unfused: 4 bf16 cos/sin tables of ``[t, 1, 1, d]`` a layer, ~3% of a
layer's activations, where TE's fused RoPE keeps one fp32 table) and the fused SwiGLU (``bias_activation_fusion``:
megatron's own, as on the GPU).
"""
from __future__ import annotations

import torch


class _Flash(torch.autograd.Function):
    """q, k, v -> out, saving what flash attention saves (module docstring)."""

    @staticmethod
    def forward(ctx, q, k, v):
        out = torch.empty_like(q)
        lse = torch.empty(q.shape[:-1], dtype=torch.float32, device=q.device)   # one per query row and head
        ctx.save_for_backward(q, k, v, out, lse)
        return out

    @staticmethod
    def backward(ctx, grad_out):
        q, k, v, _out, _lse = ctx.saved_tensors
        accum = torch.empty(q.shape, dtype=torch.float32, device=q.device)    # flash-attn's fp32 dq accumulator
        dq = torch.empty_like(q)
        del accum
        return dq, torch.empty_like(k), torch.empty_like(v)


class FlashStandIn(torch.nn.Module):
    """Megatron's core-attention interface over :class:`_Flash` (module docstring)."""

    def forward(self, query, key, value, attention_mask=None, attn_mask_type=None, attention_bias=None,
                packed_seq_params=None, **_):
        out = _Flash.apply(query, key, value)
        if query.dim() == 3:            # THD: megatron reshapes [t, heads, d] itself
            return out
        s, b = out.shape[:2]
        return out.reshape(s, b, -1)


class _Norm(torch.autograd.Function):
    """x -> RMSNorm(x) · w, saving what TE's fused norm saves: x and an fp32 rsigma per row."""

    @staticmethod
    def forward(ctx, x, weight):
        rsigma = torch.empty(x.shape[:-1], dtype=torch.float32, device=x.device)
        ctx.save_for_backward(x, weight, rsigma)
        return torch.empty_like(x)

    @staticmethod
    def backward(ctx, grad_out):
        x, weight, _rsigma = ctx.saved_tensors
        return torch.empty_like(x), torch.empty_like(weight)


class FusedNormStandIn(torch.nn.Module):
    """An RMSNorm over the weight of the norm it replaces (module docstring)."""

    def __init__(self, norm: torch.nn.Module):
        super().__init__()
        self.weight = norm.weight

    def forward(self, x):
        return _Norm.apply(x, self.weight)


def use_te_memory(chunks) -> dict[str, int]:
    """Swap, in ``chunks`` (model chunks, wrapped or not), every core attention for :class:`FlashStandIn` and
    every RMSNorm for :class:`FusedNormStandIn`; returns how many of each."""
    n = {"attention": 0, "norm": 0}
    for chunk in chunks:
        for parent in list(chunk.modules()):
            for name, child in list(parent.named_children()):
                if name == "core_attention" and not isinstance(child, FlashStandIn):
                    setattr(parent, name, FlashStandIn())
                    n["attention"] += 1
                elif isinstance(child, torch.nn.RMSNorm):
                    setattr(parent, name, FusedNormStandIn(child))
                    n["norm"] += 1
    return n
