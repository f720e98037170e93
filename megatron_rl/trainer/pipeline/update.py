"""The one update pipeline every data path feeds (``rl_step`` calls :func:`update`), cut by stage; a
response token enters each stage once:

    1 sequences  (``pipeline/sequences.py``)
         path.sampled(data)              the sequences the policy sampled, per-row inputs (the path)
         -> behaviour                    the engines' log-prob and staleness of every token, once
    2 log-prob passes  (``pipeline/logprobs.py``)
         -> old / ref log-probs          whole batch, once (the proximal and reference policies;
                                         ``algo.off_policy=bypass``: old := the engine's, no pass),
                                         the trainer-vs-engine gap and mismatch metrics
    3 rows and corrections  (``pipeline/rows.py``)
         -> path.join_rewards            rewards scored beside the passes land (``rollout/pending_rewards.py``),
                                         then the step's reward / length metrics
         -> in-reward KL -> path.after_logprobs
         -> advantages                   whole batch, once (registered estimator)
         -> base rows -> path.train_rows the rows the loss trains on, with the off-policy / rollout-
                                         correction weights and keep mask (folded into the mask after
                                         the path's hook) — the path's: conditioned sequences,
                                         a filtered subset, a per-row teacher plan
    4 the update  (here)
         -> [epoch]* [mini-batch]*       ``trainer.ppo_epochs`` x the rows cut IN ORDER (no shuffle,
                                         as the references) into ``trainer.mini_batch_prompts`` x
                                         ``rollout.n`` rows
              -> path.mini_batch_inputs  the path's per-mini-batch inputs under the weights of THAT
                                         moment (the teacher family's support passes)
              -> batch statistics        the loss's whole-mini-batch fields (registry)
              -> micro-batches -> objective -> one optimizer step   (``actor.train_step``)
              -> path.after_optimizer_step    (teacher EMA / snapshot counter)

Nothing here knows a method name: what runs is asked of the path (its hooks, each handed an
:class:`~megatron_rl.trainer.contract.UpdateContext`) and of the
registries (the loss's ``support`` and ``batch_stats``). Each mini-batch is one global batch of
``actor.train_step``: split over DP ranks and micro-batches there, normalised by its own token /
row counts (global over DP). ``mini_batch_prompts`` = 0 (the default) is one mini-batch = the whole
batch, which is exactly the earlier one-step update.

LR schedule: the scheduler advances once per RL step (on its first optimizer step), so
``optim.warmup_steps`` and the decay count RL steps, as verl's actor scheduler does (it steps once
per ``update_actor``); every mini-batch of a step uses that step's LR.

Per-optimizer-step rows (epoch, mini-batch, loss, grad norm, clip fractions, …) go to
``run_dir/optimizer_steps.jsonl`` (driver); the step's metrics row carries their means (timings and
the counts a path declares summed, ``DataPath.summed_metrics``) and ``actor/optimizer_steps``.
"""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from megatron_rl import algorithms as A
from megatron_rl.algorithms import correction as C
from megatron_rl.trainer.contract import PipelineRun, Rows, UpdateContext, UpdateHooks
from megatron_rl.trainer.pipeline.batch import mini_batches
from megatron_rl.trainer.pipeline.logprobs import logprob_passes
from megatron_rl.trainer.pipeline.objective import Objective
from megatron_rl.trainer.pipeline.packing import TokenBudget
from megatron_rl.trainer.pipeline.rows import train_rows
from megatron_rl.trainer.pipeline.sequences import behaviour

OPTIMIZER_STEPS_FILE = "optimizer_steps.jsonl"


def update(run: PipelineRun, data, step: int) -> dict:
    """Every rank (collective): the four stages of the module docstring on ``data``; the metrics row."""
    path: UpdateHooks = run.path
    ctx = run.update_context()       # what the path's hooks see of the run (trainer/contract.py)
    s = path.sampled(ctx, data, step)                                              # 1
    beh = behaviour(s.ro, s.seqs.resp_mask, step, run.actor.groups.dp)
    lp, metrics = logprob_passes(run, s, beh)                                      # 2
    rows, metrics = train_rows(run, ctx, data, s, lp, beh, step, metrics)          # 3
    if len(rows) == 0:
        return metrics                 # the path said why (e.g. no sample survived its filter)
    per_step = optimizer_steps(run, rows, s.hp, step, ctx)                         # 4
    metrics.update(mean_metrics(per_step, path.summed_metrics, path.last_metrics))
    _log_optimizer_steps(run, step, per_step)
    return metrics


