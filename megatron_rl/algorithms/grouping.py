"""Vectorised per-group statistics over a flat batch (torch only).

Every advantage estimator works on 1-D per-sample tensors plus an integer ``group_ids`` tensor
naming each sample's prompt group. Groups are arbitrary integers (not necessarily contiguous
or sorted); :func:`group_index` maps them to dense indices ``0..G-1`` once, and the helpers
below reduce with ``index_add_`` / ``scatter_reduce`` so that one call handles every group
at once (no Python loop over groups).

Shapes: ``x`` [N] float, ``group_ids`` [N] int, returned per-group stats [G], gathered back
per sample with ``stat[inv]``.
"""
from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor


class Groups(NamedTuple):
    """Dense group index of a batch.

    inv: [N] long, dense group index of each sample; counts: [G] float sample counts;
    num_groups: G.
    """

    inv: Tensor
    counts: Tensor
    num_groups: int


def check_finite(name: str, x: Tensor, group_ids: Tensor | None = None) -> None:
    """Raise ``ValueError`` naming the first non-finite sample of ``x`` (NaN or ±inf)."""
    bad = ~torch.isfinite(x)
    if bool(bad.any()):
        flat = bad.reshape(bad.shape[0], -1).any(dim=1) if x.dim() > 1 else bad
        i = int(torch.nonzero(flat)[0, 0])
        grp = f" (group {int(group_ids[i])})" if group_ids is not None else ""
        raise ValueError(f"{name}: non-finite value at sample {i}{grp}: {x[i].tolist()!r}; "
                         f"{int(flat.sum())} bad sample(s) in total")


def check_1d(name: str, x: Tensor, n: int | None = None) -> None:
    """Raise ``ValueError`` unless ``x`` is a 1-D tensor (of length ``n`` when given)."""
    if not isinstance(x, Tensor) or x.dim() != 1:
        raise ValueError(f"{name} must be a 1-D tensor [N], got {getattr(x, 'shape', type(x))}")
    if n is not None and x.shape[0] != n:
        raise ValueError(f"{name} has {x.shape[0]} samples, expected {n}")


def group_index(group_ids: Tensor, n: int | None = None) -> Groups:
    """Dense group index: ``inv[i]`` in ``0..G-1`` and per-group counts.

    Raises if ``group_ids`` is not a 1-D integer tensor of length ``n``.
    """
    check_1d("group_ids", group_ids, n)
    if group_ids.dtype.is_floating_point or group_ids.dtype == torch.bool:
        raise ValueError(f"group_ids must be an integer tensor, got {group_ids.dtype}")
    _, inv = torch.unique(group_ids, return_inverse=True)
    g = int(inv.max()) + 1 if inv.numel() else 0
    counts = torch.bincount(inv, minlength=g)
    return Groups(inv, counts, g)


def gsum(x: Tensor, grp: Groups) -> Tensor:
    """Per-group sum: [N] -> [G]."""
    return torch.zeros(grp.num_groups, dtype=x.dtype, device=x.device).index_add_(0, grp.inv, x)


def gmean(x: Tensor, grp: Groups) -> Tensor:
    """Per-group mean: [N] -> [G]."""
    return gsum(x, grp) / grp.counts.to(x.dtype)


def gvar(x: Tensor, grp: Groups, *, unbiased: bool) -> Tensor:
    """Per-group variance, unbiased (n-1, as ``torch.std``) or population (n); [N] -> [G].

    Centred two-pass form (sum of squared deviations from the group mean), so no
    catastrophic cancellation. Singleton groups give 0 in the population form and NaN-free 0
    in the unbiased form (their ``n-1`` is clamped to 1; callers special-case singletons).
    """
    mu = gmean(x, grp)
    dev2 = gsum((x - mu[grp.inv]) ** 2, grp)
    n = grp.counts.to(x.dtype)
    return dev2 / ((n - 1).clamp_min(1) if unbiased else n)


def guniform(x: Tensor, grp: Groups) -> Tensor:
    """[G] bool: every value in the group is identical (max == min, exact)."""
    hi = torch.full((grp.num_groups,), -torch.inf, dtype=x.dtype, device=x.device)
    lo = torch.full((grp.num_groups,), torch.inf, dtype=x.dtype, device=x.device)
    hi = hi.scatter_reduce(0, grp.inv, x, "amax")
    lo = lo.scatter_reduce(0, grp.inv, x, "amin")
    return hi == lo
