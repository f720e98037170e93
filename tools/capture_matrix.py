"""Capture, then compare, every method's numbers on the chat fixture: the bit-for-bit check of a refactor.

    python tools/capture_matrix.py capture OUT_DIR [--only sync,async,partial,dp2] [--kinds score,grpo@async]
    python tools/capture_matrix.py compare BEFORE_DIR AFTER_DIR

``capture`` runs, from the checkout it is started in (``PYTHONPATH`` decides which one):

* ``sync`` + ``async``: ``tests/e2e/workers/chat_kinds.py`` with every ``algo.kind`` and every variant
  of ``tests/e2e/test_chat_methods.py`` (one-step-off is ``grpo@async``), 2 RL steps each;
* ``partial``: GRPO on the same fixture with in-flight partial rollouts (``vllm-async``, 2 extra groups),
  3 steps through ``megatron-rl train``;
* ``dp2``: GRPO and BiCC+RCC through ``torchrun --nproc-per-node 2 -m megatron_rl.cli train`` (DP = 2).

``--kinds`` keeps, of the ``sync`` / ``async`` kinds and variants, those named (e.g. ``score``: one family's
check in minutes instead of the whole matrix); a name that is none of them is an error.

``compare`` reads each run dir's ``metrics.jsonl`` and ``optimizer_steps.jsonl`` and reports every value
that differs, leaving out the wall-clock and memory readings (:data:`TIMING`), which no two runs share.
Exit status 0 when every number is equal, 1 otherwise. A partial run's schedule depends on timing (which
response finishes before a push), so its rows are compared too but reported apart.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TIMING = re.compile(r"^(time|perf|memory)/|seconds$|secs$|_s$|_ms$|elapsed|timestamp")
FILES = ("metrics.jsonl", "optimizer_steps.jsonl")
DP2_KINDS = ("grpo", "bicc_rcc")
PARTIAL = ["rollout.engine=vllm-async", "rollout.partial.enable=true", "rollout.partial.extra_groups=2", "trainer.steps=3"]


def _env() -> dict:
    return {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}", "PYTHONUNBUFFERED": "1",
            "RAY_AUTH_MODE": "disabled", "WANDB_MODE": "offline", "TOKENIZERS_PARALLELISM": "false",
            "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "2")}


def _run(cmd: list[str], log: Path) -> None:
    print(f"[capture] {' '.join(cmd[:6])} ... > {log}", flush=True)
    with open(log, "w") as f:
        rc = subprocess.run(cmd, check=False, stdout=f, stderr=subprocess.STDOUT, cwd=ROOT, env=_env()).returncode
    if rc != 0:
        raise SystemExit(f"capture: {cmd[1]} exited {rc}; see {log}")


def capture(out: Path, only: set[str], kinds: list[str] | None = None) -> None:
    sys.path.insert(0, str(ROOT))
    sys.path.insert(0, str(ROOT / "tests/e2e/workers"))
    from chat_kinds import overrides

    from tests.e2e.test_chat_methods import KINDS, VARIANTS
    from tests.helpers.chat_fixture import build_chat_fixture
    from tests.helpers.fake_openai_server import start_server

    chosen = [*KINDS, *VARIANTS]
    if kinds:
        unknown = sorted(set(kinds) - set(chosen))
        if unknown:
            raise SystemExit(f"capture: --kinds {unknown} are not among the chat kinds / variants {chosen}")
        chosen = [k for k in chosen if k in kinds]
    out.mkdir(parents=True, exist_ok=True)
    fx = build_chat_fixture(out / "fixture")
    py = sys.executable
    if only & {"sync", "async"}:
        proc, url = start_server(1500)
        try:
            _run([py, str(ROOT / "tests/e2e/workers/chat_kinds.py"), str(Path(fx["hf_path"]).parent), str(out / "chat"),
                  url, *chosen], out / "chat.log")
        finally:
            proc.kill()
    cfg = out / "base.yaml"   # the CLI wants a config; the chat kinds' overrides carry everything else
    cfg.write_text("trainer:\n  seed: 7\n")
    if "partial" in only:
        ov = [o.replace(str(out / "chat" / "grpo"), str(out / "partial")) for o in overrides("grpo", fx, out / "chat", "")]
        _run([py, "-m", "megatron_rl.cli", "train", "--config", str(cfg), *[o for o in ov if not o.startswith("trainer.steps=")], *PARTIAL],
             out / "partial.log")
    if "dp2" in only:
        torchrun = str(Path(py).parent / "torchrun")
        for kind in DP2_KINDS:
            ov = [o.replace(str(out / "chat" / kind), str(out / f"dp2_{kind}")) for o in overrides(kind, fx, out / "chat", "")]
            _run([torchrun, "--standalone", "--nproc-per-node=2", "-m", "megatron_rl.cli", "train", "--config", str(cfg), *ov],
                 out / f"dp2_{kind}.log")


def _rows(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()] if path.exists() else []


def _differs(a, b) -> bool:
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return False
    return a != b


def compare(before: Path, after: Path) -> int:
    runs = sorted({p.parent.relative_to(before) for f in FILES for p in before.rglob(f)})
    bad, partial_bad, n_values = [], [], 0
    for run in runs:
        for name in FILES:
            ra, rb = _rows(before / run / name), _rows(after / run / name)
            where = partial_bad if str(run).startswith("partial") else bad
            if len(ra) != len(rb):
                where.append(f"{run}/{name}: {len(ra)} rows before, {len(rb)} after")
                continue
            for i, (x, y) in enumerate(zip(ra, rb)):
                keys = {k for k in x.keys() | y.keys() if not TIMING.search(k)}
                n_values += len(keys)
                for k in sorted(keys):
                    if _differs(x.get(k), y.get(k)):
                        where.append(f"{run}/{name} row {i} {k}: {x.get(k)!r} -> {y.get(k)!r}")
    print(f"compare: {len(runs)} run dirs, {n_values} values; {len(bad)} differ"
          + (f"; partial (timing-dependent): {len(partial_bad)} differ" if partial_bad else ""))
    for line in bad[:80] + partial_bad[:40]:
        print("  " + line)
    return 1 if bad else 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("capture")
    c.add_argument("out", type=Path)
    c.add_argument("--only", default="sync,async,partial,dp2")
    c.add_argument("--kinds", default="", help="comma-separated chat kinds / variants of sync and async (default: all)")
    d = sub.add_parser("compare")
    d.add_argument("before", type=Path)
    d.add_argument("after", type=Path)
    a = ap.parse_args(argv)
    if a.cmd == "capture":
        capture(a.out.resolve(), set(a.only.split(",")), [k for k in a.kinds.split(",") if k])
        return 0
    return compare(a.before, a.after)


if __name__ == "__main__":
    sys.exit(main())
