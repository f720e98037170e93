"""Answer extraction from model text: last ``\\boxed{}``/``\\fbox{}`` (brace-matched), ``<answer>``
tags, GSM8K ``#### N``. Linear-time scanning; never evaluates anything."""
from __future__ import annotations

import re

_THINK = re.compile(r"<think>.*?</think>", re.S)
_ANSWER = re.compile(r"<answer>(.*?)</answer>", re.S)
_HASH = re.compile(r"####\s*([^\n]+)")
_NUM = re.compile(r"-?\d[\d,]*(?:\.\d+)?")


def strip_think(text: str) -> str:
    """Remove ``<think>…</think>`` blocks."""
    return _THINK.sub("", text)


def last_boxed(text: str) -> str | None:
    """Content of the last ``\\boxed{…}`` / ``\\fbox{…}`` (nested braces counted), or None."""
    best = None
    for key in ("\\boxed", "\\fbox"):
        i = text.rfind(key)
        if i >= 0 and (best is None or i > best[0]):
            best = (i, key)
    if best is None:
        return None
    j = best[0] + len(best[1])
    while j < len(text) and text[j] == " ":
        j += 1
    if j >= len(text) or text[j] != "{":
        return None
    depth, start = 0, j + 1
    for k in range(j, len(text)):
        c = text[k]
        if c == "{":
            depth += 1
        elif c == "}":
            depth -= 1
            if depth == 0:
                return text[start:k]
    return None


def extract_answer(text: str) -> str | None:
    """Final answer: last box, else last ``<answer>`` tag, else ``#### N``; None if absent."""
    b = last_boxed(text)
    if b is not None:
        return b
    tags = _ANSWER.findall(text)
    if tags:
        inner = tags[-1]
        return last_boxed(inner) or inner.strip()
    h = _HASH.findall(text)
    if h:
        return h[-1].strip()
    return None


def gsm8k_hash(text: str) -> str:
    """SCoRe's ``gsm8k_hash`` extractor: last <answer> (commas and a trailing '.' stripped), else
    last ``#### N``, else the last number, else ''."""
    tags = _ANSWER.findall(text)
    if tags:
        return tags[-1].replace(",", "").strip().rstrip(".").strip()
    h = _HASH.findall(text)
    if h:
        return h[-1].replace(",", "").strip().rstrip(".").strip()
    nums = _NUM.findall(text)
    return nums[-1].replace(",", "") if nums else ""
