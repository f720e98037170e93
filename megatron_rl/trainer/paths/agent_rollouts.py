"""Multi-turn rollouts for the plain sampling path (``multi_turn.enable``, docs/multi-turn.md): the agent loops
(``agent/loop.py``) run each row's trajectories on the rollout client, the result is one :class:`Rollouts`
with its ``response_mask`` (1 = sampled by the policy), which the pipeline folds into the loss mask
(``pipeline/sequences.policy_tokens_only``).

Per row: the loop its ``agent_name`` names (verl's column; else ``multi_turn.loop``), the tools' per-sample
``create`` arguments from ``extra_info.tools_kwargs`` (verl's ``{tool: {"create_kwargs": {...}}}``). The
prompts were rendered with the tools' schemas (``agent/run_config.template_kwargs``: ``tools=`` for every
rendering of the chat template, as verl's agent loop renders them). Metrics: ``multi_turn/*`` (``agent.loop.loop_metrics``),
``tool/*`` (the run's counters, ``ToolStats``), ``multi_turn/template_drift_tokens`` and
``multi_turn/template_drift_frac`` (``agent/template_check.py``) unless the check is off.
"""
from __future__ import annotations

import logging

from megatron_rl.agent.loop import Budgets, agent_loop_class, loop_metrics
from megatron_rl.agent.run_config import tool_set
from megatron_rl.agent.template_check import template_drift
from megatron_rl.rollout import rollouts as R

log = logging.getLogger("megatron_rl.multi_turn")


def tools_kwargs(row) -> dict | None:
    """The row's ``extra_info.tools_kwargs`` without the entries a parquet struct column fills with null for the
    tools other rows name (pyarrow reads a struct's every field on every row)."""
    kw = (row.extra_info or {}).get("tools_kwargs") or {}
    return {k: v for k, v in kw.items() if v is not None} or None


def interaction_kwargs(row) -> dict | None:
    """The row's ``extra_info.interaction_kwargs`` when it names an interaction (verl's form; nulls dropped)."""
    kw = {k: v for k, v in ((row.extra_info or {}).get("interaction_kwargs") or {}).items() if v is not None}
    return kw if kw.get("name") else None


class AgentRollouts:
    """The loops of one run, built once (each the first time a row names it)."""

    def __init__(self, cfg, tok):
        mt = cfg.multi_turn
        self.cfg, self.tok, self.tools = cfg, tok, tool_set(cfg)
        self.budgets = Budgets(cfg.rollout.max_tokens, mt.max_assistant_turns, mt.max_user_turns,
                               mt.max_parallel_calls, mt.max_tool_response_length)
        self.loops: dict = {}
        self.check = mt.tokenization_check
        self.loop(mt.loop)      # built at start-up (``build_path``): a tokenizer without a chat template fails here

    def loop(self, name: str):
        if name not in self.loops:
            self.loops[name] = agent_loop_class(name)(self.tok, self.tools, self.budgets)
        return self.loops[name]

    def generate(self, client, dataset, indices: list[int], sampling) -> R.Rollouts:
        """Driver only: ``sampling.n`` trajectories per row of ``indices`` (as ``rollouts.generate``)."""
        rows = [dataset[i] for i in indices]
        by_loop: dict[str, list[int]] = {}
        for k, r in enumerate(rows):
            by_loop.setdefault(getattr(r, "agent_name", "") or self.cfg.multi_turn.loop, []).append(k)
        trajs = []
        for name, ks in by_loop.items():
            kwargs = [tools_kwargs(rows[k]) for k in ks]
            inter = [interaction_kwargs(rows[k]) for k in ks]
            for t in self.loop(name).run(client, [list(rows[k].prompt_ids) for k in ks], sampling, kwargs, inter):
                t.prompt_index = ks[t.prompt_index]
                trajs.append(t)
        trajs.sort(key=lambda t: (t.prompt_index, t.sample_index))
        ro = R.from_completions(rows, trajs, self.tok)
        ro.stats = {**ro.stats, **loop_metrics(trajs), **(self.tools.stats.metrics() if self.tools else {}),
                    **self.drift(rows, trajs)}
        return ro

    def drift(self, rows, trajs) -> dict:
        """The tokenization check (``multi_turn.tokenization_check``): metrics; strict stops at the first drift."""
        if self.check == "off":
            return {}
        total, drifted = 0, 0
        for t in trajs:
            d = template_drift(self.tok, list(rows[t.prompt_index].messages) + t.messages, t.prompt_ids,
                               t.response_ids, t.turn_starts)
            if d.tokens:
                if self.check == "strict":
                    raise RuntimeError(f"multi_turn.tokenization_check=strict: sample {t.prompt_index}/{t.sample_index} "
                                       f"{d.describe()}; set multi_turn.tokenization_check=warn to train on it")
                drifted += 1
                total += d.tokens
                if drifted == 1:
                    log.warning("multi-turn trajectory drifts from the chat template: %s", d.describe())
        return {"multi_turn/template_drift_tokens": total / max(1, len(trajs)),
                "multi_turn/template_drift_frac": drifted / max(1, len(trajs))}
