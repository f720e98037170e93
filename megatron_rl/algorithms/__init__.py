"""megatron_rl.algorithms — advantages, policy losses, KL, contrastive inputs (torch + stdlib only).

Public functions (1-D tensors are per sample [N]; [N, T] per token; ``group_ids`` int [N]):

    grpo_advantage(rewards, group_ids, *, scale="std", eps=1e-6)      -> [N]
    rloo_advantage(rewards, group_ids)                                -> [N]
    remax_advantage(rewards, greedy_rewards)                          -> [N]
    bicc_advantage(rewards, group_ids)                                -> [N]
    rcc_advantage(rewards, delta, group_ids, *, base="grpo")          -> [N]
    papo_advantage(outcome, process, correct, group_ids, *, lam=1.0, eps=1e-6) -> [N]
    ppo_clip_loss(logp, old_logp, advantages, mask, *, clip_low=0.2, clip_high=0.2, dual_clip=None)
                                                                      -> LossOutput(loss_mat [N, T], metrics)
    aggregate(loss_mat, mask, mode)                                   -> scalar
    kl_penalty(logp, ref_logp, kind)                                  -> [N, T]
    k3_log_ratio(logp - old_logp)                                     -> [N, T] (e^Δ − 1 − Δ, the approx_kl metric)
    rlcsd_signal(pos_logp [N,T], neg_logp [N,K,T], neg_mask [N,K])    -> e [N, T]
    rlcsd_advantage(adv, signal, mask, **hparams)                     -> RLCSDAdvantage(advantages, adv_hat, gate, residual)

Trainer interface (stable):

* ``ALGO_KINDS[kind] -> AlgoKind(advantage, loss, hparams)`` for grpo, dapo, drgrpo, remax, rloo,
  bicc, bicc_rcc (``base``: an estimator registered by ``register_bicc_base``), rlcsd, opsd, sdpo, srpo, rlsd,
  opsd_ectr, rlsd_ectr, papo, score, gspo, cispo; ``ALGO_KINDS[kind].path`` names its trainer data path;
  ``register_algo_kind(name, advantage, loss, hparams, path, needs_group=True)`` adds a method
  (``needs_group=False``: it learns from one sample per prompt, ``single_sample_kinds()``).
* Inputs: ``register_input(name, shape, dtype)`` declares a named per-step input (its producer —
  a data path, a plugin — lists it in its ``provides``, its readers in their ``needs``);
  ``input_spec(name)``, ``input_names()``.
* One frozen :class:`AlgoInputs` bundle per step / mini-batch (a mapping of the registered inputs
  it holds; ``x.<name>`` is the value or None). Registered functions:
  advantage ``fn(inputs, hp) -> Tensor[N]``; loss ``fn(inputs, advantages, hp) -> LossOutput``
  (``loss_mat`` [N, T], ``metrics`` of 0-d tensors) or ``MaskedLossOutput`` (adds the ``mask`` to
  aggregate with, when the token axis differs, e.g. SCoRe's [y1 | y2]); aggregation is
  separate (``aggregate``). ``compute_advantages(kind, inputs, hp)`` and
  ``compute_policy_loss(kind, inputs, adv, hp) -> PolicyObjective(loss, pg_loss, kl_loss, metrics)``
  wrap lookup, input checks, aggregation and the KL-loss term.
* ``register_advantage(name, needs=...)`` / ``register_policy_loss(name, needs=...)`` (duplicates
  raise), ``get_advantage`` / ``get_policy_loss`` (unknown names raise listing the sorted valid
  names), ``advantage_names()``, ``policy_loss_names()``, ``required_inputs(adv, loss, hp=None)``,
  ``kind_required_inputs(kind, hp)`` (adds ``ref_logp`` when the KL loss is on).
* Data-path helpers: ``dapo_overlong_penalty``, ``dynamic_sampling_keep``, ``DynamicSampler``,
  ``build_bicc_contexts``, ``bicc_old_logp``, ``select_rlcsd_hints``, ``rlcsd_teacher_prompt``,
  ``topk_tail_support`` / ``distill_support_fields`` (the right top-k chooser per loss),
  ``full_entropy``, ``first_eos_mask``.

Each module's docstring lists where it departs from the reference code and why.
"""
from .advantages import (
    PAPOAdvantage,
    ReMaxTokenAdvantage,
    bicc_advantage,
    drgrpo_advantage,
    grpo_advantage,
    papo_advantage,
    papo_components,
    rcc_advantage,
    rcc_delta,
    remax_advantage,
    remax_token_advantage,
    rloo_advantage,
)
from .builtin import (
    ALGO_KINDS,
    AlgoKind,
    algo_kind,
    compute_advantages,
    kind_required_inputs,
    register_algo_kind,
    single_sample_kinds,
)
from .cispo import CISPOHParams, cispo_loss
from .contrastive import (
    BiCCBatch,
    BiCCSample,
    HintAssignment,
    HintSelection,
    RLCSDAdvantage,
    bicc_old_logp,
    build_bicc_contexts,
    hint_answer,
    last_boxed,
    rlcsd_advantage,
    rlcsd_signal,
    rlcsd_teacher_prompt,
    select_rlcsd_hints,
    student_prompt,
)
from .dapo import DynamicSampler, dapo_overlong_penalty, dynamic_sampling_keep
from .distill import (
    SUPPORT_CHOOSER,
    distill_support_fields,
    full_entropy,
    generalized_jsd,
    opsd_ectr_loss,
    opsd_loss,
    opsd_token_loss,
    sdpo_loss,
    srpo_log_u_mean,
    srpo_loss,
    srpo_routes,
    topk_tail_support,
)
from .gspo import GSPOHParams, gspo_loss, sequence_log_ratio
from .hparams import (
    BiCCHParams,
    BiCCRCCHParams,
    DAPOHParams,
    DrGRPOHParams,
    GRPOHParams,
    OPSDECTRHParams,
    OPSDHParams,
    PAPOHParams,
    PPOHParams,
    ReMaxHParams,
    RLCSDHParams,
    RLOOHParams,
    RLSDECTRHParams,
    RLSDHParams,
    ScoreHParams,
    SDPOHParams,
    SRPOHParams,
)
from .inputs import AlgoInputs, InputSpec, input_names, input_spec, register_input
from .kl import AdaptiveKLController, apply_kl_in_reward, k3_log_ratio, kl_penalty
from .losses import (
    AGG_MODES,
    LossOutput,
    MaskedLossOutput,
    PartialLoss,
    RLCSDPaths,
    aggregate,
    finish_aggregate,
    partial_aggregate,
    plain_clip_loss,
    ppo_clip_loss,
    rlcsd_loss,
    rlcsd_paths,
    rlsd_advantage,
    rlsd_ectr_advantage,
    rlsd_lambda,
    tis_weights,
)
from .objective import (
    ObjectiveTerms,
    PolicyObjective,
    compute_policy_loss,
    loss_needs,
    objective_terms,
)
from .registry import (
    BiCCBase,
    advantage_names,
    bicc_base,
    bicc_base_names,
    check_inputs,
    get_advantage,
    get_policy_loss,
    loss_batch_stats,
    loss_inputs,
    loss_support,
    policy_loss_names,
    register_advantage,
    register_bicc_base,
    register_policy_loss,
    required_inputs,
)
from .score import (
    first_eos_mask,
    score_k3,
    score_loss_mat,
    score_stage1_loss,
    score_stage2_loss,
    shaped_reward,
)

