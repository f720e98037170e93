"""Run untrusted Python (the model's code) in a separate, limited process.

What one :meth:`Sandbox.run` does:

- **scratch directory**: the child's working directory, ``HOME`` and ``TMPDIR``; removed afterwards whatever
  happened. For a root caller it is a tmpfs of ``tmp_mb`` MiB owned by the sandbox user, in a private mount
  namespace that also puts a fresh tmpfs of that size over ``/tmp``, ``/var/tmp`` and ``/dev/shm``: what the code
  writes there never reaches the host's disk, is bounded in size, and vanishes with the run's last process;
- **a bare environment**: ``PATH``, ``HOME``, ``TMPDIR``, locale and thread-count variables only (the caller's
  variables, tokens and keys included, are not passed), no inherited file descriptors, stdin empty;
- **unprivileged user** (when the caller is root, as in the usual training container): the child drops to a
  uid of its own, unique among the runs in flight on the host (reserved with a lock), no supplementary groups. So it
  can write only where "others" may (its scratch directory and the private tmpfs mounts, other world-writable directories),
  cannot modify or delete the caller's files, cannot signal the caller's processes, and ``RLIMIT_NPROC``
  (which the kernel does not apply to root) caps its processes and threads: a fork bomb stops at ``max_procs``;
- **no network**: a new, empty network namespace (``unshare(CLONE_NEWNET)``, with ``CLONE_NEWNS`` for the mounts
  above; ``CLONE_NEWUSER`` with it when not root): no interface but a down loopback, so no TCP/UDP to anywhere, the caller's localhost included,
  and no abstract Unix sockets of the host;
- **limits** (``setrlimit``, per process): address space (``RLIMIT_AS``, a memory bomb gets ``MemoryError``),
  CPU seconds (``RLIMIT_CPU``: ``SIGXCPU``, then ``SIGKILL`` a second later), file size (``RLIMIT_FSIZE``), open
  files, no core dumps; ``nice`` 10; ``no_new_privs`` (a setuid program gains nothing);
- **wall clock and output**: the parent reads stdout and stderr as they come, keeps at most ``output_bytes``
  (a flood is killed at the limit, never buffered), and kills at ``wall_s``;
- **the whole tree dies**: the child leads a new session; at the end the session's process group is killed
  and, when a uid of its own was used, every process left with that uid (a child that called ``setsid`` or
  double-forked included) is killed until none is left.

What it does **not** protect against (it is not a container or a VM):

- **reading**: the code reads every file "others" may read (system files, a world-readable repository or
  data set, other users' world-readable files) and sees every process in ``/proc`` (command lines included);
  keep secrets out of world-readable places;
- **other world-writable places**: a world-writable directory other than ``/tmp``, ``/var/tmp``, ``/dev/shm``
  (``/run/lock``, a shared data directory with mode 777) stays writable, without quota; the private tmpfs
  mounts live in RAM (up to four times ``tmp_mb`` per run in flight);
- **Unix sockets on the filesystem** that "others" may write (a world-writable socket of a local service) are
  reachable: the network namespace isolates IP and abstract sockets only;
- **aggregate load**: limits are per process, so up to ``max_procs`` processes may each use ``memory_mb`` and
  ``cpu_s``; there is no cgroup, so the host's memory and CPU are shared;
- **the kernel**: a kernel exploit or a side channel is out of scope (``no_new_privs`` is set, so a setuid
  program does not raise the code's privileges, but there is no seccomp filter on system calls);
- **not root**: without root the uid is not changed (no ``RLIMIT_NPROC`` cap: it would count all of the
  caller's processes; the code can write whatever the caller can and read the caller's ``/proc/<pid>/environ``),
  the tree is killed by process group only (a ``setsid`` escapes it) and the network namespace needs
  unprivileged user namespaces (:class:`SandboxUnavailable` when the kernel refuses them). This path is not
  exercised by the tests, which run as root.

The uids come from ``uid_range`` (default ``[1_500_000_000, +1_000_000)``), which must be mapped in the
caller's user namespace; the reservation covers the processes of one host (one ``/tmp``). Containers that
share a kernel and a uid range should get different ranges: the kernel counts ``RLIMIT_NPROC`` per uid across them.

The interpreter must be one the sandbox user can run: ``sys.executable`` when every directory above it is
world-searchable, else ``/usr/bin/python3`` (a pyenv Python under ``/root`` is not); ``python=`` picks one.
"""
from __future__ import annotations

