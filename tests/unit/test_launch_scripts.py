"""Every shell script under examples/ (and tools/) passes ``bash -n`` and ``shellcheck``, and rejects bad input
with one clear line before it starts anything (no torchrun, no srun).

shellcheck comes from Debian (``make cluster-deps`` installs it); without it the shellcheck test is
skipped with that reason.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "examples"


def _is_shell(p: Path) -> bool:
    if p.suffix in (".sh", ".sbatch", ".bash"):
        return True
    try:
        first = p.read_bytes()[:64]
    except OSError:
        return False
    return first.startswith(b"#!") and b"sh" in first.split(b"\n")[0]


SCRIPTS = sorted(p for p in [*EXAMPLES.rglob("*"), *(REPO / "tools").rglob("*.sh")] if p.is_file() and _is_shell(p))


def test_there_are_scripts():
    names = {p.name for p in SCRIPTS}
    assert {"train_multinode.sbatch", "train_1node.sh", "tiny_cpu_2proc.sh", "convert_hf_to_mcore.sh",
            "local_cluster.sh"} <= names


@pytest.mark.parametrize("script", SCRIPTS, ids=[p.name for p in SCRIPTS])
def test_bash_n(script):
    p = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True, check=False)
    assert p.returncode == 0, p.stderr


@pytest.mark.parametrize("script", SCRIPTS, ids=[p.name for p in SCRIPTS])
def test_shellcheck_clean(script):
    sc = shutil.which("shellcheck")
    if sc is None:
        pytest.skip("shellcheck is not installed (`make cluster-deps` installs it from Debian)")
    p = subprocess.run([sc, "--shell=bash", "--severity=info", str(script)], capture_output=True, text=True, check=False)
    assert p.returncode == 0, p.stdout + p.stderr


def _run(script: str, env: dict, *args: str, cwd: Path = REPO) -> subprocess.CompletedProcess:
    base = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    return subprocess.run(["bash", str(EXAMPLES / script), *args], capture_output=True, text=True, timeout=60,
                          check=False, env={**base, **env}, cwd=cwd)


FAKE_JOB = {"SLURM_JOB_ID": "1", "SLURM_JOB_NODELIST": "n[1-2]"}  # fails validation before any scontrol/srun


@pytest.mark.parametrize("script,env,msg", [
    ("slurm/train_multinode.sbatch", {}, "run me with sbatch"),
    ("slurm/train_multinode.sbatch", {**FAKE_JOB, "GPUS_PER_NODE": "eight"}, "GPUS_PER_NODE=eight: want an integer"),
    ("slurm/train_multinode.sbatch", {**FAKE_JOB, "CONFIG": "nope.yaml"}, "CONFIG=nope.yaml: no such file"),
    ("slurm/train_multinode.sbatch", {**FAKE_JOB, "ROLLOUT_NODES": "-1"}, "ROLLOUT_NODES=-1: want an integer"),
    ("slurm/train_multinode.sbatch", {**FAKE_JOB, "RAY_PORT": "70000"}, "want ports in 1..65535"),
    ("slurm/train_multinode.sbatch", {**FAKE_JOB, "RESUME": "/no/such/ckpt"}, "RESUME=/no/such/ckpt: want auto"),
    ("slurm/train_multinode.sbatch", {**FAKE_JOB, "VENV": "/nonexistent"}, "VENV=/nonexistent: no bin/torchrun"),
    ("torchrun/train_1node.sh", {"NPROC": "0"}, "NPROC=0: want an integer >= 1"),
    ("torchrun/train_1node.sh", {"CONFIG": "missing.yaml"}, "CONFIG=missing.yaml: no such file"),
    ("torchrun/tiny_cpu_2proc.sh", {"VENV": "/nonexistent"}, "VENV=/nonexistent: no bin/torchrun"),
    ("torchrun/convert_hf_to_mcore.sh", {"OUT": "x"}, "set HF="),
    ("torchrun/convert_hf_to_mcore.sh", {"HF": "/nonexistent", "OUT": "x"}, "HF=/nonexistent: no config.json"),
    ("torchrun/convert_hf_to_mcore.sh", {"HF": "examples", "OUT": "x", "TP": "two"}, None),
])
def test_bad_input_is_one_clear_line(script, env, msg, tmp_path):
    if msg is None:  # TP check needs a real HF dir
        (tmp_path / "config.json").write_text("{}")
        env, msg = {**env, "HF": str(tmp_path)}, "TP=two PP=1: want integers"
    p = _run(script, env)
    assert p.returncode == 2, (p.returncode, p.stdout, p.stderr)
    err = p.stderr.strip().splitlines()
    assert len(err) == 1 and msg in err[0], p.stderr


def test_torchrun_scripts_keep_the_callers_directory(tmp_path):
    """Relative paths are the caller's: CONFIG relative to cwd is found (the script no longer cd's)."""
    (tmp_path / "my.yaml").write_text("{}")
    p = _run("torchrun/train_1node.sh", {"CONFIG": "my.yaml", "VENV": "/nonexistent"}, cwd=tmp_path)
    assert p.returncode == 2 and "VENV=/nonexistent" in p.stderr, p.stderr  # CONFIG passed, VENV reached


def test_gpu_check_refuses_bad_input_in_one_line(tmp_path):
    """tools/gpu_check.sh: wheels over the 64 MiB limit, a missing wheel folder, and (here) no CUDA device are
    one line each, before anything is installed or run."""
    tool = REPO / "tools" / "gpu_check.sh"
    big = tmp_path / "wheels"
    big.mkdir()
    with open(big / "megatron_core-0.16.1-py3-none-any.whl", "wb") as f:
        f.truncate(65 * 1024 * 1024)                     # sparse: 65 MiB by size
    base = {k: v for k, v in os.environ.items() if k != "WHEELS"}
    for env, words in (({"WHEELS": str(big)}, "65 MiB of wheels, over the 64 MiB limit"),
                       ({"WHEELS": str(tmp_path / "none")}, "is not a directory"),
                       ({"SEQ_LEN": "0"}, "SEQ_LEN=0 is not a positive integer"),
                       ({"PYTHON": sys.executable}, "no CUDA device visible")):
        p = subprocess.run(["bash", str(tool)], capture_output=True, text=True, timeout=120, check=False,
                           env={**base, "OUT": str(tmp_path / "out"), **env})
        assert p.returncode == 2 and words in p.stderr and len(p.stderr.strip().splitlines()) == 1, (env, p.stderr)
    assert not (tmp_path / "out").exists()
