"""Agent loops: multi-turn rollouts token in / token out (docs/multi-turn.md).

A loop turns each prompt (token ids) into a :class:`Trajectory` by alternating engine turns and tool turns,
never re-templating what the engine sampled::

    context = prompt
    repeat:
        turn = engine.generate(context)                  sampled ids kept as sampled   (mask 1, engine log-probs)
        calls = parse_tool_calls(decode(turn))           hermes <tool_call> blocks (agent/tool_calls.py)
        stop if: turn hit the response budget ("length") | max_assistant_turns | max_user_turns
        no call: the row's interaction (agent/interactions.py) answers with a user turn
                 (sep + <|im_start|>user\n{text}<|im_end|>\n + generation_prompt, or its own ids, mask 0), or it
                 ends (no interaction: ends)
        results = ToolSet.call(c) for c in calls[:max_parallel_calls]     failures come back as error text
        obs = encode(sep + render_tool_responses(texts) ) + generation_prompt     (mask 0, log-prob 0)
        stop ("length") if |response| + |obs| >= max_response_tokens      (the response ends on a sampled token)
        context += turn + obs

``sep`` is ``"\\n"`` after a turn that ended with ``<|im_end|>`` (what the chat template writes after it),
``"<|im_end|>\\n"`` otherwise. A user turn (an interaction's or a tool response) counts against
``max_user_turns``. Each tool text is cut to ``max_tool_response_length`` tokens before rendering. An
interaction may answer with the ids of its turn as the template renders it after the assistant's content
(``Reply.ids``; SCoRe's correction turn, ``trainer/paths/two_attempts.py``): they are appended as they are,
except that ids opening with the EOS id share it with a turn that ended on EOS (ChatML's closing
``<|im_end|>`` is written once).
``generation_prompt`` is the tokenizer's own: its chat template rendered with and without
``add_generation_prompt`` (:func:`generation_prompt_ids`; Qwen3 with thinking off adds an empty think block).

Per trajectory: ``response_ids`` (every token after the prompt), ``response_mask`` (1 = sampled by the
policy, 0 = tool / template tokens), ``logprobs`` (the engine's, 0 where the mask is 0), ``turns`` (assistant
turns), ``tool_calls``, ``tool_errors`` and ``messages`` (the turns as chat messages, for the tokenization
check), ``turn_finish`` (each turn's finish reason). The token budget: a turn's ``max_tokens`` is
``max_response_tokens − |response|`` (the rollout's ``max_tokens``), so a response never exceeds the training
frame, capped at ``max_turn_tokens`` when that is set (a turn cut by that cap alone goes on to the next turn).

Without tools (``tools=None``: a loop of engine and interaction turns, SCoRe's) a turn's text is not read for
calls, and a tokenizer without a chat template serves as long as every interaction answers with ids.

Batching: every turn is one ``generate`` call over the live trajectories that share a turn budget;
turn 0 is the plain call (``n`` samples per prompt, the caller's sampling), later turns ``n=1`` with seed
``seed + 104729 · turn`` (the engine adds the context's index): turn k draws as generation round k of the step
(``rollout.rollouts.sampling_seed``'s round stride; the step stride 7919 would give turn 1 the next step's seed).

Registry: ``single_turn_agent`` (one engine turn, mask all 1: the plain rollout), ``tool_agent`` (the loop
above); :func:`register_agent_loop` on a subclass of :class:`AgentLoop` in a module named under the
config's ``plugins:`` adds one. Imports nothing of the trainer or rollout packages (the engine is duck-typed:
``generate(prompts, sampling)``; ``sampling`` a dataclass with ``n``, ``max_tokens``, ``seed``).
"""
from __future__ import annotations

import abc
import dataclasses
import uuid

from megatron_rl.agent.class_registry import ClassRegistry
from megatron_rl.agent.interactions import make_interaction
from megatron_rl.agent.tool_calls import (
    IM_END,
    IM_START,
    parse_tool_calls,
    render_tool_responses,
)

_HOW = ("register one with @megatron_rl.agent.loop.register_agent_loop(name) on an AgentLoop subclass in a "
        "module named under the config's top-level `plugins:` key")


@dataclasses.dataclass(frozen=True)
class Budgets:
    """The limits of one trajectory (verl's ``multi_turn`` names)."""

    max_response_tokens: int
    max_assistant_turns: int = 5
    max_user_turns: int = 5
    max_parallel_calls: int = 1
    max_tool_response_length: int = 256
    max_turn_tokens: int = 0
    """A turn's own token cap (0: only the remaining ``max_response_tokens``)."""


