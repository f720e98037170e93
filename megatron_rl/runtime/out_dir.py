"""The ``--out`` directories of every writing command (``convert``, ``data prepare``, ``data generate``,
``eval``): what is there, one refusal line, and write-to-temp-then-rename.

Each command owns its rule of what it may replace (``convert/atomic.py``: a checkpoint of ours;
``data/prepare/io.py``: an earlier prepare output; ...); this module holds what the rules share:

* :func:`out_entries`: the resolved target and what it holds (``[]`` = missing or empty: written), or
  one ``FileExistsError`` line when it is a file;
* :func:`refuse_foreign`: the line for a non-empty ``--out`` that is not the command's own output;
* :func:`atomic_dir`: a fresh temp dir beside the target (same file system, so the final ``rename`` is
  atomic); on success an earlier output is renamed aside, the new one renamed into place, the old one
  deleted; on error only the temp dir this call created is deleted (a full disk is one
  ``DiskSpaceError`` line).
"""
from __future__ import annotations

import contextlib
import os
import shutil
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

from megatron_rl.runtime.diskspace import DiskSpaceError, free_bytes, is_disk_full

Check = Callable[[Path, bool], object]
"""A command's rule: ``check(target, force)`` raises ``FileExistsError`` unless it may write ``target``."""


def out_entries(target: str | os.PathLike, ignore: tuple[str, ...] = ()) -> tuple[Path, list[str]]:
    """``target`` resolved and the sorted names it holds (minus ``ignore``); ``[]`` when it is missing or
    empty. A file is one ``FileExistsError`` line."""
    target = Path(target).resolve()
    if not target.exists():
        return target, []
    if not target.is_dir():
        raise FileExistsError(f"--out {target} is an existing file, not a directory; choose another --out")
    return target, sorted(p.name for p in target.iterdir() if p.name not in ignore)


def refuse_foreign(target: Path, entries: list[str], what: str, replaces: str) -> None:
    """Raise the one line for a non-empty ``--out`` that is not ``what`` (e.g. "a checkpoint written by
    megatron-rl"); ``replaces`` says what ``--force`` would replace."""
    shown = ", ".join(entries[:3]) + (f", ... ({len(entries)} entries)" if len(entries) > 3 else "")
    raise FileExistsError(f"--out {target} is not empty ({shown}) and is not {what}; refusing to touch it "
                          f"(--force only replaces {replaces}): choose a new or empty --out")


def make_temp_dir(target: Path, tag: str | None = None) -> Path:
    """Create (exclusively) and return a temp dir beside ``target``: the only thing cleanup may delete."""
    tag = tag or uuid.uuid4().hex[:8]
    tmp = target.parent / f".tmp-{target.name}-{tag}"
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp.mkdir()
    return tmp


def replace_dir(tmp: Path, target: Path, force: bool, check: Check) -> None:
    """Move the finished ``tmp`` onto ``target`` (``check``-ed again now: it may have changed meanwhile)."""
    check(target, force)
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


def raise_if_disk_full(err: BaseException, tmp: Path, target: Path) -> None:
    """A write into ``tmp`` that failed because the disk is full: remove ``tmp`` and raise one
    ``DiskSpaceError`` line naming ``target`` (``diskspace.py``); any other error: return."""
    if isinstance(err, DiskSpaceError) or not is_disk_full(err, tmp.parent):
        return
    shutil.rmtree(tmp, ignore_errors=True)
    raise DiskSpaceError(f"disk full while writing {target} ({free_bytes(tmp.parent)} bytes free now): the partial "
                         "output was removed; free some space and run again") from err


@contextlib.contextmanager
def atomic_dir(target: str | os.PathLike, force: bool, check: Check, enabled: bool = True) -> Iterator[Path]:
    """Yield a fresh temp dir beside ``target``; on success move it onto ``target`` (:func:`replace_dir`);
    on error delete the temp dir (and only it). ``enabled=False`` (non-writing ranks) yields the temp
    path without checking, creating or renaming."""
    target = Path(target).resolve()
    if not enabled:
        yield target.parent / f".tmp-{target.name}-peer"
        return
    check(target, force)
    tmp = make_temp_dir(target)
    try:
        yield tmp
        replace_dir(tmp, target, force, check)
    except BaseException as e:
        raise_if_disk_full(e, tmp, target)
        shutil.rmtree(tmp, ignore_errors=True)
        raise
