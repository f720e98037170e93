"""Built-in registrations (adapters from :class:`AlgoInputs` + hparams to the pure functions),
the ``algo.kind`` table and the two per-step entry points the trainer calls.

    kind = ALGO_KINDS[cfg.algo.kind]                  # (advantage, loss, hparams class)
    hp = kind.hparams(**cfg.algo.<kind>)
    need = required_inputs(kind.advantage, kind.loss, hp)   # start-up check
    adv = compute_advantages(kind_name, inputs, hp)          # once per step, full batch
    obj = compute_policy_loss(kind_name, mb_inputs, adv[mb], hp)  # per mini-batch; obj.loss.backward()

Each kind declares the trainer data path it runs on (``AlgoKind.path``: ``plain``, ``greedy``,
``bicc_context``, ``process_reward``, ``rlcsd_hints``, ``gt_teacher``, ``two_attempts``; the classes are
registered in ``megatron_rl/trainer/paths/``). ``register_algo_kind`` adds a method.
"""
from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor

from . import hparams as H
from .advantages import (
    bicc_advantage,
    grpo_advantage,
    papo_advantage,
    rcc_advantage,
    rcc_delta,
    remax_advantage,
    rloo_advantage,
)
from .contrastive import rlcsd_advantage, rlcsd_signal
from .distill import (
    SUPPORT_CHOOSER,
    generalized_jsd,
    opsd_ectr_loss,
    opsd_loss,
    sdpo_loss,
    srpo_log_u_mean,
    srpo_loss,
)
from .inputs import AlgoInputs
from .losses import (
    LossOutput,
    MaskedLossOutput,
    masked_mean,
    plain_clip_loss,
    ppo_clip_loss,
    rlcsd_loss,
    rlsd_advantage,
    rlsd_ectr_advantage,
    rlsd_lambda,
)
from .registry import (
    _ADVANTAGES,
    _LOSSES,
    _lookup,
    bicc_base,
    check_inputs,
    get_advantage,
    register_advantage,
    register_bicc_base,
    register_policy_loss,
)
from .score import score_loss_mat, shaped_reward

# ----------------------------------------------------------------------------------- advantages


@register_advantage("grpo")
def _grpo(x: AlgoInputs, hp) -> Tensor:
    """GRPO's knobs (``scale``, ``eps``) when the method's hparams are GRPO's; the paper's defaults for
    the methods that reuse the estimator with their own hparams (the self-distillation family)."""
    if isinstance(hp, H.GRPOHParams):
        return grpo_advantage(x.rewards, x.group_ids, scale=hp.scale, eps=hp.eps)
    return grpo_advantage(x.rewards, x.group_ids)


@register_advantage("drgrpo")
def _drgrpo(x: AlgoInputs, hp) -> Tensor:
    return grpo_advantage(x.rewards, x.group_ids, scale="none")


@register_advantage("rloo")
def _rloo(x: AlgoInputs, hp) -> Tensor:
    return rloo_advantage(x.rewards, x.group_ids)


@register_advantage("remax", needs=("greedy_rewards",))
def _remax(x: AlgoInputs, hp) -> Tensor:
    return remax_advantage(x.rewards, x.greedy_rewards)


# BiCC's base estimators (docs/methods/bicc-rcc.md): ``algo.bicc.base`` / ``algo.bicc_rcc.base`` name one of these


@register_bicc_base("grpo", scale="std_u")
@register_bicc_base("dapo", scale="std_u")
def _base_grpo(x: AlgoInputs, hp) -> Tensor:
    return grpo_advantage(x.rewards, x.group_ids, eps=hp.eps if isinstance(hp, H.BiCCRCCHParams) else 1e-6)


@register_bicc_base("drgrpo", scale="one")
def _base_drgrpo(x: AlgoInputs, hp) -> Tensor:
    return grpo_advantage(x.rewards, x.group_ids, scale="none")


@register_bicc_base("remax", scale="greedy", needs=("greedy_rewards",))
def _base_remax(x: AlgoInputs, hp) -> Tensor:
    return remax_advantage(x.rewards, x.greedy_rewards)


