"""The plan of a run config (``megatron-rl plan --config run.yaml``): which plan inputs a config decides.

:func:`config_inputs` reads from a loaded run config the :class:`~megatron_rl.planning.memory.PlanInputs` fields
the config decides::

    tp, pp, vpp, cp, sequence_parallel   parallel.*
    dist_opt                    optim.use_distributed_optimizer
    dtype                       model.bf16 (bf16, else fp32)
    max_tokens_per_micro_batch  trainer.max_tokens_per_micro_batch (the token budget; 0 = padded)
    micro_batch                 trainer.micro_batch_size (null: 32) when padded; unset with a budget
    seq_len                     data.max_prompt_len + rollout.max_tokens (one training sequence)
    max_model_len               rollout.max_model_len (the budget's floor)
    colocated                   rollout.placement == colocated (``--separate`` contradicting it is refused)
    offload                     trainer.offload
    rollout_engines             rollout.num_engines
    rollout_tp                  rollout.tensor_parallel_size
    rollout_mem_util            rollout.gpu_memory_utilization (null: the placement's auto share)
    recompute, recompute_method, recompute_num_layers   model.recompute*
    reference                   the method needs reference log-probs (its KL loss / in-reward KL is on) and
                                lora.enable is off (LoRA's reference is the policy with its adapters off: no copy)
    lora_rank, lora_targets     lora.rank, lora.target_modules when lora.enable (else rank 0: full fine-tuning)
    teacher_shadow              the method's teacher_mode is snapshot or ema (an fp32 copy, trainer/paths/teacher/weights.py)
    fused_swiglu                true: a GPU build fuses SwiGLU (models/provider.py cuda_fusions)
    top_k, top_p, min_p         rollout.top_k / top_p / min_p (the sampling distribution μ the trainer scores)
    ratio_space                 algo.ratio_space
    attention                   model.backend: te -> flash, local -> local; auto is left to ``--attention``
                                (flash by default: auto builds TE where it imports on the GPU machine)

The rest (``--model``, ``--dp``: the world size is the launcher's, ``--rollout-seqs``,
``--extra-weight-copies``) stay command-line options: each 7B–14B example
names them in its header's ``megatron-rl plan --config ...`` line. A flag that contradicts the
config is refused (one line naming both). The layout table of docs/plan-and-memory.md is rendered from those header
lines by ``tools/example_plans.py`` (a documentation generator, outside the package).
The command (``cli/plan.py``) loads and checks the config as ``train`` does (``load_checked``: the trainer's
start-up rules) and hands it here, so this module sits below the trainer. Loading a config imports torch
(config validation); plan without ``--config`` does not.
"""
from __future__ import annotations

from typing import Any

#: PlanInputs field -> the config key it comes from (for messages)
KEYS = {"tp": "parallel.tp", "pp": "parallel.pp", "vpp": "parallel.vpp", "cp": "parallel.cp", "sequence_parallel": "parallel.sequence_parallel",
        "dist_opt": "optim.use_distributed_optimizer", "dtype": "model.bf16", "micro_batch": "trainer.micro_batch_size",
        "max_tokens_per_micro_batch": "trainer.max_tokens_per_micro_batch", "max_model_len": "rollout.max_model_len",
        "seq_len": "data.max_prompt_len + rollout.max_tokens", "colocated": "rollout.placement",
        "offload": "trainer.offload", "rollout_engines": "rollout.num_engines",
        "rollout_tp": "rollout.tensor_parallel_size", "rollout_mem_util": "rollout.gpu_memory_utilization",
        "recompute": "model.recompute", "recompute_method": "model.recompute_method",
        "recompute_num_layers": "model.recompute_num_layers", "reference": "algo.<kind> (its KL needs a reference)",
        "teacher_shadow": "algo.<kind>.teacher_mode", "fused_swiglu": "the GPU build (fused SwiGLU)",
        "attention": "model.backend", "top_k": "rollout.top_k", "top_p": "rollout.top_p", "min_p": "rollout.min_p",
        "ratio_space": "algo.ratio_space", "lora_rank": "lora.rank (lora.enable)", "lora_targets": "lora.target_modules"}


def config_inputs(cfg) -> dict[str, Any]:
    """The PlanInputs fields that the loaded run config ``cfg`` decides (module docstring)."""
    from megatron_rl.algorithms import (
        kind_required_inputs,  # lazy: defers torch to the call
    )
    from megatron_rl.rollout.placement import (
        engine_memory_utilization,  # lazy: defers torch to the call
    )

    budget, m, r = cfg.trainer.max_tokens_per_micro_batch, cfg.model, cfg.rollout
    return {"tp": cfg.parallel.tp, "pp": cfg.parallel.pp, "vpp": cfg.parallel.vpp, "cp": cfg.parallel.cp, "sequence_parallel": cfg.parallel.sequence_parallel,
            "dist_opt": cfg.optim.use_distributed_optimizer, "dtype": "bf16" if cfg.model.bf16 else "fp32",
            "max_tokens_per_micro_batch": budget, "micro_batch": None if budget else cfg.trainer.rows_per_micro_batch,
            "max_model_len": cfg.rollout.max_model_len, "seq_len": cfg.data.max_prompt_len + cfg.rollout.max_tokens,
            "offload": cfg.trainer.offload, "rollout_engines": cfg.rollout.num_engines,
            "colocated": cfg.rollout.placement == "colocated", "rollout_tp": r.tensor_parallel_size,
            "rollout_mem_util": engine_memory_utilization(r.gpu_memory_utilization, r.placement),
            "recompute": m.recompute, "recompute_method": m.recompute_method, "recompute_num_layers": m.recompute_num_layers,
            "reference": "ref_logp" in kind_required_inputs(cfg.algo.kind, cfg.algo.hparams) and not cfg.lora.enable,
            "lora_rank": cfg.lora.rank if cfg.lora.enable else 0,
            **({"lora_targets": tuple(cfg.lora.target_modules)} if cfg.lora.enable else {}),
            "teacher_shadow": _teacher_shadow(cfg.algo.hparams),
            "top_k": r.top_k, "top_p": r.top_p, "min_p": r.min_p, "ratio_space": cfg.algo.ratio_space, "bucket_mb": r.bucket_mb,
            "fused_swiglu": True, **({"attention": _ATTENTION[m.backend]} if m.backend in _ATTENTION else {})}


def _teacher_shadow(hp) -> bool:
    """Whether the method keeps the teacher's own weights (an fp32 copy): a teacher method in snapshot or ema mode."""
    from megatron_rl.algorithms.hparams import (
        TeacherHParams,  # lazy: defers torch to the call
    )

    return isinstance(hp, TeacherHParams) and hp.teacher_mode in ("snapshot", "ema")


#: model.backend -> the attention its layers run (auto: decided on the GPU machine, left to the flag)
_ATTENTION = {"te": "flash", "local": "local"}


def merge_config(from_cfg: dict[str, Any], path, given: dict[str, Any], defaults,
                 explicit: set[str] = frozenset()) -> dict[str, Any]:
    """``given`` (parsed flags) with ``from_cfg`` (:func:`config_inputs` of the config at ``path``); a flag set
    away from its default (or named in ``explicit``: given on the command line, whatever its value) to a value
    other than the config's is an error."""
    for k, v in from_cfg.items():
        if given.get(k, v) != v and (given[k] != getattr(defaults, k) or k in explicit):
            raise ValueError(f"plan: --{k.replace('_', '-')}={given[k]} contradicts {KEYS[k]} of {path} "
                             f"({'null' if v is None else v}); drop the flag or change the config")
    return {**given, **from_cfg}
