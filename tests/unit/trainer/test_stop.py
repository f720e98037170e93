"""The graceful-stop state machine (``trainer/loop/stop.py``) with real signals: the first SIGINT/SIGTERM
only sets the flag, a second one (or one before the run is armed) ends the process at once with
128 + signum and one short line, and the handlers in force before are restored on exit (also after a
library such as Ray replaced ours in between)."""
from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from megatron_rl.trainer.loop.stop import GracefulStop, Stopped, exit_code

REPO = Path(__file__).resolve().parents[3]


def _theirs(signum, frame):   # a previous handler (e.g. pytest's or the demo's)
    raise AssertionError("the previous handler must not run while the stop is installed")


def _ray_like(signum, frame):  # what ray.init installs for SIGTERM
    raise AssertionError("replaced handler must not run after reclaim")


def test_first_signal_sets_the_flag_and_previous_handlers_come_back():
    before = {s: signal.signal(s, _theirs) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        with GracefulStop() as st:
            st.arm()
            signal.signal(signal.SIGTERM, _ray_like)        # a library takes SIGTERM ...
            st.reclaim()                                     # ... and the run takes it back
            assert signal.getsignal(signal.SIGTERM) == st._handler
            os.kill(os.getpid(), signal.SIGTERM)             # real signal, handled at the next bytecode
            assert st.signum == signal.SIGTERM
            assert st.agreed() == signal.SIGTERM             # one process: its own flag
        assert signal.getsignal(signal.SIGINT) is _theirs
        assert signal.getsignal(signal.SIGTERM) is _ray_like  # the latest handler before ours
    finally:
        for s, h in before.items():
            signal.signal(s, h)


def test_stopped_exit_status():
    assert (exit_code(signal.SIGINT), exit_code(signal.SIGTERM)) == (130, 143)
    e = Stopped(signal.SIGTERM)
    assert isinstance(e, SystemExit) and e.code == 143


SCRIPT = textwrap.dedent("""
    import os, signal, sys, time
    from megatron_rl.trainer.loop.stop import GracefulStop
    sig = getattr(signal, sys.argv[1])
    with GracefulStop() as st:
        if sys.argv[2] == "armed":
            st.arm(lambda: sys.argv[3] if len(sys.argv) > 3 else None)
            os.kill(os.getpid(), sig)
            print("flag", int(st.signum), flush=True)
        os.kill(os.getpid(), sig)
        time.sleep(30)
        print("not reached", flush=True)
""")


@pytest.mark.parametrize(("sig", "phase", "code", "lines", "ckpt"), [
    ("SIGINT", "armed", 130, ["SIGINT: finishing the current step", "SIGINT: stopping now (second signal); no checkpoint "
                              "was written yet, so the steps trained so far are lost"], None),
    ("SIGINT", "armed", 130, ["SIGINT: finishing the current step", "SIGINT: stopping now (second signal); the last "
                              "complete checkpoint is kept: run/checkpoints/step_4"], "run/checkpoints/step_4"),
    ("SIGTERM", "start-up", 143, ["SIGTERM: stopping now (nothing to save yet): start-up, nothing trained"], None),
], ids=["second-ctrl-c-no-checkpoint", "second-ctrl-c", "before-armed"])
def test_second_signal_or_startup_signal_ends_at_once(sig, phase, code, lines, ckpt):
    """A stop at once says what is kept: the newest complete checkpoint, or that there is none (it said
    "the last complete checkpoint is kept" when the run had written none)."""
    p = subprocess.run([sys.executable, "-c", SCRIPT, sig, phase, *([ckpt] if ckpt else [])], capture_output=True,
                       text=True, timeout=60, check=False,
                       cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert p.returncode == code, p.stderr
    assert "not reached" not in p.stdout and "Traceback" not in p.stderr
    if phase == "armed":
        assert p.stdout.split() == ["flag", str(int(getattr(signal, sig)))]
    got = p.stderr.strip().splitlines()
    assert len(got) == len(lines) and all(want in g for want, g in zip(lines, got)), got


WATCHDOG = textwrap.dedent("""
    import subprocess, sys, time
    from megatron_rl.trainer.loop.stop import StepWatchdog
    child = subprocess.Popen(["sleep", "120"])
    print(child.pid, flush=True)
    dog = StepWatchdog(float(sys.argv[1]), lambda: "run/checkpoints/step_2")
    with dog.step(2):
        pass                      # a step that finishes: the bound does nothing
    with dog.step(3):
        time.sleep(60)            # a step that never finishes (a grader that never answers)
    print("not reached", flush=True)
""")


def test_a_step_past_its_bound_ends_the_run_and_its_children():
    """``trainer.step_timeout_s``: a step still running past the bound ends the process with one line naming
    the step and the checkpoint kept, exit status 1, and no child of it left (a stuck step waited forever)."""
    import time

    import psutil

    t0 = time.monotonic()
    p = subprocess.run([sys.executable, "-c", WATCHDOG, "1.5"], capture_output=True, text=True, timeout=60, check=False,
                       cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)})
    took = time.monotonic() - t0
    assert p.returncode == 1 and "not reached" not in p.stdout and took < 30, (p.returncode, took, p.stderr)
    assert p.stderr.strip().splitlines() == [
        "[megatron-rl] step 3 has run for more than trainer.step_timeout_s=1.5 s: stopping the run and its engines; "
        "the last complete checkpoint is kept: run/checkpoints/step_2"], p.stderr
    child = int(p.stdout.split()[0])
    assert not psutil.pid_exists(child) or psutil.Process(child).status() == psutil.STATUS_ZOMBIE


