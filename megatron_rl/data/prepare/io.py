"""Reading what the hub serves (parquet or JSONL, one file or a directory of shards), writing prepared
parquet files, hashing, and the ``--out`` rule of ``megatron-rl data prepare``.

``--out`` (as ``megatron-rl convert`` has it, ``convert/atomic.py``): a missing or empty directory is
written; a directory holding only what an earlier ``data prepare`` wrote (``manifest.json`` naming
``megatron-rl data prepare`` plus its parquet files) is replaced only with ``--force``; anything else
is refused with or without ``--force``. Files are written into a temp dir beside ``--out`` and renamed
into place, so a failed run leaves nothing half-written.
"""
from __future__ import annotations

import gzip
import hashlib
import json
import os
import re
from collections.abc import Iterator
from pathlib import Path

from megatron_rl.runtime.out_dir import atomic_dir, out_entries, refuse_foreign

SUFFIXES = (".parquet", ".jsonl", ".json", ".jsonl.gz", ".json.gz")
#: compressed files read only once decompressed: suffix -> (what, the command that decompresses ``{f}``)
DECOMPRESS = {".zst": ("zstd-compressed", "zstd -d {f}"), ".bz2": ("bzip2-compressed", "bunzip2 -k {f}"),
              ".xz": ("xz-compressed", "unxz -k {f}"), ".zip": ("a zip archive", "unzip {f}"),
              ".parquet.gz": ("gzip-compressed", "gunzip -k {f}")}
MANIFEST = "manifest.json"
TOOL = "megatron-rl data prepare"
#: a hub shard's name: ``<split>-00000-of-00003.parquet`` (or the split alone: ``test.jsonl``)
_SHARD = re.compile(r"^(?P<split>[A-Za-z_]+)(-\d+-of-\d+)?\.(parquet|jsonl|json)(\.gz)?$")
_SPLITS = ("train", "test", "validation", "valid", "val", "dev")


def _refuse_compressed(p: Path) -> None:
    for suffix, (what, cmd) in DECOMPRESS.items():
        if p.name.endswith(suffix):
            raise ValueError(f"--in {p}: {what}; decompress it first: {cmd.format(f=p)}")


def input_files(path: str | os.PathLike) -> list[Path]:
    """The data files of ``path``: itself, or the ``*.parquet`` / ``*.jsonl`` / ``*.json`` shards
    (``.gz`` too) under the directory (recursively, sorted by relative path). One line when there are
    none, for a compressed file we do not read (with the command that decompresses it), and for a
    directory holding several splits' shards (``train-*`` and ``test-*``: one of them was meant)."""
    p = Path(path)
    if not p.exists():
        raise FileNotFoundError(f"--in {p}: no such file or directory")
    if p.is_file():
        if not p.name.endswith(SUFFIXES):
            _refuse_compressed(p)
            raise ValueError(f"--in {p}: not a parquet or JSONL file (expected one of {', '.join(SUFFIXES)})")
        return [p]
    files = sorted((f for f in p.rglob("*") if f.is_file() and f.name.endswith(SUFFIXES)
                    and not any(part.startswith(".") for part in f.relative_to(p).parts)),
                   key=lambda f: f.relative_to(p).as_posix())
    if not files:
        raise FileNotFoundError(f"--in {p}: the directory holds no {', '.join(SUFFIXES)} files")
    _one_split(p, files)
    return files


def _one_split(p: Path, files: list[Path]) -> None:
    by: dict[str, list[Path]] = {}
    for f in files:
        m = _SHARD.match(f.name)
        if m and m["split"].lower() in _SPLITS:
            by.setdefault(m["split"].lower(), []).append(f)
    if len(by) > 1:
        shown = ", ".join(f"{s}: {len(fs)} file{'s' * (len(fs) > 1)}" for s, fs in sorted(by.items()))
        first = by["test"][0] if "test" in by else next(iter(by.values()))[0]
        raise ValueError(f"--in {p} holds files of several splits ({shown}): pass one of them, e.g. --in {first}")


def _parquet(f: Path):
    """``pq.ParquetFile(f)``; a file that is not one is a line naming it (JSON lines under a .parquet name,
    a cut-off download)."""
    import pyarrow as pa  # lazy: defers pyarrow to the call
    import pyarrow.parquet as pq  # lazy: defers pyarrow to the call

    try:
        return pq.ParquetFile(f)
    except (pa.ArrowException, OSError) as e:
        with open(f, "rb") as fh:
            head = fh.read(64).lstrip()
        if head[:1] in (b"{", b"["):
            raise ValueError(f"--in {f}: not a parquet file: it holds JSON lines; rename it to .jsonl") from None
        raise ValueError(f"--in {f}: not a readable parquet file (a cut-off download? {e})") from None


def _open_text(f: Path):
    """The binary stream of a JSON / JSONL file (gunzipped for ``.gz``)."""
    return gzip.open(f, "rb") if f.name.endswith(".gz") else open(f, "rb")


