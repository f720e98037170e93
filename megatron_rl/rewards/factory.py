"""Reward-side components of a run, built from its ``reward`` config section: the reward manager,
PAPO's rubric grader and its LLM outcome verifier, each with its circuit breaker (no request is
made here). The composition root (``trainer/loop/setup.py``), the start-up checks (``preflight``) and
PAPO's data path (``trainer/paths/process_reward.py``) build them here."""
from __future__ import annotations

from typing import TYPE_CHECKING

from megatron_rl.rewards.breaker import CircuitBreaker
from megatron_rl.rewards.grader import RubricGrader
from megatron_rl.rewards.outcome_judge import OutcomeVerifier

if TYPE_CHECKING:
    from megatron_rl.config import Config
    from megatron_rl.rewards.grader import RubricGrader
    from megatron_rl.rewards.manager import RewardManager
    from megatron_rl.rewards.outcome_judge import OutcomeVerifier


def build_grader(cfg: Config) -> RubricGrader:
    """The PAPO rubric grader of ``cfg.reward`` with its circuit breaker (no request is made here)."""
    r = cfg.reward
    grader = RubricGrader(r.grader_url, r.grader_model, concurrency=r.grader_concurrency, timeout=r.grader_timeout,
                          retries=r.grader_retries, fallback=r.grader_fallback, max_tokens=r.grader_max_tokens)
    grader.breaker = CircuitBreaker(r.grader_breaker_failures, r.grader_breaker_cooldown, name="grader")
    grader.unparsable_policy = r.grader_unparsable_policy
    return grader


def uses_outcome_verifier(cfg: Config) -> bool:
    """Whether the run asks PAPO's LLM outcome verifier: reward ``papo_math`` selected (``reward.default`` or
    a ``by_source`` value) with ``reward.outcome_verifier`` on and a ``grader_url``."""
    r = cfg.reward
    return bool(r.outcome_verifier and r.grader_url and "papo_math" in {r.default, *r.by_source.values()})


def build_outcome_verifier(cfg: Config) -> OutcomeVerifier | None:
    """PAPO's LLM outcome verifier on the grader endpoint (``rewards/outcome_judge.py``) with its own
    circuit breaker, or None when the run does not use it (no request is made here)."""
    if not uses_outcome_verifier(cfg):
        return None
    r = cfg.reward
    v = OutcomeVerifier(r.grader_url, r.grader_model, concurrency=r.grader_concurrency, timeout=r.grader_timeout,
                        retries=r.grader_retries, max_tokens=r.grader_max_tokens)
    v.breaker = CircuitBreaker(r.grader_breaker_failures, r.grader_breaker_cooldown, name="verifier")
    v.unparsable_policy = r.grader_unparsable_policy
    return v


def build_rewards(cfg: Config, is_driver: bool = True) -> RewardManager:
    """The run's reward manager (verifier per data source, the reward pool's size and timeout); on the
    driver (which scores) with PAPO's outcome verifier when used."""
    from megatron_rl.rewards.manager import RewardManager  # lazy: defers torch to the call

    r = cfg.reward
    verifier = build_outcome_verifier(cfg) if is_driver else None
    return RewardManager(r.by_source, r.default or None, workers=r.workers, timeout_s=r.timeout_s,
                         second_opinion={"papo_math": verifier} if verifier is not None else None)
