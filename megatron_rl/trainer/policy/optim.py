"""Optimizer + LR schedule for the policy actor: megatron-core ``get_megatron_optimizer`` (Adam)
and ``OptimizerParamScheduler``, from one small typed spec.
"""
from __future__ import annotations

import dataclasses
from typing import Sequence

import torch

_DECAY_STYLES = ("constant", "linear", "cosine", "inverse-square-root")


@dataclasses.dataclass(frozen=True)
class OptimSpec:
    """Adam(W) settings and the LR schedule.

    Schedule (megatron ``OptimizerParamScheduler``, evaluated at the 1-based step n before that
    step's update): ``lr * n / warmup_steps`` for ``n <= warmup_steps``, then ``decay_style`` from
    ``lr`` to ``min_lr`` reached at ``n = decay_steps`` (``None``: ``warmup_steps + 1``, i.e.
    constant ``lr`` after warm-up with ``decay_style="constant"``).
    """

    lr: float = 1e-6
    """Peak learning rate."""
    min_lr: float = 0.0
    """Final learning rate of the decay."""
    warmup_steps: int = 0
    """Optimizer steps of linear warm-up."""
    decay_steps: int | None = None
    """Step at which the decay reaches ``min_lr`` (must exceed ``warmup_steps``)."""
    decay_style: str = "constant"
    """One of constant, linear, cosine, inverse-square-root."""
    weight_decay: float = 0.0
    """Decoupled weight decay (AdamW), not applied to biases and norms."""
    betas: tuple[float, float] = (0.9, 0.999)
    """Adam (beta1, beta2)."""
    eps: float = 1e-8
    """Adam epsilon."""
    clip_grad: float = 1.0
    """Global L2 grad-norm clip (0 disables)."""
    use_distributed_optimizer: bool = True
    """Shard optimizer state over data-parallel ranks (ZeRO-1)."""
    bf16: bool = False
    """bf16 model params + fp32 main params / grads; False = everything fp32."""

    def __post_init__(self) -> None:
        if not self.lr > 0:
            raise ValueError(f"OptimSpec.lr must be > 0, got {self.lr}")
        if not 0 <= self.min_lr <= self.lr:
            raise ValueError(f"OptimSpec.min_lr must be in [0, lr={self.lr}], got {self.min_lr}")
        if self.warmup_steps < 0:
            raise ValueError(f"OptimSpec.warmup_steps must be >= 0, got {self.warmup_steps}")
        if self.decay_steps is not None and self.decay_steps <= self.warmup_steps:
            raise ValueError(f"OptimSpec.decay_steps={self.decay_steps} must exceed warmup_steps={self.warmup_steps}")
        if self.decay_style != "constant" and self.decay_steps is None:
            raise ValueError(f"OptimSpec.decay_style={self.decay_style!r} needs decay_steps (the step where lr reaches min_lr)")
        if self.decay_style not in _DECAY_STYLES:
            raise ValueError(f"OptimSpec.decay_style {self.decay_style!r} not in {_DECAY_STYLES}")
        if self.clip_grad < 0 or self.weight_decay < 0:
            raise ValueError("OptimSpec.clip_grad and weight_decay must be >= 0")
        object.__setattr__(self, "betas", tuple(self.betas))

    @property
    def params_dtype(self) -> torch.dtype:
        return torch.bfloat16 if self.bf16 else torch.float32


def build_optimizer(spec: OptimSpec, model_chunks: Sequence[torch.nn.Module]):
    """``(MegatronOptimizer, OptimizerParamScheduler)`` for DDP-wrapped ``model_chunks``."""
    from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer
    from megatron.core.optimizer_param_scheduler import OptimizerParamScheduler

    cfg = OptimizerConfig(
        optimizer="adam", lr=spec.lr, min_lr=spec.min_lr, weight_decay=spec.weight_decay,
        adam_beta1=spec.betas[0], adam_beta2=spec.betas[1], adam_eps=spec.eps,
        clip_grad=spec.clip_grad, bf16=spec.bf16, params_dtype=spec.params_dtype,
        use_distributed_optimizer=spec.use_distributed_optimizer)
    opt = get_megatron_optimizer(cfg, list(model_chunks))
    decay = spec.decay_steps if spec.decay_steps is not None else spec.warmup_steps + 1
    sched = OptimizerParamScheduler(
        opt, init_lr=0.0 if spec.warmup_steps > 0 else spec.lr, max_lr=spec.lr, min_lr=spec.min_lr,
        lr_warmup_steps=spec.warmup_steps, lr_decay_steps=decay, lr_decay_style=spec.decay_style,
        start_wd=spec.weight_decay, end_wd=spec.weight_decay, wd_incr_steps=decay, wd_incr_style="constant")
    return opt, sched


def current_lr(optimizer) -> float:
    """Learning rate of the first param group (all groups share it here)."""
    return float(optimizer.param_groups[0]["lr"])
