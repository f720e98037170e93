"""One ``data prepare`` run: read -> convert (skip and count bad rows) -> de-duplicate -> seeded shuffle
-> cap -> split -> write ``<split>.parquet`` + ``manifest.json`` atomically into ``--out``.

Determinism: the same inputs, source, seed and flags give byte-identical rows (the shuffle is
``random.Random(seed)`` over the kept rows in input order; GPQA's option order is seeded per row).
"""
from __future__ import annotations

import collections
import dataclasses
import json
import random
import re
import sys
from pathlib import Path

from tqdm import tqdm

from megatron_rl import __version__
from megatron_rl.data import prompts
from megatron_rl.data.prepare import io, schema
from megatron_rl.data.prepare.registry import Skip, Source, get_source
from megatron_rl.runtime.diskspace import check_writable

#: inputs with more rows than this get a progress bar (stderr)
PROGRESS_ROWS = 10000


@dataclasses.dataclass
class PrepareRequest:
    """What ``megatron-rl data prepare`` was asked: ``inputs`` = ``[(part name or "", path)]``."""

    source: str
    inputs: list[tuple[str, str]]
    out: str
    seed: int = 0
    force: bool = False
    strict: bool = False
    max_rows: int | None = None
    val_rows: int = 0
    split: str | None = None
    template: str | None = None
    command: str = ""


@dataclasses.dataclass
class Counts:
    read: int = 0
    kept: int = 0
    skipped: collections.Counter = dataclasses.field(default_factory=collections.Counter)   # bad rows
    filtered: collections.Counter = dataclasses.field(default_factory=collections.Counter)  # not in the subset
    first: dict = dataclasses.field(default_factory=dict)   # skip reason -> where it first happened

    def line(self, source: str, written: dict[str, int]) -> str:
        """The one summary line (skips by reason, so nothing is dropped silently)."""
        sizes = ", ".join(f"{k} {v}" for k, v in written.items())
        parts = [f"{source}: read {self.read} rows, wrote {sum(written.values())} ({sizes})"]
        if self.skipped:
            parts.append(f"skipped {sum(self.skipped.values())} bad rows ("
                         + ", ".join(f"{n} {r}" for r, n in self.skipped.most_common()) + ")")
        if self.filtered:
            parts.append(f"left out {sum(self.filtered.values())} ("
                         + ", ".join(f"{n} {r}" for r, n in self.filtered.most_common()) + ")")
        return "; ".join(parts)


def _parts(src: Source, inputs: list[tuple[str, str]]) -> list[tuple[Source, str]]:
    """``(converting source, path)`` per input; a multi-input source needs each part named once."""
    if not src.parts:
        if len(inputs) != 1 or inputs[0][0]:
            raise ValueError(f"data prepare {src.name}: give exactly one --in PATH (a file or a directory of shards)")
        return [(src, inputs[0][1])]
    names = [n for n, _ in inputs]
    if sorted(names) != sorted(src.parts):
        raise ValueError(f"data prepare {src.name}: give one --in NAME=PATH for each of {', '.join(src.parts)} "
                         f"(got {', '.join(n or 'PATH' for n in names)})")
    by = dict(inputs)
    return [(get_source(n), by[n]) for n in src.parts]


def _convert(part: Source, rec: dict, seed: int) -> tuple[str, dict]:
    """``part.convert``; a record whose fields have unexpected types is a bad row (``Skip``), not a crash."""
    try:
        return part.convert(rec, seed)
    except Skip:
        raise
    except (TypeError, ValueError, AttributeError, KeyError) as e:
        raise Skip(f"malformed record ({type(e).__name__})") from e


def _collect(src: Source, req: PrepareRequest, counts: Counts) -> tuple[list[dict], list[Path]]:
    """Converted rows in input order, duplicates and skips counted; ``--strict`` raises on a bad row."""
    rows, seen, files_all = [], set(), []
    for part, path in _parts(src, req.inputs):
        files = io.input_files(path)
        files_all += files
        total = io.count_rows(files)
        for f in files:   # a file in another source's schema: one line now, not a skip per row
            schema.check_columns(part, f)
        bar = tqdm(total=total, desc=f"prepare {part.name}", unit="row", file=sys.stderr,
                   disable=total <= PROGRESS_ROWS)
        for where, rec in io.iter_records(files, part.columns):
            counts.read += 1
            bar.update(1)
            try:
                if not isinstance(rec, dict):
                    raise Skip("not a JSON object")
                key, row = _convert(part, rec, req.seed)
            except Skip as e:
                if e.bad and req.strict:
                    raise ValueError(f"{where}: {e.reason} (--strict refuses bad rows; drop --strict to skip "
                                     "and count them)") from None
                (counts.skipped if e.bad else counts.filtered)[e.reason] += 1
                counts.first.setdefault(e.reason, where)
                continue
            if src.dedupe and key in seen:
                counts.filtered["duplicate problem"] += 1
                continue
            seen.add(key)
            rows.append(row)
        bar.close()
    return rows, files_all


