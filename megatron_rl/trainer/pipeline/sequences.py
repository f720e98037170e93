"""Stage 1 of the update (``pipeline/update.py``): the sampled sequences and the engines' side of them.

    rollouts ──> SeqBatch        prompt ++ response rows, right-padded, with each row's response frame
             ──> Behaviour        the engines' log-prob of every response token and the staleness of every
                                  sample and token, built ONCE a step (:func:`behaviour`)

Per-token quantities are kept in the RESPONSE frame ``[N, R]`` (token r of sample n's response),
because BiCC moves a sample's response to a different position when a context is inserted; each
row's ``resp_pos[n, r]`` indexes the actor's target frame ``[N, S-1]`` (``logp.gather``).
A data path builds its sequences here (``DataPath.sampled``); the pipeline builds the behaviour.
"""
from __future__ import annotations

import torch
import torch.distributed as dist

from megatron_rl.algorithms import offpolicy as O
from megatron_rl.algorithms.staleness import staleness
from megatron_rl.runtime.device import default_device
from megatron_rl.trainer.contract import Behaviour, SeqBatch
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
    if ro.response_mask is not None:
        policy_tokens_only(ro, pl, rl, loss_mask, mask)
    return SeqBatch(TrainBatch(tokens, loss_mask, {"resp_pos": pos, "resp_mask": mask}), pos, mask)


def policy_tokens_only(ro, pl: list[int], rl: list[int], loss_mask: torch.Tensor, mask: torch.Tensor) -> None:
    """Multi-turn rollouts (``Rollouts.response_mask``, docs/multi-turn.md): the tool-response and template
    tokens the agent loop appended leave the loss mask and the response-frame mask, in place, so every
    loss aggregation, advantage and engine-mismatch metric reads the policy's sampled tokens only:
    ``m[n, r] ← m[n, r] · response_mask[n, r]``. Such a batch travels whole to every rank
    (``dispatch.share_plan``), so every row's mask is set."""
    rows, _, starts = ro.token_spans()
    for i, r0 in zip(rows, starts):
        a, b = pl[i], rl[i]
        m = ro.response_mask[r0:r0 + b].to(loss_mask.dtype)
        loss_mask[i, a - 1:a + b - 1] *= m
        k = min(b, mask.shape[1])
        mask[i, :k] *= m[:k]


def response_frame(x: torch.Tensor, sb: SeqBatch) -> torch.Tensor:
    """``[N, S-1]`` -> ``[N, R]`` (zeros off the mask)."""
    return x.gather(1, sb.resp_pos) * sb.resp_mask


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


def token_staleness(ro, step: int, like: torch.Tensor) -> torch.Tensor:
    """``[N, R]`` staleness of each response token in the frame of ``like`` (0 past a response): the rule of
    ``algorithms/staleness.py`` at the trainer's version ``step − 1`` over ``ro.token_versions``."""
    out = torch.zeros(like.shape, dtype=torch.long)
    flat = staleness(step - 1, ro.token_versions)
    for i, s in enumerate(torch.split(flat, ro.response_lens.tolist())):
        k = min(len(s), like.shape[1])
        out[i, :k] = s[:k]
    return out


def sample_staleness(ro, step: int) -> torch.Tensor:
    """``[N]`` staleness of each sample at the trainer's version ``step − 1``: its oldest token's with per-
    token versions (partial rollouts), else the batch's ``ro.weight_version`` (none: collected
    synchronously, 0)."""
    if ro.token_versions is not None:
        oldest = torch.stack([v.min() for v in torch.split(ro.token_versions.long(), ro.response_lens.tolist())])
        return staleness(step - 1, oldest)
    version = step - 1 if ro.weight_version is None else ro.weight_version
    return staleness(step - 1, torch.full((len(ro),), version, dtype=torch.long))


def behaviour(ro, mask: torch.Tensor, step: int, dp_group=None) -> Behaviour:
    """The engines' side of the step's sequences (``contract.Behaviour``), once: the engine frame in the
    response frame of ``mask`` (``SeqBatch.resp_mask``; assembled over ``dp_group`` for a shared-out batch,
    :func:`engine_frame`) and the staleness of every sample and, with per-token versions, every token. The
    trainer holds the weights of step − 1 while it trains step ``step``."""
    tok = token_staleness(ro, step, mask) if ro.token_versions is not None else None
    return Behaviour(engine_frame(ro, mask, dp_group), sample_staleness(ro, step), tok)
