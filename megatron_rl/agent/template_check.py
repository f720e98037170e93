"""The tokenization check of a multi-turn trajectory (``multi_turn.tokenization_check``, docs/multi-turn.md).

The agent loop keeps the sampled tokens as sampled and appends tool responses rendered as text (never
re-templating the conversation), so what the policy trained on may differ from what the tokenizer's chat
template makes of the same conversation (Qwen3's template drops the empty think block of earlier turns;
a model writes a call in other spacing than the template's ``tojson``; BPE merges across a boundary).
The check renders ``prompt messages + trajectory messages`` with the template (no generation prompt) and
compares token by token with ``prompt_ids + response_ids``:

    common = length of the longest common prefix of the two id lists
    drift  = len(trajectory) − common          (0: the trajectory is a prefix of the template's rendering)

A trajectory may stop short of the template's text (the closing ``\\n`` after ``<|im_end|>``, a turn cut by
the token budget), hence "prefix". :class:`Drift` names the first differing token, the assistant turn it falls
in (``turn_starts``; 0 = the prompt) and a few ids of each side.
"""
from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class Drift:
    tokens: int           # len(trajectory) − common prefix
    at: int               # index of the first differing token in prompt ++ response (-1: none)
    turn: int             # the assistant turn (1-based) holding it; 0 = in the prompt
    ours: tuple[int, ...]
    template: tuple[int, ...]

    def describe(self) -> str:
        return (f"turn {self.turn}: token {self.at} differs from the chat template's rendering "
                f"(trajectory {list(self.ours)} vs template {list(self.template)}; {self.tokens} tokens from there)")


def template_drift(tokenizer, messages: list[dict], prompt_ids, response_ids, turn_starts) -> Drift:
    """The trajectory's drift from the chat template (module docstring)."""
    want = list(tokenizer.encode(tokenizer.apply_chat_template(list(messages), False)))
    have = list(prompt_ids) + list(response_ids)
    common = 0
    for a, b in zip(have, want):
        if a != b:
            break
        common += 1
    if common == len(have):
        return Drift(0, -1, 0, (), ())
    r = common - len(prompt_ids)
    turn = 0 if r < 0 else sum(1 for s in turn_starts if s <= r)
    return Drift(len(have) - common, common, turn, tuple(have[common:common + 6]), tuple(want[common:common + 6]))
