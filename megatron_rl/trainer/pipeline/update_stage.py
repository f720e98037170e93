"""Pieces of the update pipeline (``trainer/pipeline/update.py``) that every data path shares: sequence
batches, the response frame, the trainer/engine log-prob gap, the in-reward KL, the off-policy
weights and the advantage inputs (the objective itself is ``trainer/pipeline/objective.py``).

Per-token quantities are kept in the RESPONSE frame ``[N, R]`` (token r of sample n's response),
because BiCC moves a sample's response to a different position when a context is inserted; each
row's ``resp_pos[n, r]`` indexes the actor's target frame ``[N, S-1]`` (``logp.gather``).
"""
from __future__ import annotations

import dataclasses

import torch
import torch.distributed as dist

from megatron_rl import algorithms as A
from megatron_rl.algorithms import correction as C
from megatron_rl.algorithms import mismatch as M
from megatron_rl.algorithms import offpolicy as O
from megatron_rl.algorithms.inputs import input_spec, is_input
from megatron_rl.rollout.partial import StalenessPolicy, within_bound
from megatron_rl.runtime.device import default_device
from megatron_rl.trainer.contract import SeqBatch
from megatron_rl.trainer.pipeline.batch import TrainBatch, make_batch


def build_seq_batch(prompts: list[list[int]], responses: list[list[int]], pad_id: int, seq_len: int,
                    max_resp: int, extras: dict | None = None) -> SeqBatch:
    """Right-padded sequences ``prompt ++ response``; response-frame positions and mask."""
    n = len(prompts)
    pos = torch.zeros(n, max_resp, dtype=torch.long)
    mask = torch.zeros(n, max_resp)
    for i, (p, r) in enumerate(zip(prompts, responses)):
        k = min(len(r), max_resp)
        pos[i, :k] = torch.arange(len(p) - 1, len(p) - 1 + k)
        mask[i, :k] = 1.0
    ex = {"resp_pos": pos, "resp_mask": mask, **(extras or {})}
    return SeqBatch(make_batch(prompts, responses, pad_id, ex, seq_len), pos, mask)


def sequences(run, prompts: list[list[int]], responses: list[list[int]], max_resp: int | None = None) -> SeqBatch:
    """THE sequence batch of a step's ``prompt ++ response`` pairs on ``run`` (the ``Run``, or the
    ``UpdateContext`` a data-path hook is handed: both carry ``cfg``, ``tok``, ``seq_len``): right-padded with
    ``run.tok.pad_id`` to ``run.seq_len`` (a multiple of 8 x TP), with a response frame of ``max_resp``
    tokens (default ``rollout.max_tokens``): :func:`build_seq_batch`."""
    max_resp = run.cfg.rollout.max_tokens if max_resp is None else max_resp
    return build_seq_batch(prompts, responses, run.tok.pad_id, run.seq_len(prompts, responses), max_resp)


def rollout_sequences(run, ro) -> SeqBatch:
    """:func:`sequences` of the rollouts ``ro`` (``prompt ++ response`` of every sample), copied row by row
    straight from their flat buffers: the same tensors as ``build_seq_batch`` of the lists, no Python
    object per token and no index tensor the size of the batch. Of a data-parallel share
    (``Rollouts.share``): the rows it does not hold keep ``pad_id`` tokens (their masks and frame as any
    row's, from the lengths); no pass of this rank runs them (``trainer/pipeline/dispatch.py``)."""
    pl, rl = ro.prompt_lens.tolist(), ro.response_lens.tolist()
    if 0 in pl:
        raise ValueError(f"make_batch: prompt {pl.index(0)} is empty (the first response token needs a context)")
    n, s, max_resp = len(ro), run.padded_len(max(a + b for a, b in zip(pl, rl))), run.cfg.rollout.max_tokens
    tokens = torch.full((n, s), run.tok.pad_id, dtype=torch.long)
    loss_mask = torch.zeros((n, s - 1), dtype=torch.float32)
    pos, mask = torch.zeros(n, max_resp, dtype=torch.long), torch.zeros(n, max_resp)
    frame = torch.arange(max_resp)
    for i, po, ro_ in zip(*ro.token_spans()):
        a, b = pl[i], rl[i]
        tokens[i, :a] = ro.prompt_ids[po:po + a]
        tokens[i, a:a + b] = ro.response_ids[ro_:ro_ + b]
    for i, (a, b) in enumerate(zip(pl, rl)):
        loss_mask[i, a - 1:a + b - 1] = 1.0
        k = min(b, max_resp)
        pos[i, :k] = frame[:k] + (a - 1)
        mask[i, :k] = 1.0
    return SeqBatch(TrainBatch(tokens, loss_mask, {"resp_pos": pos, "resp_mask": mask}), pos, mask)


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


def response_frame(x: torch.Tensor, sb: SeqBatch) -> torch.Tensor:
    """``[N, S-1]`` -> ``[N, R]`` (zeros off the mask)."""
    return x.gather(1, sb.resp_pos) * sb.resp_mask


