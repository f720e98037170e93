"""SCoRe two-attempt self-correction objectives (Kumar et al., ICLR 2025, arXiv 2409.12917;
BY571/SCoRe code; spec Part 2).

Per token d_t = ref_t − lp_t, K3_t = e^{d_t} − d_t − 1 (k3 sample estimate of KL(π_θ‖π_ref),
no clamp here, as in the reference). Length normalisation N[q] per sample:
"sequence" Σ m q / max(Σ m, 1); "constant" Σ m q / max_new (Dr.GRPO style, per attempt).

    Stage I:  L_I  = mean_i [ −r2_i·N[lp2]_i + β2·N[K3(y1)]_i ]
    Stage II: r̃2 = r2 + α(r2 − r1);
              L_II = mean_i [ −r1·N[lp1] − r̃2·N[lp2] + β1·N[K3(y1)] + β1·N[K3(y2)] ]

Plain REINFORCE on raw rewards (no ratio, clip or baseline). :func:`score_loss_mat` writes the
objective as a per-token matrix over the concatenated attempts [y1 | y2] so that
``aggregate(loss_mat, mask, "seq-mean-token-sum")`` equals L_I / L_II exactly.

Departure: :func:`first_eos_mask` keeps tokens up to and including the first EOS even when the
pad id differs from EOS (the reference's "count EOS ≤ 1" mask leaks padding; ``quirk=True``
reproduces it for parity tests only).
"""
from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor

from .inputs import register_input


def score_k3(logp: Tensor, ref_logp: Tensor) -> Tensor:
    """K3_t = exp(ref − lp) − (ref − lp) − 1 ≥ 0; gradient via lp only. [N, T]."""
    d = ref_logp.detach() - logp
    return torch.exp(d) - d - 1.0


def length_norm_weights(mask: Tensor, mode: str = "sequence", max_new: int | None = None) -> Tensor:
    """Per-token weights m/Σm ("sequence") or m/max_new ("constant"). [N, T]."""
    m = mask.to(torch.get_default_dtype() if not mask.dtype.is_floating_point else mask.dtype)
    if mode == "sequence":
        return m / m.sum(-1, keepdim=True).clamp_min(1)
    if mode == "constant":
        if not max_new or max_new <= 0:
            raise ValueError(f"length_norm='constant' needs max_new > 0, got {max_new}")
        return m / float(max_new)
    raise ValueError(f"unknown SCoRe length_norm {mode!r}; valid: ['constant', 'sequence']")


def shaped_reward(r1: Tensor, r2: Tensor, alpha: float = 10.0) -> Tensor:
    """r̃2 = r2 + α(r2 − r1). [N]."""
    return r2 + alpha * (r2 - r1)


class ScoreLoss(NamedTuple):
    """loss_mat [N, T1+T2], mask [N, T1+T2] (aggregate with seq-mean-token-sum), metrics."""

    loss_mat: Tensor
    mask: Tensor
    metrics: dict


def score_loss_mat(stage: int, lp1: Tensor, ref1: Tensor, m1: Tensor, lp2: Tensor, ref2: Tensor, m2: Tensor,
                   r1: Tensor, credit2: Tensor, *, beta1: float = 0.01, beta2: float = 0.1,
                   length_norm: str = "sequence", max_new: tuple = (None, None)) -> ScoreLoss:
    """Per-token SCoRe objective for stage 1 or 2 over [attempt-1 | attempt-2] tokens.

    ``credit2`` is attempt 2's reward coefficient: r2 in stage I, r̃2 (:func:`shaped_reward`) in
    stage II; ``r1`` is used in stage II only. Shapes: [N, T1], [N, T2]; r1, credit2 [N]."""
    if stage not in (1, 2):
        raise ValueError(f"SCoRe stage must be 1 or 2, got {stage}")
    w1 = length_norm_weights(m1, length_norm, max_new[0]).to(lp1.dtype)
    w2 = length_norm_weights(m2, length_norm, max_new[1]).to(lp2.dtype)
    k1, k2 = score_k3(lp1, ref1), score_k3(lp2, ref2)
    r1, c2 = r1.detach().to(lp1.dtype)[:, None], credit2.detach().to(lp2.dtype)[:, None]
    if stage == 1:
        t1 = beta2 * k1 * w1
        t2 = -c2 * lp2 * w2
    else:
        t1 = (-r1 * lp1 + beta1 * k1) * w1
        t2 = (-c2 * lp2 + beta1 * k2) * w2
    mask = torch.cat([m1.bool(), m2.bool()], dim=-1)
    loss = torch.where(mask, torch.cat([t1, t2], dim=-1), torch.zeros((), dtype=lp1.dtype))
    metrics = {"score_kl1": ((k1 * w1).sum(-1)).mean().detach(), "score_kl2": ((k2 * w2).sum(-1)).mean().detach(),
               "score_credit2": c2.mean().detach()}
    return ScoreLoss(loss, mask, metrics)


def score_stage1_loss(lp1, ref1, m1, lp2, m2, r2, *, beta2: float = 0.1, length_norm: str = "sequence",
                      max_new: tuple = (None, None)) -> Tensor:
    """Scalar L_I (docs/methods/score.md). Shapes: [N, T1], [N, T2]; r2 [N]."""
    w1 = length_norm_weights(m1, length_norm, max_new[0]).to(lp1.dtype)
    w2 = length_norm_weights(m2, length_norm, max_new[1]).to(lp2.dtype)
    kl1 = (torch.where(m1.bool(), score_k3(lp1, ref1), 0.0) * w1).sum(-1)
    pg = (torch.where(m2.bool(), lp2, 0.0) * w2).sum(-1)
    return (-r2.detach() * pg + beta2 * kl1).mean()


def score_stage2_loss(lp1, ref1, m1, lp2, ref2, m2, r1, r2, *, beta1: float = 0.01, alpha: float = 10.0,
                      length_norm: str = "sequence", max_new: tuple = (None, None)) -> Tensor:
    """Scalar L_II (docs/methods/score.md)."""
    out = score_loss_mat(2, lp1, ref1, m1, lp2, ref2, m2, r1, shaped_reward(r1, r2, alpha), beta1=beta1,
                         length_norm=length_norm, max_new=max_new)
    return out.loss_mat.sum(-1).mean()


def first_eos_mask(ids: Tensor, eos_id: int, *, quirk: bool = False) -> Tensor:
    """1 up to and including the first EOS. ``quirk=True``: reference rule (#EOS in y_≤t) ≤ 1.
    Shapes: ids [N, T] → bool [N, T]."""
    is_eos = (ids == eos_id).long()
    seen = is_eos.cumsum(-1)
    if quirk:
        return seen <= 1
    return (seen - is_eos) == 0



# SCoRe's attempt-1 inputs (the two-attempts path provides them); T1 = attempt 1's response frame
register_input("first_logp", ("N", "T1"), "float", "current policy on attempt 1's tokens, with grad",
               policy="logp", index="first_pos")
register_input("first_ref_logp", ("N", "T1"), "float", "reference policy on attempt 1's tokens")
register_input("first_mask", ("N", "T1"), "float", "attempt 1's response mask", filler=torch.zeros_like)
register_input("first_rewards", ("N",), "float", "attempt 1's reward")
