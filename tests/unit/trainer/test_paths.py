"""The data-path registry: strict registration, start-up errors, every method's declared path, and
``plugins:`` kept in ``config.yaml`` (a method from outside the package trains in test_plugin_inputs.py)."""
from __future__ import annotations

import sys

import pytest

from megatron_rl import algorithms as A
from megatron_rl.config import load_config
from megatron_rl.trainer.loop.preflight import load_checked
from megatron_rl.trainer import paths as P
from megatron_rl.trainer.paths.plain import PlainPath


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
