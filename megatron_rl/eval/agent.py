"""Multi-turn evaluation (``multi_turn.enable``, docs/multi-turn.md): held-out rows run through the run's agent
loops (``agent/rows.AgentRunner``, the loop training samples with: tools, interactions and budgets of the
``multi_turn`` section, each row's ``agent_name`` / ``tools_kwargs`` / ``interaction_kwargs``), shared by
``megatron-rl eval --config`` and the training run's held-out evaluation (``trainer.eval_every``).

Each trajectory is scored as training scores it: the reward of the row's ``data_source`` on the decoded whole
response, its tool turns included. Reported beside the accuracy (``agent/rows.eval_metrics``): ``tool_call_rate``
(trajectories with at least one call), ``tool_success_rate`` (calls that ran without error), ``tool_calls_mean``,
``turns_mean``. Each trajectory is one line of the completions file (``agent/rows.trajectory_record``: the
response, the counters and the turns as chat messages, tool turns included).
"""
from __future__ import annotations

import json
from pathlib import Path

from megatron_rl.agent.rows import AgentRunner, eval_metrics, trajectory_record


def run_agent_eval(runner: AgentRunner, client, rows: list, sampling, tok):
    """``sampling.n`` trajectories per row -> (their ``Rollouts`` with decoded texts, ordered by row then sample;
    the completions-file records; :func:`~megatron_rl.agent.rows.eval_metrics`)."""
    from megatron_rl.rollout.rollouts import (
        from_completions,  # lazy: defers torch to the call
    )

    trajs = runner.run(client, rows, sampling)
    ro = from_completions(rows, trajs, tok)
    records = [trajectory_record(t, text, tok.decode(list(t.prompt_ids))) for t, text in zip(trajs, ro.texts)]
    return ro, records, eval_metrics(trajs)


def write_records(path, records: list[dict]) -> Path:
    """One JSON object per line (``megatron-rl eval --completions`` reads the file back)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in records)
    return path
