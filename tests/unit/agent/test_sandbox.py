"""The process sandbox against hostile code (megatron_rl/agent/tools/sandbox.py): each attack a test, each with
the control that shows the attack works outside the sandbox. The uid-based guarantees (process cap, no
writes to the caller's files, the uid sweep) need a root caller, as in the training container."""
from __future__ import annotations

import ast
import os
import re
import shutil
import socket
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from megatron_rl.agent.tools.sandbox import (
    Sandbox,
    SandboxLimits,
    SandboxUnavailable,
    default_python,
    pids_of_uid,
)

root_only = pytest.mark.skipif(os.geteuid() != 0, reason="the uid isolation applies to a root caller")


def sandbox(**limits) -> Sandbox:
    return Sandbox(SandboxLimits(**{"wall_s": 5.0, "cpu_s": 2, **limits}))


def test_runs_code_as_its_own_user_in_a_scratch_dir_that_is_removed():
    r = sandbox().run("import os\nprint(os.getuid(), os.getcwd())\nopen('f.txt', 'w').write('x' * 100)\nprint(6 * 7)")
    uid, cwd, answer = r.stdout.split()
    assert (r.returncode, answer, r.timed_out, r.truncated) == (0, "42", False, False)
    assert Path(cwd).name.startswith("megatron_rl-sandbox-") and not Path(cwd).exists()
    if os.geteuid() == 0:
        assert int(uid) != 0


@root_only
def test_fork_bomb_stops_at_max_procs_and_no_process_survives_the_run():
    # children that setsid() (leaving the process group) and sleep: the cap holds, and the uid sweep kills
    # them although the main process exits normally
    code = """
import os, time
ok = failed = 0
for _ in range(100):
    try:
        pid = os.fork()
    except OSError:
        failed += 1
        continue
    if pid == 0:
        os.setsid()
        time.sleep(60)
        os._exit(0)
    ok += 1
print(os.getuid(), ok, failed, flush=True)
"""
    r = sandbox(max_procs=6).run(code)
    uid, ok, failed = map(int, r.stdout.split())
    assert ok <= 5 and failed >= 95, r      # 6 processes of the sandbox uid: the main one and 5 children
    assert pids_of_uid(uid) == []


@root_only
def test_spinning_fork_bomb_is_killed_at_the_wall_clock():
    code = "import os\nprint(os.getuid(), flush=True)\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n"
    t0 = time.monotonic()
    r = sandbox(wall_s=1.0, max_procs=4).run(code)
    assert r.timed_out and time.monotonic() - t0 < 4.0, r
    assert pids_of_uid(int(r.stdout.split()[0])) == []


@pytest.fixture
def world_visible_dir():
    """A directory of the caller's that others may enter and read, outside the temporary directories the sandbox
    replaces with its own (pytest's tmp_path is one of those, and sits under a 0700 directory): beside this file,
    unless the checkout itself lies under one of them (a clone in /tmp), then under /opt."""
    here = Path(__file__).resolve().parent
    hidden = any(here.is_relative_to(t) for t in ("/tmp", "/var/tmp", "/dev/shm"))
    d = (Path("/opt") if hidden else here) / f"_sandbox_probe_{os.getpid()}"
    d.mkdir(mode=0o755)
    d.chmod(0o755)
    yield d
    shutil.rmtree(d)


def test_a_daemon_still_writing_after_main_exits_is_cut_off_and_killed():
    code = """
import os, time
if os.fork() == 0:
    os.setsid()
    while True:
        print("daemon", flush=True)
        time.sleep(0.01)
print(os.getuid(), "main done", flush=True)
"""
    r = sandbox(wall_s=5.0).run(code)
    assert r.returncode == 0 and not r.timed_out and r.seconds < 2.0, r
    # the daemon writes to the same pipe: its lines may interleave with the main line's bytes
    uid = re.search(r"(\d+)\s*(?:daemon\s*)*main done", r.stdout).group(1)
    if os.geteuid() == 0:
        assert pids_of_uid(int(uid)) == []


def test_parallel_runs_get_their_own_uid_and_scratch_dir():
    sb = sandbox()
    with ThreadPoolExecutor(3) as ex:
        runs = list(ex.map(sb.run, ["import os, time\ntime.sleep(0.3)\nprint(os.getuid(), os.getcwd())"] * 3))
    uids, dirs = zip(*(r.stdout.split() for r in runs))
    assert len(set(dirs)) == 3 and all(r.returncode == 0 for r in runs)
    if os.geteuid() == 0:
        assert len(set(uids)) == 3


