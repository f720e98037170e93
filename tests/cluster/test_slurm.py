"""``sbatch examples/slurm/train_multinode.sbatch`` (unmodified; configured by environment variables and
sbatch options only) under a real Slurm: Debian's slurmctld + two slurmd "nodes" on this host + munge,
set up by ``tools/slurm/local_cluster.sh``.

The job bootstraps a Ray head on node1 and a Ray worker on node2, runs torchrun on both nodes
(c10d rendezvous on node1's address, node ranks from Slurm, one trainer rank per node = DP 2),
trains the tiny CPU GRPO config, and is requeued mid-run through the script's own SIGUSR1 handler
(what ``--signal=B:USR1@300`` delivers before the time limit); the requeued job continues from the
newest complete checkpoint (``RESUME=auto``) to the last step. Every Ray process of the job is gone
afterwards (each node's Ray is stopped by its own step).

Skipped, with the reason, when Slurm is not installed (``make cluster-deps``) or not root.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from tests.helpers.cluster import MULTINODE_STEPS, REPO, multinode_overrides, rows, run_env
from tests.helpers.dist import free_port

SCRIPT = "examples/slurm/train_multinode.sbatch"
SETUP = REPO / "tools" / "slurm" / "local_cluster.sh"


def _sh(*cmd: str, check: bool = True) -> str:
    p = subprocess.run(list(cmd), capture_output=True, text=True, timeout=60, check=False)
    if check and p.returncode != 0:
        raise AssertionError(f"{' '.join(cmd)} failed: {p.stdout}{p.stderr}")
    return p.stdout


@pytest.fixture(scope="module")
def slurm():
    missing = [b for b in ("slurmctld", "slurmd", "munged", "sbatch", "scontrol") if shutil.which(b) is None]
    if missing:
        pytest.skip(f"Slurm not installed ({', '.join(missing)} missing): `make cluster-deps` installs it")
    if os.geteuid() != 0:
        pytest.skip("starting a local Slurm cluster needs root")
    running = subprocess.run(["sinfo", "-h"], capture_output=True, timeout=30, check=False).returncode == 0
    p = subprocess.run([str(SETUP), "start"], capture_output=True, text=True, timeout=180, check=False)
    assert p.returncode == 0, f"local Slurm did not start: {p.stdout}{p.stderr}"
    yield
    if not running:  # leave the host as found
        subprocess.run([str(SETUP), "stop"], capture_output=True, timeout=60, check=False)


def job_field(job: str, field: str) -> str:
    m = re.search(rf"\b{field}=(\S*)", _sh("scontrol", "show", "job", job, check=False))
    return m.group(1) if m else ""


def wait_job(job: str, cond, what: str, log: Path, timeout: float = 600) -> None:
    t0 = time.monotonic()
    while not cond():
        state = job_field(job, "JobState")
        if state in ("FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY") or time.monotonic() - t0 > timeout:
            tail = log.read_text()[-6000:] if log.exists() else "(no job log)"
            raise AssertionError(f"job {job} {state or 'gone'} while waiting for {what}:\n{tail}")
        time.sleep(0.5)


@pytest.mark.slow
def test_sbatch_script_runs_and_resumes_after_requeue(slurm, plain_warm, tmp_path):
    run_dir = tmp_path / "run"
    ray_tmp = Path(tempfile.mkdtemp(prefix="rs", dir="/tmp"))  # short: Ray's unix sockets live under it
    # stand-in GPUs (count-only GRES from local_cluster.sh, when it could create them): the script's
    # --gres requests on every srun step are scheduled for real; Ray advertises them; nothing uses them
    m = re.search(r"Gres=gpu:(\d+)", _sh("scontrol", "show", "node", "node1"))
    gpus = m.group(1) if m else "0"
    env = run_env(CONFIG="examples/configs/tiny_cpu_grpo.yaml", GPUS_PER_NODE=gpus, NPROC_PER_NODE="1",
                  RAY_PORT=str(free_port()), MASTER_PORT=str(free_port()), RAY_WAIT_S="120", RAY_TMPDIR=str(ray_tmp),
                  RAY_HEAD_ARGS=f"--include-dashboard=false --ray-client-server-port={free_port()}",
                  RAY_START_ARGS="--num-cpus=1 --disable-usage-stats")
    log = tmp_path / "slurm.out"
    t0 = time.monotonic()
    job = subprocess.run(["sbatch", "--parsable", "--nodes=2", f"--gpus-per-node={gpus}", "--cpus-per-task=1",
                          "--time=20", f"--output={log}", f"--chdir={REPO}", SCRIPT,
                          *multinode_overrides(plain_warm, run_dir)],
                         env=env, capture_output=True, text=True, check=True, timeout=60).stdout.strip().split(";")[0]
    done = False
    try:
        wait_job(job, lambda: (run_dir / "checkpoints" / "step_2" / "COMPLETE").exists(), "the step-2 checkpoint", log)
        _sh("scancel", "--batch", "--signal=USR1", job)  # what --signal=B:USR1@300 sends before the limit
        wait_job(job, lambda: job_field(job, "Restarts") == "1" and job_field(job, "JobState") == "PENDING",
                 "the requeue", log, timeout=120)
        _sh("scontrol", "update", f"JobId={job}", "StartTime=now")  # skip Slurm's fixed delay before a requeued job
        wait_job(job, lambda: job_field(job, "JobState") == "COMPLETED", "completion", log)
        done = True
    finally:
        if not done:
            subprocess.run(["scancel", job], check=False)
    wall = time.monotonic() - t0
    out = log.read_text()
    print(f"[slurm] job {job}: 2 Slurm nodes x {gpus} stand-in GPUs, requeued once, {wall:.0f} s from sbatch to "
          "completion")
    assert job_field(job, "ExitCode") == "0:0", out[-4000:]
    assert "SIGUSR1 (time limit near): requeueing job" in out and "(restart 1)" in out, out[-4000:]
    assert re.search(r"resumed from \S+/checkpoints/step_\d+ at step \d+", out), out[-4000:]
    assert [r["step"] for r in rows(run_dir)] == list(range(1, MULTINODE_STEPS + 1))
    for i in (0, 1):  # a Ray node per Slurm node, each hosting one engine
        logs = list((ray_tmp / f"ray-{job}-{i}").glob("session_*/logs/worker-*.out"))
        assert any("_EngineActor" in f.read_text(errors="replace") for f in logs), f"no engine on Ray node {i}"
    left = _sh("pgrep", "-af", f"ray-{job}-", check=False).strip()
    assert not left, f"Ray processes of job {job} outlived it:\n{left}"
    shutil.rmtree(ray_tmp, ignore_errors=True)
