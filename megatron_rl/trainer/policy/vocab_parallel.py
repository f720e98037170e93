"""Per-token log-probs and entropy with the vocabulary split over tensor-parallel ranks.

Notation (one token position; ``z`` the full logits row over the true vocabulary V, split into
contiguous shards of width ``W = V_pad / tp``; rank r holds columns ``[r W, (r+1) W)``; columns
``>= V`` are padding and are treated as ``-inf``):

    m        = max_j z_j                                  (all-reduce MAX of local maxima)
    s        = sum_j exp(z_j - m)                         (all-reduce SUM of local sums)
    lse      = m + log s
    logp_t   = z_t - lse                                  (z_t: all-reduce SUM, only the owner is non-zero)
    p_j      = exp(z_j - lse)
    H        = lse - sum_j p_j z_j                        (all-reduce SUM of local sum p_j z_j)

Gradients (local to each shard; no communication in backward):

    d logp_t / d z_j = 1[j = t] - p_j
    d H      / d z_j = -p_j (z_j - sum_k p_k z_k) = -p_j (z_j - lse + H)

Only shard-sized tensors are materialised; the full ``[..., V]`` logits never exist on any rank.
This is the scheme of Megatron's vocab-parallel cross-entropy, extended with the entropy term.

Under the engines' sampling distribution μ (``algorithms/sampling.py``: min-p, top-k, top-p after the
temperature, as vLLM applies them) the same scheme runs on weights w_j ∈ [0, 1] of the kept set,
found by reductions over the TP group (:func:`vocab_parallel_sampled_logprobs`):

    log μ(y_t) = z_t − log Σ_j w_j exp(z_j)          d/dz_j = 1[j = t] − μ_j,   μ_j = w_j exp(z_j) / Σ_k w_k exp(z_k)

(the kept set is chosen under stop-gradient, as the engine chose it).
"""
from __future__ import annotations

from typing import NamedTuple

import torch
import torch.distributed as dist

from megatron_rl.algorithms.sampling import (
    CHUNK_BYTES,
    WHOLE_ROW,
    Collectives,
    SamplingSpec,
    row_blocks,
    sampling_support,
)


class LogProbs(NamedTuple):
    """``logp``: ``[...]`` log-prob of each target; ``entropy``: ``[...]`` entropy of each row."""

    logp: torch.Tensor
    entropy: torch.Tensor


def _world(group) -> tuple[int, int]:
    if group is None or not dist.is_available() or not dist.is_initialized():
        return 0, 1
    return dist.get_rank(group), dist.get_world_size(group)


def _all_reduce(t: torch.Tensor, op, group) -> torch.Tensor:
    if _world(group)[1] > 1:
        dist.all_reduce(t, op=op, group=group)
    return t


def _valid_width(lo: int, width: int, vocab_size: int | None) -> int:
    """Number of leading columns of a shard starting at ``lo`` that are real (not padding)."""
    if vocab_size is None:
        return width
    return max(0, min(width, vocab_size - lo))


