"""Write-to-temp-then-rename for output directories (nothing half-written is ever left)."""
from __future__ import annotations

import contextlib
import os
import shutil
import uuid
from pathlib import Path
from typing import Iterator

MARKERS = ("config.json", "metadata.json", "model.safetensors", "model.safetensors.index.json", "COMPLETE")


def holds_checkpoint(path: Path) -> bool:
    """True when ``path`` already contains an HF or Megatron checkpoint."""
    return path.is_dir() and any((path / m).exists() for m in MARKERS)


@contextlib.contextmanager
def atomic_dir(target: str | os.PathLike, force: bool = False, enabled: bool = True) -> Iterator[Path]:
    """Yield a temp dir beside ``target``; on success rename it to ``target``; on error delete it.

    Refuses (``FileExistsError``) when ``target`` holds a checkpoint unless ``force``.
    ``enabled=False`` (non-writing ranks) yields the temp path without creating or renaming anything.
    """
    target = Path(target).resolve()
    if holds_checkpoint(target) and not force:
        raise FileExistsError(f"{target} already holds a checkpoint; pass --force to overwrite it")
    tmp = target.parent / f".tmp-{target.name}-{os.environ.get('MRL_ATOMIC_TAG', uuid.uuid4().hex[:8])}"
    if not enabled:
        yield tmp
        return
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp.mkdir(parents=True, exist_ok=True)
    try:
        yield tmp
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if target.exists():
        shutil.rmtree(target)
    os.replace(tmp, target)
