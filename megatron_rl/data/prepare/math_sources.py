"""Math sources: DeepMath-103K in RLCSD's difficulty bands, PAPO's NuminaMath 20k, MATH-500, AIME 2024 /
2025, AMC23, OlympiadBench, Hendrycks MATH (SCoRe) and RLCSD's AMC23+AIME24+AIME25 evaluation file.
The upstream columns are the constants below, each naming the hub dataset whose schema it is.
"""
from __future__ import annotations

from megatron_rl.data import prompts
from megatron_rl.data.prepare.registry import (Skip, Source, answer, answer_value, braces_balanced, dedupe_key, pick, register, solution_text,
                                               text, verl_row)
from megatron_rl.rewards.extract import last_boxed

#: zwhe99/DeepMath-103K
DEEPMATH_COLUMNS = ("question", "final_answer", "difficulty", "topic", "r1_solution_1", "r1_solution_2", "r1_solution_3")
#: RLCSD's bands (THU-BPM/RLCSD ``deepmath_filtered_<band>``): inclusive bounds on ``difficulty``
DEEPMATH_BANDS = {"level5_7": (5.0, 7.0), "level6_8": (6.0, 8.0), "level7_10": (7.0, 10.0)}
#: RLCSD's ``max_train_samples``
DEEPMATH_CAP = 60000
#: Artemis0430/NuminaMath-20k-Stratified (NuminaMath-1.5 columns); answers NuminaMath marks as not verifiable
NUMINA_COLUMNS = ("problem", "solution", "answer", "problem_type", "question_type", "source")
NUMINA_NO_ANSWER = {"proof", "notfound", "none", "n/a"}
#: HuggingFaceH4/MATH-500
MATH500_COLUMNS = ("problem", "solution", "answer", "subject", "level", "unique_id")
#: AIME 2024 / 2025 and AMC23 as the hub serves them: Maxwell-Jia/AIME_2024 (``ID``, ``Problem``,
#: ``Solution``, ``Answer``), HuggingFaceH4/aime_2024 and math-ai/aime25 (``id``, ``problem``, ``solution``,
#: ``answer``), opencompass/AIME2025 (``question``, ``answer``), math-ai/amc23 (``id``, ``question``, ``answer``),
#: AI-MO/aimo-validation-amc (``id``, ``problem``, ``answer`` as float)
COMPETITION_PROBLEM = ("problem", "Problem", "question", "Question")
COMPETITION_ANSWER = ("answer", "Answer")
COMPETITION_ID = ("id", "ID", "unique_id")
#: Hothan/OlympiadBench (``OE_TO_maths_en_COMP``): ``final_answer`` is a list of strings
OLYMPIAD_COLUMNS = ("id", "question", "context", "final_answer", "solution", "is_multiple_answer", "unit",
                    "answer_type", "subfield", "subject", "language", "modality", "image_1", "image_2", "image_3",
                    "image_4", "image_5")
#: hendrycks/competition_math (EleutherAI/hendrycks_math) test: the answer is the last box of ``solution``
HENDRYCKS_COLUMNS = ("problem", "level", "type", "solution")


def _deepmath(band: str):
    lo, hi = DEEPMATH_BANDS[band]

    def convert(rec: dict, seed: int) -> tuple[str, dict]:
        """DeepMath row -> RLCSD training row: the band filter on ``difficulty``, ``Problem:`` prompt,
        the first non-empty ``r1_solution_<k>`` as the privileged reference solution."""
        q = text(rec, "question")
        d = rec.get("difficulty")
        if d is None:
            raise Skip("null or empty difficulty")
        try:
            d = float(d)
        except (TypeError, ValueError):
            raise Skip("unparsable difficulty") from None
        if not lo <= d <= hi:
            raise Skip(f"difficulty outside {band}", bad=False)
        gt = answer(rec, "final_answer")
        sol = next((s for s in (solution_text(rec.get(f"r1_solution_{k}")) for k in (1, 2, 3)) if s), "")
        if not sol:
            raise Skip("null or empty r1_solution_1..3")
        return dedupe_key(q), verl_row("deepmath", prompts.rlcsd_math(q), gt, problem=q, reference_solution=sol,
                                       difficulty=d, topic=rec.get("topic") or "")
    return convert


def numina(rec: dict, seed: int) -> tuple[str, dict]:
    """NuminaMath row -> PAPO training row (data_source ``numina_math_process``, ``extra_info.question``
    and ``reference_solution`` for the rubric grader)."""
    q = text(rec, "problem")
    gt = answer(rec, "answer")
    if gt.lower() in NUMINA_NO_ANSWER:
        raise Skip("no verifiable answer")
    sol = solution_text(rec.get("solution"))
    if not sol:
        raise Skip("null or empty solution")
    meta = {k: rec.get(k) or "" for k in ("problem_type", "question_type", "source")}
    return dedupe_key(q), verl_row("numina_math_process", prompts.papo(q), gt, question=q, reference_solution=sol, **meta)


