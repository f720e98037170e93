"""The e2e tests' runner: several RL runs (demo runs from one warm start, or config runs) in one worker
process (``tests/e2e/workers/demo_runs.py``), so a module pays the process, Ray and engine start once."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
WORKER = REPO / "tests" / "e2e" / "workers" / "demo_runs.py"


def warm_overrides(warm: Path, run_dir: Path, *extra: str) -> list[str]:
    """The ``megatron-rl train`` overrides of a short test run of a ``tiny_cpu_*`` config from a warm-started
    demo run dir ``warm`` (its ``sft_hf`` policy and training data), checkpointing every 2 steps into
    ``run_dir``, with no eval, export or progress bar; then ``extra``, whose keys replace the base's (the
    CLI refuses a key overridden twice with different values)."""
    base = [f"model.hf_path={warm / 'sft_hf'}", f"data.train={warm / 'data' / 'train.parquet'}", "data.val=",
            "trainer.ckpt_every=2", "trainer.eval_every=0", f"trainer.run_dir={run_dir}", "trainer.export_hf=false",
            "logging.progress=false", "rollout.kv_cache_gib=0.25"]
    mine = {o.split("=", 1)[0] for o in extra}
    return [o for o in base if o.split("=", 1)[0] not in mine] + list(extra)


def start_demo_runs(out: Path, runs: list[dict], *, warm: dict | None = None,
                    init_from: Path | None = None) -> subprocess.Popen:
    """Start the worker on ``runs`` (see its docstring) from a fresh warm start (``warm``), an earlier
    demo run dir (``init_from``) or neither (config runs only); each demo run's files land in
    ``out/<name>``. :func:`finish_demo_runs` collects it (a caller may watch the runs' files in between)."""
    assert warm is None or init_from is None, "warm= or init_from=, not both"
    out.mkdir(parents=True, exist_ok=True)
    spec = out / "spec.json"
    spec.write_text(json.dumps({"warm": warm, "init_from": str(init_from) if init_from else None, "runs": runs,
                                "out": str(out)}))
    return subprocess.Popen([sys.executable, str(WORKER), str(spec)], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, cwd=REPO,
                            env={**os.environ, "OMP_NUM_THREADS": "2", "PYTHONUNBUFFERED": "1"})


def finish_demo_runs(proc: subprocess.Popen, out: Path, timeout: float = 2400) -> dict:
    """Wait for the worker; its per-run results (``{name: {ok, before, after, secs, error?}}``)."""
    try:
        log, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        log, _ = proc.communicate()
        raise AssertionError(f"demo runs still running after {timeout} s:\n{log[-5000:]}") from None
    assert proc.returncode == 0, f"demo runs failed:\n{log[-8000:]}"
    res = json.loads((out / "results.json").read_text())
    print({k: v["secs"] for k, v in res.items()})
    return res


def demo_runs(out: Path, runs: list[dict], *, warm: dict | None = None, init_from: Path | None = None,
              timeout: float = 2400) -> dict:
    """:func:`start_demo_runs` then :func:`finish_demo_runs`."""
    return finish_demo_runs(start_demo_runs(out, runs, warm=warm, init_from=init_from), out, timeout)


def run_result(out: Path, res: dict, name: str) -> tuple[float, float, list[dict]]:
    """``(held-out acc before RL, after RL, metrics rows)`` of run ``name``; its error if it failed."""
    r = res[name]
    assert r["ok"], f"{name} failed:\n{r['error']}"
    rows = [json.loads(x) for x in (out / name / "metrics.jsonl").read_text().splitlines()]
    print(f"[{name}] held-out greedy accuracy {r['before']:.3f} -> {r['after']:.3f} ({r['secs']} s)")
    return r["before"], r["after"], rows


def run_demo(algo: str, run_dir: Path, steps: int = 60, *extra: str) -> tuple[float, float, list[dict]]:
    """A whole ``python -m megatron_rl.cli.demo --algo ALGO --steps STEPS`` in a subprocess (its own warm start):
    ``(held-out acc before RL, after RL, metrics rows)``."""
    cmd = [sys.executable, "-m", "megatron_rl.cli.demo", "--algo", algo, "--steps", str(steps), "--run-dir", str(run_dir),
           *extra]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=900,
                       env={**os.environ, "OMP_NUM_THREADS": "2", "PYTHONUNBUFFERED": "1"})
    assert p.returncode == 0, f"demo {algo} failed:\n{p.stdout[-3000:]}\n{p.stderr[-5000:]}"
    m = re.search(r"before RL ([0-9.]+) -> after RL ([0-9.]+)", p.stdout)
    assert m, p.stdout[-2000:]
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return float(m.group(1)), float(m.group(2)), rows
