"""The trainer's GPU code path on this CPU (``megatron-rl train --simulate-gpu``, ``runtime/simulated_gpu.py``):
every method family, one-step-off, partial rollouts, checkpoint / ``--resume auto`` / export, and a four-rank
TP = 2 x DP = 2 run, each with device tensors where a GPU puts them, every op's operands on one device,
host tensors refused by NCCL-semantics collectives, and the host syncs and transfers counted per step.

One worker process runs the families on one engine pool (``tests/e2e/workers/simulated_gpu.py``); the
partial and four-rank runs go through the CLI flag itself. What the tier cannot see (kernels, streams, the
allocator, NCCL itself) is listed in its module docstring and ``docs/simulated-gpu.md``.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers.dist import repo_env
from tests.helpers.fake_openai_server import start_server

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
pytestmark = pytest.mark.timeout(1200)
SIM = ("sim/host_syncs", "sim/d2h_bytes", "sim/h2d_bytes", "sim/device_peak_gib")


def _env() -> dict:
    return repo_env({**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "2", "RAY_AUTH_MODE": "disabled"})


@pytest.fixture(scope="module")
def families(chat_fixture, tmp_path_factory):
    proc, url = start_server(1500)
    out = tmp_path_factory.mktemp("sim_families")
    try:
        p = subprocess.run([sys.executable, str(ROOT / "tests/e2e/workers/simulated_gpu.py"),
                            str(Path(chat_fixture["hf_path"]).parent), str(out), url],
                           capture_output=True, text=True, timeout=1100, cwd=ROOT, env=_env())
        assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-5000:]
    finally:
        proc.kill()
    return out, json.loads((out / "results.json").read_text())


def _rows(run_dir: Path) -> list[dict]:
    return [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]


def _counted(rows: list[dict]) -> None:
    """Every step's row carries the simulated GPU's counts; the step synced and moved bytes both ways."""
    for r in rows:
        assert all(k in r for k in SIM), sorted(k for k in r if k.startswith("sim/"))
        assert r["sim/host_syncs"] > 0 and r["sim/d2h_bytes"] > 0 and r["sim/device_peak_gib"] > 0


def test_every_family_trains_on_the_simulated_gpu(families):
    out, res = families
    bad = {k: v["error"][-1500:] for k, v in res.items() if not v["ok"]}
    assert not bad, bad
    for kind, v in res.items():
        _counted(v["rows"])
        assert v["rows"][0]["rollout/logprob_gap"] < 1e-3, kind   # the start-up gate and the passes ran on it
    assert [r["step"] for r in res["grpo@async"]["rows"]] == [1, 2]
    assert res["grpo@async"]["rows"][1]["offpolicy/staleness_max"] == 1.0
    assert res["grpo@mu"]["rows"][0]["rollout/outside_support_frac"] >= 0.0   # the μ pass ran on it


def test_checkpoint_resume_and_export_on_the_simulated_gpu(families):
    out, res = families
    rows = res["grpo@ckpt"]["rows"]
    assert [r["step"] for r in rows] == [1, 2]          # step 2 came from --resume auto of the step-1 checkpoint
    run = out / "grpo@ckpt"
    assert (run / "checkpoints").is_dir() and any((run / "hf").glob("*.safetensors")), sorted(p.name for p in run.iterdir())
    report = json.loads((run / "simulated_gpu.json").read_text())
    assert report["totals"]["host_syncs"] > 0 and report["sites"]


def _cli(tmp_path: Path, fx: dict, kind: str, extra: list[str], nproc: int = 1) -> tuple[subprocess.CompletedProcess, Path]:
    sys.path.insert(0, str(ROOT / "tests/e2e/workers"))
    from chat_kinds import overrides

    run = tmp_path / "run"
    ov = [o.replace(f"trainer.run_dir={tmp_path / kind}", f"trainer.run_dir={run}")
          for o in overrides(kind, fx, tmp_path, "") if not o.startswith("trainer.steps=")]
    cfg = tmp_path / "base.yaml"
    cfg.write_text("trainer:\n  seed: 7\n")
    launch = [str(BIN / "torchrun"), "--standalone", f"--nproc-per-node={nproc}"] if nproc > 1 else [sys.executable]
    p = subprocess.run([*launch, "-m", "megatron_rl.cli", "train", "--config", str(cfg), "--simulate-gpu", *ov, *extra],
                       capture_output=True, text=True, timeout=900, cwd=ROOT, env=_env())
    return p, run


def test_tp2_by_dp2_on_the_simulated_gpu(chat_fixture, tmp_path):
    """Four ranks, TP = 2 x DP = 2, in one launch: Megatron's 2-rank tensor-parallel groups (vocab-parallel passes)
    and 2-rank data-parallel groups (the replica shares, the engine frame assembled over the DP group:
    NCCL-semantics, so staged through the device)."""
    p, run = _cli(tmp_path, chat_fixture, "grpo", ["parallel.tp=2", "trainer.steps=1"], nproc=4)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-5000:]
    rows = _rows(run)
    _counted(rows)
    assert rows[0]["data/held_frac"] < 1.0                 # each replica received its share only
    assert any("engine_frame" in s for s in json.loads((run / "simulated_gpu.json").read_text())["sites"])


def test_partial_rollouts_on_the_simulated_gpu(chat_fixture, tmp_path):
    p, run = _cli(tmp_path, chat_fixture, "grpo", ["rollout.engine=vllm-async", "rollout.partial.enable=true",
                                                    "rollout.partial.extra_groups=2", "trainer.steps=2"])
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-5000:]
    rows = _rows(run)
    assert [r["step"] for r in rows] == [1, 2]
    _counted(rows)
