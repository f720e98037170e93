"""``megatron-rl data prepare`` as a command: ``--out`` safety (as ``convert``), atomic writes, shards,
the manifest (hashes, counts, command), ``--strict``, one-line errors, the progress bar on large inputs."""
from __future__ import annotations

import hashlib
import json

import pytest

from megatron_rl.data.cli import main
from megatron_rl.data.prepare import pipeline
from tests.helpers.prepare import run, write_jsonl, write_parquet


def gsm(i: int, ans: str | None = None) -> dict:
    return {"question": f"Question number {i}?", "answer": f"work\n#### {i if ans is None else ans}"}


def test_cli_writes_manifest_with_hashes_counts_and_command(tmp_path, capsys):
    src = write_jsonl(tmp_path / "gsm8k.jsonl", [gsm(1), gsm(2), gsm(3, ans="x"), gsm(1)])
    out = tmp_path / "data" / "gsm8k"
    argv = ["prepare", "gsm8k", "--in", str(src), "--out", str(out)]
    assert main(argv) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "gsm8k: read 4 rows, wrote 2 (test 2); skipped 1 bad rows (1 unparsable answer); left out 1 (1 duplicate problem)"
    man = json.loads((out / "manifest.json").read_text())
    assert man["command"] == "megatron-rl data " + " ".join(argv)
    assert man["inputs"] == [{"path": str(src.resolve()), "sha256": hashlib.sha256(src.read_bytes()).hexdigest()}]
    assert man["outputs"]["test"] == {"file": "test.parquet", "rows": 2,
                                      "sha256": hashlib.sha256((out / "test.parquet").read_bytes()).hexdigest()}
    assert sorted(p.name for p in out.iterdir()) == ["manifest.json", "test.parquet"]
    assert not [p for p in out.parent.iterdir() if p.name.startswith(".")]       # no temp dir left


def test_out_safety_as_convert(tmp_path, capsys):
    src = write_jsonl(tmp_path / "g.jsonl", [gsm(1)])
    out = tmp_path / "out"
    assert main(["prepare", "gsm8k", "--in", str(src), "--out", str(out)]) == 0
    before = (out / "test.parquet").read_bytes()
    assert main(["prepare", "gsm8k", "--in", str(src), "--out", str(out)]) == 2
    assert "pass --force" in capsys.readouterr().err
    write_jsonl(src, [gsm(1), gsm(2)])
    assert main(["prepare", "gsm8k", "--in", str(src), "--out", str(out), "--force"]) == 0
    assert (out / "test.parquet").read_bytes() != before
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("mine")
    for extra in ([], ["--force"]):
        assert main(["prepare", "gsm8k", "--in", str(src), "--out", str(foreign), *extra]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "not empty (notes.txt)" in err
    assert (foreign / "notes.txt").read_text() == "mine"
    (tmp_path / "file").write_text("x")
    assert main(["prepare", "gsm8k", "--in", str(src), "--out", str(tmp_path / "file")]) == 2


def test_failed_run_leaves_the_old_output(tmp_path, capsys):
    src = write_jsonl(tmp_path / "g.jsonl", [gsm(1)])
    out = tmp_path / "out"
    assert main(["prepare", "gsm8k", "--in", str(src), "--out", str(out)]) == 0
    before = sorted((p.name, p.read_bytes()) for p in out.iterdir())
    write_jsonl(src, [gsm(1, ans="none")])
    assert main(["prepare", "gsm8k", "--in", str(src), "--out", str(out), "--force"]) == 2
    assert "no usable rows in" in capsys.readouterr().err
    assert sorted((p.name, p.read_bytes()) for p in out.iterdir()) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["g.jsonl", "out"]


def test_strict_refuses_naming_the_row(tmp_path, capsys):
    src = write_parquet(tmp_path / "s.parquet", [gsm(1), {"question": "", "answer": "#### 2"}])
    assert main(["prepare", "gsm8k", "--in", str(src), "--out", str(tmp_path / "o"), "--strict"]) == 2
    err = capsys.readouterr().err
    assert err == "megatron-rl data prepare: error: s.parquet:1: null or empty question (--strict refuses bad rows; drop --strict to skip and count them)\n"
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("argv,msg", [
    (["prepare", "nosuch", "--in", "x", "--out", "o"], "unknown data source 'nosuch'"),
    (["prepare", "gsm8k", "--in", "/no/such/file.jsonl", "--out", "o"], "no such file or directory"),
    (["prepare", "gsm8k", "--in", "a.jsonl", "--in", "b.jsonl", "--out", "o"], "give exactly one --in PATH"),
    (["prepare", "gsm8k", "--in", "README.md", "--out", "o"], "not a parquet or JSONL file"),
])
def test_bad_arguments_are_one_line(argv, msg, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "README.md").write_text("x")
    for n in ("a", "b"):
        write_jsonl(tmp_path / f"{n}.jsonl", [gsm(1)])
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and msg in err, err


def test_directory_of_shards_in_name_order(tmp_path):
    d = tmp_path / "gsm8k" / "main"
    write_parquet(d / "test-00001-of-00002.parquet", [gsm(3), gsm(4)])
    write_parquet(d / "test-00000-of-00002.parquet", [gsm(1), gsm(2)])
    write_jsonl(d / "extra" / "more.jsonl", [gsm(5)])
    write_jsonl(d / ".cache" / "stale.jsonl", [gsm(9)])
    man, rows = run("gsm8k", tmp_path / "gsm8k", tmp_path / "out")
    assert [r["reward_model"]["ground_truth"] for r in rows["test"]] == ["5", "1", "2", "3", "4"]
    assert len(man["inputs"]) == 3


def test_progress_bar_on_large_inputs(tmp_path, capsys):
    n = pipeline.PROGRESS_ROWS + 1
    src = tmp_path / "big.jsonl"
    src.write_text("".join(json.dumps(gsm(i)) + "\n" for i in range(n)))
    man, _ = run("gsm8k", src, tmp_path / "out")
    assert man["outputs"]["test"]["rows"] == n
    assert "prepare gsm8k: 100%" in capsys.readouterr().err
    run("gsm8k", write_jsonl(tmp_path / "small.jsonl", [gsm(1)]), tmp_path / "out2")
    assert "prepare gsm8k" not in capsys.readouterr().err


def test_example_configs_name_prepared_paths_and_the_command_that_makes_them():
    """Every ``data/<name>/<split>.parquet`` an example config names is what ``data prepare <name>``
    writes, and the config carries that command (which the ``data`` parser accepts) with ``--out data/<name>``."""
    import re
    import shlex
    from pathlib import Path

    from megatron_rl.data.cli import build_parser
    from megatron_rl.data.prepare.registry import get_source

    configs = sorted((Path(__file__).resolve().parents[3] / "examples" / "configs").glob("*.yaml"))
    named = 0
    for path in configs:
        text = path.read_text()
        commands = {}
        for line in re.findall(r"^#\s+(megatron-rl data prepare .*)$", text, re.M):
            args = build_parser().parse_args(shlex.split(line.split("   #")[0])[2:])
            commands[args.source] = args
        for name, split in re.findall(r"^\s+(?:train|val):\s+data/(\w+)/(\w+)\.parquet", text, re.M):
            named += 1
            assert get_source(name).split == split, f"{path.name}: data prepare {name} writes {get_source(name).split}.parquet"
            assert name in commands and commands[name].out == f"data/{name}", f"{path.name}: no command line for data/{name}"
    assert named >= 20
