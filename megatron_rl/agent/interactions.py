"""Interactions: a registered provider of user turns in a multi-turn rollout (verl's ``BaseInteraction``;
docs/multi-turn.md). After an assistant turn with no tool call, the row's interaction (its
``extra_info.interaction_kwargs.name``) reads the conversation and answers with a user message, or ends it.

Life cycle, per trajectory: ``start(instance_id, **interaction_kwargs)``, ``respond(instance_id, messages) ->
Reply`` after each such turn, ``finish(instance_id)``. Built-in: ``gsm8k`` (verl's ``Gsm8kInteraction``): the last
assistant message is graded by verl's strict GSM8K rule (``rewards/verl_rules.gsm8k_verdict``: the ``#### <n>``
line) against ``ground_truth``; right → "Your response is correct!" and the conversation ends, wrong → "Your
response is incorrect! You need to reflect on your answer and try again." and the policy writes again.
``self_correct`` (SCoRe, docs/methods/score.md): after the first attempt it answers with the self-correction
instruction (start argument ``instruction``; ``turn_ids``, when given, the turn's ids as the chat template renders
it, or the instruction's own ids on a template-less tokenizer: ``trainer/paths/two_attempts.py``), after the
second it ends the conversation.
``@register_interaction(name)`` on a subclass in a module named under ``plugins:`` adds one.
"""
from __future__ import annotations

import abc
import dataclasses

from megatron_rl.agent.class_registry import ClassRegistry
from megatron_rl.rewards.verl_rules import gsm8k_verdict

_HOW = ("register one with @megatron_rl.agent.interactions.register_interaction(name) on an Interaction subclass "
        "in a module named under the config's top-level `plugins:` key")


@dataclasses.dataclass(frozen=True)
class Reply:
    """An interaction's answer: end the conversation (``stop``), the user message ``text``, a turn ``score``;
    ``ids``: the turn's token ids as the template renders it after the assistant's content (appended as they are,
    agent/loop.py), None: the loop renders ``text`` as a user turn."""

    stop: bool
    text: str
    score: float = 0.0
    ids: tuple[int, ...] | None = None


class Interaction(abc.ABC):
    """A user-turn provider (module docstring); the default keeps each instance's kwargs in ``self.instances``."""

    name = ""

    def __init__(self):
        self.instances: dict[str, dict] = {}

    def start(self, instance_id: str, **kwargs) -> None:
        self.instances[instance_id] = dict(kwargs)

    @abc.abstractmethod
    def respond(self, instance_id: str, messages: list[dict]) -> Reply:
        """The user turn after ``messages`` (the trajectory so far), or one that ends it."""

    def finish(self, instance_id: str) -> None:
        self.instances.pop(instance_id, None)


_INTERACTIONS = ClassRegistry("interaction", Interaction, _HOW)
#: class decorator: register an :class:`Interaction` subclass under ``name`` (twice raises)
register_interaction = _INTERACTIONS.register
interaction_names = _INTERACTIONS.names


def make_interaction(name: str) -> Interaction:
    """A new interaction of the registered ``name``; ``KeyError`` with the valid names and how to add one."""
    return _INTERACTIONS.get(name)()


@register_interaction("gsm8k")
class Gsm8kInteraction(Interaction):
    """verl's GSM8K interaction (module docstring)."""

    def respond(self, instance_id: str, messages: list[dict]) -> Reply:
        last = next((m.get("content") or "" for m in reversed(messages) if m.get("role") == "assistant"), "")
        ok = float(gsm8k_verdict(last, self.instances[instance_id].get("ground_truth"))) == 1.0
        if ok:
            return Reply(True, "Your response is correct!", 1.0)
        return Reply(False, "Your response is incorrect! You need to reflect on your answer and try again.", 0.0)


@register_interaction("self_correct")
class SelfCorrectInteraction(Interaction):
    """SCoRe's correction turn (module docstring): the instruction once, then the end."""

    def start(self, instance_id: str, **kwargs) -> None:
        if not str(kwargs.get("instruction", "")).strip() and not kwargs.get("turn_ids"):
            raise ValueError("interaction self_correct needs its `instruction` text (interaction_kwargs)")
        super().start(instance_id, corrected=False, **kwargs)

    def respond(self, instance_id: str, messages: list[dict]) -> Reply:
        inst = self.instances[instance_id]
        if inst["corrected"]:
            return Reply(True, "")
        inst["corrected"] = True
        ids = inst.get("turn_ids")
        return Reply(False, inst.get("instruction", ""), ids=None if ids is None else tuple(ids))
