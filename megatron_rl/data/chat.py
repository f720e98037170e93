"""Token layouts through a tokenizer's chat template, for data paths that edit a rendered prompt.

A rollout's tokens must reach the loss exactly as the engine sampled them, so the paths that put
more text around them (BiCC contexts inside the user turn, SCoRe's second turn after an assistant
answer) never decode and re-encode a sampled answer. They render the template around a sentinel
instead, split the rendered text at the sentinel, and encode only the template's own text; the
sampled ids are spliced in whole (what multi-turn RL stacks call "token in, token out").

For template-less tokenizers (the SentencePiece demo fixture) :func:`has_chat_template` is False and
callers keep their inline layouts.
"""
from __future__ import annotations

import dataclasses

SENTINEL = "\u2063MRLSENTINEL\u2063"
"""Marker rendered in place of a message's content and split on; it is never encoded."""
BICC_HEADER = "\n\nOther attempts at this problem (for reference):\n\n"
"""BiCC context header (docs/methods/bicc-rcc.md, consequence 2: a short fixed header inside the user turn)."""
BICC_DELIMITER = "\n\n---\n\n"
"""Written after each opposite-partition trace (docs/methods/bicc-rcc.md, consequence 2: a fixed delimiter)."""


def has_chat_template(tok) -> bool:
    """True for HF tokenizers that carry a chat template."""
    inner = getattr(tok, "tok", None)
    return inner is not None and getattr(inner, "chat_template", None) is not None


def _render(tok, messages: list[dict], add_generation_prompt: bool) -> str:
    return tok.apply_chat_template(messages, add_generation_prompt=add_generation_prompt)


def split_at_sentinel(text: str) -> tuple[str, str]:
    if text.count(SENTINEL) != 1:
        raise ValueError("chat template rendered the probe message 0 or >1 times; cannot locate a turn boundary")
    a, b = text.split(SENTINEL)
    return a, b


@dataclasses.dataclass(frozen=True)
class UserTurnEnd:
    """Where the last user message's content ends inside a rendered prompt: the prompt's last
    ``len(tail)`` ids are the template text after it (ChatML: ``<|im_end|>\\n<|im_start|>assistant\\n``)."""

    tail: tuple[int, ...]

    @classmethod
    def of(cls, tok) -> "UserTurnEnd":
        _, after = split_at_sentinel(_render(tok, [{"role": "user", "content": SENTINEL}], True))
        return cls(tuple(tok.encode(after)))

    def insert_point(self, prompt_ids) -> int:
        """Index in ``prompt_ids`` right after the user content (before the end-of-turn text)."""
        n = len(self.tail)
        if n == 0 or tuple(prompt_ids[-n:]) != self.tail:
            raise ValueError("prompt does not end with the chat template's end-of-user-turn + generation prompt "
                             f"({n} ids); was it rendered with add_generation_prompt=True by this tokenizer?")
        return len(prompt_ids) - n


@dataclasses.dataclass(frozen=True)
class NextUserTurn:
    """Template ids that close an assistant answer and open a new user turn carrying ``instruction``
    plus the generation prompt: the second prompt is ``x1 ++ y1 ++ suffix`` with y1's ids verbatim.

    ``closes_with_eos``: the suffix starts with the EOS id (ChatML's ``<|im_end|>``), so a y1 that
    ended with EOS shares that token instead of closing twice; a truncated y1 (no EOS) is closed by
    the suffix all the same."""

    suffix: tuple[int, ...]
    closes_with_eos: bool

    @classmethod
    def of(cls, tok, instruction: str, probe_messages: list[dict] | None = None) -> "NextUserTurn":
        msgs = probe_messages or [{"role": "system", "content": "s"}, {"role": "user", "content": "q"}]
        first = _render(tok, msgs, True)
        full = _render(tok, msgs + [{"role": "assistant", "content": SENTINEL},
                                    {"role": "user", "content": instruction}], True)
        before, after = split_at_sentinel(full)
        # ``first`` may extend ``before`` with text the generation prompt opens the answer with (Qwen3's
        # ``enable_thinking=false``: an empty think block); x1 carries it and y1 follows it
        if not first.startswith(before):
            raise ValueError("the chat template renders earlier turns differently once an assistant turn follows; "
                             "SCoRe's second prompt needs the first prompt as its exact prefix")
        ids = tuple(tok.encode(after))
        return cls(ids, bool(ids) and ids[0] == tok.eos_id)

    def second_prompt(self, x1: list[int], y1: list[int], eos_id: int) -> list[int]:
        body = list(y1[:-1]) if self.closes_with_eos and y1 and y1[-1] == eos_id else list(y1)
        return list(x1) + body + list(self.suffix)
