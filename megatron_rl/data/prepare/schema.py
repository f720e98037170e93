"""The columns each ``data prepare`` source cannot do without, checked per input file before a row is
read: a file in another source's schema, or missing a column, is one line naming the columns expected
and found, and the source(s) whose schema the file fits (it was "null or empty X" once per row).

``REQUIRED[source]`` is a tuple of column groups; a group is satisfied by any one of its names (the
hub serves AIME / AMC under several spellings, ``math_sources.COMPETITION_*``). The names come from
the converters of ``math_sources`` / ``qa_sources`` / ``verl_sources`` (``text(rec, ...)`` /
``answer(rec, ...)`` fields that are never optional).
"""
from __future__ import annotations

from pathlib import Path

from megatron_rl.data.prepare import io
from megatron_rl.data.prepare.math_sources import COMPETITION_ANSWER, COMPETITION_PROBLEM
from megatron_rl.data.prepare.registry import SOURCES, Source

_DEEPMATH = (("question",), ("final_answer",), ("difficulty",), ("r1_solution_1", "r1_solution_2", "r1_solution_3"))
_COMPETITION = (COMPETITION_PROBLEM, COMPETITION_ANSWER)

REQUIRED: dict[str, tuple[tuple[str, ...], ...]] = {
    "deepmath_filtered_level5_7": _DEEPMATH, "deepmath_filtered_level6_8": _DEEPMATH,
    "deepmath_filtered_level7_10": _DEEPMATH,
    "numinamath_20k_stratified": (("problem",), ("answer",), ("solution",)),
    "math500": (("problem",), ("answer",)),
    "aime24": _COMPETITION, "aime25": _COMPETITION, "amc23": _COMPETITION,
    "olympiadbench": (("question",), ("final_answer",)),
    "math": (("problem",), ("solution",)),
    "gsm8k": (("question",), ("answer",)),
    "gpqa_diamond": (("Question",), ("Correct Answer",), ("Incorrect Answer 1",), ("Incorrect Answer 2",),
                     ("Incorrect Answer 3",)),
    "dapo_math_17k": (("prompt",), ("reward_model",)),
    "verl": (("prompt",), ("data_source",), ("reward_model",)),
}


def fits(source: str, columns: set[str]) -> bool:
    return source in REQUIRED and all(any(c in columns for c in group) for group in REQUIRED[source])


def _known(source: str) -> set[str]:
    """The columns a source's upstream file has (its ``columns``, else its required names)."""
    src = SOURCES[source]
    return set(src.columns or ()) | {c for g in REQUIRED[source] for c in g}


def guess(columns: set[str], exclude: str = "") -> list[str]:
    """The sources whose required columns ``columns`` has, best match (Jaccard of the column sets) first;
    only the best-scoring ones."""
    scored = [(len(columns & _known(s)) / len(columns | _known(s)), s) for s in sorted(REQUIRED)
              if s != exclude and fits(s, columns)]
    if not scored:
        return []
    top = max(v for v, _ in scored)
    return [s for v, s in scored if v == top]


def check_columns(src: Source, f: Path) -> None:
    """Raise one ``ValueError`` line when ``f`` lacks a column ``src`` needs (see the module docstring)."""
    if src.name not in REQUIRED:
        return
    cols = io.file_columns(f)
    missing = [g for g in REQUIRED[src.name] if not any(c in cols for c in g)]
    if not missing:
        return
    want = ", ".join(" or ".join(g) for g in REQUIRED[src.name])
    line = (f"--in {f}: {src.name} reads the column(s) {want} ({src.dataset}); the file has "
            f"{', '.join(sorted(cols)) or 'none'}: no {' or '.join(missing[0])}")
    other = guess(set(cols), exclude=src.name)
    if other:
        line += (f". Its columns are those of {' / '.join(other)}: megatron-rl data prepare {other[0]} --in {f}"
                 if len(other) == 1 else f". Its columns fit {', '.join(other)}: prepare it as one of them")
    raise ValueError(line)
