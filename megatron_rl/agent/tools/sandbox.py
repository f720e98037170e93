"""Run untrusted Python (the model's code) in a separate, limited process.

What one :meth:`Sandbox.run` does:

- **scratch directory**: a fresh ``mkdtemp`` directory, the child's working directory, ``HOME`` and ``TMPDIR``,
  owned by the sandbox user; removed afterwards whatever happened;
- **unprivileged user** (when the caller is root, as in the usual training container): the child drops to a
  uid of its own, unique among the runs in flight (reserved with a lock file), no supplementary groups. So it
  can write only where "others" may (its scratch directory, world-writable directories such as ``/tmp``),
  cannot modify or delete the caller's files, cannot signal the caller's processes, and ``RLIMIT_NPROC``
  (which the kernel does not apply to root) caps its processes and threads: a fork bomb stops at ``max_procs``;
- **no network**: a new, empty network namespace (``unshare(CLONE_NEWNET)``; ``CLONE_NEWUSER`` with it when
  not root): no interface but a down loopback, so no TCP/UDP to anywhere, the caller's localhost included,
  and no abstract Unix sockets of the host;
- **limits** (``setrlimit``, per process): address space (``RLIMIT_AS``, a memory bomb gets ``MemoryError``),
  CPU seconds (``RLIMIT_CPU``: ``SIGXCPU``, then ``SIGKILL`` a second later), file size (``RLIMIT_FSIZE``), open
  files, no core dumps; ``nice`` 10;
- **wall clock and output**: the parent reads stdout and stderr as they come, keeps at most ``output_bytes``
  (a flood is killed at the limit, never buffered), and kills at ``wall_s``;
- **the whole tree dies**: the child leads a new session; at the end the session's process group is killed
  and, when a uid of its own was used, every process left with that uid (a child that called ``setsid`` or
  double-forked included) is killed until none is left.

What it does **not** protect against (it is not a container or a VM):

- **reading**: the code reads every file "others" may read (system files, a world-readable repository or
  data set, other users' world-readable files) and sees every process in ``/proc`` (command lines included);
  keep secrets out of world-readable places;
- **writing world-writable places**: ``/tmp``, ``/var/tmp``, ``/dev/shm`` stay writable; files left there are
  not removed, and there is no disk quota (``RLIMIT_FSIZE`` bounds one file, not their number);
- **Unix sockets on the filesystem** that "others" may write (a world-writable socket of a local service) are
  reachable: the network namespace isolates IP and abstract sockets only;
- **aggregate load**: limits are per process, so up to ``max_procs`` processes may each use ``memory_mb`` and
  ``cpu_s``; there is no cgroup, so the host's memory and CPU are shared;
- **the kernel**: a kernel exploit or a side channel is out of scope; so is a sandbox escape via a setuid binary
  the system ships;
- **not root**: without root the uid is not changed (no ``RLIMIT_NPROC`` cap: it would count all of the
  caller's processes), the tree is killed by process group only (a ``setsid`` escapes it) and the network
  namespace needs unprivileged user namespaces (:class:`SandboxUnavailable` when the kernel refuses them).

The interpreter must be one the sandbox user can run: ``sys.executable`` when every directory above it is
world-searchable, else ``/usr/bin/python3`` (a pyenv Python under ``/root`` is not); ``python=`` picks one.
"""
from __future__ import annotations

import ctypes
import fcntl
import itertools
import os
import resource
import selectors
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

CLONE_NEWNET = 0x40000000
CLONE_NEWUSER = 0x10000000
_EXIT_SETUP = 126   # the child could not set itself up (the message is on its stderr)


class SandboxUnavailable(RuntimeError):
    """This host cannot give the isolation the sandbox promises (no network namespace, no usable uid)."""


@dataclass(frozen=True)
class SandboxLimits:
    """Limits of one run."""

    wall_s: float = 10.0
    """Wall-clock seconds before the whole tree is killed."""
    cpu_s: int = 5
    """CPU seconds per process (``RLIMIT_CPU``)."""
    memory_mb: int = 1024
    """Address space per process in MiB (``RLIMIT_AS``)."""
    output_bytes: int = 16384
    """Bytes of stdout + stderr kept; more kills the run (``truncated``)."""
    max_procs: int = 16
    """Processes and threads of the sandbox user (``RLIMIT_NPROC``; root callers only)."""
    file_mb: int = 16
    """Largest file the code may write, MiB (``RLIMIT_FSIZE``)."""
    open_files: int = 64
    """Open file descriptors per process (``RLIMIT_NOFILE``)."""

    def __post_init__(self):
        for k in ("wall_s", "cpu_s", "memory_mb", "output_bytes", "max_procs", "file_mb", "open_files"):
            v = getattr(self, k)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or v <= 0:
                raise ValueError(f"SandboxLimits.{k} must be a positive number, got {v!r}")


