"""How long the dry run takes (``megatron-rl train --config C --dry-run``), split by stage, against two baselines
measured in the same run: an import-only child (python + torch + megatron-core + the trainer's modules: the floor
of every role's process) and ``megatron-rl plan --config C`` (the arithmetic the dry run checks).

Per example: the whole command's wall clock, and per role the seconds the report prints: start (imports, the fake
world, Megatron's groups), build (the policy and every model the method holds, on the fake device) and the step's
phases (the old / reference / teacher log-prob passes, the update). The goal: any 7B–14B example's dry run in a
few minutes on this machine's 2 cores (issue 52).

    .venv/bin/python benchmarks/bench_dryrun.py [NAME ...]   # default: llama3_1_8b_dapo qwen3_8b_grpo qwen2_5_14b_rlcsd
"""
from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DEFAULT = ("llama3_1_8b_dapo", "qwen3_8b_grpo", "qwen2_5_14b_rlcsd")
FIXTURES = REPO / "tests" / "fixtures" / "hf_configs"
IMPORTS = ("import torch, megatron.core, megatron_rl.trainer.policy.actor, megatron_rl.trainer.dryrun.step, "
           "megatron_rl.runtime.fake_device")


def model_dir(name: str) -> Path:
    return next(d for d in sorted(FIXTURES.iterdir(), key=lambda d: -len(d.name)) if name.startswith(d.name))


def timed(cmd: list[str]) -> tuple[float, str]:
    env = {**os.environ, "PYTHONPATH": str(REPO), "TORCHDYNAMO_DISABLE": "1"}
    env.pop("WORLD_SIZE", None)
    t0 = time.perf_counter()
    r = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, env=env, check=False)
    if r.returncode:
        raise SystemExit(f"{' '.join(cmd)} failed ({r.returncode}):\n{r.stderr[-3000:]}")
    return time.perf_counter() - t0, r.stdout


def main(names: list[str]) -> None:
    py = sys.executable
    floor, _ = timed([py, "-c", IMPORTS])
    print(f"baseline: import-only child {floor:.1f} s (every role's process pays it)")
    for name in names:
        config, model = f"examples/configs/{name}.yaml", f"model.hf_path={model_dir(name).relative_to(REPO)}"
        header = re.search(r"^#\s+megatron-rl plan (.*)$", (REPO / config).read_text(), re.MULTILINE).group(1)
        plan_s, _ = timed([py, "-m", "megatron_rl.cli", "plan", *shlex.split(header)])   # the example's own plan line
        dry_s, out = timed([py, "-m", "megatron_rl.cli", "train", "--config", config, "--dry-run", model])
        roles = re.findall(r"seconds: start ([\d.]+), build ([\d.]+), step ([\d.]+) \((.*)\)", out)
        print(f"{name}: dry run {dry_s:.1f} s = {dry_s / floor:.1f}x the import floor, {dry_s / plan_s:.0f}x plan "
              f"({plan_s:.1f} s); {len(roles)} role(s)")
        for start, build, step, phases in roles:
            print(f"  role: start {start} s, build {build} s, step {step} s ({phases})")
        print(f"  {out.strip().splitlines()[-1]}")


if __name__ == "__main__":
    main(sys.argv[1:] or list(DEFAULT))
