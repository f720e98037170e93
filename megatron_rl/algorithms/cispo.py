"""CISPO: Clipped IS-weight Policy Optimization (MiniMax-M1, arXiv 2506.13585, eq. 4–5).

PPO drops the gradient of a token whose ratio left the trust region; CISPO keeps every token's
gradient and clips only the importance-sampling weight, which carries no gradient:

    r_t = exp(clamp(lp_t − old_t, −20, 20))                  (old: behaviour / proximal log-probs)
    r̂_t = clip(r_t, 1 − ε_low, 1 + ε_high)                  (ε_low ≥ 1: no lower bound, as the paper runs)
    L_t = −sg(r̂_t) · A_t · lp_t  on m_t = 1, else 0;  times w (TIS) when given.

So ∇L_t = −r̂_t A_t ∇lp_t: REINFORCE with a truncated IS weight. The paper normalises by the batch's
token count (``token-mean``) and drops the KL term. Shapes: lp / old / m [N, T]; A [N] or [N, T] →
loss_mat [N, T]. The loss VALUE is the surrogate −r̂ A lp (not near 0 on-policy, unlike PPO's −ρA);
only its gradient is the policy gradient.

References: verl ``compute_policy_loss_cispo`` (``verl/trainer/ppo/core_algos.py``, verl 0.9.1 release:
±20 log-ratio clamp, ``pg_clipfrac`` = fraction of tokens with r̂ ≠ r; its examples/cispo_trainer runs
ε_low = 10, ε_high = 0.2); slime ``compute_cispo_loss`` (``slime/utils/ppo_utils.py``, THUDM/slime @
501dae9: the same, without the clamp). Departure: none in the formula; ε_high is not stated in the
paper (it was tuned), the default is verl's example value.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from .builtin import register_algo_kind
from .hparams import GRPOHParams, _check
from .inputs import AlgoInputs
from .kl import k3_log_ratio
from .losses import LossOutput, _finish, _per_token, masked_mean
from .registry import register_policy_loss


def cispo_loss(logp: Tensor, old_logp: Tensor, advantages: Tensor, mask: Tensor, *, clip_low: float = 10.0,
               clip_high: float = 0.2, tis_weights: Tensor | None = None) -> LossOutput:
    """CISPO per-token loss −sg(clip(r, 1 − ε_low, 1 + ε_high))·A·lp (module docstring).

    Metrics: ``pg_clipfrac`` (token mean of [r̂ ≠ r]), ``ppo_kl`` (token mean of −Δ), ``approx_kl`` (token
    mean of the k3 term e^Δ − 1 − Δ ≥ 0), ``cispo_is_weight`` (token mean of r̂).
    """
    if clip_low < 0 or clip_high < 0:
        raise ValueError(f"cispo clip ranges must be >= 0, got {clip_low}/{clip_high}")
    a = _per_token(advantages, logp)
    delta = torch.clamp((logp - old_logp).detach(), -20.0, 20.0)
    ratio = torch.exp(delta)
    weight = torch.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high)
    loss = -weight * a * logp
    metrics = {"pg_clipfrac": masked_mean((weight != ratio).to(logp.dtype), mask),
               "ppo_kl": masked_mean(-delta, mask), "approx_kl": masked_mean(k3_log_ratio(delta), mask),
               "cispo_is_weight": masked_mean(weight, mask)}
    return LossOutput(_finish(loss, mask, tis_weights), metrics)


@dataclass(frozen=True)
class CISPOHParams(GRPOHParams):
    """CISPO (arXiv 2506.13585 §3.1): IS weight clipped above only (ε_low ≥ 1), token-mean, no KL, no dual
    clip; GRPO's group advantage. ε_high 0.2 and ε_low 10 as verl's examples/cispo_trainer."""

    clip_low: float = 10.0           #: ε_low of the IS weight: r̂ ≥ 1 − ε_low (≥ 1: no lower bound, the paper's setting)
    clip_high: float = 0.2           #: ε_high of the IS weight: r̂ ≤ 1 + ε_high (tuned in the paper; verl's example 0.2)
    dual_clip: float | None = None
    loss_agg_mode: str = "token-mean"
    kl_loss_coef: float = 0.0

    def _check_clip(self) -> None:
        _check(self.clip_low >= 0 and self.clip_high >= 0, f"cispo clip ranges must be >= 0: clip_low={self.clip_low}, "
               f"clip_high={self.clip_high}")
        _check(self.dual_clip is None, "cispo has no dual clip (its weight is already bounded): dual_clip must be null")


@register_policy_loss("cispo", needs=("logp", "old_logp"))
def _cispo(x: AlgoInputs, adv: Tensor, hp) -> LossOutput:
    return cispo_loss(x.logp, x.old_logp, adv, x.mask, clip_low=hp.clip_low, clip_high=hp.clip_high,
                      tis_weights=x.tis_weights)


register_algo_kind("cispo", "grpo", "cispo", CISPOHParams)
