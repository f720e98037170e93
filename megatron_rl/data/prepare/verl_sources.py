"""Sources already in verl's columns: DAPO-Math-17k (re-wrapped and de-duplicated: the release repeats
every problem many times) and ``verl``, a validating copy of a released verl parquet (RLCSD's
``Leyiii/RLCSD`` folders, Logic-RL's K&K files): rows load as they are, bad ones are skipped."""
from __future__ import annotations

import collections

from megatron_rl.data import prompts
from megatron_rl.data.prepare.registry import Skip, Source, answer_value, dedupe_key, register, verl_row
from megatron_rl.rewards.sources import MULTIMODAL_COLUMNS, check_counts, row_reward, warn_unmatched

#: BytedTsinghua-SIA/DAPO-Math-17k: ``data_source`` (``math_dapo``), ``prompt`` (one user turn in DAPO's
#: "Answer:" format), ``ability``, ``reward_model`` {ground_truth, style}, ``extra_info`` {index: uuid}
DAPO_COLUMNS = ("data_source", "prompt", "ability", "reward_model", "extra_info")


def user_content(rec: dict) -> str:
    """The last user message of a verl ``prompt`` column; ``Skip`` when the column is not a non-empty
    list of ``{role, content}`` messages with a non-empty user turn."""
    msgs = rec.get("prompt")
    if isinstance(msgs, str):
        raise Skip("prompt is a str, not a list of {role, content} messages")
    if not isinstance(msgs, (list, tuple)) or not msgs:
        raise Skip("null or empty prompt")
    if not all(isinstance(m, dict) and isinstance(m.get("content"), str) for m in msgs):
        raise Skip("prompt is not a list of {role, content} messages")
    users = [m["content"] for m in msgs if m.get("role") == "user"]
    if not users or not users[-1].strip():
        raise Skip("null or empty prompt")
    return users[-1]


def ground_truth(rec: dict) -> object:
    """``reward_model.ground_truth``; ``Skip`` when missing or empty."""
    rm = rec.get("reward_model")
    gt = rm.get("ground_truth") if isinstance(rm, dict) else None
    if gt is None or (isinstance(gt, (str, dict, list)) and not (gt.strip() if isinstance(gt, str) else gt)):
        raise Skip("null or empty reward_model.ground_truth")
    return gt


def dapo(rec: dict, seed: int) -> tuple[str, dict]:
    """DAPO-Math-17k row -> the same row with the problem re-wrapped in DAPO's template (so every row
    has exactly the "Answer:" instruction the ``dapo`` reward reads), data_source ``math_dapo``."""
    problem = prompts.strip_dapo(user_content(rec))
    if not problem:
        raise Skip("null or empty prompt")
    gt = answer_value(ground_truth(rec), "reward_model.ground_truth")
    upstream = rec.get("extra_info") if isinstance(rec.get("extra_info"), dict) else {}
    return dedupe_key(problem), verl_row("math_dapo", prompts.dapo(problem), gt, problem=problem,
                                         uid=str(upstream.get("index") or ""))


def passthrough(rec: dict, seed: int) -> tuple[str, dict]:
    """A verl row, checked (prompt messages, data_source, ground truth) and kept unchanged."""
    content = user_content(rec)
    ds = rec.get("data_source")
    if not isinstance(ds, str) or not ds.strip():
        raise Skip("null or empty data_source")
    ground_truth(rec)
    return dedupe_key(content), rec


def check_rewards(rows: list[dict], by_source: dict[str, str]) -> None:
    """Every passthrough row has a reward here (``rewards/sources.py``: the row's own, the built-in table, or
    ``--reward-by-source``, which is then written into the rows' ``reward_model.reward``) and no row is
    multimodal; else one line naming each unmapped source with its row count."""
    media = sorted({c for r in rows for c in MULTIMODAL_COLUMNS if r.get(c) is not None})
    if media:
        raise ValueError(f"data prepare verl: multimodal rows (a {media[0]!r} column): this project trains and scores "
                         "text-only models; use a text dataset")
    counts = collections.Counter((str(r["data_source"]), row_reward(r)) for r in rows)
    seen = check_counts("data prepare verl", counts, by_source, None, flag="--reward-by-source")
    warn_unmatched("--reward-by-source", by_source, seen, "the rows of data prepare verl")
    for r in rows:
        if r["data_source"] in by_source:
            r["reward_model"] = {**r["reward_model"], "reward": by_source[r["data_source"]]}


register(Source("dapo_math_17k", "BytedTsinghua-SIA/DAPO-Math-17k", dapo, split="train", shuffle=True,
                columns=DAPO_COLUMNS))
register(Source("verl", "a parquet already in verl's columns (RLCSD's, Logic-RL's K&K)", passthrough, split="train",
                dedupe=False))
