"""A fresh run never mixes with an earlier run in the same ``trainer.run_dir`` (issue 10).

Reproduces: a fresh run in a used run_dir kept the old checkpoints (so ``--resume auto`` later
continued the other run). Now refused without ``--resume``; ``--overwrite`` archives the old run.
"""
from __future__ import annotations

import pytest

from megatron_rl.trainer.run_dir import archive_run, check_run_dir, used_by


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


def test_overwrite_archives_only_run_artifacts(tmp_path):
    d = _old_run(tmp_path / "run")
    check_run_dir(d, None, True)
    dest = archive_run(d)
    assert (dest / "checkpoints" / "step_10" / "COMPLETE").is_file() and (dest / "metrics.jsonl").is_file()
    assert dest.parent == d / "archive"
    assert used_by(d) == [] and (d / "data" / "train.parquet").read_text() == "user data"
    assert archive_run(d) is None                             # nothing left to move