import fcntl
import itertools
import os
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
from typing import ClassVar

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
    tmp_mb: int = 64
    """Size of each private tmpfs (the scratch directory, ``/tmp``, ``/var/tmp``, ``/dev/shm``), MiB; root callers only."""

    def __post_init__(self):
        for k in ("wall_s", "cpu_s", "memory_mb", "output_bytes", "max_procs", "file_mb", "open_files", "tmp_mb"):
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


def pids_of_uid(uid: int, zombies: bool = False) -> list[int]:
    """Processes whose real uid is ``uid``, read from ``/proc`` (live ones; ``zombies``: exited, unreaped ones too)."""
    out = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            text = Path(f"/proc/{name}/status").read_text()
        except OSError:
            continue
        fields = dict(ln.split(":", 1) for ln in text.splitlines() if ":" in ln)
        if fields.get("Uid", "").split()[:1] != [str(uid)]:
            continue
        if zombies or not fields.get("State", "").strip().startswith(("Z", "X")):
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
    """Reserves a uid per run: one byte-range lock (``lockf``) per uid on one file,
    ``<tmp>/megatron_rl-sandbox-uids/<first>-<count>.lock``, so runs of other processes on the host skip it
    too, and a set for the threads of this process (POSIX locks are per process). A lock dies with its
    process, so a crashed run frees its uid. One pool per range and process, its file never closed (closing
    any descriptor of the file would drop all of this process's locks on it). A uid that still has processes,
    exited ones not yet reaped included, is skipped: they count against its ``RLIMIT_NPROC``."""

    _pools: ClassVar[dict[tuple[int, int], _UidPool]] = {}
    _pools_lock: ClassVar[threading.Lock] = threading.Lock()

    @classmethod
    def get(cls, start: int, count: int) -> _UidPool:
        with cls._pools_lock:
            if (start, count) not in cls._pools:
                cls._pools[(start, count)] = cls(start, count)
            return cls._pools[(start, count)]

    def __init__(self, start: int, count: int):
        self.start, self.count = start, count
        d = Path(tempfile.gettempdir()) / "megatron_rl-sandbox-uids"
        d.mkdir(mode=0o700, exist_ok=True)
        self.fd = os.open(d / f"{start}-{count}.lock", os.O_CREAT | os.O_RDWR, 0o600)
        self.in_use: set[int] = set()
        self._next = itertools.count(os.getpid() * 7919)
        self._lock = threading.Lock()

    def acquire(self) -> int:
        with self._lock:
            for _ in range(min(self.count, 10_000)):
                i = next(self._next) % self.count
                if i in self.in_use:
                    continue
                try:
                    fcntl.lockf(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 1, i)
                except OSError:
                    continue                         # a run of another process holds it
                kill_uid(self.start + i)             # leftovers of a run whose parent died
                if pids_of_uid(self.start + i, zombies=True):
                    fcntl.lockf(self.fd, fcntl.LOCK_UN, 1, i)
                    continue
                self.in_use.add(i)
                return self.start + i
        raise SandboxUnavailable(f"no free sandbox uid in [{self.start}, {self.start + self.count})")

    def release(self, uid: int) -> None:
        with self._lock:
            fcntl.lockf(self.fd, fcntl.LOCK_UN, 1, uid - self.start)
            self.in_use.discard(uid - self.start)


