"""What a run's ``multi_turn`` config asks of the agent package (docs/multi-turn.md): the run's tool set and the
options of every chat-template rendering (``tools=`` the tools' schemas, as verl's agent loop renders them)."""
from __future__ import annotations


def tool_set(cfg):
    """The run's ``ToolSet`` (``multi_turn.tools``), None without any."""
    if not cfg.multi_turn.tools:
        return None
    from megatron_rl.agent.tools import (
        ToolSet,  # lazy: a single-turn run imports no tool (setup reads this module)
    )

    return ToolSet(cfg.multi_turn.tools)


def template_kwargs(cfg) -> dict:
    """``data.chat_template_kwargs`` plus, for a multi-turn run with tools, ``tools=`` their schemas: every
    rendering of the chat template (prompts, the generation prompt, the tokenization check) lists them."""
    kw = dict(cfg.data.chat_template_kwargs)
    if cfg.multi_turn.enable and cfg.multi_turn.tools:
        kw["tools"] = tool_set(cfg).schemas()
    return kw