def optimizer_steps(run: PipelineRun, rows: Rows, hp, step: int, ctx: UpdateContext | None = None) -> list[dict]:
    """``ppo_epochs`` x the mini-batches of ``rows``: one optimizer step each; their metric dicts
    (``ctx``: what the path's ``mini_batch_inputs`` hook is handed, ``run.update_context()`` if None)."""
    cfg, path = run.cfg, run.path
    kind, t = cfg.algo.kind, cfg.trainer
    loss = A.algo_kind(kind).loss
    stats = A.loss_batch_stats(loss)
    mbs = run.micro
    multiple = 1 if isinstance(mbs, TokenBudget) else run.info.dp * mbs   # padded: N a multiple of DP x rows
    chunks = mini_batches(len(rows), t.mini_batch_prompts * cfg.rollout.n)
    ctx = run.update_context() if ctx is None else ctx
    out = []
    for epoch in range(t.ppo_epochs):
        for k, idx in enumerate(chunks):
            mb = rows if len(chunks) == 1 else rows.select(idx)
            ex = dict(mb.extras)
            p_ex, m = path.mini_batch_inputs(ctx, mb, hp, loss, step)   # under the weights of this moment
            ex.update(p_ex)
            for name in sorted(stats):
                ex[name] = stats[name](ex, hp)
            batch = dataclasses.replace(mb.seqs.batch, extras=ex).pad_rows_to_multiple(multiple)
            first_of_bypass = not out and not C.correction_recomputes(cfg.algo.off_policy)
            res = run.actor.train_step(batch, Objective(kind, hp, batch, step, mismatch=first_of_bypass), mbs,
                                       lr_increment=1 if not out else 0)
            if res.update_successful:
                path.after_optimizer_step()
            m.update(actor_metrics(res))
            m.update({"epoch": epoch, "mini_batch": k, "rows": len(idx)})
            out.append(m)
    return out


def actor_metrics(res) -> dict:
    """``TrainStepResult`` -> metrics row entries (``actor/`` unless the name has its own prefix)."""
    return {f"actor/{k}" if "/" not in k else k: v for k, v in res.to_dict().items()}


_PER_STEP_ONLY = ("epoch", "mini_batch", "rows")


def mean_metrics(per_step: list[dict], summed: tuple[str, ...] = (), last: tuple[str, ...] = ()) -> dict:
    """One row from the optimizer steps of an RL step: means; timings and the keys starting with one
    of ``summed`` summed (the path's counts, ``DataPath.summed_metrics``); ``last`` as after the last
    step (a path's counters); ``actor/optimizer_steps`` = their number."""
    summed = ("time/", *summed)
    out: dict = {}
    for key in dict.fromkeys(k for m in per_step for k in m):   # every key, in the order first seen
        if key in _PER_STEP_ONLY:
            continue
        vals = [float(m[key]) for m in per_step if key in m]
        if key in last:
            out[key] = vals[-1]
        elif key.startswith(summed):
            out[key] = sum(vals)
        else:
            out[key] = sum(vals) / len(vals)
    out["actor/optimizer_steps"] = float(len(per_step))
    return out


def _log_optimizer_steps(run: PipelineRun, step: int, per_step: list[dict]) -> None:
    """Driver: one row per optimizer step in ``run_dir/optimizer_steps.jsonl``."""
    if not run.info.is_driver:
        return
    with open(Path(run.cfg.trainer.run_dir) / OPTIMIZER_STEPS_FILE, "a") as f:
        for m in per_step:
            f.write(json.dumps({"step": step, **{k: float(v) for k, v in m.items()}}) + "\n")