@dataclass(frozen=True)
class SandboxResult:
    """What one run produced. ``returncode`` < 0 is the signal that ended it (``-24`` SIGXCPU, ``-9`` SIGKILL)."""

    stdout: str
    stderr: str
    returncode: int | None
    timed_out: bool
    truncated: bool
    seconds: float

    @property
    def cpu_limited(self) -> bool:
        return self.returncode == -signal.SIGXCPU or (self.returncode == -signal.SIGKILL
                                                       and not self.timed_out and not self.truncated)


def _world_runnable(path: str) -> bool:
    """Every directory above ``path`` is searchable by others and the file is readable and executable by them."""
    p = Path(os.path.realpath(path))
    try:
        if (p.stat().st_mode & (stat.S_IROTH | stat.S_IXOTH)) != (stat.S_IROTH | stat.S_IXOTH):
            return False
        return all(d.stat().st_mode & stat.S_IXOTH for d in p.parents)
    except OSError:
        return False


def default_python() -> str:
    """The interpreter the sandbox runs (module docstring); ``SandboxUnavailable`` when none fits."""
    if os.geteuid() != 0 or _world_runnable(sys.executable):
        return sys.executable
    for cand in ("/usr/bin/python3", "/usr/local/bin/python3"):
        if _world_runnable(cand):
            return cand
    raise SandboxUnavailable(f"no Python the sandbox user can run: {sys.executable} is under a directory others "
                             "cannot search, and /usr/bin/python3 is missing; pass python=")


def _mapped(uid: int, count: int) -> bool:
    """``[uid, uid + count)`` lies inside one range of this user namespace's ``/proc/self/uid_map``."""
    try:
        rows = [tuple(map(int, ln.split())) for ln in Path("/proc/self/uid_map").read_text().splitlines()]
    except OSError:
        return True
    return any(inside <= uid and uid + count <= inside + n for inside, _outside, n in rows)


def pids_of_uid(uid: int) -> list[int]:
    """Live (not zombie) processes whose real uid is ``uid``, read from ``/proc``."""
    out = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            text = Path(f"/proc/{name}/status").read_text()
        except OSError:
            continue
        fields = dict(ln.split(":", 1) for ln in text.splitlines() if ":" in ln)
        if fields.get("Uid", "").split()[:1] == [str(uid)] and not fields.get("State", "").strip().startswith(("Z", "X")):
            out.append(int(name))
    return out


def kill_uid(uid: int, rounds: int = 200) -> bool:
    """SIGKILL every process of ``uid`` until none is left (a forking tree needs a few rounds); False if some survived."""
    for _ in range(rounds):
        pids = pids_of_uid(uid)
        if not pids:
            return True
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(0.005)
    return not pids_of_uid(uid)


