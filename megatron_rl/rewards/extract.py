"""Answer extraction from model text: last ``\\boxed{}``/``\\fbox{}`` (brace-matched), ``<answer>``
tags, GSM8K ``#### N``. Linear-time scanning; never evaluates anything."""
from __future__ import annotations

import re

_THINK = re.compile(r"<think>.*?</think>", re.S)
_ANSWER = re.compile(r"<answer>(.*?)</answer>", re.S)
_HASH = re.compile(r"####\s*([^\n]+)")
_HASH_NUM = re.compile(r"####\s*(-?[\d,]+(?:\.\d+)?)")
_ANSWER_WS = re.compile(r"<answer>\s*(.*?)\s*</answer>", re.S)
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
    return braced(text, j)


def braced(text: str, j: int) -> str | None:
    """The contents of the brace group that opens at ``text[j]`` (nested braces counted), or None when
    ``text[j]`` is no ``{`` or the group never closes."""
    if j >= len(text) or text[j] != "{":
        return None
    depth = 0
    for k in range(j, len(text)):
        c = text[k]
        if c == "{":
            depth += 1
        elif c == "}":
            depth -= 1
            if depth == 0:
                return text[j + 1:k]
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


def _number(s: str) -> str:
    """SCoRe's number normalisation, in the reference's order: strip, drop ONE trailing-dot run,
    then remove thousands commas (``"5.,"`` -> ``"5."``, ``"1,234."`` -> ``"1234"``)."""
    return s.strip().rstrip(".").replace(",", "").strip()


def gsm8k_hash(text: str) -> str:
    """SCoRe's ``gsm8k_hash`` extractor (docs/methods/score.md): the last ``<answer>`` contents, else the number
    of the last ``#### N`` (``"#### 42 apples"`` -> ``"42"``), else the last number, else ``""``;
    each normalised by :func:`_number`."""
    tags = _ANSWER_WS.findall(text)
    if tags:
        return _number(tags[-1])
    h = _HASH_NUM.findall(text)
    if h:
        return _number(h[-1])
    nums = _NUM.findall(text)
    return _number(nums[-1]) if nums else ""


def first_boxed(text: str) -> str | None:
    """Content of the FIRST ``\\boxed{…}`` (nested braces counted), or None."""
    i = text.find("\\boxed{")
    return None if i < 0 else braced(text, i + len("\\boxed"))


_DOLLARS = re.compile(r"^\$+|\$+$")
_DISPLAY = re.compile(r"^\\\[(.*)\\\]$", re.S)
_FINAL_IS = re.compile(r"final answer is:?\s*", re.I)


def _peel(text: str) -> str:
    """Peel outer ``$…$``, ``\\[…\\]`` and ``\\boxed{…}`` wrappers until none is left."""
    prev = None
    while text != prev:
        prev = text
        text = _DOLLARS.sub("", text).strip()
        m = _DISPLAY.match(text)
        if m:
            text = m.group(1).strip()
            continue
        if text.startswith("\\boxed{"):
            b = first_boxed(text)
            if b is not None:
                text = b.strip()
    return text


def math_final_answer(text: str) -> str:
    """SCoRe's ``math_final_answer`` extractor (docs/methods/score.md): the last ``<answer>`` contents with
    ``$``, ``\\[..\\]`` and ``\\boxed{}`` wrappers peeled, else the FIRST ``\\boxed{}``, else what
    follows "final answer is" (a ``$…$`` span, or the text up to a sentence end / newline), else ``""``."""
    tags = _ANSWER_WS.findall(text)
    if tags:
        return _peel(tags[-1].rstrip("."))
    b = first_boxed(text)
    if b is not None:
        return _peel(b.rstrip("."))
    m = _FINAL_IS.search(text)
    if m:
        rest = text[m.end():]
        span = re.match(r"\$([^$\n]+)\$", rest) or re.match(r"([^\n]+?)(?=\.\s|\.$|\n|$)", rest)
        if span:
            return _peel(span.group(1).rstrip("."))
    return ""


EXTRACTORS = {"gsm8k_hash": gsm8k_hash, "math_final_answer": math_final_answer}
"""SCoRe answer extractors by name (the reference's ``reward.answer_extractor``)."""
