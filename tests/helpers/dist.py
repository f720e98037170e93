"""Run a script under ``torchrun`` (gloo, N local processes) from a test."""
from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


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
