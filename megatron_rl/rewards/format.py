"""SCoRe format rewards (spec §2.2): compound 0.25·think + 0.25·answer + 0.5·match, and strict."""
from __future__ import annotations

import re

from megatron_rl.rewards.extract import gsm8k_hash

_THINK_PAIR = re.compile(r"<think>.*?</think>", re.S)
_ANS_PAIR = re.compile(r"<answer>.*?</answer>", re.S)
_STRICT = re.compile(r"\s*<think>(?:(?!</?think>|</?answer>).)*</think>\s*<answer>(?:(?!</?think>|</?answer>).)*</answer>\s*", re.S)


def _match(pred: str, target: str) -> float:
    return 1.0 if gsm8k_hash(pred).strip().lower() == gsm8k_hash(target).strip().lower() and gsm8k_hash(pred) else 0.0


def format_and_match(pred: str, target: str) -> float:
    """0.25·[≥1 think pair] + 0.25·[exactly one answer pair] + 0.5·match."""
    return 0.25 * bool(_THINK_PAIR.search(pred)) + 0.25 * (len(_ANS_PAIR.findall(pred)) == 1) + 0.5 * _match(pred, target)


def strict_format_and_match(pred: str, target: str) -> float:
    """0.5·[text is exactly <think>…</think><answer>…</answer>] + 0.5·match."""
    once = all(pred.count(t) == 1 for t in ("<think>", "</think>", "<answer>", "</answer>"))
    return 0.5 * bool(once and _STRICT.fullmatch(pred)) + 0.5 * _match(pred, target)
