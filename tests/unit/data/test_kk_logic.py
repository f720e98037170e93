"""``data generate kk``: Logic-RL-format Knights & Knaves puzzles and RLCSD's splits.

The uniqueness oracle here is written independently of ``kk_logic.solve``: it reads the row's
``statements`` text (``ast.literal_eval``, as Logic-RL's data stores it), encodes each assignment as
an integer bit mask and evaluates every statement over all 2^n masks at once with integer bit
operations. The verifier oracle is the ``kk`` reward (Logic-RL's answer parse)."""
from __future__ import annotations

import ast
import random
import re

import numpy as np
import pyarrow.parquet as pq
import pytest

from megatron_rl.data import kk_logic as K


def _oracle_solutions(statements, n: int) -> np.ndarray:
    """Masks m in [0, 2^n) (bit i set = person i is a knight) where every speaker's truth equals their bit."""
    m = np.arange(1 << n, dtype=np.int64)
    bit = lambda i: (m >> i) & 1 == 1  # noqa: E731

    def val(s):
        if s[0] == "telling-truth":
            return bit(s[1])
        if s[0] == "lying":
            return ~bit(s[1])
        if s[0] == "not":
            return ~val(s[1])
        x, y = val(s[1]), val(s[2])
        return {"and": x & y, "or": x | y, "->": ~x | y, "<=>": ~(x ^ y)}[s[0]]

    ok = np.ones(1 << n, dtype=bool)
    for i, s in enumerate(statements):
        ok &= val(s) == bit(i)
    return m[ok]


def _roles(mask: int, n: int) -> list[bool]:
    return [bool(mask >> i & 1) for i in range(n)]


def test_1000_puzzles_per_size_2_to_11_have_exactly_one_solution():
    for n in range(2, 12):
        rng = random.Random(n)
        for _ in range(1000):
            p = K.generate(n, rng)
            stmts = ast.literal_eval(K.to_row(p, "t", 0)["reward_model"]["ground_truth"]["statements"])
            sols = _oracle_solutions(stmts, n)
            assert len(sols) == 1, (n, stmts)
            assert _roles(int(sols[0]), n) == list(p.solution)


def test_phrasing_and_answer_text_are_logic_rls():
    rng = random.Random(3)
    p = K.generate(5, rng)
    assert p.quiz.startswith("A very special island is inhabited only by knights and knaves. Knights always tell the "
                             "truth, and knaves always lie. You meet 5 inhabitants: ")
    assert p.quiz.endswith(" So who is a knight and who is a knave?")
    assert len(set(p.names)) == 5 and all(name in p.quiz for name in p.names)
    lines = p.solution_text_format.split("\n")
    assert [ln.split()[0] for ln in lines] == ["(1)", "(2)", "(3)", "(4)", "(5)"]
    for ln, name, knight in zip(lines, p.names, p.solution):
        assert ln.endswith(f"{name} is a {'knight' if knight else 'knave'}")
    names = ["Ava", "Noah"]
    assert K.statement_text(names, ("->", ("telling-truth", 0), ("lying", 1))) == "If Ava is a knight then Noah is a knave"
    assert K.statement_text(names, ("<=>", ("lying", 0), ("telling-truth", 1))) == \
        "Ava is a knave if and only if Noah is a knight"
    assert K.statement_text(names, ("not", ("lying", 1))) == "Noah is not a knave"
    assert K.statement_text(names, ("or", ("lying", 1), ("telling-truth", 0))) == "Noah is a knave or Ava is a knight"
    # every operator kind and several ways of reporting speech occur over a few hundred puzzles
    rng = random.Random(0)
    ps = [K.generate(6, rng) for _ in range(300)]
    ops = {s[0] for p in ps for s in p.statements}
    assert ops == {"telling-truth", "lying", "not", "and", "or", "->", "<=>"}
    assert sum(" said that " in p.quiz for p in ps) > 10 and sum(" if and only if " in p.quiz for p in ps) > 10


