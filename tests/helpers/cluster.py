"""Several "nodes" on this one host for tests: a Ray cluster started with ``ray start --block`` per node
(separate temp dirs and ports, as the sbatch script does) and torchrun launches with ``--nnodes``.

Each Ray node is stopped by terminating its own ``ray start --block`` process (which stops that node's
processes); ``ray stop`` is never used because it stops every Ray instance on the host.
"""
from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Self

from tests.helpers.demo import warm_overrides
from tests.helpers.dist import free_port

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
#: steps of the multi-node runs (tests/cluster): checkpoints at 2 and 4, so a kill after step 2 resumes mid-run
MULTINODE_STEPS = 6
ENV = {"OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", "RAY_AUTH_MODE": "disabled", "WANDB_MODE": "offline",
       "TOKENIZERS_PARALLELISM": "false", "PYTHONPATH": str(REPO)}
#: metrics that measure time, not the computation
TIMING = ("time/", "perf/", "rollout/sync_seconds")


def run_env(**extra: str) -> dict:
    """The environment of a launch on these test clusters: without a ``RAY_ADDRESS`` from the caller's
    environment, since they start and join their own Ray cluster."""
    env = {**os.environ, **ENV, **extra}
    env.pop("RAY_ADDRESS", None)
    return env


class RayCluster:
    """``n`` Ray nodes on this host: node 0 the head; ``cpus`` each. ``.address`` = ``ip:port``."""

    def __init__(self, n: int = 2, cpus: int = 1):
        self.n, self.cpus = n, cpus
        self.root = Path(tempfile.mkdtemp(prefix="rc", dir="/tmp"))  # short: Ray's unix sockets live under it
        self.port = free_port()
        self.address = f"127.0.0.1:{self.port}"
        self.procs: list[subprocess.Popen] = []

    def node_dir(self, i: int) -> Path:
        return self.root / f"n{i}"

    def _start(self, i: int) -> None:
        args = [str(BIN / "ray"), "start", "--block", f"--temp-dir={self.node_dir(i)}", f"--num-cpus={self.cpus}",
                "--num-gpus=0", "--node-ip-address=127.0.0.1", "--disable-usage-stats",
                f"--dashboard-agent-listen-port={free_port()}"]
        if i == 0:
            args += ["--head", f"--port={self.port}", "--include-dashboard=false",
                     f"--ray-client-server-port={free_port()}"]
        else:
            args += [f"--address={self.address}"]
        with open(self.root / f"node{i}.log", "w") as log:  # the child keeps its own copy of the fd
            self.procs.append(subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, env=run_env(),
                                               start_new_session=True))

    def __enter__(self) -> Self:
        for i in range(self.n):
            self._start(i)
            if i == 0:
                time.sleep(2)
        p = subprocess.run([sys.executable, "-m", "megatron_rl.runtime.cluster", "wait-ray", "--address", self.address,
                            "--nodes", str(self.n), "--timeout", "120"], env=run_env(), capture_output=True, text=True,
                           check=False)
        if p.returncode != 0:
            self.__exit__()
            raise RuntimeError(f"Ray cluster did not come up: {p.stderr[-2000:]}")
        return self

    def engine_nodes(self) -> list[int]:
        """Indices of the nodes whose Ray session ran an engine actor (its worker log names the class)."""
        hits = []
        for i in range(self.n):
            logs = self.node_dir(i).glob("session_*/logs/worker-*.out")
            if any("_EngineActor" in f.read_text(errors="replace") for f in logs):
                hits.append(i)
        return hits

    def __exit__(self, *exc) -> None:
        for p in self.procs:  # SIGTERM: `ray start --block` stops its node's processes and exits
            with contextlib.suppress(ProcessLookupError):
                p.send_signal(signal.SIGTERM)
        for p in self.procs:
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(p.pid, signal.SIGKILL)
                p.wait()
        shutil.rmtree(self.root, ignore_errors=True)