@dataclasses.dataclass
class Trajectory:
    """One multi-turn rollout (a ``Completion`` plus its mask and counters)."""

    prompt_index: int
    sample_index: int
    prompt_ids: tuple[int, ...]
    response_ids: list[int] = dataclasses.field(default_factory=list)
    logprobs: list[float] = dataclasses.field(default_factory=list)
    response_mask: list[int] = dataclasses.field(default_factory=list)
    finish_reason: str = "stop"
    turns: int = 0
    tool_calls: int = 0
    tool_errors: int = 0
    tool_rewards: dict = dataclasses.field(default_factory=dict)
    messages: list[dict] = dataclasses.field(default_factory=list)
    versions: tuple[int, ...] = ()
    turn_starts: list[int] = dataclasses.field(default_factory=list)
    """Where each assistant turn starts in ``response_ids``."""
    interaction_turns: int = 0
    """User turns an interaction wrote (``agent/interactions.py``)."""
    turn_finish: list[str] = dataclasses.field(default_factory=list)
    """Each assistant turn's finish reason (``finish_reason`` is the last one's)."""


def generation_prompt_ids(tokenizer) -> list[int]:
    """The ids the tokenizer's chat template appends for ``add_generation_prompt`` (rendered with and
    without it for one user message; the difference must be a suffix)."""
    msgs = [{"role": "user", "content": "x"}]
    with_, without = tokenizer.apply_chat_template(msgs, True), tokenizer.apply_chat_template(msgs, False)
    if not with_.startswith(without) or with_ == without:
        raise ValueError("multi_turn: the tokenizer's chat template has no generation prompt to append after a tool "
                         "response (a chat model's tokenizer with a ChatML-style template is needed)")
    return list(tokenizer.encode(with_[len(without):]))


class AgentLoop(abc.ABC):
    """Runs trajectories for a batch of prompts (module docstring). ``tools``: a ToolSet or None."""

    name = ""

    def __init__(self, tokenizer, tools, budgets: Budgets):
        self.tok, self.tools, self.budgets = tokenizer, tools, budgets

    @abc.abstractmethod
    def run(self, engine, prompts: list[list[int]], sampling, tools_kwargs: list[dict] | None = None,
            interaction_kwargs: list[dict] | None = None) -> list[Trajectory]:
        """The trajectories of ``prompts`` (one a prompt, in order)."""

    def first_turn(self, engine, prompts, sampling) -> list[tuple[Trajectory, object]]:
        """Turn 0: the plain ``generate`` call; each completion as a new trajectory with its turn."""
        out = []
        for c in engine.generate([list(p) for p in prompts], sampling):
            t = Trajectory(c.prompt_index, c.sample_index, tuple(c.prompt_ids))
            self.add_turn(t, c)
            out.append((t, c))
        return out

    @staticmethod
    def add_turn(t: Trajectory, c) -> None:
        t.turn_starts.append(len(t.response_ids))
        t.response_ids += list(c.response_ids)
        t.logprobs += [float(x) for x in c.logprobs]
        t.response_mask += [1] * len(c.response_ids)
        t.versions = t.versions + tuple(getattr(c, "versions", ()) or ())
        t.finish_reason = c.finish_reason
        t.turn_finish.append(c.finish_reason)
        t.turns += 1


_LOOPS = ClassRegistry("agent loop", AgentLoop, _HOW)
#: class decorator: register an :class:`AgentLoop` subclass under ``name`` (twice raises)
register_agent_loop = _LOOPS.register
agent_loop_names = _LOOPS.names
#: the registered loop class; ``KeyError`` with the valid names and how to add one otherwise
agent_loop_class = _LOOPS.get


@register_agent_loop("single_turn_agent")
class SingleTurnAgentLoop(AgentLoop):
    """One engine turn: the plain rollout (mask all 1)."""

    def run(self, engine, prompts, sampling, tools_kwargs=None, interaction_kwargs=None):
        out = [t for t, _ in self.first_turn(engine, prompts, sampling)]
        for t in out:
            t.messages = [{"role": "assistant", "content": self.tok.decode(t.response_ids)}]
        return out


