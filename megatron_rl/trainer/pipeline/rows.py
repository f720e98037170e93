"""Stage 3 of the update (``pipeline/update.py``): rewards, advantages, and the rows the loss trains on
with their corrections.

    rewards land (``DataPath.join_rewards``) -> the step's reward / length metrics -> in-reward KL
      -> path.after_logprobs -> advantages (registered estimator, whole batch, once)
      -> base rows: rewards, groups, advantages, old / ref log-probs, the off-policy (decoupled PPO / TIS)
         or rollout-correction weights and keep mask, the staleness keep mask (partial rollouts)
      -> path.train_rows (conditioned sequences, a filtered subset, a per-row teacher plan)
      -> the keep mask folded into the loss mask

Every weight and mask reads the step's one ``Behaviour`` (``pipeline/sequences.behaviour``): the engine
frame and the staleness are not rebuilt here.
"""
from __future__ import annotations

import dataclasses

import torch

from megatron_rl import algorithms as A
from megatron_rl.algorithms import correction as C
from megatron_rl.algorithms import offpolicy as O
from megatron_rl.algorithms.inputs import input_spec, is_input
from megatron_rl.algorithms.staleness import StalenessPolicy, within_bound
from megatron_rl.trainer.contract import (
    CORRECTION_KEEP,
    Behaviour,
    LogProbs,
    PipelineRun,
    Rows,
    Sampled,
    UpdateContext,
)


def train_rows(run: PipelineRun, ctx: UpdateContext, data, s: Sampled, lp: LogProbs, beh: Behaviour, step: int,
               metrics: dict) -> tuple[Rows, dict]:
    """The stage (module docstring): the rows the loss trains on and the metrics row so far (the
    rollouts' reward / length metrics first, then ``metrics``, then what this stage adds)."""
    path, cfg = run.path, run.cfg
    path.join_rewards(ctx, s, metrics)   # rewards scored beside the passes (plain paths, synchronous) land
    metrics = {**rollout_metrics(path.logged(data), cfg), **metrics}
    if s.hp.kl_reward_coef > 0:      # only paths with ``kl_in_reward`` pass validation with a coefficient
        metrics.update(kl_in_reward(s.ro, lp.old, lp.ref, s.seqs.resp_mask, s.hp.kl_reward_coef, s.hp.kl_reward_type))
    path.after_logprobs(ctx, s, lp, metrics)
    ai = advantage_inputs(s.ro, s.seqs.resp_mask, old_logp=lp.old, ref_logp=lp.ref)
    adv = A.compute_advantages(cfg.algo.kind, ai.replace(**s.adv_fields), s.hp).float()
    rows = path.train_rows(ctx, s, base_rows(cfg, s, lp, beh, adv, metrics, path.importance_weights), lp, step,
                           metrics)
    metrics["adv/mean_abs"] = float(adv.abs().mean())
    return fold_keep(rows), metrics


def base_rows(cfg, s: Sampled, lp: LogProbs, beh: Behaviour, adv: torch.Tensor, metrics: dict,
              importance_weights: bool = True) -> Rows:
    """Every sampled row with its loss inputs: rewards, groups, advantages, old / ref log-probs,
    the decoupled-PPO / TIS weights of a stale batch (``importance_weights``), the keep mask (rollout-
    correction rejection, partial rollouts' staleness mask: ``CORRECTION_KEEP``), the path's extras."""
    ex = {"rewards": s.ro.rewards.float(), "group_ids": s.ro.group_ids, "advantages": adv, "old_logp": lp.old,
          "resp_pos": s.seqs.resp_pos, "resp_mask": s.seqs.resp_mask}
    if lp.ref is not None:
        ex["ref_logp"] = lp.ref
    if importance_weights and C.is_correction_mode(cfg.algo.off_policy):   # the rollout-correction suite
        tis, keep, off = correction_inputs(cfg, lp.engine_space, s.seqs.resp_mask, beh)
        if tis is not None:
            ex["tis_weights"] = tis
        if keep is not None:
            ex[CORRECTION_KEEP] = keep
        metrics.update(off)
    elif importance_weights:
        tis, off = off_policy_inputs(cfg, lp.engine_space, s.seqs.resp_mask, beh)   # stale (async)
        if tis is not None:
            ex["tis_weights"] = tis
        metrics.update(off)
    stale_keep, stale_m = staleness_keep(cfg, s.seqs.resp_mask, beh)   # partial policy mask
    if stale_keep is not None:
        ex[CORRECTION_KEEP] = stale_keep * ex[CORRECTION_KEEP] if CORRECTION_KEEP in ex else stale_keep
        metrics.update(stale_m)
    ex.update(s.extras)
    return Rows(s.seqs, ex, ro=s.ro)


def fold_keep(rows: Rows) -> Rows:
    """The keep mask (``CORRECTION_KEEP``: rollout-correction rejection, staleness mask) taken out of the
    rows' extras and multiplied into their loss mask ``resp_mask``: a rejected token contributes nothing."""
    keep = rows.extras.pop(CORRECTION_KEEP, None)
    if keep is not None:
        rows.extras["resp_mask"] = rows.extras["resp_mask"] * keep
    return rows


