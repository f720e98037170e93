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
    assert main(["--data", str(data), "--completions", str(comp), "--k", "2", "--out", str(out), "--force"]) == 0
    s = json.loads((out / "summary.json").read_text())
    # pass@2 per row: 1 - C(1,2)/C(4,2) = 1; 1 - C(3,2)/C(4,2) = 0.5; 1  -> mean 5/6; mean@2: (1 + 0.5 + 1)/3
    assert math.isclose(s["pass@2"], 5 / 6) and math.isclose(s["mean@2"], 2.5 / 3)
    lines = (out / "samples.jsonl").read_text().splitlines()
    assert len(lines) == 12 and json.loads(lines[0]) == {"row": 0, "sample": 0, "score": 1.0, "correct": True}
    # neither --k nor --n: k = 1 over the n = 4 samples the file holds, stated; pass@1 = c/n per row (Chen et al.
    # eq. 1 at k = 1) is the mean over all 4, so mean@4 (= 2/3 by hand) is reported beside mean@1 (the first sample)
    assert main(["--data", str(data), "--completions", str(comp), "--out", str(out), "--force"]) == 0
    s = json.loads((out / "summary.json").read_text())
    assert (s["k"], s["n"]) == (1, 4) and math.isclose(s["pass@1"], 2 / 3) and math.isclose(s["mean@4"], s["pass@1"])
    assert math.isclose(s["mean@1"], (1 + 0 + 1) / 3)


def test_eval_bad_input(tmp_path, capsys):
    data = write_parquet([("R 1234=", "4321")], "reverse", "test", tmp_path / "e.parquet")
    comp = tmp_path / "c.jsonl"
    comp.write_text('{"index": 0, "response": "4321"}\n{"oops": 1}\n')
    assert main(["--data", str(data), "--completions", str(comp), "--k", "1", "--out", str(tmp_path / "o")]) == 2
    assert "bad completion line" in capsys.readouterr().err


def test_n_samples_and_several_k(tmp_path):
    """``--n 4 --k 1,2``: mean@k over the first k samples, pass@k from all n, mean@n, per data source."""
    rows = [("R 12=", "21"), ("R 34=", "43")]
    data = write_parquet(rows, "reverse", "test", tmp_path / "eval.parquet")
    comp = tmp_path / "c.jsonl"
    answers = {0: ["21", "12", "21", "21", "x"],   # first 4: 3/4 correct (the 5th is past --n)
               1: ["0", "0", "43", "0"]}           # 1/4
    comp.write_text("\n".join(json.dumps({"index": i, "response": r}) for i, rs in answers.items() for r in rs))
    out = tmp_path / "out"
    assert main(["--data", str(data), "--completions", str(comp), "--n", "4", "--k", "1,2", "--out", str(out)]) == 0
    s = json.loads((out / "summary.json").read_text())
    # mean@4 = (3/4 + 1/4)/2; mean@1 = (1 + 0)/2; pass@1 = c/n averaged = mean@4;
    # pass@2 = (1 - C(1,2)/C(4,2) + 1 - C(3,2)/C(4,2)) / 2 = (1 + 0.5) / 2
    assert s["n"] == 4 and s["k"] == [1, 2]
    assert math.isclose(s["mean@4"], 0.5) and math.isclose(s["mean@1"], 0.5) and math.isclose(s["pass@1"], 0.5)
    assert math.isclose(s["pass@2"], 0.75) and math.isclose(s["mean@2"], 0.25)
    src = s["by_source"]["reverse"]
    assert src["rows"] == 2 and math.isclose(src["mean@4"], 0.5) and math.isclose(src["pass@2"], 0.75)
    assert len((out / "samples.jsonl").read_text().splitlines()) == 8


@pytest.mark.parametrize(("argv", "words"), [
    (["--n", "2", "--k", "4"], "--n must be >= 1 and >= every --k"),
    (["--top-p", "0"], "--top-p must be in (0, 1]"),
    (["--top-k", "-3"], "--top-k must be -1"),
    (["--chat-template-kwargs", "{oops"], "--chat-template-kwargs: not JSON"),
    (["--chat-template-kwargs", "[1]"], "must be a JSON object"),
])
def test_eval_sampling_options_fail_clearly(tmp_path, capsys, argv, words):
    data = write_parquet([("R 1234=", "4321")], "reverse", "test", tmp_path / "e.parquet")
    comp = tmp_path / "c.jsonl"
    comp.write_text('{"index": 0, "response": "4321"}\n')
    assert main(["--data", str(data), "--completions", str(comp), "--out", str(tmp_path / "o"), *argv]) == 2
    assert words in capsys.readouterr().err


def test_eval_generates_as_the_papers_do(chat_tokenizer, tmp_path):
    """``--model`` on the HF engine: n samples per row at T / top-p / top-k, prompts rendered with
    ``--chat-template-kwargs`` (the fixture's template reads enable_thinking), mean@n and pass@k per source."""
    from tests.helpers.chat_fixture import make_model, write_chat_task

    model = tmp_path / "m"
    chat_tokenizer.tok.save_pretrained(str(model))
    make_model(model, chat_tokenizer.tok).save_pretrained(str(model))
    data = write_chat_task(tmp_path, sizes={"test": 3})["test"]
    out = tmp_path / "out"
    assert main(["--data", str(data), "--model", str(model), "--engine", "hf", "--n", "4", "--k", "1,4",
                 "--temperature", "0.6", "--top-p", "0.95", "--top-k", "20", "--max-tokens", "3",
                 "--chat-template-kwargs", '{"enable_thinking": false}', "--out", str(out)]) == 0
    s = json.loads((out / "summary.json").read_text())
    assert s["n"] == 4 and set(s["by_source"]["math"]) == {"mean@1", "pass@1", "mean@4", "pass@4", "rows"}
    lines = [json.loads(x) for x in (out / "completions.jsonl").read_text().splitlines()]
    assert len(lines) == 12 and all(ln["prompt"].endswith("assistant\n<think>\n\n</think>\n\n") for ln in lines)
