"""`megatron-rl plan --config`: every 7B–14B example fits 78 GiB (usable of 80) as configured (its placement, offload
and engines read from the config), the layout table of docs/plan-and-memory.md is the generated one, contradicting
flags are refused, and the phases follow the placement/offload model of ``planning/memory.py``."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from megatron_rl.cli.plan import format_report
from megatron_rl.planning.memory import GIB, fits
from tests.helpers.tools import load_tool

EP = load_tool("example_plans")

REPO = Path(__file__).resolve().parents[2]
LARGE = sorted(p for p in EP.CONFIGS.glob("*.yaml") if not p.stem.startswith("tiny_cpu_"))


def _expected_placement(path: Path, cfg) -> str:
    """The config's rollout.placement, which its header's layout line states too."""
    layout = re.search(r"^# layout: .*$", path.read_text(), re.MULTILINE).group(0)
    assert ("separate" if "(separate)" in layout else "colocated") == cfg.rollout.placement, path.name
    return cfg.rollout.placement


@pytest.mark.parametrize("path", LARGE, ids=[p.stem for p in LARGE])
def test_example_fits_as_configured(path):
    """The header's plan line names this config and plans what it configures: a layout that does not
    fit 78 GiB, or a plan of another placement/offload/layout than the config's, fails here."""
    from megatron_rl.recipes import load

    line = EP.header_plan_line(path)
    assert line and f"--config examples/configs/{path.name} " in line, f"{path.name}: plan line must use --config"
    cfg = load(path.stem)
    rep = EP.example_report(path)
    i = rep.inputs
    assert fits(rep), f"{path.name} does not fit as configured:\n{format_report(rep)}"
    assert ("colocated" if i.colocated else "separate") == _expected_placement(path, cfg)
    assert (i.tp, i.pp, i.offload, i.rollout_engines) == (cfg.parallel.tp, cfg.parallel.pp, cfg.trainer.offload,
                                                          cfg.rollout.num_engines)
    assert i.seq_len == cfg.data.max_prompt_len + cfg.rollout.max_tokens
    budget = cfg.trainer.max_tokens_per_micro_batch      # the token budget is what the activations are planned for
    assert (i.max_tokens_per_micro_batch, i.max_model_len) == (budget, cfg.rollout.max_model_len)
    assert i.micro_batch_tokens == (budget or cfg.trainer.rows_per_micro_batch * i.seq_len)
    assert i.micro_batch == (None if budget else cfg.trainer.rows_per_micro_batch)
    world = int(re.search(r"^# layout: TP=\d+ PP=\d+ DP=\d+ \((\d+) GPUs\)", path.read_text(), re.MULTILINE).group(1))
    assert i.tp * i.pp * i.dp == world, f"{path.name}: header layout vs plan --dp"


@pytest.mark.parametrize("path", LARGE, ids=[p.stem for p in LARGE])
def test_example_plan_counts_what_the_config_builds(path):
    """The plan of every 7B-14B example counts what its config builds (the reference when the method's KL
    needs one, the teacher's fp32 snapshot / EMA shadow, the engines' TP and memory share, recompute, the
    fused SwiGLU of a GPU build) against 78 GiB usable, and the header states those figures (pinned)."""
    from megatron_rl.algorithms import kind_required_inputs
    from megatron_rl.algorithms.hparams import TeacherHParams
    from megatron_rl.recipes import load
    from megatron_rl.rollout.placement import engine_memory_utilization

    cfg, rep = load(path.stem), EP.example_report(path)
    i = rep.inputs
    # LoRA: the reference is the policy with its adapters off (no copy); the adapters' state is planned instead
    assert i.reference == ("ref_logp" in kind_required_inputs(cfg.algo.kind, cfg.algo.hparams) and not cfg.lora.enable)
    assert (i.lora_rank, i.lora_targets if cfg.lora.enable else ()) == \
        ((cfg.lora.rank, tuple(cfg.lora.target_modules)) if cfg.lora.enable else (0, ()))
    hp = cfg.algo.hparams
    assert i.teacher_shadow == (isinstance(hp, TeacherHParams) and hp.teacher_mode in ("snapshot", "ema"))
    assert (i.rollout_tp, i.rollout_mem_util) == (cfg.rollout.tensor_parallel_size, engine_memory_utilization(
        cfg.rollout.gpu_memory_utilization, cfg.rollout.placement))
    assert (i.recompute, i.recompute_method, i.recompute_num_layers) == (cfg.model.recompute, cfg.model.recompute_method,
                                                                        cfg.model.recompute_num_layers)
    assert i.fused_swiglu and i.gpu_mem_gib == 78 and i.extra_weight_copies == 0   # copies come from the config
    n = rep.params.max if rep.stage == "only" else (rep.params.first_stage if rep.stage == "first" else rep.params.last_stage)
    assert rep.extra_copies == (i.reference * 2 + i.teacher_shadow * (4 + 2)) * n       # bf16 + fp32 shadow
    assert EP.header_figures(path) == EP.figures_line(rep), f"{path.name}: header plan figures are stale"


