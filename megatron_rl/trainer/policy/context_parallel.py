"""Context parallelism (``parallel.cp``): which tokens of a packed THD batch each CP rank holds, and
how per-token results computed on a rank's slice come back to the full frame.

Layout (Megatron-core / Transformer Engine's load-balanced THD split): every sequence of the packed
batch is padded to a multiple of ``2·cp`` tokens and cut into ``2·cp`` equal chunks; CP rank ``r``
keeps chunks ``r`` and ``2·cp − 1 − r`` of every sequence, in sequence order. Under causal attention
chunk ``i`` attends to ``i + 1`` chunks, so every rank does the same work. This is the order Transformer
Engine's ``thd_get_partitioned_indices(cu_seqlens_padded, total, cp, rank)`` returns (the index
Megatron-core's ``utils.get_thd_batch_on_this_cp_rank`` slices with); that function is TE's CUDA
extension, so it is written here in torch and runs (and is tested) on CPU.

The loss (``loss_fn``) needs whole sequences (sequence-, group- and token-level normalisers, teacher
terms), so the per-token log-probs / entropy / support computed on a rank's slice are all-gathered over
the CP group and put back into each sequence's frame (:class:`GatherCP`) before it: every CP rank then
runs the unchanged loss on the same full tensors. The gather's backward hands each rank the gradient
of its own tokens only (not a sum over ranks: every rank computed the same loss, so that gradient
is already the whole one). Megatron's distributed optimizer sums gradients over the data-parallel
group WITH context parallelism (``get_data_parallel_group(with_context_parallel=True)``), which adds
the ranks' disjoint token contributions; the normaliser is counted once per CP group (the actor's
``_finalize_grads``). The alternative — the loss on the slice with its normaliser all-reduced over
CP — would need every loss to be token-separable, which GRPO's per-sequence means are not.
"""
from __future__ import annotations

import torch
import torch.distributed as dist


def padded_cu_seqlens(cu_seqlens: torch.Tensor, cp: int, tp: int = 1) -> torch.Tensor:
    """``cu_seqlens`` with every sequence's length rounded up to a multiple of ``2·cp·tp`` (``tp`` > 1 with
    sequence parallelism, which splits each rank's tokens over TP: Megatron-LM pads packed sequences the same)."""
    lens = (cu_seqlens[1:] - cu_seqlens[:-1]).long()
    if (lens < 0).any():
        raise ValueError("cu_seqlens must be non-decreasing")
    q = 2 * cp * tp
    padded = (lens + q - 1) // q * q
    return torch.cat([cu_seqlens.new_zeros(1), padded.cumsum(0).to(cu_seqlens.dtype)])


def padded_positions(cu_seqlens: torch.Tensor, cu_padded: torch.Tensor) -> torch.Tensor:
    """For each token of the unpadded frame, its position in the padded frame (``[cu[-1]]`` int64):
    sequence ``i``'s token ``j`` sits at ``cu_padded[i] + j``."""
    lens = (cu_seqlens[1:] - cu_seqlens[:-1]).long()
    seq = torch.repeat_interleave(torch.arange(lens.numel(), device=lens.device), lens)
    within = torch.arange(int(cu_seqlens[-1]), device=lens.device) - cu_seqlens[:-1].long()[seq]
    return cu_padded[:-1].long()[seq] + within


def partition_indices(cu_seqlens: torch.Tensor, cp: int, rank: int) -> torch.Tensor:
    """Token indices (int64, in the frame ``cu_seqlens`` describes) that CP rank ``rank`` holds:
    for each sequence in order, its chunk ``rank`` then its chunk ``2·cp − 1 − rank`` (chunk =
    length / (2·cp)). Every length must be a multiple of ``2·cp`` (:func:`padded_cu_seqlens`)."""
    if cp < 1 or not 0 <= rank < cp:
        raise ValueError(f"partition_indices: rank {rank} outside a context-parallel group of {cp}")
    starts = cu_seqlens[:-1].long()
    lens = (cu_seqlens[1:] - cu_seqlens[:-1]).long()
    if (lens % (2 * cp)).any():
        raise ValueError(f"partition_indices: sequence lengths {lens.tolist()} are not multiples of 2*cp={2 * cp}")
    chunk = lens // (2 * cp)
    pieces = []
    for s, c in zip(starts.tolist(), chunk.tolist()):
        pieces += [torch.arange(s + rank * c, s + (rank + 1) * c),
                   torch.arange(s + (2 * cp - 1 - rank) * c, s + (2 * cp - rank) * c)]
    out = torch.cat(pieces) if pieces else torch.zeros(0, dtype=torch.long)
    return out.to(cu_seqlens.device)


def unpartition(parts: list[torch.Tensor] | tuple[torch.Tensor, ...], cu_seqlens: torch.Tensor, dim: int = 0) -> torch.Tensor:
    """Inverse of :func:`partition_indices`: the CP ranks' slices (``parts[r]`` = the full tensor
    indexed along ``dim`` by ``partition_indices(cu_seqlens, len(parts), r)``) back to the full frame.
    Differentiable (a concatenation and a permutation)."""
    cp, held = len(parts), sum(p.shape[dim] for p in parts)
    if held != int(cu_seqlens[-1]):
        raise ValueError(f"unpartition: the slices hold {held} tokens, cu_seqlens {int(cu_seqlens[-1])}")
    perm = torch.cat([partition_indices(cu_seqlens, cp, r) for r in range(cp)])
    inverse = torch.empty_like(perm)
    inverse[perm] = torch.arange(perm.numel(), device=perm.device)
    return torch.cat(list(parts), dim=dim).index_select(dim, inverse.to(parts[0].device))


class GatherCP(torch.autograd.Function):
    """All-gather a per-token tensor over the CP group and un-permute it into the full (padded) frame.

    Forward: ``[n_local, ...]`` slice -> ``[T, ...]`` full frame (``T = cu_padded[-1]``), the same on
    every CP rank. Backward: the rank's own rows of the incoming gradient (every CP rank computes the
    same loss from the same gathered tensor, so no reduction: see the module docstring)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, cu_padded: torch.Tensor, group, rank: int, cp: int) -> torch.Tensor:
        parts = [torch.empty_like(x) for _ in range(cp)]
        dist.all_gather(parts, x.contiguous(), group=group)
        ctx.save_for_backward(partition_indices(cu_padded, cp, rank).to(x.device))
        return unpartition(parts, cu_padded)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        (idx,) = ctx.saved_tensors
        return grad.index_select(0, idx), None, None, None, None


def gather_cp(x: torch.Tensor, cu_padded: torch.Tensor, group, rank: int, cp: int) -> torch.Tensor:
    """:class:`GatherCP` (dim 0 = tokens)."""
    return GatherCP.apply(x, cu_padded, group, rank, cp)
