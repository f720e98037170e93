"""The reward registry: ``fn(response_text, ground_truth) -> float`` by name (torch-free, so reward
worker processes import it cheaply). A function may return a :class:`~megatron_rl.rewards.verdict.Verdict`
(a float with its reason); the manager counts the reasons."""
from __future__ import annotations

import time
from typing import Callable

from megatron_rl.rewards import math_reward
from megatron_rl.rewards.dapo import dapo_reward, dapo_strict_box_reward
from megatron_rl.rewards.exact import exact_match
from megatron_rl.rewards.format import score_rewards
from megatron_rl.rewards.gpqa import gpqa_reward
from megatron_rl.rewards.knights_knaves import verify_kk, verify_kk_rlcsd
from megatron_rl.rewards.prime_math import prime_math_score
from megatron_rl.rewards.verl_rules import (gsm8k_flexible_reward, gsm8k_strict_reward, gsm8k_verl_reward,
                                            hendrycks_math_reward, math_dapo_reward)

_REWARDS: dict[str, Callable[[str, object], float]] = {}


def register_reward(name: str):
    """Register ``fn(response_text, ground_truth) -> float`` under ``name`` (twice raises)."""

    def deco(fn):
        if name in _REWARDS:
            raise ValueError(f"reward {name!r} registered twice")
        _REWARDS[name] = fn
        return fn
    return deco


def get_reward(name: str):
    try:
        return _REWARDS[name]
    except KeyError:
        raise KeyError(f"unknown reward {name!r}; valid: {sorted(_REWARDS)}") from None


def score_one(name: str, response: str, ground_truth, timeout_s: float | None = None):
    """One reward value (a reward worker's task; ``timeout_s``: the ``math`` check's budget)."""
    if timeout_s is not None:
        math_reward.TIMEOUT_S = timeout_s
    return get_reward(name)(response, ground_truth)


register_reward("exact")(exact_match)


def _register_builtin() -> None:
    register_reward("math")(math_reward.math_reward)
    register_reward("math_rlcsd")(math_reward.math_rlcsd_reward)
    register_reward("kk")(verify_kk)
    register_reward("kk_rlcsd")(verify_kk_rlcsd)
    register_reward("dapo")(dapo_reward)
    register_reward("dapo_strict_box")(dapo_strict_box_reward)
    register_reward("gpqa")(gpqa_reward)
    register_reward("papo_math")(prime_math_score)   # + the LLM outcome verifier: RewardManager(second_opinion=...)
    register_reward("prime_math")(prime_math_score)  # the rule alone: verl's numina_* sources
    # verl's rules for the data_source names of its default_compute_score (rewards/verl_rules.py)
    register_reward("gsm8k_strict")(gsm8k_strict_reward)
    register_reward("gsm8k_verl")(gsm8k_verl_reward)
    register_reward("gsm8k_flexible")(gsm8k_flexible_reward)
    register_reward("hendrycks_math")(hendrycks_math_reward)
    register_reward("math_dapo")(math_dapo_reward)
    for name, fn in score_rewards().items():
        register_reward(name)(fn)


_register_builtin()


def score_timed(name: str, response: str, ground_truth, timeout_s: float | None = None):
    """``(score_one(...), seconds it took in the worker)`` — the latency of one response (benchmarks)."""
    t0 = time.perf_counter()
    v = score_one(name, response, ground_truth, timeout_s)
    return v, time.perf_counter() - t0