def off_policy_inputs(cfg, old: torch.Tensor, mask: torch.Tensor, beh: Behaviour) -> tuple[torch.Tensor | None, dict]:
    """Decoupled-PPO importance weights of the batch (``algorithms/offpolicy.py``) and their metrics.

    Proximal policy = ``old`` (the trainer's log-probs of the PLAIN batch under its current weights:
    the context the engines sampled in); behaviour = the engines' sampling log-probs (``beh.logp``);
    staleness = ``beh.stale`` (a sample's oldest token's: a response spanning a push counts as stale and
    all its tokens get the decoupled weight, each against the engine log-prob of the version that
    sampled it). Mode and cap: ``algo.off_policy`` / ``algo.tis_cap``. Returns (weights [N, T] or None,
    metrics)."""
    out = O.off_policy_weights(old, beh.logp, mask, beh.stale, mode=cfg.algo.off_policy, cap=cfg.algo.tis_cap)
    return out.weights, {k: float(v) for k, v in out.metrics.items()}


def correction_inputs(cfg, old: torch.Tensor, mask: torch.Tensor, beh: Behaviour):
    """A registered rollout-correction mode (``algorithms/correction.py``) on the batch: (weights or
    None, keep mask or None, metrics incl. the staleness ones); ``beh`` as in :func:`off_policy_inputs`."""
    out = C.apply_correction(cfg.algo.off_policy, old, beh.logp, mask, cfg.algo.correction)
    metrics = {k: float(v) for k, v in O.staleness_metrics(beh.stale).items()}
    metrics.update({k: float(v) for k, v in out.metrics.items()})
    return out.weights, out.keep, metrics


def staleness_keep(cfg, mask: torch.Tensor, beh: Behaviour) -> tuple[torch.Tensor | None, dict]:
    """The per-token staleness bound as a loss keep mask ``[N, R]`` (partial rollouts' ``policy=mask``,
    slime/vime's off-policy prefix mask): token t of a response stays in the loss iff its staleness
    ``beh.token_stale`` is within the bound (``algorithms/staleness.within_bound``; versions never decrease
    along a response, so what leaves is its old-version prefix). None — nothing to fold — without
    per-token versions or under ``drop`` (the pool dropped the over-stale groups already).
    Metric ``partial/masked_tokens``: the response tokens (of ``mask``) it takes out of the loss."""
    r = cfg.rollout
    if beh.token_stale is None or not r.partial.enable or r.partial.policy != "mask":
        return None, {}
    policy = StalenessPolicy(r.partial.max_staleness, r.partial.policy)
    keep = within_bound(beh.token_stale, policy).to(mask.dtype)
    return keep, {"partial/masked_tokens": float(((1.0 - keep) * mask).sum())}


def rollout_metrics(ro, cfg) -> dict:
    """The step's reward / length metrics of the rollouts ``ro`` (before any in-reward KL)."""
    n = cfg.rollout.n
    r = ro.rewards.view(-1, n) if len(ro) % n == 0 else ro.rewards.view(1, -1)
    lens = ro.response_lens.to(torch.float32)
    return {"reward/mean": float(ro.rewards.mean()), "reward/acc": float(ro.correct.float().mean()),
            "reward/all_correct_groups": float((r.min(1).values > 0.5).float().mean()),
            "reward/all_wrong_groups": float((r.max(1).values <= 0.5).float().mean()),
            "response/len_mean": float(lens.mean()),
            "response/clip_frac": sum(f == "length" for f in ro.finish) / len(ro), **ro.stats}


def kl_in_reward(ro, old: torch.Tensor, ref: torch.Tensor, mask: torch.Tensor, beta: float, kind: str) -> dict:
    """In-reward KL (verl ``apply_kl_penalty`` with the fixed controller, ``algorithms.apply_kl_in_reward``):
    r_i ← r_i − β·Σ_t KL_t(old, ref)·m_t, the sequence sum of the token-level rewards that outcome
    advantages read (docs/methods/bicc-rcc.md). ``ro.correct`` stays the binary outcome. Departure: the released
    BiCC recipe applies it before its old log-probs exist (docs/methods/bicc-rcc.md: it cannot run so); here they do."""
    out = A.apply_kl_in_reward(torch.zeros_like(old), old, ref, mask, beta, kind)
    ro.rewards = ro.rewards + out.token_rewards.sum(-1).to(ro.rewards.dtype)
    return {"reward/kl_in_reward": float(out.mean_kl), "reward/kl_in_reward_mean_penalty": float(-out.token_rewards.sum(-1).mean())}


def advantage_inputs(rollouts, mask: torch.Tensor, old_logp=None, ref_logp=None) -> A.AlgoInputs:
    """The advantage's bundle: ``mask``, old / ref log-probs and every field of the rollouts named like
    a registered input (``rewards``, ``group_ids``, ``correct`` and what a path adds, e.g. a greedy
    baseline or a process score), floating ones in float64."""
    per_row = {f.name: getattr(rollouts, f.name) for f in dataclasses.fields(rollouts) if is_input(f.name)}
    per_row = {k: v.double() if v is not None and input_spec(k).dtype == "float" else v for k, v in per_row.items()}
    return A.AlgoInputs(mask=mask, old_logp=old_logp, ref_logp=ref_logp, **per_row)
