"""Run a script under ``torchrun`` (gloo, N local processes) from a test."""
from __future__ import annotations

import os
import random
import socket
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

#: Ports a test hands to a process it starts come from [20000, the kernel's ephemeral range): a port the
#: kernel picked with ``bind(0)`` and the test released can be taken by any outgoing connection or other
#: ``bind(0)`` before the child binds it (CI saw torchrun's c10d rendezvous fail with EADDRINUSE on such a
#: port while Ray and vLLM opened connections in the other worker). Below the ephemeral range
#: (/proc/sys/net/ipv4/ip_local_port_range, 32768-60999 by default) and above Ray's worker ports (10002-19999)
#: the kernel never hands a port out by itself; each pytest-xdist worker draws from its own slice, so two
#: workers never pick the same one, and a worker never repeats one.
_PORT_LO = 20000
_ISSUED: set[int] = set()


def _ephemeral_lo() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_port() -> int:
    """A port nothing listens on now and that no other test worker or kernel allocation will pick."""
    hi = min(_ephemeral_lo(), 32768)
    n = max(1, int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")))
    wid = os.environ.get("PYTEST_XDIST_WORKER", "gw0")
    i = int(wid[2:]) if wid[2:].isdigit() else 0
    span = (hi - _PORT_LO) // n
    lo = _PORT_LO + (i % n) * span
    for _ in range(500):
        port = lo + random.randrange(span)
        if port in _ISSUED:
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        _ISSUED.add(port)
        return port
    raise RuntimeError(f"no free port in [{lo}, {lo + span})")


def repo_env(env: dict | None = None) -> dict:
    """``env`` (default: this process's) with the repository first on ``PYTHONPATH``: a worker script run
    as a subprocess imports ``tests.helpers`` (and this checkout's ``megatron_rl``) from there."""
    e = dict(os.environ if env is None else env)
    e["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), e.get("PYTHONPATH")]))
    return e


def torchrun(script: str | Path, *args: str, nproc: int = 2, timeout: float = 600, env: dict | None = None) -> subprocess.CompletedProcess:
    """Run ``script`` with ``nproc`` ranks; raise with both ranks' output on failure. Each rank runs torch
    with ``$MEGATRON_RL_TEST_THREADS`` intra-op threads (default 1; set 2 to check that a tolerance holds
    under another reduction blocking of the host's kernels)."""
    e = repo_env()
    e.update({"OMP_NUM_THREADS": os.environ.get("MEGATRON_RL_TEST_THREADS", "1"), "PYTHONUNBUFFERED": "1",
              "MASTER_ADDR": "127.0.0.1"})
    e.update(env or {})
    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={nproc}",
           f"--master_port={free_port()}", "--master_addr=127.0.0.1", str(script), *map(str, args)]
    p = subprocess.run(cmd, cwd=REPO, env=e, capture_output=True, text=True, timeout=timeout)
    if p.returncode != 0:
        raise AssertionError(f"torchrun {script} failed (rc={p.returncode})\n--- stdout\n{p.stdout[-6000:]}\n--- stderr\n{p.stderr[-8000:]}")
    return p