@register_agent_loop("tool_agent")
class ToolAgentLoop(AgentLoop):
    """Engine turns, tool turns and interaction turns until no call or a budget (module docstring); ``tools=None``:
    engine and interaction turns only."""

    def __init__(self, tokenizer, tools, budgets: Budgets):
        super().__init__(tokenizer, tools, budgets)
        try:
            self.gen_prompt = generation_prompt_ids(tokenizer)
        except ValueError:
            if tools is not None:
                raise
            self.gen_prompt = None     # no template: interactions must answer with ids (``_interact``)
        ends = tokenizer.encode(IM_END) if self.gen_prompt is not None else []
        self.im_end = ends[0] if len(ends) == 1 else None

    def run(self, engine, prompts, sampling, tools_kwargs=None, interaction_kwargs=None):
        """``interaction_kwargs``: per prompt, None or verl's ``{"name": <interaction>, ...its start arguments}``."""
        for what, xs in (("tools_kwargs", tools_kwargs), ("interaction_kwargs", interaction_kwargs)):
            if xs is not None and len(xs) != len(prompts):
                raise ValueError(f"{what}: {len(xs)} entries for {len(prompts)} prompts")
        done: list[Trajectory] = []
        live: list[tuple[Trajectory, str]] = []
        self._inter: dict = {}
        try:
            for t, c in self.first_turn(engine, prompts, sampling):
                iid = uuid.uuid4().hex
                if self.tools is not None:
                    self.tools.create(iid, (tools_kwargs or [None] * len(prompts))[t.prompt_index])
                ik = dict((interaction_kwargs or [None] * len(prompts))[t.prompt_index] or {})
                if ik.get("name"):
                    self._inter[iid] = make_interaction(ik.pop("name"))
                    self._inter[iid].start(iid, **ik)
                self._after_turn(t, iid, c, live, done, self.prefill(t.prompt_ids))
            turn = 1
            while live:
                by_budget: dict[int, list] = {}
                for t, iid in live:
                    by_budget.setdefault(self._turn_tokens(t), []).append((t, iid))
                live = []
                for left, group in sorted(by_budget.items()):
                    sp = dataclasses.replace(sampling, n=1, max_tokens=left,
                                             seed=None if sampling.seed is None else (sampling.seed + 104_729 * turn) % 2 ** 31)
                    comps = engine.generate([list(t.prompt_ids) + t.response_ids for t, _ in group], sp)
                    for (t, iid), c in zip(group, comps):
                        self.add_turn(t, c)
                        self._after_turn(t, iid, c, live, done)
                turn += 1
        except BaseException:
            for _, iid in live:
                if self.tools is not None:
                    self.tools.release(iid)
                if iid in self._inter:
                    self._inter.pop(iid).finish(iid)
            raise
        return sorted(done, key=lambda t: (t.prompt_index, t.sample_index))

    def _turn_tokens(self, t: Trajectory) -> int:
        """The next turn's ``max_tokens``: what is left of the response budget, capped at ``max_turn_tokens``."""
        b = self.budgets
        left = b.max_response_tokens - len(t.response_ids)
        return min(left, b.max_turn_tokens) if b.max_turn_tokens > 0 else left

    def _out_of_room(self, t: Trajectory, c) -> bool:
        """The turn hit a token limit other than ``max_turn_tokens`` alone: the response budget is spent."""
        b = self.budgets
        turn_cap_only = 0 < b.max_turn_tokens == len(c.response_ids) and len(t.response_ids) < b.max_response_tokens
        return c.finish_reason == "length" and not turn_cap_only

    def prefill(self, prompt_ids) -> list[int]:
        """The tokens of an assistant turn the prompt already began (after its last generation prompt; usually
        none): turn 0's text is read for calls from there (a prompt may force a call by writing it)."""
        if self.tools is None:
            return []
        g, p = self.gen_prompt, list(prompt_ids)
        for i in range(len(p) - len(g), -1, -1):
            if p[i:i + len(g)] == g:
                return p[i + len(g):]
        return []

    def _after_turn(self, t: Trajectory, iid: str, c, live: list, done: list, prefill: list[int] = ()) -> None:
        """Parse the turn just added; finish the trajectory or append the tool responses and keep it live."""
        b = self.budgets
        text = self.tok.decode(list(prefill) + list(c.response_ids))
        parsed = parse_tool_calls(text) if self.tools is not None else None
        calls = parsed.calls[:b.max_parallel_calls] if parsed is not None else []
        t.messages.append({"role": "assistant", "content": parsed.content if calls else text,
                           "tool_calls": [{"type": "function", "function": {"name": getattr(k, "name", ""),
                                                                            "arguments": getattr(k, "arguments", {})}}
                                          for k in calls]})
        user_turns = t.turns - 1
        if self._out_of_room(t, c) or t.turns >= b.max_assistant_turns or user_turns >= b.max_user_turns:
            return self._finish(t, iid, done)
        sep = "\n" if c.response_ids and c.response_ids[-1] == self.im_end else IM_END + "\n"
        if not calls:
            return self._interact(t, iid, sep, live, done)
        results = [self.tools.call(iid, k) for k in calls]
        t.tool_calls += len(results)
        t.tool_errors += sum(not r.ok for r in results)
        texts = [self._cut(r.text) for r in results]
        obs = list(self.tok.encode(sep + render_tool_responses(texts, None))) + self.gen_prompt
        if self._append(t, iid, obs, live, done):
            t.messages += [{"role": "tool", "content": x} for x in texts]

    def _interact(self, t: Trajectory, iid: str, sep: str, live: list, done: list) -> None:
        """A turn without a call: the row's interaction answers with a user turn, or the trajectory ends."""
        inter = self._inter.get(iid)
        if inter is None:
            return self._finish(t, iid, done)
        reply = inter.respond(iid, t.messages)
        if reply.stop:
            return self._finish(t, iid, done)
        if reply.ids is not None:
            eos = getattr(self.tok, "eos_id", None)
            shared = bool(reply.ids) and reply.ids[0] == eos and bool(t.response_ids) and t.response_ids[-1] == eos
            obs = list(reply.ids[1:] if shared else reply.ids)
        elif self.gen_prompt is None:
            raise ValueError(f"interaction {inter.name!r} answered with text, but the tokenizer has no chat template "
                             "to render a user turn; answer with Reply.ids")
        else:
            obs = list(self.tok.encode(f"{sep}{IM_START}user\n{reply.text}{IM_END}\n")) + self.gen_prompt
        if self._append(t, iid, obs, live, done):
            t.interaction_turns += 1
            t.messages.append({"role": "user", "content": reply.text})

    def _append(self, t: Trajectory, iid: str, obs: list[int], live: list, done: list) -> bool:
        """Append non-policy tokens (mask 0, log-prob 0) and keep the trajectory live (True), unless they would
        not leave room for a sampled token (then it ends, "length": False)."""
        b = self.budgets
        if len(t.response_ids) + len(obs) >= b.max_response_tokens:
            t.finish_reason = "length"
            self._finish(t, iid, done)
            return False
        t.response_ids += obs
        t.logprobs += [0.0] * len(obs)
        t.response_mask += [0] * len(obs)
        if t.versions:      # an engine labelling tokens with weight versions: a tool token takes its turn's
            t.versions += (t.versions[-1],) * len(obs)
        live.append((t, iid))
        return True

    def _cut(self, text: str) -> str:
        ids = self.tok.encode(text)
        n = self.budgets.max_tool_response_length
        return text if len(ids) <= n else self.tok.decode(ids[:n])

    def _finish(self, t: Trajectory, iid: str, done: list) -> None:
        if self.tools is not None:
            t.tool_rewards = self.tools.rewards(iid)
            self.tools.release(iid)
        if iid in self._inter:
            self._inter.pop(iid).finish(iid)
        done.append(t)


def loop_metrics(trajs: list[Trajectory]) -> dict[str, float]:
    """Batch means: ``multi_turn/turns_mean``, ``multi_turn/tool_calls_mean``, ``multi_turn/tool_errors_mean``,
    ``multi_turn/policy_token_frac`` (sampled tokens / response tokens)."""
    n = max(1, len(trajs))
    tokens = sum(len(t.response_ids) for t in trajs)
    return {"multi_turn/turns_mean": sum(t.turns for t in trajs) / n,
            "multi_turn/tool_calls_mean": sum(t.tool_calls for t in trajs) / n,
            "multi_turn/tool_errors_mean": sum(t.tool_errors for t in trajs) / n,
            "multi_turn/interaction_turns_mean": sum(t.interaction_turns for t in trajs) / n,
            "multi_turn/policy_token_frac": sum(sum(t.response_mask) for t in trajs) / max(1, tokens)}
