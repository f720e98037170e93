"""Bad inputs to ``megatron-rl data prepare``, ``data generate kk`` and ``eval --benchmarks`` (issue 45,
the fourth first-hour report; the sibling of ``test_bad_inputs.py``): each gets exit 2, ONE stderr line
naming the file / option / value, and nothing on disk changes (nothing outside ``--out`` above all: the
``--split ../mine`` case used to overwrite the user's file beside it).

Every case runs the real entry point in-process (``megatron_rl.cli.main``). The inputs are made in the
upstream schemas the docs name (MATH-500, GSM8K, OlympiadBench, verl rows).

``python tests/unit/test_bad_data_inputs.py`` prints the table (case -> exit, last stderr line, whether
anything outside ``--out`` changed), the before -> after record of the issue.
"""
from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

MATH500 = [{"problem": f"What is {i} + {i}?", "solution": f"It is $\\boxed{{{2 * i}}}$.", "answer": str(2 * i),
            "subject": "Algebra", "level": 1, "unique_id": f"test/algebra/{i}.json"} for i in range(1, 4)]
GSM8K = [{"question": f"Tom has {i} apples and buys {i} more. How many?", "answer": f"{i}+{i}={2 * i}\n#### {2 * i}"}
         for i in range(1, 4)]
OLYMPIAD = [{"id": i, "question": f"Find {i}.", "final_answer": {"value": str(i)}, "solution": "s", "language": "English",
             "subject": "Math", "modality": "Text-only"} for i in range(3)]


def verl_row(i: int, source: str = "math500") -> dict:
    return {"data_source": source, "prompt": [{"role": "user", "content": f"What is {i} + {i}?"}], "ability": "math",
            "reward_model": {"style": "rule", "ground_truth": str(2 * i)}, "extra_info": {"index": i}}


