"""The tool-use demo's task (``megatron-rl demo --task tools``, docs/tool-use-demo.md): products a tiny model
cannot work out in its head, with the built-in ``calculator`` tool.

A row asks ``What is 482 * 37?``; verl's agentic columns (``agent_name: tool_agent``), ``data_source``
``arith_tools``, ``reward_model`` {ground_truth, style rule, reward ``gsm8k_verl``: the answer is the last
``#### N`` of the response}. A right trajectory calls the tool, reads its response, answers::

    <tool_call>
    {"name": "calculator", "arguments": {"expression": "482 * 37"}}
    </tool_call>                                     -> tool: 17834
    #### 17834

:func:`traces` are the warm start's conversations: a share ``call_frac`` of them the call above, the others an
answer written without the tool (the right number, which the tiny model cannot compute: it learns to guess),
so the warm-started policy calls the tool on some samples only and RL has a choice to reinforce.
Splits are disjoint: the pairs are shuffled once with ``seed`` and cut.
"""
from __future__ import annotations

import json
import random
from pathlib import Path

SOURCE = "arith_tools"
SYSTEM = "You are a careful assistant. Use the calculator tool for arithmetic."


def question(a: int, b: int) -> str:
    return f"What is {a} * {b}?"


def split_pairs(seed: int, sizes: dict[str, int]) -> dict[str, list[tuple[int, int]]]:
    """Disjoint ``{split: [(a, b)]}``: a three-digit times a two-digit number (81 000 pairs)."""
    pairs = [(a, b) for a in range(100, 1000) for b in range(10, 100)]
    random.Random(seed).shuffle(pairs)
    if sum(sizes.values()) > len(pairs):
        raise ValueError(f"{SOURCE}: requested {sum(sizes.values())} items, only {len(pairs)} exist")
    out, start = {}, 0
    for name, n in sizes.items():
        out[name], start = pairs[start:start + n], start + n
    return out


def prompt(a: int, b: int) -> list[dict]:
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question(a, b)}]


def row(a: int, b: int, split: str, index: int) -> dict:
    """One verl-schema row (the agentic columns of verl's ``gsm8k_tool_agent_loop.py`` preprocessing)."""
    return {"data_source": SOURCE, "agent_name": "tool_agent", "prompt": prompt(a, b), "ability": "math",
            "reward_model": {"style": "rule", "ground_truth": str(a * b), "reward": "gsm8k_verl"},
            "extra_info": {"split": split, "index": index, "question": question(a, b)}}


def write_task(out_dir, seed: int = 0, sizes: dict[str, int] | None = None) -> dict[str, Path]:
    """``{split: parquet path}`` of the task (default 4000 train, 200 val)."""
    import pyarrow as pa  # lazy: defers pyarrow to the call
    import pyarrow.parquet as pq  # lazy: defers pyarrow to the call

    paths = {}
    for split, pairs in split_pairs(seed, sizes or {"train": 4000, "val": 200}).items():
        paths[split] = Path(out_dir) / f"{split}.parquet"
        paths[split].parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(pa.Table.from_pylist([row(a, b, split, i) for i, (a, b) in enumerate(pairs)]), str(paths[split]))
    return paths


def call_text(a: int, b: int) -> str:
    """The assistant's call, as the hermes format writes it (``agent/tool_calls.py``)."""
    return "<tool_call>\n" + json.dumps({"name": "calculator", "arguments": {"expression": f"{a} * {b}"}}) + "\n</tool_call>"


def traces(pairs: list[tuple[int, int]], call_frac: float, seed: int) -> list[list[dict]]:
    """The warm start's conversations: with probability ``call_frac`` [prompt, the call, the tool's response,
    ``#### a·b``], else [prompt, ``#### a·b`` written directly]."""
    rng = random.Random(seed)
    out = []
    for a, b in pairs:
        if rng.random() < call_frac:
            tail = [{"role": "assistant", "content": call_text(a, b)}, {"role": "tool", "content": str(a * b)},
                    {"role": "assistant", "content": f"#### {a * b}"}]
        else:
            tail = [{"role": "assistant", "content": f"#### {a * b}"}]
        out.append(prompt(a, b) + tail)
    return out
