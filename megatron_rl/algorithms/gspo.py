"""GSPO: Group Sequence Policy Optimization (Zheng et al. 2025, Qwen, arXiv 2507.18071), and GSPO-token.

The importance ratio is the sequence's length-normalised likelihood ratio, one per response, clipped
as PPO clips a token's (paper eq. 5–7); GSPO-token (eq. 13–14) carries the same value on every token
but takes each token's gradient on its own, so that a per-token advantage can weigh it:

    Δ_t = lp_t − old_t                           (old: behaviour / proximal log-probs, no gradient)
    log s_i = min(Σ_t m_t Δ_t / max(Σ_t m_t, 1), 10)      sequence ratio s_i = (π_θ(y_i)/π_old(y_i))^(1/|y_i|)
    GSPO:        s_i,t = s_i                      (gradient (s_i/|y_i|) Σ_t ∇lp_t, through the whole row)
    GSPO-token:  s_i,t = exp(sg(log s_i) + lp_t − sg(lp_t))   (value s_i; gradient s_i ∇lp_t)
    L_i,t = max(−A_i,t s_i,t, −A_i,t clip(s_i,t, 1 − ε_low, 1 + ε_high)) on m_t = 1, else 0;
    with a dual clip c (off in the paper): L = min(−A c, L) where A < 0.  Times w (TIS) when given.

Shapes: lp / old / m [N, T]; A [N] (per sequence) or [N, T] → loss_mat [N, T]. With a per-sequence A
and ``seq-mean-token-mean`` aggregation (the paper's 1/G Σ_i), GSPO and GSPO-token have the same
value and gradient (paper §4.3; ``tests/unit/algorithms/test_gspo_cispo.py``).

References: verl ``compute_policy_loss_gspo`` (``verl/trainer/ppo/core_algos.py``, volcengine/verl @
012be9d, and the 0.9.1 release: the GSPO-token form, log-ratio clamped at 10, ``pg_clipfrac`` = the
fraction of tokens where the clipped term is taken); slime ``compute_gspo_kl`` + ``compute_policy_loss``
(``slime/utils/ppo_utils.py``, THUDM/slime @ 501dae9: the sequence form, gradient through the mean,
optional dual clip).

Departures: the sequence log-ratio is clamped at 10 in both forms (verl clamps its token form; slime
does not clamp); the row's mean divides by max(Σm, 1) as both do, so an all-masked row has s = 1 and
weighs nothing in any aggregation.
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

LEVELS = ("sequence", "token")
LOG_RATIO_MAX = 10.0     #: upper clamp of log s_i (verl's numerical guard; s = e^10 is clipped by any ε < 2e4)


def sequence_log_ratio(logp: Tensor, old_logp: Tensor, mask: Tensor) -> Tensor:
    """log s_i = min(Σ_t m Δ_t / max(Σ_t m, 1), 10) with Δ = lp − sg(old): [N] (gradient through lp)."""
    m = mask.to(logp.dtype)
    delta = torch.where(m > 0, logp - old_logp.detach(), torch.zeros_like(logp))
    return torch.clamp((delta * m).sum(-1) / m.sum(-1).clamp_min(1.0), max=LOG_RATIO_MAX)


def gspo_loss(logp: Tensor, old_logp: Tensor, advantages: Tensor, mask: Tensor, *, clip_low: float = 3e-4,
              clip_high: float = 4e-4, level: str = "sequence", dual_clip: float | None = None,
              tis_weights: Tensor | None = None) -> LossOutput:
    """GSPO (``level="sequence"``) or GSPO-token (``level="token"``) per-token loss (module docstring).

    Metrics: ``pg_clipfrac`` (token mean of [clipped term taken]), ``ppo_kl`` (token mean of −Δ),
    ``approx_kl`` (token mean of the k3 term e^Δ − 1 − Δ ≥ 0 of each token's own Δ), ``gspo_seq_ratio``
    (mean of s_i over rows with tokens), ``gspo_seq_clipfrac`` (fraction of those rows whose s_i lies outside
    [1 − ε_low, 1 + ε_high]).
    """
    if level not in LEVELS:
        raise ValueError(f"gspo level {level!r} not in {list(LEVELS)}")
    if dual_clip is not None and dual_clip <= 1.0:
        raise ValueError(f"dual_clip must be > 1, got {dual_clip}")
    a = _per_token(advantages, logp)
    log_s = sequence_log_ratio(logp, old_logp, mask)
    if level == "sequence":
        log_st = log_s[:, None].expand_as(logp)
    else:
        log_st = log_s.detach()[:, None] + logp - logp.detach()
    ratio = torch.exp(log_st)
    l1 = -a * ratio
    l2 = -a * torch.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high)
    loss = torch.maximum(l1, l2)
    if dual_clip is not None:
        loss = torch.where(a < 0, torch.minimum(-a * dual_clip, loss), loss)
    rows = (mask.sum(-1) > 0).to(logp.dtype)
    s = torch.exp(log_s.detach())
    out_of_band = ((s < 1.0 - clip_low) | (s > 1.0 + clip_high)).to(logp.dtype)
    metrics = {"pg_clipfrac": masked_mean((l2 > l1).to(logp.dtype), mask).detach(),
               "ppo_kl": masked_mean(-(logp - old_logp).detach(), mask),
               "approx_kl": masked_mean(k3_log_ratio(logp - old_logp), mask),
               "gspo_seq_ratio": masked_mean(s, rows), "gspo_seq_clipfrac": masked_mean(out_of_band, rows)}
    return LossOutput(_finish(loss, mask, tis_weights), metrics)


@dataclass(frozen=True)
class GSPOHParams(GRPOHParams):
    """GSPO (arXiv 2507.18071 §5.1; verl recipe/gspo): sequence ratio clipped to [1 − 3e-4, 1 + 4e-4], the
    paper's per-sequence mean (seq-mean-token-mean), no dual clip, no KL; GRPO's group advantage."""

    clip_low: float = 3e-4           #: ε_low of the sequence ratio (paper: 3e-4)
    clip_high: float = 4e-4          #: ε_high of the sequence ratio (paper: 4e-4)
    dual_clip: float | None = None
    loss_agg_mode: str = "seq-mean-token-mean"
    kl_loss_coef: float = 0.0
    level: str = "sequence"          #: sequence (GSPO: one ratio, gradient through the row's mean) | token (GSPO-token: per-token gradient, per-token advantages)

    def __post_init__(self) -> None:
        super().__post_init__()
        _check(self.level in LEVELS, f"gspo level {self.level!r} not in {list(LEVELS)}")


@register_policy_loss("gspo", needs=("logp", "old_logp"))
def _gspo(x: AlgoInputs, adv: Tensor, hp) -> LossOutput:
    return gspo_loss(x.logp, x.old_logp, adv, x.mask, clip_low=hp.clip_low, clip_high=hp.clip_high,
                     level=hp.level, dual_clip=hp.dual_clip, tis_weights=x.tis_weights)


register_algo_kind("gspo", "grpo", "gspo", GSPOHParams)