#: (id, argv ({X} = the work dir), words of the one stderr line); every case: exit 2, nothing changed on disk
CASES = [
    # --- data prepare: the cases
    ("split-parent-overwrite", ["data", "prepare", "math500", "--in", "{X}/math500.jsonl", "--out", "{X}/o", "--split",
                                "../mine"],
     "--split '../mine': a split is a plain name (letters, digits, _ and -): it names OUT/<split>.parquet"),
    ("split-escape", ["data", "prepare", "math500", "--in", "{X}/math500.jsonl", "--out", "{X}/o", "--split", "../escape"],
     "--split '../escape': a split is a plain name"),
    ("other-source-schema", ["data", "prepare", "math500", "--in", "{X}/gsm8k.jsonl", "--out", "{X}/o"],
     "--in {X}/gsm8k.jsonl: math500 reads the column(s) problem, answer (HuggingFaceH4/MATH-500); the file has answer, "
     "question: no problem. Its columns are those of gsm8k: megatron-rl data prepare gsm8k --in {X}/gsm8k.jsonl"),
    ("missing-column", ["data", "prepare", "math500", "--in", "{X}/noanswer.jsonl", "--out", "{X}/o"],
     "--in {X}/noanswer.jsonl: math500 reads the column(s) problem, answer (HuggingFaceH4/MATH-500); the file has "
     "level, problem, solution, subject, unique_id: no answer"),
    ("struct-final-answer", ["data", "prepare", "olympiadbench", "--in", "{X}/olymp.parquet", "--out", "{X}/o"],
     "data prepare olympiadbench: no usable rows in {X}/olymp.parquet: all 3 rows skipped (3 final_answer is a dict, "
     "not text); first at olymp.parquet:0"),
    ("string-prompt", ["data", "prepare", "verl", "--in", "{X}/strprompt.parquet", "--out", "{X}/o"],
     "data prepare verl: no usable rows in {X}/strprompt.parquet: all 3 rows skipped (3 prompt is a str, not a list of "
     "{role, content} messages)"),
    ("empty-file", ["data", "prepare", "math500", "--in", "{X}/empty.jsonl", "--out", "{X}/o"],
     "--in {X}/empty.jsonl: the file is empty (0 rows)"),
    ("latin1", ["data", "prepare", "math500", "--in", "{X}/latin1.jsonl", "--out", "{X}/o"],
     "{X}/latin1.jsonl:2: not UTF-8 text (byte 0xe9 at column 16); re-encode the file as UTF-8, e.g. iconv -f LATIN1 "
     "-t UTF-8"),
    # --- data prepare: ours
    ("split-val-collision", ["data", "prepare", "math500", "--in", "{X}/math500.jsonl", "--out", "{X}/o", "--split", "val",
                             "--val-rows", "1"],
     "--split val with --val-rows 1: both would write val.parquet; name the main split something else"),
    ("split-empty", ["data", "prepare", "math500", "--in", "{X}/math500.jsonl", "--out", "{X}/o", "--split", ""],
     "--split '': a split is a plain name"),
    ("split-suffix", ["data", "prepare", "math500", "--in", "{X}/math500.jsonl", "--out", "{X}/o", "--split",
                      "test.parquet"], "--split 'test.parquet': a split is a plain name"),
    ("jsonl-named-parquet", ["data", "prepare", "math500", "--in", "{X}/rows.parquet", "--out", "{X}/o"],
     "--in {X}/rows.parquet: not a parquet file: it holds JSON lines; rename it to .jsonl"),
    ("truncated-parquet", ["data", "prepare", "math500", "--in", "{X}/cut.parquet", "--out", "{X}/o"],
     "--in {X}/cut.parquet: not a readable parquet file (a cut-off download? Parquet magic bytes not found"),
    ("wrapped-json", ["data", "prepare", "math500", "--in", "{X}/wrapped.json", "--out", "{X}/o"],
     "--in {X}/wrapped.json: one JSON object, not rows: its key 'data' holds 3 records; extract them, e.g. "
     "jq '.data' {X}/wrapped.json > rows.json"),
    ("truncated-json", ["data", "prepare", "math500", "--in", "{X}/cut.json", "--out", "{X}/o"],
     "{X}/cut.json:1: not valid JSON (Expecting ',' delimiter: line 1 column 151; a cut-off download?)"),
    ("two-splits-in-dir", ["data", "prepare", "gsm8k", "--in", "{X}/hub", "--out", "{X}/o"],
     "--in {X}/hub holds files of several splits (test: 1 file, train: 1 file): pass one of them, e.g. --in "
     "{X}/hub/main/test-00000-of-00001.parquet"),
    ("zstd", ["data", "prepare", "math500", "--in", "{X}/math500.jsonl.zst", "--out", "{X}/o"],
     "--in {X}/math500.jsonl.zst: zstd-compressed; decompress it first: zstd -d {X}/math500.jsonl.zst"),
    ("mixed-shards", ["data", "prepare", "math500", "--in", "{X}/mixed", "--out", "{X}/o"],
     "--in {X}/mixed/b.jsonl: math500 reads the column(s) problem, answer (HuggingFaceH4/MATH-500); the file has "
     "answer, question: no problem"),
    # --- data generate kk: the cases
    ("kk-train-0", ["data", "generate", "kk", "--out", "{X}/kk", "--train-per-size", "0"],
     "--train-per-size must be >= 1, got 0"),
    ("kk-all-0", ["data", "generate", "kk", "--out", "{X}/kk", "--train-per-size", "0", "--test-per-size", "0",
                  "--ood-count", "0"], "--train-per-size must be >= 1, got 0"),
    ("kk-size-40", ["data", "generate", "kk", "--out", "{X}/kk", "--ood-sizes", "40"],
     "--ood-sizes 40: the solver checks all 2^40 assignments of a 40-person puzzle, about 376.0 TiB of memory"),
    # the memory bound is this host's (half its available memory); 34 people need 5 TiB, more than any host has
    ("kk-size-34", ["data", "generate", "kk", "--out", "{X}/kk", "--ood-sizes", "34"],
     "--ood-sizes 34: the solver checks all 2^34 assignments of a 34-person puzzle, about 5.0 TiB of memory"),
    ("kk-too-many-2", ["data", "generate", "kk", "--out", "{X}/kk", "--train-sizes", "2-2", "--train-per-size", "100000"],
     "2 people: 100100 puzzles asked (100000 train + 100 test), but only 184 distinct unique-solution puzzles of 2 "
     "people exist (the generator draws at most 165, 9/10 of them)"),
    ("kk-ood-overlap", ["data", "generate", "kk", "--out", "{X}/kk", "--ood-sizes", "5,6"],
     "--ood-sizes 5,6 overlap --train-sizes 4-8 (5, 6): an out-of-distribution size must not be a train size"),
    ("kk-sizes-reversed", ["data", "generate", "kk", "--out", "{X}/kk", "--train-sizes", "8-4"],
     "argument --train-sizes: LO-HI needs LO <= HI, got '8-4' (did you mean 4-8?)"),
    # --- data generate kk: ours
    ("kk-ood-twice", ["data", "generate", "kk", "--out", "{X}/kk", "--ood-sizes", "9,9"],
     "argument --ood-sizes: 9 given twice in '9,9'"),
    ("kk-train-twice", ["data", "generate", "kk", "--out", "{X}/kk", "--train-sizes", "4,4,5"],
     "argument --train-sizes: 4 given twice in '4,4,5'"),
    ("kk-test-0", ["data", "generate", "kk", "--out", "{X}/kk", "--test-per-size", "0"],
     "--test-per-size must be >= 1, got 0"),
    ("kk-too-many-3", ["data", "generate", "kk", "--out", "{X}/kk", "--train-sizes", "3-5", "--train-per-size", "85000"],
     "3 people: 85100 puzzles asked (85000 train + 100 test), but only 90116 distinct unique-solution puzzles of 3 "
     "people exist (the generator draws at most 81104, 9/10 of them)"),
    # --- eval --benchmarks: the cases
    ("eval-k-list", ["eval", "--benchmarks", "math500", "--data-dir", "{X}/bench", "--completions-dir", "{X}/c4", "--k",
                     "1,2,4", "--out", "{X}/e"],
     "--k 1,2,4: --benchmarks reports one metric per benchmark (the table's column): give one k"),
    ("eval-too-few", ["eval", "--benchmarks", "amc23", "--data-dir", "{X}/bench", "--completions-dir", "{X}/c2", "--n", "4",
                      "--out", "{X}/e"],
     "benchmark amc23: {X}/c2/amc23.jsonl: row 0 has 2 completions, n=4 needs 4 per row (n: --n)"),
    # --- eval --benchmarks: ours
    ("eval-empty-completions", ["eval", "--benchmarks", "amc23", "--data-dir", "{X}/bench", "--completions-dir",
                                "{X}/cempty", "--out", "{X}/e"],
     "benchmark amc23: {X}/cempty/amc23.jsonl is empty: no completions"),
    ("eval-latin1-completions", ["eval", "--benchmarks", "amc23", "--data-dir", "{X}/bench", "--completions-dir",
                                 "{X}/clatin", "--out", "{X}/e"],
     "benchmark amc23: {X}/clatin/amc23.jsonl:1: not UTF-8 text (byte 0xe9 at column 30)"),
    ("eval-index-range", ["eval", "--benchmarks", "amc23", "--data-dir", "{X}/bench", "--completions-dir", "{X}/coob",
                          "--n", "1", "--out", "{X}/e"],
     "benchmark amc23: {X}/coob/amc23.jsonl: index 40 is out of range: {X}/bench/amc23/test.parquet has 3 rows"),
    ("eval-empty-benchmark", ["eval", "--benchmarks", "amc23", "--data-dir", "{X}/bench_empty", "--completions-dir",
                              "{X}/c2", "--out", "{X}/e"],
     "benchmark amc23: {X}/bench_empty/amc23/test.parquet has no rows"),
    ("eval-benchmark-not-parquet", ["eval", "--benchmarks", "amc23", "--data-dir", "{X}/bench_bad", "--completions-dir",
                                    "{X}/c2", "--out", "{X}/e"],
     "benchmark amc23: {X}/bench_bad/amc23/test.parquet: not a readable parquet file"),
    ("eval-data-dir-one-level-down", ["eval", "--benchmarks", "amc23", "--data-dir", "{X}/bench/amc23",
                                      "--completions-dir", "{X}/c2", "--out", "{X}/e"],
     "--data-dir {X}/bench/amc23 holds a test.parquet itself: --data-dir is the folder above the benchmark folders "
     "(DIR/<benchmark>/test.parquet); pass --data-dir {X}/bench"),
]

