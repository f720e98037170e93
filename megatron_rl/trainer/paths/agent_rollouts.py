"""Multi-turn rollouts for the plain sampling path (``multi_turn.enable``, docs/multi-turn.md): the agent loops
(``agent/loop.py``) run each row's trajectories on the rollout client, the result is one :class:`Rollouts`
with its ``response_mask`` (1 = sampled by the policy), which the pipeline folds into the loss mask
(``pipeline/sequences.policy_tokens_only``).

Per row (``agent/rows.py``): the loop its ``agent_name`` names (verl's column; else ``multi_turn.loop``), the tools'
per-sample ``create`` arguments from ``extra_info.tools_kwargs`` (verl's ``{tool: {"create_kwargs": {...}}}``). The
prompts were rendered with the tools' schemas (``agent/run_config.template_kwargs``: ``tools=`` for every
rendering of the chat template, as verl's agent loop renders them). Metrics: ``multi_turn/*`` (``agent.loop.loop_metrics``),
``tool/*`` (the run's counters, ``ToolStats``), ``multi_turn/template_drift_tokens`` and
``multi_turn/template_drift_frac`` (``agent/template_check.py``) unless the check is off.
"""
from __future__ import annotations

import logging

from megatron_rl.agent.loop import loop_metrics
from megatron_rl.agent.rows import AgentRunner
from megatron_rl.agent.template_check import template_drift
from megatron_rl.rollout import rollouts as R

log = logging.getLogger("megatron_rl.multi_turn")


class AgentRollouts:
    """The run's agent loops (``agent/rows.AgentRunner``, built once) and the training batch they make."""

    def __init__(self, cfg, tok):
        self.cfg, self.tok = cfg, tok
        self.runner = AgentRunner(cfg, tok, cfg.rollout.max_tokens)   # a template without a chat template fails here
        self.tools = self.runner.tools
        self.check = cfg.multi_turn.tokenization_check

    def generate(self, client, dataset, indices: list[int], sampling) -> R.Rollouts:
        """Driver only: ``sampling.n`` trajectories per row of ``indices`` (as ``rollouts.generate``)."""
        rows = [dataset[i] for i in indices]
        trajs = self.runner.run(client, rows, sampling)
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
