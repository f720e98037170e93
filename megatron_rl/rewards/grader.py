"""PAPO rubric grader (LLM-as-judge process reward) over any OpenAI-compatible chat endpoint.

Async client with bounded concurrency, per-request timeout, retries with exponential backoff, a
per-run cache keyed by (problem, response), and failure counters the trainer logs. A grader that
is down never stops training: after the retries the configured ``fallback`` score is used and
counted (``stats()["grader/fallbacks"]``). Scores follow the spec exactly (bicc_rcc_papo spec §2.2):
last ``\\boxed{}``/``\\fbox{}`` of the judge output (``<think>`` removed) converted to float and
accepted only if in {0, 0.5, 1}; else a "score: x" / "score is x" regex, same set; else 0.0.
Empty student solution or missing reference -> 0.0 without a call.
"""
from __future__ import annotations

import asyncio
import dataclasses
import json
import re

from megatron_rl.rewards.breaker import CircuitBreaker, log
from megatron_rl.rewards.extract import last_boxed, strip_think

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


@dataclasses.dataclass
class GraderStats:
    calls: int = 0
    cache_hits: int = 0
    retries: int = 0
    timeouts: int = 0
    http_errors: int = 0
    malformed: int = 0
    unparsable: int = 0
    fallbacks: int = 0
    breaker_skips: int = 0     # requests not sent because the circuit breaker was open (breaker.py)
    breaker_opens: int = 0


class RubricGrader:
    """Grade (problem, reference, solution) triples; see module docstring."""

    def __init__(self, base_url: str, model: str, *, concurrency: int = 8, timeout: float = 120.0,
                 retries: int = 3, backoff: float = 1.0, fallback: float = 0.0, temperature: float = 0.1,
                 max_tokens: int = 4096, api_key: str = "EMPTY"):
        if fallback not in VALID:
            raise ValueError(f"grader fallback must be one of {VALID}, got {fallback}")
        self.url = base_url.rstrip("/") + "/chat/completions"
        self.model, self.concurrency, self.timeout = model, concurrency, timeout
        self.retries, self.backoff, self.fallback = retries, backoff, fallback
        self.temperature, self.max_tokens, self.api_key = temperature, max_tokens, api_key
        self.cache: dict[tuple[str, str], float] = {}
        self._stats = GraderStats()
        self.breaker = CircuitBreaker()     # replaced by setup_run with the configured thresholds

    def stats(self) -> dict[str, float]:
        self._stats.breaker_skips, self._stats.breaker_opens = self.breaker.skips, self.breaker.opens
        return {f"grader/{k}": float(v) for k, v in dataclasses.asdict(self._stats).items()}

    async def _one(self, session, sem, problem: str, reference: str, solution: str) -> float:
        import aiohttp

        key = (problem, solution)
        if key in self.cache:
            self._stats.cache_hits += 1
            return self.cache[key]
        if not solution.strip() or not reference.strip():
            return 0.0
        body = {"model": self.model, "temperature": self.temperature, "max_tokens": self.max_tokens,
                "messages": [{"role": "user", "content": RUBRIC_PROMPT.format(problem=problem, reference=reference,
                                                                             solution=strip_think(solution))}]}
        async with sem:
            for attempt in range(self.retries + 1):
                if attempt:
                    self._stats.retries += 1
                    await asyncio.sleep(self.backoff * 2 ** (attempt - 1))
                if not self.breaker.allow():
                    break
                self._stats.calls += 1
                try:
                    async with session.post(self.url, json=body, timeout=aiohttp.ClientTimeout(total=self.timeout),
                                            headers={"Authorization": f"Bearer {self.api_key}"}) as r:
                        if r.status != 200:
                            self._stats.http_errors += 1
                            self.breaker.failure(f"HTTP {r.status}")
                            continue
                        raw = await r.text()
                    content = json.loads(raw)["choices"][0]["message"]["content"]
                except asyncio.TimeoutError:
                    self._stats.timeouts += 1
                    self.breaker.failure("timeout")
                    continue
                except (aiohttp.ClientError, OSError) as e:
                    self._stats.http_errors += 1
                    self.breaker.failure(type(e).__name__)
                    continue
                except (ValueError, KeyError, IndexError, TypeError):
                    self._stats.malformed += 1
                    continue
                self.breaker.success()
                score = parse_score(content)
                if score is None:
                    self._stats.unparsable += 1
                    score = 0.0
                self.cache[key] = score
                return score
        self._stats.fallbacks += 1
        return self.fallback

    async def agrade(self, items: list[tuple[str, str, str]]) -> list[float]:
        import aiohttp

        sem = asyncio.Semaphore(self.concurrency)
        async with aiohttp.ClientSession() as s:
            return list(await asyncio.gather(*(self._one(s, sem, *it) for it in items)))

    def grade_batch(self, items: list[tuple[str, str, str]]) -> list[float]:
        """Synchronous wrapper: ``[(problem, reference_solution, student_solution)] -> scores``.
        Logs one console warning with the count when any score of the batch is the fallback."""
        before = self._stats.fallbacks
        scores = asyncio.run(self.agrade(items))
        fell = self._stats.fallbacks - before
        if fell:
            log.warning("grader: %d of %d grades used the fallback score %.1f (breaker %s, %d requests skipped so far)",
                        fell, len(items), self.fallback, self.breaker.state, self.breaker.skips)
        return scores