def logprob_gap(old: torch.Tensor, engine, mask: torch.Tensor) -> float:
    """Mean |trainer − engine| log-prob over valid response tokens (``rollout/logprob_gap``): the
    trainer's forward puts each token where the engine sampled it, and both agree on the model.
    ``engine``: the engines' log-probs as a frame like ``old`` (:func:`engine_frame`) or ragged lists."""
    roll = engine if isinstance(engine, torch.Tensor) else O.behaviour_matrix(engine, old)
    return float(((old - roll).abs() * mask).sum() / mask.sum().clamp_min(1))


def engine_frame(ro, like: torch.Tensor, dp_group=None) -> torch.Tensor:
    """The engines' log-prob of each response token in the response frame of ``like`` (``[N, R]``, its
    dtype; 0 past a response): ``behaviour_matrix`` of the batch. Of a batch shared out over the
    data-parallel replicas (``Rollouts.share``, ``trainer/pipeline/dispatch.py``) each replica fills the
    rows it owns and one sum over ``dp_group`` assembles the frame on every rank: each entry is one
    replica's value plus zeros, so the frame is the whole batch's, bit for bit."""
    if ro.share is None:
        return O.behaviour_matrix(ro.rollout_logp, like)
    out = torch.zeros_like(like)
    r_max, lens = like.shape[1], ro.response_lens.tolist()
    rows, _, starts = ro.token_spans()
    at = dict(zip(rows, starts))
    for i in ro.share.owned.tolist():
        k = min(lens[i], r_max)
        out[i, :k] = ro.response_logp[at[i]:at[i] + k]
    if dp_group is not None and dist.get_world_size(dp_group) > 1:
        dev = default_device() if dist.get_backend(dp_group) == "nccl" else out.device
        buf = out.to(dev)
        dist.all_reduce(buf, group=dp_group)
        out = buf.to(like.device)
    return out


def kl_in_reward(ro, old: torch.Tensor, ref: torch.Tensor, mask: torch.Tensor, beta: float, kind: str) -> dict:
    """In-reward KL (verl ``apply_kl_penalty`` with the fixed controller, ``algorithms.apply_kl_in_reward``):
    r_i ← r_i − β·Σ_t KL_t(old, ref)·m_t, the sequence sum of the token-level rewards that outcome
    advantages read (docs/methods/bicc-rcc.md). ``ro.correct`` stays the binary outcome. Departure: the released
    BiCC recipe applies it before its old log-probs exist (docs/methods/bicc-rcc.md: it cannot run so); here they do."""
    out = A.apply_kl_in_reward(torch.zeros_like(old), old, ref, mask, beta, kind)
    ro.rewards = ro.rewards + out.token_rewards.sum(-1).to(ro.rewards.dtype)
    return {"reward/kl_in_reward": float(out.mean_kl), "reward/kl_in_reward_mean_penalty": float(-out.token_rewards.sum(-1).mean())}


def off_policy_inputs(cfg, ro, old: torch.Tensor, mask: torch.Tensor, step: int,
                      gen: torch.Tensor | None = None) -> tuple[torch.Tensor | None, dict]:
    """Decoupled-PPO importance weights of the batch (``algorithms/offpolicy.py``) and their metrics.

    Proximal policy = ``old`` (the trainer's log-probs of the PLAIN batch under its current weights:
    the context the engines sampled in); behaviour = the engines' sampling log-probs
    (``ro.rollout_logp``); staleness = (step − 1) − ``ro.weight_version`` (the trainer holds the
    weights of step − 1; a batch collected synchronously has no version: staleness 0). Mode and
    cap: ``algo.off_policy`` / ``algo.tis_cap``. ``gen``: the behaviour log-probs as a frame
    (:func:`engine_frame`; None: built from ``ro``). Returns (weights [N, T] or None, metrics)."""
    stale = batch_staleness(ro, step)
    out = O.off_policy_weights(old, O.behaviour_matrix(ro.rollout_logp, old) if gen is None else gen, mask, stale,
                               mode=cfg.algo.off_policy, cap=cfg.algo.tis_cap)
    return out.weights, {k: float(v) for k, v in out.metrics.items()}


def batch_staleness(ro, step: int) -> torch.Tensor:
    """[N] staleness of the batch's samples: (step − 1) − ``ro.weight_version`` (0 without a version);
    with per-token versions (``ro.token_versions``, partial rollouts) the staleness of a sample's OLDEST
    token, so a response spanning a push counts as stale and all its tokens get the decoupled weight
    (each against the engine log-prob of the version that sampled it)."""
    if ro.token_versions is not None:
        oldest = torch.stack([v.min() for v in torch.split(ro.token_versions.long(), ro.response_lens.tolist())])
        return O.staleness(step - 1, oldest)
    version = step - 1 if ro.weight_version is None else ro.weight_version
    return O.staleness(step - 1, torch.full((len(ro),), version, dtype=torch.long))