def _target_index(targets: torch.Tensor, lo: int, width: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(owned mask ``[...]``, clamped local index ``[..., 1]``) of each target in this shard."""
    local_t = targets - lo
    own = (local_t >= 0) & (local_t < width)
    return own, local_t.clamp(0, width - 1).unsqueeze(-1)


def _upcast(x: torch.Tensor) -> torch.Tensor:
    """fp32 for half types; fp32/fp64 inputs are used as they are (no copy)."""
    return x if x.dtype in (torch.float32, torch.float64) else x.float()


def _shard(logits: torch.Tensor, group, vocab_size: int | None) -> tuple[torch.Tensor, int, int]:
    """(fp32 view of this rank's logits shard, its first global column, its number of real columns)."""
    rank, _ = _world(group)
    width = logits.shape[-1]
    lo = rank * width
    return _upcast(logits), lo, _valid_width(lo, width, vocab_size)


def _max_exp_sum(z: torch.Tensor, nv: int, group) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Global row max ``m``, local ``e = exp(z - m)`` (0 on padding columns) and global ``s = sum e``."""
    if nv > 0:
        m = z[..., :nv].max(dim=-1).values
    else:
        m = torch.full(z.shape[:-1], float("-inf"), dtype=z.dtype, device=z.device)
    _all_reduce(m, dist.ReduceOp.MAX, group)
    e = torch.exp(z - m.unsqueeze(-1))
    if nv < z.shape[-1]:
        e[..., nv:] = 0.0
    return m, e, _all_reduce(e.sum(dim=-1), dist.ReduceOp.SUM, group)


def _probs(logits: torch.Tensor, lse: torch.Tensor, nv: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(fp32 logits shard z, p = exp(z - lse) with 0 on padding columns), for the backward passes."""
    z = _upcast(logits)
    p = torch.exp(z - lse.unsqueeze(-1))
    if nv < z.shape[-1]:
        p[..., nv:] = 0.0
    return z, p


class _VocabParallelLogProbs(torch.autograd.Function):
    """Autograd function; see the module docstring for the forward and backward formulas.

    Padded columns are excluded from the max and have ``exp`` set to 0; their raw (finite) logits
    then drop out of every sum because they are multiplied by ``p_j = 0``. Peak extra memory is
    two fp32 shards (plus one fp32 copy when the input is not fp32).
    """

    @staticmethod
    def forward(ctx, logits, targets, group, vocab_size):
        z, lo, nv = _shard(logits, group, vocab_size)
        width = logits.shape[-1]
        m, e, s = _max_exp_sum(z, nv, group)
        lse = m + torch.log(s)
        own, idx = _target_index(targets, lo, width)
        z_t = torch.where(own, z.gather(-1, idx).squeeze(-1), torch.zeros_like(m))
        _all_reduce(z_t, dist.ReduceOp.SUM, group)
        pz = _all_reduce(e.mul_(z).sum(dim=-1), dist.ReduceOp.SUM, group) / s   # sum_j p_j z_j
        del e
        ctx.save_for_backward(logits, targets, lse, pz)
        ctx.meta = (lo, nv)
        return z_t - lse, lse - pz

    @staticmethod
    def backward(ctx, g_logp, g_ent):
        logits, targets, lse, pz = ctx.saved_tensors
        lo, nv = ctx.meta
        width = logits.shape[-1]
        z, p = _probs(logits, lse, nv)
        g_logp = torch.zeros_like(lse) if g_logp is None else g_logp
        g_ent = torch.zeros_like(lse) if g_ent is None else g_ent
        # grad_j = g_logp * (1[j=t] - p_j) - g_ent * p_j * (z_j - pz)
        grad = (z - pz.unsqueeze(-1)).mul_(g_ent.unsqueeze(-1)).add_(g_logp.unsqueeze(-1)).mul_(p).neg_()
        del p, z
        own, idx = _target_index(targets, lo, width)
        grad.scatter_add_(-1, idx, (g_logp * own).unsqueeze(-1))
        return grad.to(logits.dtype), None, None, None


def vocab_parallel_logprobs(logits_shard: torch.Tensor, targets: torch.Tensor, tp_group=None,
                            vocab_size: int | None = None) -> LogProbs:
    """Log-prob of ``targets`` and entropy under ``softmax(logits)``, vocab split over ``tp_group``.

    Args:
        logits_shard: ``[..., W]`` this rank's contiguous vocab shard (rank r: columns ``[rW, (r+1)W)``).
            Any float dtype; computed in fp32 (fp64 kept as is). Temperature must already be applied (``z / T``).
        targets: ``[...]`` int64 global vocab ids (must be ``< vocab_size``).
        tp_group: tensor-parallel process group; ``None`` (or an uninitialised world) means no split.
        vocab_size: the true vocabulary size; columns at global index ``>= vocab_size`` (padding
            added for TP divisibility) are excluded from the softmax. ``None``: no padding.

    Returns:
        :class:`LogProbs` ``(logp [...], entropy [...])`` in fp32, both differentiable w.r.t. logits.
    """
    if logits_shard.shape[:-1] != targets.shape:
        raise ValueError(f"vocab_parallel_logprobs: logits {tuple(logits_shard.shape)} do not match "
                         f"targets {tuple(targets.shape)} on the leading dims")
    rank, world = _world(tp_group)
    if vocab_size is not None and vocab_size > logits_shard.shape[-1] * world:
        raise ValueError(f"vocab_parallel_logprobs: vocab_size={vocab_size} exceeds the padded vocab "
                         f"{logits_shard.shape[-1]} x {world} ranks")
    logp, ent = _VocabParallelLogProbs.apply(logits_shard, targets.long(), tp_group, vocab_size)
    return LogProbs(logp, ent)


def full_vocab_logprobs(logits: torch.Tensor, targets: torch.Tensor, vocab_size: int | None = None) -> LogProbs:
    """Reference on full logits ``[..., V]``: ``log_softmax`` + gather, ``H = -sum p log p``."""
    z = _upcast(logits)
    if vocab_size is not None:
        z = z[..., :vocab_size]
    lp = torch.log_softmax(z, dim=-1)
    logp = lp.gather(-1, targets.long().unsqueeze(-1)).squeeze(-1)
    ent = -(lp.exp() * lp).sum(-1)
    return LogProbs(logp, ent)


# ------------------------------------------------------------------ top-k + tail supports (distillation)

def _lse(z: torch.Tensor, nv: int, group) -> torch.Tensor:
    """Global log-sum-exp of each row over the real vocabulary (padding columns excluded)."""
    m, _, s = _max_exp_sum(z, nv, group)
    return m + torch.log(s)


class _VocabParallelGather(torch.autograd.Function):
    """logp[..., u] = z[..., idx_u] - lse for global indices ``idx`` ``[..., k]`` (vocab split over TP).

    Backward: d logp_u / d z_j = 1[j = idx_u] - p_j, so grad_j = scatter(g)_j - p_j * sum_u g_u
    (local to each shard, no communication).
    """

    @staticmethod
    def forward(ctx, logits, idx, group, vocab_size):
        z, lo, nv = _shard(logits, group, vocab_size)
        width = logits.shape[-1]
        lse = _lse(z, nv, group)
        own, local = _target_index(idx, lo, width)
        local = local.squeeze(-1)
        z_u = torch.where(own, z.gather(-1, local), torch.zeros_like(idx, dtype=z.dtype))
        _all_reduce(z_u, dist.ReduceOp.SUM, group)
        ctx.save_for_backward(logits, idx, lse)
        ctx.meta = (lo, nv)
        return z_u - lse.unsqueeze(-1)

    @staticmethod
    def backward(ctx, g):
        logits, idx, lse = ctx.saved_tensors
        lo, nv = ctx.meta
        width = logits.shape[-1]
        _, p = _probs(logits, lse, nv)
        grad = p.mul_(-g.sum(-1, keepdim=True))
        own, local = _target_index(idx, lo, width)
        grad.scatter_add_(-1, local.squeeze(-1), g * own)
        return grad.to(logits.dtype), None, None, None


def vocab_parallel_gather_logprobs(logits_shard: torch.Tensor, idx: torch.Tensor, tp_group=None,
                                   vocab_size: int | None = None) -> torch.Tensor:
    """Full-vocabulary-normalised log-probs at global ids ``idx`` ``[..., k]`` (differentiable).

    ``logits_shard`` ``[..., W]`` as in :func:`vocab_parallel_logprobs`; returns ``[..., k]`` fp32.
    """
    if logits_shard.shape[:-1] != idx.shape[:-1]:
        raise ValueError(f"vocab_parallel_gather_logprobs: logits {tuple(logits_shard.shape)} do not match "
                         f"indices {tuple(idx.shape)} on the leading dims")
    return _VocabParallelGather.apply(logits_shard, idx.long(), tp_group, vocab_size)


class TopK(NamedTuple):
    """``idx`` ``[..., k]`` global ids (descending logit, ties -> lowest id); ``logp`` ``[..., k]`` their
    full-vocab log-probs; ``entropy`` ``[...]`` full-vocab entropy."""

    idx: torch.Tensor
    logp: torch.Tensor
    entropy: torch.Tensor


@torch.no_grad()
def vocab_parallel_topk(logits_shard: torch.Tensor, k: int, tp_group=None, vocab_size: int | None = None) -> TopK:
    """Top-k of the full (TP-split) vocabulary without materialising it: each rank takes its local
    top-k (stable, lowest id first on ties), the ``tp * k`` candidates are all-gathered, and the
    global top-k is their top-k with the same tie rule. No gradient (supports are chosen under
    ``sg``). Entropy via the same reductions as :func:`vocab_parallel_logprobs`."""
    rank, world = _world(tp_group)
    width = logits_shard.shape[-1]
    lo = rank * width
    nv = _valid_width(lo, width, vocab_size)
    total = vocab_size if vocab_size is not None else width * world
    if not 1 <= k < total:
        raise ValueError(f"top-k support needs 1 <= k < V={total}, got k={k}")
    z = _upcast(logits_shard)
    lse = _lse(z, nv, tp_group)
    p = torch.exp(z - lse.unsqueeze(-1))
    if nv < width:
        p[..., nv:] = 0.0
    pz = _all_reduce((p * z).sum(-1), dist.ReduceOp.SUM, tp_group)
    kk = min(k, nv)
    if kk > 0:
        order = torch.sort(z[..., :nv], dim=-1, descending=True, stable=True).indices[..., :kk]
        vals, gidx = z.gather(-1, order), order + lo
    else:
        vals = z.new_empty((*z.shape[:-1], 0))
        gidx = torch.empty((*z.shape[:-1], 0), dtype=torch.long, device=z.device)
    if kk < k:   # pad so every rank contributes k candidates (padding never wins)
        pad = k - kk
        vals = torch.cat([vals, vals.new_full((*vals.shape[:-1], pad), float("-inf"))], -1)
        gidx = torch.cat([gidx, gidx.new_full((*gidx.shape[:-1], pad), total)], -1)
    if world > 1:
        vs, ids = [torch.empty_like(vals) for _ in range(world)], [torch.empty_like(gidx) for _ in range(world)]
        dist.all_gather(vs, vals.contiguous(), group=tp_group)
        dist.all_gather(ids, gidx.contiguous(), group=tp_group)
        vals, gidx = torch.cat(vs, -1), torch.cat(ids, -1)
        # candidates are grouped by rank = ascending id blocks; a stable sort keeps lowest id first on ties
        sel = torch.sort(vals, dim=-1, descending=True, stable=True).indices[..., :k]
        vals, gidx = vals.gather(-1, sel), gidx.gather(-1, sel)
    return TopK(gidx, vals - lse.unsqueeze(-1), lse - pz)


def with_tail(top_logp: torch.Tensor) -> torch.Tensor:
    """Append the tail bucket log(1 - exp(min(LSE(top), -1e-7))) to ``[..., k]`` log-probs -> ``[..., k+1]``."""
    lse = torch.clamp(torch.logsumexp(top_logp, dim=-1, keepdim=True), max=-1e-7)
    return torch.cat([top_logp, torch.log(-torch.expm1(lse))], dim=-1)


# ------------------------------------------------------------------ the sampling distribution μ (truncated)

def tp_collectives(group) -> Collectives:
    """The reductions of ``algorithms.sampling`` over the TP group (the whole row when unsplit)."""
    if _world(group)[1] == 1:
        return WHOLE_ROW

    def cat(t: torch.Tensor) -> torch.Tensor:
        parts = [torch.empty_like(t) for _ in range(_world(group)[1])]
        dist.all_gather(parts, t.contiguous(), group=group)
        return torch.cat(parts, -1)

    return Collectives(lambda t: _all_reduce(t, dist.ReduceOp.MAX, group),
                       lambda t: _all_reduce(t, dist.ReduceOp.SUM, group), cat)


class SampledLogProbs(NamedTuple):
    """``logp`` ``[...]`` log μ of each target (differentiable); ``kept`` ``[...]`` bool: the target is
    in μ's kept set (False only where trainer and engine disagree on the set)."""

    logp: torch.Tensor
    kept: torch.Tensor


class _VocabParallelSampledLogProbs(torch.autograd.Function):
    """log μ(y) with the vocab split over TP; the module docstring's formulas. The kept set is one
    boundary value and one tie weight per row (``algorithms/sampling.py`` :class:`Support`): nothing
    shard-sized is saved beyond the logits, and the backward runs in row chunks into the gradient."""

    @staticmethod
    def forward(ctx, logits, targets, group, vocab_size, spec):
        z, lo, nv = _shard(logits, group, vocab_size)
        width = logits.shape[-1]
        sup = sampling_support(z[..., :nv], spec, tp_collectives(group))   # the real columns: a view
        own, idx = _target_index(targets, lo, width)
        z_t = _all_reduce(torch.where(own, z.gather(-1, idx).squeeze(-1), torch.zeros_like(sup.log_z)),
                          dist.ReduceOp.SUM, group)
        ctx.save_for_backward(logits, targets, sup.bound, sup.frac, sup.log_z)
        ctx.meta = (lo, nv)
        kept = z_t >= sup.bound
        ctx.mark_non_differentiable(kept)
        return z_t - sup.log_z, kept

    @staticmethod
    def backward(ctx, g, _g_kept):
        logits, targets, bound, frac, log_z = ctx.saved_tensors
        lo, nv = ctx.meta
        width = logits.shape[-1]
        own, idx = _target_index(targets, lo, width)
        grad = torch.empty(logits.shape, dtype=logits.dtype, device=logits.device)
        rows = max(1, CHUNK_BYTES // (4 * width))
        for ix in row_blocks(logits):                  # 2-D views: no copy of a sliced logits tensor
            z_all, b_all, f_all, lz_all, g_all = logits[ix], *(t[ix].unsqueeze(-1) for t in (bound, frac, log_z, g))
            for i in range(0, z_all.shape[0], rows):
                sl = slice(i, i + rows)
                z, b = _upcast(z_all[sl]), b_all[sl]
                gc = torch.exp(z - lz_all[sl]).mul_(-g_all[sl])                          # −g μ_j on the kept
                gc.masked_fill_(z < b, 0.0).mul_(torch.where(z == b, f_all[sl], 1.0))   # set, f on the ties
                if nv < width:
                    gc[:, nv:] = 0.0
                grad[ix][sl] = gc
        grad.scatter_add_(-1, idx, (g * own).unsqueeze(-1).to(grad.dtype))
        return grad, None, None, None, None


def vocab_parallel_sampled_logprobs(logits_shard: torch.Tensor, targets: torch.Tensor, spec: SamplingSpec,
                                    tp_group=None, vocab_size: int | None = None) -> SampledLogProbs:
    """log μ(targets) under the sampling distribution of ``spec`` (its min-p, top-k, top-p; the
    temperature must already be applied, ``z / T``, as in :func:`vocab_parallel_logprobs`), vocab split
    over ``tp_group``; shapes as there. The kept set costs per row: one all-gather of each shard's
    candidates (k + 32 values with top-k, else 512, times 8 for the rows they do not settle; ``algorithms/sampling.py``), two all-reduce MAX of one
    number and, for top-p without top-k, one all-reduce SUM; memory: row chunks of ``CHUNK_BYTES``."""
    if logits_shard.shape[:-1] != targets.shape:
        raise ValueError(f"vocab_parallel_sampled_logprobs: logits {tuple(logits_shard.shape)} do not match "
                         f"targets {tuple(targets.shape)} on the leading dims")
    logp, kept = _VocabParallelSampledLogProbs.apply(logits_shard, targets.long(), tp_group, vocab_size, spec)
    return SampledLogProbs(logp, kept)
