"""Dataset rows through their agent loops (``multi_turn.enable``, docs/multi-turn.md): what training's rollouts
(``trainer/paths/agent_rollouts.py``), the held-out evaluation and ``megatron-rl eval`` share.

Per row (verl's columns, read as verl's agent loop reads them): the loop its ``agent_name`` names (else the
run's ``multi_turn.loop``), the tools' per-sample ``create`` arguments from ``extra_info.tools_kwargs``
(``{tool: {"create_kwargs": {...}}}``), the interaction of ``extra_info.interaction_kwargs.name``.
:func:`check_agent_rows` refuses a file naming what the run lacks; :class:`AgentRunner` runs the rows;
:func:`eval_metrics` and :func:`trajectory_record` are the evaluation's numbers and completions lines.
"""
from __future__ import annotations

from megatron_rl.agent.interactions import make_interaction
from megatron_rl.agent.loop import Budgets, Trajectory, agent_loop_class
from megatron_rl.agent.run_config import tool_set


def tools_kwargs(extra_info) -> dict | None:
    """A row's ``extra_info.tools_kwargs`` without the entries a parquet struct column fills with null for the
    tools other rows name (pyarrow reads a struct's every field on every row)."""
    kw = (extra_info or {}).get("tools_kwargs") or {}
    return {k: v for k, v in kw.items() if v is not None} or None


def interaction_kwargs(extra_info) -> dict | None:
    """A row's ``extra_info.interaction_kwargs`` when it names an interaction (verl's form; nulls dropped)."""
    kw = {k: v for k, v in ((extra_info or {}).get("interaction_kwargs") or {}).items() if v is not None}
    return kw if kw.get("name") else None


def check_agent_rows(path, where: str, tools) -> None:
    """The agentic columns of parquet ``path`` name what the run has: a row's ``agent_name`` a registered loop, its
    ``extra_info.tools_kwargs`` tools of ``tools`` (and present where ``need_tools_kwargs`` says so), its
    ``extra_info.interaction_kwargs.name`` a registered interaction. One ``ValueError`` line naming the first
    offending row (``where``: how the file was named, e.g. ``data.train=...``) and the fix."""
    import pyarrow.parquet as pq  # lazy: defers pyarrow to the call

    f = pq.ParquetFile(path)
    cols = [c for c in ("agent_name", "extra_info") if c in f.schema_arrow.names]
    for i, r in enumerate(f.read(columns=cols).to_pylist() if cols else []):
        name, extra = r.get("agent_name"), r.get("extra_info") or {}
        if name:
            try:
                agent_loop_class(name)
            except KeyError as e:
                raise ValueError(f"{where}: row {i} agent_name: {e.args[0]}") from None
        kw = extra.get("tools_kwargs") or {}
        if extra.get("need_tools_kwargs") and not kw:
            raise ValueError(f"{where}: row {i} says need_tools_kwargs but has no extra_info.tools_kwargs")
        unknown = sorted(k for k, v in kw.items() if v is not None and k not in tools)
        if unknown:
            raise ValueError(f"{where}: row {i} extra_info.tools_kwargs names tools this run does not configure: "
                             f"{unknown}; add them to multi_turn.tools (registered tools: docs/tools.md)")
        ik = interaction_kwargs(extra)
        if ik:
            try:
                inter = make_interaction(ik.pop("name"))
            except KeyError as e:
                raise ValueError(f"{where}: row {i} extra_info.interaction_kwargs.name: {e.args[0]}") from None
            try:                  # its start arguments, as the loop will hand them (``Interaction.start`` checks them)
                inter.start("check", **ik)
            except (TypeError, ValueError) as e:
                raise ValueError(f"{where}: row {i} extra_info.interaction_kwargs: {e}") from None
            inter.finish("check")


class AgentRunner:
    """The agent loops of one run's ``multi_turn`` section, each built the first time a row names it.
    ``max_response_tokens``: the budget of a whole response (training: ``rollout.max_tokens``)."""

    def __init__(self, cfg, tok, max_response_tokens: int):
        mt = cfg.multi_turn
        self.default, self.tok, self.tools = mt.loop, tok, tool_set(cfg)
        self.budgets = Budgets(max_response_tokens, mt.max_assistant_turns, mt.max_user_turns, mt.max_parallel_calls,
                               mt.max_tool_response_length)
        self.loops: dict = {}
        self.loop(mt.loop)      # built now: a tokenizer without a chat template fails here, at start-up

    def loop(self, name: str):
        if name not in self.loops:
            self.loops[name] = agent_loop_class(name)(self.tok, self.tools, self.budgets)
        return self.loops[name]

    def run(self, client, rows: list, sampling) -> list[Trajectory]:
        """``sampling.n`` trajectories per row (rows: ``prompt_ids``, ``agent_name``, ``extra_info``), ordered by
        row then sample; ``prompt_index`` is the row's position in ``rows``."""
        by_loop: dict[str, list[int]] = {}
        for k, r in enumerate(rows):
            by_loop.setdefault(getattr(r, "agent_name", "") or self.default, []).append(k)
        trajs = []
        for name, ks in by_loop.items():
            kwargs = [tools_kwargs(rows[k].extra_info) for k in ks]
            inter = [interaction_kwargs(rows[k].extra_info) for k in ks]
            for t in self.loop(name).run(client, [list(rows[k].prompt_ids) for k in ks], sampling, kwargs, inter):
                t.prompt_index = ks[t.prompt_index]
                trajs.append(t)
        return sorted(trajs, key=lambda t: (t.prompt_index, t.sample_index))


def eval_metrics(trajs: list) -> dict[str, float]:
    """The evaluation's tool numbers over trajectories (or completions lines with ``turns`` / ``tool_calls`` /
    ``tool_errors``)::

        tool_call_rate    = #{trajectories with >= 1 tool call} / #trajectories
        tool_success_rate = Σ (calls − failed calls) / Σ calls     (absent when no call was made)
        tool_calls_mean   = Σ calls / #trajectories;   turns_mean = Σ assistant turns / #trajectories

    A failed call: an unknown tool, malformed JSON, the tool's exception or time-out (``ToolResult.ok`` false)."""
    get = (lambda t, k: t[k]) if trajs and isinstance(trajs[0], dict) else getattr
    n, calls = max(1, len(trajs)), sum(get(t, "tool_calls") for t in trajs)
    out = {"tool_call_rate": sum(get(t, "tool_calls") > 0 for t in trajs) / n, "tool_calls_mean": calls / n,
           "turns_mean": sum(get(t, "turns") for t in trajs) / n}
    if calls:
        out["tool_success_rate"] = 1.0 - sum(get(t, "tool_errors") for t in trajs) / calls
    return out


def trajectory_record(t: Trajectory, response: str, prompt: str) -> dict:
    """A completions-file line of one trajectory (``megatron-rl eval``'s format, ``eval/completions.py``): the
    whole ``response`` text (its tool turns included, as the reward reads it), the counters, the turns as chat
    messages (the assistant's with their parsed ``tool_calls``, the tools' responses)."""
    return {"index": t.prompt_index, "sample": t.sample_index, "response": response, "prompt": prompt,
            "turns": t.turns, "tool_calls": t.tool_calls, "tool_errors": t.tool_errors,
            "finish_reason": t.finish_reason, "messages": t.messages}