def _retemplate(src: Source, rows: list[dict], template: str) -> None:
    """``--template``: the prompt re-rendered from ``extra_info.problem`` with a recipe's template, and
    the data_source it pairs with (``prompts.BENCHMARK_TEMPLATES``; the benchmark's name is kept in
    ``extra_info.benchmark``)."""
    if not src.retemplate:
        raise ValueError(f"--template applies to the math benchmarks only, not to {src.name!r} (its prompt is its recipe's)")
    if template not in prompts.BENCHMARK_TEMPLATES:
        raise ValueError(f"--template {template!r}: valid: {', '.join(prompts.BENCHMARK_TEMPLATES)}")
    pairs = prompts.BENCHMARK_TEMPLATES[template]
    for r in rows:
        r["prompt"] = prompts.TEMPLATES[template](r["extra_info"]["problem"])
        r["extra_info"] = {**r["extra_info"], "benchmark": r["data_source"], "template": template}
        r["data_source"] = pairs or r["data_source"]


def _splits(src: Source, req: PrepareRequest, rows: list[dict]) -> dict[str, list[dict]]:
    if src.shuffle:
        random.Random(req.seed).shuffle(rows)
    cap = req.max_rows if req.max_rows is not None else src.max_rows
    if cap is not None:
        rows = rows[:cap]
    main = req.split or src.split
    if req.val_rows:
        if req.val_rows >= len(rows):
            raise ValueError(f"--val-rows {req.val_rows} leaves no {main} rows ({len(rows)} rows kept)")
        out = {"val": rows[: req.val_rows], main: rows[req.val_rows:]}
    else:
        out = {main: rows}
    if not src.dedupe:   # passthrough: rows as they are
        return out
    for split, part in out.items():
        for i, r in enumerate(part):
            r["extra_info"] = {"split": split, "index": i, **r["extra_info"]}
    return out


def _no_rows(src: Source, req: PrepareRequest, counts: Counts, files: list[Path]) -> str:
    """The line for a run that kept nothing: the file(s), the reasons by count and where the commonest
    first happened."""
    where = str(files[0]) if len(files) == 1 else f"--in {', '.join(p for _, p in req.inputs)}"
    why = counts.skipped + counts.filtered
    reasons = ", ".join(f"{n} {r}" for r, n in why.most_common())
    top = why.most_common(1)[0][0] if why else ""
    return (f"data prepare {src.name}: no usable rows in {where}: all {counts.read} rows skipped ({reasons})"
            + (f"; first at {counts.first[top]}" if top in counts.first else ""))


#: ``--split``: a plain name (it becomes OUT/<split>.parquet; nothing may land outside --out)
_SPLIT_NAME = re.compile(r"^[A-Za-z0-9_-]+$")


def check_request(src: Source, req: PrepareRequest) -> None:
    """The request's own values, before anything is read or written: ``--split`` a plain name that
    does not collide with ``--val-rows``' val; ``--val-rows`` >= 0; ``--template`` valid for the source;
    ``--out`` writable (its own path in the line, not the temp dir beside it)."""
    if req.split is not None and not _SPLIT_NAME.match(req.split):
        raise ValueError(f"--split {req.split!r}: a split is a plain name (letters, digits, _ and -): it names "
                         "OUT/<split>.parquet, so nothing is written outside --out; e.g. --split test")
    if req.val_rows and req.val_rows < 0:
        raise ValueError(f"--val-rows must be >= 0, got {req.val_rows}")
    if req.val_rows and (req.split or src.split) == "val":
        raise ValueError(f"--split val with --val-rows {req.val_rows}: both would write val.parquet; name the main "
                         "split something else (or drop --val-rows)")
    if req.template is not None:
        _retemplate(src, [], req.template)   # a bad --template fails before reading
    check_writable(req.out, "--out")
    io.check_out_dir(req.out, req.force)


def prepare(req: PrepareRequest) -> dict:
    """Run one ``data prepare`` (module docstring); returns the manifest (with ``summary``: the line)."""
    src = get_source(req.source)
    check_request(src, req)
    counts = Counts()
    rows, files = _collect(src, req, counts)
    if not rows:
        raise ValueError(_no_rows(src, req, counts, files))
    if req.template is not None:
        _retemplate(src, rows, req.template)
    splits = _splits(src, req, rows)
    manifest = {"tool": io.TOOL, "source": src.name, "template": req.template, "dataset": src.dataset, "version": __version__,
                "command": req.command, "seed": req.seed, "max_rows": req.max_rows if req.max_rows is not None else src.max_rows,
                "val_rows": req.val_rows, "read": counts.read, "skipped": dict(counts.skipped),
                "left_out": dict(counts.filtered),
                "inputs": [{"path": str(f.resolve()), "sha256": io.sha256(f)} for f in files], "outputs": {}}
    with io.atomic_out(req.out, req.force) as tmp:
        for split, part in splits.items():
            path = tmp / f"{split}.parquet"
            io.write_rows(part, path)
            manifest["outputs"][split] = {"file": path.name, "rows": len(part), "sha256": io.sha256(path)}
        manifest["summary"] = counts.line(src.name, {k: len(v) for k, v in splits.items()})
        (tmp / io.MANIFEST).write_text(json.dumps(manifest, indent=1, ensure_ascii=False) + "\n")
    return manifest
