"""Exact resume (with PPO mini-batches; the synchronous GRPO and RLCSD runs with packed token-budget
micro-batches, the asynchronous one padded): a graceful stop (SIGTERM in the middle of step 3 — a reward equal to the config's
pauses there, so the timing is certain —: the run finishes the step, checkpoints it, prints one line
and exits 143) or a SIGKILL right after a checkpoint, then a SIGKILL
mid-step; ``--resume auto`` must reproduce the uninterrupted run's metrics.jsonl (losses, rewards,
grad norms) bit for bit on CPU. A half-written checkpoint (no COMPLETE marker) is ignored and a
stale ``.tmp-step_*`` dir is removed at the next start with one line.

The interrupted runs are ``megatron-rl train`` processes (each kill is a real SIGKILL of the process
group). The uninterrupted reference runs of all tests share one process and engine pool (``refs``),
so a match also shows that a run does not depend on what its process or engines ran before.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.helpers.demo import demo_runs, warm_overrides

KEYS = ("reward/mean", "reward/acc", "actor/loss", "actor/grad_norm", "actor/entropy", "rollout/logprob_gap",
        "adv/mean_abs")
STEPS = 6


@pytest.fixture(scope="module")
def warm(plain_warm) -> Path:
    """The session's warm-started tiny policy + task data (``plain_warm``, tests/conftest.py)."""
    return plain_warm


MB = "trainer.mini_batch_prompts=8"   # 32 prompts per step: 4 PPO mini-batches, one optimizer step each
PACK = ("trainer.micro_batch_size=null", "trainer.max_tokens_per_micro_batch=256")   # packed token-budget micro-batches
REFS = {   # the uninterrupted runs: name -> (config, extra overrides); the asynchronous one last
    "grpo": ("tiny_cpu_grpo", (MB, *PACK, "logging.tensorboard=true")),   # + TensorBoard event files
    "rlcsd_teacher": ("tiny_cpu_rlcsd", ("algo.rlcsd.teacher_sync_interval=3", MB, *PACK)),
    "grpo_async": ("tiny_cpu_grpo", ("rollout.max_staleness=1", MB)),
}
OPT_KEYS = ("actor/loss", "actor/grad_norm", "actor/pg_clipfrac", "actor/lr")


@pytest.fixture(scope="module")
def refs(warm, tmp_path_factory) -> dict[str, list[dict]]:
    """Every test's uninterrupted reference run, in ONE process with one engine pool
    (``tests/helpers/demo.py``: ``loop.run`` on the same config and overrides as the ``megatron-rl
    train`` command line of the interrupted runs); name -> its metrics rows."""
    out = tmp_path_factory.mktemp("refs")
    runs = []
    for name, (config, extra) in REFS.items():
        runs.append({"name": name, "config": f"examples/configs/{config}.yaml",
                     "overrides": _overrides(warm, out / name, extra),
                     "own_client": name.endswith("_async")})
    res = demo_runs(out, runs, timeout=1800)
    for name, r in res.items():
        assert r["ok"], f"reference run {name} failed:\n{r['error']}"
    return {name: (_rows(out / name), out / name) for name in REFS}


def _overrides(warm: Path, run_dir: Path, extra: tuple = ()) -> list[str]:
    return warm_overrides(warm, run_dir, f"trainer.steps={STEPS}", "trainer.keep_last=5", *extra)


def _cmd(warm: Path, run_dir: Path, resume: bool, config: str = "tiny_cpu_grpo", extra: tuple = ()) -> list[str]:
    cmd = [sys.executable, "-m", "megatron_rl.cli", "train", "--config", f"examples/configs/{config}.yaml",
           *_overrides(warm, run_dir, extra)]
    return cmd + (["--resume", "auto"] if resume else [])


def _run(cmd, env: dict | None = None, **kw):
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True,
                            cwd=Path(__file__).resolve().parents[2], env={**os.environ, "OMP_NUM_THREADS": "2", **(env or {})},
                            **kw)


