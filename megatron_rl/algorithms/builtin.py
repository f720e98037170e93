"""Built-in registrations (adapters from :class:`AlgoInputs` + hparams to the pure functions),
the ``algo.kind`` table and the two per-step entry points the trainer calls.

    kind = ALGO_KINDS[cfg.algo.kind]                  # (advantage, loss, hparams class)
    hp = kind.hparams(**cfg.algo.<kind>)
    need = required_inputs(kind.advantage, kind.loss, hp)   # start-up check
    adv = compute_advantages(kind_name, inputs, hp)          # once per step, full batch
    obj = compute_policy_loss(kind_name, mb_inputs, adv[mb], hp)  # per mini-batch; obj.loss.backward()

``KIND_DATA_PATH`` tells the trainer which extra data path a kind needs: ``bicc_context``
(``contrastive.build_bicc_contexts``), ``rlcsd_hints`` (``contrastive.select_rlcsd_hints`` with K
negatives; ``_ectr`` kinds use one), ``gt_teacher`` (teacher prompt from the dataset solution),
``greedy`` (one greedy rollout per prompt), ``process_reward`` (PRM scores), ``two_attempts``.
"""
from __future__ import annotations

from typing import NamedTuple

from torch import Tensor

from . import hparams as H
from .advantages import (bicc_advantage, grpo_advantage, papo_advantage, rcc_advantage, rcc_delta,
                         remax_advantage, rloo_advantage)
from .contrastive import rlcsd_advantage, rlcsd_signal
from .distill import generalized_jsd, opsd_ectr_loss, opsd_loss, sdpo_loss, srpo_loss
from .inputs import AlgoInputs
from .kl import kl_penalty
from .losses import (LossOutput, MaskedLossOutput, aggregate, plain_clip_loss, ppo_clip_loss, rlcsd_loss, rlsd_advantage,
                     rlsd_ectr_advantage, rlsd_lambda)
from .registry import (_lookup, check_inputs, get_advantage, get_policy_loss, register_advantage,
                       register_policy_loss, _ADVANTAGES, _LOSSES)
from .score import score_loss_mat, shaped_reward

# ----------------------------------------------------------------------------------- advantages


@register_advantage("grpo")
def _grpo(x: AlgoInputs, hp) -> Tensor:
    return grpo_advantage(x.rewards, x.group_ids, scale=getattr(hp, "scale", "std"), eps=getattr(hp, "eps", 1e-6))


@register_advantage("drgrpo")
def _drgrpo(x: AlgoInputs, hp) -> Tensor:
    return grpo_advantage(x.rewards, x.group_ids, scale="none")


@register_advantage("rloo")
def _rloo(x: AlgoInputs, hp) -> Tensor:
    return rloo_advantage(x.rewards, x.group_ids)


@register_advantage("remax", needs=("greedy_rewards",))
def _remax(x: AlgoInputs, hp) -> Tensor:
    return remax_advantage(x.rewards, x.greedy_rewards)


def _base_needs(hp) -> set:
    return {"greedy_rewards"} if getattr(hp, "base", None) == "remax" else set()


@register_advantage("bicc", hp_needs=_base_needs)
def _bicc(x: AlgoInputs, hp) -> Tensor:
    """BiCC changes the ratio's inputs only (spec §1.6): the advantage is the base estimator's —
    ``bicc`` (the released ±sqrt(n∓/n±) form), GRPO/DAPO (std-scaled), Dr.GRPO (unscaled), ReMax."""
    base = getattr(hp, "base", "bicc")
    if base in ("grpo", "dapo"):
        return grpo_advantage(x.rewards, x.group_ids, eps=getattr(hp, "eps", 1e-6))
    if base == "drgrpo":
        return grpo_advantage(x.rewards, x.group_ids, scale="none")
    if base == "remax":
        return remax_advantage(x.rewards, x.greedy_rewards)
    return bicc_advantage(x.rewards, x.group_ids, threshold=getattr(hp, "threshold", 0.5))


