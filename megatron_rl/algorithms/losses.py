"""Policy-gradient surrogates (per-token loss matrices) and loss aggregation.

Every loss returns :class:`LossOutput` ``(loss_mat [N, T], metrics)``; masked positions of
``loss_mat`` are exactly 0 and metrics are 0-d tensors (reduced once per step by the logger).
Aggregation is a separate axis: :func:`aggregate` (STYLE.md §3).

Notation: lp = current log-prob (gradient), old = behaviour log-prob, A = advantage ([N] per
sample or [N, T] per token), m = mask, ρ = exp(lp − old), w = optional TIS weights [N, T].

Contents
* :func:`ppo_clip_loss` — verl ``vanilla``: ρ = exp(clamp(lp − old, ±20)), asymmetric clip
  (clip-higher, DAPO) and optional dual clip c (Ye et al. 2020).
* :func:`plain_clip_loss` — RLCSD-family clip: no ±20 clamp, no dual clip.
* :func:`rlcsd_loss` — RLCSD two-path loss, each path normalised by its own token count.
* :func:`rlsd_advantage`, :func:`rlsd_ectr_advantage`, :func:`rlsd_lambda` — RLSD teacher-gap
  modulation (use with :func:`plain_clip_loss`, token-mean).

Departures from the reference code:
* ``aggregate`` excludes all-masked rows from the sequence count in every ``seq-mean-*`` mode
  (verl's new engine path does this for token-sum only) and returns 0 for an empty mask instead
  of dividing by 1e-8.
* RLCSD's two token counts are taken over the tensors passed in (call it on the whole
  mini-batch of a rank), not per token-budget micro-batch as in the reference code; the result
  is aggregated with ``"token-sum"`` because the loss carries its own normalisers.
* RLSD's λ decay is a switch defaulting to the constant λ₀ (the reference runs never decayed,
  docs/methods/self-distillation.md).
"""
from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor

from .kl import k3_log_ratio

AGG_MODES = ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm", "token-sum")


class LossOutput(NamedTuple):
    """loss_mat: [N, T] per-token loss (0 off-mask); metrics: name → 0-d tensor."""

    loss_mat: Tensor
    metrics: dict


class MaskedLossOutput(NamedTuple):
    """A loss whose token axis differs from the inputs' mask (SCoRe: [y1 | y2]); ``mask`` is the
    one to aggregate with."""

    loss_mat: Tensor
    metrics: dict
    mask: Tensor


def _per_token(adv: Tensor, like: Tensor) -> Tensor:
    adv = adv.detach().to(like.dtype)
    if adv.dim() == 1:
        return adv[:, None].expand_as(like)
    if adv.shape != like.shape:
        raise ValueError(f"advantages shape {tuple(adv.shape)} does not match log-probs {tuple(like.shape)}")
    return adv


def masked_mean(x: Tensor, mask: Tensor) -> Tensor:
    """Σ(x·m)/Σm over all entries; 0 when the mask is empty (0-d tensor)."""
    m = mask.to(x.dtype)
    n = m.sum()
    return torch.where(n > 0, (torch.where(m > 0, x, 0.0) * m).sum() / n.clamp_min(1e-30), 0.0 * n)


def _finish(loss: Tensor, mask: Tensor, tis_weights: Tensor | None) -> Tensor:
    if tis_weights is not None:
        loss = loss * tis_weights.detach().to(loss.dtype)
    return torch.where(mask.bool(), loss, torch.zeros_like(loss))


