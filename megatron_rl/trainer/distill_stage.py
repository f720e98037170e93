"""Update stage of the self-distillation family: rlcsd, opsd, sdpo, srpo, rlsd, opsd_ectr, rlsd_ectr.

    old/ref log-probs -> GRPO advantages (full groups) -> hint plan (drop/keep, spec §1.5.1)
    -> teacher inputs, packed -> teacher passes under θ̄ (TeacherWeights.swapped, no grad)
    -> teacher tensors in the response frame -> one optimizer step -> teacher schedule

Teacher passes: every teacher sequence of the step (K_i + 1 per kept sample for rlcsd_hints, one
per sample for gt_teacher) is packed into rows of ``teacher.pack_len`` tokens and run as one
forward-only schedule; a second pass is needed only by opsd_ectr (negatives gathered at the
positive teacher's top-k ids). sdpo/srpo choose the support by the STUDENT's top-k: one student
pass (current θ, no grad) picks the ids before the teacher gathers there; at train time the student
support is re-gathered with gradient at the same ids (the loss's declared ``support``, read by
``trainer/objective.Objective``).

Teacher timing: the reference runs teacher forwards inside the update's micro-batch loop. This
trainer makes one optimizer step per trainer step, so θ̄ (and the current θ, in ``fixed`` mode) is
the same before the update as during it: computing the teacher before the update is identical.

Whole-batch statistics (``register_policy_loss(..., batch_stats=...)``, :data:`BATCH_STATS`): RLCSD's
N_non and N_sel are counted over the WHOLE kept batch (the gate depends only on teacher signals and
A, known before the update), so the loss does not depend on micro-batching or DP (spec §1.5.3
"compute the two denominators over the whole mini-batch"); SRPO's mean routed weight likewise.
Every loss trains through the one objective builder (``trainer/objective.py``).
"""
from __future__ import annotations

import dataclasses
import functools
import math
import random
import time

import torch

from megatron_rl import algorithms as A
from megatron_rl.trainer import update_stage as U
from megatron_rl.trainer.batch import TrainBatch
from megatron_rl.trainer.objective import Objective
from megatron_rl.trainer.paths import actor_metrics
from megatron_rl.trainer.teacher_inputs import Packed, pack, truncate_left
from megatron_rl.trainer.vocab_parallel import with_tail


def step_rng(seed: int, step: int) -> random.Random:
    """Hint sampling RNG of a step: a resumed run draws the same hints."""
    return random.Random(seed * 1_000_033 + step * 7_919 + 17)


def pad_train_rows(batch: TrainBatch, multiple: int) -> TrainBatch:
    """Append copies of row 0 with every mask zeroed (spec: zero-mask padding copies contribute nothing)."""
    extra = (-batch.num_samples) % multiple
    if extra == 0:
        return batch
    idx = torch.cat([torch.arange(batch.num_samples), torch.zeros(extra, dtype=torch.long)])
    ex = {k: v[idx].clone() for k, v in batch.extras.items()}
    for k in ("resp_mask", "teacher_neg_mask"):
        if k in ex:
            ex[k][batch.num_samples:] = 0
    if "teacher_neg_mask" in ex:        # keep >= 1 valid slot so rlcsd_signal stays defined (rows are masked)
        ex["teacher_neg_mask"][batch.num_samples:, 0] = 1
    mask = batch.loss_mask[idx].clone()
    mask[batch.num_samples:] = 0
    return TrainBatch(batch.tokens[idx], mask, ex)


def _teacher_micro_batch(rows: int, dp: int, mbs: int) -> int:
    return max(1, min(mbs, math.ceil(rows / dp)))


