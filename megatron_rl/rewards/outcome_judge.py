"""PAPO's LLM outcome verifier: a second opinion on a response the rule check (``prime_math.py``) calls
wrong, asked of the same OpenAI-compatible endpoint as the rubric grader (PAPO's reference,
``verl/utils/reward_score/llm_answer_grading.py`` in tanzelin430/PAPO, routed from its
``reward_score/__init__.py`` for every paper run: ``USE_LLM_VERIFIER=true``).

    r_out = 1                            if prime_math(response, truth)
          = [judge says CORRECT]         else, when the verifier answers
          = 0 (the rule's verdict)       when it fails (counted: ``verifier/fallbacks``)

The judge gets the question, the extracted answer and the reference answer, in one user message,
and ends its short explanation with ``Final Grade: CORRECT`` or ``INCORRECT``. Extracted answer: the
response with ``<think>…</think>`` removed (and anything before a lone ``</think>``), the content of
its last ``\\boxed{}`` / ``\\fbox{}``, else the whole remaining text; an empty one, or a non-finite one
against a finite reference (``1/0``, ``\\infty``: ``prime_math.degenerate``), is 0 without a call.
Parsing: ``<think>`` removed from the judge's text; the "Final Grade: X" line, else a standalone
CORRECT with no INCORRECT anywhere; anything else is INCORRECT (``verifier/unparsable``).

HTTP, retries, the circuit breaker and the failure classes: ``judge_client.JudgeClient``, with the
``reward.grader_*`` settings and its own breaker (metrics prefix ``verifier/``). Successful verdicts
are cached per (question, extracted answer, reference) for the run.
"""
from __future__ import annotations

import asyncio
import re

from megatron_rl.rewards.breaker import log
from megatron_rl.rewards.extract import last_boxed, strip_think
from megatron_rl.rewards.judge_client import JudgeClient
from megatron_rl.rewards.prime_math import degenerate

OUTCOME_PROMPT = """Decide whether a student's final answer to a math question matches the reference answer.

Question: {question}

Student's answer: {answer}

Reference answer: {reference}

Judge only by the reference answer; you do not need to solve the question. An answer written differently from the reference but mathematically equivalent is correct; one that is not equivalent is incorrect. An interval must match exactly, including whether each end is open or closed. For an expression, show the steps that establish (or refute) equivalence. If the reference lists several solutions, the student's answer must contain all of them.

Explain your decision in a few sentences, then finish with exactly one line:

Final Grade: CORRECT or INCORRECT"""

_FINAL = re.compile(r"Final\s+Grade:\s*(CORRECT|INCORRECT)", re.I)


def extract_answer(response: str) -> str:
    """The answer the verifier is shown (module docstring)."""
    text = strip_think(response or "")
    if "</think>" in text:
        text = text.rsplit("</think>", 1)[1]
    box = last_boxed(text)
    return (box if box else text).strip()


def parse_grade(judge_output: str) -> bool | None:
    """True (CORRECT), False (INCORRECT), None (neither said: treated as INCORRECT, counted)."""
    text = strip_think(judge_output or "")
    m = _FINAL.search(text)
    if m:
        return m.group(1).upper() == "CORRECT"
    if re.search(r"\bCORRECT\b", text, re.I):
        return not re.search(r"\bINCORRECT\b", text, re.I)
    return None


class OutcomeVerifier(JudgeClient):
    """``verify_batch([(question, response, reference)]) -> [True | False | None]`` (None: the verifier
    failed, the rule's verdict stands); see the module docstring."""

    def __init__(self, base_url: str, model: str, **kw):
        super().__init__(base_url, model, name="verifier", **kw)
        self.cache: dict[tuple[str, str, str], bool] = {}

    async def _one(self, session, sem, item: tuple[str, str, str]) -> bool | None:
        question, response, reference = item
        answer = extract_answer(response)
        if not answer or not str(reference).strip() or degenerate(answer, reference):
            return False       # nothing to judge; a non-finite answer never gets a second opinion (no reward hack)
        key = (question, answer, str(reference))
        if key in self.cache:
            self._stats.cache_hits += 1
            return self.cache[key]
        content = await self.ask(session, sem, OUTCOME_PROMPT.format(question=question, answer=answer, reference=reference))
        if content is None:
            self._stats.fallbacks += 1
            return None
        verdict = parse_grade(content)
        self.parsed(content, verdict is not None)
        if verdict is None:
            verdict = False
        self.cache[key] = verdict
        return verdict

    def verify_batch(self, items: list[tuple[str, str, str]]) -> list[bool | None]:
        """One console warning when any verdict of the batch failed; raises
        :class:`~megatron_rl.rewards.judge_client.JudgeRejected` once the breaker opened on 4xx replies."""
        replies, bad = self._stats.replies, self._stats.unparsable
        out = asyncio.run(self.ask_all(self._one, items)) if items else []
        fell = sum(v is None for v in out)
        if fell:
            log.warning("verifier: %d of %d outcome checks failed, the rule's verdict (0) stands (breaker %s, "
                        "%d requests skipped so far)", fell, len(items), self.breaker.state, self.breaker.skips)
        self.raise_if_rejected()
        self.check_readable(replies, bad)
        return out