@register_bicc_base("bicc", scale="std_p")
def _base_bicc(x: AlgoInputs, hp) -> Tensor:
    """The released code's ±sqrt(n∓/n±) form."""
    return bicc_advantage(x.rewards, x.group_ids, threshold=hp.threshold)


def _base_needs(hp) -> set:
    return set(bicc_base(hp.base).needs) if isinstance(hp, H.BiCCHParams) else set()


@register_advantage("bicc", hp_needs=_base_needs)
def _bicc(x: AlgoInputs, hp) -> Tensor:
    """BiCC changes the ratio's inputs only (docs/methods/bicc-rcc.md): the advantage is the base estimator's
    (``register_bicc_base``)."""
    return bicc_base(hp.base).fn(x, hp)


@register_advantage("rcc", needs=("old_logp", "ref_logp"), hp_needs=_base_needs)
def _rcc(x: AlgoInputs, hp) -> Tensor:
    delta = x.delta if x.delta is not None else rcc_delta(x.old_logp, x.ref_logp, x.mask, hp.rcc_delta)
    return rcc_advantage(x.rewards, delta, x.group_ids, base=hp.base, eps=hp.eps, greedy_rewards=x.greedy_rewards)


@register_advantage("papo", needs=("process",))
def _papo(x: AlgoInputs, hp) -> Tensor:
    """PAPO A_out + λ·A_proc; ablations (docs/methods/papo.md): ``prm_only`` = GRPO on r_proc (graded on every
    response), ``mult`` = GRPO on r_out·r_proc."""
    mode = hp.reward_mode
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


def rlcsd_counts(ex: dict, hp) -> tuple[float, float]:
    """(N_non, N_sel) of a whole mini-batch (docs/methods/self-distillation.md: "compute the two denominators over the whole
    mini-batch"), from its per-row teacher tensors and advantages (no grad)."""
    e = rlcsd_signal(ex["teacher_logp"], ex["teacher_neg_logp"], ex["teacher_neg_mask"])
    mod = rlcsd_advantage(ex["advantages"], e, ex["resp_mask"], **hp.signal_kwargs())
    m = ex["resp_mask"] > 0
    return float((m & ~mod.gate).sum()), float((m & mod.gate).sum())


def _rlcsd_counts_field(ex: dict, hp) -> Tensor:
    """The ``rlcsd_counts`` field: (N_non, N_sel) repeated on every row, ``[N, 2]``."""
    return torch.tensor(rlcsd_counts(ex, hp), dtype=torch.float32).expand(ex["resp_mask"].shape[0], 2).clone()


def _srpo_field(ex: dict, hp) -> Tensor:
    """The ``srpo_log_u_mean`` field: log mean(u) over the whole mini-batch's routed tokens, so
    d = u / mean(u) does not depend on the micro-batch split."""
    lum = srpo_log_u_mean(ex["advantages"], ex["resp_mask"], ex["teacher_entropy"], hp.srpo_beta)
    return lum.expand(ex["resp_mask"].shape[0]).clone()


@register_policy_loss("rlcsd", needs=("logp", "old_logp", "teacher_logp", "teacher_neg_logp", "teacher_neg_mask"),
                      batch_stats={"rlcsd_counts": _rlcsd_counts_field})
def _rlcsd(x: AlgoInputs, adv: Tensor, hp) -> LossOutput:
    """Aggregate with ``token-sum``: the matrix carries its own normalisers, the whole mini-batch's
    (N_non, N_sel) when the trainer passes ``rlcsd_counts`` (else counted over ``x``)."""
    e = rlcsd_signal(x.teacher_logp, x.teacher_neg_logp, x.teacher_neg_mask)
    mod = rlcsd_advantage(adv, e, x.mask, **hp.signal_kwargs())
    counts = None if x.rlcsd_counts is None else (x.rlcsd_counts[0, 0], x.rlcsd_counts[0, 1])
    out = rlcsd_loss(x.logp, x.old_logp, adv, mod.adv_hat, mod.gate, x.mask, clip_eps=hp.clip_low,
                     eta=hp.eta, tis_weights=x.tis_weights, counts=counts)
    return LossOutput(out.loss_mat, {"rlcsd_sel_frac": out.metrics["rlcsd_sel_frac"],
                                     "rlcsd_abs_residual": masked_mean(mod.residual.abs(), x.mask).detach()})


