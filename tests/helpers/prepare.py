"""Shared helpers of the ``data prepare`` tests: write upstream-schema files, prepare, read back, score."""
from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from megatron_rl.data.prepare.pipeline import PrepareRequest, prepare
from megatron_rl.rewards.manager import RewardManager
from megatron_rl.rewards.registry import get_reward
from megatron_rl.rewards.sources import row_reward


def write_parquet(path: Path, records: list[dict]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(records), path)
    return path


def write_jsonl(path: Path, records: list[dict]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records), encoding="utf-8")
    return path


def run(source: str, inp, out: Path, **kw) -> tuple[dict, dict[str, list[dict]]]:
    """Prepare ``inp`` (a path, or ``[(name, path)]``) into ``out``; returns (manifest, rows by split)."""
    inputs = inp if isinstance(inp, list) else [("", str(inp))]
    man = prepare(PrepareRequest(source=source, inputs=[(n, str(p)) for n, p in inputs], out=str(out), **kw))
    rows = {split: pq.read_table(out / o["file"]).to_pylist() for split, o in man["outputs"].items()}
    return man, rows


def reward_of(row: dict, default: str = "math"):
    """The reward the training loop's manager picks for ``row`` (the reward the prepared row names, else its
    data_source's; ``default``: the config's ``reward.default``, here the RLCSD configs' ``math``), as a function."""
    return get_reward(RewardManager(default=default).name_of(row["data_source"], row_reward(row)))


def score(row: dict, response: str, default: str = "math") -> float:
    return float(reward_of(row, default)(response, row["reward_model"]["ground_truth"]))


def user_text(row: dict) -> str:
    return [m["content"] for m in row["prompt"] if m["role"] == "user"][-1]
