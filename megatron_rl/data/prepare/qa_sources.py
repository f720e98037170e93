"""GSM8K (SCoRe) and GPQA-Diamond (PAPO's table; options shuffled per row with a fixed seed, scored by
the ``gpqa`` letter reward)."""
from __future__ import annotations

import hashlib
import random
import re

from megatron_rl.data import prompts
from megatron_rl.data.prepare.registry import Skip, Source, dedupe_key, register, text, verl_row

#: openai/gsm8k (``main``): ``answer`` is the worked solution ending in ``#### N``
GSM8K_COLUMNS = ("question", "answer")
_HASH = re.compile(r"####\s*(-?[\d,]*\.?\d+)\s*$")
#: Idavidrein/gpqa (``gpqa_diamond``): the question, the correct and three incorrect answers
GPQA_COLUMNS = ("Question", "Correct Answer", "Incorrect Answer 1", "Incorrect Answer 2", "Incorrect Answer 3",
                "Record ID", "High-level domain", "Subdomain", "Explanation")


def gsm8k(rec: dict, seed: int) -> tuple[str, dict]:
    """GSM8K row -> SCoRe row: the number after ``####`` (thousands commas removed) is the ground truth
    (SCoRe's ``gsm8k_hash`` extracts it from a response), the worked text the reference solution."""
    q = text(rec, "question")
    full = text(rec, "answer")
    m = _HASH.search(full)
    if m is None:
        raise Skip("unparsable answer")
    gt = m.group(1).replace(",", "")
    return dedupe_key(q), verl_row("score_gsm8k", prompts.score_gsm8k(q), gt, problem=q,
                                   reference_solution=full[: m.start()].strip())


def shuffled_options(correct: str, wrong: list[str], seed: int, key: str) -> tuple[list[str], str]:
    """The four options in a per-row order fixed by ``seed`` and the row's ``key`` (not by its position,
    so it survives reordering), and the correct letter."""
    digest = hashlib.sha256(f"{seed}\0{key}".encode()).hexdigest()
    order = list(range(4))
    random.Random(int(digest[:16], 16)).shuffle(order)
    opts = [[correct, *wrong][i] for i in order]
    return opts, prompts.LETTERS[order.index(0)]


def gpqa(rec: dict, seed: int) -> tuple[str, dict]:
    """GPQA row -> multiple-choice row (simple-evals' query), ground truth the correct letter."""
    q = text(rec, "Question")
    correct = text(rec, "Correct Answer")
    wrong = [text(rec, f"Incorrect Answer {k}") for k in (1, 2, 3)]
    if len({o.strip() for o in [correct, *wrong]}) < 4:
        raise Skip("duplicate options")
    key = str(rec.get("Record ID") or q)
    opts, letter = shuffled_options(correct, wrong, seed, key)
    return dedupe_key(q), verl_row("gpqa_diamond", prompts.gpqa(q, opts), letter, ability="science", problem=q,
                                   reference_solution=str(rec.get("Explanation") or ""), record_id=key,
                                   domain=rec.get("High-level domain") or "", subdomain=rec.get("Subdomain") or "")


register(Source("gsm8k", "openai/gsm8k (main)", gsm8k, columns=GSM8K_COLUMNS))
register(Source("gpqa_diamond", "Idavidrein/gpqa (gpqa_diamond)", gpqa, columns=GPQA_COLUMNS))
