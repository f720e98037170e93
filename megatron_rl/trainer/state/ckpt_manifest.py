"""File manifest of a checkpoint, stored in its ``COMPLETE`` marker, so a damaged checkpoint is
recognised before it is loaded (and ``--resume auto`` falls back to the previous complete one).

Before this, a truncated ``.distcp`` or ``.metadata`` inside a checkpoint marked complete (a full
disk, a copy cut short, a bad rsync) surfaced as a 120-line traceback from deep inside
``torch.distributed.checkpoint``. The manifest holds, per file under the checkpoint directory:
its size, and a CRC-32 (``zlib.crc32``) for files up to :data:`CRC_MAX_BYTES` (metadata, RNG,
extra state, and the shards of small models). Large shard files get the size only: a truncation
always changes it, and a CRC over hundreds of GB would cost minutes on rank 0 at every save.
Checkpoints written before the manifest existed have none and are trusted as before.
"""
from __future__ import annotations

import os
import zlib
from pathlib import Path

CRC_MAX_BYTES = 64 << 20
MARKER = "COMPLETE"


def _crc(path: Path) -> int:
    crc = 0
    with open(path, "rb") as f:
        while chunk := f.read(8 << 20):
            crc = zlib.crc32(chunk, crc)
    return crc


def build_manifest(directory: str | os.PathLike) -> dict[str, list[int]]:
    """``{relative path: [size] or [size, crc32]}`` of every file under ``directory`` except the marker."""
    root = Path(directory)
    out = {}
    for p in sorted(root.rglob("*")):
        if not p.is_file() or p.name == MARKER:
            continue
        size = p.stat().st_size
        out[str(p.relative_to(root))] = [size, _crc(p)] if size <= CRC_MAX_BYTES else [size]
    return out


def find_damage(directory: str | os.PathLike, manifest: dict | None) -> str | None:
    """None when every file of ``manifest`` is present with its size (and CRC); else what is wrong,
    naming the first bad file."""
    if not manifest:
        return None
    root = Path(directory)
    for rel, entry in manifest.items():
        p = root / rel
        if not p.is_file():
            return f"{p} is missing"
        size = p.stat().st_size
        if size != entry[0]:
            return f"{p} has {size} bytes, the checkpoint recorded {entry[0]} (truncated or overwritten)"
        if len(entry) > 1 and _crc(p) != entry[1]:
            return f"{p} fails its CRC-32 check (contents changed after the save)"
    return None
