"""The data-path registry: strict registration, start-up errors, every method's declared path, and a
toy method added by one registration plus its config dataclass, trained end to end."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from megatron_rl import algorithms as A
from megatron_rl.preflight import load_checked
from megatron_rl.trainer import paths as P
from megatron_rl.trainer.paths.sampling import PlainPath

ROOT = Path(__file__).resolve().parents[3]


def test_builtin_paths_and_every_method_declares_one():
    assert P.path_names() == ["bicc_context", "greedy", "gt_teacher", "plain", "process_reward", "rlcsd_hints",
                              "two_attempts"]
    declared = {k: P.path_class(k).name for k in A.ALGO_KINDS}
    assert declared["remax"] == "greedy" and declared["score"] == "two_attempts" and declared["papo"] == "process_reward"
    assert declared["bicc_rcc"] == "bicc_context" and declared["srpo"] == "gt_teacher" and declared["rlcsd"] == "rlcsd_hints"
    assert declared["grpo"] == declared["dapo"] == "plain"


def test_unknown_path_lists_the_valid_ones():
    with pytest.raises(ValueError, match=r"unknown data path 'nope'; valid: \['bicc_context', 'greedy', "):
        P.get_path("nope")


def test_registering_a_path_twice_raises():
    with pytest.raises(ValueError, match="data path 'plain' is already registered"):
        P.register_path("plain")(type("Again", (PlainPath,), {}))


def test_incomplete_path_is_refused_at_registration():
    class Half(P.DataPath):
        def collect(self, step):
            return None

    with pytest.raises(TypeError, match=r"data path 'half' .* is incomplete: implement \['update'\]"):
        P.register_path("half")(Half)
    assert "half" not in P.path_names()


def test_method_on_an_unknown_path_fails_at_config_load(monkeypatch):
    monkeypatch.setitem(A.ALGO_KINDS, "grpo", A.ALGO_KINDS["grpo"]._replace(path="warp"))
    with pytest.raises(ValueError, match="algo.kind='grpo' declares data path 'warp', which is not registered"):
        load_checked(None, ["algo.kind=grpo"])


def test_path_checks_the_methods_hparams_class(monkeypatch):
    """A method declaring the teacher path with hparams that carry no teacher knobs fails at load."""
    monkeypatch.setitem(A.ALGO_KINDS, "grpo", A.ALGO_KINDS["grpo"]._replace(path="gt_teacher"))
    with pytest.raises(ValueError, match="'gt_teacher' data path needs hparams deriving from TeacherHParams"):
        load_checked(None, ["algo.kind=grpo"])


def test_register_algo_kind_is_strict():
    with pytest.raises(ValueError, match="algo kind 'grpo' is already registered"):
        A.register_algo_kind("grpo", "grpo", "ppo_clip", A.GRPOHParams)
    with pytest.raises(KeyError, match="unknown advantage 'nope'"):
        A.register_algo_kind("toy_x", "nope", "ppo_clip", A.GRPOHParams)
    with pytest.raises(TypeError, match="hparams must be a PPOHParams dataclass"):
        A.register_algo_kind("toy_x", "grpo", "ppo_clip", dict)
    assert "toy_x" not in A.ALGO_KINDS


def test_toy_method_trains_end_to_end(tmp_path):
    """tests/unit/workers/toy_method.py registers advantage + loss + kind (+ ToyHParams) and trains 2
    real steps; its functions ran, its config key arrived, and its loss metric was logged. The run
    uses the HF ``generate`` engine (the fallback) through Ray: the suite's loop run on that engine
    (the CLI path is run by tests/e2e/test_quickstart.py, on vLLM), colocated (``rollout.placement``) with ``trainer.offload=all`` (two-stage offload, a checkpoint
    between parked stages)."""
    run_dir = tmp_path / "run"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "RAY_AUTH_MODE": "disabled", "WANDB_MODE": "offline"}
    p = subprocess.run([sys.executable, str(ROOT / "tests/unit/workers/toy_method.py"), str(tmp_path / "assets"),
                        str(run_dir)], capture_output=True, text=True, timeout=300, cwd=ROOT, env=env, check=False)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-4000:]
    res = json.loads((run_dir / "toy_result.json").read_text())
    assert res["advantage_calls"] == 2 and res["loss_calls"] >= 2 and res["hparams"]["baseline_scale"] == 0.5
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2]
    assert all("toy/adv_mean" in r and r["actor/loss"] == r["actor/loss"] for r in rows)
    # colocated: one engine sleep per step, and step 2 generated after a level-2 sleep, which the HF
    # engine refuses unless the push restored every weight (trainer/colocate.py's order)
    assert [r["rollout/sleeps"] for r in rows] == [1.0, 2.0]
    assert (run_dir / "checkpoints" / "step_2" / "COMPLETE").is_file()   # saved between the parked stages
