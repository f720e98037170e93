"""Update stage of the self-distillation family: rlcsd, opsd, sdpo, srpo, rlsd, opsd_ectr, rlsd_ectr.

    old/ref log-probs -> GRPO advantages (full groups) -> hint plan (drop/keep, spec §1.5.1)
    -> teacher inputs, packed -> teacher passes under θ̄ (TeacherWeights.swapped, no grad)
    -> teacher tensors in the response frame -> one optimizer step -> teacher schedule

Teacher passes: every teacher sequence of the step (K_i + 1 per kept sample for rlcsd_hints, one
per sample for gt_teacher) is packed into rows of ``teacher.pack_len`` tokens and run as one
forward-only schedule; a second pass is needed only by opsd_ectr (negatives gathered at the
positive teacher's top-k ids). sdpo/srpo choose the support by the STUDENT's top-k: one student
pass (current θ, no grad) picks the ids before the teacher gathers there; at train time the student
support is re-gathered with gradient at the same ids (``loss_fn.support_index``).

Teacher timing: the reference runs teacher forwards inside the update's micro-batch loop. This
trainer makes one optimizer step per trainer step, so θ̄ (and the current θ, in ``fixed`` mode) is
the same before the update as during it: computing the teacher before the update is identical.

RLCSD normalisers: N_non and N_sel are counted over the WHOLE kept batch (the gate depends only on
teacher signals and A, known before the update), so the loss does not depend on micro-batching or
DP (spec §1.5.3 "compute the two denominators over the whole mini-batch").
"""
from __future__ import annotations

import dataclasses
import math
import random
import time

import torch

from megatron_rl import algorithms as A
from megatron_rl.trainer import update_stage as U
from megatron_rl.trainer.batch import TrainBatch
from megatron_rl.trainer.objective import partial_aggregate
from megatron_rl.trainer.teacher_inputs import Packed, pack, plan_teacher, truncate_left
from megatron_rl.trainer.vocab_parallel import with_tail

TEACHER_KINDS = ("rlcsd", "opsd", "sdpo", "srpo", "rlsd", "opsd_ectr", "rlsd_ectr")
TOPK_LOSSES = {"opsd": "teacher", "opsd_ectr": "teacher", "sdpo": "student", "srpo": "student"}


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


def build_teacher_tensors(run, ro, keep_sb, plan, hp, kind: str, step: int = 0) -> TeacherTensors:
    """Pack the plan's teacher sequences, run the teacher passes, and lay the results out per sample."""
    cfg = run.cfg
    R_max, pad, mbs, dp = cfg.rollout.max_tokens, run.tok.pad_id, cfg.trainer.micro_batch_size, run.info.dp
    n = len(plan.keep)
    k_neg = plan.k_max
    loss = A.algo_kind(kind).loss
    chooser = TOPK_LOSSES.get(loss)
    top_k = getattr(hp, "top_k", None)
    t0 = time.perf_counter()
    seqs, owner = [], []
    for j, i in enumerate(plan.keep):
        resp = ro.responses[i]
        for slot, prompt in enumerate(plan.prompts[j]):
            seqs.append((truncate_left(list(prompt), resp, cfg.rollout.max_model_len), resp))
            owner.append((j, slot))
    run.dump_samples(step, "teacher", [list(p) + list(r) for p, r in seqs])
    mult = 8 * max(1, run.info.tp)
    row_len = cfg.teacher.pack_len or cfg.rollout.max_model_len
    packed = run.teacher_packed
    ex, metrics = {}, {}
    student_idx = None
    if chooser == "student":        # sdpo/srpo: the support is the student's top-k at the current θ
        st = run.actor.forward_support(keep_sb.batch, mbs, k=top_k)
        student_idx = st["idx"].gather(1, keep_sb.resp_pos[..., None].expand(-1, -1, top_k))
    if loss == "opsd_ectr":
        pos_i = [m for m, (_, s) in enumerate(owner) if s == 0]
        neg_i = [m for m, (_, s) in enumerate(owner) if s == 1]
        pk_pos = pack([seqs[m] for m in pos_i], R_max, pad, row_len, mult, packed)
        pos = teacher_pass(run.actor, run.teacher, pk_pos, dp, mbs, k=top_k)
        pk_neg = pack([seqs[m] for m in neg_i], R_max, pad, row_len, mult, packed)
        neg = teacher_pass(run.actor, run.teacher, pk_neg, dp, mbs, index=pos["idx"])
        ex.update({"teacher_topk": with_tail(pos["logp"]), "teacher_neg_topk": with_tail(neg["logp"]),
                   "support_idx_resp": pos["idx"], "teacher_logp": pos["token_logp"]})
        rows, real, slots = pk_pos.batch.num_samples + pk_neg.batch.num_samples, pk_pos.real_tokens + pk_neg.real_tokens, \
            (pk_pos.batch.num_samples * pk_pos.batch.seq_len + pk_neg.batch.num_samples * pk_neg.batch.seq_len)
    else:
        pk = pack(seqs, R_max, pad, row_len, mult, packed)
        index = None
        if student_idx is not None:
            index = torch.cat([student_idx[j:j + 1] for j, _ in owner], 0)
        out = teacher_pass(run.actor, run.teacher, pk, dp, mbs, k=top_k if chooser == "teacher" else None, index=index)
        slot0 = [m for m, (_, s) in enumerate(owner) if s == 0]
        ex["teacher_logp"] = out["token_logp"][slot0]
        ex["teacher_entropy"] = out["entropy"][slot0]
        if chooser is not None:
            ex["teacher_topk"] = with_tail(out["logp"][slot0])
            ex["support_idx_resp"] = out["idx"][slot0] if chooser == "teacher" else student_idx
        if k_neg > 0:
            neg = torch.zeros((n, k_neg, R_max))
            nmask = torch.zeros((n, k_neg), dtype=torch.bool)
            for m, (j, s) in enumerate(owner):
                if s > 0:
                    neg[j, s - 1] = out["token_logp"][m]
                    nmask[j, s - 1] = True
            ex["teacher_neg_logp"], ex["teacher_neg_mask"] = neg, nmask
        rows, real, slots = pk.batch.num_samples, pk.real_tokens, pk.batch.num_samples * pk.batch.seq_len
    metrics.update({"teacher/sequences": len(seqs), "teacher/rows": rows, "teacher/pad_frac": 1.0 - real / slots,
                    "teacher/tokens": real, "time/teacher": time.perf_counter() - t0,
                    "teacher/syncs": run.teacher.syncs})
    return TeacherTensors(ex, metrics)