# Runs in the sandbox interpreter, started by the caller (root or not), before the model's code: the network
# namespace, the limits, then the uid; then main.py, its traceback printed without this frame. Python >= 3.8.
# (Not a preexec_fn: that runs Python between fork and exec, unsafe in a threaded caller.)
_BOOTSTRAP = r"""
import ctypes, os, resource, sys
def _mounts(libc, uid, tmp_mb, fail):
    # a private mount namespace: tmpfs over /tmp, /var/tmp, /dev/shm and over the scratch directory itself
    libc.mount.argtypes = (ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p)
    def mount(src, dst, fstype, flags, data):
        if libc.mount(src, dst.encode(), fstype, flags, data) != 0:
            fail("mount on %s failed: %s" % (dst, os.strerror(ctypes.get_errno())))
    mount(b"none", "/", None, 0x4000 | 0x40000, None)          # MS_REC | MS_PRIVATE: nothing reaches the host
    scratch = os.getcwd()
    for d in ("/tmp", "/var/tmp", "/dev/shm"):
        if os.path.isdir(d) and not os.path.islink(d):
            mount(b"tmpfs", d, b"tmpfs", 2 | 4, b"size=%dm,nr_inodes=8192,mode=1777" % tmp_mb)  # MS_NOSUID | MS_NODEV
    os.makedirs(scratch, exist_ok=True)
    mount(b"tmpfs", scratch, b"tmpfs", 2 | 4, b"size=%dm,nr_inodes=8192,mode=0700,uid=%d,gid=%d" % (tmp_mb, uid, uid))
    os.chdir(scratch)
def _setup(uid, mem, cpu, fsize, nofile, nproc, tmp_mb):
    def fail(what):
        sys.stderr.write("sandbox setup: %s\n" % what)
        sys.stderr.flush()
        os._exit(126)
    with open("main.py") as f:         # read before the private mounts hide the caller's scratch directory
        src = f.read()
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.unshare(0x40000000 | 0x00020000 if uid >= 0 else 0x50000000) != 0:   # NEWNET | NEWNS; NEWUSER | NEWNET
        fail("unshare (network and mount namespaces) failed: " + os.strerror(ctypes.get_errno()))
    if uid >= 0:
        _mounts(libc, uid, tmp_mb, fail)
        with open("main.py", "w") as f:     # for the traceback's source lines; root's file: read-only to the code
            f.write(src)
    for k, v in ((resource.RLIMIT_AS, mem), (resource.RLIMIT_FSIZE, fsize), (resource.RLIMIT_NOFILE, nofile),
                 (resource.RLIMIT_CORE, 0), (resource.RLIMIT_CPU, cpu)):
        resource.setrlimit(k, (v, v + 1 if k == resource.RLIMIT_CPU else v))
    os.nice(10)
    if libc.prctl(38, 1, 0, 0, 0) != 0:        # PR_SET_NO_NEW_PRIVS: a setuid program runs without its privileges
        fail("prctl(PR_SET_NO_NEW_PRIVS) failed: " + os.strerror(ctypes.get_errno()))
    if uid >= 0:
        resource.setrlimit(resource.RLIMIT_NPROC, (nproc, nproc))
        try:
            os.setgroups([])
            os.setgid(uid)
            os.setuid(uid)
        except OSError as e:
            fail("setuid(%d) failed: %s" % (uid, e.strerror))
    return src
_src = _setup(*map(int, sys.argv[1:8]))
del _setup, _mounts
sys.argv = ["main.py"]
_code = compile(_src, "main.py", "exec")
try:
    exec(_code, {"__name__": "__main__", "__file__": "main.py", "__builtins__": __builtins__})
except SystemExit:
    raise
except BaseException as _e:
    import traceback
    traceback.print_exception(type(_e), _e, _e.__traceback__.tb_next)
    sys.exit(1)
"""


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
        self._uids = _UidPool.get(*uid_range) if self.root else None

    def probe(self) -> None:
        """Run ``pass`` once: ``SandboxUnavailable`` (one line) now, at start-up, rather than at the first call."""
        r = self.run("import sys; sys.stdout.write('ok')")
        if r.stdout != "ok":
            raise SandboxUnavailable(f"the sandbox's probe run failed: rc={r.returncode} {r.stderr.strip()[-300:]!r}")

    def run(self, code: str) -> SandboxResult:
        """Run ``code`` as ``main.py`` in a fresh scratch directory; never raises for what the code does."""
        uid = self._uids.acquire() if self._uids else None
        scratch = tempfile.mkdtemp(prefix="megatron_rl-sandbox-")
        try:
            main = Path(scratch) / "main.py"
            main.write_text(code)
            return self._run(scratch, uid)
        finally:
            if uid is not None:
                kill_uid(uid)
                self._uids.release(uid)
            shutil.rmtree(scratch, ignore_errors=True)

    def _run(self, scratch: str, uid: int | None) -> SandboxResult:
        lim = self.limits
        env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": scratch, "TMPDIR": scratch, "LANG": "C.UTF-8",
               "PYTHONIOENCODING": "utf-8", "PYTHONDONTWRITEBYTECODE": "1", "OMP_NUM_THREADS": "1",
               "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
        t0 = time.monotonic()
        mb = 1 << 20
        argv = [self.python, "-I", "-u", "-c", _BOOTSTRAP] + [str(int(v)) for v in (
            -1 if uid is None else uid, lim.memory_mb * mb, lim.cpu_s, lim.file_mb * mb, lim.open_files, lim.max_procs,
            lim.tmp_mb)]
        p = subprocess.Popen(argv, cwd=scratch, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, start_new_session=True)
        timed_out = truncated = False
        try:
            out, err, timed_out, truncated = self._collect(p, t0)
            if not (timed_out or truncated):     # the pipes closed; the main process may still run
                try:
                    p.wait(timeout=max(lim.wall_s - (time.monotonic() - t0), 0.0))
                except subprocess.TimeoutExpired:
                    timed_out = True
        finally:
            self._kill_tree(p, uid)
            p.stdout.close()
            p.stderr.close()
        out, err = out.decode("utf-8", "replace"), err.decode("utf-8", "replace")
        if p.returncode == _EXIT_SETUP and err.startswith("sandbox setup:"):
            raise SandboxUnavailable(err.strip())
        return SandboxResult(out, err, p.returncode, timed_out, truncated, time.monotonic() - t0)

    def _collect(self, p: subprocess.Popen, t0: float) -> tuple[bytearray, bytearray, bool, bool]:
        """Read stdout and stderr as they come until both close, the wall clock runs out, the output passes
        its limit, or the main process has exited and the pipes are drained (a descendant that still writes
        gets 0.2 s more; it is killed with the rest)."""
        lim = self.limits
        out, err = bytearray(), bytearray()
        bufs = {p.stdout.fileno(): out, p.stderr.fileno(): err}
        sel = selectors.DefaultSelector()
        for fd in bufs:
            os.set_blocking(fd, False)
            sel.register(fd, selectors.EVENT_READ)
        exited_at = None
        try:
            while sel.get_map():
                now = time.monotonic()
                left = lim.wall_s - (now - t0)
                if left <= 0:
                    return out, err, True, False
                if exited_at is None and p.poll() is not None:
                    exited_at = now
                events = sel.select(timeout=min(0.05, left))
                if exited_at is not None and (not events or now - exited_at > 0.2):
                    break
                for key, _ in events:
                    chunk = os.read(key.fd, 65536)
                    if not chunk:
                        sel.unregister(key.fd)
                        continue
                    room = lim.output_bytes - len(out) - len(err)
                    bufs[key.fd] += chunk[:max(room, 0)]
                    if len(chunk) > room:
                        return out, err, False, True
        finally:
            sel.close()
        return out, err, False, False

    @staticmethod
    def _kill_tree(p: subprocess.Popen, uid: int | None) -> None:
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        if uid is not None:
            kill_uid(uid)
        p.wait()