def test_reference_verifier_scores_the_solution_1_and_a_one_role_flip_0():
    from megatron_rl.rewards.registry import get_reward

    kk = get_reward("kk")
    rng = random.Random(7)
    for n in (2, 4, 8, 11):
        for _ in range(20):
            p = K.generate(n, rng)
            gt = K.to_row(p, "test", 0)["reward_model"]["ground_truth"]
            good = f"<think>reasoning</think><answer> {p.solution_text_format} </answer>"
            assert float(kk(good, gt)) == 1.0
            i = rng.randrange(n)
            flipped = p.solution_text_format.split("\n")
            flipped[i] = re.sub(r"knight$|knave$", lambda m: "knave" if m.group() == "knight" else "knight", flipped[i])
            assert float(kk(f"<answer>{chr(10).join(flipped)}</answer>", gt)) == 0.0


def test_row_is_verl_schema_with_the_logic_rl_prompt():
    p = K.generate(4, random.Random(1))
    row = K.to_row(p, "train", 3)
    assert row["data_source"] == "kk_logic"
    assert [m["role"] for m in row["prompt"]] == ["system", "user"]
    assert "<answer> (1) Zoey is a knight\n(2) ... </answer>" in row["prompt"][0]["content"]
    assert row["prompt"][1]["content"] == p.quiz
    assert row["reward_model"]["style"] == "rule"
    assert set(row["reward_model"]["ground_truth"]) == {"solution_text_format", "statements"}
    assert row["extra_info"] == {"split": "train", "index": 3, "n_people": 4}
    from megatron_rl.rewards.manager import RewardManager

    assert RewardManager().name_of(row["data_source"]) == "kk"


def _generate(out, *extra):
    from megatron_rl.cli import main

    return main(["data", "generate", "kk", "--out", str(out), "--train-per-size", "60", "--test-per-size", "20",
                 "--ood-count", "15", *extra])


def test_cli_splits_are_deterministic_disjoint_and_named_per_contract(tmp_path, capsys):
    assert _generate(tmp_path / "a", "--seed", "5") == 0
    assert _generate(tmp_path / "b", "--seed", "5") == 0
    assert _generate(tmp_path / "c", "--seed", "6") == 0
    files = ["train.parquet", "kk_4_8/test.parquet", "kk_9/test.parquet", "kk_10/test.parquet", "kk_11/test.parquet"]
    tables = {f: pq.read_table(tmp_path / "a" / f).to_pylist() for f in files}
    assert {f: len(t) for f, t in tables.items()} == {"train.parquet": 300, "kk_4_8/test.parquet": 100,
                                                      "kk_9/test.parquet": 15, "kk_10/test.parquet": 15,
                                                      "kk_11/test.parquet": 15}
    for f in files:   # the same seed: byte-identical files; another seed: other puzzles
        assert (tmp_path / "a" / f).read_bytes() == (tmp_path / "b" / f).read_bytes()
        assert (tmp_path / "a" / f).read_bytes() != (tmp_path / "c" / f).read_bytes()
    people = {f: sorted({r["extra_info"]["n_people"] for r in t}) for f, t in tables.items()}
    assert people == {"train.parquet": [4, 5, 6, 7, 8], "kk_4_8/test.parquet": [4, 5, 6, 7, 8],
                      "kk_9/test.parquet": [9], "kk_10/test.parquet": [10], "kk_11/test.parquet": [11]}
    keys = [K.canonical(ast.literal_eval(r["reward_model"]["ground_truth"]["statements"]))
            for t in tables.values() for r in t]
    assert len(keys) == len(set(keys)) == 445   # no puzzle twice, within or across splits
    import json

    man = json.loads((tmp_path / "a" / "manifest.json").read_text())
    assert man["seed"] == 5 and man["files"]["train.parquet"]["rows"] == 300
    assert man["command"].startswith("megatron-rl data generate kk --out ")
    # the train count does not change the test sets (each split has its own stream)
    assert _generate(tmp_path / "d", "--seed", "5", "--train-per-size", "61") == 0
    assert (tmp_path / "d/kk_9/test.parquet").read_bytes() == (tmp_path / "a/kk_9/test.parquet").read_bytes()


