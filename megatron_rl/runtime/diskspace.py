"""Free space before a large write, and a full disk during one, as one line.

Why: a checkpoint or HF export that runs out of space fails deep inside torch's writers (a
``RuntimeError: file write failed`` from the zip writer, a ``CheckpointException`` from
``torch.distributed.checkpoint``, an ``OSError`` ENOSPC) — 44 to 145 lines of traceback — and leaves
a half-written temp directory that keeps the disk full. So the writers here (``trainer/state/checkpoint.py``,
``convert/``) first compare the expected size with ``os.statvfs`` (:func:`check_free`: nothing is
started when it does not fit) and turn a full disk that still happens during the write (another
process filled it, or the estimate was low) into :class:`DiskSpaceError` after removing their temp
directory. The CLI prints it as one ``error:`` line; it is a runtime error (exit status 1).
"""
from __future__ import annotations

import errno
import os
from pathlib import Path

_FULL = (errno.ENOSPC, errno.EDQUOT)
#: below this many free bytes after a failed write, the write failed because the disk is full (torch's
#: zip writer reports only "file write failed", without the errno)
NEARLY_FULL = 1 << 20


class DiskSpaceError(OSError):
    """Not enough free space for a write (checked before it, or ENOSPC during it)."""

    def __init__(self, message: str):
        super().__init__(message)
        self.errno = errno.ENOSPC


def human(n: int) -> str:
    """``1536 -> '1.5 KiB'``: bytes for a message (the exact count is printed beside it)."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


def free_bytes(path: str | os.PathLike) -> int:
    """Bytes an unprivileged writer may still use on the file system of ``path`` (or of its nearest
    existing parent, for a path not created yet)."""
    p = Path(path).resolve()
    while not p.exists() and p != p.parent:
        p = p.parent
    st = os.statvfs(p)
    return st.f_bavail * st.f_frsize


class NotWritableError(PermissionError):
    """The place of a write is on a read-only file system or not writable by this user (a user error:
    checked before anything is written, one line, never reported as a full disk)."""


def _existing(path: str | os.PathLike) -> Path:
    p = Path(path).absolute()
    while not p.exists() and p != p.parent:
        p = p.parent
    return p


def is_read_only(path: str | os.PathLike) -> bool:
    """Is the file system of ``path`` (or of its nearest existing parent) mounted read-only?"""
    try:
        return bool(os.statvfs(_existing(path)).f_flag & os.ST_RDONLY)
    except OSError:
        return False


def check_writable(path: str | os.PathLike, what: str) -> None:
    """Raise :class:`NotWritableError` (one line naming ``what`` and ``path``) when ``path`` -- or, for a
    path not created yet, its nearest existing parent -- cannot be written: a read-only mount, or no
    write permission (root writes anywhere but a read-only mount). Also ``NotADirectoryError`` when
    that parent is a file."""
    q = _existing(path)
    if q != Path(path).absolute() and not q.is_dir():
        raise NotADirectoryError(f"{what} {path}: {q} is a file, not a directory; choose another location")
    if is_read_only(q):
        raise NotWritableError(f"{what} {path}: {q} is on a read-only file system; nothing was written - choose a "
                               "writable location")
    if not os.access(q, os.W_OK | (os.X_OK if q.is_dir() else 0)):
        raise NotWritableError(f"{what} {path}: no write permission in {q}; nothing was written - choose a writable "
                               "location or fix its permissions")


def check_free(path: str | os.PathLike, need: int, what: str) -> None:
    """Raise :class:`NotWritableError` when ``path`` cannot be written at all (a read-only mount has no
    free blocks either; it must not read as a full disk), else :class:`DiskSpaceError` naming ``path``
    and the bytes needed vs free when ``need`` bytes do not fit on its file system."""
    check_writable(path, what)
    free = free_bytes(path)
    if free < need:
        raise DiskSpaceError(f"not enough free space for {what} in {path}: needs {need} bytes ({human(need)}), "
                             f"{free} bytes ({human(free)}) free; nothing was written - free some space or "
                             "choose another location")


def tree_bytes(path: str | os.PathLike) -> int:
    """Total size of the files under ``path`` (0 when it does not exist)."""
    total = 0
    for root, _, files in os.walk(path):
        for f in files:
            try:
                total += os.stat(os.path.join(root, f)).st_size
            except OSError:
                pass
    return total


def meta_bytes(meta) -> int:
    """Bytes of the tensors ``[(name, torch dtype, shape), ...]`` (``convert.live.hf_tensor_meta``)."""
    total = 0
    for _, dtype, shape in meta:
        n = dtype.itemsize
        for d in shape:
            n *= d
        total += n
    return total


def is_disk_full(exc: BaseException, path: str | os.PathLike) -> bool:
    """Did ``exc`` come from a full disk? An ENOSPC / EDQUOT anywhere in its chain (causes, contexts,
    a torch.distributed.checkpoint ``CheckpointException``'s per-rank failures), or, for writers that
    drop the errno, a file system of ``path`` with less than :data:`NEARLY_FULL` bytes left."""
    stack, seen = [exc], set()
    while stack:
        e = stack.pop()
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        if isinstance(e, OSError) and e.errno in _FULL or "No space left on device" in str(e):
            return True
        stack += [e.__cause__, e.__context__]
        failures = getattr(e, "failures", None)
        if isinstance(failures, dict):
            stack += [v[0] if isinstance(v, tuple) else v for v in failures.values() if isinstance(v, (tuple, BaseException))]
    write_error = type(exc).__name__ == "CheckpointException" or (
        isinstance(exc, (RuntimeError, OSError)) and not isinstance(exc, (FileExistsError, FileNotFoundError)))
    if not write_error or is_read_only(path):   # a config or usage error, a read-only mount: never the disk
        return False
    try:
        return free_bytes(path) < NEARLY_FULL
    except OSError:
        return False


def check_free_on_rank0(path: str | os.PathLike, need: int, what: str) -> None:
    """Collective form of :func:`check_free` for a write done by global rank 0 alone: rank 0 checks
    its file system and every rank raises the same :class:`DiskSpaceError` (none enters the write)."""
    import torch.distributed as dist

    multi = dist.is_initialized() and dist.get_world_size() > 1
    msg = None
    if not multi or dist.get_rank() == 0:
        try:
            check_free(path, need, what)
        except (DiskSpaceError, NotWritableError) as e:
            msg = (isinstance(e, NotWritableError), str(e))
    if multi:
        box = [msg]
        dist.broadcast_object_list(box, src=0)
        msg = box[0]
    if msg:
        raise (NotWritableError if msg[0] else DiskSpaceError)(msg[1])
