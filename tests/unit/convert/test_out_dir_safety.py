"""``convert --out`` never deletes what megatron-rl did not write (both directions, --force or not).

Reproduces the data loss of issue 10: a non-empty ``--out`` that is not a checkpoint (user files)
was deleted and replaced, exit 0. Now: refused with one line, files intact; ``--force`` replaces only
a checkpoint of ours that holds nothing foreign; an empty dir is written into.
"""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "megatron_rl.cli", "convert", *map(str, args)], capture_output=True,
                          text=True, timeout=300, cwd=REPO, check=False)


def _user_dir(path: Path) -> Path:
    path.mkdir()
    (path / "notes.txt").write_text("my thesis")
    (path / "sub").mkdir()
    (path / "sub" / "data.csv").write_text("1,2")
    return path


def _intact(path: Path) -> bool:
    return (path / "notes.txt").read_text() == "my thesis" and (path / "sub" / "data.csv").read_text() == "1,2"


def test_hf_to_mcore_never_deletes_user_files(hf_dir, tmp_path):
    from megatron_rl.convert.stream import hf_to_mcore_streaming as convert

    user = _user_dir(tmp_path / "user")
    p = _cli("hf-to-mcore", "--hf", hf_dir, "--out", user, "--force")   # the CLI: one line, exit 2
    assert p.returncode == 2 and "is not a checkpoint written by megatron-rl; refusing to touch it" in p.stderr
    assert len(p.stderr.strip().splitlines()) == 1 and _intact(user)
    assert not (tmp_path / "user.convert.log").exists()      # refused before any record: no log file either
    with pytest.raises(FileExistsError, match="refusing to touch it"):
        convert(hf_dir, user)
    # the source HF dir itself (an HF checkpoint, but not ours) is refused too
    with pytest.raises(FileExistsError, match="not a checkpoint written by megatron-rl"):
        convert(hf_dir, hf_dir, force=True)
    assert (hf_dir / "model.safetensors").is_file()
    # an empty dir is fine; our checkpoint is replaced only with --force
    empty = tmp_path / "empty"
    empty.mkdir()
    assert convert(hf_dir, empty) == empty and (empty / "COMPLETE").is_file()
    with pytest.raises(FileExistsError, match="pass --force"):
        convert(hf_dir, empty)
    (empty / "mine.txt").write_text("keep")      # our checkpoint + a user file: refused even with --force
    with pytest.raises(FileExistsError, match=r"plus other files \(mine.txt\)"):
        convert(hf_dir, empty, force=True)
    assert (empty / "mine.txt").is_file()
    (empty / "mine.txt").unlink()
    assert convert(hf_dir, empty, force=True) == empty
    assert not list(tmp_path.glob(".tmp-*")) and not list(tmp_path.glob(".old-*"))


def test_mcore_to_hf_never_deletes_user_files(hf_dir, tmp_path):
    from megatron_rl.convert.checkpoints import mcore_to_hf
    from megatron_rl.convert.stream import hf_to_mcore_streaming

    ckpt = hf_to_mcore_streaming(hf_dir, tmp_path / "mc")
    user = _user_dir(tmp_path / "user")
    for force in (False, True):   # refused before any model is built
        with pytest.raises(FileExistsError, match="refusing to touch it"):
            mcore_to_hf(ckpt, user, force=force)
        with pytest.raises(FileExistsError, match="not a checkpoint written by megatron-rl"):
            mcore_to_hf(ckpt, hf_dir, force=force)
    assert _intact(user)
    out = tmp_path / "export"
    assert _cli("mcore-to-hf", "--ckpt", ckpt, "--out", out).returncode == 0
    assert (out / "megatron_rl_export.json").is_file()
    with pytest.raises(FileExistsError, match="pass --force"):
        mcore_to_hf(ckpt, out)
    p = _cli("mcore-to-hf", "--ckpt", ckpt, "--out", out, "--force", "--verbose")   # --verbose: INFO on the console
    assert p.returncode == 0 and "INFO megatron_rl.convert: exported" in p.stderr, p.stderr
    assert not list(tmp_path.glob(".tmp-*")) and not list(tmp_path.glob(".old-*"))


def test_atomic_dir_cleanup_deletes_only_its_temp_dir(tmp_path):
    from megatron_rl.convert.atomic import atomic_dir

    user = _user_dir(tmp_path / "user")
    with pytest.raises(FileExistsError, match="refusing to touch it"), atomic_dir(user, force=True):
        pass
    assert _intact(user)
    with pytest.raises(RuntimeError), atomic_dir(tmp_path / "new") as tmp:
        (tmp / "x").write_text("half")
        raise RuntimeError("boom")
    assert not (tmp_path / "new").exists() and not list(tmp_path.glob(".tmp-*")) and _intact(user)
