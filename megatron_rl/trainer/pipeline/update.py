"""The one update pipeline every data path feeds (``rl_step`` calls :func:`update`).

    path.sampled(data)                     the sequences the policy sampled, per-row inputs (the path)
      -> old / ref log-probs               whole batch, once (the proximal and reference policies;
                                           ``algo.off_policy=bypass``: old := the engine's, no pass),
                                           the trainer-vs-engine mismatch metrics
      -> path.join_rewards                 rewards scored beside the passes land (``rollout/pending_rewards.py``:
                                           the plain paths of synchronous runs), then the step's reward /
                                           length metrics (``update_stage.rollout_metrics``)
      -> in-reward KL -> path.after_logprobs
      -> advantages                        whole batch, once (registered estimator)
      -> base rows -> path.train_rows      the rows the loss trains on, with the off-policy / rollout-
                                           correction weights and keep mask (folded into the mask after
                                           the path's hook) — the path's: conditioned sequences,
                                           a filtered subset, a per-row teacher plan
      -> [epoch]* [mini-batch]*            ``trainer.ppo_epochs`` x the rows cut IN ORDER (no shuffle,
                                           as the references) into ``trainer.mini_batch_prompts`` x
                                           ``rollout.n`` rows
           -> path.mini_batch_inputs       the path's per-mini-batch inputs under the weights of THAT
                                           moment (the teacher family's support passes)
           -> batch statistics             the loss's whole-mini-batch fields (registry)
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
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import torch

from megatron_rl import algorithms as A
from megatron_rl.algorithms import correction as C
from megatron_rl.algorithms import offpolicy as O
from megatron_rl.trainer.pipeline import update_stage as U
from megatron_rl.trainer.pipeline.batch import mini_batches
from megatron_rl.trainer.pipeline.objective import Objective
from megatron_rl.trainer.pipeline.packing import TokenBudget
from megatron_rl.trainer.contract import CORRECTION_KEEP, LogProbs, Rows, Sampled, UpdateContext, UpdateHooks

if TYPE_CHECKING:
    from megatron_rl.runtime.parallel import ParallelInfo
    from megatron_rl.trainer.policy.actor import PolicyActor, ReferencePolicy

OPTIMIZER_STEPS_FILE = "optimizer_steps.jsonl"


class Run(Protocol):
    """What the pipeline reads of the run it is handed (the loop's ``Run`` is one; the pipeline names no
    loop type, so the loop stays above it)."""

    cfg: Any
    path: UpdateHooks
    actor: PolicyActor
    ref: ReferencePolicy | None
    info: ParallelInfo
    micro: Any

    def update_context(self) -> UpdateContext: ...


def update(run: Run, data, step: int) -> dict:
    """Every rank (collective): the pipeline of the module docstring on ``data``; the metrics row."""
    path: UpdateHooks = run.path
    ctx = run.update_context()       # what the path's hooks see of the run (trainer/contract.py)
    s = path.sampled(ctx, data, step)
    lp, metrics = logprob_passes(run, s, step)
    path.join_rewards(ctx, s, metrics)   # rewards scored beside the passes (plain paths, synchronous) land
    metrics = {**U.rollout_metrics(path.logged(data), run.cfg), **metrics}
    if s.hp.kl_reward_coef > 0:      # only paths with ``kl_in_reward`` pass validation with a coefficient
        metrics.update(U.kl_in_reward(s.ro, lp.old, lp.ref, s.seqs.resp_mask, s.hp.kl_reward_coef, s.hp.kl_reward_type))
    path.after_logprobs(ctx, s, lp, metrics)
    ai = U.advantage_inputs(s.ro, s.seqs.resp_mask, old_logp=lp.old, ref_logp=lp.ref)
    adv = A.compute_advantages(run.cfg.algo.kind, ai.replace(**s.adv_fields), s.hp).float()
    rows = path.train_rows(ctx, s, base_rows(run, s, lp, adv, step, metrics, path.importance_weights), lp, step,
                           metrics)
    rows = fold_keep(rows)
    metrics["adv/mean_abs"] = float(adv.abs().mean())
    if len(rows) == 0:
        return metrics                 # the path said why (e.g. no sample survived its filter)
    per_step = optimizer_steps(run, rows, s.hp, step, ctx)
    metrics.update(mean_metrics(per_step, path.summed_metrics, path.last_metrics))
    _log_optimizer_steps(run, step, per_step)
    return metrics


def fold_keep(rows: Rows) -> Rows:
    """The keep mask (``CORRECTION_KEEP``: rollout-correction rejection, staleness mask) taken out of the
    rows' extras and multiplied into their loss mask ``resp_mask``: a rejected token contributes nothing."""
    keep = rows.extras.pop(CORRECTION_KEEP, None)
    if keep is not None:
        rows.extras["resp_mask"] = rows.extras["resp_mask"] * keep
    return rows