def _support_metrics(x: AlgoInputs, alpha: float) -> dict:
    """Diagnostics on the top-k support: forward KL(teacher‖student) and the α-JSD, token means."""
    t, s = x.teacher_topk, x.student_topk.detach()
    fkl = (t.exp() * (t - s)).sum(-1)
    return {"distill/fkl_support": masked_mean(fkl, x.mask).detach(),
            "distill/jsd_support": masked_mean(generalized_jsd(s, t, alpha), x.mask).detach()}


def _with_support(out, x: AlgoInputs, alpha: float):
    return type(out)(out.loss_mat, {**out.metrics, **_support_metrics(x, alpha)}, *out[2:])


@register_policy_loss("opsd", needs=("student_topk", "teacher_topk"), support=SUPPORT_CHOOSER["opsd"])
def _opsd(x: AlgoInputs, adv: Tensor, hp) -> LossOutput:
    out = opsd_loss(x.student_topk, x.teacher_topk, x.mask, clip=hp.jsd_token_clip, tis_weights=x.tis_weights)
    return _with_support(out, x, 0.5)


@register_policy_loss("sdpo", needs=("logp", "old_logp", "student_topk", "teacher_topk"), support=SUPPORT_CHOOSER["sdpo"])
def _sdpo(x: AlgoInputs, adv: Tensor, hp) -> LossOutput:
    out = sdpo_loss(x.student_topk, x.teacher_topk, x.logp, x.old_logp, x.mask, alpha=hp.alpha,
                    is_clip=hp.is_clip, tis_weights=x.tis_weights)
    return _with_support(out, x, hp.alpha)


@register_policy_loss("srpo", needs=("logp", "old_logp", "student_topk", "teacher_topk", "teacher_entropy"),
                      support=SUPPORT_CHOOSER["srpo"], batch_stats={"srpo_log_u_mean": _srpo_field})
def _srpo(x: AlgoInputs, adv: Tensor, hp) -> LossOutput:
    jsd = generalized_jsd(x.student_topk, x.teacher_topk, hp.alpha)
    out = srpo_loss(x.logp, x.old_logp, adv, x.mask, jsd, x.teacher_entropy, clip_eps=hp.clip_low,
                    dual_clip=hp.dual_clip, beta=hp.srpo_beta, is_clip=hp.is_clip, tis_weights=x.tis_weights,
                    log_u_mean=x.srpo_log_u_mean)
    return _with_support(out, x, hp.alpha)


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


@register_policy_loss("opsd_ectr", needs=("student_topk", "teacher_topk", "teacher_neg_topk"),
                      support=SUPPORT_CHOOSER["opsd_ectr"])
def _opsd_ectr(x: AlgoInputs, adv: Tensor, hp) -> LossOutput:
    out = opsd_ectr_loss(x.student_topk, x.teacher_topk, x.teacher_neg_topk, x.mask, alpha=hp.alpha,
                         log_w_floor=hp.log_w_floor, cw_tau=hp.cw_tau, clip=hp.jsd_token_clip,
                         tis_weights=x.tis_weights)
    return _with_support(out, x, 0.5)


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
    """advantage name, policy-loss name, hyper-parameter dataclass, trainer data path name, and
    whether the update compares the samples of a prompt's group (a group-relative advantage that the
    loss reads, or a contrast drawn from the group): such a kind learns nothing with ``rollout.n=1``."""

    advantage: str
    loss: str
    hparams: type
    path: str = "plain"
    needs_group: bool = True


ALGO_KINDS: dict = {}