def decode_line(f: str | os.PathLike, ln: int, raw: bytes) -> str:
    """One line as text; a line that is not UTF-8 is one line naming the file, line, byte and column
    (a UTF-8 byte-order mark at the start of the file is dropped)."""
    if ln == 1 and raw.startswith(b"\xef\xbb\xbf"):
        raw = raw[3:]
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        col = len(raw[: e.start].decode("utf-8", "replace")) + 1
        raise ValueError(f"{f}:{ln}: not UTF-8 text (byte 0x{raw[e.start]:02x} at column {col}); re-encode the file "
                         f"as UTF-8, e.g. iconv -f LATIN1 -t UTF-8 {f} > {Path(f).stem}.utf8{Path(f).suffix}") from None


def count_rows(files: list[Path]) -> int:
    """Rows in ``files`` (parquet metadata; JSONL lines; a JSON array's length), for the progress bar;
    no rows at all is one line naming the file (an empty shard among full ones is fine)."""
    n = sum(_parquet(f).metadata.num_rows if f.suffix == ".parquet" else _json_rows(f) for f in files)
    if n == 0:
        raise ValueError(f"--in {files[0]}: the file is empty (0 rows)" if len(files) == 1 else
                         f"--in {files[0].parent}: all {len(files)} files are empty (0 rows)")
    return n


def _json_rows(f: Path) -> int:
    with _open_text(f) as fh:
        lines = sum(1 for line in fh if line.strip())
    if lines and _is_json_document(f):
        return len(_json_document(f))
    return lines


def file_columns(f: Path) -> list[str]:
    """The column names of a data file: the parquet schema; JSON(L): the keys of its first 100 objects."""
    if f.suffix == ".parquet":
        return list(_parquet(f).schema_arrow.names)
    cols: dict[str, None] = {}
    for i, (_, rec) in enumerate(_json_records(f)):
        if i >= 100:
            break
        if isinstance(rec, dict):
            cols.update(dict.fromkeys(rec))
    return list(cols)


def iter_records(files: list[Path], columns: tuple[str, ...] | None = None) -> Iterator[tuple[str, dict]]:
    """``(where, record)`` for every row of ``files`` in order; ``where`` = ``file:row``. Parquet is
    streamed in batches reading only ``columns`` that exist (None: all); JSONL one object per line (a
    ``.json`` file may also be one JSON array of objects)."""
    for f in files:
        if f.suffix == ".parquet":
            pf = _parquet(f)
            cols = None if columns is None else [c for c in pf.schema_arrow.names if c in columns]
            i = 0
            for batch in pf.iter_batches(batch_size=2048, columns=cols):
                for rec in batch.to_pylist():
                    yield f"{f.name}:{i}", rec
                    i += 1
            continue
        yield from _json_records(f)


def _is_json_document(f: Path) -> bool:
    """A ``.json`` file that is one JSON document (an array of rows, or an object) rather than JSON lines."""
    if not f.name.endswith((".json", ".json.gz")):
        return False
    with _open_text(f) as fh:
        head = fh.read(4096).lstrip(b"\xef\xbb\xbf \t\r\n")
    if head[:1] == b"[":
        return True
    if head[:1] != b"{":
        return False
    with _open_text(f) as fh:
        first = next((ln for ln in fh if ln.strip()), b"")
    try:   # JSON lines: the first line is a whole object
        json.loads(decode_line(f, 1, first))
        return False
    except ValueError:
        return True


def _json_document(f: Path) -> list:
    """The rows of a one-document ``.json`` file; an object wrapping the rows is refused with the key."""
    with _open_text(f) as fh:
        text = "\n".join(decode_line(f, ln, raw) for ln, raw in enumerate(fh.read().split(b"\n"), 1))
    try:
        doc = json.loads(text)
    except ValueError as e:
        raise ValueError(f"{f}:{getattr(e, 'lineno', 1)}: not valid JSON ({getattr(e, 'msg', e)}: line "
                         f"{getattr(e, 'lineno', '?')} column {getattr(e, 'colno', '?')}; a cut-off download?)") from None
    if isinstance(doc, list):
        return doc
    lists = [(k, v) for k, v in doc.items() if isinstance(v, list) and v and all(isinstance(r, dict) for r in v)]
    if lists:
        k, v = lists[0]
        raise ValueError(f"--in {f}: one JSON object, not rows: its key {k!r} holds {len(v)} records; extract them, "
                         f"e.g. jq '.{k}' {f} > rows.json")
    return [doc]


def _json_records(f: Path) -> Iterator[tuple[str, dict]]:
    if _is_json_document(f):
        for i, rec in enumerate(_json_document(f)):
            yield f"{f.name}:{i}", rec
        return
    with _open_text(f) as fh:
        for ln, raw in enumerate(fh, 1):
            line = decode_line(f, ln, raw)
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
