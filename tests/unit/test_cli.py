"""The `megatron-rl` console script: parsing, dispatch to the owners' mains, error messages."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from megatron_rl import cli

REPO = Path(__file__).resolve().parents[2]
EXE = Path(sys.executable).with_name("megatron-rl")


def run_cli(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    """Run the installed console script (the real entry point from setup.py)."""
    assert EXE.exists(), f"console script missing at {EXE}: pip install -e ."
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    return subprocess.run([str(EXE), *args], capture_output=True, text=True, cwd=REPO, env=env, timeout=timeout)


def test_help_lists_every_subcommand():
    p = run_cli("--help")
    assert p.returncode == 0
    for name in ("train", "demo", "eval", "convert", "plan"):
        assert f"    {name} " in p.stdout
    assert run_cli("--version").stdout.startswith("megatron-rl ")


def test_no_command_prints_help_and_fails():
    p = run_cli()
    assert p.returncode == 2 and "usage: megatron-rl" in p.stdout


def test_plan_prints_table():
    p = run_cli("plan", "--model", "qwen3-8b", "--tp", "2", "--pp", "1", "--dp", "4", "--micro-batch", "1",
                "--seq-len", "8192", "--rollout-tp", "2", "--offload", "optimizer")
    assert p.returncode == 0, p.stderr
    assert "layout TP=2 PP=1 DP=4 (8 GPUs)" in p.stdout and "PEAK per GPU" in p.stdout


def test_plan_exits_non_zero_when_the_layout_does_not_fit(capsys):
    """The table is printed either way; a layout over --gpu-mem-gib is refused: exit 2, one stderr line."""
    assert cli.main(["plan", "--model", "qwen3-8b", "--tp", "2", "--dp", "4", "--seq-len", "8192"]) == 2
    out, err = capsys.readouterr()
    assert "DOES NOT FIT in 78 GiB" in out
    assert err.strip().startswith("megatron-rl plan: error: the layout does not fit: peak 125.59 GiB per GPU > "
                                  "--gpu-mem-gib 78") and len(err.strip().splitlines()) == 1


def test_plan_bad_layout_is_one_clear_line():
    p = run_cli("plan", "--model", "qwen3-8b", "--tp", "3")
    assert p.returncode == 2
    assert p.stderr.strip().splitlines()[-1].startswith(
        "megatron-rl plan: error: ValueError: qwen3-8b: num_attention_heads=32 is not divisible by tp=3")
    assert "Traceback" not in p.stderr
    p = run_cli("--debug", "plan", "--model", "qwen3-8b", "--tp", "3")
    assert p.returncode == 2 and "Traceback" in p.stderr


def test_train_errors(tmp_path):
    p = run_cli("train", "--config", str(tmp_path / "missing.yaml"))
    assert p.returncode == 2 and f"config file not found: {tmp_path / 'missing.yaml'}" in p.stderr
    p = run_cli("train", "--config", "x.yaml", "trainer.steps")
    assert p.returncode == 2 and "override 'trainer.steps' is not of the form section.key=value" in p.stderr
    p = run_cli("train", "algo.kind=grpo")
    assert p.returncode == 2 and "the following arguments are required: --config" in p.stderr


def test_parse_train_and_passthrough():
    c = cli.parse_command(["train", "--config", "a.yaml", "algo.kind=dapo", "trainer.lr=1e-6", "--resume", "auto"])
    assert c.command == "train" and c.args.overrides == ["algo.kind=dapo", "trainer.lr=1e-6"]
    assert c.args.resume == "auto" and c.rest == []
    assert cli.parse_command(["train", "--config", "a.yaml", "--resume", "none"]).args.resume is None
    assert cli.parse_command(["train", "--config", "a.yaml"]).args.resume is None
    c = cli.parse_command(["--debug", "convert", "hf-to-mcore", "--hf", "d", "--out", "o", "--tp", "2", "--help"])
    assert (c.command, c.args.debug, c.rest) == ("convert", True, ["hf-to-mcore", "--hf", "d", "--out", "o", "--tp", "2", "--help"])
    c = cli.parse_command(["demo", "--algo", "grpo"])
    assert (c.command, c.rest) == ("demo", ["--algo", "grpo"])


def test_missing_owner_module_is_a_clear_error(monkeypatch, capsys):
    monkeypatch.setitem(cli.PASSTHROUGH, "eval", ("megatron_rl.no_such_module:main", "megatron_rl.cli.plan:no_such_fn"))
    assert cli.main(["eval", "--x"]) == 2
    err = capsys.readouterr().err
    assert "megatron-rl eval: error: this installation has no implementation of 'eval'" in err
    assert "megatron_rl.no_such_module:main, megatron_rl.cli.plan:no_such_fn" in err


def test_passthrough_dispatch_calls_owner_main(monkeypatch, capsys):
    """Dispatch goes to the listed module:function with the untouched argv (here: plan's own main)."""
    monkeypatch.setitem(cli.PASSTHROUGH, "eval", ("megatron_rl.cli.plan:main",))
    assert cli.main(["eval", "--model", "qwen3-1.7b", "--seq-len", "512"]) == 0
    assert "model qwen3-1.7b: 1.721 B params" in capsys.readouterr().out


@pytest.mark.parametrize("command", ["convert", "demo", "eval"])
def test_passthrough_help_is_the_owners_help(command):
    assert callable(cli.resolve_main(command))   # no skip: a CliError here is a lost main(argv)
    p = run_cli(command, "--help")
    assert p.returncode == 0, p.stderr
    assert "usage:" in p.stdout


def _stand_in_model(tmp_path: Path) -> Path:
    import json

    d = tmp_path / "model"
    d.mkdir()
    (d / "config.json").write_text(json.dumps(dict(
        architectures=["Qwen3ForCausalLM"], model_type="qwen3", hidden_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=32, intermediate_size=512, vocab_size=32,
        tie_word_embeddings=True)))
    from tests.helpers.tiny_model import add_char_tokenizer

    return add_char_tokenizer(d)   # preflight tokenises the prompt file


def test_train_check_loads_config_with_overrides(tmp_path):
    """`train --check` goes through the real load_config: overrides applied, config printed as YAML."""
    import yaml

    model = _stand_in_model(tmp_path)
    import pyarrow as pa
    import pyarrow.parquet as pq

    row = {"data_source": "reverse", "prompt": [{"role": "user", "content": "12"}], "reward_model": {"ground_truth": "21"}}
    pq.write_table(pa.Table.from_pylist([row] * 32), tmp_path / "train.parquet")   # >= data.prompts_per_step rows
    p = run_cli("train", "--config", "examples/configs/tiny_cpu_grpo.yaml", f"model.hf_path={model}",
                f"data.train={tmp_path / 'train.parquet'}", "data.val=", f"trainer.run_dir={tmp_path / 'run'}",
                "trainer.steps=7", "algo.kind=dapo", "algo.dapo.overlong_buffer_len=2", "--check")
    assert p.returncode == 0, p.stderr
    head, _, body = p.stdout.partition("\n")
    assert head == "config OK: examples/configs/tiny_cpu_grpo.yaml with 7 override(s)"
    tree = yaml.safe_load(body)
    assert tree["trainer"]["steps"] == 7 and tree["algo"]["kind"] == "dapo" and "dapo" in tree["algo"]


def test_train_bad_config_key_is_one_clear_line(tmp_path):
    model = _stand_in_model(tmp_path)
    p = run_cli("train", "--config", "examples/configs/tiny_cpu_grpo.yaml", f"model.hf_path={model}",
                "trainer.stepz=3", "--check")
    assert p.returncode == 2 and "Traceback" not in p.stderr
    last = p.stderr.strip().splitlines()[-1]
    assert last.startswith("megatron-rl train: error: ValueError: trainer: unknown key(s) ['stepz']"), last
    p = run_cli("train", "--config", "examples/configs/tiny_cpu_grpo.yaml", f"model.hf_path={model}",
                "parallel.tp=3", "--check")
    assert p.returncode == 2 and "not divisible by tensor parallel size 3" in p.stderr
