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
from megatron_rl.config import load_config
from megatron_rl.trainer.loop.preflight import load_checked
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
        def sampled(self, data, step):
            return None

    with pytest.raises(TypeError, match=r"data path 'half' .* is incomplete: implement \['collect'\]"):
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
    """The plugin command of docs/contributing.md ("Adding a method"), with a few more overrides.
    A method from outside the package trains through the real CLI: ``megatron-rl train ...
    plugins=[toy_method]`` with tests/unit/workers/ on ``PYTHONPATH`` (as a user's module) imports
    toy_method.py, which registers advantage + loss + kind (+ ToyHParams), before ``algo.kind=toy`` is
    validated; 2 real steps follow. Its functions ran in the training process, its config key arrived,
    its loss metric was logged and ``run_dir/config.yaml`` keeps the key (a resume imports it again).
    The run uses the HF ``generate`` engine (the fallback) through Ray: the suite's loop run on that
    engine (tests/e2e/test_quickstart.py runs vLLM), colocated (``rollout.placement``) with
    ``trainer.offload=all`` (two-stage offload, a checkpoint between parked stages), and the end-of-run
    HF export between parked stages (issue 31: the export left the weights' storage unresizable, so the
    offload after it failed)."""
    import yaml

    from megatron_rl.cli.demo import prepare

    paths, _, hf = prepare(tmp_path / "assets", seed=0)
    run_dir, result = tmp_path / "run", tmp_path / "toy_result.json"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "tests/unit/workers")]),
           "RAY_AUTH_MODE": "disabled", "WANDB_MODE": "offline", "TOY_METHOD_RESULT": str(result)}
    p = subprocess.run([sys.executable, "-m", "megatron_rl.cli", "train", "--config", "examples/configs/tiny_cpu_grpo.yaml",
                        "plugins=[toy_method]", "algo.kind=toy", "algo.toy.baseline_scale=0.5",
                        f"model.hf_path={hf}", f"data.train={paths['train']}", "data.val=", f"trainer.run_dir={run_dir}",
                        "trainer.steps=2", "trainer.ckpt_every=0", "data.prompts_per_step=4",
                        "rollout.n=4", "rollout.engine=hf", "trainer.micro_batch_size=8", "logging.progress=false",
                        "logging.wandb_mode=disabled", "rollout.placement=colocated", "trainer.offload=all"],
                       capture_output=True, text=True, timeout=300, cwd=ROOT, env=env, check=False)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-4000:]
    res = json.loads(result.read_text())
    assert res["advantage_calls"] == 2 and res["loss_calls"] >= 2 and res["hparams"]["baseline_scale"] == 0.5
    assert yaml.safe_load((run_dir / "config.yaml").read_text())["plugins"] == ["toy_method"]
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2]
    assert all("toy/adv_mean" in r and r["actor/loss"] == r["actor/loss"] for r in rows)
    # colocated: one engine sleep per step, and step 2 generated after a level-2 sleep, which the HF
    # engine refuses unless the push restored every weight (trainer/loop/colocate.py's order)
    assert [r["rollout/sleeps"] for r in rows] == [1.0, 2.0]
    assert (run_dir / "checkpoints" / "step_2" / "COMPLETE").is_file()   # saved between the parked stages
    # exported between parked stages too (the run ends with its summary, exit 0 above): the safetensors
    # library reads every tensor of the initial policy back, same shapes and dtypes, finite
    import torch
    from safetensors.torch import load_file

    exported = load_file(str(run_dir / "hf" / "model.safetensors"))
    initial = load_file(str(hf / "model.safetensors"))
    assert exported.keys() == initial.keys() and "hf_export" not in p.stderr
    assert all(exported[k].shape == initial[k].shape and exported[k].dtype == initial[k].dtype
               and torch.isfinite(exported[k].float()).all() for k in exported)
    assert (run_dir / "hf" / "config.json").is_file() and "Trying to resize" not in p.stderr


def test_plugins_are_kept_in_config_yaml_and_imported_again_on_load(tmp_path, monkeypatch):
    """``run_dir/config.yaml`` keeps ``plugins:``, and loading that file (``--config run_dir/config.yaml``;
    what a resume compares) imports the module again in a process that has not imported it yet."""
    from megatron_rl.trainer.state.run_config import save_run_config

    (tmp_path / "mods").mkdir()
    (tmp_path / "mods" / "mrl_probe_plugin.py").write_text("LOADED = True\n")
    monkeypatch.syspath_prepend(str(tmp_path / "mods"))       # the user's PYTHONPATH
    save_run_config(load_config(None, ["plugins=[mrl_probe_plugin]", f"trainer.run_dir={tmp_path / 'run'}"]))
    monkeypatch.delitem(sys.modules, "mrl_probe_plugin")      # as in a new process
    again = load_config(tmp_path / "run" / "config.yaml")
    assert again.plugins == ("mrl_probe_plugin",) and sys.modules["mrl_probe_plugin"].LOADED
    assert "plugins" not in load_config(None).to_dict()       # unset: earlier runs' config.yaml shape
