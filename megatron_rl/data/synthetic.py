"""Synthetic verifiable tasks written as verl-convention parquet files (no download needed).

Columns: ``prompt`` (chat messages), ``data_source``, ``reward_model`` {ground_truth, style},
``extra_info`` {split, index}. Tasks:

* ``reverse``: ``R 4831=`` -> ``1384`` (4-digit string reversal; 10^4 inputs; the most reliable task
  a tiny CPU policy learns by RL — notes/cpu_learnability.md)
* ``addition``: ``37+45=`` -> ``082`` (two 2-digit numbers, 3-digit zero-padded sum)

Splits are disjoint by construction: the inputs are shuffled once with ``seed`` and cut.
"""
from __future__ import annotations

import os
import random
from pathlib import Path

from megatron_rl.rewards.knights_knaves import generate_puzzle

TASKS = ("reverse", "addition")


def _items(task: str) -> list[tuple[str, str]]:
    if task == "reverse":
        return [(f"R {i:04d}=", f"{i:04d}"[::-1]) for i in range(10_000)]
    if task == "addition":
        return [(f"{a:02d}+{b:02d}=", f"{a + b:03d}") for a in range(100) for b in range(100)]
    raise ValueError(f"unknown synthetic task {task!r}; supported: {', '.join(TASKS)}")


def split_items(task: str, seed: int, sizes: dict[str, int]) -> dict[str, list[tuple[str, str]]]:
    """Disjoint splits ``{name: [(prompt, answer)]}`` of the task's inputs."""
    items = _items(task)
    random.Random(seed).shuffle(items)
    if sum(sizes.values()) > len(items):
        raise ValueError(f"{task}: requested {sum(sizes.values())} items, only {len(items)} exist")
    out, start = {}, 0
    for name, n in sizes.items():
        out[name] = items[start:start + n]
        start += n
    return out


def task_texts(task: str) -> list[str]:
    """Every prompt + answer string (a corpus to train the task's tokenizer)."""
    return [p + a for p, a in _items(task)]


def write_parquet(rows: list[tuple[str, str]], task: str, split: str, out_path: str | os.PathLike) -> Path:
    """Write ``rows`` as a verl-convention parquet file."""
    import pyarrow as pa  # lazy: defers pyarrow to the call
    import pyarrow.parquet as pq  # lazy: defers pyarrow to the call

    table = pa.table({
        "prompt": [[{"role": "user", "content": p}] for p, _ in rows],
        "data_source": [task] * len(rows),
        "reward_model": [{"ground_truth": a, "style": "rule"} for _, a in rows],
        "extra_info": [{"split": split, "index": i} for i in range(len(rows))],
    })
    out = Path(out_path)
    out.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(table, out)
    return out


def write_knights_knaves(out_path: str | os.PathLike, n_people: int | tuple[int, int], count: int, seed: int = 0,
                         split: str = "train") -> Path:
    """Knights & Knaves puzzles (unique solution, brute-force checked) as verl parquet; ``n_people``
    an int or an inclusive range (e.g. (4, 8) for training, 9 / 10 / 11 for OOD evaluation)."""
    import pyarrow as pa  # lazy: defers pyarrow to the call
    import pyarrow.parquet as pq  # lazy: defers pyarrow to the call

    lo, hi = (n_people, n_people) if isinstance(n_people, int) else n_people
    rng = random.Random(seed)
    puzzles = [generate_puzzle(rng.randint(lo, hi), seed * 1_000_003 + i) for i in range(count)]
    instr = ("A very special island is inhabited only by knights and knaves. Knights always tell the truth, "
             "and knaves always lie. {q} Who is a knight and who is a knave? Give the final answer in \\boxed{{}}.")
    table = pa.table({
        "prompt": [[{"role": "user", "content": instr.format(q=p["question"])}] for p in puzzles],
        "data_source": ["knights_knaves"] * count,
        "reward_model": [{"ground_truth": ", ".join(f"{k} is a {v}" for k, v in p["solution"].items()), "style": "rule"}
                         for p in puzzles],
        "extra_info": [{"split": split, "index": i, "n_people": len(p["names"])} for i, p in enumerate(puzzles)],
    })
    out = Path(out_path)
    out.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(table, out)
    return out


def write_task(task: str, out_dir: str | os.PathLike, seed: int = 0,
               sizes: dict[str, int] | None = None) -> dict[str, Path]:
    """Write ``{split}.parquet`` for each split; returns their paths."""
    sizes = sizes or {"train": 9000, "val": 200, "test": 500}
    return {name: write_parquet(rows, task, name, Path(out_dir) / f"{name}.parquet")
            for name, rows in split_items(task, seed, sizes).items()}