@register_advantage("rcc", needs=("old_logp", "ref_logp"), hp_needs=_base_needs)
def _rcc(x: AlgoInputs, hp) -> Tensor:
    delta = x.delta if x.delta is not None else rcc_delta(x.old_logp, x.ref_logp, x.mask, hp.rcc_delta)
    return rcc_advantage(x.rewards, delta, x.group_ids, base=hp.base, eps=hp.eps, greedy_rewards=x.greedy_rewards)


@register_advantage("papo", needs=("process",))
def _papo(x: AlgoInputs, hp) -> Tensor:
    """PAPO A_out + λ·A_proc; ablations (spec §2.4): ``prm_only`` = GRPO on r_proc (graded on every
    response), ``mult`` = GRPO on r_out·r_proc."""
    mode = getattr(hp, "reward_mode", "dual")
    if mode == "prm_only":
        return grpo_advantage(x.process, x.group_ids, eps=hp.eps)
    if mode == "mult":
        return grpo_advantage(x.rewards * x.process, x.group_ids, eps=hp.eps)
    return papo_advantage(x.rewards, x.process, x.correct, x.group_ids, lam=hp.lam, eps=hp.eps,
                          scale="none" if hp.scale == "none" else "std", process_norm=hp.process_norm)


@register_advantage("score", hp_needs=lambda hp: {"first_rewards"} if hp.stage == 2 else set())
def _score_adv(x: AlgoInputs, hp) -> Tensor:
    """Credit of attempt 2: r2 (stage I) or r̃2 = r2 + α(r2 − r1) (stage II)."""
    if hp.stage == 1:
        return x.rewards.detach()
    return shaped_reward(x.first_rewards.detach(), x.rewards.detach(), hp.alpha)

# --------------------------------------------------------------------------------------- losses


@register_policy_loss("ppo_clip", needs=("logp", "old_logp"))
def _ppo(x: AlgoInputs, adv: Tensor, hp) -> LossOutput:
    return ppo_clip_loss(x.logp, x.old_logp, adv, x.mask, clip_low=hp.clip_low, clip_high=hp.clip_high,
                         dual_clip=hp.dual_clip, tis_weights=x.tis_weights)


@register_policy_loss("rlcsd", needs=("logp", "old_logp", "teacher_logp", "teacher_neg_logp", "teacher_neg_mask"))
def _rlcsd(x: AlgoInputs, adv: Tensor, hp) -> LossOutput:
    e = rlcsd_signal(x.teacher_logp, x.teacher_neg_logp, x.teacher_neg_mask)
    mod = rlcsd_advantage(adv, e, x.mask, **hp.signal_kwargs())
    out = rlcsd_loss(x.logp, x.old_logp, adv, mod.adv_hat, mod.gate, x.mask, clip_eps=hp.clip_low,
                     eta=hp.eta, tis_weights=x.tis_weights)
    return LossOutput(out.loss_mat, {**out.metrics, "rlcsd_abs_residual": (mod.residual.abs() * x.mask).sum()
                                     / x.mask.sum().clamp_min(1)})


@register_policy_loss("opsd", needs=("student_topk", "teacher_topk"))
def _opsd(x: AlgoInputs, adv: Tensor, hp) -> LossOutput:
    return opsd_loss(x.student_topk, x.teacher_topk, x.mask, clip=hp.jsd_token_clip, tis_weights=x.tis_weights)


@register_policy_loss("sdpo", needs=("logp", "old_logp", "student_topk", "teacher_topk"))
def _sdpo(x: AlgoInputs, adv: Tensor, hp) -> LossOutput:
    return sdpo_loss(x.student_topk, x.teacher_topk, x.logp, x.old_logp, x.mask, alpha=hp.alpha,
                     is_clip=hp.is_clip, tis_weights=x.tis_weights)


@register_policy_loss("srpo", needs=("logp", "old_logp", "student_topk", "teacher_topk", "teacher_entropy"))
def _srpo(x: AlgoInputs, adv: Tensor, hp) -> LossOutput:
    jsd = generalized_jsd(x.student_topk, x.teacher_topk, hp.alpha)
    return srpo_loss(x.logp, x.old_logp, adv, x.mask, jsd, x.teacher_entropy, clip_eps=hp.clip_low,
                     dual_clip=hp.dual_clip, beta=hp.srpo_beta, is_clip=hp.is_clip, tis_weights=x.tis_weights,
                     log_u_mean=x.srpo_log_u_mean)


