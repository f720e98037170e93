"""Checkpoint save at step 2 / resume (torchrun, gloo): the continuation reproduces the
uninterrupted run's losses exactly at the same layout (TP=2) and, after resharding TP=2 -> TP=1 and
TP=2 -> PP=2, within what the reordered fp32 reductions allow (the weights load exactly; the new layout
sums in another order: ``tests/helpers/fp32_tolerance.py``, 2·κ·passes·Σγ̃_k over the tiny model's forward,
backward and token-sum reductions, κ = Σ|terms| / |loss| measured before the step, passes = steps since the load); half-written checkpoints are ignored; keep_last prunes; a disk that
fills up during a save (a real small tmpfs) costs one line and nothing else.
Every case builds its own actor (megatron groups rebuilt per case); the 2-process cases share one
launch, the 1-process one has its own.
"""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from tests.helpers.dist import torchrun
from tests.helpers.fp32_tolerance import cond, reorder_rtol, tiny_qwen3_path
from tests.helpers.tmpfs import mount_tmpfs, umount

WORKERS = Path(__file__).parent / "workers"
SEQ = 16                     #: ``fixed_batch``'s sequence length (``tests/helpers/actor_common.SEQ``)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    from tests.helpers.actor_common import make_tiny_hf

    d = tmp_path_factory.mktemp("ckpt")
    hf = make_tiny_hf(d / "hf")
    run = d / "run"
    (run / "checkpoints" / ".tmp-step_0" / "dist").mkdir(parents=True)     # stale: crashed earlier save
    # one launch per world size (each costs the torch + megatron imports per rank), cases in order:
    # full run; simulated crashes (a half-written newer save and a renamed dir without its COMPLETE
    # marker); resume at the same layout and at PP=2; a checkpoint before the first optimizer step
    # (its own run dir); then the TP=1 resume in one process
    torchrun(WORKERS / "actor_checkpoint.py", hf, d, f"full:full:{run}:2:1", f"crash:crash:{run}:0:0",
             f"same:resume:{run}:2:1", f"pp2:resume:{run}:1:2", f"fresh:fresh:{d / 'fresh_run'}:2:1",
             "stop:stop:-:0:0",
             nproc=2, timeout=900)
    # + the full-disk case on a small tmpfs (2 checkpoints of the tiny model do not fit in 6 MiB)
    small = d / "small"
    no_mount = mount_tmpfs(small, "6m")
    try:
        torchrun(WORKERS / "actor_checkpoint.py", hf, d, f"tp1:resume:{run}:1:1",
                 *([] if no_mount else [f"disk:diskfull:{small / 'run'}:1:1"]), nproc=1, timeout=300)
    finally:
        if not no_mount:
            umount(small)
    out = {k: json.loads((d / f"{k}.json").read_text()) for k in ("full", "same", "tp1", "pp2", "fresh")}
    out["disk"] = no_mount or json.loads((d / "disk.json").read_text())
    out["stop"] = json.loads((d / "stop.json").read_text())["ranks"]
    out["listing_after_full"] = json.loads((d / "crash.json").read_text())["listing"]
    out["run_dir"], out["hf"], out["dir"] = run, hf, d
    out["_hf"] = json.loads((hf / "config.json").read_text())
    return out


def test_keep_last_and_stale_tmp_removed(runs):
    assert runs["listing_after_full"] == ["step_1", "step_2"]


def test_disk_filled_during_a_checkpoint(runs):
    """A real ENOSPC in the middle of the step-2 save of the tiny model (a filler took the tmpfs'
    last bytes the moment the temp dir appeared): one line naming the path, no temp dir left, step_1
    intact and still the one to resume from; the next save meets the free-space check and starts nothing."""
    r = runs["disk"]
    if isinstance(r, str):
        pytest.skip(r)
    assert r["mid_write"].startswith("disk full while writing checkpoint step_2 in ") and "\n" not in r["mid_write"]
    assert "checkpoints" in r["mid_write"] and "the partial checkpoint was removed" in r["mid_write"]
    assert r["after_mid_write"] == ["step_1"] and r["latest"] == "step_1" and r["step1_manifest_same"]
    assert r["precheck"].startswith("not enough free space for checkpoint step_3 in ") and "\n" not in r["precheck"]
    m = re.search(r"checkpoints: needs (\d+) bytes \(.*\), (\d+) bytes \(.*\) free; nothing was written", r["precheck"])
    assert m and int(m.group(1)) > int(m.group(2)), r["precheck"]
    assert r["after_precheck"] == ["step_1"]
    assert r["export"].startswith("not enough free space for the HF export hf in ") and "\n" not in r["export"]
    assert r["after_export"] == ["checkpoints"]


def test_graceful_stop_is_agreed_by_every_rank(runs):
    """SIGTERM reaches rank 1 only (a real signal): at the next step boundary both ranks stop on it."""
    assert runs["stop"] == [[0, 15, 0], [0, 15, 15]]


