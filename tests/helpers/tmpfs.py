"""A small real file system for the full-disk tests: a size-limited tmpfs mounted on a temp dir.

Mounting needs root (CAP_SYS_ADMIN); where that is not permitted the test is skipped with the reason
(a size-limited directory cannot be emulated faithfully otherwise: statvfs and ENOSPC come from the
file system)."""
from __future__ import annotations

import contextlib
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest


def mount_tmpfs(where: Path, size: str) -> str | None:
    """Mount a tmpfs of ``size`` (``mount -o size=``, e.g. ``"4m"``) on ``where``; None on success,
    else why not (for a skip reason)."""
    where.mkdir(parents=True, exist_ok=True)
    p = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)], capture_output=True,
                       text=True, check=False)
    return None if p.returncode == 0 else f"cannot mount a {size} tmpfs here (needs root / CAP_SYS_ADMIN): " \
                                          f"{p.stderr.strip()}"


def umount(where: Path) -> None:
    subprocess.run(["umount", "-l", str(where)], check=False)


@contextlib.contextmanager
def small_tmpfs(where: Path, size: str) -> Iterator[Path]:
    """:func:`mount_tmpfs` for the duration of a ``with`` block; skips the test when not permitted."""
    why = mount_tmpfs(where, size)
    if why:
        pytest.skip(why)
    try:
        yield where
    finally:
        umount(where)


@contextlib.contextmanager
def read_only_tmpfs(where: Path) -> Iterator[Path]:
    """A tiny tmpfs mounted read-only on ``where`` (statvfs reports ST_RDONLY and no free blocks: the
    place a write must be refused as read-only, not as a full disk); skips when mounting is not
    permitted."""
    where.mkdir(parents=True, exist_ok=True)
    p = subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=1m", "tmpfs", str(where)], capture_output=True,
                       text=True, check=False)
    if p.returncode:
        pytest.skip(f"cannot mount a read-only tmpfs here (needs root / CAP_SYS_ADMIN): {p.stderr.strip()}")
    try:
        yield where
    finally:
        umount(where)
