"""Issue 24, "a run that explains itself" and "nothing overwritten", through the real entry point
(``megatron_rl.cli.main`` in-process; ``train --check`` runs the start-up checks of ``setup_run``
without starting anything): ``run_dir/config.yaml`` and the ``--resume`` comparison, ``--resume auto``
starting fresh, ``--print-config``, ``keep_last=0``, the OPSD-family reference-solution check, and
``eval --out`` / ``demo --run-dir`` refusing what they did not write. Real files throughout.

The config.yaml of a real start (and the warning of a real resume) is asserted in
``tests/e2e/test_quickstart.py``, whose docs/getting-started.md commands start and resume a run.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from megatron_rl import cli
from tests.helpers.tiny_model import add_char_tokenizer

REPO = Path(__file__).resolve().parents[2]
TINY = REPO / "examples" / "configs" / "tiny_cpu_grpo.yaml"
TINY_HF = {"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "hidden_size": 128, "num_hidden_layers": 2,
           "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 32, "intermediate_size": 512,
           "vocab_size": 32, "tie_word_embeddings": True, "max_position_embeddings": 128}


def _parquet(path: Path, extra_info: dict | None = None) -> Path:
    import pyarrow as pa
    import pyarrow.parquet as pq

    row = {"data_source": "reverse", "prompt": [{"role": "user", "content": "12"}], "reward_model": {"ground_truth": "21"}}
    if extra_info is not None:
        row["extra_info"] = extra_info
    pq.write_table(pa.Table.from_pylist([row] * 64), path)   # >= data.prompts_per_step (a start-up check)
    return path


@pytest.fixture
def work(tmp_path) -> Path:
    for name, hidden in (("model", 128), ("model2", 256)):
        (tmp_path / name).mkdir()
        (tmp_path / name / "config.json").write_text(json.dumps({**TINY_HF, "hidden_size": hidden}))
        add_char_tokenizer(tmp_path / name)   # preflight tokenises the prompt file
    _parquet(tmp_path / "train.parquet")
    return tmp_path


def _base(work: Path, run: str = "run") -> list[str]:
    return [f"model.hf_path={work / 'model'}", f"data.train={work / 'train.parquet'}", "data.val=",
            f"trainer.run_dir={work / run}"]


def _train(work: Path, *args: str, run: str = "run", capsys) -> tuple[int, str, str]:
    given = {a.split("=", 1)[0] for a in args if "=" in a}
    argv = ["train", "--config", str(TINY), *(b for b in _base(work, run) if b.split("=", 1)[0] not in given), *args,
            "--check"]
    try:
        rc = cli.main(argv)
    except SystemExit as e:
        rc = e.code
    out = capsys.readouterr()
    return rc, out.out, out.err


def _lines(text: str) -> list[str]:
    return [ln for ln in text.splitlines() if ln.strip()]


def _started_run(work: Path, *overrides: str, run: str = "run") -> Path:
    """A run dir as a start leaves it: config.yaml (written by the code a start runs) + a checkpoint."""
    from megatron_rl.config import load_config
    from megatron_rl.trainer.state.run_config import save_run_config

    cfg = load_config(TINY, [*_base(work, run), *overrides])
    ck = Path(cfg.trainer.run_dir) / "checkpoints" / "step_2"
    ck.mkdir(parents=True)
    (ck / "COMPLETE").write_text(json.dumps({"step": 2}))
    save_run_config(cfg)
    return Path(cfg.trainer.run_dir)


def _snapshot(d: Path) -> dict:
    return {str(p.relative_to(d)): p.read_bytes() for p in sorted(d.rglob("*")) if p.is_file()}


# ------------------------------------------------------------------------------ config.yaml


def test_config_yaml_is_loadable_records_the_package_and_never_overwrites(work):
    from megatron_rl import __version__
    from megatron_rl.config import load_config
    from megatron_rl.trainer.state.run_config import save_run_config
    from megatron_rl.trainer.state.run_dir import archive_run

    cfg = load_config(TINY, _base(work))
    first = save_run_config(cfg)
    run = work / "run"
    assert first == run / "config.yaml"
    assert load_config(first) == cfg                                     # _meta ignored by the loader
    meta = yaml.safe_load(first.read_text())["_meta"]
    assert meta["version"] == __version__ and meta["git_commit"]        # this checkout is a git worktree
    assert meta["architecture"]["hidden_size"] == 128
    assert save_run_config(cfg) is None                                  # identical restart: nothing new
    changed = load_config(TINY, [*_base(work), "trainer.steps=9"])
    assert save_run_config(changed) == run / "config.1.yaml"
    assert load_config(run / "config.yaml") == cfg and load_config(run / "config.1.yaml") == changed
    (run / "samples.jsonl").write_text("{}\n")                          # logging.dump_samples appends to it
    dest = archive_run(run)                                              # --overwrite archives them
    assert sorted(p.name for p in dest.iterdir()) == ["config.1.yaml", "config.yaml", "samples.jsonl"]
    assert not list(run.glob("config*.yaml"))


# ------------------------------------------------------------------------------ --resume comparison


def test_resume_with_an_unchanged_config_is_silent(work, capsys):
    _started_run(work)
    rc, out, err = _train(work, "--resume", "auto", capsys=capsys)
    assert rc == 0 and err == "" and "config OK" in out


def test_resume_warns_listing_each_changed_key(work, capsys):
    run = _started_run(work)
    before = _snapshot(run)
    rc, _, err = _train(work, "optim.lr=0.001", "trainer.steps=9", "--resume", "auto", capsys=capsys)
    assert rc == 0 and len(_lines(err)) == 1, err
    assert "warning: resuming with a changed configuration" in err
    assert "optim.lr: 0.0003 -> 0.001" in err and "trainer.steps: 100 -> 9" in err
    assert _snapshot(run) == before                                      # --check writes nothing


@pytest.mark.parametrize(("override", "keys"), [
    ("algo.kind=rloo", ["algo.kind: 'grpo' -> 'rloo'"]),
    ("rollout.n=4", ["rollout.n: 8 -> 4"]),
    ("model.hf_path={W}/model2", ["model.architecture.hidden_size: 128 -> 256", "model.hf_path: "]),
], ids=["method", "group-size", "model"])
def test_resume_refuses_a_changed_method_group_size_or_model(work, capsys, override, keys):
    run = _started_run(work)
    before = _snapshot(run)
    o = override.replace("{W}", str(work))
    rc, _, err = _train(work, o, "--resume", "auto", capsys=capsys)
    lines = _lines(err)
    assert rc not in (0, None) and len(lines) == 1 and "Traceback" not in err, err
    assert all(k in lines[0] for k in keys) and "--allow-config-change" in lines[0], lines[0]
    rc, _, err = _train(work, o, "--resume", "auto", "--allow-config-change", capsys=capsys)
    assert rc == 0 and "warning: resuming with a changed configuration" in err and keys[0] in err
    assert _snapshot(run) == before


def test_resume_path_compares_with_that_checkpoints_run(work, capsys):
    run = _started_run(work, run="other")
    rc, _, err = _train(work, "rollout.n=4", "--resume", str(run / "checkpoints" / "step_2"), capsys=capsys)
    assert rc not in (0, None) and "rollout.n: 8 -> 4" in err and str(run / "config.yaml") in err


def test_resume_of_a_run_dir_without_config_yaml_warns(work, capsys):
    run = _started_run(work)
    (run / "config.yaml").unlink()                                       # a run from before config.yaml
    rc, _, err = _train(work, "--resume", "auto", capsys=capsys)
    assert rc == 0 and len(_lines(err)) == 1 and "has no config.yaml" in err, err


def test_resume_auto_without_a_checkpoint_says_it_starts_fresh(work, capsys):
    rc, out, err = _train(work, "--resume", "auto", capsys=capsys)
    assert rc == 0 and err == ""
    assert "--resume auto: no complete checkpoint in" in out and "starting a fresh run" in out


# ------------------------------------------------------------------------------ --print-config, keep_last


def test_print_config_lists_every_key_with_default_and_description(tmp_path, capsys):
    import dataclasses

    from megatron_rl.algorithms import ALGO_KINDS
    from megatron_rl.config import Config, load_config

    assert cli.main(["train", "--print-config", "--algo", "opsd"]) == 0
    text = capsys.readouterr().out
    lines = text.splitlines()
    keys = [i for i, ln in enumerate(lines) if ln.strip() and not ln.lstrip().startswith("#") and not ln.endswith(":")]
    assert len(keys) > 90
    assert all(lines[i - 1].lstrip().startswith("#") and len(lines[i - 1].strip()) > 2 for i in keys), \
        [lines[i] for i in keys if not lines[i - 1].lstrip().startswith("#")]
    assert "  # Complete checkpoints kept" in text and "0 = keep all" in text
    (tmp_path / "c.yaml").write_text(text)                               # the output is a loadable config
    cfg = load_config(tmp_path / "c.yaml")
    assert cfg.algo.kind == "opsd" and cfg.algo.hparams == ALGO_KINDS["opsd"].hparams()
    assert all(getattr(cfg, f.name) == getattr(Config(), f.name) for f in dataclasses.fields(Config) if f.name != "algo")


def test_train_without_config_or_print_config_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as e:
        cli.main(["train"])
    err = capsys.readouterr().err
    assert e.value.code == 2 and len(_lines(err)) == 1 and "--config (or --print-config)" in err
    rc = cli.main(["train", "--print-config", "--algo", "ppo"])
    err = capsys.readouterr().err
    assert rc not in (0, None) and len(_lines(err)) == 1 and "--algo 'ppo': unknown method" in err


def test_keep_last_zero_keeps_every_checkpoint_and_is_documented(tmp_path):
    from megatron_rl.trainer.state.checkpoint import _prune

    for s in (1, 2, 3):
        (tmp_path / f"step_{s}").mkdir()
        (tmp_path / f"step_{s}" / "COMPLETE").write_text("{}")
    _prune(tmp_path, 0)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step_1", "step_2", "step_3"]
    _prune(tmp_path, 1)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step_3"]
    from tests.helpers.tools import load_tool

    docs_reference = load_tool("docs_reference")   # the generated config reference (docs/reference/config.md)

    assert "0 = keep all" in next(doc for key, _, doc in docs_reference.config_rows() if key == "trainer.keep_last")


# ------------------------------------------------------------------------------ OPSD family: reference solutions


def test_gt_teacher_on_rows_without_a_solution_is_a_start_up_error(work, capsys):
    opsd = ["algo.kind=opsd", "teacher.template=chat", "algo.opsd.top_k=8"]
    rc, _, err = _train(work, *opsd, capsys=capsys)
    lines = _lines(err)
    assert rc not in (0, None) and len(lines) == 1, err
    assert f"data.train={work / 'train.parquet'}: 64 of 64 rows have no extra_info.solution" in lines[0]
    assert "algo.kind=opsd" in lines[0]
    _parquet(work / "sol.parquet", {"reference_solution": "reverse 12 -> 21"})
    rc, _, err = _train(work, *opsd, f"data.train={work / 'sol.parquet'}", capsys=capsys)
    assert rc == 0, err
    rc, _, err = _train(work, *opsd[:1], "teacher.template=inline", "algo.opsd.top_k=8", capsys=capsys)
    assert rc == 0, err                                                  # inline shows the answer only
    # asked of the path, not of a list of names: rlcsd needs it only when its positive hint is the solution
    assert _train(work, "algo.kind=rlcsd", "teacher.template=chat", capsys=capsys)[0] == 0
    rc, _, err = _train(work, "algo.kind=rlcsd", "teacher.template=chat", "algo.rlcsd.source=gt_cot", capsys=capsys)
    assert rc not in (0, None) and "extra_info.solution" in err


# ------------------------------------------------------------------------------ nothing overwritten


def _eval(work: Path, out: Path, *extra: str, capsys) -> tuple[int, str]:
    (work / "c.jsonl").write_text("".join(f'{{"index": {i}, "response": "21"}}\n' for i in range(64)))
    rc = cli.main(["eval", "--data", str(work / "train.parquet"), "--completions", str(work / "c.jsonl"),
                   "--out", str(out), *extra])
    return rc, capsys.readouterr().err


def test_eval_out_follows_converts_rule(work, capsys):
    user = work / "mine"
    user.mkdir()
    (user / "summary.json").write_text("my numbers")
    rc, err = _eval(work, user, "--force", capsys=capsys)
    assert rc not in (0, None) and len(_lines(err)) == 1 and "is not an eval output of megatron-rl" in err
    assert sorted(p.name for p in user.iterdir()) == ["summary.json"] and (user / "summary.json").read_text() == "my numbers"

    out = work / "e"
    assert _eval(work, out, capsys=capsys)[0] == 0                      # new dir: written, with the marker
    assert (out / "megatron_rl_eval.json").is_file() and json.loads((out / "summary.json").read_text())["rows"] == 64
    before = _snapshot(out)
    rc, err = _eval(work, out, capsys=capsys)
    assert rc not in (0, None) and len(_lines(err)) == 1 and "pass --force to replace it" in err
    assert _snapshot(out) == before
    assert _eval(work, out, "--force", capsys=capsys)[0] == 0           # our own output: replaced with --force
    (out / "notes.txt").write_text("mine")
    rc, err = _eval(work, out, "--force", capsys=capsys)
    assert rc not in (0, None) and "plus other files (notes.txt)" in err and (out / "notes.txt").read_text() == "mine"


def test_demo_refuses_a_run_dir_with_user_files(work, capsys):
    user = work / "thesis"
    user.mkdir()
    (user / "thesis.tex").write_text("keep me")
    rc = cli.main(["demo", "--run-dir", str(user)])
    err = capsys.readouterr().err
    assert rc not in (0, None) and len(_lines(err)) == 1 and "holds files the demo did not write (thesis.tex)" in err
    assert sorted(p.name for p in user.iterdir()) == ["thesis.tex"]


def test_resume_at_another_vpp_is_refused_whatever_the_flag(work):
    """A checkpoint holds one set of model chunks per virtual stage and loads at the vpp it was written with
    only (``ParallelConfig.vpp``): a resume at another ``parallel.vpp`` failed after start-up; the start-up
    rule now refuses it in one line naming both values, ``--allow-config-change`` included."""
    from megatron_rl.config import load_config
    from megatron_rl.trainer.state.run_config import check_resume

    _started_run(work, "parallel.pp=2", "parallel.vpp=2")
    cfg = load_config(TINY, [*_base(work), "parallel.pp=2"])
    for allow in (False, True):
        with pytest.raises(ValueError, match=r"saved at parallel.vpp=2 .* asks for parallel.vpp=1: .* set parallel.vpp=2"):
            check_resume(cfg, "auto", allow)
