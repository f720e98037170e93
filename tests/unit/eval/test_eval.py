"""``megatron-rl eval`` from a completions JSONL: mean@k / pass@k equal a hand computation."""
from __future__ import annotations

import json
import math

import pytest

from megatron_rl.data.synthetic import write_parquet
from megatron_rl.eval import main, pass_at_k


def test_pass_at_k_estimator():
    assert pass_at_k(4, 0, 2) == 0.0 and pass_at_k(4, 4, 2) == 1.0
    assert math.isclose(pass_at_k(4, 1, 2), 1 - math.comb(3, 2) / math.comb(4, 2))  # = 0.5
    with pytest.raises(ValueError):
        pass_at_k(2, 1, 3)


def test_eval_cli_matches_hand_computation(tmp_path):
    rows = [("R 1234=", "4321"), ("R 0007=", "7000"), ("R 5555=", "5555")]
    data = write_parquet(rows, "reverse", "test", tmp_path / "eval.parquet")
    comp = tmp_path / "c.jsonl"
    answers = {0: ["4321", "4321", "1234", "4321"],  # 3/4 correct
               1: ["0007", "7000", "7", "70"],      # 1/4
               2: ["5555", "5555", "5555", "5555"]}  # 4/4
    comp.write_text("\n".join(json.dumps({"index": i, "response": r}) for i, rs in answers.items() for r in rs))
    out = tmp_path / "out"
    assert main(["--data", str(data), "--completions", str(comp), "--k", "4", "--out", str(out)]) == 0
    s = json.loads((out / "summary.json").read_text())
    # hand: mean@4 = (3/4 + 1/4 + 4/4) / 3 = 2/3; pass@4 = (1 + 1 + 1) / 3 = 1
    assert math.isclose(s["mean@4"], 2 / 3) and s["pass@4"] == 1.0
    assert main(["--data", str(data), "--completions", str(comp), "--k", "2", "--out", str(out)]) == 0
    s = json.loads((out / "summary.json").read_text())
    # pass@2 per row: 1 - C(1,2)/C(4,2) = 1; 1 - C(3,2)/C(4,2) = 0.5; 1  -> mean 5/6; mean@2: (1 + 0.5 + 1)/3
    assert math.isclose(s["pass@2"], 5 / 6) and math.isclose(s["mean@2"], 2.5 / 3)
    lines = (out / "samples.jsonl").read_text().splitlines()
    assert len(lines) == 12 and json.loads(lines[0]) == {"row": 0, "sample": 0, "score": 1.0, "correct": True}


def test_eval_bad_input(tmp_path, capsys):
    data = write_parquet([("R 1234=", "4321")], "reverse", "test", tmp_path / "e.parquet")
    comp = tmp_path / "c.jsonl"
    comp.write_text('{"index": 0, "response": "4321"}\n{"oops": 1}\n')
    assert main(["--data", str(data), "--completions", str(comp), "--k", "1", "--out", str(tmp_path / "o")]) == 2
    assert "bad completion line" in capsys.readouterr().err
