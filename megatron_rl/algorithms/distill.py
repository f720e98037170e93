"""On-policy self-distillation losses: OPSD, SDPO, SRPO, OPSD-ECTR (docs/methods/self-distillation.md).

All teacher quantities are detached. Distributions live on a top-k + tail support built by
:func:`topk_tail_support` from full-vocabulary logits: the k indices chosen by one
distribution, the full-vocab-normalised log-probs gathered there, plus one tail bucket
log p(tail) = log(1 − exp(min(LSE(top-k), −1e-7))). Supports are [N, T, k+1] log-probs.

* OPSD (Zhao et al. 2026, "on-policy self-distillation"): ℓ_t = Σ_u min(p_T(u)[log p_T − log p_S](u), κ),
  per-element clip from above (κ = 0.05), so ℓ_t may be negative; clipped elements give no grad.
* SDPO: generalised JSD_α (Agarwal et al. 2024, GKD) times an IS weight min(exp(sg(lp) − old), 2).
* SRPO: GRPO dual-clip loss on rows with mean advantage > 0, entropy-weighted SDPO on the rest,
  one shared token denominator (aggregate with ``"token-mean"``).
* OPSD-ECTR: OPSD towards a CFG-style guided target q = softmax((1+α)log p_c − α·max(log p_w, f)),
  weighted by ω = KL(p_c‖p_w)/(KL + τ).

Departures: ties in the top-k go to the lowest vocabulary index (stable sort; ``torch.topk``'s
tie order is unspecified and changes the support when tied logits differ in the other model).
The tail uses log(−expm1(x)) (same value, stable). JSD_α at α ∈ {0, 1} is the
limit the reference special-cases (forward / reverse KL), not the degenerate mixture formula.
The legacy per-token (instead of per-element) OPSD clip is not reproduced.
"""
from __future__ import annotations

import math

import torch
from torch import Tensor

from .losses import LossOutput, _finish, masked_mean, ppo_clip_loss
from .inputs import register_input


def _with_tail(logp_full: Tensor, idx: Tensor) -> Tensor:
    top = logp_full.gather(-1, idx)
    lse = torch.clamp(torch.logsumexp(top, dim=-1, keepdim=True), max=-1e-7)
    return torch.cat([top, torch.log(-torch.expm1(lse))], dim=-1)


def topk_tail_support(select_logits: Tensor, *other_logits: Tensor, k: int = 100) -> tuple[Tensor, ...]:
    """Top-k (+ tail) support chosen by ``select_logits``; returns one [.., k+1] log-prob
    tensor per input, ``select`` first. Shapes: logits [N, T, V] each (same V)."""
    if k < 1 or k >= select_logits.shape[-1]:
        raise ValueError(f"top-k support needs 1 <= k < V={select_logits.shape[-1]}, got k={k}")
    # stable descending sort: ties go to the lowest vocabulary index (deterministic across backends)
    idx = torch.sort(select_logits.detach(), dim=-1, descending=True, stable=True).indices[..., :k]
    return tuple(_with_tail(torch.log_softmax(x, dim=-1), idx) for x in (select_logits, *other_logits))


def opsd_token_loss(student: Tensor, teacher: Tensor, clip: float = 0.05) -> Tensor:
    """Σ_u min(p_T(u)(log p_T(u) − log p_S(u)), clip); ``clip`` ≤ 0 means no clip (as in the
    reference). Shapes: supports [N, T, K] → [N, T]."""
    t = teacher.detach()
    el = t.exp() * (t - student)
    return (torch.clamp(el, max=clip) if clip > 0 else el).sum(-1)


def generalized_jsd(student: Tensor, teacher: Tensor, alpha: float = 0.5) -> Tensor:
    """JSD_α = (1−α)KL(S‖M) + αKL(T‖M), M = (1−α)S + αT; α=0 → KL(T‖S), α=1 → KL(S‖T). [N, T]."""
    if not 0.0 <= alpha <= 1.0:
        raise ValueError(f"JSD alpha must be in [0, 1], got {alpha}")
    t = teacher.detach()
    if alpha == 0.0:
        return (t.exp() * (t - student)).sum(-1)
    if alpha == 1.0:
        return (student.exp() * (student - t)).sum(-1)
    a = torch.tensor(alpha, dtype=student.dtype)
    mix = torch.logsumexp(torch.stack([student + torch.log1p(-a), t + torch.log(a)]), dim=0)
    kl_s = (student.exp() * (student - mix)).sum(-1)
    kl_t = (t.exp() * (t - mix)).sum(-1)
    return (1 - alpha) * kl_s + alpha * kl_t


