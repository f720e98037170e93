"""A damaged checkpoint marked complete is skipped with a warning naming the bad file (issue 10).

Reproduces: a truncated ``.distcp`` / ``.metadata`` inside a ``COMPLETE`` checkpoint gave a
120-line traceback on ``--resume auto``. The manifest in ``COMPLETE`` (``ckpt_manifest.py``) now
finds it first; ``find_latest`` falls back to the previous complete checkpoint. The same check on
checkpoints written by the real trainer: ``tests/distributed/test_checkpoint.py``.
"""
from __future__ import annotations

import json
import logging

import pytest

from megatron_rl.trainer.state.checkpoint import _complete, find_latest
from megatron_rl.trainer.state.ckpt_manifest import build_manifest


def _ckpt(run, step, payload=b"x" * 1000):
    d = run / "checkpoints" / f"step_{step}"
    (d / "dist").mkdir(parents=True)
    (d / "dist" / "__0_0.distcp").write_bytes(payload)
    (d / "dist" / ".metadata").write_bytes(b"meta" * 50)
    (d / "extra_state.pt").write_bytes(b"extra")
    (d / "COMPLETE").write_text(json.dumps({"step": step, "files": build_manifest(d)}))
    return d


@pytest.mark.parametrize("victim,how", [("dist/__0_0.distcp", "truncate"), ("dist/.metadata", "truncate"),
                                        ("dist/__0_0.distcp", "flip"), ("extra_state.pt", "delete")])
def test_damaged_newest_checkpoint_falls_back_with_a_warning(tmp_path, caplog, victim, how):
    run = tmp_path / "run"
    _ckpt(run, 2)
    newest = _ckpt(run, 4)
    f = newest / victim
    if how == "truncate":
        f.write_bytes(f.read_bytes()[:-7])
    elif how == "flip":
        f.write_bytes(b"y" + f.read_bytes()[1:])
    else:
        f.unlink()
    with caplog.at_level(logging.WARNING, logger="megatron_rl.checkpoint"):
        assert find_latest(run) == run / "checkpoints" / "step_2"
    msg = " ".join(r.getMessage() for r in caplog.records)
    assert "skipping damaged checkpoint step_4" in msg and str(f) in msg
    caplog.clear()   # issue 31: the start-up checks and the resume both look; the warning prints once
    assert find_latest(run) == run / "checkpoints" / "step_2" and not caplog.records
    with pytest.raises(ValueError, match="is damaged: .*" + victim.split("/")[-1]):
        _complete(newest)                          # an explicit --resume PATH: one clear error


def test_intact_and_pre_manifest_checkpoints_are_trusted(tmp_path):
    run = tmp_path / "run"
    _ckpt(run, 1)
    old = run / "checkpoints" / "step_3"           # written before manifests existed: no "files"
    (old / "dist").mkdir(parents=True)
    (old / "COMPLETE").write_text(json.dumps({"step": 3}))
    assert find_latest(run) == old
    assert _complete(run / "checkpoints" / "step_1")[1]["step"] == 1