@root_only
def test_cannot_write_modify_or_delete_files_outside(world_visible_dir):
    tmp_path = world_visible_dir
    keep = tmp_path / "keep.txt"
    keep.write_text("original")
    keep.chmod(0o644)
    code = f"""
import os
tries = {{"create": lambda: open({str(tmp_path / 'new.txt')!r}, "w"), "append": lambda: open({str(keep)!r}, "a"),
          "delete": lambda: os.remove({str(keep)!r}), "rename": lambda: os.rename({str(keep)!r}, {str(tmp_path / 'stolen')!r}),
          "chmod": lambda: os.chmod({str(keep)!r}, 0o777)}}
for what, f in tries.items():
    try:
        f()
        print(what, "allowed")
    except OSError as e:
        print(what, "denied", e.errno)
"""
    r = sandbox().run(code)
    # EACCES (13) for what the file and directory modes refuse; EPERM (1) for chmod of a file one does not own
    assert r.stdout.split("\n")[:5] == [f"{w} denied 13" for w in ("create", "append", "delete", "rename")] + [
        "chmod denied 1"], r
    assert keep.read_text() == "original" and sorted(p.name for p in tmp_path.iterdir()) == ["keep.txt"]
    # control: the same code run by the caller does all of it
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, check=False).stdout
    assert "create allowed" in out and "append allowed" in out


@root_only
def test_tmp_is_private_bounded_and_gone_after_the_run():
    marker = f"megatron_rl_sandbox_probe_{os.getpid()}"
    code = f"""
import os
for d in ("/tmp", "/dev/shm", "."):
    with open(os.path.join(d, {marker!r}), "w") as f:
        f.write("x")
print(sorted(os.listdir("/tmp")), flush=True)
try:
    with open("big", "wb") as f:
        for _ in range(16):
            f.write(b"0" * 2**20)
    print("wrote 16 MiB")
except OSError as e:
    print("disk full", e.errno)
"""
    r = sandbox(tmp_mb=4, file_mb=64).run(code)
    listing, full = r.stdout.splitlines()
    names = ast.literal_eval(listing)
    # the sandbox's /tmp holds its marker and (the scratch directory being under /tmp) the path to its
    # scratch tmpfs, none of the host's files
    assert marker in names and all(n == marker or n.startswith("megatron_rl-sandbox-") for n in names), names
    assert full == "disk full 28", r                    # ENOSPC at the 4 MiB tmpfs, before RLIMIT_FSIZE
    assert not (Path("/tmp") / marker).exists() and not (Path("/dev/shm") / marker).exists()


def test_no_network_not_even_the_callers_localhost():
    with socket.create_server(("127.0.0.1", 0)) as srv:
        port = srv.getsockname()[1]
        code = f"""
import socket
for host in ("127.0.0.1", "8.8.8.8"):
    try:
        socket.create_connection((host, {port} if host == "127.0.0.1" else 53), timeout=2).close()
        print(host, "connected")
    except OSError as e:
        print(host, "refused", e.errno)
"""
        control = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=30, check=False).stdout
        r = sandbox().run(code)
    assert "127.0.0.1 connected" in control                    # the listener is reachable from outside
    assert r.stdout.startswith("127.0.0.1 refused") and "connected" not in r.stdout, r


def test_huge_output_is_truncated_at_the_limit_and_the_run_stopped():
    t0 = time.monotonic()
    r = sandbox(output_bytes=4096).run("import sys\nwhile True:\n    sys.stdout.write('x' * 1000)\n    sys.stderr.write('y' * 10)")
    assert r.truncated and not r.timed_out and len(r.stdout) + len(r.stderr) == 4096, r
    assert time.monotonic() - t0 < 3.0


def test_infinite_loop_is_killed_at_its_cpu_time():
    r = sandbox(cpu_s=1, wall_s=10.0).run("while True:\n    pass")
    assert r.cpu_limited and not r.timed_out and r.seconds < 8.0, r


def test_a_loop_that_ignores_sigxcpu_is_killed_at_the_hard_limit():
    r = sandbox(cpu_s=1, wall_s=10.0).run("import signal\nsignal.signal(signal.SIGXCPU, signal.SIG_IGN)\nwhile True:\n    pass")
    assert r.returncode == -9 and r.cpu_limited and r.seconds < 8.0, r


def test_sleeping_code_is_killed_at_the_wall_clock():
    r = sandbox(wall_s=1.0).run("import time\nprint('start', flush=True)\ntime.sleep(30)")
    assert r.timed_out and r.stdout == "start\n" and r.seconds < 3.0, r


@pytest.mark.parametrize("code", ["b = bytearray(8 * 2**30)", "x = []\nwhile True:\n    x.append(bytearray(2**24))"],
                         ids=["one_alloc", "growing"])
def test_memory_bomb_gets_memory_error(code):
    r = sandbox(memory_mb=256).run(code)
    assert r.returncode == 1 and r.stderr.rstrip().endswith("MemoryError"), r


def test_limits_are_checked_and_a_bad_interpreter_is_refused():
    with pytest.raises(ValueError, match="SandboxLimits.cpu_s must be a positive number"):
        SandboxLimits(cpu_s=0)
    assert default_python()
    if os.geteuid() == 0:
        with pytest.raises(SandboxUnavailable, match="not mapped"):
            Sandbox(uid_range=(2**32 - 10, 100))
