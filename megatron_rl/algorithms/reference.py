"""Plain per-group Python loops: the oracle that the vectorised estimators are tested against
(``tests/unit/algorithms``) and the baseline of ``benchmarks/bench_advantages.py``.

Written independently of :mod:`.advantages`: each group is sliced out with a boolean mask and
its statistics come from ``torch.mean`` / ``torch.std`` directly (verl's loop structure).
"""
from __future__ import annotations

import torch
from torch import Tensor


def _groups(group_ids: Tensor):
    for g in torch.unique(group_ids).tolist():
        yield torch.nonzero(group_ids == g).flatten()


def grpo_loop(rewards: Tensor, group_ids: Tensor, *, scale: str = "std", eps: float = 1e-6) -> Tensor:
    """verl ``compute_grpo_outcome_advantage`` loop (+ exact-0 for uniform groups)."""
    out = torch.zeros_like(rewards)
    for idx in _groups(group_ids):
        r = rewards[idx]
        if len(idx) == 1:
            out[idx] = r / (1 + eps) if scale == "std" else (r if scale == "none" else 0 * r)
            continue
        if bool((r == r[0]).all()):
            continue
        c = r - r.mean()
        out[idx] = c / (r.std() + eps) if scale == "std" else (c if scale == "none" else c / r.std(unbiased=False))
    return out


def rloo_loop(rewards: Tensor, group_ids: Tensor) -> Tensor:
    """A_i = r_i − mean of the others."""
    out = torch.zeros_like(rewards)
    for idx in _groups(group_ids):
        r = rewards[idx]
        n = len(idx)
        if n == 1 or bool((r == r[0]).all()):
            continue
        out[idx] = torch.stack([r[i] - (r.sum() - r[i]) / (n - 1) for i in range(n)])
    return out


def bicc_loop(rewards: Tensor, group_ids: Tensor, threshold: float = 0.5) -> Tensor:
    """±sqrt(n∓/n±) per group; degenerate → 0."""
    out = torch.zeros_like(rewards)
    for idx in _groups(group_ids):
        pos = rewards[idx] > threshold
        npos, nneg = int(pos.sum()), int((~pos).sum())
        if npos == 0 or nneg == 0:
            continue
        out[idx] = torch.where(pos, torch.tensor((nneg / npos) ** 0.5, dtype=rewards.dtype),
                               torch.tensor(-(npos / nneg) ** 0.5, dtype=rewards.dtype))
    return out


def rcc_loop(rewards: Tensor, delta: Tensor, group_ids: Tensor, eps: float = 1e-6) -> Tensor:
    """RCC with the verl-GRPO scale."""
    out = torch.zeros_like(rewards)
    for idx in _groups(group_ids):
        r, d = rewards[idx], delta[idx]
        if len(idx) == 1:
            out[idx] = r / (1 + eps)
            continue
        if bool((r == r[0]).all()):
            continue
        cov = ((r - r.mean()) * (d - d.mean())).mean()
        out[idx] = (r - (r.mean() + 2 * cov)) / (r.std() + eps)
    return out


def papo_loop(outcome: Tensor, process: Tensor, correct: Tensor, group_ids: Tensor, lam: float = 1.0,
              eps: float = 1e-6) -> Tensor:
    """PAPO total advantage, one group at a time."""
    out = torch.zeros_like(outcome)
    for idx in _groups(group_ids):
        ro, rp, c = outcome[idx], process[idx], correct[idx].bool()
        a = torch.zeros_like(ro)
        if len(idx) > 1 and float(ro.std()) > eps:
            a = (ro - ro.mean()) / (ro.std() + eps)
        p = torch.zeros_like(ro)
        if int(c.sum()) >= 2:
            rc = rp[c]
            if float(rc.std()) > eps:
                p[c] = (rc - rc.mean()) / (rc.std() + eps)
        out[idx] = a + lam * p
    return out