def is_weight(logp: Tensor, old_logp: Tensor, is_clip: float = 2.0) -> Tensor:
    """min(exp(clamp(sg(lp) − old, ±20)), is_clip), no grad. [N, T]."""
    return torch.clamp(torch.exp(torch.clamp(logp.detach() - old_logp.detach(), -20, 20)), max=is_clip)


def opsd_loss(student: Tensor, teacher: Tensor, mask: Tensor, *, clip: float = 0.05,
              tis_weights: Tensor | None = None) -> LossOutput:
    """OPSD per-token clipped forward KL (teacher top-k support); aggregate with token-mean."""
    loss = opsd_token_loss(student, teacher, clip)
    return LossOutput(_finish(loss, mask, tis_weights), {"distill_loss": masked_mean(loss.detach(), mask)})


def sdpo_loss(student: Tensor, teacher: Tensor, logp: Tensor, old_logp: Tensor, mask: Tensor, *,
              alpha: float = 0.5, is_clip: float = 2.0, tis_weights: Tensor | None = None) -> LossOutput:
    """SDPO: JSD_α · IS (student top-k support); aggregate with token-mean."""
    jsd = generalized_jsd(student, teacher, alpha)
    w = is_weight(logp, old_logp, is_clip)
    return LossOutput(_finish(jsd * w, mask, tis_weights), {"jsd": masked_mean(jsd.detach(), mask)})


def srpo_routes(advantages: Tensor, mask: Tensor) -> tuple[Tensor, Tensor]:
    """SRPO routing: (grpo_rows [N] bool: ā_i = Σ_t A m / max(Σ m, 1) > 0, routed [N, T] bool: the
    valid tokens of the other rows, zero-advantage rows included)."""
    m = mask.to(torch.float64)
    a = advantages.detach().to(torch.float64)
    a_tok = a[:, None] * m if a.dim() == 1 else a * m
    grpo_rows = a_tok.sum(-1) / m.sum(-1).clamp_min(1) > 0
    return grpo_rows, mask.bool() & ~grpo_rows[:, None]


def srpo_log_u_mean(advantages: Tensor, mask: Tensor, teacher_entropy: Tensor, beta: float = 1.0) -> Tensor:
    """log mean_routed(u), u = exp(−β H_T), over every routed token of the batch given (a scalar;
    0 when nothing is routed). The trainer evaluates it once on the whole step's batch so that the
    weight d = u / mean(u) does not depend on micro-batching or DP (the reference normalises per
    micro-batch, which makes the loss a function of ``micro_batch_size``)."""
    _, routed = srpo_routes(advantages, mask)
    if not bool(routed.any()):
        return teacher_entropy.new_zeros(())
    x = -beta * teacher_entropy.detach()[routed].to(torch.float64)
    return (torch.logsumexp(x, 0) - math.log(x.numel())).to(teacher_entropy.dtype)


def srpo_loss(logp: Tensor, old_logp: Tensor, advantages: Tensor, mask: Tensor, jsd: Tensor,
              teacher_entropy: Tensor, *, clip_eps: float = 0.2, dual_clip: float = 3.0, beta: float = 1.0,
              is_clip: float = 2.0, tis_weights: Tensor | None = None,
              log_u_mean: Tensor | None = None) -> LossOutput:
    """SRPO routing (docs/methods/self-distillation.md); aggregate with ``"token-mean"`` (one shared denominator).

    ā_i = Σ_t A m / max(Σ m, 1); rows with ā_i > 0 → GRPO dual-clip loss; the others (zero-
    advantage rows included) → JSD·IS·d with d = u/mean_routed(u), u = exp(−β H_T).
    ``log_u_mean``: log mean_routed(u) of the WHOLE step's batch (:func:`srpo_log_u_mean`, a
    scalar or [N] of equal values); None = this batch's own mean (the reference's per-micro-batch
    form). Shapes: [N, T] each; advantages [N] or [N, T].
    """
    m = mask.to(logp.dtype)
    a = advantages.detach().to(logp.dtype)
    a_tok = a[:, None] * m if a.dim() == 1 else a * m
    grpo_rows, routed = srpo_routes(advantages, mask)
    grpo = ppo_clip_loss(logp, old_logp, a_tok, mask, clip_low=clip_eps, clip_high=clip_eps,
                         dual_clip=dual_clip).loss_mat
    h = teacher_entropy.detach().to(logp.dtype)
    if log_u_mean is None:
        log_u_mean = srpo_log_u_mean(advantages, mask, h, beta)
    lum = log_u_mean.reshape(-1)[0] if log_u_mean.dim() else log_u_mean
    d = torch.where(routed, torch.exp(-beta * h - lum.to(h.dtype)), torch.zeros_like(h))
    sdpo = jsd * is_weight(logp, old_logp, is_clip) * d
    loss = torch.where(grpo_rows[:, None], grpo, sdpo)
    metrics = {"srpo_grpo_frac": grpo_rows.to(logp.dtype).mean() if grpo_rows.numel() else logp.new_zeros(()),
               "jsd": masked_mean(jsd.detach(), routed)}
    return LossOutput(_finish(loss, mask, tis_weights), metrics)