def teacher_pass(actor, teacher, pk: Packed, dp: int, mbs: int, *, k: int | None = None,
                 index: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
    """One packed forward under θ̄; results per sequence in the response frame ``[M, R(, k)]``."""
    batch = pk.batch
    key = None
    if index is not None:        # [M, R, k] ids -> packed frame [rows, S-1, k]
        rows, s1 = batch.num_samples, batch.seq_len - 1
        flat = torch.zeros((rows * s1, index.shape[-1]), dtype=torch.long)
        m = pk.resp_mask.reshape(-1) > 0
        flat[pk.target_pos.reshape(-1)[m]] = index.reshape(-1, index.shape[-1])[m]
        batch = dataclasses.replace(batch, extras={**batch.extras, "support_idx": flat.view(rows, s1, -1)})
        key = "support_idx"
    with teacher.swapped():
        out = actor.forward_support(batch, _teacher_micro_batch(batch.num_samples, dp, mbs), k=k, index_key=key)
    return {name: pk.gather(v) for name, v in out.items()}


@dataclasses.dataclass
class TeacherTensors:
    """Response-frame teacher quantities of the kept samples (n rows)."""

    extras: dict
    metrics: dict


def build_teacher_tensors(run, tp, ro, keep_sb, plan, hp, kind: str, step: int = 0) -> TeacherTensors:
    """Pack the plan's teacher sequences, run the teacher passes under ``tp.teacher`` (the path's
    weights), and lay the results out per sample. The loss's declarations choose the passes: its
    top-k ``support`` side, and ``teacher_neg_topk`` among its needs (negatives gathered at the
    positive teacher's ids: a second pass)."""
    cfg = run.cfg
    loss = A.algo_kind(kind).loss
    chooser = A.loss_support(loss)
    top_k = hp.top_k if chooser is not None else None   # support losses' hparams carry top_k
    t0 = time.perf_counter()
    seqs, owner = _teacher_sequences(run, ro, plan, step)
    packer = functools.partial(pack, max_resp=cfg.rollout.max_tokens, pad_id=run.tok.pad_id,
                               row_len=cfg.teacher.pack_len or cfg.rollout.max_model_len,
                               multiple=8 * max(1, run.info.tp), packed=tp.packed)
    passer = functools.partial(teacher_pass, run.actor, tp.teacher, dp=run.info.dp, mbs=cfg.trainer.micro_batch_size)
    if "teacher_neg_topk" in A.loss_inputs(loss, hp):
        ex, packs = _paired_passes(seqs, owner, packer, passer, top_k)
    else:
        student_idx = None
        if chooser == "student":        # sdpo/srpo: the support is the student's top-k at the current θ
            st = run.actor.forward_support(keep_sb.batch, cfg.trainer.micro_batch_size, k=top_k)
            student_idx = st["idx"].gather(1, keep_sb.resp_pos[..., None].expand(-1, -1, top_k))
        ex, packs = _one_pass(seqs, owner, packer, passer, chooser, top_k, student_idx, len(plan.keep), plan.k_max,
                              cfg.rollout.max_tokens)
    real = sum(pk.real_tokens for pk in packs)
    slots = sum(pk.batch.num_samples * pk.batch.seq_len for pk in packs)
    metrics = {"teacher/sequences": len(seqs), "teacher/rows": sum(pk.batch.num_samples for pk in packs),
               "teacher/pad_frac": 1.0 - real / slots, "teacher/tokens": real,
               "time/teacher": time.perf_counter() - t0, "teacher/syncs": tp.teacher.syncs}
    return TeacherTensors(ex, metrics)


def _teacher_sequences(run, ro, plan, step: int) -> tuple[list[tuple], list[tuple[int, int]]]:
    """The teacher's (prompt, response) pairs, prompts left-truncated to fit ``max_model_len``, and
    each pair's owner ``(kept sample j, slot)``: slot 0 the positive context, slot s > 0 negative s."""
    seqs, owner = [], []
    for j, i in enumerate(plan.keep):
        resp = ro.responses[i]
        for slot, prompt in enumerate(plan.prompts[j]):
            seqs.append((truncate_left(list(prompt), resp, run.cfg.rollout.max_model_len), resp))
            owner.append((j, slot))
    run.dump_samples(step, "teacher", [list(p) + list(r) for p, r in seqs])
    return seqs, owner


def _paired_passes(seqs, owner, packer, passer, top_k):
    """Two passes: the positives' top-k, then the negatives' log-probs at the positives' ids."""
    pk_pos = packer([seqs[m] for m, (_, s) in enumerate(owner) if s == 0])
    pos = passer(pk_pos, k=top_k)
    pk_neg = packer([seqs[m] for m, (_, s) in enumerate(owner) if s == 1])
    neg = passer(pk_neg, index=pos["idx"])
    ex = {"teacher_topk": with_tail(pos["logp"]), "teacher_neg_topk": with_tail(neg["logp"]),
          "support_idx_resp": pos["idx"], "teacher_logp": pos["token_logp"]}
    return ex, (pk_pos, pk_neg)


def _one_pass(seqs, owner, packer, passer, chooser, top_k, student_idx, n: int, k_neg: int, R_max: int):
    """One pass over every sequence: the positives' token log-probs, entropy and (for a support loss)
    top-k at the chosen ids; the negatives' token log-probs laid out ``[n, k_neg, R]`` with a mask."""
    pk = packer(seqs)
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


def rlcsd_counts(ex: dict, hp) -> tuple[float, float]:
    """(N_non, N_sel) of the whole kept batch, from the teacher tensors and advantages (no grad)."""
    e = A.rlcsd_signal(ex["teacher_logp"], ex["teacher_neg_logp"], ex["teacher_neg_mask"])
    mod = A.rlcsd_advantage(ex["advantages"], e, ex["resp_mask"], **hp.signal_kwargs())
    m = ex["resp_mask"] > 0
    return float((m & ~mod.gate).sum()), float((m & mod.gate).sum())


def _rlcsd_counts_field(ex: dict, hp) -> torch.Tensor:
    return torch.tensor(rlcsd_counts(ex, hp), dtype=torch.float32).expand(ex["resp_mask"].shape[0], 2).clone()


def _srpo_field(ex: dict, hp) -> torch.Tensor:
    """d = u / mean(u) over the whole step's routed tokens (not per micro-batch)."""
    lum = A.srpo_log_u_mean(ex["advantages"], ex["resp_mask"], ex["teacher_entropy"], hp.srpo_beta)
    return lum.expand(ex["resp_mask"].shape[0]).clone()


#: whole-batch statistic field -> how it is computed from the kept batch's extras (no grad)
BATCH_STATS = {"rlcsd_counts": _rlcsd_counts_field, "srpo_log_u_mean": _srpo_field}


def update_teacher(run, tp, ro, step: int) -> dict:
    """old/ref log-probs -> advantages -> hint plan (``tp.plan``) -> teacher passes -> one optimizer step."""
    cfg, hp, kind = run.cfg, run.cfg.algo.hparams, run.cfg.algo.kind
    mbs, R_max, pad = cfg.trainer.micro_batch_size, cfg.rollout.max_tokens, run.tok.pad_id
    plain = U.build_seq_batch(ro.prompts, ro.responses, pad, run.seq_len(ro.prompts, ro.responses), R_max)
    run.dump_samples(step, "policy", [p + r for p, r in zip(ro.prompts, ro.responses)])
    old, ref, metrics = U.old_ref_logprobs(run, ro, plain)
    adv = A.compute_advantages(kind, U.advantage_inputs(ro, plain.resp_mask, old_logp=old, ref_logp=ref), hp).float()
    plan = tp.plan(ro, step)
    metrics.update({"teacher/kept_frac": len(plan.keep) / len(ro),
                    "teacher/dropped_groups": plan.dropped_groups, "teacher/dropped_targets": plan.dropped_targets,
                    "teacher/k_mean": (sum(plan.n_neg) / len(plan.n_neg)) if plan.n_neg else 0.0,
                    "adv/mean_abs": float(adv.abs().mean())})
    if not plan.keep:
        # spec §1.5.1: no surviving sample -> the update is skipped and the teacher counter stays
        metrics.update({"actor/update_skipped": 1.0, "actor/update_successful": 0.0})
        return metrics
    keep = plan.keep
    sub = ro.select(keep)
    keep_sb = U.build_seq_batch(sub.prompts, sub.responses, pad, run.seq_len(sub.prompts, sub.responses), R_max)
    tt = build_teacher_tensors(run, tp, ro, keep_sb, plan, hp, kind, step)
    metrics.update(tt.metrics)
    extras = {"rewards": ro.rewards[keep].float(), "group_ids": sub.group_ids, "advantages": adv[keep],
              "old_logp": old[keep], "resp_pos": keep_sb.resp_pos, "resp_mask": keep_sb.resp_mask}
    if ref is not None:
        extras["ref_logp"] = ref[keep]
    tis, off = U.off_policy_inputs(cfg, ro, old, plain.resp_mask, step)   # stale batches (async rollouts)
    if tis is not None:
        extras["tis_weights"] = tis[keep]
    metrics.update(off)
    idx_resp = tt.extras.pop("support_idx_resp", None)
    extras.update(tt.extras)
    if idx_resp is not None:
        extras["support_idx"] = _support_to_train_frame(idx_resp, keep_sb)
    for name in sorted(A.loss_batch_stats(A.algo_kind(kind).loss)):
        extras[name] = BATCH_STATS[name](extras, hp)
    batch = pad_train_rows(dataclasses.replace(keep_sb.batch, extras=extras), run.info.dp * mbs)
    res = run.actor.train_step(batch, Objective(kind, hp, batch, step), mbs)
    if res.update_successful:
        tp.teacher.after_optimizer_step()
    metrics.update(actor_metrics(res))
    metrics["actor/update_skipped"] = 0.0
    return metrics
