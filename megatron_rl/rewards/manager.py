"""Reward composition: a registry of verifiers chosen per row's ``data_source``, scored on the reward
pool (``rewards/pool.py``) for the verifiers that need one."""
from __future__ import annotations

import dataclasses
import math
from typing import Sequence

import torch

from megatron_rl.rewards import pool as P
from megatron_rl.rewards.math_reward import deadline_for
from megatron_rl.rewards.problem import problem_text
from megatron_rl.rewards.registry import get_reward, register_reward, score_one  # noqa: F401 -- re-exported
from megatron_rl.rewards.sources import resolve, unmapped_line
from megatron_rl.rewards.verdict import reason_of

#: rewards scored on the worker pool (a symbolic check that may need killing, or just CPU-heavy)
POOLED = frozenset({"math", "math_rlcsd", "papo_math", "prime_math"})


@dataclasses.dataclass(frozen=True)
class RewardBatch:
    reward: torch.Tensor        # [N] float
    correct: torch.Tensor       # [N] bool
    process: torch.Tensor | None
    info: list
    stats: dict = dataclasses.field(default_factory=dict)   # reward/timeouts, reward/degenerate, ...


class RewardManager:
    """``score(rows, texts)``: the verifier of each row, chosen by ``rewards/sources.resolve``: ``by_source``
    (the config's map), the reward the row names, the built-in ``data_source`` table (verl's names with
    verl's rules, then this project's), ``default`` (a fallback only when given); a row with none raises
    (the start-up checks refuse such files first, ``sources.check_rows``). Rows whose reward is in
    :data:`POOLED` run on a pool of ``workers`` processes (0: one per CPU the driver may use), each check
    bounded by ``timeout_s``; the others run inline. Non-finite rewards raise naming the sample.

    ``second_opinion``: ``{reward name: judge}`` — for the rows of that reward whose rule score is 0,
    ``judge.verify_batch([(question, response, ground_truth)])`` is asked and a True verdict makes the
    reward 1 (PAPO's LLM outcome verifier on ``papo_math``, ``outcome_judge.py``); a failed check
    (None) leaves the rule's 0, counted by the judge. :meth:`score`'s stats carry the judges' counters
    and ``reward/llm_corrected``."""

    def __init__(self, by_source: dict[str, str] | None = None, default: str | None = None, workers: int = 0,
                 timeout_s: float = 5.0, second_opinion: dict | None = None):
        self.by_source = dict(by_source or {})
        self.default = default or None
        self.workers, self.timeout_s = workers, float(timeout_s)
        self.second_opinion = dict(second_opinion or {})
        for name in {*self.by_source.values(), *([default] if default else []), *self.second_opinion}:
            get_reward(name)

    def name_of(self, data_source: str, named: str = "") -> str:
        """The reward of a row of ``data_source`` naming reward ``named`` ("" for none): ``sources.resolve``;
        ``ValueError`` (one line) when none applies."""
        name, _ = resolve(str(data_source), named or "", self.by_source, self.default)
        if name is None:
            raise ValueError(unmapped_line("a scored row", {str(data_source): 1}))
        return name

    def values(self, names: Sequence[str], texts: Sequence[str], truths: Sequence) -> tuple[list, dict]:
        """Raw reward values (floats / Verdicts) for parallel lists, and the pool counters."""
        vals: list = [None] * len(texts)
        pooled = [i for i, n in enumerate(names) if n in POOLED]
        stats = {"reward/timeouts": 0, "reward/timeout_zero": 0}
        if pooled:
            p = P.shared_pool(self.workers, deadline_for(self.timeout_s))
            before = dict(p.stats)
            out = p.map("megatron_rl.rewards.registry:score_one",
                        [(names[i], texts[i], truths[i], self.timeout_s) for i in pooled])
            for i, v in zip(pooled, out):
                vals[i] = v
            final = p.stats["timeouts"] - before["timeouts"]
            stats = {"reward/timeouts": p.stats["retries"] - before["retries"] + final, "reward/timeout_zero": final}
        for i, n in enumerate(names):
            if vals[i] is None:
                vals[i] = get_reward(n)(texts[i], truths[i])
        return vals, stats

    def _ask_second_opinion(self, names: Sequence[str], rows: Sequence, texts: Sequence[str], vals: list[float]) -> set[int]:
        """Rule-wrong rows of a reward with a judge: 1 where the judge says correct; returns those rows."""
        corrected = set()
        for name, judge in self.second_opinion.items():
            idx = [i for i, n in enumerate(names) if n == name and vals[i] <= 0]
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
        names = [self.name_of(r.data_source, getattr(r, "reward", "")) for r in rows]
        raw, stats = self.values(names, texts, [r.ground_truth for r in rows])
        vals = []
        for i, (r, v) in enumerate(zip(rows, raw)):
            v = float(v)
            if not math.isfinite(v):
                raise FloatingPointError(f"reward of sample {i} (data_source={r.data_source!r}, row {r.index}) is {v}")
            vals.append(v)
        reasons = [reason_of(v) for v in raw]
        stats["reward/degenerate"] = sum(x == "degenerate" for x in reasons)
        info = [{"reason": x} if x else {} for x in reasons]
        if self.second_opinion:
            corrected = self._ask_second_opinion(names, rows, texts, vals)
            for i in corrected:
                info[i]["llm_corrected"] = True
            for judge in self.second_opinion.values():
                stats.update(judge.stats())
            stats["reward/llm_corrected"] = float(len(corrected))
        rew = torch.tensor(vals, dtype=torch.float32)
        return RewardBatch(rew, rew > 0.5, None, info, stats)
