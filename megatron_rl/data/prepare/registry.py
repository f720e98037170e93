"""The sources ``megatron-rl data prepare`` knows: name -> :class:`Source` (registration), and the
field readers every converter shares (a bad field raises :class:`Skip`, counted by reason)."""
from __future__ import annotations

import dataclasses
import re
from typing import Callable

from megatron_rl.rewards.extract import strip_think


class Skip(ValueError):
    """A record that is not written. ``bad``: a defect of the record (null / empty field, unparsable
    answer: ``--strict`` refuses it); otherwise a filter (out of the band, not in the subset)."""

    def __init__(self, reason: str, bad: bool = True):
        super().__init__(reason)
        self.reason, self.bad = reason, bad


@dataclasses.dataclass(frozen=True)
class Source:
    """One preparable source. ``convert(record, seed) -> (dedupe key, verl row)`` raises :class:`Skip`.
    ``split``: the output file's split (``train`` / ``val`` / ``test``); ``shuffle``: seeded shuffle of
    the kept rows (train sets; benchmarks keep the file order); ``max_rows``: default cap (after the
    shuffle); ``parts``: a multi-input source's named inputs (``--in NAME=PATH`` each), whose records
    the part's own source converts; ``columns``: the columns read from parquet (None: all)."""

    name: str
    dataset: str
    convert: Callable[[dict, int], tuple[str, dict]] | None
    split: str = "test"
    shuffle: bool = False
    max_rows: int | None = None
    dedupe: bool = True
    columns: tuple[str, ...] | None = None
    parts: tuple[str, ...] = ()
    retemplate: bool = False
    """``--template`` may re-render the prompt from ``extra_info.problem`` (the math benchmarks, which each
    recipe asks in its own format)."""


SOURCES: dict[str, Source] = {}


def register(src: Source) -> Source:
    if src.name in SOURCES:
        raise ValueError(f"data source {src.name!r} registered twice")
    SOURCES[src.name] = src
    return src


def get_source(name: str) -> Source:
    try:
        return SOURCES[name]
    except KeyError:
        raise KeyError(f"unknown data source {name!r}; valid: {', '.join(sorted(SOURCES))}") from None


def source_names() -> list[str]:
    return sorted(SOURCES)


# --- field readers -----------------------------------------------------------------------------
def pick(rec: dict, *names: str) -> object:
    """The value of the first of ``names`` present in ``rec`` (None when none is)."""
    for n in names:
        if n in rec:
            return rec[n]
    return None


def text(rec: dict, *names: str) -> str:
    """A non-empty string field (first of ``names``); ``Skip("null or empty <name>")`` otherwise."""
    v = pick(rec, *names)
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        v = str(v)
    _not_text(v, names[0])
    if not isinstance(v, str) or not v.strip():
        raise Skip(f"null or empty {names[0]}")
    return v.strip()


def _not_text(v: object, name: str) -> None:
    """A value of the wrong type (a struct, a list, a bool where text belongs) is its own skip reason,
    with the type: "null or empty" would send the user looking for missing data."""
    if v is not None and not isinstance(v, str):
        raise Skip(f"{name} is a {type(v).__name__}, not text")


_DOLLAR = re.compile(r"^\$+(.*?)\$+$", re.S)


def answer(rec: dict, *names: str) -> str:
    """A final answer (first of ``names``): integers as written, integral floats without ``.0`` (the hub
    serves some answer columns as float), ``$…$`` peeled; ``Skip("unparsable answer")`` for unbalanced
    braces, ``Skip("null or empty <name>")`` for a missing one."""
    return answer_value(pick(rec, *names), names[0])


def answer_value(v: object, name: str) -> str:
    """:func:`answer` of the value ``v`` of field ``name``."""
    if isinstance(v, float) and v.is_integer():
        v = int(v)
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        v = str(v)
    _not_text(v, name)
    if not isinstance(v, str) or not v.strip():
        raise Skip(f"null or empty {name}")
    s = _DOLLAR.sub(r"\1", v.strip()).strip()
    if not s:
        raise Skip(f"null or empty {name}")
    if not braces_balanced(s):
        raise Skip("unparsable answer")
    return s


def braces_balanced(s: str) -> bool:
    """Every ``{`` closed in order (escaped ``\\{`` / ``\\}`` count as text)."""
    depth = 0
    s = s.replace("\\{", "").replace("\\}", "")
    for c in s:
        depth += {"{": 1, "}": -1}.get(c, 0)
        if depth < 0:
            return False
    return depth == 0


def solution_text(v: object) -> str:
    """A reference solution as text (``<think>`` blocks removed; a list joined by blank lines)."""
    if isinstance(v, (list, tuple)):
        v = "\n\n".join(str(x) for x in v if x)
    return strip_think(str(v)).strip() if v else ""


def dedupe_key(problem: str) -> str:
    """Problems equal up to whitespace and case are duplicates."""
    return " ".join(problem.split()).lower()


def verl_row(data_source: str, prompt: list[dict], ground_truth: str, ability: str = "math", **extra) -> dict:
    """One row in verl's columns (``extra_info.split`` / ``index`` are set when the file is written). The
    source fields of ``extra_info`` are strings ("" for none), so prepared files of different sources
    concatenate into one parquet."""
    info = {k: "" if v is None else str(v) for k, v in extra.items()}
    return {"data_source": data_source, "prompt": prompt, "ability": ability,
            "reward_model": {"style": "rule", "ground_truth": ground_truth}, "extra_info": info}