def test_eight_b_flagships_use_peer_layouts():
    """8B recipes with the 40960-token budget: TP 4 with full recompute (not TP 8, DP 1); engines of TP 2."""
    from megatron_rl.recipes import load

    for path in LARGE:
        cfg = load(path.stem)
        if path.stem.startswith("qwen3_8b") and cfg.trainer.max_tokens_per_micro_batch == 40960:
            assert (cfg.parallel.tp, cfg.model.recompute, cfg.rollout.tensor_parallel_size) == (4, "full", 2), path.name


def test_a_separate_8_gpu_example_fits_without_sleep():
    seps = [p for p in LARGE if not EP.example_report(p).inputs.colocated]
    assert seps, "no separate-placement example"
    for p in seps:
        rep = EP.example_report(p)
        i = rep.inputs
        assert i.tp * i.pp * i.dp + i.rollout_engines * i.rollout_tp == 8, p.name
        assert i.offload == "none" and rep.peak == max(rep.train_total, rep.rollout_total) <= 80 * GIB


def test_readme_layout_table_is_the_generated_one():
    m = re.search(r"<!-- layout-table:start -->\n(.*?)<!-- layout-table:end -->", (REPO / "docs" / "plan-and-memory.md").read_text(),
                  re.DOTALL)
    assert m, "docs/plan-and-memory.md lacks the layout table markers"
    assert m.group(1) == EP.layout_table(), "docs/plan-and-memory.md layout table is stale: paste `python tools/example_plans.py`"
    assert "| NO |" not in m.group(1)


def test_flag_contradicting_the_config_is_one_line(capsys):
    from megatron_rl import cli

    cfg = str(EP.CONFIGS / "qwen3_8b_grpo.yaml")
    rc = cli.main(["plan", "--config", cfg, "--model", "qwen3-8b", "--dp", "1", "--tp", "2"])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and len(err.splitlines()) == 1, err
    assert "--tp=2 contradicts parallel.tp of" in err and "(4)" in err
    rc = cli.main(["plan", "--config", cfg, "--model", "qwen3-8b", "--dp", "1", "--offload", "all"])
    assert rc == 2 and "--offload=all contradicts trainer.offload" in capsys.readouterr().err
    # a flag that agrees with the config is fine; the config's offload is what is planned
    assert cli.main(["plan", "--config", cfg, "--model", "qwen3-8b", "--dp", "2", "--tp", "4", "--rollout-seqs", "16",
                     "--max-tokens-per-micro-batch", "40960"]) == 0
    out = capsys.readouterr().out
    assert "trainer resident (offload optimizer)" in out and "colocated: max(update, generation)" in out


def test_plan_config_of_a_packed_and_a_padded_config(capsys):
    """Both kinds of configs plan: the report names the micro-batch it planned."""
    from megatron_rl import cli

    for name, dp, want in (("qwen3_8b_grpo", "1", "micro-batch 40960 tokens (packed), seq 18432, bf16"),
                           ("qwen3_8b_grpo_separate", "1", "micro-batch 1 x 18432 (padded), bf16")):
        rc = cli.main(["plan", "--config", str(EP.CONFIGS / f"{name}.yaml"), "--model", "qwen3-8b", "--dp", dp,
                       "--rollout-seqs", "16"])
        out = capsys.readouterr().out
        assert rc == 0 and want in out, out


@pytest.mark.parametrize("flags,want", [
    (["--micro-batch", "2"], "--micro-batch=2 contradicts trainer.micro_batch_size of {cfg} (null)"),
    (["--max-tokens-per-micro-batch", "20000"],
     "--max-tokens-per-micro-batch=20000 contradicts trainer.max_tokens_per_micro_batch of {cfg} (40960)"),
    (["--max-model-len", "50000"], "--max-model-len=50000 contradicts rollout.max_model_len of {cfg} (40960)"),
], ids=["micro-batch", "budget", "max-model-len"])
def test_micro_batch_flags_contradicting_a_budget_config(flags, want, capsys):
    from megatron_rl import cli

    cfg = str(EP.CONFIGS / "qwen3_8b_grpo.yaml")
    rc = cli.main(["plan", "--config", cfg, "--model", "qwen3-8b", "--dp", "1", *flags])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and len(err.splitlines()) == 1 and want.format(cfg=cfg) in err, err


def test_config_budget_below_max_model_len_is_one_line(tmp_path, capsys):
    """plan --config refuses a budget a single sequence does not fit, as config validation does."""
    from megatron_rl import cli

    text = (EP.CONFIGS / "qwen3_8b_grpo.yaml").read_text()
    assert "  max_tokens_per_micro_batch: 40960" in text
    bad = tmp_path / "small_budget.yaml"
    bad.write_text(text.replace("  max_tokens_per_micro_batch: 40960", "  max_tokens_per_micro_batch: 20000"))
    rc = cli.main(["plan", "--config", str(bad), "--model", "qwen3-8b", "--dp", "1"])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and len(err.splitlines()) == 1, err
    assert "trainer.max_tokens_per_micro_batch=20000 is below rollout.max_model_len=40960" in err