class _UidPool:
    """Reserves a uid per run with ``flock`` on ``<tmp>/megatron_rl-sandbox-uids/<uid>`` (other processes of
    the host too); the lock dies with its holder, so a crashed run frees its uid."""

    def __init__(self, start: int, count: int):
        self.start, self.count = start, count
        self.dir = Path(tempfile.gettempdir()) / "megatron_rl-sandbox-uids"
        self.dir.mkdir(mode=0o700, exist_ok=True)
        self._next = itertools.count(os.getpid() * 7919)
        self._lock = threading.Lock()

    def acquire(self) -> tuple[int, int]:
        for _ in range(self.count):
            with self._lock:
                uid = self.start + next(self._next) % self.count
            fd = os.open(self.dir / str(uid), os.O_CREAT | os.O_RDWR, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                continue
            kill_uid(uid)     # leftovers of a run whose parent died
            return uid, fd
        raise SandboxUnavailable(f"all {self.count} sandbox uids from {self.start} are in use")

    @staticmethod
    def release(fd: int) -> None:
        os.close(fd)


def _preexec(limits: SandboxLimits, uid: int | None):
    libc = ctypes.CDLL(None, use_errno=True)
    mb = 1 << 20
    rl = [(resource.RLIMIT_AS, limits.memory_mb * mb), (resource.RLIMIT_FSIZE, limits.file_mb * mb),
          (resource.RLIMIT_NOFILE, limits.open_files), (resource.RLIMIT_CORE, 0)]
    cpu = (int(limits.cpu_s), int(limits.cpu_s) + 1)

    def fail(what: str) -> None:
        os.write(2, f"sandbox setup: {what} failed: {os.strerror(ctypes.get_errno())}\n".encode())
        os._exit(_EXIT_SETUP)

    def child():   # runs in the forked child before exec: system calls only
        os.setsid()
        if libc.unshare(CLONE_NEWNET if uid is not None else CLONE_NEWUSER | CLONE_NEWNET) != 0:
            fail("unshare (network namespace)")
        for k, v in rl:
            resource.setrlimit(k, (v, v))
        resource.setrlimit(resource.RLIMIT_CPU, cpu)
        os.nice(10)
        if uid is not None:
            resource.setrlimit(resource.RLIMIT_NPROC, (limits.max_procs, limits.max_procs))
            try:
                os.setgroups([])
                os.setgid(uid)
                os.setuid(uid)
            except OSError as e:
                os.write(2, f"sandbox setup: setuid({uid}) failed: {e.strerror}\n".encode())
                os._exit(_EXIT_SETUP)
    return child


class Sandbox:
    """Runs Python source under :class:`SandboxLimits` (module docstring). Thread-safe: runs in flight each
    get their own uid and scratch directory."""

    def __init__(self, limits: SandboxLimits | None = None, python: str | None = None,
                 uid_range: tuple[int, int] = (1_500_000_000, 1_000_000)):
        self.limits = limits or SandboxLimits()
        self.python = python or default_python()
        self.root = os.geteuid() == 0
        if self.root and not _mapped(*uid_range):
            raise SandboxUnavailable(f"sandbox uid range {uid_range} is not mapped in this user namespace "
                                     "(/proc/self/uid_map); pass uid_range=(first, count) inside it")
        self._uids = _UidPool(*uid_range) if self.root else None

    def run(self, code: str) -> SandboxResult:
        """Run ``code`` as ``main.py`` in a fresh scratch directory; never raises for what the code does."""
        uid, lock_fd = self._uids.acquire() if self._uids else (None, None)
        scratch = tempfile.mkdtemp(prefix="megatron_rl-sandbox-")
        try:
            main = Path(scratch) / "main.py"
            main.write_text(code)
            if uid is not None:
                os.chown(scratch, uid, uid)
            return self._run(scratch, uid)
        finally:
            if uid is not None:
                kill_uid(uid)
                _UidPool.release(lock_fd)
            shutil.rmtree(scratch, ignore_errors=True)

    def _run(self, scratch: str, uid: int | None) -> SandboxResult:
        lim = self.limits
        env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": scratch, "TMPDIR": scratch, "LANG": "C.UTF-8",
               "PYTHONIOENCODING": "utf-8", "PYTHONDONTWRITEBYTECODE": "1", "OMP_NUM_THREADS": "1",
               "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
        t0 = time.monotonic()
        p = subprocess.Popen([self.python, "-I", "-u", "main.py"], cwd=scratch, env=env, stdin=subprocess.DEVNULL,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, preexec_fn=_preexec(lim, uid))
        bufs = {p.stdout.fileno(): bytearray(), p.stderr.fileno(): bytearray()}
        timed_out = truncated = False
        sel = selectors.DefaultSelector()
        for f in (p.stdout, p.stderr):
            os.set_blocking(f.fileno(), False)
            sel.register(f.fileno(), selectors.EVENT_READ)
        exited_at = None
        try:
            while sel.get_map():
                now = time.monotonic()
                if now - t0 >= lim.wall_s:
                    timed_out = True
                    break
                if exited_at is None and p.poll() is not None:
                    exited_at = now
                if exited_at is not None and now - exited_at > 0.05:   # main exited; a descendant holds the pipe
                    break
                for key, _ in sel.select(timeout=min(0.05, lim.wall_s - (now - t0))):
                    chunk = os.read(key.fd, 65536)
                    if not chunk:
                        sel.unregister(key.fd)
                        continue
                    room = lim.output_bytes - sum(len(b) for b in bufs.values())
                    bufs[key.fd] += chunk[:max(room, 0)]
                    if len(chunk) > room:
                        truncated = True
                if truncated:
                    break
            if not (timed_out or truncated):
                try:
                    p.wait(timeout=max(lim.wall_s - (time.monotonic() - t0), 0.0))
                except subprocess.TimeoutExpired:
                    timed_out = True
        finally:
            sel.close()
            self._kill_tree(p, uid)
            p.stdout.close()
            p.stderr.close()
        out, err = (bufs[f].decode("utf-8", "replace") for f in list(bufs))
        if p.returncode == _EXIT_SETUP and err.startswith("sandbox setup:"):
            raise SandboxUnavailable(err.strip())
        return SandboxResult(out, err, p.returncode, timed_out, truncated, time.monotonic() - t0)

    @staticmethod
    def _kill_tree(p: subprocess.Popen, uid: int | None) -> None:
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        if uid is not None:
            kill_uid(uid)
        p.wait()
