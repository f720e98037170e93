"""Staleness: how many optimizer steps old the weights that sampled a sample or a token are, and the
bound partial rollouts train within — ONE rule for the partial rollouts' pool (``rollout/partial_pool.py``,
which judges a finished response), the update (``trainer/pipeline/sequences.behaviour``, which builds the
batch's per-sample and per-token staleness once a step) and the off-policy weights (``offpolicy.py``).

    s = V − v          V: the trainer's weight version when it trains; v: the version that sampled it
    s_sample = max_t s_t   (the sample's OLDEST token: a response spanning a push counts as stale)

Bound k (:class:`StalenessPolicy`, ``rollout.partial.max_staleness`` / ``policy``): ``drop`` rejects a
response with max_t s_t > k (and its group); ``mask`` keeps the tokens with s_t <= k in the loss (versions
never decrease along a response, so what leaves is its old-version prefix).
"""
from __future__ import annotations

import dataclasses

import torch
from torch import Tensor


def staleness(trainer_version: int, versions: Tensor) -> Tensor:
    """THE staleness rule, per sample and per token: s = V − v (long, the shape of ``versions``) for the
    weight versions ``v`` that sampled a sample or a token, trained while the trainer holds version ``V``
    (the partial rollouts' pool judges responses by it, the update weighs and masks by it:
    ``trainer/pipeline/sequences.behaviour``). A sample's staleness is its OLDEST token's. A version
    ahead of the trainer (s < 0) is a bookkeeping error and raises."""
    s = int(trainer_version) - versions.long()
    if s.numel() and int(s.min()) < 0:
        raise ValueError(f"weight version {int(versions.max())} is ahead of the trainer's ({trainer_version})")
    return s


STALENESS_MODES = ("drop", "mask")


@dataclasses.dataclass(frozen=True)
class StalenessPolicy:
    """``bound``: the largest per-token staleness trained on (>= 0); ``mode``: drop | mask (module docstring)."""

    bound: int
    mode: str = "drop"

    def __post_init__(self):
        if self.bound < 0:
            raise ValueError(f"staleness bound must be >= 0, got {self.bound}")
        if self.mode not in STALENESS_MODES:
            raise ValueError(f"staleness mode must be one of {'|'.join(STALENESS_MODES)}, got {self.mode!r}")


def within_bound(stale: torch.Tensor, policy: StalenessPolicy) -> torch.Tensor:
    """s_t <= k elementwise (bool, any shape) of the staleness ``stale`` (:func:`staleness`): the tokens
    ``mask`` keeps in the loss — the rule the pool judges a response by (:func:`staleness_mask`) and the
    update applies to the batch's loss mask (``trainer/pipeline/rows.staleness_keep``)."""
    return stale <= policy.bound


def staleness_mask(versions: torch.Tensor, trainer_version: int, policy: StalenessPolicy) -> torch.Tensor | None:
    """The response's loss mask under ``policy`` ([T] bool), or None when ``drop`` rejects it.

    drop: all-True if max_t s_t <= k else None; mask: s_t <= k (its old-version prefix False), None
    when no token stays."""
    keep = within_bound(staleness(trainer_version, versions), policy)
    if policy.mode == "drop":
        return keep if bool(keep.all()) else None
    return keep if bool(keep.any()) else None
