"""Reading what the hub serves (parquet or JSONL, one file or a directory of shards), writing prepared
parquet files, hashing, and the ``--out`` rule of ``megatron-rl data prepare``.

``--out`` (as ``megatron-rl convert`` has it, ``convert/atomic.py``): a missing or empty directory is
written; a directory holding only what an earlier ``data prepare`` wrote (``manifest.json`` naming
``megatron-rl data prepare`` plus its parquet files) is replaced only with ``--force``; anything else
is refused with or without ``--force``. Files are written into a temp dir beside ``--out`` and renamed
into place, so a failed run leaves nothing half-written.
"""
from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterator
from pathlib import Path

from megatron_rl.runtime.out_dir import atomic_dir, out_entries, refuse_foreign

SUFFIXES = (".parquet", ".jsonl", ".json")
MANIFEST = "manifest.json"
TOOL = "megatron-rl data prepare"


def input_files(path: str | os.PathLike) -> list[Path]:
    """The data files of ``path``: itself, or the ``*.parquet`` / ``*.jsonl`` / ``*.json`` shards under
    the directory (recursively, sorted by relative path). One line when there are none."""
    p = Path(path)
    if not p.exists():
        raise FileNotFoundError(f"--in {p}: no such file or directory")
    if p.is_file():
        if not p.name.endswith(SUFFIXES):
            raise ValueError(f"--in {p}: not a parquet or JSONL file (expected one of {', '.join(SUFFIXES)})")
        return [p]
    files = sorted((f for f in p.rglob("*") if f.is_file() and f.name.endswith(SUFFIXES)
                    and not any(part.startswith(".") for part in f.relative_to(p).parts)),
                   key=lambda f: f.relative_to(p).as_posix())
    if not files:
        raise FileNotFoundError(f"--in {p}: the directory holds no {', '.join(SUFFIXES)} files")
    return files


def count_rows(files: list[Path]) -> int:
    """Rows in ``files`` (parquet metadata; JSONL lines), for the progress bar."""
    import pyarrow.parquet as pq  # lazy: defers pyarrow to the call

    n = 0
    for f in files:
        if f.suffix == ".parquet":
            n += pq.ParquetFile(f).metadata.num_rows
        else:
            with open(f, "rb") as fh:
                n += sum(1 for line in fh if line.strip())
    return n


def iter_records(files: list[Path], columns: tuple[str, ...] | None = None) -> Iterator[tuple[str, dict]]:
    """``(where, record)`` for every row of ``files`` in order; ``where`` = ``file:row``. Parquet is
    streamed in batches reading only ``columns`` that exist (None: all); JSONL one object per line (a
    ``.json`` file may also be one JSON array of objects)."""
    import pyarrow.parquet as pq  # lazy: defers pyarrow to the call

    for f in files:
        if f.suffix == ".parquet":
            pf = pq.ParquetFile(f)
            cols = None if columns is None else [c for c in pf.schema_arrow.names if c in columns]
            i = 0
            for batch in pf.iter_batches(batch_size=2048, columns=cols):
                for rec in batch.to_pylist():
                    yield f"{f.name}:{i}", rec
                    i += 1
            continue
        yield from _json_records(f)


def _json_records(f: Path) -> Iterator[tuple[str, dict]]:
    with open(f, encoding="utf-8") as fh:
        head = fh.read(1)
        while head and head.isspace():
            head = fh.read(1)
        fh.seek(0)
        if head == "[":
            for i, rec in enumerate(json.load(fh)):
                yield f"{f.name}:{i}", rec
            return
        for ln, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except ValueError as e:
                raise ValueError(f"{f}:{ln}: not a JSON object ({e})") from None
            yield f"{f.name}:{ln}", rec


def sha256(path: str | os.PathLike) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def write_rows(rows: list[dict], path: Path) -> None:
    """``rows`` (verl columns) as one parquet file."""
    import pyarrow as pa  # lazy: defers pyarrow to the call
    import pyarrow.parquet as pq  # lazy: defers pyarrow to the call

    pq.write_table(pa.Table.from_pylist(rows), path)


def check_out_dir(target: str | os.PathLike, force: bool) -> Path:
    """Raise ``FileExistsError`` unless ``target`` may be (over)written (module docstring)."""
    target, entries = out_entries(target)
    if not entries:
        return target
    ours = _ours(target)
    foreign = [e for e in entries if not (ours and (e == MANIFEST or e.endswith(".parquet")))]
    if foreign:
        refuse_foreign(target, foreign, f"a directory written by '{TOOL}'", "our own output")
    if not force:
        raise FileExistsError(f"--out {target} already holds prepared data; pass --force to replace it")
    return target


def _ours(path: Path) -> bool:
    try:
        meta = json.loads((path / MANIFEST).read_text())
    except (OSError, ValueError):
        return False
    return isinstance(meta, dict) and meta.get("tool") == TOOL


def atomic_out(target: str | os.PathLike, force: bool):
    """Write into a fresh temp dir beside ``target``, renamed onto it on success
    (:func:`megatron_rl.runtime.out_dir.atomic_dir` under :func:`check_out_dir`)."""
    return atomic_dir(target, force, check_out_dir)
