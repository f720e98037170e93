"""verl's GSM8K-with-tools rows, in the schema ``examples/data_preprocess/gsm8k_multiturn_w_tool.py`` writes
(and ``gsm8k_tool_agent_loop.py``, which adds the ``agent_name`` column): ``data_source`` ``openai/gsm8k``, a
[system, user] ``prompt`` telling the model to call ``calc_gsm8k_reward``, ``ability`` ``math``,
``reward_model`` {style: rule, ground_truth}, ``extra_info`` {split, index, answer, question,
need_tools_kwargs: true, tools_kwargs: {calc_gsm8k_reward: {create_kwargs: {ground_truth}}},
interaction_kwargs: {query, ground_truth}}."""
from __future__ import annotations

from pathlib import Path

SYSTEM = ("You are a math expert. You are given a question and you need to solve it step by step. Reasoning step by "
          "step before any tool call. You should use the `calc_gsm8k_reward` tool after step by step solving the "
          "question, before generate final answer at least once and refine your answer if necessary. Put your final "
          "answer in the format of `#### <answer>`.")
INSTRUCTION = "Let's think step by step and output the final answer after `####`."
ITEMS = [("Tom has 3 apples and buys 4 more. How many apples does he have?", "3 + 4 = <<3+4=7>>7\n#### 7", "7"),
         ("A box holds 6 pens. How many pens are in 5 boxes?", "6 * 5 = <<6*5=30>>30\n#### 30", "30")]


def rows(agent_name: str | None = "tool_agent", **extra) -> list[dict]:
    out = []
    for i, (q, raw, sol) in enumerate(ITEMS):
        question = q + " " + INSTRUCTION
        r = {"data_source": "openai/gsm8k",
             "prompt": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}],
             "ability": "math", "reward_model": {"style": "rule", "ground_truth": sol},
             "extra_info": {"split": "train", "index": i, "answer": raw, "question": q, "need_tools_kwargs": True,
                            "tools_kwargs": {"calc_gsm8k_reward": {"create_kwargs": {"ground_truth": sol}}},
                            "interaction_kwargs": {"query": question, "ground_truth": sol}, **extra}}
        if agent_name is not None:
            r["agent_name"] = agent_name
        out.append(r)
    return out


def write(path: Path, table_rows: list[dict]) -> Path:
    import pyarrow as pa
    import pyarrow.parquet as pq

    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(table_rows), str(path))
    return path
