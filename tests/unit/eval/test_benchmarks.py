"""``megatron-rl eval --benchmarks``: the papers' tables over prepared benchmark directories.

Oracles: the numbers are recomputed here by hand from the completions (mean@k = the mean of the
first k samples' correctness, pass@k = 1 − C(n−c, k) / C(n, k) with ``math.comb``; SCoRe's
attempt 1 / attempt 2 / Δ / Δ^{i→c} / Δ^{c→i} counted over the pairs), with correctness given by
construction (a boxed right or wrong number; a K&K answer that is the solution or a one-role flip)."""
from __future__ import annotations

import json
import math
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from megatron_rl.eval import main


def _write_bench(data_dir: Path, name: str, answers: list[str], data_source: str = "math500", reward: str = "") -> Path:
    """A prepared benchmark in verl schema: DIR/<name>/test.parquet (``reward``: the reward its rows name, as
    ``data prepare`` writes them; "" for none)."""
    rm = {"style": "rule", "ground_truth": None, **({"reward": reward} if reward else {})}
    rows = [{"prompt": [{"role": "user", "content": f"Problem {i}: what is {a}? Put it in \\boxed{{}}."}],
             "data_source": data_source, "reward_model": {**rm, "ground_truth": a},
             "extra_info": {"split": "test", "index": i}} for i, a in enumerate(answers)]
    path = data_dir / name / "test.parquet"
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


def _write_completions(path: Path, per_row: list[list[str]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps({"index": i, "response": r}) + "\n" for i, rs in enumerate(per_row) for r in rs))


def _boxed(ok_pattern: list[list[bool]], answers: list[str]) -> list[list[str]]:
    return [[f"so \\boxed{{{a if ok else str(int(a) + 1)}}}" for ok in oks] for oks, a in zip(ok_pattern, answers)]


def _hand(pattern: list[list[bool]], k: int) -> tuple[float, float]:
    n = len(pattern[0])
    mean = sum(sum(p[:k]) / k for p in pattern) / len(pattern)
    pas = sum(1 - math.comb(n - sum(p), k) / math.comb(n, k) for p in pattern) / len(pattern)
    return mean, pas


def test_named_benchmarks_from_a_completions_dir_match_a_hand_computation(tmp_path, capsys):
    data, comps = tmp_path / "data", tmp_path / "comps"
    pats = {"aime24": [[True, False, False, True], [False] * 4, [True] * 4],
            "amc23": [[False, True, True, True], [False, False, True, False]]}
    for name, pat in pats.items():
        answers = [str(10 + i) for i in range(len(pat))]
        _write_bench(data, name, answers)
        _write_completions(comps / f"{name}.jsonl", _boxed(pat, answers))
    out = tmp_path / "out"
    assert main(["--benchmarks", "aime24,amc23", "--data-dir", str(data), "--completions-dir", str(comps),
                 "--n", "4", "--k", "2", "--out", str(out)]) == 0
    s = json.loads((out / "summary.json").read_text())
    for name, pat in pats.items():
        mean2, pass2 = _hand(pat, 2)
        e = s["benchmarks"][name]
        assert math.isclose(e["mean@2"], mean2) and math.isclose(e["pass@2"], pass2)
        assert e["value"] == e["mean@2"] and e["problems"] == len(pat) and e["reward"] == "math"
    avg = (_hand(pats["aime24"], 2)[0] + _hand(pats["amc23"], 2)[0]) / 2
    assert math.isclose(s["average"]["mean@2"], avg) and s["problems"] == 5
    # the papers' layout: rows = benchmarks then the average, one column per metric, then the problem count
    md = (out / "table.md").read_text().splitlines()
    assert md[0] == "| Benchmark | mean@2 | Problems |" and md[1] == "|---|---:|---:|"
    assert md[2] == f"| AIME24 | {100 * _hand(pats['aime24'], 2)[0]:.1f} | 3 |"
    assert md[3] == f"| AMC23 | {100 * _hand(pats['amc23'], 2)[0]:.1f} | 2 |"
    assert md[4] == f"| Average | {100 * avg:.1f} | 5 |" and len(md) == 5
    assert "| Average |" in capsys.readouterr().out
    lines = (out / "samples.jsonl").read_text().splitlines()
    assert len(lines) == 20 and json.loads(lines[0]) == {"benchmark": "aime24", "row": 0, "sample": 0, "correct": True}
    # n 4 without --k: each benchmark's mean@4 (the papers' avg@n) and pass@4
    assert main(["--benchmarks", "aime24,amc23", "--data-dir", str(data), "--completions-dir", str(comps),
                 "--n", "4", "--out", str(out), "--force"]) == 0
    s = json.loads((out / "summary.json").read_text())
    assert math.isclose(s["benchmarks"]["amc23"]["pass@4"], _hand(pats["amc23"], 4)[1])
    assert s["benchmarks"]["amc23"]["metric"] == "mean@4"