@pytest.fixture(scope="module")
def demo_assets(tmp_path_factory):
    from megatron_rl.cli.demo import prepare

    paths, _, hf = prepare(tmp_path_factory.mktemp("assets"), seed=0)
    return paths, hf


def _catches_sigterm(pid: int) -> bool:
    """Has process ``pid`` installed a SIGTERM handler (``SigCgt`` of /proc/PID/status)?"""
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    mask = next((int(ln.split()[1], 16) for ln in text.splitlines() if ln.startswith("SigCgt:")), 0)
    return bool(mask >> (signal.SIGTERM - 1) & 1)


def _sigint_default() -> None:
    """A suite started in the background (``make test &``, nohup) hands its children SIGINT ignored, which
    the command rightly keeps ignored; the user's Ctrl-C reaches a foreground command, as here."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@pytest.mark.parametrize("sig", ["SIGTERM", "SIGINT"])
def test_a_signal_during_convert_is_one_line_and_leaves_nothing(demo_assets, tmp_path, sig):
    """Outside a training run too (here ``convert``, as soon as the command's handlers are in): one
    line, 128 + signum, no traceback, nothing at --out (Ctrl-C was a KeyboardInterrupt traceback,
    SIGTERM a silent death)."""
    import time

    _, hf = demo_assets
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    p = subprocess.Popen([sys.executable, "-m", "megatron_rl.cli", "convert", "hf-to-mcore", "--hf", str(hf), "--out",
                          str(tmp_path / "ck")], cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True, preexec_fn=_sigint_default)
    deadline = time.monotonic() + 60
    while not _catches_sigterm(p.pid) and p.poll() is None and time.monotonic() < deadline:
        time.sleep(0.005)
    p.send_signal(getattr(signal, sig))
    out, err = p.communicate(timeout=60)
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert p.returncode == exit_code(getattr(signal, sig)), (out, err)
    assert lines == [f"megatron-rl convert: stopped by {sig}; nothing half-written is left in place"], err
    assert not (tmp_path / "ck").exists() and not [q for q in tmp_path.iterdir() if q.name.startswith(".tmp")]


def test_sigterm_during_engine_start_up_is_one_line_143_and_leaves_no_process(demo_assets, tmp_path):
    """Issue 31: a SIGTERM while the run starts Ray and its engines ended with Ray's own handler (exit
    15, no line) and left two Ray agents running. Now: the real ``megatron-rl train``, signalled once its
    local Ray is up (a raylet among its descendants), prints one line, exits 143, and none of the
    processes it started is alive afterwards."""
    import time

    import psutil

    paths, hf = demo_assets
    env = {**os.environ, "PYTHONPATH": str(REPO), "RAY_AUTH_MODE": "disabled", "WANDB_MODE": "offline"}
    for k in ("RAY_ADDRESS", "WORLD_SIZE", "RANK"):
        env.pop(k, None)
    p = subprocess.Popen([sys.executable, "-m", "megatron_rl.cli", "train", "--config", "examples/configs/tiny_cpu_grpo.yaml",
                          f"model.hf_path={hf}", f"data.train={paths['train']}", "data.val=",
                          f"trainer.run_dir={tmp_path / 'run'}", "rollout.engine=hf", "data.prompts_per_step=4",
                          "rollout.n=4", "trainer.micro_batch_size=8", "logging.wandb_mode=disabled"],
                         cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    seen: dict[int, psutil.Process] = {}
    try:
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline and p.poll() is None:
            with contextlib.suppress(psutil.Error):
                for c in psutil.Process(p.pid).children(recursive=True):
                    seen.setdefault(c.pid, c)
            if any("raylet" in " ".join(_cmd(c)) for c in seen.values()):
                break
            time.sleep(0.2)
        assert p.poll() is None, p.communicate()[1][-3000:]
        time.sleep(1.0)   # engine actors starting
        with contextlib.suppress(psutil.Error):
            for c in psutil.Process(p.pid).children(recursive=True):
                seen.setdefault(c.pid, c)
        p.send_signal(signal.SIGTERM)
        _, err = p.communicate(timeout=60)
    finally:
        if p.poll() is None:
            p.kill()
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert p.returncode == 143, err[-3000:]
    assert lines[-1] == "[megatron-rl] SIGTERM: stopping now (nothing to save yet): start-up, nothing trained"
    assert "Traceback" not in err and "Started a local Ray instance" not in err, err[-3000:]
    assert len(seen) >= 2
    gone, alive = psutil.wait_procs(list(seen.values()), timeout=10)
    assert not alive, [(c.pid, _cmd(c)) for c in alive]


def _cmd(proc) -> list[str]:
    import psutil

    try:
        return proc.cmdline()
    except psutil.Error:
        return []
