"""The papers' prompt templates, written once per recipe: ``TEMPLATES[name](problem, **fields)`` ->
the row's chat messages (verl's ``prompt`` column: a list of ``{role, content}``).

* ``rlcsd_math``: RLCSD (THU-BPM/RLCSD) training rows: one user turn, ``Problem: <problem>``, a
  blank line and the Qwen-Math chain-of-thought instruction (reason step by step, final answer in
  ``\\boxed{}``); no system message.
* ``boxed``: the RLCSD evaluation rows (AMC23 / AIME24 / AIME25) and the math benchmarks: the same
  turn without the ``Problem:`` prefix.
* ``dapo``: DAPO-Math-17k's own user turn (BytedTsinghua-SIA/DAPO-Math-17k): solve step by step, the
  last line ``Answer: $Answer``; the ``dapo`` reward reads that line.
* ``papo``: PAPO's NuminaMath user turn (tanzelin430/PAPO ``verl/data/convert_numina_math.py``): a
  knowledgeable-math-assistant preamble asking to think step by step, the problem, the final answer in
  ``\\boxed{}``.
* ``score_gsm8k`` / ``score_math``: SCoRe (BY571/SCoRe) turns: a system task prompt asking for
  ``<think>…</think><answer>…</answer>``, and ``Question:\\n<question>`` as the user turn.
* ``gpqa``: openai/simple-evals' multiple-choice query (``Answer: $LETTER`` on the last line, options
  ``A) … D)``).
"""
from __future__ import annotations

from typing import Callable

#: the Qwen-Math chain-of-thought instruction (RLCSD's student and teacher prompts end with it)
BOXED_INSTRUCTION = "Please reason step by step, and put your final answer within \\boxed{}."
DAPO_PREFIX = ("Solve the following math problem step by step. The last line of your response should be of the "
               "form Answer: $Answer (no quotes) where $Answer is the answer to the problem.\n\n")
DAPO_SUFFIX = "\n\nRemember to put your answer on its own line after \"Answer:\"."
PAPO_PREAMBLE = ("You are a knowledgeable math assistant. Answer the following question and think step by step.")
PAPO_ASK = "Please put your final answer within \\boxed{}."
SCORE_GSM8K_SYSTEM = ("You are a helpful assistant that solves grade-school math word problems. First think through "
                      "the problem inside <think> </think> tags, then give only the final number inside "
                      "<answer> </answer> tags.")
SCORE_MATH_SYSTEM = ("You are a helpful assistant that solves competition math problems. First think through the "
                     "problem inside <think> </think> tags, then give only the final answer inside "
                     "<answer> </answer> tags.")
GPQA_QUERY = ("Answer the following multiple choice question. The last line of your response should be of the "
              "following format: 'Answer: $LETTER' (without quotes) where LETTER is one of ABCD. Think step by "
              "step before answering.\n\n{question}\n\nA) {A}\nB) {B}\nC) {C}\nD) {D}")
LETTERS = "ABCD"


def _user(text: str) -> list[dict]:
    return [{"role": "user", "content": text}]


def rlcsd_math(problem: str) -> list[dict]:
    """``Problem: <problem>\\n\\n<BOXED_INSTRUCTION>`` (RLCSD training rows)."""
    return _user(f"Problem: {problem}\n\n{BOXED_INSTRUCTION}")


def boxed(problem: str) -> list[dict]:
    """``<problem>\\n\\n<BOXED_INSTRUCTION>`` (RLCSD evaluation rows, math benchmarks)."""
    return _user(f"{problem}\n\n{BOXED_INSTRUCTION}")


def dapo(problem: str) -> list[dict]:
    """DAPO-Math-17k's turn: :data:`DAPO_PREFIX` + problem + :data:`DAPO_SUFFIX`."""
    return _user(f"{DAPO_PREFIX}{problem}{DAPO_SUFFIX}")


def papo(problem: str) -> list[dict]:
    """PAPO's turn: preamble, problem, the boxed request."""
    return _user(f"{PAPO_PREAMBLE}\n\n{problem}\n\n{PAPO_ASK}")


def score_gsm8k(problem: str) -> list[dict]:
    """SCoRe's GSM8K turns: system task prompt, ``Question:\\n<question>``."""
    return [{"role": "system", "content": SCORE_GSM8K_SYSTEM}, {"role": "user", "content": f"Question:\n{problem}"}]


def score_math(problem: str) -> list[dict]:
    """SCoRe's MATH turns: system task prompt, ``Question:\\n<question>``."""
    return [{"role": "system", "content": SCORE_MATH_SYSTEM}, {"role": "user", "content": f"Question:\n{problem}"}]


def gpqa(problem: str, options: list[str]) -> list[dict]:
    """simple-evals' multiple-choice query with the four (already shuffled) options A-D."""
    if len(options) != 4:
        raise ValueError(f"gpqa: 4 options expected, got {len(options)}")
    return _user(GPQA_QUERY.format(question=problem, **dict(zip(LETTERS, options))))


TEMPLATES: dict[str, Callable[..., list[dict]]] = {
    "rlcsd_math": rlcsd_math, "boxed": boxed, "dapo": dapo, "papo": papo,
    "score_gsm8k": score_gsm8k, "score_math": score_math, "gpqa": gpqa,
}


#: templates of a bare problem that ``data prepare --template`` may put on a math benchmark, and the
#: data_source each pairs with (None: the benchmark's own); DAPO's validation rows are ``math_dapo``
#: rows in its "Answer:" format, scored by the ``dapo`` reward
BENCHMARK_TEMPLATES: dict[str, str | None] = {"boxed": None, "rlcsd_math": None, "papo": None, "dapo": "math_dapo"}


def strip_dapo(content: str) -> str:
    """The problem inside a DAPO-Math-17k user turn (the inverse of :func:`dapo`); a turn without the
    DAPO wrapper is returned stripped as it is."""
    s = content
    if s.startswith(DAPO_PREFIX):
        s = s[len(DAPO_PREFIX):]
    if s.endswith(DAPO_SUFFIX):
        s = s[: -len(DAPO_SUFFIX)]
    return s.strip()