#: cases that used to fail and now run: (id, argv, words of the last stdout line)
WORKS = [
    ("jsonl-gz", ["data", "prepare", "math500", "--in", "{X}/math500.jsonl.gz", "--out", "{X}/ogz"], "wrote {X}/ogz"),
    ("json-gz", ["data", "prepare", "math500", "--in", "{X}/math500.json.gz", "--out", "{X}/ojgz"], "wrote {X}/ojgz"),
    ("utf8-bom", ["data", "prepare", "math500", "--in", "{X}/bom.jsonl", "--out", "{X}/obom"], "wrote {X}/obom"),
    ("eval-k-alone-sets-n", ["eval", "--benchmarks", "math500", "--data-dir", "{X}/bench", "--completions-dir", "{X}/c4",
                             "--k", "4", "--out", "{X}/e4"], "| MATH-500 |"),
]


def _parquet(path: Path, rows: list[dict]) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows), path)


def _jsonl(path: Path, rows: list[dict]) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    text = "".join(json.dumps(r) + "\n" for r in rows)
    path.write_text(text)
    return text


def make_work(x: Path) -> Path:
    """Every input the cases name, in the upstream schemas."""
    text = _jsonl(x / "math500.jsonl", MATH500)
    (x / "mine.parquet").write_bytes(b"the user's own file")
    _jsonl(x / "gsm8k.jsonl", GSM8K)
    _jsonl(x / "noanswer.jsonl", [{k: v for k, v in r.items() if k != "answer"} for r in MATH500])
    _parquet(x / "olymp.parquet", OLYMPIAD)
    _parquet(x / "strprompt.parquet", [{**verl_row(i), "prompt": f"What is {i} + {i}?"} for i in range(3)])
    (x / "empty.jsonl").write_text("")
    (x / "latin1.jsonl").write_bytes((json.dumps(MATH500[0]) + "\n" + '{"problem": "Qu\u00e9 es 1+1?", "answer": "2"}\n')
                                     .encode("latin-1"))
    (x / "bom.jsonl").write_bytes(b"\xef\xbb\xbf" + text.encode())
    (x / "rows.parquet").write_text(text)
    _parquet(x / "full.parquet", MATH500)
    (x / "cut.parquet").write_bytes((x / "full.parquet").read_bytes()[:-40])
    (x / "wrapped.json").write_text(json.dumps({"data": MATH500, "version": 1}, indent=2))
    (x / "cut.json").write_text(json.dumps(MATH500)[:150])
    _parquet(x / "hub" / "main" / "train-00000-of-00001.parquet", GSM8K)
    _parquet(x / "hub" / "main" / "test-00000-of-00001.parquet", GSM8K)
    (x / "math500.jsonl.zst").write_bytes(b"\x28\xb5\x2f\xfd" + b"\0" * 16)
    _jsonl(x / "mixed" / "a.jsonl", MATH500)
    _jsonl(x / "mixed" / "b.jsonl", GSM8K)
    (x / "math500.jsonl.gz").write_bytes(gzip.compress(text.encode()))
    (x / "math500.json.gz").write_bytes(gzip.compress(json.dumps(MATH500).encode()))
    for name in ("math500", "amc23"):
        _parquet(x / "bench" / name / "test.parquet", [verl_row(i, name) for i in range(1, 4)])
    _parquet(x / "bench_empty" / "amc23" / "test.parquet", [verl_row(1, "amc23")][:0] or [])
    (x / "bench_bad" / "amc23").mkdir(parents=True)
    (x / "bench_bad" / "amc23" / "test.parquet").write_text(text)
    _jsonl(x / "c4" / "math500.jsonl", [{"index": i, "responses": [f"\\boxed{{{2 * (i + 1)}}}"] * 4} for i in range(3)])
    _jsonl(x / "c2" / "amc23.jsonl", [{"index": i, "responses": ["\\boxed{2}"] * 2} for i in range(3)])
    (x / "cempty").mkdir()
    (x / "cempty" / "amc23.jsonl").write_text("")
    (x / "clatin").mkdir()
    (x / "clatin" / "amc23.jsonl").write_bytes('{"index": 0, "response": "caf\u00e9"}\n'.encode("latin-1"))
    _jsonl(x / "coob" / "amc23.jsonl", [{"index": i, "response": "2"} for i in (0, 1, 2, 40)])
    return x