def logprob_passes(run: Run, s: Sampled, step: int) -> tuple[LogProbs, dict]:
    """Old and reference log-probs of the sampled sequences (no grad), the trainer<->engine
    agreement ``rollout/logprob_gap`` (mean |old − engine log-prob| over response tokens) and the
    mismatch metrics beside it (``update_stage.mismatch_inputs``), both under the distribution the
    engines report (μ with ``rollout.logprobs=processed``: truncation is not mismatch);
    ``rollout/outside_support_frac``: the share of response tokens outside the trainer's own kept set.
    ``algo.off_policy=bypass``: no old pass at all — old := the engine's log-probs (``bypass_old``); no
    gap then, and the mismatch's ``token_mult_prob_error`` / ``gen_kl`` come from the first optimizer
    step's forward (``Objective``)."""
    t0 = time.perf_counter()
    mbs, cfg = run.micro, run.cfg
    recompute = C.correction_recomputes(cfg.algo.off_policy)
    mu = run.actor.sampling is not None          # μ truncates (``algorithms/sampling.py``)
    in_mu = mu and cfg.algo.ratio_space == "sampling"
    mu = in_mu or (mu and cfg.rollout.logprobs == "processed")   # μ is needed: the ratio's or the engines' space
    gen = U.engine_frame(s.ro, s.seqs.resp_mask, run.actor.groups.dp)   # a shared-out batch: assembled over DP
    res = run.actor.forward_logprobs(s.seqs.batch, mbs, sampling=mu) if recompute else None
    ref_res = run.ref.forward_logprobs(s.seqs.batch, mbs, sampling=in_mu) if run.ref is not None else None
    ref_full = None if ref_res is None else (ref_res.sampling_logp if in_mu else ref_res.logp)
    ref = U.response_frame(ref_full, s.seqs) if ref_full is not None else None
    if not recompute:
        old_full, old = bypass_old(s, gen)
        return LogProbs(old_full, ref_full, old, ref, engine=gen), {"time/logprobs": time.perf_counter() - t0}
    old_full = res.sampling_logp if in_mu else res.logp
    old = U.response_frame(old_full, s.seqs)
    processed = res.sampling_logp is not None and cfg.rollout.logprobs == "processed"
    engine_full = res.sampling_logp if processed else res.logp
    other = engine_full is not old_full
    lp = LogProbs(old_full, ref_full, old, ref, U.response_frame(engine_full, s.seqs) if other else None,
                  engine_full if other else None, engine=gen)
    cmp, mask = lp.engine_space, s.seqs.resp_mask
    metrics = {"rollout/logprob_gap": U.logprob_gap(cmp, gen, mask),
               **U.mismatch_inputs(cfg, s.ro, cmp, mask, step, gen=gen)}
    if mu:
        outside = (1.0 - U.response_frame(res.sampling_kept, s.seqs)) * mask
        metrics["rollout/outside_support_frac"] = float(outside.sum() / mask.sum().clamp_min(1))
    return lp, {**metrics, "time/logprobs": time.perf_counter() - t0}


def bypass_old(s: Sampled, gen: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """π_old := π_rollout: the engine's log-probs in the response frame ``[N, R]`` (0 off the mask)
    and scattered to the target frame ``[N, S-1]`` (0 at non-response positions); ``gen``: the engine
    frame (``U.engine_frame``; None: built from the rollouts)."""
    m = s.seqs.resp_mask
    old = (O.behaviour_matrix(s.ro.rollout_logp, m) if gen is None else gen) * m
    n, s_len = s.seqs.batch.tokens.shape
    full = torch.zeros((n, s_len - 1), dtype=old.dtype).scatter_add_(1, s.seqs.resp_pos, old)
    return full, old


def base_rows(run: Run, s: Sampled, lp: LogProbs, adv: torch.Tensor, step: int, metrics: dict,
              importance_weights: bool = True) -> Rows:
    """Every sampled row with its loss inputs: rewards, groups, advantages, old / ref log-probs,
    the decoupled-PPO / TIS weights of a stale batch (``importance_weights``), the keep mask (rollout-
    correction rejection, partial rollouts' staleness mask: ``CORRECTION_KEEP``), the path's extras."""
    ex = {"rewards": s.ro.rewards.float(), "group_ids": s.ro.group_ids, "advantages": adv, "old_logp": lp.old,
          "resp_pos": s.seqs.resp_pos, "resp_mask": s.seqs.resp_mask}
    if lp.ref is not None:
        ex["ref_logp"] = lp.ref
    if importance_weights and C.is_correction_mode(run.cfg.algo.off_policy):   # the rollout-correction suite
        tis, keep, off = U.correction_inputs(run.cfg, s.ro, lp.engine_space, s.seqs.resp_mask, step, gen=lp.engine)
        if tis is not None:
            ex["tis_weights"] = tis
        if keep is not None:
            ex[CORRECTION_KEEP] = keep
        metrics.update(off)
    elif importance_weights:
        tis, off = U.off_policy_inputs(run.cfg, s.ro, lp.engine_space, s.seqs.resp_mask, step, gen=lp.engine)   # stale (async)
        if tis is not None:
            ex["tis_weights"] = tis
        metrics.update(off)
    stale_keep, stale_m = U.staleness_keep(run.cfg, s.ro, s.seqs.resp_mask, step)   # partial_policy=mask
    if stale_keep is not None:
        ex[CORRECTION_KEEP] = stale_keep * ex[CORRECTION_KEEP] if CORRECTION_KEEP in ex else stale_keep
        metrics.update(stale_m)
    ex.update(s.extras)
    return Rows(s.seqs, ex, ro=s.ro)


def optimizer_steps(run: Run, rows: Rows, hp, step: int, ctx: UpdateContext | None = None) -> list[dict]:
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


def _log_optimizer_steps(run: Run, step: int, per_step: list[dict]) -> None:
    """Driver: one row per optimizer step in ``run_dir/optimizer_steps.jsonl``."""
    if not run.info.is_driver:
        return
    with open(Path(run.cfg.trainer.run_dir) / OPTIMIZER_STEPS_FILE, "a") as f:
        for m in per_step:
            f.write(json.dumps({"step": step, **{k: float(v) for k, v in m.items()}}) + "\n")