def test_kk_preset_on_generated_puzzles_scores_pass_at_1_with_the_kk_reward(tmp_path):
    """``data generate kk`` output read by ``eval --benchmarks kk``: the solution text scores 1, a
    one-role flip 0; the preset's column is pass@1 and KK 4–8 / 9 / 10 / 11 are its rows."""
    import re

    from megatron_rl.cli import main as cli_main

    data = tmp_path / "kk"
    assert cli_main(["data", "generate", "kk", "--out", str(data), "--train-per-size", "1", "--test-per-size", "2",
                     "--ood-count", "4"]) == 0
    comps, expect = tmp_path / "c", {}
    for name in ("kk_4_8", "kk_9", "kk_10", "kk_11"):
        rows = pq.read_table(data / name / "test.parquet").to_pylist()
        resps = []
        for i, r in enumerate(rows):
            sol = r["reward_model"]["ground_truth"]["solution_text_format"]
            wrong = re.sub(r"knight$|knave$", lambda m: "knave" if m.group() == "knight" else "knight", sol, count=1,
                           flags=re.M)
            resps.append([f"<think>...</think><answer>{sol if i % 2 == 0 else wrong}</answer>"])
        expect[name] = sum(i % 2 == 0 for i in range(len(rows))) / len(rows)
        _write_completions(comps / f"{name}.jsonl", resps)
    out = tmp_path / "out"
    assert main(["--benchmarks", "kk", "--data-dir", str(data), "--completions-dir", str(comps), "--out", str(out)]) == 0
    s = json.loads((out / "summary.json").read_text())
    assert s["preset"] == "kk" and list(s["benchmarks"]) == ["kk_4_8", "kk_9", "kk_10", "kk_11"]
    assert {n: e["value"] for n, e in s["benchmarks"].items()} == expect
    assert all(e["metric"] == "pass@1" and e["reward"] == "kk" for e in s["benchmarks"].values())
    md = (out / "table.md").read_text().splitlines()
    assert md[0] == "| Benchmark | pass@1 | Problems |" and md[2].startswith("| KK 4–8 | 50.0 | 10 |")
    assert md[-1] == f"| Average | {100 * sum(expect.values()) / 4:.1f} | 22 |"


