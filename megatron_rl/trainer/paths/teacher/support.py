"""Support passes of the teacher family: teacher forwards under the path's teacher weights, and the
student's top-k pass when the loss lets the student choose the support (the path's
``mini_batch_inputs`` hook calls :func:`teacher_tensors` once per mini-batch, at update time).

    path.teacher_sequences(rows) -> packed rows (``inputs.pack``)
      -> forward under θ̄ (``path.teacher.swapped()``, no grad) -> per-sequence results in the response frame

What runs is read from the loss's registration, never from a method name: its top-k ``support`` side
(``register_policy_loss(..., support=...)``: "teacher" keeps the teacher's top-k ids, "student" takes
them from one no-grad pass of the current θ) and ``teacher_neg_topk`` among its inputs (negatives
gathered at the positive teacher's ids: a second pass). Every teacher sequence of the mini-batch (K_i + 1
per kept sample on the hint path, one per sample on the ground-truth path) is packed into rows of
``teacher.pack_len`` tokens and run as one forward-only schedule. The teacher scores the tokens of its row's
response-frame mask only (``inputs.pack(masks=...)``): a multi-turn response's tool / user tokens are context,
every teacher output there is 0 and off the loss mask (``teacher/scored_tokens`` counts the scored ones).

At train time the student's support is re-gathered with gradient at the same ids (``support_idx``,
read by ``trainer/pipeline/objective.Objective``).
"""
from __future__ import annotations

import dataclasses
import functools
import math
import time

import torch

from megatron_rl import algorithms as A
from megatron_rl.trainer.contract import UpdateContext
from megatron_rl.trainer.pipeline.packing import TokenBudget
from megatron_rl.trainer.policy.vocab_parallel import with_tail

from .inputs import Packed, attention_crossover, pack


