"""What a run's ``multi_turn`` config asks of the agent package (docs/multi-turn.md): the run's tool set and the
options of every chat-template rendering (``tools=`` the tools' schemas, as verl's agent loop renders them)."""
from __future__ import annotations

from megatron_rl.agent.tools import ToolSet


def tool_set(cfg) -> ToolSet | None:
    """The run's tools (``multi_turn.tools``), None without any."""
    return ToolSet(cfg.multi_turn.tools) if cfg.multi_turn.tools else None


def template_kwargs(cfg) -> dict:
    """``data.chat_template_kwargs`` plus, for a multi-turn run with tools, ``tools=`` their schemas: every
    rendering of the chat template (prompts, the generation prompt, the tokenization check) lists them."""
    kw = dict(cfg.data.chat_template_kwargs)
    if cfg.multi_turn.enable and cfg.multi_turn.tools:
        kw["tools"] = tool_set(cfg).schemas()
    return kw
