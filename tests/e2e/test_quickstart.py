"""The quick-start commands of docs/getting-started.md (and the README's, a subset of them), run as written (issue 10: its eval step failed for want of a
tokenizer in the run's ``hf/`` export, and no training step could be exported).

Runs, in order and verbatim, every ``megatron-rl`` line of the page's "Quick start" block that
runs on this CPU machine, through the installed console script, in a scratch working directory
where ``examples/`` is the repository's and ``runs/demo_bicc_rcc`` / ``runs/demo_rlcsd`` are the
session's warm-started demo run (``plain_warm``). Left out, and why:

* ``megatron-rl demo ...``: the same entry as ``make demo``; the session's warm start (``plain_warm``),
  tests/e2e/test_learning.py (bicc_rcc) and test_score.py run it, and
  tests/e2e/workers/demo_runs.py runs its config and loop for several methods in one process (a full
  demo is minutes of RL on 2 cores);
* the "Templates" block after it (``<HF_MODEL_DIR>`` and other placeholders, GPU launchers): not
  runnable as written, and marked so.

The console of each command is checked too (issue 24, quiet by default): ``train`` ends with the
formatted summary (no Python dict), wandb prints nothing, ``eval`` keeps vLLM's INFO and its
"Chat template warmup failed" traceback in ``OUT/eval.log``, ``convert`` prints one line.
"""
from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
EXE = Path(sys.executable).with_name("megatron-rl")


GUIDE = REPO / "docs" / "getting-started.md"


def quickstart_lines(path: Path = GUIDE) -> list[str]:
    text = path.read_text()
    block = text[text.index("## Quick start"):]
    block = block[:block.index("\n##", 4)]
    lines = []
    for code in re.findall(r"```bash\n(.*?)```", block, re.DOTALL):
        lines += [ln.strip() for ln in code.splitlines() if ln.strip().startswith("megatron-rl ")]
    return lines


def test_readme_quickstart_lines_are_the_guides():
    """README.md's quick start is a subset of the guide's, in the same order, so this module runs it too."""
    readme, guide = quickstart_lines(REPO / "README.md"), quickstart_lines()
    assert readme and all(ln in guide for ln in readme), [ln for ln in readme if ln not in guide]
    assert [guide.index(ln) for ln in readme] == sorted(guide.index(ln) for ln in readme)


def runnable_here(line: str) -> bool:
    argv = shlex.split(line)
    assert not re.search(r"<[A-Z_]+>", line), f"placeholder in a runnable quick-start line: {line}"
    return argv[1] != "demo"


def _rows(run_dir: Path) -> list[dict]:
    return [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_readme_quickstart_runs_as_written(plain_warm, tmp_path):
    lines = [ln for ln in quickstart_lines() if runnable_here(ln)]
    assert any(" train " in f" {ln} " for ln in lines) and any(" eval " in f" {ln} " for ln in lines), lines
    (tmp_path / "runs").mkdir()
    (tmp_path / "examples").symlink_to(REPO / "examples")
    for name in ("demo_bicc_rcc", "demo_rlcsd"):
        (tmp_path / "runs" / name).symlink_to(plain_warm)
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1", PYTHONPATH=str(REPO))
    times, first = {}, None
    run = tmp_path / "runs" / "tiny_cpu_grpo"
    for line in lines:
        t0 = time.perf_counter()
        p = subprocess.run([str(EXE), *shlex.split(line)[1:]], cwd=tmp_path, env=env, capture_output=True, text=True,
                           timeout=900, check=False)
        times[line] = round(time.perf_counter() - t0, 1)
        assert p.returncode == 0, f"{line}\n--- stderr\n{p.stderr[-4000:]}"
        console = p.stdout + p.stderr
        if " train " in f" {line} ":
            assert "Traceback" not in p.stderr and "Number of buckets" not in console   # noise -> train.log
            assert "megatron-rl train: done" in p.stdout and "{'" not in p.stdout, p.stdout[-2000:]  # the summary
            assert "--resume auto" in p.stdout.splitlines()[-1] and "wandb:" not in console, console[-2000:]
        if " eval " in f" {line} ":   # ~58 lines of vLLM INFO / warnings before issue 24
            assert " INFO " not in console and "Chat template warmup" not in console, console[-3000:]
            assert len([ln for ln in p.stderr.splitlines() if ln.strip()]) <= 6, p.stderr[-3000:]
            assert "Initializing a V1 LLM engine" in (tmp_path / shlex.split(line)[-1] / "eval.log").read_text()
        if " convert " in f" {line} ":
            assert p.stderr.strip() == "" and len(p.stdout.splitlines()) == 1, console[-2000:]
        if first is None and "tiny_cpu_grpo" in line:   # the first run, before its --resume auto
            first = (_rows(run), (run / "wandb_id.txt").read_text().strip())
        if "tiny_cpu_grpo" in line and "--resume auto" in line:   # the changed key is named, old -> new
            assert "trainer.steps: 4 -> 6" in p.stderr and "warning: resuming with a changed configuration" in p.stderr
    # every start left its resolved configuration (with the package's version): 4 steps, then 6
    import yaml

    saved = [yaml.safe_load((run / n).read_text()) for n in ("config.yaml", "config.1.yaml")]
    assert [c["trainer"]["steps"] for c in saved] == [4, 6] and not (run / "config.2.yaml").exists()
    assert all(c["_meta"]["version"] and c["algo"]["kind"] == "grpo" for c in saved)
    rows = _rows(run)
    steps = [r["step"] for r in rows]
    assert steps == list(range(1, steps[-1] + 1)) and steps[-1] > 4        # resumed, no duplicate rows
    assert rows[:len(first[0])] == first[0]                                 # earlier rows kept as they were
    assert (run / "wandb_id.txt").read_text().strip() == first[1]           # the same wandb run continues
    guide = GUIDE.read_text()
    table = guide[guide.index("Main keys of a `metrics.jsonl` line"):]
    table = table[:table.index("\n\n", table.index("| key |"))]   # the table ends at its blank line
    documented = set(re.findall(r"`([a-z_]+/[a-z_]+)`", table)) - {"eval/acc"}  # eval/acc: eval steps only
    assert documented and documented <= set(rows[0]), f"docs/getting-started.md metric keys not logged: {documented - set(rows[0])}"
    assert (run / "hf" / "sp.model").is_file() and "Number of buckets" in (run / "train.log").read_text()
    assert (run / "curve.png").read_bytes()[:4] == b"\x89PNG"
    assert (run / "hf_step4" / "model.safetensors").is_file() and (run / "hf_step4" / "sp.model").is_file()
    summary = json.loads((run / "eval" / "summary.json").read_text())
    assert summary["rows"] > 0 and 0.0 <= summary["pass@4"] <= 1.0
    # --n 4 --temperature 0.6 --top-p 0.95 --top-k 20: mean@4 and pass@4 per data source
    assert summary["n"] == 4 and all(0.0 <= s["mean@4"] <= s["pass@4"] <= 1.0 for s in summary["by_source"].values())
    assert len((run / "eval" / "samples.jsonl").read_text().splitlines()) == 4 * summary["rows"]
    print("quick-start command seconds:", json.dumps(times, indent=1))