def test_two_attempt_reports_attempt_1_attempt_2_and_delta_by_hand(tmp_path):
    data, comps = tmp_path / "data", tmp_path / "comps"
    p1 = {"gsm8k": [[True, False], [False, False], [True, True]], "math": [[False, True]]}
    p2 = {"gsm8k": [[True, True], [False, True], [False, True]], "math": [[False, False]]}
    for name in p1:
        answers = [str(3 + i) for i in range(len(p1[name]))]
        _write_bench(data, name, answers)
        _write_completions(comps / f"{name}.jsonl", _boxed(p1[name], answers))
        _write_completions(comps / f"{name}.attempt2.jsonl", _boxed(p2[name], answers))
    out = tmp_path / "out"
    assert main(["--benchmarks", "score", "--data-dir", str(data), "--completions-dir", str(comps), "--n", "2",
                 "--out", str(out)]) == 0
    s = json.loads((out / "summary.json").read_text())
    for name in p1:
        pairs = [(a, b) for r1, r2 in zip(p1[name], p2[name]) for a, b in zip(r1, r2)]
        t1, t2 = sum(a for a, _ in pairs) / len(pairs), sum(b for _, b in pairs) / len(pairs)
        e = s["benchmarks"][name]
        assert math.isclose(e["attempt1"], t1) and math.isclose(e["attempt2"], t2)
        assert math.isclose(e["delta"], t2 - t1)
        assert math.isclose(e["i_to_c"], sum(b and not a for a, b in pairs) / len(pairs))
        assert math.isclose(e["c_to_i"], sum(a and not b for a, b in pairs) / len(pairs))
    # gsm8k: t1 3/6, t2 4/6 -> Δ +16.7; math: t1 1/2, t2 0 -> Δ -50.0
    md = (out / "table.md").read_text().splitlines()
    assert md[0] == "| Benchmark | attempt 1 | attempt 2 | Δ | Δ i→c | Δ c→i | Problems |"
    assert md[2] == "| GSM8K | 50.0 | 66.7 | +16.7 | +33.3 | +16.7 | 3 |"
    assert md[3] == "| MATH | 50.0 | 0.0 | -50.0 | +0.0 | +50.0 | 1 |"
    assert md[4].startswith("| Average | 50.0 | 33.3 | -16.7 |")
    from megatron_rl.eval.table import log_metrics

    logged = log_metrics(s)
    assert math.isclose(logged["eval/avg"], (4 / 6 + 0) / 2) and math.isclose(logged["eval/math/delta"], -0.5)


@pytest.mark.parametrize(("argv", "words"), [
    (["--benchmarks", "aime24,nope"], "unknown benchmark 'nope'"),
    (["--benchmarks", "aime24,kk"], "a preset stands alone"),
    (["--benchmarks", "aime25"], "no "),
    (["--benchmarks", "aime24", "--data", "x.parquet"], "one of them"),
    (["--benchmarks", "aime24", "--n", "2", "--k", "4"], "mean@4 needs --n >= 4"),
])
def test_benchmark_arguments_fail_in_one_line(tmp_path, capsys, argv, words):
    data = tmp_path / "data"
    _write_bench(data, "aime24", ["1"])
    assert main(["--data-dir", str(data), "--completions-dir", str(tmp_path), "--out", str(tmp_path / "o"), *argv]) == 2
    err = capsys.readouterr().err
    assert words in err and len(err.strip().splitlines()) == 1


def test_missing_completion_file_and_two_attempt_model_without_instruction(tmp_path, capsys):
    data = tmp_path / "data"
    _write_bench(data, "gsm8k", ["1"])
    _write_bench(data, "math", ["1"])
    assert main(["--benchmarks", "gsm8k", "--data-dir", str(data), "--completions-dir", str(tmp_path),
                 "--out", str(tmp_path / "o")]) == 2
    assert "no gsm8k.jsonl" in capsys.readouterr().err
    model = tmp_path / "m"
    model.mkdir()
    (model / "config.json").write_text("{}")
    assert main(["--benchmarks", "score", "--data-dir", str(data), "--model", str(model),
                 "--out", str(tmp_path / "o2")]) == 2
    assert "needs --instruction" in capsys.readouterr().err


