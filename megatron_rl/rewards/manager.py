"""Reward composition: a registry of verifiers chosen per row's ``data_source``."""
from __future__ import annotations

import dataclasses
import math
from typing import Callable, Sequence

import torch

from megatron_rl.rewards.exact import exact_match

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


register_reward("exact")(exact_match)


def _register_builtin() -> None:
    from megatron_rl.rewards.format import score_rewards
    from megatron_rl.rewards.knights_knaves import verify_kk
    from megatron_rl.rewards.math_verify import math_reward
    from megatron_rl.rewards.prime_math import prime_math_score

    register_reward("math")(math_reward)
    register_reward("papo_math")(prime_math_score)   # + the LLM outcome verifier: RewardManager(second_opinion=...)
    register_reward("kk")(verify_kk)
    for name, fn in score_rewards().items():
        register_reward(name)(fn)


_register_builtin()
DEFAULT_BY_SOURCE = {"reverse": "exact", "addition": "exact", "knights_knaves": "kk", "kk": "kk",
                     "math": "math", "gsm8k": "math", "aime": "math", "amc": "math", "math500": "math"}


@dataclasses.dataclass(frozen=True)
class RewardBatch:
    reward: torch.Tensor        # [N] float
    correct: torch.Tensor       # [N] bool
    process: torch.Tensor | None
    info: list


class RewardManager:
    """``score(rows, texts)``: the verifier of each row's ``data_source`` (``by_source`` map, else
    ``default``). Non-finite rewards raise naming the sample.

    ``second_opinion``: ``{reward name: judge}`` — for the rows of that reward whose rule score is 0,
    ``judge.verify_batch([(question, response, ground_truth)])`` is asked and a True verdict makes the
    reward 1 (PAPO's LLM outcome verifier on ``papo_math``, ``outcome_judge.py``); a failed check
    (None) leaves the rule's 0, counted by the judge. :meth:`stats` has the judges' counters."""

    def __init__(self, by_source: dict[str, str] | None = None, default: str = "exact", second_opinion: dict | None = None):
        self.by_source = {**DEFAULT_BY_SOURCE, **(by_source or {})}
        self.default = default
        self.second_opinion = dict(second_opinion or {})
        for name in {*self.by_source.values(), default, *self.second_opinion}:
            get_reward(name)

    def stats(self) -> dict[str, float]:
        out = {}
        for judge in self.second_opinion.values():
            out.update(judge.stats())
        return out

    def _ask_second_opinion(self, rows: Sequence, texts: Sequence[str], vals: list[float]) -> set[int]:
        """Rule-wrong rows of a reward with a judge: 1 where the judge says correct; returns those rows."""
        from megatron_rl.data.dataset import problem_text

        corrected = set()
        for name, judge in self.second_opinion.items():
            idx = [i for i, r in enumerate(rows) if self.by_source.get(r.data_source, self.default) == name and vals[i] <= 0]
            if not idx:
                continue
            items = []
            for i in idx:
                try:
                    question = problem_text(rows[i])
                except ValueError:
                    question = ""
                items.append((question, texts[i], str(rows[i].ground_truth)))
            for i, verdict in zip(idx, judge.verify_batch(items)):
                if verdict:
                    vals[i] = 1.0
                    corrected.add(i)
        return corrected

    def score(self, rows: Sequence, texts: Sequence[str]) -> RewardBatch:
        if len(rows) != len(texts):
            raise ValueError(f"{len(rows)} rows but {len(texts)} responses")
        vals = []
        for i, (r, t) in enumerate(zip(rows, texts)):
            v = float(get_reward(self.by_source.get(r.data_source, self.default))(t, r.ground_truth))
            if not math.isfinite(v):
                raise FloatingPointError(f"reward of sample {i} (data_source={r.data_source!r}, row {r.index}) is {v}")
            vals.append(v)
        corrected = self._ask_second_opinion(rows, texts, vals) if self.second_opinion else set()
        rew = torch.tensor(vals, dtype=torch.float32)
        return RewardBatch(rew, rew > 0.5, None, [{"llm_corrected": True} if i in corrected else {} for i in range(len(vals))])