def _kill_when(proc, cond, timeout=300):
    t0 = time.time()
    while not cond():
        assert proc.poll() is None, f"run ended before the kill point:\n{proc.stdout.read()[-3000:]}"
        assert time.time() - t0 < timeout, "kill point never reached"
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def _rows(run_dir: Path, name: str = "metrics.jsonl") -> list[dict]:
    p = run_dir / name
    return [json.loads(x) for x in p.read_text().splitlines()] if p.exists() else []


def _same_optimizer_steps(ref_dir: Path, run_dir: Path, keys=OPT_KEYS) -> None:
    """Every optimizer step (``optimizer_steps.jsonl``: 4 PPO mini-batches per RL step) equal, in order."""
    a, b = _rows(ref_dir, "optimizer_steps.jsonl"), _rows(run_dir, "optimizer_steps.jsonl")
    assert [(r["step"], r["mini_batch"]) for r in b] == [(r["step"], r["mini_batch"]) for r in a] and len(a) >= STEPS
    for x, y in zip(a, b):
        for k in keys:
            assert x.get(k) == y.get(k), f"step {x['step']} mini-batch {x['mini_batch']} {k}: {x.get(k)!r} != {y.get(k)!r}"


def _finish(proc) -> None:
    out, _ = proc.communicate(timeout=600)
    assert proc.returncode == 0, out[-4000:]


@pytest.mark.slow
def test_resume_after_sigterm_and_sigkill_is_bit_identical(warm, refs, tmp_path):
    ref, ref_dir = refs["grpo"]
    _sigkill_resume(warm, tmp_path, ref, REFS["grpo"][1], first="sigterm")
    assert all(r["actor/optimizer_steps"] == 4.0 for r in ref)
    opt = _rows(ref_dir, "optimizer_steps.jsonl")
    assert all(r["actor/pg_clipfrac"] == 0.0 for r in opt if r["mini_batch"] == 0)   # on-policy: ratio 1
    assert len({r["actor/lr"] for r in opt if r["step"] == 2}) == 1                  # the LR schedule counts RL steps
    _same_optimizer_steps(ref_dir, tmp_path / "run")
    _tensorboard_continues(tmp_path / "run")


def _tensorboard_continues(run_dir: Path) -> None:
    """``logging.tensorboard``: the interrupted-and-resumed run's event files, read with TensorBoard's own
    reader, hold every metrics.jsonl value once per step (steps 1..STEPS, none twice although three
    processes wrote them), as float32."""
    import numpy as np
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    assert len(list((run_dir / "tensorboard").glob("events.out.tfevents.*"))) == 3   # one per process
    acc = EventAccumulator(str(run_dir / "tensorboard"), size_guidance={"scalars": 0})
    acc.Reload()
    rows = _rows(run_dir)
    for key in KEYS:
        got = [(e.step, e.value) for e in acc.Scalars(key)]
        assert got == [(r["step"], float(np.float32(r[key]))) for r in rows], (key, got)


@pytest.mark.slow
def test_async_resume_after_sigkill_is_bit_identical(warm, refs, tmp_path):
    """``rollout.max_staleness=1``: the kill lands while the producer is generating a batch ahead
    (after the step-2 checkpoint), and the checkpoint holds a finished batch not yet trained on; the
    resumed run must consume it and regenerate the lost one exactly. One kill (the synchronous test's
    second, mid-step one, is the same case here) saves a launch."""
    ref, ref_dir = refs["grpo_async"]
    _sigkill_resume(warm, tmp_path, ref, REFS["grpo_async"][1], kill_timeout=600, second_kill=False)
    assert [r["offpolicy/staleness_mean"] for r in ref] == [0.0] + [1.0] * (STEPS - 1)
    _same_optimizer_steps(ref_dir, tmp_path / "run")


PAUSE_DRIVER = '''
import os, sys, time
from pathlib import Path
from megatron_rl.rewards.manager import register_reward
from megatron_rl.rewards.exact import exact_match
calls = [0]

@register_reward("exact_pausing")
def _r(text, gt):  # exact_match (the tiny config's reward); at the first sample of step 3 (32 prompts x
    calls[0] += 1  # 8 samples per step) it marks the moment and pauses, so a signal lands mid-step for sure
    if calls[0] == 2 * 256 + 1:
        Path(os.environ["PAUSE_MARK"]).touch()
        time.sleep(2.0)
    return exact_match(text, gt)

from megatron_rl.cli import main
if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
'''


