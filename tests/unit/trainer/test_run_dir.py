"""A fresh run never mixes with an earlier run in the same ``trainer.run_dir`` (issue 10).

Reproduces: a fresh run in a used run_dir kept the old checkpoints (so ``--resume auto`` later
continued the other run). Now refused without ``--resume``; ``--overwrite`` archives the old run.
"""
from __future__ import annotations

import pytest

from megatron_rl.trainer.state.run_dir import archive_run, check_run_dir, used_by


def _old_run(d):
    (d / "checkpoints" / "step_10").mkdir(parents=True)
    (d / "checkpoints" / "step_10" / "COMPLETE").write_text('{"step": 10}')
    (d / "metrics.jsonl").write_text('{"step": 1}\n')
    (d / "data").mkdir()
    (d / "data" / "train.parquet").write_text("user data")
    return d


def test_fresh_run_in_used_dir_is_refused(tmp_path):
    check_run_dir(tmp_path / "new", None, False)             # unused: fine
    d = _old_run(tmp_path / "run")
    assert used_by(d) == ["checkpoints/step_10", "metrics.jsonl"]
    with pytest.raises(ValueError, match=r"already holds a run \(checkpoints/step_10, metrics.jsonl\): pass --resume auto"):
        check_run_dir(d, None, False)
    check_run_dir(d, "auto", False)                           # resuming is the point of a used dir
    with pytest.raises(ValueError, match="cannot be combined with --resume"):
        check_run_dir(d, "auto", True)


def test_overwrite_archives_the_whole_run_but_its_inputs(tmp_path):
    """Issue 31: every file the earlier run wrote moves -- optimizer_steps.jsonl (once missed by a list of
    names) and any file a later version writes -- while the new run's inputs stay."""
    from megatron_rl.config import load_config
    from megatron_rl.trainer.state.run_dir import config_inputs

    d = _old_run(tmp_path / "run")
    (d / "optimizer_steps.jsonl").write_text('{"step": 1, "optimizer_step": 1}\n')
    (d / "some_future_output.bin").write_bytes(b"x")
    (d / "config.yaml").write_text("trainer: {steps: 3}\n")
    cfg = load_config(None, [f"data.train={d / 'data' / 'train.parquet'}", f"trainer.run_dir={d}"])
    assert config_inputs(cfg, d) == [d / "data" / "train.parquet"]
    check_run_dir(d, None, True)
    dest = archive_run(d, keep=config_inputs(cfg, d))
    assert (dest / "checkpoints" / "step_10" / "COMPLETE").is_file() and (dest / "metrics.jsonl").is_file()
    assert (dest / "optimizer_steps.jsonl").read_text() == '{"step": 1, "optimizer_step": 1}\n'
    assert sorted(p.name for p in dest.iterdir()) == ["checkpoints", "config.yaml", "metrics.jsonl",
                                                      "optimizer_steps.jsonl", "some_future_output.bin"]
    assert dest.parent == d / "archive"
    assert used_by(d) == [] and (d / "data" / "train.parquet").read_text() == "user data"
    assert sorted(p.name for p in d.iterdir()) == ["archive", "data"]
    assert archive_run(d, keep=[d / "data"]) is None          # nothing left to move


def test_a_lone_optimizer_steps_log_marks_the_dir_used(tmp_path):
    (tmp_path / "optimizer_steps.jsonl").write_text('{"step": 1}\n')
    assert used_by(tmp_path) == ["optimizer_steps.jsonl"]
