"""The dry run (``megatron-rl train --dry-run``, ``megatron_rl/trainer/dryrun/``): roles, the step's batch, the
oracles, and one 8B example end to end on this CPU (about 45 s on 2 shared cores)."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from megatron_rl.planning.arch import load_arch
from megatron_rl.planning.memory import PlanInputs, padded_vocab, params_per_gpu
from megatron_rl.trainer.dryrun import oracles
from megatron_rl.trainer.dryrun.roles import layout_of, roles
from megatron_rl.trainer.dryrun.step import step_shape
from megatron_rl.trainer.loop.preflight import load_checked

ROOT = Path(__file__).resolve().parents[3]
FIXTURES = ROOT / "tests/fixtures/hf_configs"
MODELS = ("qwen3_8b", "qwen2_5_7b", "qwen2_5_14b", "llama3_1_8b")


def _cfg(name: str, model: str, *more: str):
    return load_checked(ROOT / f"examples/configs/{name}.yaml", [f"model.hf_path={FIXTURES / model}", *more])


def test_roles_one_per_stage_at_megatrons_ranks(monkeypatch):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    lay = layout_of(_cfg("qwen2_5_14b_rlcsd", "qwen2_5_14b"))
    assert (lay.tp, lay.pp, lay.dp, lay.world) == (4, 2, 2, 16)          # 8 engines x TP 2 share 16 GPUs
    assert [(r.pp_rank, r.rank) for r in roles(lay)] == [(0, 0), (1, 8)]  # tp fastest, then dp, then pp
    assert layout_of(_cfg("qwen3_8b_grpo_separate", "qwen3_8b")).dp == 1   # separate: one replica
    assert layout_of(_cfg("qwen3_8b_grpo", "qwen3_8b"), env={"WORLD_SIZE": "16"}).dp == 4


def test_step_batch_fills_the_token_budget():
    grpo = step_shape(_cfg("qwen3_8b_grpo", "qwen3_8b"), layout_of(_cfg("qwen3_8b_grpo", "qwen3_8b"), env={}))
    assert (grpo.rows, grpo.row_len, grpo.slots, grpo.packed) == (4, 10240, 40960, True)
    sep = _cfg("qwen3_8b_grpo_separate", "qwen3_8b")
    padded = step_shape(sep, layout_of(sep, env={}))
    assert (padded.rows, padded.row_len, padded.packed) == (1, 2048 + 16384, False)
    pp = _cfg("qwen2_5_14b_rlcsd", "qwen2_5_14b")
    assert step_shape(pp, layout_of(pp, env={})).micro_batches == 2       # the pipeline filled


@pytest.mark.parametrize("model", MODELS)
def test_oracles_agree_with_the_plans_shapes(model):
    arch = load_arch(str(FIXTURES / model))
    assert oracles.hf_param_count(str(FIXTURES / model)) == arch.total_params()
    inp = PlanInputs(tp=4, pp=1, dp=2)
    est = oracles.megatron_state_bytes(arch, padded_vocab(arch.vocab, 4), tp=4, pp=1, dp=2)
    assert est.bytes_per_param == 12
    assert abs(est.params - params_per_gpu(arch, inp).max) / est.params < 2e-4   # QK-norm, biases, norms / t


def _dry_run(config: str, *overrides: str, timeout: int = 600) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("WORLD_SIZE", None)
    return subprocess.run([sys.executable, "-m", "megatron_rl.cli", "train", "--config", config, "--dry-run",
                           *overrides], capture_output=True, text=True, timeout=timeout, cwd=ROOT, env=env, check=False)


def test_dry_run_of_an_8b_example_measures_what_plan_and_megatron_say():
    """Llama-3.1-8B DAPO at TP 4 x DP 4, 22528-token micro-batches (13 s on 2 idle cores, 43 s beside a long job:
    imports and the fake world, a log-prob pass and the update over 32 meta layers). What it measures is what
    docs/dry-run-results.json records for it, byte for byte (the record the docs' table and the plan's 10% check
    read: tests/unit/test_dry_run_table.py)."""
    from megatron_rl.trainer.dryrun.run import run
    from tests.helpers.tools import load_tool

    drt = load_tool("dry_run_table")
    # the command docs/dry-run.md gives, run as the CLI runs it (its config and overrides)
    cmd = (ROOT / "docs/dry-run.md").read_text().split("```bash\n", 1)[1].split("```", 1)[0].split()
    assert cmd[:5] == ["megatron-rl", "train", "--config", "examples/configs/llama3_1_8b_dapo.yaml", "--dry-run"], cmd
    assert cmd[5:] == drt.overrides("llama3_1_8b_dapo")
    out, results = run(str(ROOT / cmd[3]), cmd[5:])
    last = out.strip().splitlines()[-1]
    assert re.fullmatch(r"dry run: 1 rank roles, peak \d+\.\d\d GiB on rank 0 \(plan \d+\.\d\d GiB\), "
                        r"parameters 8\.030 B over all ranks", last), last
    assert "vs transformers' model 8,030,261,248: equal" in out
    for row in ("weights", "gradients (fp32 main grads)", "optimizer (fp32 master + Adam, /DP)"):
        line = next(x for x in out.splitlines() if x.strip().startswith(row))
        assert line.rstrip().endswith("+0.0%"), line          # the static state is the plan's, to the byte's 0.05%
    est = next(x for x in out.splitlines() if "Megatron-LM's estimate" in x)
    assert abs(float(re.search(r"\(([+-][\d.]+)%\)", est).group(1))) < 0.1, est
    # the update's matmul FLOPs (torch's flop registry) are Kaplan's 6·N·T to the FLOP: N this rank's weights
    # that multiply (the 2L + 1 RMSNorm weights and the embedding lookup do not), T = 22528 tokens
    r = results[0]
    n_matmul = r["params"]["local"] - 128512 * 4096 // 4 - (2 * 32 + 1) * 4096
    assert r["phases"]["update"]["flops"] == 6 * n_matmul * 22528
    assert 0 < r["phases"]["weight push"]["working"] < 5 * 2**30          # gathered tensors + two 256 MiB buckets
    now = drt.record_of("llama3_1_8b_dapo", results, 0.0)
    recorded = json.loads(drt.RECORD.read_text())["llama3_1_8b_dapo"]
    assert [{k: v for k, v in r.items()} for r in now["roles"]] == recorded["roles"], \
        "the dry run measures otherwise than docs/dry-run-results.json says: run `python tools/dry_run_table.py`"
    assert now["shape"] == recorded["shape"]


def test_dry_run_refuses_a_model_without_its_config_json(tmp_path):
    r = _dry_run("examples/configs/qwen3_8b_grpo.yaml", f"model.hf_path={tmp_path}", timeout=120)
    assert r.returncode == 2 and "config.json" in r.stderr and "tests/fixtures/hf_configs" in r.stderr, r.stderr


def test_dry_run_builds_the_lora_policy():
    """``lora.enable`` (issue 54): the dry run builds the adapters on the frozen base and the adapter-off reference
    (no second model); weights, grads and optimizer are the plan's (adapters' state only, ``planning/memory.py``),
    the base's parameters sum to transformers' count, the adapters are counted apart. ~35 s on 2 busy cores."""
    from megatron_rl.planning.arch import load_arch
    from megatron_rl.planning.memory import PlanInputs, lora_params_per_layer

    r = _dry_run("examples/configs/qwen3_8b_grpo.yaml", f"model.hf_path={FIXTURES / 'qwen3_8b'}", "lora.enable=true",
                 "model.backend=local")
    assert r.returncode == 0, r.stderr[-3000:]
    out = r.stdout
    for row in ("weights", "gradients (fp32 main grads)", "optimizer (fp32 master + Adam, /DP)"):
        line = next(x for x in out.splitlines() if x.strip().startswith(row))
        assert line.rstrip().endswith("+0.0%"), line
    ref = next(x for x in out.splitlines() if x.strip().startswith("reference weights"))
    assert ref.split()[2:4] == ["0.00", "0.00"], ref
    assert "vs transformers' model 8,190,735,360: equal" in out
    arch = load_arch(str(FIXTURES / "qwen3_8b"))
    adapters = arch.layers * lora_params_per_layer(arch, PlanInputs(tp=4, lora_rank=16))   # qwen3_8b_grpo: TP 4
    assert f"at most {adapters:,} adapter parameters on a rank" in out, out[-1500:]
