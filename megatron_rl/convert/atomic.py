"""Write-to-temp-then-rename for output directories, and the rule for what may be replaced.

Never delete what this program did not create:

* ``--out`` that does not exist, or is an empty directory: written.
* ``--out`` that holds a checkpoint written by megatron-rl (a Megatron checkpoint whose ``COMPLETE``
  marker is ours, or an HF export carrying :data:`EXPORT_MARKER`) and nothing else: replaced only
  with ``force`` (``--force``); without it a ``FileExistsError`` says so.
* any other non-empty ``--out`` (user files, an HF download, a checkpoint plus foreign files):
  refused, with or without ``force``, naming what is there.

Outputs are written into a fresh temp dir beside the target (same file system, so the final
``rename`` is atomic). Replacing an old checkpoint renames it aside first, renames the new one into
place, then deletes the old one; an error before that deletes only the temp dir this call created.
"""
from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path

MARKERS = ("config.json", "metadata.json", "model.safetensors", "model.safetensors.index.json", "COMPLETE")
#: written into every HF export of this package: what makes an HF dir "ours" (replaceable with --force)
EXPORT_MARKER = "megatron_rl_export.json"
_OURS_MCORE = {"dist", "hf", "COMPLETE", "teacher", "rng", "extra_state.pt"}
_OURS_HF = re.compile(r"^(config\.json|generation_config\.json|model(-\d+-of-\d+)?\.safetensors|"
                      r"model\.safetensors\.index\.json|tokenizer\.json|tokenizer_config\.json|"
                      r"special_tokens_map\.json|tokenizer\.model|vocab\.json|merges\.txt|chat_template\.jinja|"
                      r"sp\.model|" + re.escape(EXPORT_MARKER) + r")$")


def holds_checkpoint(path: Path) -> bool:
    """True when ``path`` already contains an HF or Megatron checkpoint (ours or not)."""
    return path.is_dir() and any((path / m).exists() for m in MARKERS)


def _ours_kind(path: Path) -> str | None:
    """``"mcore"`` / ``"hf"`` when ``path`` is a checkpoint written by megatron-rl, else None."""
    marker = path / "COMPLETE"
    if marker.is_file() and (path / "dist").is_dir():
        try:
            meta = json.loads(marker.read_text())
        except (OSError, ValueError):
            return None
        return "mcore" if isinstance(meta, dict) and "step" in meta else None
    return "hf" if (path / EXPORT_MARKER).is_file() else None


def check_out_dir(target: str | os.PathLike, force: bool) -> Path:
    """Raise ``FileExistsError`` unless ``target`` may be (over)written; see the module docstring."""
    target = Path(target).resolve()
    if not target.exists():
        return target
    if not target.is_dir():
        raise FileExistsError(f"--out {target} is an existing file, not a directory; choose another --out")
    entries = sorted(p.name for p in target.iterdir())
    if not entries:
        return target
    kind = _ours_kind(target)
    if kind is None:
        shown = ", ".join(entries[:3]) + (f", ... ({len(entries)} entries)" if len(entries) > 3 else "")
        raise FileExistsError(f"--out {target} is not empty ({shown}) and is not a checkpoint written by "
                              "megatron-rl; refusing to touch it (--force only replaces our own checkpoints): "
                              "choose a new or empty --out")
    foreign = [e for e in entries if (e not in _OURS_MCORE if kind == "mcore" else not _OURS_HF.match(e))]
    if foreign:
        raise FileExistsError(f"--out {target} holds a megatron-rl checkpoint plus other files ({', '.join(foreign[:3])}); "
                              "refusing to delete them: move them away or choose another --out")
    if not force:
        raise FileExistsError(f"{target} already holds a checkpoint; pass --force to overwrite it")
    return target


def make_temp_dir(target: Path, tag: str | None = None) -> Path:
    """Create (exclusively) and return a temp dir beside ``target``: the only thing cleanup may delete."""
    tag = tag or uuid.uuid4().hex[:8]
    tmp = target.parent / f".tmp-{target.name}-{tag}"
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp.mkdir()
    return tmp


def replace_dir(tmp: Path, target: Path, force: bool) -> None:
    """Move the finished ``tmp`` onto ``target`` (re-checked now: it may have changed meanwhile)."""
    check_out_dir(target, force)
    old = None
    if target.exists():
        if any(target.iterdir()):
            old = target.parent / f".old-{target.name}-{uuid.uuid4().hex[:8]}"
            os.rename(target, old)
        else:
            target.rmdir()
    os.replace(tmp, target)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


@contextlib.contextmanager
def atomic_dir(target: str | os.PathLike, force: bool = False, enabled: bool = True) -> Iterator[Path]:
    """Yield a fresh temp dir beside ``target``; on success move it onto ``target`` (see
    :func:`replace_dir`); on error delete the temp dir (and only it).

    ``enabled=False`` (non-writing ranks) yields the temp path without checking, creating or renaming.
    """
    target = Path(target).resolve()
    if not enabled:
        yield target.parent / f".tmp-{target.name}-{'peer'}"
        return
    check_out_dir(target, force)
    tmp = make_temp_dir(target)
    try:
        yield tmp
        replace_dir(tmp, target, force)
    except BaseException as e:
        raise_if_disk_full(e, tmp, target)
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def raise_if_disk_full(err: BaseException, tmp: Path, target: Path) -> None:
    """A write into ``tmp`` that failed because the disk is full: remove ``tmp`` and raise one
    ``DiskSpaceError`` line naming ``target`` (``diskspace.py``); any other error: return."""
    from megatron_rl.runtime.diskspace import DiskSpaceError, free_bytes, is_disk_full

    if isinstance(err, DiskSpaceError) or not is_disk_full(err, tmp.parent):
        return
    shutil.rmtree(tmp, ignore_errors=True)
    raise DiskSpaceError(f"disk full while writing {target} ({free_bytes(tmp.parent)} bytes free now): the partial "
                         "output was removed; free some space and run again") from err