def ppo_clip_loss(logp: Tensor, old_logp: Tensor, advantages: Tensor, mask: Tensor, *, clip_low: float = 0.2,
                  clip_high: float = 0.2, dual_clip: float | None = None,
                  tis_weights: Tensor | None = None) -> LossOutput:
    """PPO clipped surrogate, verl ``vanilla`` (Schulman et al. 2017; DAPO clip-higher).

    Δ = clamp(lp − old, −20, 20); ρ = e^Δ; L1 = −Aρ; L2 = −A·clip(ρ, 1−ε_low, 1+ε_high);
    Lc = max(L1, L2); with dual clip c > 1: L = min(−A·c, Lc) where A < 0, else Lc.
    Times w (TIS) when given. Metrics: pg_clipfrac, ppo_kl (= mean −Δ; signed terms, can cancel),
    approx_kl (= mean of k3 e^Δ − 1 − Δ ≥ 0, :func:`~megatron_rl.algorithms.kl.k3_log_ratio`: 0 only if
    every Δ is 0; a clipped token's ρ lies outside [1 − ε_low, 1 + ε_high], so its k3 term is at least
    min(ε_high − ln(1 + ε_high), −ε_low − ln(1 − ε_low))), pg_clipfrac_lower.
    Shapes: logp/old_logp/mask [N, T]; advantages [N] or [N, T] → loss_mat [N, T].
    """
    if dual_clip is not None and dual_clip <= 1.0:
        raise ValueError(f"dual_clip must be > 1, got {dual_clip}")
    a = _per_token(advantages, logp)
    delta = torch.clamp(logp - old_logp.detach(), -20.0, 20.0)
    ratio = torch.exp(delta)
    l1 = -a * ratio
    l2 = -a * torch.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high)
    lc = torch.maximum(l1, l2)
    lower = torch.zeros_like(mask, dtype=torch.bool)
    loss = lc
    if dual_clip is not None:
        l3 = -a * dual_clip
        lower = (lc > l3) & (a < 0)
        loss = torch.where(a < 0, torch.minimum(l3, lc), lc)
    metrics = {"pg_clipfrac": masked_mean((l2 > l1).to(logp.dtype), mask).detach(),
               "ppo_kl": masked_mean(-delta, mask).detach(),
               "approx_kl": masked_mean(k3_log_ratio(delta), mask),
               "pg_clipfrac_lower": masked_mean(lower.to(logp.dtype), mask).detach()}
    return LossOutput(_finish(loss, mask, tis_weights), metrics)


def clipped_surrogate(logp: Tensor, old_logp: Tensor, adv: Tensor, eps: float) -> Tensor:
    """−min(ρA, clip(ρ, 1−ε, 1+ε)A) with ρ = exp(lp − old) (no clamp). Shapes: [N, T]."""
    ratio = torch.exp(logp - old_logp.detach())
    return -torch.minimum(ratio * adv, torch.clamp(ratio, 1.0 - eps, 1.0 + eps) * adv)


def plain_clip_loss(logp: Tensor, old_logp: Tensor, advantages: Tensor, mask: Tensor, *, clip_eps: float = 0.2,
                    tis_weights: Tensor | None = None) -> LossOutput:
    """RLCSD-family PPO clip (no ±20 clamp, no dual clip). Shapes and metrics (but pg_clipfrac_lower) as
    :func:`ppo_clip_loss`."""
    a = _per_token(advantages, logp)
    loss = clipped_surrogate(logp, old_logp, a, clip_eps)
    delta = (logp - old_logp).detach()
    ratio = torch.exp(delta)
    clipped = ((ratio < 1 - clip_eps) & (a < 0)) | ((ratio > 1 + clip_eps) & (a > 0))
    metrics = {"pg_clipfrac": masked_mean(clipped.to(logp.dtype), mask),
               "ppo_kl": masked_mean(-delta, mask), "approx_kl": masked_mean(k3_log_ratio(delta), mask)}
    return LossOutput(_finish(loss, mask, tis_weights), metrics)


class PartialLoss(NamedTuple):
    """``loss_sum`` (differentiable scalar) and ``normaliser`` (scalar tensor, or None = no division)."""

    loss_sum: Tensor
    normaliser: Tensor | None


