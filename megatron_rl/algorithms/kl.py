"""KL estimators k1/k2/k3 (Schulman 2020, "Approximating KL divergence"; verl ``kl_penalty``).

Per token, with lp the current (or old) log-prob and ref the reference log-prob:

    k1 ("kl")          lp − ref
    "abs"              |lp − ref|
    k2 ("mse")         ½ (lp − ref)²
    k3 ("low_var_kl")  x = clamp(ref − lp, −20, 20);  clamp(eᕽ − x − 1, −10, 10)

A trailing ``+`` (``"k3+"``, ``"k1+"``) gives the value of the named estimator with the gradient
of k2 (straight-through: k2 − sg(k2) + sg(named)), an unbiased-gradient variant.
Usable in-loss (``kl_penalty(lp, ref, kind)`` aggregated with the loss's mode) and in-reward
(:func:`apply_kl_in_reward`). ``ref`` never receives gradient (it is detached).
verl's ``"full"`` estimator is not offered (it needs full-vocabulary log-probs).

:func:`k3_log_ratio` is k3 as a diagnostic (no clamps, no gradient, exact to a few u for any Δ): the
PPO-family losses report it as ``approx_kl``, the size of the policy's move since the old log-probs,
and ``mismatch.gen_kl`` averages it over the trainer-vs-engine log-ratios.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import torch
from torch import Tensor

_ALIASES = {"k1": "k1", "kl": "k1", "abs": "abs", "k2": "k2", "mse": "k2", "k3": "k3", "low_var_kl": "k3"}


def kl_kinds() -> list[str]:
    """Sorted valid estimator names (suffix ``+`` allowed on each)."""
    return sorted(_ALIASES)


def _base(lp: Tensor, ref: Tensor, kind: str) -> Tensor:
    d = lp - ref
    if kind == "k1":
        return d
    if kind == "abs":
        return d.abs()
    if kind == "k2":
        return 0.5 * d * d
    x = torch.clamp(-d, -20.0, 20.0)
    return torch.clamp(torch.exp(x) - x - 1.0, -10.0, 10.0)


#: |Δ| below which :func:`k3_log_ratio` sums its Taylor series (expm1(Δ) − Δ cancels there)
K3_SERIES_BELOW = 0.1


def k3_log_ratio(delta: Tensor) -> Tensor:
    """k3 of the log-ratio Δ = log π_new − log π_old per token: e^Δ − 1 − Δ = ρ − 1 − log ρ, no gradient.

    On tokens sampled from π_old its mean is an unbiased estimate of KL(π_old ‖ π_new) (Schulman 2020,
    "Approximating KL divergence"; CleanRL's ``approx_kl``). Every term is ≥ 0, so a mean of them cannot
    cancel (unlike the mean of −Δ, ``ppo_kl``). Computed without cancellation: for |Δ| < 0.1 the series
    Δ²(1/2 + Δ/6 + Δ²/24 + Δ³/120 + Δ⁴/720) (truncation Δ⁵/2520 < 4e-9 relative, below fp32's
    u = 6e-8; bracket ≥ 0.48 > 0), beyond it expm1(Δ) − Δ (rounding ≤ (|e^Δ − 1| + |Δ|)·u / k3 + u ≤ 22u
    at |Δ| = 0.1, less further out). So the value is 0 exactly where Δ = 0 (and where Δ² underflows:
    |Δ| < 4e-23 in fp32), > 0 everywhere else. Shapes: any; the same back, in Δ's dtype.
    """
    d = delta.detach()
    series = d * d * (0.5 + d * (1.0 / 6 + d * (1.0 / 24 + d * (1.0 / 120 + d * (1.0 / 720)))))
    return torch.where(d.abs() < K3_SERIES_BELOW, series, torch.expm1(d) - d)


def kl_penalty(logp: Tensor, ref_logp: Tensor, kind: str = "k3") -> Tensor:
    """Per-token KL estimate, same shape as ``logp`` (e.g. [N, T]). Gradient flows via logp only."""
    straight = kind.endswith("+")
    name = _ALIASES.get(kind[:-1] if straight else kind)
    if name is None:
        raise ValueError(f"unknown KL estimator {kind!r}; valid: {kl_kinds()} (optionally with '+')")
    ref = ref_logp.detach()
    value = _base(logp, ref, name)
    if not straight:
        return value
    k2 = _base(logp, ref, "k2")
    return k2 - k2.detach() + value.detach()


class KLInReward(NamedTuple):
    """token_rewards [N, T] = scores − β·kld; kld [N, T] (masked); mean_kl scalar tensor."""

    token_rewards: Tensor
    kld: Tensor
    mean_kl: Tensor


def apply_kl_in_reward(token_scores: Tensor, old_logp: Tensor, ref_logp: Tensor, mask: Tensor,
                       beta: float, kind: str = "k1") -> KLInReward:
    """verl ``apply_kl_penalty``: r_t = s_t − β·KL(old_t, ref_t)·m_t (no gradient anywhere).

    ``mean_kl`` is the batch mean of per-sequence masked means (what the adaptive controller reads).
    Shapes: [N, T] each.
    """
    m = mask.to(token_scores.dtype)
    kld = kl_penalty(old_logp.detach(), ref_logp, kind).detach() * m
    per_seq = kld.sum(-1) / m.sum(-1).clamp_min(1)
    return KLInReward(token_scores - beta * kld, kld, per_seq.mean() if per_seq.numel() else per_seq.sum())


@dataclass
class AdaptiveKLController:
    """β ← β·(1 + clip(KL/target − 1, −0.2, 0.2)·n_steps/horizon) (Ziegler et al. 2019; verl)."""

    value: float
    target: float
    horizon: int

    def update(self, current_kl: float, n_steps: int) -> float:
        """Update and return β."""
        err = min(max(current_kl / self.target - 1.0, -0.2), 0.2)
        self.value *= 1.0 + err * n_steps / self.horizon
        return self.value
