"""Checkpoint directory rules that need no distributed run: find_latest and pruning, stale temp
dirs removed at start-up, the free-space check's message (on a real small tmpfs), plus the upstream
symbols the dist-optimizer load patch wraps."""
from __future__ import annotations

import inspect
import logging

import pytest

from megatron_rl.runtime.diskspace import DiskSpaceError, check_free, free_bytes, is_disk_full
from megatron_rl.trainer.state.checkpoint import (
    _prune,
    checkpoints_dir,
    find_latest,
    remove_stale_tmp,
)
from tests.helpers.tmpfs import small_tmpfs


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


def test_stale_tmp_dirs_are_removed_with_one_line(tmp_path, caplog):
    root = checkpoints_dir(tmp_path)
    _mk(root, "step_2")
    _mk(root, ".tmp-step_3", complete=False)       # a save killed half-way
    (root / ".tmp-step_3" / "dist" / "0_0.distcp").write_bytes(b"x" * 1000)
    _mk(root, ".tmp-step_5", complete=False)
    (tmp_path / ".tmp-step_9").mkdir()             # not under checkpoints/: not ours to remove
    (root / "notes.tmp-step_1").write_text("keep")
    with caplog.at_level(logging.WARNING, logger="megatron_rl.checkpoint"):
        removed = remove_stale_tmp(tmp_path)
    assert [p.name for p in removed] == [".tmp-step_3", ".tmp-step_5"]
    assert sorted(p.name for p in root.iterdir()) == ["notes.tmp-step_1", "step_2"]
    assert (tmp_path / ".tmp-step_9").is_dir() and find_latest(tmp_path).name == "step_2"
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1 and "removed 2 unfinished checkpoint dir(s)" in lines[0] and ".tmp-step_3" in lines[0]
    assert remove_stale_tmp(tmp_path) == [] and remove_stale_tmp(tmp_path / "nothing_here") == []


def test_free_space_check_on_a_small_tmpfs(tmp_path):
    with small_tmpfs(tmp_path / "mnt", "1m") as mnt:
        free = free_bytes(mnt / "run" / "checkpoints")        # not created yet: its file system is asked
        assert 0 < free <= 1 << 20
        check_free(mnt, free // 2, "checkpoint step_2")      # fits: nothing raised
        with pytest.raises(DiskSpaceError) as e:
            check_free(mnt / "run" / "checkpoints", 3 << 20, "checkpoint step_4")
        msg = str(e.value)
        assert "\n" not in msg and f"in {mnt / 'run' / 'checkpoints'}:" in msg
        assert f"needs {3 << 20} bytes (3.0 MiB), {free} bytes" in msg and "nothing was written" in msg
        assert list(mnt.iterdir()) == []
        # a write that runs into ENOSPC is recognized as a full disk (the errno, or the nearly empty fs)
        with pytest.raises(OSError) as full, open(mnt / "big", "wb") as f:
            f.write(b"\0" * (2 << 20))
            f.flush()
        assert is_disk_full(full.value, mnt)
        assert is_disk_full(RuntimeError("[enforce fail at inline_container.cc] file write failed"), mnt)
        assert not is_disk_full(ValueError("bad config"), mnt)


def test_distopt_patch_targets_exist():
    from megatron.core.optimizer.distrib_optimizer import DistributedOptimizer as D

    assert list(inspect.signature(D._set_main_param_and_optimizer_states).parameters) == ["self", "model_param", "tensors"]
    assert list(inspect.signature(D.load_state_dict).parameters) == ["self", "state_dict"]
    assert hasattr(D, "_get_main_param_and_optimizer_states") and hasattr(D, "_init_optimizer_states_with_dummy_values")
