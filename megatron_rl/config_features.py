"""The optional features' sections of the run configuration: ``lora`` (LoRA adapters on the policy,
docs/lora.md) and ``multi_turn`` (multi-turn rollouts with tools, docs/multi-turn.md). Frozen dataclasses like
``config_sections.py``'s, with the same one-line checks; ``config.py`` re-exports them. A leaf."""
from __future__ import annotations

import dataclasses
from typing import Any

from megatron_rl.config_sections import _check


#: HF projections ``lora.target_modules`` may name (``models/lora.py`` ``TARGETS``; repeated here: config is a leaf)
LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


@dataclasses.dataclass(frozen=True)
class LoraConfig:
    """LoRA on the policy (``models/lora.py``): y = W x + (alpha / rank) · B A x on the targeted projections,
    W frozen; the KL reference is the same policy with its adapters off (no second model)."""

    enable: bool = False
    """Train LoRA adapters instead of the full policy (the base weights are frozen; the optimizer holds the
    adapters only)."""
    rank: int = 16
    """Adapter rank r (>= 1)."""
    alpha: float = 32.0
    """Adapter scale numerator: the update is (alpha / rank) · B A."""
    dropout: float = 0.0
    """Must be 0: the training pass must compute the distribution the rollout engines sampled from (a dropped-out
    adapter would not), so any other value is refused."""
    target_modules: tuple[str, ...] = LORA_TARGETS
    """HF projections with adapters (PEFT's names): q_proj k_proj v_proj o_proj gate_proj up_proj down_proj."""
    push: str = "merged"
    """What the weight sync pushes to the engines: merged (W + (alpha / rank) · B A per projection, the full
    HF weights as without LoRA) | adapter (the adapters only, served by vLLM's LoRA support on the base of
    ``model.hf_path``: ``rollout.engine=vllm``, synchronous rollouts, separate placement; other combinations
    are refused at config load)."""
    init_seed: int = 0
    """Seed of the adapters' initialisation (A uniform, B = 0: the policy starts as the base)."""

    def __post_init__(self):
        object.__setattr__(self, "target_modules", tuple(self.target_modules))
        _check(self.rank >= 1, f"lora.rank must be >= 1, got {self.rank}")
        _check(self.alpha > 0, f"lora.alpha must be > 0, got {self.alpha}")
        _check(self.dropout == 0, f"lora.dropout={self.dropout} refused: it must be 0 (the training pass must compute "
               "the same distribution as the rollout engines, which run the adapters without dropout)")
        bad = sorted(set(self.target_modules) - set(LORA_TARGETS))
        _check(not bad and bool(self.target_modules),
               f"lora.target_modules {bad or '[]'} invalid; valid: {list(LORA_TARGETS)}")
        _check(self.push in ("merged", "adapter"), f"lora.push must be merged|adapter, got {self.push!r}")


#: multi-turn tool formats the parser reads (``agent/tool_calls.py``)
TOOL_FORMATS = ("hermes",)


@dataclasses.dataclass(frozen=True)
class MultiTurnConfig:
    """Multi-turn rollouts with tools (docs/multi-turn.md): an agent loop (``agent/loop.py``) runs each sample's
    turns token in / token out; the loss and the engine-mismatch metrics read the sampled tokens only."""

    enable: bool = False
    """Roll out through the agent loop (GRPO-family methods on the plain path; the others are refused at start-up)."""
    loop: str = "tool_agent"
    """The default agent loop: single_turn_agent | tool_agent | one a ``plugins:`` module registers; a row's
    ``agent_name`` (verl's column) picks another."""
    format: str = "hermes"
    """Tool-call format: hermes (``<tool_call>`` JSON blocks, Qwen2.5 / Qwen3 templates)."""
    max_assistant_turns: int = 5
    """Engine turns per trajectory (>= 1)."""
    max_user_turns: int = 5
    """Tool-response turns per trajectory (>= 0)."""
    max_parallel_calls: int = 1
    """Calls executed per assistant turn (the first ones; >= 1)."""
    max_tool_response_length: int = 256
    """Tokens of one tool response kept (the rest cut before rendering; >= 1)."""
    tools: Any = dataclasses.field(default_factory=dict)
    """The run's tools: a list of registered names, or a mapping name -> the tool's config (``docs/tools.md``)."""
    tokenization_check: str = "warn"
    """Each trajectory's tokens against the chat template applied to its messages: off | warn (metric
    ``multi_turn/template_drift_tokens`` and a warning) | strict (the first drift stops the run naming the turn
    and the differing tokens)."""

    def __post_init__(self):
        tools = self.tools
        if isinstance(tools, (list, tuple)):
            tools = {n: {} for n in tools}
        _check(isinstance(tools, dict) and all(isinstance(k, str) and isinstance(v, (dict, type(None)))
                                               for k, v in tools.items()),
               f"multi_turn.tools: expected a list of tool names or a mapping name -> config, got {self.tools!r}")
        object.__setattr__(self, "tools", {k: dict(v or {}) for k, v in tools.items()})
        _check(self.format in TOOL_FORMATS, f"multi_turn.format={self.format!r} invalid; valid: {list(TOOL_FORMATS)}")
        _check(self.max_assistant_turns >= 1, f"multi_turn.max_assistant_turns must be >= 1, got {self.max_assistant_turns}")
        _check(self.max_user_turns >= 0, f"multi_turn.max_user_turns must be >= 0, got {self.max_user_turns}")
        _check(self.max_parallel_calls >= 1, f"multi_turn.max_parallel_calls must be >= 1, got {self.max_parallel_calls}")
        _check(self.max_tool_response_length >= 1,
               f"multi_turn.max_tool_response_length must be >= 1, got {self.max_tool_response_length}")
        _check(self.tokenization_check in ("off", "warn", "strict"),
               f"multi_turn.tokenization_check={self.tokenization_check!r} invalid; valid: off|warn|strict")