def _empty_parquet_fix(x: Path) -> None:
    """An empty benchmark file keeps the verl schema (a prepared file with every row filtered out)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.Table.from_pylist([verl_row(1, "amc23")]).slice(0, 0), x / "bench_empty" / "amc23" / "test.parquet")


@pytest.fixture(scope="module")
def work(tmp_path_factory) -> Path:
    x = make_work(tmp_path_factory.mktemp("bad_data"))
    _empty_parquet_fix(x)
    return x


def expand(argv: list[str], x: Path) -> list[str]:
    return [a.replace("{X}", str(x)) for a in argv]


def run_case(argv: list[str]) -> int:
    from megatron_rl import cli

    try:
        return cli.main(argv)
    except SystemExit as e:   # argparse usage errors
        return e.code


def snapshot(root: Path) -> dict:
    """Every path under ``root`` with its size and modification time (what "nothing changed" compares)."""
    return {str(p.relative_to(root)): (p.stat().st_size, p.stat().st_mtime_ns) for p in root.rglob("*")}


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_bad_data_input_is_one_line_and_writes_nothing(case, work, capsys):
    _, argv, want = case
    before = snapshot(work)
    rc = run_case(expand(argv, work))
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert rc == 2, f"{argv}: exit {rc}, want 2:\n{err}"
    assert snapshot(work) == before, f"{argv}: files changed on disk"
    assert len(lines) == 1, f"{argv}: expected one line, got {len(lines)}:\n{err}"
    assert "Traceback" not in err and want.replace("{X}", str(work)) in lines[0], lines[0]
    assert (work / "mine.parquet").read_bytes() == b"the user's own file"


@pytest.mark.parametrize("case", WORKS, ids=[c[0] for c in WORKS])
def test_inputs_that_used_to_fail_now_run(case, work, capsys):
    """gzip'd JSONL / JSON and a UTF-8 BOM are read (the same rows as the plain file); ``--k 4`` alone
    sets n = 4 with ``--benchmarks`` (it asked for the benchmark's 32)."""
    _, argv, want = case
    rc = run_case(expand(argv, work))
    out, err = capsys.readouterr()
    assert rc == 0, err
    assert want.replace("{X}", str(work)) in out, out
    if argv[1] == "prepare":
        import pyarrow.parquet as pq

        rows = pq.read_table(Path(expand([argv[-1]], work)[0]) / "test.parquet").to_pylist()
        assert [r["reward_model"]["ground_truth"] for r in rows] == [r["answer"] for r in MATH500]


def test_unwritable_out_names_the_users_path(work, tmp_path, capsys):
    """``--out`` on a read-only file system: one line naming the user's ``--out`` (it was an OSError
    traceback naming the internal ``.tmp-o-…`` dir beside it), exit 2, before any input is read."""
    from tests.helpers.tmpfs import read_only_tmpfs

    with read_only_tmpfs(tmp_path / "ro") as ro:
        for argv, tool in [
            (["data", "prepare", "math500", "--in", str(work / "math500.jsonl"), "--out", f"{ro}/o"], "data prepare"),
            (["data", "generate", "kk", "--out", f"{ro}/kk", "--train-per-size", "1"], "data generate kk"),
        ]:
            rc = run_case(argv)
            lines = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
            assert rc == 2 and len(lines) == 1, lines
            assert lines[0].startswith(f"megatron-rl {tool}: error: --out {ro}/")
            assert f"--out {ro}/" in lines[0] and "read-only file system" in lines[0] and ".tmp-" not in lines[0]
        assert list(ro.iterdir()) == []


def test_interrupted_generate_leaves_nothing_and_reruns_without_force(tmp_path):
    """``data generate kk`` writes into a temp dir renamed onto ``--out`` at the end (as ``prepare``):
    Ctrl-C halfway leaves neither ``--out`` nor the temp dir, so the rerun needs no ``--force`` (a failed
    run used to leave files that were refused even with ``--force``). A real process and a real SIGINT."""
    import os
    import signal
    import subprocess
    import sys
    import time

    from tests.helpers.dist import repo_env

    out = tmp_path / "kk"
    argv = [sys.executable, "-m", "megatron_rl.cli", "data", "generate", "kk", "--out", str(out), "--train-sizes", "4-8",
            "--train-per-size", "20000", "--test-per-size", "1", "--ood-sizes", "9", "--ood-count", "1"]
    p = subprocess.Popen(argv, env=repo_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while not list(tmp_path.glob(".tmp-kk-*/kk_9")) and time.monotonic() < deadline:   # the test sets are written
        time.sleep(0.1)
    assert list(tmp_path.glob(".tmp-kk-*")), "no temp dir appeared"
    os.kill(p.pid, signal.SIGINT)
    _, err = p.communicate(timeout=60)
    assert p.returncode != 0, err
    assert sorted(x.name for x in tmp_path.iterdir()) == [], err   # no --out, no temp dir
    from megatron_rl import cli

    assert cli.main([("1" if a == "20000" else a) for a in argv[3:]]) == 0
    assert sorted(x.name for x in out.iterdir()) == ["kk_4_8", "kk_9", "manifest.json", "train.parquet"]


def test_the_documented_data_dir_is_git_ignored():
    """The docs write ``data/...`` in the checkout (``data generate kk --out data/kk``, ``data prepare
    ... --out data/math500``): git ignores it, so nothing the docs' lines write is ever committed."""
    import subprocess

    root = Path(__file__).resolve().parents[2]
    for path in ("data/kk/train.parquet", "data/math500/test.parquet"):
        p = subprocess.run(["git", "check-ignore", "-q", path], cwd=root, check=False)
        assert p.returncode == 0, f"{path} is not git-ignored"
    assert subprocess.run(["git", "check-ignore", "-q", "megatron_rl/data/cli.py"], cwd=root, check=False).returncode == 1


def test_the_table_has_every_case():
    ids = [c[0] for c in CASES + WORKS]
    assert len(ids) == len(set(ids)) and len(CASES) >= 30


if __name__ == "__main__":   # the before -> after table: case, exit, last stderr line, changed outside --out
    import contextlib
    import io
    import tempfile
    import sys
    import traceback

    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))   # this checkout's package, not the venv's install
    print("| case | exit | last stderr line (or exception) | outside --out changed |\n|---|---|---|---|")
    for cid, argv, _ in CASES + WORKS:
        x = make_work(Path(tempfile.mkdtemp()))   # a fresh one per case: a "before" run leaves files behind
        _empty_parquet_fix(x)
        args = expand(argv, x)
        out_dir = Path(args[args.index("--out") + 1])
        before = {k: v for k, v in snapshot(x).items() if not (x / k).is_relative_to(out_dir)}
        buf = io.StringIO()
        with contextlib.redirect_stderr(buf), contextlib.redirect_stdout(io.StringIO()):
            try:
                rc = run_case(args)
            except BaseException as e:   # noqa: BLE001  (the "before" run: a crash is a result)
                rc = f"crash {type(e).__name__}"
                buf.write(traceback.format_exception_only(e)[-1])
        after = {k: v for k, v in snapshot(x).items() if not (x / k).is_relative_to(out_dir)}
        last = ([ln for ln in buf.getvalue().splitlines() if ln.strip()] or [""])[-1]
        n_lines = len([ln for ln in buf.getvalue().splitlines() if ln.strip()])
        shown = last.replace(str(x), "X").replace("|", "/")[:260]
        print(f"| {cid} | {rc} | ({n_lines} lines) {shown} | {'YES' if after != before else 'no'} |", flush=True)