@register_policy_loss("rlsd", needs=("logp", "old_logp", "teacher_logp"))
def _rlsd(x: AlgoInputs, adv: Tensor, hp) -> LossOutput:
    lam = rlsd_lambda(x.step, hp.lam, hp.lam_decay_steps, hp.lam_decay)
    a_hat = rlsd_advantage(adv, x.teacher_logp, x.logp, lam=lam, eps_w=hp.eps_w)
    return plain_clip_loss(x.logp, x.old_logp, a_hat, x.mask, clip_eps=hp.clip_low, tis_weights=x.tis_weights)


@register_policy_loss("rlsd_ectr", needs=("logp", "old_logp", "teacher_logp", "teacher_neg_logp"))
def _rlsd_ectr(x: AlgoInputs, adv: Tensor, hp) -> LossOutput:
    lam = rlsd_lambda(x.step, hp.lam, hp.lam_decay_steps, hp.lam_decay)
    a_hat = rlsd_ectr_advantage(adv, x.teacher_logp, x.teacher_neg_logp[:, 0], lam=lam, eps_w=hp.eps_w)
    return plain_clip_loss(x.logp, x.old_logp, a_hat, x.mask, clip_eps=hp.clip_low, tis_weights=x.tis_weights)


@register_policy_loss("opsd_ectr", needs=("student_topk", "teacher_topk", "teacher_neg_topk"))
def _opsd_ectr(x: AlgoInputs, adv: Tensor, hp) -> LossOutput:
    return opsd_ectr_loss(x.student_topk, x.teacher_topk, x.teacher_neg_topk, x.mask, alpha=hp.alpha,
                          log_w_floor=hp.log_w_floor, cw_tau=hp.cw_tau, clip=hp.jsd_token_clip,
                          tis_weights=x.tis_weights)


@register_policy_loss("score", needs=("logp", "ref_logp", "first_logp", "first_ref_logp", "first_mask",
                                      "first_rewards"))
def _score(x: AlgoInputs, adv: Tensor, hp) -> MaskedLossOutput:
    """``adv`` is attempt 2's credit from the "score" advantage (r2 or r̃2); r1 = first_rewards."""
    out = score_loss_mat(hp.stage, x.first_logp, x.first_ref_logp, x.first_mask, x.logp, x.ref_logp, x.mask,
                         x.first_rewards, adv, beta1=hp.beta1, beta2=hp.beta2, length_norm=hp.length_norm,
                         max_new=(hp.max_new_attempt1, hp.max_new_attempt2))
    return MaskedLossOutput(out.loss_mat, out.metrics, out.mask)

# ------------------------------------------------------------------------------------ algo kinds


class AlgoKind(NamedTuple):
    """advantage name, policy-loss name, hyper-parameter dataclass."""

    advantage: str
    loss: str
    hparams: type


ALGO_KINDS = {
    "grpo": AlgoKind("grpo", "ppo_clip", H.GRPOHParams),
    "dapo": AlgoKind("grpo", "ppo_clip", H.DAPOHParams),
    "drgrpo": AlgoKind("drgrpo", "ppo_clip", H.DrGRPOHParams),
    "remax": AlgoKind("remax", "ppo_clip", H.ReMaxHParams),
    "rloo": AlgoKind("rloo", "ppo_clip", H.RLOOHParams),
    "bicc": AlgoKind("bicc", "ppo_clip", H.BiCCHParams),
    "bicc_rcc": AlgoKind("rcc", "ppo_clip", H.BiCCRCCHParams),
    "rlcsd": AlgoKind("grpo", "rlcsd", H.RLCSDHParams),
    "opsd": AlgoKind("grpo", "opsd", H.OPSDHParams),
    "sdpo": AlgoKind("grpo", "sdpo", H.SDPOHParams),
    "srpo": AlgoKind("grpo", "srpo", H.SRPOHParams),
    "rlsd": AlgoKind("grpo", "rlsd", H.RLSDHParams),
    "opsd_ectr": AlgoKind("grpo", "opsd_ectr", H.OPSDECTRHParams),
    "rlsd_ectr": AlgoKind("grpo", "rlsd_ectr", H.RLSDECTRHParams),
    "papo": AlgoKind("papo", "ppo_clip", H.PAPOHParams),
    "score": AlgoKind("score", "score", H.ScoreHParams),
}