def _start_pausing(cmd: list[str], tmp_path: Path) -> tuple[subprocess.Popen, Path]:
    """``cmd`` (a ``megatron-rl train`` line) run through :data:`PAUSE_DRIVER`, whose reward (equal to
    the config's) pauses in the middle of step 3; returns the process and the file marking the pause."""
    drv, mark = tmp_path / "pause_driver.py", tmp_path / "step3_started"
    drv.write_text(PAUSE_DRIVER)
    cmd = [sys.executable, str(drv), *cmd[3:], "reward.default=exact_pausing", "reward.by_source={reverse: exact_pausing}"]
    return _run(cmd, env={"PAUSE_MARK": str(mark)}), mark


def _sigterm_mid_step_3(proc, mark: Path, run_dir: Path, timeout: float) -> None:
    """SIGTERM (to the train process, as torchrun or ``kill`` sends it) while step 3 is scoring its
    samples: the run finishes step 3, checkpoints it, says how to resume in one line and exits 143,
    no traceback."""
    ck = run_dir / "checkpoints"
    t0 = time.time()
    while not mark.exists():
        assert proc.poll() is None, f"run ended before step 3:\n{proc.stdout.read()[-3000:]}"
        assert time.time() - t0 < timeout, "step 3 never started"
        time.sleep(0.05)
    assert [r["step"] for r in _rows(run_dir)] == [1, 2] and (ck / "step_2" / "COMPLETE").exists()
    os.kill(proc.pid, signal.SIGTERM)
    out, _ = proc.communicate(timeout=300)
    assert proc.returncode == 143, out[-4000:]
    assert "Traceback" not in out, out[-4000:]
    said = [x for x in out.splitlines() if "resume with:" in x]
    assert len(said) == 1 and "stopped by SIGTERM after step 3 of 6" in said[0], out[-4000:]
    assert f"trainer.run_dir={run_dir} " in said[0] and said[0].endswith(" --resume auto"), said[0]
    assert (ck / "step_3" / "COMPLETE").exists() and not list(ck.glob(".tmp-*"))
    assert [r["step"] for r in _rows(run_dir)] == [1, 2, 3]


def _sigkill_resume(warm: Path, tmp_path: Path, ref: list[dict], extra: tuple, kill_timeout: float = 300,
                    second_kill: bool = True, first: str = "sigkill") -> list[dict]:
    run_dir = tmp_path / "run"
    ck = run_dir / "checkpoints"
    assert [r["step"] for r in ref] == list(range(1, STEPS + 1))

    # 1) SIGTERM in the middle of step 3 (graceful stop: step 3 is checkpointed), or SIGKILL right
    #    after the step-2 checkpoint completes
    if first == "sigterm":
        p, mark = _start_pausing(_cmd(warm, run_dir, resume=False, extra=extra), tmp_path)
        _sigterm_mid_step_3(p, mark, run_dir, kill_timeout)
    else:
        p = _run(_cmd(warm, run_dir, resume=False, extra=extra))
        _kill_when(p, lambda: (ck / "step_2" / "COMPLETE").exists(), kill_timeout)
    # a half-written checkpoint must be ignored by --resume auto; a save cut short removed at start
    fake = ck / "step_5"
    fake.mkdir(parents=True, exist_ok=True)
    (fake / "garbage").write_text("partial")
    (ck / ".tmp-step_7" / "dist").mkdir(parents=True)
    # 2) resume, then SIGKILL in the middle of step 5 (after step 5 started: its row not yet written)
    if second_kill:
        p = _run(_cmd(warm, run_dir, resume=True, extra=extra))
        _kill_when(p, lambda: (ck / "step_4" / "COMPLETE").exists(), kill_timeout)
        out = p.stdout.read()
        assert out.count("removed 1 unfinished checkpoint dir(s)") == 1 and ".tmp-step_7" in out, out[-3000:]
    # 3) resume to the end
    _finish(_run(_cmd(warm, run_dir, resume=True, extra=extra)))
    assert not list(ck.glob(".tmp-*"))
    got = _rows(run_dir)
    assert [r["step"] for r in got] == list(range(1, STEPS + 1)), [r["step"] for r in got]
    for a, b in zip(ref, got):
        for k in KEYS:
            assert a[k] == b[k], f"step {a['step']} {k}: uninterrupted {a[k]!r} != resumed {b[k]!r}"
    return ref