__all__ = [
    "AGG_MODES",
    "ALGO_KINDS",
    "SUPPORT_CHOOSER",
    "AdaptiveKLController",
    "AlgoInputs",
    "AlgoKind",
    "BiCCBase",
    "BiCCBatch",
    "BiCCHParams",
    "BiCCRCCHParams",
    "BiCCSample",
    "CISPOHParams",
    "DAPOHParams",
    "DrGRPOHParams",
    "DynamicSampler",
    "GRPOHParams",
    "GSPOHParams",
    "HintAssignment",
    "HintSelection",
    "InputSpec",
    "LossOutput",
    "MaskedLossOutput",
    "OPSDECTRHParams",
    "OPSDHParams",
    "ObjectiveTerms",
    "PAPOAdvantage",
    "PAPOHParams",
    "PPOHParams",
    "PartialLoss",
    "PolicyObjective",
    "RLCSDAdvantage",
    "RLCSDHParams",
    "RLCSDPaths",
    "RLOOHParams",
    "RLSDECTRHParams",
    "RLSDHParams",
    "ReMaxHParams",
    "ReMaxTokenAdvantage",
    "SDPOHParams",
    "SRPOHParams",
    "ScoreHParams",
    "advantage_names",
    "aggregate",
    "algo_kind",
    "apply_kl_in_reward",
    "bicc_advantage",
    "bicc_base",
    "bicc_base_names",
    "bicc_old_logp",
    "build_bicc_contexts",
    "check_inputs",
    "cispo_loss",
    "compute_advantages",
    "compute_policy_loss",
    "dapo_overlong_penalty",
    "distill_support_fields",
    "drgrpo_advantage",
    "dynamic_sampling_keep",
    "finish_aggregate",
    "first_eos_mask",
    "full_entropy",
    "generalized_jsd",
    "get_advantage",
    "get_policy_loss",
    "grpo_advantage",
    "gspo_loss",
    "hint_answer",
    "input_names",
    "input_spec",
    "k3_log_ratio",
    "kind_required_inputs",
    "kl_penalty",
    "last_boxed",
    "loss_batch_stats",
    "loss_inputs",
    "loss_needs",
    "loss_support",
    "objective_terms",
    "opsd_ectr_loss",
    "opsd_loss",
    "opsd_token_loss",
    "papo_advantage",
    "papo_components",
    "partial_aggregate",
    "plain_clip_loss",
    "policy_loss_names",
    "ppo_clip_loss",
    "rcc_advantage",
    "rcc_delta",
    "register_advantage",
    "register_algo_kind",
    "register_bicc_base",
    "register_input",
    "register_policy_loss",
    "remax_advantage",
    "remax_token_advantage",
    "required_inputs",
    "rlcsd_advantage",
    "rlcsd_loss",
    "rlcsd_paths",
    "rlcsd_signal",
    "rlcsd_teacher_prompt",
    "rloo_advantage",
    "rlsd_advantage",
    "rlsd_ectr_advantage",
    "rlsd_lambda",
    "score_k3",
    "score_loss_mat",
    "score_stage1_loss",
    "score_stage2_loss",
    "sdpo_loss",
    "select_rlcsd_hints",
    "sequence_log_ratio",
    "shaped_reward",
    "single_sample_kinds",
    "srpo_log_u_mean",
    "srpo_loss",
    "srpo_routes",
    "student_prompt",
    "tis_weights",
    "topk_tail_support",
]
