"""Off-policy correction for asynchronous (stale) rollouts: decoupled PPO with a truncated IS weight.

With ``rollout.max_staleness = k > 0`` the batch of step t was sampled by the engines with weights
``v_b`` (the *behaviour* policy π_behav, ``b = max(0, t − 1 − k)``) while the trainer updates
``v_{t−1}``. Following the decoupled PPO objective of AReaL (Fu et al. 2025, "AReaL: a
large-scale asynchronous RL system", Eq. 5), the trainer's recomputed log-probs of the batch under
its current weights are the *proximal* policy π_prox (the ``old_logp`` every registered loss
already clips against), and each token's loss is multiplied by the importance weight of the
proximal against the behaviour policy, truncated at ``cap`` (TIS, Yao et al. 2025):

    J(θ) = E_{y ~ π_behav} [ Σ_t  w_t · min(ρ_t A_t, clip(ρ_t, 1 − ε, 1 + ε) A_t) ]
    ρ_t = π_θ(y_t | ·) / π_prox(y_t | ·)                       (the loss's own ratio, unchanged)
    w_t = min(exp(clip(log π_prox − log π_behav, −20, 20)), cap) · m_t      (no gradient)

This is the same weight as the RLCSD recipes' rollout correction (spec ``rlcsd_family_and_score``
§1.3.3, ``rollout_is: token``, threshold 2.0), computed by the one implementation
:func:`megatron_rl.algorithms.losses.tis_weights`; the modes below only decide WHICH samples get it.

Modes (``algo.off_policy``):

* ``decoupled`` (default): samples with staleness s_i > 0 get w; samples with s_i = 0 get w = 1
  exactly — their behaviour policy IS the proximal one (same weights; the remaining engine vs
  trainer difference is numerics, watched by ``rollout/logprob_gap`` and the start-up gate). A
  batch without stale samples returns no weights at all, so the synchronous path is unchanged
  bit for bit.
* ``tis``: every sample gets w, staleness 0 included (the RLCSD recipes' engine-mismatch TIS).
* ``none``: no weight (ablation: plain PPO against the proximal policy on stale data).

Staleness of sample i: s_i = (trainer weight version at update time) − (version it was sampled
with), in optimizer steps.

The rollout-correction suite (sequence-level TIS / MIS, geometric-mean rejection, IcePop, bypass)
registers further modes in ``correction.py``.

Departure from AReaL: AReaL drops tokens whose weight exceeds its cap
(``behav_imp_weight_cap``); here the weight is truncated (kept at the cap), as the issue and the
RLCSD recipes specify.
"""
from __future__ import annotations

import math
from typing import NamedTuple

import torch
from torch import Tensor

from .correction import CORRECTION_MODES
from .staleness import staleness  # noqa: F401  (the rule, re-exported where the weights read it)
from .losses import tis_weights

OFF_POLICY_MODES = ("decoupled", "tis", "none")


class ISWeights(NamedTuple):
    """weights: [N, T] (no grad) or None when no sample is weighted (the loss then runs unweighted);
    metrics: name → 0-d tensor (``offpolicy/*``)."""

    weights: Tensor | None
    metrics: dict


def check_mode(mode: str, cap: float) -> None:
    """Raise ``ValueError`` for an unknown mode (the three here or a registered rollout-correction
    mode, ``correction.py``) or a cap ≤ 1 (a cap below 1 would down-weight on-policy tokens)."""
    if mode not in OFF_POLICY_MODES and mode not in CORRECTION_MODES:
        raise ValueError(f"algo.off_policy must be one of {[*OFF_POLICY_MODES, *CORRECTION_MODES]}, got {mode!r}")
    if not (isinstance(cap, (int, float)) and math.isfinite(cap) and cap >= 1.0):
        raise ValueError(f"algo.tis_cap must be a finite number >= 1, got {cap!r}")


def staleness_metrics(stale: Tensor) -> dict:
    """``offpolicy/staleness_mean``, ``offpolicy/staleness_max``, ``offpolicy/stale_frac`` of [N] staleness."""
    s = stale.long().to(torch.float32)
    return {"offpolicy/staleness_mean": s.mean() if len(s) else s.new_zeros(()),
            "offpolicy/staleness_max": s.max() if len(s) else s.new_zeros(()),
            "offpolicy/stale_frac": (s > 0).float().mean() if len(s) else s.new_zeros(())}


def off_policy_weights(prox_logp: Tensor, behav_logp: Tensor, mask: Tensor, stale: Tensor, *,
                       mode: str = "decoupled", cap: float = 2.0) -> ISWeights:
    """Truncated IS weights of the proximal against the behaviour policy (module docstring).

    Shapes: prox_logp / behav_logp / mask [N, T] (response frame); stale [N] staleness in steps.
    Returns :class:`ISWeights`; metrics (over the masked tokens of the weighted samples; 0 when
    none): ``offpolicy/is_mean``, ``offpolicy/is_max``, ``offpolicy/is_clipped_frac`` (share of
    tokens whose ratio exceeded ``cap``), and over all samples ``offpolicy/staleness_mean``,
    ``offpolicy/staleness_max``, ``offpolicy/stale_frac``.
    """
    check_mode(mode, cap)
    if mode not in OFF_POLICY_MODES:
        raise ValueError(f"off_policy_weights computes {list(OFF_POLICY_MODES)}; {mode!r} is a rollout-correction "
                         "mode (correction.apply_correction)")
    stale = stale.long()
    metrics = staleness_metrics(stale)
    rows = torch.zeros_like(stale, dtype=torch.bool) if mode == "none" else (
        stale > 0 if mode == "decoupled" else torch.ones_like(stale, dtype=torch.bool))
    zero = prox_logp.new_zeros(())
    if not bool(rows.any()):
        return ISWeights(None, {**metrics, "offpolicy/is_mean": zero + 1.0, "offpolicy/is_max": zero + 1.0,
                                "offpolicy/is_clipped_frac": zero})
    m = mask.to(prox_logp.dtype)
    w_all = tis_weights(prox_logp, behav_logp, m, cap=cap)
    w = torch.where(rows[:, None], w_all, m)      # unweighted rows: exactly 1 on their tokens
    sel = m * rows[:, None].to(m.dtype)
    n = sel.sum().clamp_min(1.0)
    log_ratio = torch.clamp(prox_logp.detach() - behav_logp.detach(), -20.0, 20.0)
    clipped = (log_ratio > math.log(cap)).to(m.dtype) * sel
    metrics.update({"offpolicy/is_mean": (w_all * sel).sum() / n,
                    "offpolicy/is_max": torch.where(sel > 0, w_all, zero).max(),
                    "offpolicy/is_clipped_frac": clipped.sum() / n})
    return ISWeights(w.detach(), metrics)


def behaviour_matrix(rollout_logp: list, like: Tensor) -> Tensor:
    """The engines' per-token log-probs (ragged lists, response order) as an [N, T] tensor in the
    frame and dtype of ``like``; tokens past T are cut, missing ones are 0 (masked anyway)."""
    out = torch.zeros_like(like)
    t_max = like.shape[1]
    for i, lp in enumerate(rollout_logp):
        k = min(len(lp), t_max)
        if k:
            out[i, :k] = torch.tensor(list(lp[:k]), dtype=like.dtype)
    return out