def _support_to_train_frame(idx_resp: torch.Tensor, sb) -> torch.Tensor:
    """``[n, R, k]`` ids of the response frame -> ``[n, S-1, k]`` target frame (0 off the mask)."""
    n, s1 = sb.batch.num_samples, sb.batch.seq_len - 1
    out = torch.zeros((n, s1, idx_resp.shape[-1]), dtype=torch.long)
    m = sb.resp_mask > 0
    rows = torch.arange(n)[:, None].expand_as(sb.resp_pos)
    out[rows[m], sb.resp_pos[m]] = idx_resp[m]
    return out


def make_teacher_loss_fn(kind: str, hp, step: int, rlcsd_counts: tuple[float, float] | None = None):
    """Per-micro-batch objective of a teacher kind (global normalisers; see the module docstring)."""
    k = A.algo_kind(kind)
    loss = A.get_policy_loss(k.loss)
    topk = k.loss in TOPK_LOSSES

    def loss_fn(logp, entropy, mb: TrainBatch, support=None):
        ex = mb.extras
        pos, m = ex["resp_pos"], ex["resp_mask"]
        lp = logp.gather(1, pos)
        fields = {f: ex[f] for f in ("teacher_logp", "teacher_neg_logp", "teacher_neg_mask", "teacher_topk",
                                     "teacher_neg_topk", "teacher_entropy", "srpo_log_u_mean") if f in ex}
        if topk:
            sup = support.gather(1, pos[..., None].expand(-1, -1, support.shape[-1]))
            fields["student_topk"] = with_tail(sup)
        x = A.AlgoInputs(rewards=ex["rewards"], group_ids=ex["group_ids"], mask=m, logp=lp, old_logp=ex["old_logp"],
                         ref_logp=ex.get("ref_logp"), step=step, **fields)
        metrics = {}
        if k.loss == "rlcsd":
            e = A.rlcsd_signal(x.teacher_logp, x.teacher_neg_logp, x.teacher_neg_mask)
            mod = A.rlcsd_advantage(ex["advantages"], e, m, **hp.signal_kwargs())
            p = A.rlcsd_paths(lp, ex["old_logp"], ex["advantages"], mod.adv_hat, mod.gate, m, clip_eps=hp.clip_low)
            n_non, n_sel = rlcsd_counts
            s = p.loss_non.sum() / max(n_non, 1.0) + hp.eta * p.loss_sel.sum() / max(n_sel, 1.0)
            d = None
            metrics["rlcsd/sel_frac"] = (p.mask_sel.sum(), m.sum())
            metrics["rlcsd/abs_residual"] = ((mod.residual.abs() * m).sum(), m.sum())
        else:
            out = loss(x, ex["advantages"], hp)
            s, d = partial_aggregate(out.loss_mat, m, hp.loss_agg_mode, scale_factor=hp.loss_scale_factor)
        if topk:
            t = x.teacher_topk
            fkl = (t.exp() * (t - x.student_topk.detach())).sum(-1)
            metrics["distill/fkl_support"] = ((fkl * m).sum(), m.sum())
            jsd = A.generalized_jsd(x.student_topk.detach(), t, getattr(hp, "alpha", 0.5)
                                    if k.loss in ("sdpo", "srpo") else 0.5)
            metrics["distill/jsd_support"] = ((jsd * m).sum(), m.sum())
        if "teacher_logp" in ex:
            metrics["distill/teacher_minus_student"] = (((ex["teacher_logp"] - lp.detach()) * m).sum(), m.sum())
        if hp.kl_loss_coef > 0:
            kl_mat = A.kl_penalty(lp, ex["ref_logp"], hp.kl_loss_type)
            kl_num, kl_den = partial_aggregate(kl_mat, m, "token-mean")
            # token-sum losses (rlcsd) carry their own normalisers: the KL is added as a global token mean
            s = s + hp.kl_loss_coef * (kl_num / max(rlcsd_counts[0] + rlcsd_counts[1], 1.0) if d is None else kl_num)
            metrics["actor/kl_loss"] = (kl_num.detach(), kl_den)
        ent = entropy.gather(1, pos)
        metrics["actor/entropy"] = ((ent * m).sum().detach(), m.sum())
        return s, d, metrics

    if topk:
        loss_fn.support_index = "support_idx"
    return loss_fn