def test_two_attempt_with_the_chat_fixture_model_equals_rescoring_its_completions(chat_fixture, tmp_path):
    """One cheap real run: the chat fixture's warm-started model on the HF engine samples attempt 1
    and SCoRe's second attempt; the table equals the ``math`` reward applied here to the files it wrote."""
    from megatron_rl.rewards.registry import get_reward
    from tests.helpers.chat_fixture import SCORE_INSTRUCTION

    data = tmp_path / "data"
    rows = pq.read_table(chat_fixture["test"]).to_pylist()[:4]
    (data / "math").mkdir(parents=True)
    pq.write_table(pa.Table.from_pylist(rows), data / "math" / "test.parquet")
    out = tmp_path / "out"
    assert main(["--benchmarks", "math", "--two-attempt", "--data-dir", str(data), "--model", chat_fixture["hf_path"],
                 "--engine", "hf", "--n", "2", "--temperature", "0.7", "--max-tokens", "24",
                 "--instruction", SCORE_INSTRUCTION, "--out", str(out)]) == 0
    s = json.loads((out / "summary.json").read_text())["benchmarks"]["math"]

    def correct(f):
        got = [[] for _ in rows]
        for ln in (out / "completions" / f).read_text().splitlines():
            o = json.loads(ln)
            got[o["index"]].append(float(get_reward("math")(o["response"], rows[o["index"]]["reward_model"]["ground_truth"])) >= 1)
        return [c for cs in got for c in cs]

    c1, c2 = correct("math.jsonl"), correct("math.attempt2.jsonl")
    assert len(c1) == len(c2) == 8
    assert math.isclose(s["attempt1"], sum(c1) / 8) and math.isclose(s["attempt2"], sum(c2) / 8)
    assert math.isclose(s["i_to_c"], sum(b and not a for a, b in zip(c1, c2)) / 8)
    assert 0 < s["attempt1"] < 1   # the warm-started fixture answers some, not all
    # the output is reusable: the same table from --completions-dir OUT/completions
    out2 = tmp_path / "out2"
    assert main(["--benchmarks", "math", "--two-attempt", "--data-dir", str(data), "--n", "2",
                 "--completions-dir", str(out / "completions"), "--out", str(out2)]) == 0
    assert json.loads((out2 / "summary.json").read_text())["benchmarks"]["math"] == s


def test_trainer_eval_benchmarks_are_checked_and_tabled(tmp_path):
    """``trainer.eval_benchmarks``: a YAML list or comma text, refused in one line with data.val, with
    SCoRe's two-attempt preset or with a missing file; the loop's correctness becomes the same table."""
    from megatron_rl.config import load_config
    from megatron_rl.eval.training import selected, table_metrics

    data = tmp_path / "data"
    _write_bench(data, "aime24", ["1", "2"])
    _write_bench(data, "amc23", ["3"])
    base = [f"trainer.eval_data_dir={data}", "data.val=", f"trainer.run_dir={tmp_path / 'run'}"]
    cfg = load_config(None, [*base, "trainer.eval_benchmarks=[aime24, amc23]"])
    assert cfg.trainer.eval_benchmarks == "aime24,amc23"
    assert [b.name for b in selected(cfg)[0]] == ["aime24", "amc23"]
    for over, words in ((["data.val=x.parquet"], "are both set"), (["trainer.eval_benchmarks=score"], "two-attempt"),
                        (["trainer.eval_benchmarks=gsm8k"], "no "), (["trainer.eval_benchmarks=aime24,x"], "unknown")):
        with pytest.raises((ValueError, FileNotFoundError), match=words):
            selected(load_config(None, [*base, "trainer.eval_benchmarks=aime24", *over]))

    class Blocks:   # the loop's held-out set: one contiguous block of problems per benchmark
        blocks = [("aime24", 0, 2), ("amc23", 2, 3)]

    m = table_metrics(cfg, Blocks(), [[True, False], [False, False], [True, True]], 2, step=5)
    assert m == {"eval/aime24/mean@2": 0.25, "eval/amc23/mean@2": 1.0, "eval/avg": 0.625, "eval/acc": 0.625}
    assert (tmp_path / "run/eval/step_5.md").read_text().splitlines()[-1] == "| Average | 62.5 | 3 |"
