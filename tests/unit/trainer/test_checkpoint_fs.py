"""Checkpoint directory rules that need no distributed run: find_latest and pruning,
plus the upstream symbols the dist-optimizer load patch wraps."""
from __future__ import annotations

import inspect

from megatron_rl.trainer.checkpoint import _prune, checkpoints_dir, find_latest


def _mk(root, name, complete=True):
    d = root / name
    (d / "dist").mkdir(parents=True)
    if complete:
        (d / "COMPLETE").write_text("{}")


def test_find_latest_ignores_half_written(tmp_path):
    assert find_latest(tmp_path) is None
    root = checkpoints_dir(tmp_path)
    _mk(root, "step_2")
    _mk(root, "step_10")
    _mk(root, "step_12", complete=False)      # renamed but marker missing
    _mk(root, ".tmp-step_14")                 # never renamed
    _mk(root, "step_x")                       # not a step directory
    assert find_latest(tmp_path).name == "step_10"


def test_prune_keeps_last_complete(tmp_path):
    root = checkpoints_dir(tmp_path)
    for s in (1, 2, 3, 4):
        _mk(root, f"step_{s}")
    _mk(root, "step_9", complete=False)
    _prune(root, keep_last=2)
    assert sorted(p.name for p in root.iterdir()) == ["step_3", "step_4", "step_9"]


def test_distopt_patch_targets_exist():
    from megatron.core.optimizer.distrib_optimizer import DistributedOptimizer as D

    assert list(inspect.signature(D._set_main_param_and_optimizer_states).parameters) == ["self", "model_param", "tensors"]
    assert list(inspect.signature(D.load_state_dict).parameters) == ["self", "state_dict"]
    assert hasattr(D, "_get_main_param_and_optimizer_states") and hasattr(D, "_init_optimizer_states_with_dummy_values")