def _teacher_micro_batch(rows: int, dp: int, mbs, row_len: int) -> int:
    """Packed teacher rows per micro-batch: ``mbs`` rows, or as many rows of ``row_len`` as the token
    budget holds (``TokenBudget``), at most a DP rank's share."""
    if isinstance(mbs, TokenBudget):
        mbs = max(1, mbs.max_tokens // row_len)
    return max(1, min(mbs, math.ceil(rows / dp)))


def _width_groups(pk: Packed, dp: int, mbs, min_blocks: int) -> list[tuple[int, int, int, int]]:
    """``(lo, hi, width, rows per micro-batch)`` row ranges, each run as one forward. The rows come
    widest first; a block is one micro-batch per DP rank (:func:`_teacher_micro_batch` at its first
    row's width); consecutive blocks of equal width and micro-batch merge, and a range takes on blocks
    of its micro-batch until it holds ``min_blocks`` (pipeline stages: each schedule fills the pipeline)."""
    n, out, lo = pk.batch.num_samples, [], 0
    while lo < n:
        mb = _teacher_micro_batch(n - lo, dp, mbs, pk.width(lo, lo + 1))   # no more than the rows left
        hi = min(lo + dp * mb, n)
        w = pk.width(lo, hi)
        if out and out[-1][3] == mb and (out[-1][2] == w or out[-1][1] - out[-1][0] < min_blocks * dp * mb):
            out[-1] = (out[-1][0], hi, out[-1][2], mb)
        else:
            out.append((lo, hi, w, mb))
        lo = hi
    return out


def teacher_pass(actor, teacher, pk: Packed, dp: int, mbs, *, k: int | None = None,
                 index: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
    """One packed forward under θ̄; results per sequence in the response frame ``[M, R(, k)]``.

    The rows (decreasing width, ``inputs.pack``) run in ranges of whole micro-batches, each
    narrowed to its widest row (``TrainBatch.narrow``: the cut columns are padding in every row of the
    range), so a micro-batch of short rows does not pay for the longest row's width; logits and the
    vocab passes only at the response targets (``forward_support(masked=True)``)."""
    batch = pk.batch
    key = None
    if index is not None:        # [M, R, k] ids -> packed frame [rows, S-1, k]
        rows, s1 = batch.num_samples, batch.seq_len - 1
        flat = torch.zeros((rows * s1, index.shape[-1]), dtype=torch.long)
        m = pk.resp_mask.reshape(-1) > 0
        flat[pk.target_pos.reshape(-1)[m]] = index.reshape(-1, index.shape[-1])[m]
        batch = dataclasses.replace(batch, extras={**batch.extras, "support_idx": flat.view(rows, s1, -1)})
        key = "support_idx"
    pp = getattr(getattr(actor, "groups", None), "pp_size", 1)
    parts: dict[str, list[torch.Tensor]] = {}
    with teacher.swapped():
        for lo, hi, w, mb in _width_groups(pk, dp, mbs, pp):
            out = actor.forward_support(batch.slice(lo, hi).narrow(w), mb, k=k, index_key=key, masked=True)
            for name, v in out.items():
                full = v.new_zeros((hi - lo, batch.seq_len - 1, *v.shape[2:]))
                full[:, :w - 1] = v
                parts.setdefault(name, []).append(full)
    return {name: pk.gather(torch.cat(vs, 0)) for name, vs in parts.items()}


def teacher_tensors(ctx: UpdateContext, path, rows, hp, loss: str, step: int) -> tuple[dict, dict]:
    """The mini-batch ``rows``' teacher quantities in the response frame (their ``extras`` entries,
    ``support_idx`` in the target frame) and the pass metrics. Teacher sequences and weights are the
    path's (``path.teacher_sequences(ctx, rows, step)``, ``path.teacher``, ``path.packed``)."""
    cfg = path.cfg
    chooser = A.loss_support(loss)
    top_k = hp.top_k if chooser is not None else None   # support losses' hparams carry top_k
    t0 = time.perf_counter()
    seqs, owner = path.teacher_sequences(ctx, rows, step)
    masks = [rows.seqs.resp_mask[j] for j, _ in owner]     # scored: the policy's tokens (multi-turn: not the tools')
    packer = functools.partial(pack, max_resp=cfg.rollout.max_tokens, pad_id=path.tok.pad_id,
                               row_len=cfg.teacher.pack_len or cfg.rollout.max_model_len,
                               multiple=8 * max(1, ctx.info.tp), packed=path.packed,
                               group_rows=ctx.info.dp * (ctx.micro if isinstance(ctx.micro, int) else 1),
                               attn_len=attention_crossover(ctx.actor.hf_cfg))
    passer = functools.partial(teacher_pass, ctx.actor, path.teacher, dp=ctx.info.dp, mbs=ctx.micro)
    if "teacher_neg_topk" in A.loss_inputs(loss, hp):
        ex, packs = _paired_passes(seqs, masks, owner, packer, passer, top_k)
    else:
        student_idx = None
        if chooser == "student":        # the support is the student's top-k at the current θ
            st = ctx.actor.forward_support(rows.seqs.batch, ctx.micro, k=top_k)
            student_idx = st["idx"].gather(1, rows.seqs.resp_pos[..., None].expand(-1, -1, top_k))
        k_neg = max((s for _, s in owner), default=0)
        ex, packs = _one_pass(seqs, masks, owner, packer, passer, chooser, top_k, student_idx, len(rows), k_neg,
                              cfg.rollout.max_tokens)
    idx_resp = ex.pop("support_idx_resp", None)
    if idx_resp is not None:
        ex["support_idx"] = _support_to_train_frame(idx_resp, rows.seqs)
    real = sum(pk.real_tokens for pk in packs)
    slots = sum(pk.slots for pk in packs)
    metrics = {"teacher/sequences": len(seqs), "teacher/rows": sum(pk.batch.num_samples for pk in packs),
               "teacher/pad_frac": 1.0 - real / slots, "teacher/tokens": real,
               "teacher/scored_tokens": sum(float(pk.resp_mask.sum()) for pk in packs),
               "time/teacher": time.perf_counter() - t0, "teacher/syncs": path.teacher.syncs}
    return ex, metrics


def _paired_passes(seqs, masks, owner, packer, passer, top_k):
    """Two passes: the positives' top-k, then the negatives' log-probs at the positives' ids."""
    pos_m, neg_m = ([m for m, (_, s) in enumerate(owner) if s == slot] for slot in (0, 1))
    pk_pos = packer([seqs[m] for m in pos_m], masks=[masks[m] for m in pos_m])
    pos = passer(pk_pos, k=top_k)
    pk_neg = packer([seqs[m] for m in neg_m], masks=[masks[m] for m in neg_m])
    neg = passer(pk_neg, index=pos["idx"])
    ex = {"teacher_topk": with_tail(pos["logp"]), "teacher_neg_topk": with_tail(neg["logp"]),
          "support_idx_resp": pos["idx"], "teacher_logp": pos["token_logp"]}
    return ex, (pk_pos, pk_neg)


def _one_pass(seqs, masks, owner, packer, passer, chooser, top_k, student_idx, n: int, k_neg: int, R_max: int):
    """One pass over every sequence: the positives' token log-probs, entropy and (for a support loss)
    top-k at the chosen ids; the negatives' token log-probs laid out ``[n, k_neg, R]`` with a mask."""
    pk = packer(seqs, masks=masks)
    index = None if student_idx is None else torch.cat([student_idx[j:j + 1] for j, _ in owner], 0)
    out = passer(pk, k=top_k if chooser == "teacher" else None, index=index)
    slot0 = [m for m, (_, s) in enumerate(owner) if s == 0]
    ex = {"teacher_logp": out["token_logp"][slot0], "teacher_entropy": out["entropy"][slot0]}
    if chooser is not None:
        ex["teacher_topk"] = with_tail(out["logp"][slot0])
        ex["support_idx_resp"] = out["idx"][slot0] if chooser == "teacher" else student_idx
    if k_neg > 0:
        neg, nmask = torch.zeros((n, k_neg, R_max)), torch.zeros((n, k_neg), dtype=torch.bool)
        for m, (j, s) in enumerate(owner):
            if s > 0:
                neg[j, s - 1], nmask[j, s - 1] = out["token_logp"][m], True
        ex["teacher_neg_logp"], ex["teacher_neg_mask"] = neg, nmask
    return ex, (pk,)


def _support_to_train_frame(idx_resp: torch.Tensor, sb) -> torch.Tensor:
    """``[n, R, k]`` ids of the response frame -> ``[n, S-1, k]`` target frame (0 off the mask)."""
    n, s1 = sb.batch.num_samples, sb.batch.seq_len - 1
    out = torch.zeros((n, s1, idx_resp.shape[-1]), dtype=torch.long)
    m = sb.resp_mask > 0
    rows = torch.arange(n)[:, None].expand_as(sb.resp_pos)
    out[rows[m], sb.resp_pos[m]] = idx_resp[m]
    return out
