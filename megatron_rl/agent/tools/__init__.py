"""Tools for multi-turn rollouts (docs/tools.md): the registry and the tool set a rollout calls
(``tools/registry.py``), schemas from type hints (``tools/schema.py``), the process sandbox
(``tools/sandbox.py``) and the built-in tools (``tools/builtin.py``: ``calculator``, ``code_interpreter``,
``calc_gsm8k_reward``), registered when this package is imported. Imports nothing of the trainer or rollout.
"""
from __future__ import annotations

from megatron_rl.agent.tools import builtin as _builtin  # noqa: F401  (registers the built-in tools)
from megatron_rl.agent.tools.registry import (
           FunctionTool,
           Tool,
           ToolSet,
           ToolStats,
           make_tool,
           register_tool,
           tool_names,
)
from megatron_rl.agent.tools.sandbox import (
           Sandbox,
           SandboxLimits,
           SandboxResult,
           SandboxUnavailable,
)
from megatron_rl.agent.tools.types import (
           ERROR_KINDS,
           BadCall,
           ToolCall,
           ToolError,
           ToolResult,
           ToolTimeout,
)

__all__ = ["ERROR_KINDS", "BadCall", "FunctionTool", "Sandbox", "SandboxLimits", "SandboxResult", "SandboxUnavailable",
           "Tool", "ToolCall", "ToolError", "ToolResult", "ToolSet", "ToolStats", "ToolTimeout", "make_tool",
           "register_tool", "tool_names"]