def partial_aggregate(loss_mat: Tensor, mask: Tensor, mode: str = "token-mean", *,
                      scale_factor: float | None = None) -> PartialLoss:
    """THE aggregation, as a ratio ``S / D`` of one (micro-)batch's numerator and denominator.

    ``m`` the mask, ``L`` the per-token loss; rows with Σ_t m = 0 are not counted by the seq-modes:

        token-mean:              S = Σ_it L m,                 D = Σ_it m     (DAPO; global token average)
        seq-mean-token-mean:     S = Σ_i (Σ_t L m / Σ_t m),    D = #rows      (GRPO paper)
        seq-mean-token-sum:      S = Σ_it L m,                 D = #rows
        seq-mean-token-sum-norm: S = Σ_it L m / C,             D = None       (C = scale_factor or T;
                                 Dr.GRPO's constant normaliser cancels the length bias of 1/|o|)
        token-sum:               S = Σ_it L m,                 D = None       (losses carrying own normalisers)

    ``S`` and ``D`` are sums over rows, so summing them over any split of the batch (micro-batches,
    DP ranks) and dividing once gives the whole batch's value: the trainer's micro-batch and DP
    invariance holds by construction. :func:`aggregate` is the same formula on one tensor.
    """
    if mode not in AGG_MODES:
        raise ValueError(f"unknown loss aggregation mode {mode!r}; valid: {sorted(AGG_MODES)}")
    m = mask.to(loss_mat.dtype)
    lm = torch.where(m > 0, loss_mat, torch.zeros_like(loss_mat)) * m
    if mode == "token-mean":
        return PartialLoss(lm.sum(), m.sum().detach())
    if mode == "token-sum":
        return PartialLoss(lm.sum(), None)
    if mode == "seq-mean-token-sum-norm":
        c = float(scale_factor) if scale_factor is not None else float(loss_mat.shape[-1])
        return PartialLoss(lm.sum() / c, None)
    per_row = m.sum(-1)
    valid = per_row > 0
    seq = lm.sum(-1)
    if mode == "seq-mean-token-mean":
        seq = seq / per_row.clamp_min(1e-30)
    return PartialLoss(torch.where(valid, seq, torch.zeros_like(seq)).sum(), valid.sum().to(loss_mat.dtype))


def finish_aggregate(p: PartialLoss) -> Tensor:
    """``S / D`` (``S`` when ``D`` is None); an empty normaliser gives ``0·S`` (zero gradient), never NaN."""
    if p.normaliser is None:
        return p.loss_sum
    return p.loss_sum / p.normaliser.clamp_min(1e-30) if bool(p.normaliser > 0) else p.loss_sum * 0.0


def aggregate(loss_mat: Tensor, mask: Tensor, mode: str = "token-mean", *, scale_factor: float | None = None) -> Tensor:
    """Reduce a per-token loss [N, T] to a scalar: :func:`partial_aggregate` of the whole batch, divided
    once (see its table). Empty masks give 0 (with a zero gradient), never NaN."""
    return finish_aggregate(partial_aggregate(loss_mat, mask, mode, scale_factor=scale_factor))


class RLCSDPaths(NamedTuple):
    """Per-token losses and masks of the two RLCSD paths (each [N, T]); ``mask_sel = m·g``,
    ``mask_non = m(1−g)``. A trainer that normalises over the global batch aggregates each path
    with token-mean over its own mask: L = TokenMean_non(loss_non) + η·TokenMean_sel(loss_sel)."""

    loss_non: Tensor
    mask_non: Tensor
    loss_sel: Tensor
    mask_sel: Tensor


def rlcsd_paths(logp: Tensor, old_logp: Tensor, advantages: Tensor, adv_hat: Tensor, gate: Tensor, mask: Tensor, *,
                clip_eps: float = 0.2, tis_weights: Tensor | None = None) -> RLCSDPaths:
    """ℓ_non = clipped(A)·w on m(1−g); ℓ_sel = clipped(Â)·w on m·g (docs/methods/self-distillation.md). Shapes [N, T]."""
    a = _per_token(advantages, logp)
    m = mask.bool()
    sel, non = m & gate.bool(), m & ~gate.bool()
    l_non = _finish(clipped_surrogate(logp, old_logp, a, clip_eps), non, tis_weights)
    l_sel = _finish(clipped_surrogate(logp, old_logp, adv_hat.detach().to(logp.dtype), clip_eps), sel, tis_weights)
    return RLCSDPaths(l_non, non.to(logp.dtype), l_sel, sel.to(logp.dtype))