def token_staleness(ro, step: int, like: torch.Tensor) -> torch.Tensor:
    """[N, T] staleness of each response token ((step − 1) − its version; 0 past a response) in the frame of ``like``."""
    out = torch.zeros(like.shape, dtype=torch.long)
    for i, v in enumerate(torch.split(ro.token_versions.long(), ro.response_lens.tolist())):
        k = min(len(v), like.shape[1])
        out[i, :k] = (step - 1) - v[:k]
    return out


def staleness_keep(cfg, ro, mask: torch.Tensor, step: int) -> tuple[torch.Tensor | None, dict]:
    """The per-token staleness bound as a loss keep mask ``[N, R]`` (``rollout.partial_policy=mask``,
    slime/vime's off-policy prefix mask): token t of a response stays in the loss iff its staleness
    (step − 1) − v_t <= ``rollout.partial_max_staleness`` (``rollout.partial.within_bound``; versions
    never decrease along a response, so what leaves is its old-version prefix). None — nothing to fold
    — without per-token versions or under ``drop`` (the pool dropped the over-stale groups already).
    Metric ``partial/masked_tokens``: the response tokens (of ``mask``) it takes out of the loss."""
    r = cfg.rollout
    if ro.token_versions is None or not r.partial.enable or r.partial.policy != "mask":
        return None, {}
    policy = StalenessPolicy(r.partial.max_staleness, r.partial.policy)
    keep = within_bound(token_staleness(ro, step, mask), policy).to(mask.dtype)
    return keep, {"partial/masked_tokens": float(((1.0 - keep) * mask).sum())}


def correction_band(cfg) -> tuple[float, float]:
    """The ratio band [L, U] the mismatch metrics count tokens beyond: the registered mode's own
    thresholds (``algo.correction``), else [1/C, C] with C = ``algo.tis_cap`` (verl's default lower)."""
    corr = cfg.algo.correction
    band = corr.band() if corr is not None else None
    return band if band is not None else (1.0 / cfg.algo.tis_cap, cfg.algo.tis_cap)


def mismatch_inputs(cfg, ro, old: torch.Tensor, mask: torch.Tensor, step: int, gen: torch.Tensor | None = None) -> dict:
    """The train–inference mismatch metrics of the batch (``algorithms/mismatch.py``): trainer =
    ``old`` (the recomputed log-probs), engine = ``ro.rollout_logp``; split by staleness when the run
    is asynchronous (``rollout.max_staleness`` > 0); ``gen``: the engine frame (:func:`engine_frame`; None: from ``ro``)."""
    gen = O.behaviour_matrix(ro.rollout_logp, old) if gen is None else gen
    if ro.token_versions is None:
        return M.split_mismatch_metrics(old, gen, mask, batch_staleness(ro, step), correction_band(cfg),
                                        split=cfg.rollout.max_staleness > 0)
    res = M.split_mismatch_metrics(old, gen, mask, batch_staleness(ro, step), correction_band(cfg))
    tok = token_staleness(ro, step, old)   # partial rollouts: _fresh / _stale over TOKENS by their own version
    for name, sel in (("fresh", tok == 0), ("stale", tok > 0)):
        part = mask * sel.to(mask.dtype)
        if bool(part.sum() > 0):
            res.update({f"rollout/{k}_{name}": float(v) for k, v in
                        M.mismatch_metrics(old.double(), gen.double(), part, correction_band(cfg)).items()})
    return res


def correction_inputs(cfg, ro, old: torch.Tensor, mask: torch.Tensor, step: int, gen: torch.Tensor | None = None):
    """A registered rollout-correction mode (``algorithms/correction.py``) on the batch: (weights or
    None, keep mask or None, metrics incl. the staleness ones); ``gen`` as in :func:`off_policy_inputs`."""
    gen = O.behaviour_matrix(ro.rollout_logp, old) if gen is None else gen
    out = C.apply_correction(cfg.algo.off_policy, old, gen, mask, cfg.algo.correction)
    metrics = {k: float(v) for k, v in O.staleness_metrics(batch_staleness(ro, step)).items()}
    metrics.update({k: float(v) for k, v in out.metrics.items()})
    return out.weights, out.keep, metrics


def advantage_inputs(rollouts, mask: torch.Tensor, old_logp=None, ref_logp=None) -> A.AlgoInputs:
    """The advantage's bundle: ``mask``, old / ref log-probs and every field of the rollouts named like
    a registered input (``rewards``, ``group_ids``, ``correct`` and what a path adds, e.g. a greedy
    baseline or a process score), floating ones in float64."""
    per_row = {f.name: getattr(rollouts, f.name) for f in dataclasses.fields(rollouts) if is_input(f.name)}
    per_row = {k: v.double() if v is not None and input_spec(k).dtype == "float" else v for k, v in per_row.items()}
    return A.AlgoInputs(mask=mask, old_logp=old_logp, ref_logp=ref_logp, **per_row)
