"""The attention the dry run's layers run: a stand-in for Transformer Engine's fused (flash) attention, with its
memory and none of its arithmetic.

The GPU build runs TE's fused attention (``model.backend`` te / auto); this CPU has no Transformer Engine, so the
dry run builds megatron's local layer spec and swaps each layer's ``core_attention`` (a module without
parameters) for :class:`FlashStandIn`. Flash attention keeps no S x S scores: its forward saves q, k and v (GQA's
kv heads unexpanded), the output and the fp32 log-sum-exp of every query row and head, and its backward makes
dq, dk, dv and an fp32 dq accumulator. :class:`FlashStandIn` allocates exactly those (empty: the values are
meta anyway), in the layouts megatron hands the core attention: sbhd ``[s, b, heads, d]`` (padded rows; out
``[s, b, heads x d]``) and THD ``[t, heads, d]`` (packed rows, ``packed_seq_params``; out ``[t, heads, d]``).
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


def use_flash(chunks) -> int:
    """Swap every layer's core attention in ``chunks`` (model chunks, wrapped or not) for :class:`FlashStandIn`;
    returns how many were swapped."""
    n = 0
    for chunk in chunks:
        for module in chunk.modules():
            if hasattr(module, "core_attention") and not isinstance(module.core_attention, FlashStandIn):
                module.core_attention = FlashStandIn()
                n += 1
    return n