def rlcsd_loss(logp: Tensor, old_logp: Tensor, advantages: Tensor, adv_hat: Tensor, gate: Tensor, mask: Tensor, *,
               clip_eps: float = 0.2, eta: float = 1.0, tis_weights: Tensor | None = None,
               counts: tuple | None = None) -> LossOutput:
    """RLCSD two-path loss (docs/methods/self-distillation.md); aggregate the result with ``"token-sum"``.

    ``counts`` = (N_non, N_sel) of the WHOLE mini-batch (the trainer passes them so that a
    micro-batch's token-sum is its exact share of the mini-batch loss); None: counted here.

    M_non = m(1−g), M_sel = m·g; ℓ_non = clipped(A), ℓ_sel = clipped(Â), both times w.
    L = Σ M_non ℓ_non / max(N_non, 1) + η Σ M_sel ℓ_sel / max(N_sel, 1); the returned matrix holds
    each token's share, so ``aggregate(loss_mat, mask, "token-sum") == L`` with both counts taken
    over the tensors passed in (see :func:`rlcsd_paths` for global-batch normalisation).
    Shapes: logp/old/adv_hat/gate/mask [N, T]; advantages [N] or [N, T].
    """
    p = rlcsd_paths(logp, old_logp, advantages, adv_hat, gate, mask, clip_eps=clip_eps, tis_weights=tis_weights)
    if counts is None:
        n_sel, n_non = p.mask_sel.sum().clamp_min(1), p.mask_non.sum().clamp_min(1)
    else:
        n_non, n_sel = (torch.as_tensor(c, dtype=logp.dtype).clamp_min(1) for c in counts)
    loss = p.loss_non / n_non + eta * p.loss_sel / n_sel
    metrics = {"rlcsd_sel_frac": masked_mean(p.mask_sel, mask),
               "rlcsd_loss_non": (p.loss_non.sum() / n_non).detach(),
               "rlcsd_loss_sel": (p.loss_sel.sum() / n_sel).detach()}
    return LossOutput(loss, metrics)


def tis_weights(old_logp: Tensor, rollout_logp: Tensor, mask: Tensor, cap: float = 2.0) -> Tensor:
    """Truncated IS weights w = min(exp(clamp(old − rollout, ±20)), cap)·m, no grad (docs/methods/self-distillation.md). [N, T]."""
    w = torch.clamp(torch.exp(torch.clamp(old_logp.detach() - rollout_logp.detach(), -20.0, 20.0)), max=cap)
    return w * mask.to(w.dtype)


def rlsd_lambda(step: int | None, lam0: float = 0.5, decay_steps: int = 50, decay: bool = False) -> float:
    """λ_s = λ₀·max(0, 1 − min(max(s−1, 0)/D, 1)) when ``decay`` (and a step is known), else λ₀.

    The max(·, 0) keeps λ ≤ λ₀ at a step index 0 (the reference formula gives λ₀(1 + 1/D) there)."""
    if not decay or step is None:
        return lam0
    return lam0 * max(0.0, 1.0 - min(max(step - 1, 0) / decay_steps, 1.0))


def _modulate(adv: Tensor, gap: Tensor, lam: float, eps_w: float, exp_clamp: float | None) -> Tensor:
    a = _per_token(adv, gap)
    x = torch.sign(a) * gap.detach()
    if exp_clamp is not None:
        x = torch.clamp(x, -exp_clamp, exp_clamp)
    w = torch.clamp(torch.exp(x), 1.0 - eps_w, 1.0 + eps_w)
    return a * ((1.0 - lam) + lam * w)


def rlsd_advantage(advantages: Tensor, teacher_logp: Tensor, logp: Tensor, *, lam: float = 0.5,
                   eps_w: float = 0.2) -> Tensor:
    """RLSD: Δ = ℓ_T − sg(lp); w = clip(exp(sign(A)Δ), 1±ε_w); Â = A((1−λ) + λw). [N, T], no grad."""
    return _modulate(advantages, teacher_logp.detach() - logp.detach(), lam, eps_w, None)


def rlsd_ectr_advantage(advantages: Tensor, pos_logp: Tensor, neg_logp: Tensor, *, lam: float = 0.5,
                        eps_w: float = 0.2) -> Tensor:
    """RLSD-ECTR: Δ = ℓ_T(z⁺) − ℓ_T(z⁻); exponent clamped to ±60; otherwise as RLSD. [N, T]."""
    return _modulate(advantages, pos_logp.detach() - neg_logp.detach(), lam, eps_w, 60.0)