def test_canonical_form_ignores_operand_order_of_symmetric_operators():
    a = (("and", ("lying", 1), ("telling-truth", 0)), ("->", ("lying", 0), ("lying", 1)))
    b = (("and", ("telling-truth", 0), ("lying", 1)), ("->", ("lying", 0), ("lying", 1)))
    c = (("and", ("telling-truth", 0), ("lying", 1)), ("->", ("lying", 1), ("lying", 0)))
    assert K.canonical(a) == K.canonical(b) != K.canonical(c)


def test_cli_out_safety_and_bad_sizes(tmp_path, capsys):
    (tmp_path / "mine.txt").write_text("x")
    assert _generate(tmp_path) == 2
    assert "not empty" in capsys.readouterr().err
    assert _generate(tmp_path / "o") == 0
    assert _generate(tmp_path / "o") == 2
    assert "--force" in capsys.readouterr().err
    assert _generate(tmp_path / "o", "--force") == 0
    assert _generate(tmp_path / "p", "--ood-sizes", "9,60") == 2
    assert "2..51" in capsys.readouterr().err
    with pytest.raises(ValueError, match="2..51"):
        K.generate(1, random.Random(0))


def test_the_documented_command_writes_the_documented_splits(tmp_path, monkeypatch):
    """docs/data-and-benchmarks.md's ``data generate kk`` line, run as written (in a scratch directory):
    the default counts it states (900 / 100 per size, 100 per OOD size)."""
    import shlex
    from pathlib import Path

    from megatron_rl.cli import main

    page = (Path(__file__).resolve().parents[3] / "docs/data-and-benchmarks.md").read_text()
    line = next(ln for ln in page.splitlines() if ln.startswith("megatron-rl data generate kk"))
    monkeypatch.chdir(tmp_path)
    assert main(shlex.split(line)[1:]) == 0
    rows = {f: pq.read_metadata(tmp_path / "data/kk" / f).num_rows
            for f in ("train.parquet", "kk_4_8/test.parquet", "kk_9/test.parquet", "kk_10/test.parquet", "kk_11/test.parquet")}
    assert rows == {"train.parquet": 4500, "kk_4_8/test.parquet": 500, "kk_9/test.parquet": 100,
                    "kk_10/test.parquet": 100, "kk_11/test.parquet": 100}


def test_distinct_puzzle_counts_match_brute_force():
    """``distinct_puzzles`` (mask AND-convolution) against brute force with ``solve`` over every
    statement pair for 2 people, and the statement space covers what the sampler draws."""
    pairs = [(a, b) for a in K.statement_space(0, 2) for b in K.statement_space(1, 2)]
    assert len(pairs) == 21 * 21   # per person: 3 leaves, 3 negations, 6 ordered ->, 3 unordered pairs x and/or/iff
    assert K.distinct_puzzles(2) == sum(len(K.solve(p)) == 1 for p in pairs) == 184
    assert (K.distinct_puzzles(3), K.distinct_puzzles(4), K.distinct_puzzles(5)) == (90116, 81273576, None)
    rng = random.Random(0)
    for n in (2, 3, 4):
        space = [set(K.statement_space(i, n)) for i in range(n)]
        for _ in range(300):
            i = rng.randrange(n)
            assert K.canonical((K.sample_statement(rng, i, n),))[0] in space[i]


def test_all_distinct_two_person_puzzles_are_drawable():
    """The 9/10 cap of ``data generate kk`` is below what rejection sampling reaches: all 184
    two-person puzzles come out of ``generate`` (well under a second)."""
    seen: set = set()
    rng = random.Random(0)
    for _ in range(184):
        K.generate(2, rng, seen)
    assert len(seen) == 184
    with pytest.raises(RuntimeError, match="no new unique-solution"):
        K.generate(2, rng, seen, max_tries=2000)