def register_algo_kind(name: str, advantage: str, loss: str, hparams: type, path: str = "plain",
                       needs_group: bool = True) -> AlgoKind:
    """Add a method: ``algo.kind=name`` trains ``loss`` on ``advantage`` with ``hparams`` (a frozen
    dataclass deriving from :class:`~.hparams.PPOHParams`, configured as ``algo.<name>.*``) on the
    trainer data path ``path``. ``needs_group=False`` declares that one sample per prompt suffices
    (``rollout.n=1`` is refused at start-up otherwise: see :class:`AlgoKind`). Strict: a second registration of ``name``, an unknown advantage or
    loss, or hparams that are not PPOHParams raise here; an unknown path fails at config load."""
    if name in ALGO_KINDS:
        raise ValueError(f"algo kind {name!r} is already registered ({ALGO_KINDS[name]})")
    _lookup(_ADVANTAGES, "advantage", advantage)
    _lookup(_LOSSES, "policy loss", loss)
    if not (isinstance(hparams, type) and issubclass(hparams, H.PPOHParams)):
        raise TypeError(f"algo kind {name!r}: hparams must be a PPOHParams dataclass, got {hparams!r}")
    ALGO_KINDS[name] = AlgoKind(advantage, loss, hparams, path, bool(needs_group))
    return ALGO_KINDS[name]


for _name, _kind in {
    "grpo": AlgoKind("grpo", "ppo_clip", H.GRPOHParams),
    "dapo": AlgoKind("grpo", "ppo_clip", H.DAPOHParams),
    "drgrpo": AlgoKind("drgrpo", "ppo_clip", H.DrGRPOHParams),
    "remax": AlgoKind("remax", "ppo_clip", H.ReMaxHParams, "greedy", needs_group=False),
    "rloo": AlgoKind("rloo", "ppo_clip", H.RLOOHParams),
    "bicc": AlgoKind("bicc", "ppo_clip", H.BiCCHParams, "bicc_context"),
    "bicc_rcc": AlgoKind("rcc", "ppo_clip", H.BiCCRCCHParams, "bicc_context"),
    "rlcsd": AlgoKind("grpo", "rlcsd", H.RLCSDHParams, "rlcsd_hints"),
    "opsd": AlgoKind("grpo", "opsd", H.OPSDHParams, "gt_teacher", needs_group=False),
    "sdpo": AlgoKind("grpo", "sdpo", H.SDPOHParams, "gt_teacher", needs_group=False),
    "srpo": AlgoKind("grpo", "srpo", H.SRPOHParams, "gt_teacher"),
    "rlsd": AlgoKind("grpo", "rlsd", H.RLSDHParams, "gt_teacher"),
    "opsd_ectr": AlgoKind("grpo", "opsd_ectr", H.OPSDECTRHParams, "rlcsd_hints"),
    "rlsd_ectr": AlgoKind("grpo", "rlsd_ectr", H.RLSDECTRHParams, "rlcsd_hints"),
    "papo": AlgoKind("papo", "ppo_clip", H.PAPOHParams, "process_reward"),
    "score": AlgoKind("score", "score", H.ScoreHParams, "two_attempts", needs_group=False),
}.items():
    register_algo_kind(_name, *_kind)


def single_sample_kinds() -> list[str]:
    """The registered kinds that train with one sample per prompt (``needs_group=False``), sorted."""
    return sorted(k for k, v in ALGO_KINDS.items() if not v.needs_group)


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
    if hp.kl_loss_coef > 0:
        need |= {"logp", "ref_logp"}
    if hp.kl_reward_coef > 0:
        need |= {"ref_logp"}
    return need


def compute_advantages(name: str, inputs: AlgoInputs, hp=None) -> Tensor:
    """Per-sample advantages [N] of kind ``name`` (checks the advantage's inputs first)."""
    k = algo_kind(name)
    hp = hp if hp is not None else k.hparams()
    check_inputs(inputs, _lookup(_ADVANTAGES, "advantage", k.advantage).needs_for(hp), f"advantage {k.advantage!r}")
    return get_advantage(k.advantage)(inputs, hp)


__all__ = ["ALGO_KINDS", "AlgoKind", "algo_kind", "compute_advantages", "kind_required_inputs", "register_algo_kind"]