def test_resume_same_layout_is_bit_identical(runs):
    full = {s["step"]: s for s in runs["full"]["steps"]}
    assert runs["same"]["rng_restored"] is True
    for s in runs["same"]["steps"]:
        ref = full[s["step"]]
        assert s["loss"] == ref["loss"] and s["grad_norm"] == ref["grad_norm"], (s, ref)
        assert s["lr"] == ref["lr"] and s["rng"] == ref["rng"]


@pytest.mark.parametrize("layout", ["tp1", "pp2"])
def test_resume_resharded(runs, layout):
    """TP=2 checkpoint loaded at TP=1 (1 process) and at PP=2 (2 processes)."""
    full = {s["step"]: s for s in runs["full"]["steps"]}
    assert runs[layout]["rng_restored"] is False         # layout changed: RNG deliberately skipped
    for passes, s in enumerate(runs[layout]["steps"], start=1):
        ref = full[s["step"]]
        tol = reorder_rtol(tiny_qwen3_path(runs["_hf"], SEQ, ref["tokens"], ref["params"]), cond(ref["loss_abs"], ref["loss"]), passes)
        print(f"{layout} step {s['step']}: loss rel. difference {abs(s['loss'] - ref['loss']) / abs(ref['loss']):.2e}, grad norm "
              f"{abs(s['grad_norm'] - ref['grad_norm']) / ref['grad_norm']:.2e}, bound {tol:.2e}; "
              f"one token's share {ref['loss_abs'] / ref['tokens'] / abs(ref['loss']):.2e}")
        assert tol * abs(ref["loss"]) < ref["loss_abs"] / (2 * ref["tokens"]), (ref, tol)    # keeps its power
        assert abs(s["loss"] - ref["loss"]) <= tol * abs(ref["loss"]), (s, ref, tol)
        assert abs(s["grad_norm"] - ref["grad_norm"]) <= tol * ref["grad_norm"], (s, ref, tol)
        assert s["lr"] == ref["lr"]


def test_checkpoint_before_the_first_optimizer_step(runs):
    """Saving with no optimizer state yet leaves every weight alone and the next steps unchanged."""
    fresh = runs["fresh"]["steps"]
    full = runs["full"]["steps"][:2]
    for a, b in zip(fresh, full):
        assert (a["loss"], a["grad_norm"]) == (b["loss"], b["grad_norm"]), (a, b)


@pytest.mark.parametrize("victim", [".metadata", ".distcp"])
def test_damaged_real_checkpoint_falls_back(runs, tmp_path, victim, caplog):
    """A real save's COMPLETE carries the file manifest; truncating one of its files makes
    ``find_latest`` skip it (warning naming the file) for the previous complete checkpoint."""
    import logging
    import shutil

    from megatron_rl.trainer.state.checkpoint import find_latest

    src = Path(runs["run_dir"]) / "checkpoints"
    steps = sorted((p for p in src.iterdir() if p.name.startswith("step_") and (p / "COMPLETE").is_file()),
                   key=lambda p: int(p.name[5:]))
    assert len(steps) >= 2
    run = tmp_path / "run"
    for p in steps[-2:]:
        shutil.copytree(p, run / "checkpoints" / p.name)
    newest = run / "checkpoints" / steps[-1].name
    assert json.loads((newest / "COMPLETE").read_text())["files"]
    bad = next(p for p in sorted((newest / "dist").iterdir()) if p.name.endswith(victim))
    bad.write_bytes(bad.read_bytes()[: bad.stat().st_size // 2])
    with caplog.at_level(logging.WARNING, logger="megatron_rl.checkpoint"):
        assert find_latest(run) == run / "checkpoints" / steps[-2].name
    assert str(bad) in caplog.text


def test_training_checkpoint_exports_bit_identical(runs, tmp_path):
    """``convert mcore-to-hf`` straight from training checkpoints (TP=2, distributed optimizer; the
    optimizer's keys next to the model's): the step-0 one (saved before any update) gives back the
    source HF files bit for bit (dtype, shape, bytes per tensor); the trained step-2 one equals the
    live ``export_hf`` of the restored model at TP=2, TP=1 and PP=2 bit for bit."""
    from megatron_rl.convert.checkpoints import mcore_to_hf
    from megatron_rl.convert.safetensors_index import diff_tensors

    d, hf = runs["dir"], runs["hf"]
    fresh = mcore_to_hf(d / "fresh_run" / "checkpoints" / "step_0", tmp_path / "fresh", hf_config=str(hf))
    n, bad = diff_tensors(hf, fresh)
    assert n > 10 and bad == [], bad
    step2 = mcore_to_hf(Path(runs["run_dir"]) / "checkpoints" / "step_2", tmp_path / "step2", hf_config=str(hf))
    for live in ("same", "tp1", "pp2"):
        n, bad = diff_tensors(d / f"{live}_hf", step2)
        assert n > 10 and bad == [], (live, bad)
    n, bad = diff_tensors(hf, step2)
    assert bad, "training changed the weights: the comparison can tell"
