"""A tiny chat model whose tokenizer carries a real tool-calling chat template, for the agent-loop tests.

The tokenizer is the chat fixture's (byte-level BPE with Qwen's special tokens, ``tests/helpers/chat_fixture.py``,
~2 s); its template is replaced by the Qwen3-family tool template vLLM ships
(``vllm/transformers_utils/chat_templates/template_minicpmv45.jinja``: ``<tools>`` in the system turn,
``<tool_call>`` blocks for an assistant message's ``tool_calls``, consecutive ``tool`` messages in one
``<|im_start|>user`` turn as ``<tool_response>`` blocks, Qwen3's ``enable_thinking`` and its dropping of
empty think blocks in earlier turns): the oracle the loop's tokens are compared with, written by neither side.
The model: a random 2-layer Qwen3 of that vocabulary (``chat_fixture.make_model``).
"""
from __future__ import annotations

import importlib.util
from pathlib import Path


def qwen3_tool_template() -> str:
    spec = importlib.util.find_spec("vllm")     # the file only: importing vllm is not needed
    return (Path(spec.origin).parent / "transformers_utils" / "chat_templates" / "template_minicpmv45.jinja").read_text()


def build_tool_model(d: Path) -> Path:
    """Tokenizer (with the tool template) + random tiny Qwen3 saved in ``d``; returns ``d``."""
    from tests.helpers.chat_fixture import make_model, train_tokenizer

    d = Path(d)
    fast = train_tokenizer(d)
    fast.chat_template = qwen3_tool_template()
    fast.save_pretrained(str(d))
    make_model(d, fast).save_pretrained(str(d))
    return d
