"""Byte-level index of an HF safetensors directory (no mmap, no tensor materialised).

safetensors file layout::

    [u64 little-endian N][N bytes JSON header][data]
    header = {name: {"dtype": "F32", "shape": [...], "data_offsets": [b, e]}, "__metadata__": {...}}

A tensor's bytes are ``file[8 + N + b : 8 + N + e]`` (C order). :class:`SafetensorsIndex` parses only
the headers, checks that every tensor lies inside its file (a truncated file raises ``ValueError``
"corrupt safetensors file ..."), and hands out :class:`TensorLoc` byte locations, so the streaming
converter can copy bytes file-to-file (``copy_file_range``) or ``pread`` one tensor when a dtype
cast is needed.
"""
from __future__ import annotations

import dataclasses
import json
import math
import os
import struct
from pathlib import Path

import torch

DTYPES = {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
          "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8,
          "BOOL": torch.bool}
_MAX_HEADER = 100 << 20


@dataclasses.dataclass(frozen=True)
class TensorLoc:
    """Where one tensor's bytes live: ``file[offset : offset + nbytes]``."""

    name: str
    file: Path
    dtype: torch.dtype
    shape: tuple[int, ...]
    offset: int

    @property
    def itemsize(self) -> int:
        return torch.empty((), dtype=self.dtype).element_size()

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * self.itemsize

    @property
    def row_bytes(self) -> int:
        """Bytes of one dim-0 row (one element for 1-D tensors)."""
        return math.prod(self.shape[1:]) * self.itemsize


def _read_header(path: Path) -> tuple[dict, int]:
    size = path.stat().st_size
    with open(path, "rb") as f:
        raw = f.read(8)
        if len(raw) < 8:
            raise ValueError(f"corrupt safetensors file {path}: shorter than its 8-byte header length")
        (n,) = struct.unpack("<Q", raw)
        if n > min(_MAX_HEADER, size - 8):
            raise ValueError(f"corrupt safetensors file {path}: header length {n} exceeds the file")
        try:
            header = json.loads(f.read(n))
        except ValueError as e:
            raise ValueError(f"corrupt safetensors file {path}: header is not JSON ({e})") from e
    return header, 8 + n


class SafetensorsIndex:
    """All tensors of ``hf_dir/*.safetensors`` by name (``KeyError`` naming a missing one)."""

    def __init__(self, hf_dir: str | os.PathLike):
        self.dir = Path(hf_dir)
        files = sorted(self.dir.glob("*.safetensors"))
        if not files:
            raise FileNotFoundError(f"no *.safetensors files in {self.dir}")
        self.locs: dict[str, TensorLoc] = {}
        for f in files:
            header, start = _read_header(f)
            size = f.stat().st_size
            for name, meta in header.items():
                if name == "__metadata__":
                    continue
                if name in self.locs:
                    raise ValueError(f"tensor {name!r} appears in both {self.locs[name].file.name} and {f.name}")
                try:
                    dtype = DTYPES[meta["dtype"]]
                    b, e = meta["data_offsets"]
                    shape = tuple(int(s) for s in meta["shape"])
                except (KeyError, TypeError, ValueError) as err:
                    raise ValueError(f"corrupt safetensors file {f}: bad entry for {name!r} ({err!r})") from None
                loc = TensorLoc(name, f, dtype, shape, start + b)
                if e - b != loc.nbytes or start + e > size:
                    raise ValueError(f"corrupt safetensors file {f}: {name!r} bytes [{b}, {e}) do not fit "
                                     f"shape {shape} {meta['dtype']} inside the {size}-byte file")
                self.locs[name] = loc

    def names(self) -> list[str]:
        return list(self.locs)

    def __getitem__(self, name: str) -> TensorLoc:
        try:
            return self.locs[name]
        except KeyError:
            raise KeyError(f"tensor {name!r} not found in {self.dir}") from None

    def read_rows(self, name: str, row0: int = 0, rows: int | None = None) -> torch.Tensor:
        """Rows ``[row0, row0 + rows)`` of tensor ``name`` as a fresh tensor (one ``pread``)."""
        loc = self[name]
        rows = (loc.shape[0] if loc.shape else 1) - row0 if rows is None else rows
        shape = (rows, *loc.shape[1:]) if loc.shape else ()
        out = torch.empty(shape, dtype=loc.dtype)
        buf = memoryview(out.reshape(-1).view(torch.uint8).numpy()) if out.numel() else memoryview(b"")
        with open(loc.file, "rb", buffering=0) as f:
            f.seek(loc.offset + row0 * loc.row_bytes)
            got = f.readinto(buf) if len(buf) else 0
        if got != len(buf):
            raise ValueError(f"corrupt safetensors file {loc.file}: short read of {name!r}")
        return out


def diff_tensors(a_dir: str | os.PathLike, b_dir: str | os.PathLike, ignore=("lm_head.weight",)) -> tuple[int, list[str]]:
    """Compare two HF safetensors dirs as files' tensors: (#names, names that differ in dtype, shape
    or bytes, or are in one dir only — except ``ignore``: a tied model's optional ``lm_head``).
    Reads 64 MiB of each at a time (any model size)."""
    a, b = SafetensorsIndex(a_dir), SafetensorsIndex(b_dir)
    names = sorted(set(a.names()) | set(b.names()))
    bad = []
    for n in names:
        if n not in a.locs or n not in b.locs:
            if n not in ignore:
                bad.append(n)
            continue
        x, y = a[n], b[n]
        if (x.dtype, x.shape) != (y.dtype, y.shape):
            bad.append(n)
            continue
        with open(x.file, "rb") as fx, open(y.file, "rb") as fy:
            for off in range(0, x.nbytes, 64 << 20):
                k = min(64 << 20, x.nbytes - off)
                if os.pread(fx.fileno(), k, x.offset + off) != os.pread(fy.fileno(), k, y.offset + off):
                    bad.append(n)
                    break
    return len(names), bad
