"""The eval inputs and engine: the parquet rows and the completions JSONL, read and checked; their responses
scored; the rollout engine a model is sampled with (``megatron-rl eval`` and its named benchmarks, ``bench.py``,
share them)."""
from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path

from megatron_rl.data.prepare.io import decode_line
from megatron_rl.rewards.sources import row_reward


def load_rows(path):
    """The rows of an eval parquet (verl columns: ``data_source``, ``reward_model``)."""
    import pyarrow.parquet as pq  # lazy: defers pyarrow to the call

    t = pq.read_table(path)
    for col in ("data_source", "reward_model"):
        if col not in t.column_names:
            raise ValueError(f"{path}: missing column {col!r}")
    return t.to_pylist()


def load_completions(path) -> dict[int, list[str]]:
    """Completions JSONL -> {row index: responses}; a bad line is one ``ValueError`` naming it."""
    out: dict[int, list[str]] = defaultdict(list)
    for ln, raw in enumerate(Path(path).read_bytes().splitlines(), 1):
        line = decode_line(path, ln, raw)
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
            idx = int(obj["index"])
        except (ValueError, KeyError, TypeError) as e:
            raise ValueError(f"{path}:{ln}: bad completion line ({e})") from None
        try:
            resp = obj["responses"] if "responses" in obj else [obj["response"]]
        except KeyError:
            raise ValueError(f"{path}:{ln}: a completion line needs 'response' (text) or 'responses' (list of text)") from None
        key = "responses" if "responses" in obj else "response"
        if not isinstance(resp, list) or not all(isinstance(r, str) for r in resp):
            got = obj[key]
            raise ValueError(f"{path}:{ln}: {key!r} must be {'a list of strings' if key == 'responses' else 'a string'}, "
                             f"got {type(got).__name__} {str(got)[:40]!r}")
        out[idx].extend(resp)
    return out


def load_agent_counts(path) -> dict[int, list[dict]] | None:
    """A multi-turn completions file's counters per row (``turns``, ``tool_calls``, ``tool_errors`` of each line,
    in file order: ``agent/rows.trajectory_record``), None when its lines carry none (a single-turn file)."""
    out: dict[int, list[dict]] = defaultdict(list)
    for raw in Path(path).read_bytes().splitlines():
        obj = json.loads(raw) if raw.strip() else None
        if obj is None:
            continue
        if "tool_calls" not in obj:
            return None
        out[int(obj["index"])].append({k: int(obj.get(k, 0)) for k in ("turns", "tool_calls", "tool_errors")})
    return out or None


def score_responses(rows: list, resps: list[list[str]], rm) -> list[list[float]]:
    """Every response of row i (``resps[i]``) scored by the reward its ``data_source`` selects
    (``RewardManager``: the training loop's verifiers and reward pool)."""
    flat = [(i, r) for i in range(len(rows)) for r in resps[i]]
    vals, _ = rm.values([rm.name_of(rows[i]["data_source"], row_reward(rows[i])) for i, _ in flat], [r for _, r in flat],
                        [rows[i]["reward_model"]["ground_truth"] for i, _ in flat])
    by_row: list[list[float]] = [[] for _ in rows]
    for (i, _), v in zip(flat, vals):
        by_row[i].append(float(v))
    return by_row


def check_completions(rows: list, comps: dict, need: int, what: str, completions, data) -> None:
    """Every completion index names a row of ``data`` and every row has ``need`` completions
    (checked before anything is written)."""
    bad = sorted(i for i in comps if not 0 <= i < len(rows))
    if bad:
        raise ValueError(f"{completions}: index {bad[0]} is out of range: --data {data} has {len(rows)} rows "
                         f"(indices 0..{len(rows) - 1}); were the completions made for another data file?")
    for i in range(len(rows)):
        if len(comps.get(i, [])) < need:
            raise ValueError(f"row {i}: {len(comps.get(i, []))} completions, need {what}={need}")


def model_lengths(model_dir, longest_prompt: int, max_tokens: int | None) -> tuple[int, int]:
    """(max_tokens, engine context length) within the model's ``max_position_embeddings``;
    ``max_tokens=None``: 256 or what the positions leave after the longest prompt."""
    positions = int(json.loads((Path(model_dir) / "config.json").read_text()).get("max_position_embeddings", 4096))
    room = positions - longest_prompt
    if max_tokens is None:
        max_tokens = min(256, room)
    if room < 1 or max_tokens > room:
        raise ValueError(f"the longest prompt ({longest_prompt} tokens) + --max-tokens {max_tokens} exceeds the model's "
                         f"max_position_embeddings={positions}; lower --max-tokens")
    return max_tokens, longest_prompt + max_tokens


def open_engine(engine: str, model_dir, context: int, tp: int):
    """A registered rollout engine on ``model_dir`` with a ``context``-token window, ``tp``-way tensor
    parallel when the engine takes those options (``EngineCaps.options``)."""
    from megatron_rl.rollout.registry import caps, make_engine  # lazy: defers torch to the call

    if tp > 1 and caps(engine).tensor_parallel == "never":
        raise ValueError(f"--tp {tp} needs an engine with tensor parallelism (the {engine} engine runs on one device)")
    return make_engine(engine, str(model_dir), **({"max_model_len": context, "tensor_parallel_size": tp}
                                                 if "tensor_parallel_size" in caps(engine).options else {}))
