"""The train–inference mismatch guard (``rollout.mismatch_limit`` / ``rollout.mismatch_policy``).

After each step the guard reads ``rollout/token_mult_prob_error`` (``algorithms/mismatch.py``) of the
samples generated with the trainer's own weights: the whole batch in a synchronous run, the
``_fresh`` part in an asynchronous one (a stale batch's error also holds the policy's own change since
its weights, so it says nothing about the engines' numerics; a step without fresh samples is not
judged). Above the limit, ``warn`` prints one line and goes on; ``stop`` ends the run at this step
boundary through the graceful-stop path of the loop (``trainer/loop/stop.py``): checkpoint, one line
naming the step, the metric, its value and the limit, exit status :data:`~megatron_rl.trainer.loop.stop.GUARD_EXIT`.
Every rank takes the same decision (rank 0's metrics, broadcast).
"""
from __future__ import annotations

import math

METRIC = "rollout/token_mult_prob_error"


def guard_metric(cfg) -> str:
    """The metrics-row key the guard reads under ``cfg``."""
    return METRIC + "_fresh" if cfg.rollout.max_staleness > 0 or cfg.rollout.partial.enable else METRIC


def over_limit(cfg, metrics: dict) -> float | None:
    """The guarded value when it exceeds ``rollout.mismatch_limit`` or is not finite (None: within,
    off, or not measured)."""
    limit = cfg.rollout.mismatch_limit
    value = metrics.get(guard_metric(cfg))
    if not limit or value is None:
        return None
    value = float(value)
    return value if not math.isfinite(value) or value > limit else None


def message(cfg, value: float) -> str:
    """What the guard says (the loop adds the step): the metric, its value and the limit."""
    return f"{guard_metric(cfg)} = {value:.9g} exceeds rollout.mismatch_limit = {cfg.rollout.mismatch_limit:.9g}"


def agreed(value: float | None) -> float | None:
    """Collective: rank 0's guarded value on every rank (the local one without torch.distributed)."""
    import torch.distributed as dist  # lazy: defers torch to the call

    if not dist.is_initialized() or dist.get_world_size() == 1:
        return value
    box = [value]
    dist.broadcast_object_list(box, src=0)
    return box[0]
