"""DAPO reward shaping and dynamic sampling (Yu et al. 2025, arXiv 2503.14476; verl recipe/dapo).

* :func:`dapo_overlong_penalty` — soft overlong punishment added to the reward:
  with L_exp = L_max − L_buf,  p(L) = min(−(L − L_exp)/L_buf · factor, 0).
  p = 0 up to L_exp, falls linearly to −factor at L_max.
* :func:`dynamic_sampling_keep` — the ``filter_groups`` rule: keep a group iff the population
  std of its metric is > 0 or it has a single response (uniform groups carry no GRPO signal).
* :class:`DynamicSampler` — accumulates kept groups over generation batches until
  ``train_prompts`` prompts are collected; more than ``max_num_gen_batches`` batches raises
  (≤ 0 means unlimited), as verl does.

Departure from the BiCC release: its trainer silently keeps every prompt when the metric is
``acc`` (a no-op filter); here the filter always applies when enabled.
"""
from __future__ import annotations

from dataclasses import dataclass, field
import torch
from torch import Tensor

from .grouping import check_1d, check_finite, group_index, guniform


def dapo_overlong_penalty(lengths: Tensor, max_response_len: int, buffer_len: int,
                          penalty_factor: float = 1.0) -> Tensor:
    """Overlong penalty per sample. Shapes: lengths [N] (valid response tokens) → [N] float."""
    if not 0 < buffer_len <= max_response_len:
        raise ValueError(f"overlong buffer_len must be in (0, max_response_len={max_response_len}], "
                         f"got {buffer_len}")
    check_1d("lengths", lengths)
    expected = max_response_len - buffer_len
    x = lengths.to(torch.float64)
    return torch.clamp(-(x - expected) / buffer_len * penalty_factor, max=0.0)


def dynamic_sampling_keep(metric: Tensor, group_ids: Tensor) -> Tensor:
    """[N] bool: sample belongs to a group with a non-uniform metric, or to a singleton group."""
    check_1d("metric", metric)
    m = metric.to(torch.float64)
    check_finite("dynamic-sampling metric", m, group_ids)
    grp = group_index(group_ids, m.shape[0])
    if m.numel() == 0:
        return torch.zeros(0, dtype=torch.bool)
    keep_g = ~guniform(m, grp) | (grp.counts == 1)
    return keep_g[grp.inv]


@dataclass
class DynamicSampler:
    """Accumulate groups with signal across generation batches (DAPO dynamic sampling).

    ``add(metric, group_ids)`` returns the indices (into that batch) of kept samples and updates
    the count of kept prompts. ``ready`` turns True once ``train_prompts`` prompts are kept;
    ``take(n_per_prompt)`` is then the number of trajectories to keep (train_prompts · n).
    """

    train_prompts: int
    max_num_gen_batches: int = 0
    kept_prompts: int = 0
    batches: int = 0
    filtered_prompts: int = field(default=0)

    def add(self, metric: Tensor, group_ids: Tensor) -> Tensor:
        """Filter one generation batch; returns kept sample indices [K] (long)."""
        self.batches += 1
        if self.max_num_gen_batches > 0 and self.batches > self.max_num_gen_batches:
            raise RuntimeError(f"dynamic sampling: {self.batches} generation batches exceed "
                               f"max_num_gen_batches={self.max_num_gen_batches} with only "
                               f"{self.kept_prompts}/{self.train_prompts} prompts kept; "
                               "the data may be too easy or too hard")
        keep = dynamic_sampling_keep(metric, group_ids)
        n_groups = int(torch.unique(group_ids).numel()) if group_ids.numel() else 0
        n_kept = int(torch.unique(group_ids[keep]).numel()) if bool(keep.any()) else 0
        self.kept_prompts += n_kept
        self.filtered_prompts += n_groups - n_kept
        return torch.nonzero(keep).flatten()

    @property
    def ready(self) -> bool:
        """True once at least ``train_prompts`` prompts with signal were collected."""
        return self.kept_prompts >= self.train_prompts

    def take(self, n_per_prompt: int) -> int:
        """Number of trajectories to keep after accumulation: train_prompts · n."""
        return self.train_prompts * n_per_prompt
