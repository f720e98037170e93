"""PAPO rubric grader (LLM-as-judge process reward) over any OpenAI-compatible chat endpoint.

The HTTP side (bounded concurrency, per-request timeout, retries with exponential backoff, the
circuit breaker, failure counters the trainer logs) is ``judge_client.JudgeClient``; here: the
prompt, the parsing, and a per-run cache keyed by (problem, response). A grader that is down never
stops training: after the retries the configured ``fallback`` score is used and counted
(``stats()["grader/fallbacks"]``); a grader that refuses the requests (HTTP 4xx) stops the run once
the breaker opens on them (``judge_client`` says why). Scores are parsed as PAPO's reference grader
does (the PAPO paper's rubric judge):
last ``\\boxed{}``/``\\fbox{}`` of the judge output (``<think>`` removed) converted to float and
accepted only if in {0, 0.5, 1}; else a "score: x" / "score is x" regex, same set; else 0.0.
Empty student solution or missing reference -> 0.0 without a call.
"""
from __future__ import annotations

import asyncio
import re

from megatron_rl.rewards.breaker import log
from megatron_rl.rewards.extract import last_boxed, strip_think
from megatron_rl.rewards.judge_client import JudgeClient

VALID = (0.0, 0.5, 1.0)
RUBRIC_PROMPT = """You are grading a student's solution to a math problem. Judge the QUALITY of the whole solution, not only the final answer.

Scoring rubric:
- 1: the solution is completely correct, with every step properly shown and justified.
- 0.5: the solution is generally correct but omits details or contains minor errors.
- 0: the solution does not address the problem, or contains fatal errors or severe omissions.
Special rule: citing the result of a paper or a well-known theorem does not count as proof unless the solution also proves it; such a solution never receives a 1.

## Problem
{problem}

## Reference solution
{reference}

## Student solution
{solution}

Analyze the student solution step by step against the reference, then give the final score (0, 0.5 or 1) in \\boxed{{}}."""
_SCORE_RE = re.compile(r"[Ss]core\s*(?::|is)\s*([0-9]*\.?[0-9]+)")


def parse_score(judge_output: str) -> float | None:
    """The judge's score per the spec, or None when it gave no valid score."""
    text = strip_think(judge_output or "")
    box = last_boxed(text)
    # spec T-P6: the last box, else the FIRST regex match only (an invalid first match is not retried)
    for cand in ([box] if box is not None else []) + _SCORE_RE.findall(text)[:1]:
        try:
            v = float(cand.strip())
        except ValueError:
            continue
        if v in VALID:
            return v
    return None


class RubricGrader(JudgeClient):
    """Grade (problem, reference, solution) triples; see the module docstring. HTTP, retries, breaker
    and the failure classes: ``judge_client.py``."""

    def __init__(self, base_url: str, model: str, *, concurrency: int = 8, timeout: float = 120.0,
                 retries: int = 3, backoff: float = 1.0, fallback: float = 0.0, temperature: float = 0.1,
                 max_tokens: int | None = None, api_key: str = "EMPTY"):
        if fallback not in VALID:
            raise ValueError(f"grader fallback must be one of {VALID}, got {fallback}")
        super().__init__(base_url, model, name="grader", concurrency=concurrency, timeout=timeout, retries=retries,
                         backoff=backoff, temperature=temperature, max_tokens=max_tokens, api_key=api_key)
        self.fallback = fallback
        self.cache: dict[tuple[str, str], float] = {}

    async def _one(self, session, sem, item: tuple[str, str, str]) -> float:
        problem, reference, solution = item
        key = (problem, solution)
        if key in self.cache:
            self._stats.cache_hits += 1
            return self.cache[key]
        if not solution.strip() or not reference.strip():
            return 0.0
        prompt = RUBRIC_PROMPT.format(problem=problem, reference=reference, solution=strip_think(solution))
        content = await self.ask(session, sem, prompt)
        if content is None:
            self._stats.fallbacks += 1
            return self.fallback
        score = parse_score(content)
        self.parsed(content, score is not None)
        if score is None:
            score = 0.0
        self.cache[key] = score
        return score

    async def agrade(self, items: list[tuple[str, str, str]]) -> list[float]:
        return await self.ask_all(self._one, items)

    def grade_batch(self, items: list[tuple[str, str, str]]) -> list[float]:
        """Synchronous wrapper: ``[(problem, reference_solution, student_solution)] -> scores``.
        Logs one console warning with the count when any score of the batch is the fallback; raises
        :class:`~megatron_rl.rewards.judge_client.JudgeRejected` when the breaker opened on refused (4xx)
        requests; most replies of the batch unparsable: ``judge_client.JudgeClient.check_readable``."""
        before, replies, bad = self._stats.fallbacks, self._stats.replies, self._stats.unparsable
        scores = asyncio.run(self.agrade(items))
        fell = self._stats.fallbacks - before
        if fell:
            log.warning("grader: %d of %d grades used the fallback score %.1f (breaker %s, %d requests skipped so far)",
                        fell, len(items), self.fallback, self.breaker.state, self.breaker.skips)
        self.raise_if_rejected()
        self.check_readable(replies, bad)
        return scores