@pytest.mark.slow
def test_resume_restores_the_rlcsd_snapshot_teacher(warm, refs, tmp_path):
    """RLCSD with a snapshot teacher synced every 3 optimizer steps: the step-4 checkpoint holds a
    teacher (θ after step 3) different from the policy, and the resumed run must continue with it."""
    config, extra = REFS["rlcsd_teacher"]
    args = {"config": config, "extra": extra}
    run_dir, (ref, ref_dir) = tmp_path / "run", refs["rlcsd_teacher"]
    assert (run_dir / "checkpoints").exists() is False
    p = _run(_cmd(warm, run_dir, resume=False, **args))
    _kill_when(p, lambda: (run_dir / "checkpoints" / "step_4" / "COMPLETE").exists())
    assert (run_dir / "checkpoints" / "step_4" / "teacher").is_dir()
    _finish(_run(_cmd(warm, run_dir, resume=True, **args)))
    got = _rows(run_dir)
    assert [r["step"] for r in got] == list(range(1, STEPS + 1)), [r["step"] for r in got]
    opt = _rows(ref_dir, "optimizer_steps.jsonl")
    # the snapshot counter counts optimizer steps (PPO mini-batches), read at each mini-batch's teacher pass
    assert [r["teacher/syncs"] for r in opt] == [i // 3 for i in range(len(opt))] and len(opt) > STEPS
    for a, b in zip(ref, got):
        for k in ("reward/acc", "actor/loss", "actor/grad_norm", "teacher/kept_frac", "rlcsd/sel_frac",
                  "distill/teacher_minus_student"):
            assert a.get(k) == b.get(k), f"step {a['step']} {k}: uninterrupted {a.get(k)!r} != resumed {b.get(k)!r}"
    _same_optimizer_steps(ref_dir, run_dir, OPT_KEYS + ("teacher/syncs", "rows"))


NAN_DRIVER = '''
import sys
from megatron_rl.rewards.manager import register_reward
from megatron_rl.rewards.exact import exact_match
calls = [0]

@register_reward("nan_from_step_4")
def _r(text, gt):  # a user reward that breaks: NaN from the 4th step on (32 prompts x 8 samples per step)
    calls[0] += 1
    return float("nan") if calls[0] > 3 * 256 else exact_match(text, gt)

from megatron_rl.cli import main
if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
'''


@pytest.mark.slow
def test_nan_reward_stops_naming_step_after_last_good_checkpoint(warm, tmp_path):
    drv = tmp_path / "drv.py"
    drv.write_text(NAN_DRIVER)
    run_dir = tmp_path / "nan"
    cmd = [sys.executable, str(drv)] + _cmd(warm, run_dir, resume=False)[3:] + ["reward.default=nan_from_step_4",
                                                                                "reward.by_source={reverse: nan_from_step_4}"]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=Path(__file__).resolve().parents[2],
                       env={**os.environ, "OMP_NUM_THREADS": "2"})
    assert p.returncode == 1   # a runtime error (after start-up), not a configuration error (2)
    err = p.stdout + p.stderr
    assert "stopping at step 4" in err and "reward of sample" in err and "is nan" in err, err[-3000:]
    assert "Last good checkpoint:" in err and "step_2" in err
    assert (run_dir / "checkpoints" / "step_2" / "COMPLETE").exists()
    assert [r["step"] for r in _rows(run_dir)] == [1, 2, 3], "no metrics row may be written for the failed step"