def train_cmd(nnodes: int, node_rank: int, nproc: int, rdzv: str, overrides: list[str], *, max_restarts: int = 0,
              resume: str = "auto") -> list[str]:
    """One node's torchrun (c10d rendezvous at ``rdzv``) running ``megatron-rl train``. A fresh TCPStore
    per restart round only when there are restarts, as examples/slurm/train_multinode.sbatch does (it
    says why)."""
    return ["env", f"TORCH_DISABLE_SHARE_RDZV_TCP_STORE={int(max_restarts > 0)}", str(BIN / "torchrun"), f"--nnodes={nnodes}", f"--node-rank={node_rank}", f"--nproc-per-node={nproc}",
            f"--max-restarts={max_restarts}", "--rdzv-backend=c10d", f"--rdzv-endpoint={rdzv}", "--rdzv-id=test",
            f"--rdzv-conf=is_host={int(node_rank == 0)}",  # the store on node 0, as on a real cluster
            "--monitor-interval=0.5", "-m", "megatron_rl.cli", "train", "--config",
            "examples/configs/tiny_cpu_grpo.yaml", "--resume", resume, *overrides]


def launch(cmd: list[str], log: Path) -> subprocess.Popen:
    with open(log, "w") as f:
        return subprocess.Popen(cmd, cwd=REPO, env=run_env(), stdout=f, stderr=subprocess.STDOUT,
                                start_new_session=True)


def finish(procs: list[subprocess.Popen], logs: list[Path], timeout: float = 600) -> list[int]:
    """Wait for every launch; on timeout kill all (never leave a hung job behind) and fail with the logs."""
    deadline = time.monotonic() + timeout
    codes = []
    for p in procs:
        try:
            codes.append(p.wait(timeout=max(1.0, deadline - time.monotonic())))
        except subprocess.TimeoutExpired:
            kill_all(procs)
            raise AssertionError(f"launch still running after {timeout:.0f} s:\n{tails(logs)}") from None
    return codes


def kill_all(procs: list[subprocess.Popen]) -> None:
    for p in procs:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(p.pid, signal.SIGKILL)
        p.wait()


def tails(logs: list[Path], n: int = 4000) -> str:
    return "\n".join(f"--- {p.name}\n{p.read_text(errors='replace')[-n:]}" for p in logs if p.exists())


def rows(run_dir: Path) -> list[dict]:
    p = run_dir / "metrics.jsonl"
    return [json.loads(x) for x in p.read_text().splitlines()] if p.exists() else []


#: counters of the rollout client's process (weight pushes so far): a resumed run starts them afresh
PROCESS_COUNTERS = ("rollout/sync_bytes", "rollout/weight_version", "rollout/restarts", "rollout/retries")


def assert_same_metrics(ref: list[dict], got: list[dict], what: str, skip: tuple = ()) -> None:
    """Every metric of every step equal (exactly), timings and ``skip`` aside."""
    assert [r["step"] for r in got] == [r["step"] for r in ref], (what, [r["step"] for r in got])
    for a, b in zip(ref, got):
        for k, v in a.items():
            if not k.startswith(TIMING) and k not in skip:
                assert b.get(k) == v, f"{what}: step {a['step']} {k}: reference {v!r} != {b.get(k)!r}"


def worker_pids(agent: subprocess.Popen) -> list[int]:
    """The trainer processes torchrun ``agent`` started (its direct children running megatron_rl)."""
    import psutil

    kids = psutil.Process(agent.pid).children()
    return [k.pid for k in kids if "megatron_rl" in " ".join(k.cmdline())]


def multinode_overrides(warm: Path, run_dir: Path) -> list[str]:
    """The ``tiny_cpu_grpo`` overrides of the multi-node runs (2-node torchrun, Slurm): DP=2 over two
    trainer ranks, two 1-CPU engines, :data:`MULTINODE_STEPS` steps from the plain warm start ``warm``."""
    return warm_overrides(warm, run_dir, f"trainer.steps={MULTINODE_STEPS}", "trainer.keep_last=5",
                          "data.prompts_per_step=8", "rollout.n=4", "trainer.micro_batch_size=8",
                          "rollout.num_engines=2", "rollout.cpus_per_engine=1", "parallel.timeout_s=300")