KIND_DATA_PATH = {
    "bicc": "bicc_context", "bicc_rcc": "bicc_context", "rlcsd": "rlcsd_hints", "opsd_ectr": "rlcsd_hints",
    "rlsd_ectr": "rlcsd_hints", "opsd": "gt_teacher", "sdpo": "gt_teacher", "srpo": "gt_teacher",
    "rlsd": "gt_teacher", "remax": "greedy", "papo": "process_reward", "score": "two_attempts",
}


def algo_kind(name: str) -> AlgoKind:
    """Look up a kind (KeyError listing the valid kinds)."""
    if name not in ALGO_KINDS:
        raise KeyError(f"unknown algo kind {name!r}; valid: {sorted(ALGO_KINDS)}")
    return ALGO_KINDS[name]


def kind_required_inputs(name: str, hp=None) -> set:
    """Optional inputs a kind needs, including ``ref_logp`` when its KL loss is on."""
    k = algo_kind(name)
    hp = hp if hp is not None else k.hparams()
    need = _lookup(_ADVANTAGES, "advantage", k.advantage).needs_for(hp) | \
        _lookup(_LOSSES, "policy loss", k.loss).needs_for(hp)
    if getattr(hp, "kl_loss_coef", 0.0) > 0:
        need |= {"logp", "ref_logp"}
    return need


def compute_advantages(name: str, inputs: AlgoInputs, hp=None) -> Tensor:
    """Per-sample advantages [N] of kind ``name`` (checks the advantage's inputs first)."""
    k = algo_kind(name)
    hp = hp if hp is not None else k.hparams()
    check_inputs(inputs, _lookup(_ADVANTAGES, "advantage", k.advantage).needs_for(hp), f"advantage {k.advantage!r}")
    return get_advantage(k.advantage)(inputs, hp)


class PolicyObjective(NamedTuple):
    """loss: scalar to backward; pg_loss / kl_loss: its parts; metrics: 0-d tensors."""

    loss: Tensor
    pg_loss: Tensor
    kl_loss: Tensor
    metrics: dict


def compute_policy_loss(name: str, inputs: AlgoInputs, advantages: Tensor, hp=None) -> PolicyObjective:
    """Registered loss → ``aggregate`` with ``hp.loss_agg_mode`` → + β·KL (same mode; token-mean
    for self-normalised ``token-sum`` losses)."""
    k = algo_kind(name)
    hp = hp if hp is not None else k.hparams()
    need = _lookup(_LOSSES, "policy loss", k.loss).needs_for(hp)
    if hp.kl_loss_coef > 0:
        need |= {"logp", "ref_logp"}
    check_inputs(inputs, need, f"policy loss {k.loss!r}")
    out = get_policy_loss(k.loss)(inputs, advantages, hp)
    mask = getattr(out, "mask", None)
    mask = inputs.mask if mask is None else mask
    pg = aggregate(out.loss_mat, mask, hp.loss_agg_mode, scale_factor=hp.loss_scale_factor)
    kl = pg.new_zeros(())
    if hp.kl_loss_coef > 0:
        mode = "token-mean" if hp.loss_agg_mode == "token-sum" else hp.loss_agg_mode
        kl = aggregate(kl_penalty(inputs.logp, inputs.ref_logp, hp.kl_loss_type), inputs.mask, mode,
                       scale_factor=hp.loss_scale_factor)
    metrics = {**out.metrics, "pg_loss": pg.detach(), "kl_loss": kl.detach()}
    return PolicyObjective(pg + hp.kl_loss_coef * kl, pg, kl, metrics)


__all__ = ["ALGO_KINDS", "AlgoKind", "KIND_DATA_PATH", "PolicyObjective", "algo_kind", "compute_advantages",
           "compute_policy_loss", "kind_required_inputs"]
