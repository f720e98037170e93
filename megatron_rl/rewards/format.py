"""SCoRe format rewards (docs/methods/score.md): compound 0.25·think + 0.25·answer + 0.5·match, and strict."""
from __future__ import annotations

import re

from megatron_rl.rewards.extract import EXTRACTORS, gsm8k_hash

_THINK_PAIR = re.compile(r"<think>.*?</think>", re.S)
_ANS_PAIR = re.compile(r"<answer>.*?</answer>", re.S)
_STRICT = re.compile(r"\s*<think>(?:(?!</?think>|</?answer>).)*</think>\s*<answer>(?:(?!</?think>|</?answer>).)*</answer>\s*", re.S)


def _match(pred: str, target: str, extract=gsm8k_hash) -> float:
    """[normalise(extract(pred)) == normalise(extract(target))], normalise = strip + lowercase: plain
    equality of the extractions, as in the reference — two empty extractions match."""
    return 1.0 if extract(pred).strip().lower() == extract(target).strip().lower() else 0.0


def format_and_match(pred: str, target: str, extract=gsm8k_hash) -> float:
    """0.25·[≥1 think pair] + 0.25·[exactly one answer pair] + 0.5·match."""
    return (0.25 * bool(_THINK_PAIR.search(pred)) + 0.25 * (len(_ANS_PAIR.findall(pred)) == 1)
            + 0.5 * _match(pred, target, extract))


def strict_format_and_match(pred: str, target: str, extract=gsm8k_hash) -> float:
    """0.5·[text is exactly <think>…</think><answer>…</answer>] + 0.5·match."""
    once = all(pred.count(t) == 1 for t in ("<think>", "</think>", "<answer>", "</answer>"))
    return 0.5 * bool(once and _STRICT.fullmatch(pred)) + 0.5 * _match(pred, target, extract)


def exact_match(pred: str, target: str, extract=gsm8k_hash) -> float:
    """SCoRe's ``exact_match`` reward: the match term alone."""
    return _match(pred, target, extract)


def score_rewards() -> dict:
    """Registered names -> reward fn: ``<reward>`` uses ``gsm8k_hash`` (the arithmetic / gsm8k configs),
    ``<reward>_math`` uses ``math_final_answer`` (the math config)."""
    out = {}
    for name, fn in (("format_and_match", format_and_match), ("strict_format_and_match", strict_format_and_match),
                     ("score_exact_match", exact_match)):
        for ext, suffix in (("gsm8k_hash", ""), ("math_final_answer", "_math")):
            out[name + suffix] = (lambda f, e: (lambda p, t: f(p, t, e)))(fn, EXTRACTORS[ext])
    return out
