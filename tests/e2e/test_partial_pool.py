"""Partial rollouts killed and resumed: every prompt index is consumed exactly once across a SIGKILL.

``workers/partial_driver.py`` runs a :class:`~megatron_rl.rollout.partial.PartialPool` on a real
``vllm-async`` engine (Ray actor, gloo pushes in flight after every step; 4 groups a step, 4 more in
flight, every eighth prompt 8x longer). It is SIGKILLed (its whole process group: driver, Ray, the
engine) right after a checkpoint, while groups are in flight, then resumed from that checkpoint; the
groups in flight at the kill are regenerated from their seeds. Counted: the indices trained or dropped
over both runs are each consumed once, and with the ones still pending they are exactly
0 .. next_index − 1."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

from tests.helpers.dist import REPO, repo_env

STEPS, KILL_AT = 4, 2   # short: the two engine starts (before and after the kill) are most of the time


def _start(model, run_dir, *extra):
    return subprocess.Popen([sys.executable, str(REPO / "tests/e2e/workers/partial_driver.py"), str(model), str(run_dir),
                             str(STEPS), *extra], cwd=REPO, env=repo_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)


def test_sigkill_and_resume_neither_lose_nor_repeat_a_prompt(tmp_path):
    from tests.helpers.tiny_model import save_tiny_qwen3

    model = save_tiny_qwen3(tmp_path / "m", max_positions=256)
    p = _start(model, tmp_path)
    lines = []
    for line in p.stdout:
        lines.append(line)
        if line.startswith(f"STEP {KILL_AT} "):
            break
    killed_at = json.loads((tmp_path / "ckpt.json").read_text())
    os.killpg(p.pid, signal.SIGKILL)
    p.wait(timeout=60)
    assert p.returncode == -signal.SIGKILL, "".join(lines[-20:])
    assert killed_at["step"] == KILL_AT and killed_at["pool"]["pending"], killed_at   # groups in flight at the kill
    time.sleep(2)
    q = _start(model, tmp_path, "--resume")
    out, _ = q.communicate(timeout=900)
    assert q.returncode == 0, out[-3000:]
    st = json.loads((tmp_path / "ckpt.json").read_text())
    used = st["consumed"] + st["dropped"]
    assert st["step"] == STEPS and len(st["consumed"]) == 4 * STEPS
    assert len(used) == len(set(used)), f"a prompt was consumed twice: {sorted(used)}"
    assert sorted(used + st["pool"]["pending"]) == list(range(st["pool"]["next_index"])), st
    steps = [json.loads(x.split(" ", 2)[2]) for x in (lines + out.splitlines(True)) if x.startswith("STEP ")]
    print(f"resume count: {len(st['consumed'])} prompts trained + {len(st['dropped'])} dropped over {STEPS} steps, "
          f"{len(killed_at['pool']['pending'])} in flight at the kill regenerated, pending at the end "
          f"{len(st['pool']['pending'])}, next index {st['pool']['next_index']}; span_frac per step "
          f"{[round(m['partial/span_frac'], 2) for m in steps]}")
