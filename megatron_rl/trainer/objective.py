"""Split an aggregation into a (sum, normaliser) pair so the actor can normalise over the GLOBAL batch.

Every aggregation mode of :func:`megatron_rl.algorithms.losses.aggregate` is a ratio

    L = sum_{micro-batches b, DP ranks r} S_b  /  sum_{b, r} D_b        (D = None: no division)

with per-micro-batch numerator ``S_b`` and denominator ``D_b`` below (``m`` the loss mask,
``L_it`` the per-token loss, rows with no response token are skipped by the seq-modes):

    token-mean:              S = sum_it L m,            D = sum_it m         (response tokens)
    seq-mean-token-mean:     S = sum_i (sum_t L m / sum_t m),  D = #rows with sum_t m > 0
    seq-mean-token-sum:      S = sum_i sum_t L m,       D = #rows with sum_t m > 0
    seq-mean-token-sum-norm: S = sum_it L m / C,        D = None (constant C: Dr.GRPO)
    token-sum:               S = sum_it L m,            D = None

The actor sums ``S`` and ``D`` over all micro-batches and DP ranks and divides once, so the loss
and its gradient equal ``aggregate`` applied to the whole batch at once, whatever the
micro-batching, data parallelism or pipeline split.
"""
from __future__ import annotations

from typing import NamedTuple

import torch

from megatron_rl.algorithms.losses import AGG_MODES


class PartialLoss(NamedTuple):
    """``loss_sum`` (differentiable scalar) and ``normaliser`` (scalar tensor, or None = no division)."""

    loss_sum: torch.Tensor
    normaliser: torch.Tensor | None


def partial_aggregate(loss_mat: torch.Tensor, mask: torch.Tensor, mode: str = "token-mean", *,
                      scale_factor: float | None = None) -> PartialLoss:
    """Numerator / denominator of ``aggregate(loss_mat, mask, mode)`` for one micro-batch.

    Shapes: ``loss_mat`` and ``mask`` ``[n, T]``. See the module docstring for the formulas.
    """
    if mode not in AGG_MODES:
        raise ValueError(f"unknown loss aggregation mode {mode!r}; valid: {sorted(AGG_MODES)}")
    m = mask.to(loss_mat.dtype)
    lm = torch.where(m > 0, loss_mat, torch.zeros_like(loss_mat)) * m
    if mode == "token-mean":
        return PartialLoss(lm.sum(), m.sum().detach())
    if mode == "token-sum":
        return PartialLoss(lm.sum(), None)
    if mode == "seq-mean-token-sum-norm":
        c = float(scale_factor) if scale_factor is not None else float(loss_mat.shape[-1])
        return PartialLoss(lm.sum() / c, None)
    per_row = m.sum(-1)
    valid = per_row > 0
    seq = lm.sum(-1)
    if mode == "seq-mean-token-mean":
        seq = seq / per_row.clamp_min(1e-30)
    return PartialLoss(torch.where(valid, seq, torch.zeros_like(seq)).sum(), valid.sum().to(loss_mat.dtype))