def math500(rec: dict, seed: int) -> tuple[str, dict]:
    """MATH-500 row -> benchmark row (boxed prompt, data_source ``math500``)."""
    q = text(rec, "problem")
    gt = answer(rec, "answer")
    return dedupe_key(q), verl_row("math500", prompts.boxed(q), gt, problem=q,
                                   reference_solution=solution_text(rec.get("solution")), subject=rec.get("subject") or "",
                                   level=rec.get("level") or "", unique_id=rec.get("unique_id") or "")


def _competition(data_source: str):
    def convert(rec: dict, seed: int) -> tuple[str, dict]:
        """AIME / AMC row (any of the hub's column spellings) -> benchmark row (boxed prompt)."""
        q = text(rec, *COMPETITION_PROBLEM)
        gt = answer(rec, *COMPETITION_ANSWER)
        ident = pick(rec, *COMPETITION_ID)
        return dedupe_key(q), verl_row(data_source, prompts.boxed(q), gt, problem=q,
                                       reference_solution=solution_text(pick(rec, "solution", "Solution")),
                                       id="" if ident is None else str(ident))
    return convert


def olympiadbench(rec: dict, seed: int) -> tuple[str, dict]:
    """OlympiadBench row -> benchmark row: text-only English math only (PAPO's 674-problem set),
    ``final_answer`` list joined by ``, `` (multi-answer problems), data_source ``olympiadbench``."""
    lang, subj, mod = rec.get("language"), rec.get("subject"), rec.get("modality")
    if (lang not in (None, "English") or subj not in (None, "Math") or mod not in (None, "Text-only")
            or any(rec.get(f"image_{k}") for k in range(1, 6))):
        raise Skip("not text-only English math", bad=False)
    q = text(rec, "question")
    if rec.get("context"):
        q = f"{str(rec['context']).strip()}\n\n{q}"
    fa = rec.get("final_answer")
    parts = [answer_value(a, "final_answer") for a in (fa if isinstance(fa, (list, tuple)) else [fa]) if a is not None]
    if not parts:
        raise Skip("null or empty final_answer")
    return dedupe_key(q), verl_row("olympiadbench", prompts.boxed(q), ", ".join(parts), problem=q,
                                   reference_solution=solution_text(rec.get("solution")), id=str(rec.get("id") or ""),
                                   subfield=rec.get("subfield") or "", unit=rec.get("unit") or "",
                                   answer_type=rec.get("answer_type") or "")


def hendrycks_math(rec: dict, seed: int) -> tuple[str, dict]:
    """Hendrycks MATH test row -> SCoRe row: the answer is the last ``\\boxed{}`` of the solution; the
    ground truth keeps the box (SCoRe's ``math_final_answer`` extractor reads the target's box)."""
    q = text(rec, "problem")
    sol = text(rec, "solution")
    box = last_boxed(sol)
    if box is None or not box.strip() or not braces_balanced(box):
        raise Skip("unparsable answer")
    return dedupe_key(q), verl_row("score_math", prompts.score_math(q), f"\\boxed{{{box.strip()}}}", problem=q,
                                   reference_solution=sol, level=rec.get("level") or "", type=rec.get("type") or "")


for _band in DEEPMATH_BANDS:
    register(Source(f"deepmath_filtered_{_band}", "zwhe99/DeepMath-103K", _deepmath(_band), split="train",
                    shuffle=True, max_rows=DEEPMATH_CAP, columns=DEEPMATH_COLUMNS))
register(Source("numinamath_20k_stratified", "Artemis0430/NuminaMath-20k-Stratified", numina, split="train",
                shuffle=True, columns=NUMINA_COLUMNS))
register(Source("math500", "HuggingFaceH4/MATH-500", math500, columns=MATH500_COLUMNS, retemplate=True))
for _name, _ds in (("aime24", "HuggingFaceH4/aime_2024 or Maxwell-Jia/AIME_2024"),
                   ("aime25", "math-ai/aime25, yentinglin/aime_2025 or opencompass/AIME2025"),
                   ("amc23", "math-ai/amc23 or AI-MO/aimo-validation-amc")):
    register(Source(_name, _ds, _competition(_name), retemplate=True))
register(Source("olympiadbench", "Hothan/OlympiadBench (OE_TO_maths_en_COMP)", olympiadbench, columns=OLYMPIAD_COLUMNS,
                retemplate=True))
register(Source("math", "EleutherAI/hendrycks_math (test)", hendrycks_math, columns=HENDRYCKS_COLUMNS))
register(Source("rlcsd_math_eval", "AMC23 + AIME24 + AIME25 (--in amc23=PATH --in aime24=PATH --in aime25=PATH)",
                None, split="val", parts=("amc23", "aime24", "aime25")))