def k_loss_of(kind: str) -> str:
    return A.algo_kind(kind).loss


def rlcsd_counts(ex: dict, hp) -> tuple[float, float]:
    """(N_non, N_sel) of the whole kept batch, from the teacher tensors and advantages (no grad)."""
    e = A.rlcsd_signal(ex["teacher_logp"], ex["teacher_neg_logp"], ex["teacher_neg_mask"])
    mod = A.rlcsd_advantage(ex["advantages"], e, ex["resp_mask"], **hp.signal_kwargs())
    m = ex["resp_mask"] > 0
    return float((m & ~mod.gate).sum()), float((m & mod.gate).sum())


def update_teacher(run, ro, step: int) -> dict:
    """old/ref log-probs -> advantages -> hint plan -> teacher passes -> one optimizer step."""
    cfg, hp, kind = run.cfg, run.cfg.algo.hparams, run.cfg.algo.kind
    mbs, R_max, pad = cfg.trainer.micro_batch_size, cfg.rollout.max_tokens, run.tok.pad_id
    path = A.KIND_DATA_PATH[kind]
    plain = U.build_seq_batch(ro.prompts, ro.responses, pad, run.seq_len(ro.prompts, ro.responses), R_max)
    run.dump_samples(step, "policy", [p + r for p, r in zip(ro.prompts, ro.responses)])
    old, ref, metrics = U.old_ref_logprobs(run, ro, plain)
    m = plain.resp_mask
    adv = A.compute_advantages(kind, U.advantage_inputs(ro, m, old_logp=old, ref_logp=ref), hp).float()
    plan = plan_teacher(path, ro, run.teacher_template, k_max=getattr(hp, "k_max", 1),
                        source=getattr(hp, "source", "self_rollout"), rng=step_rng(cfg.trainer.seed, step))
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
    tt = build_teacher_tensors(run, ro, keep_sb, plan, hp, kind, step)
    metrics.update(tt.metrics)
    extras = {"rewards": ro.rewards[keep].float(), "group_ids": sub.group_ids, "advantages": adv[keep],
              "old_logp": old[keep], "resp_pos": keep_sb.resp_pos, "resp_mask": keep_sb.resp_mask}
    if ref is not None:
        extras["ref_logp"] = ref[keep]
    idx_resp = tt.extras.pop("support_idx_resp", None)
    extras.update(tt.extras)
    if idx_resp is not None:
        extras["support_idx"] = _support_to_train_frame(idx_resp, keep_sb)
    if k_loss_of(kind) == "srpo":   # d = u / mean(u) over the whole step's routed tokens (not per micro-batch)
        lum = A.srpo_log_u_mean(extras["advantages"], extras["resp_mask"], extras["teacher_entropy"], hp.srpo_beta)
        extras["srpo_log_u_mean"] = lum.expand(len(keep)).clone()
    counts = rlcsd_counts(extras, hp) if kind == "rlcsd" else (float(keep_sb.resp_mask.sum()), 0.0)
    batch = pad_train_rows(dataclasses.replace(keep_sb.batch, extras=extras), run.info.dp * mbs)
    res = run.actor.train_step(batch, make_teacher_loss_fn(kind, hp, step, counts), mbs)
    if res.update_successful:
        run.teacher.after_optimizer_step()
    metrics.update({f"actor/{k}" if "/" not in k else k: v for k, v in res.to_dict().items()})
    metrics["actor/update_skipped"] = 0.0
    return metrics