def opsd_ectr_loss(student: Tensor, teacher_pos: Tensor, teacher_neg: Tensor, mask: Tensor, *, alpha: float = 0.5,
                   log_w_floor: float = -5.0, cw_tau: float = 1.0, clip: float = 0.05,
                   tis_weights: Tensor | None = None) -> LossOutput:
    """OPSD-ECTR (docs/methods/self-distillation.md); supports on the correct-hint teacher's top-k. Token-mean.

    g = (1+α)log p_c − α·max(log p_w, f); q = softmax(g); ℓ = Σ min(q(log q − log p_S), κ);
    ω = KL/(KL + τ), KL = max(0, Σ p_c(log p_c − log p_w)) (unfloored p_w); τ = 0 → ω = 1.
    """
    pc, pw = teacher_pos.detach(), teacher_neg.detach()
    q = torch.log_softmax((1 + alpha) * pc - alpha * torch.clamp(pw, min=log_w_floor), dim=-1)
    loss = opsd_token_loss(student, q, clip)
    kl = torch.clamp((pc.exp() * (pc - pw)).sum(-1), min=0.0)
    omega = kl / (kl + cw_tau) if cw_tau > 0 else torch.ones_like(kl)
    metrics = {"distill_loss": masked_mean(loss.detach(), mask), "ectr_weight": masked_mean(omega, mask)}
    return LossOutput(_finish(loss * omega, mask, tis_weights), metrics)


#: which distribution picks the top-k support for each distillation loss (docs/methods/self-distillation.md)
SUPPORT_CHOOSER = {"opsd": "teacher", "opsd_ectr": "teacher", "sdpo": "student", "srpo": "student"}


def distill_support_fields(loss_name: str, student_logits: Tensor, teacher_logits: Tensor,
                           teacher_neg_logits: Tensor | None = None, k: int = 100) -> dict:
    """The inputs (``student_topk``, ``teacher_topk``, optionally ``teacher_neg_topk``) for
    ``loss_name``, with the support chosen as that loss requires (teacher top-k for opsd and
    opsd_ectr, where the correct-hint teacher chooses and the wrong-hint teacher is gathered at the
    same indices; student top-k for sdpo and srpo). Shapes: logits [N, T, V] → [N, T, k+1]."""
    side = SUPPORT_CHOOSER.get(loss_name)
    if side is None:
        raise KeyError(f"{loss_name!r} uses no top-k support; valid: {sorted(SUPPORT_CHOOSER)}")
    extra = () if teacher_neg_logits is None else (teacher_neg_logits,)
    if side == "teacher":
        sup = topk_tail_support(teacher_logits, student_logits, *extra, k=k)
        out = {"teacher_topk": sup[0], "student_topk": sup[1]}
    else:
        sup = topk_tail_support(student_logits, teacher_logits, *extra, k=k)
        out = {"student_topk": sup[0], "teacher_topk": sup[1]}
    if extra:
        out["teacher_neg_topk"] = sup[2]
    return out


def full_entropy(logits: Tensor) -> Tensor:
    """Full-vocabulary entropy H = −Σ p log p per position, no grad (SRPO's teacher weight). [N, T, V] → [N, T]."""
    lp = torch.log_softmax(logits.detach(), dim=-1)
    return -(lp.exp() * lp).sum(-1)


def _teacher_gap(x) -> dict:
    """Diagnostic of ``teacher_logp``: Σ (teacher − student) log-prob over response tokens, per token."""
    m = x.mask
    return {"distill/teacher_minus_student": (((x.teacher_logp - x.logp.detach()) * m).sum(), m.sum())}


# the inputs of the self-distillation family (the teacher path provides them, the losses here read them);
# k+1 = top-k support plus the tail bucket (``topk_tail_support``)
register_input("teacher_logp", ("N", "T"), "float", "teacher log-prob of each sampled token (positive / GT hint)",
               diagnostic=_teacher_gap)
register_input("teacher_topk", ("N", "T", "k+1"), "float", "teacher log-probs at the top-k support")
register_input("teacher_neg_topk", ("N", "T", "k+1"), "float", "wrong-hint teacher log-probs at the top-k support")
register_input("student_topk", ("N", "T", "k+1"), "float", "current policy at the top-k support, with grad",
               policy="support", index="resp_pos")
register_input("teacher_entropy", ("N", "T"), "float", "full-vocabulary teacher entropy (SRPO)")
register_input("srpo_log_u_mean", ("N",), "float", "whole mini-batch log mean(u) on every row (SRPO's weight)")
