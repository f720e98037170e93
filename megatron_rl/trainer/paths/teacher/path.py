"""The self-distillation data paths: ``rlcsd_hints`` (rlcsd, opsd_ectr, rlsd_ectr; sibling rollouts
as hints, docs/methods/self-distillation.md) and ``gt_teacher`` (opsd, sdpo, srpo, rlsd; the dataset's solution, docs/methods/self-distillation.md).

Each owns the teacher: its hint template (built at start-up from ``teacher.template``), its shadow
weights θ̄ (``weights.TeacherWeights``, built in ``setup`` from the typed ``TeacherHParams``; checkpointed
beside the model, counters in the extra state) and the packing decision. Collection is the plain
sampling round. In the update pipeline (``trainer/pipeline/update.py``) the path plans the teacher prompts on
the whole batch after the advantages (docs/methods/self-distillation.md step 5: the RLCSD family drops samples there;
advantages were computed before, on full groups) and keeps the surviving rows with their plan
(``train_rows``); per mini-batch the pipeline asks it for those rows' support inputs
(``mini_batch_inputs``: their teacher sequences, ``teacher_sequences``, run under θ̄ of that moment
by ``support.py``), and after each optimizer step the
schedule advances (``after_optimizer_step``: EMA, snapshot counter — optimizer steps, docs/methods/self-distillation.md).

Multi-turn rollouts (``multi_turn.enable``, docs/multi-turn.md) are collected by the plain path's agent loop:
the teacher reads the whole response (the policy's turns and the tool / user turns) after its own prompt and
scores the policy's tokens only (the rows' response-frame mask), so every teacher term, top-k support and
normaliser counts mask-1 tokens; a sibling's hint is its decoded trajectory, tool responses included.
"""
from __future__ import annotations

import abc
import dataclasses
import logging
import random

from megatron_rl.algorithms.hparams import HintHParams, TeacherHParams
from megatron_rl.models.provider import resolve_backend
from megatron_rl.trainer.contract import PathSetup, UpdateContext
from megatron_rl.trainer.pipeline.sequences import rollout_sequences

from ..base import BASE_INPUTS, register_path
from ..plain import PlainPath
from .inputs import (
    SOLUTION_KEYS,
    make_template,
    plan_gt,
    plan_hints,
    template_name,
    truncate_left,
)
from .support import teacher_tensors
from .weights import TeacherWeights

log = logging.getLogger("megatron_rl.setup")


def step_rng(seed: int, step: int) -> random.Random:
    """Hint sampling RNG of a step: a resumed run draws the same hints."""
    return random.Random(seed * 1_000_033 + step * 7_919 + 17)


class TeacherPath(PlainPath):
    """Shared part of the two teacher paths (not registered itself)."""

    kl_in_reward = False     # its own update (teacher terms); the RLCSD family uses a KL loss instead
    prompt_context = "hint"  # the teacher prompt's reference answer
    shares_rows = False      # sibling hints (a group's texts) and per-row teacher sequences: the whole batch

    hparams = TeacherHParams

    #: the support passes' counts are summed over the step's optimizer steps, the sync counter is the last
    summed_metrics = ("teacher/sequences", "teacher/rows", "teacher/tokens", "teacher/scored_tokens")
    last_metrics = ("teacher/syncs",)

    def __init__(self, cfg, tok):
        super().__init__(cfg, tok)
        self.template = make_template(cfg.teacher.template, tok)
        self.teacher: TeacherWeights | None = None   # built in ``setup`` (the actor's parameters)
        self.packed = True

    @classmethod
    def validate(cls, cfg) -> None:
        super().validate(cfg)
        if cfg.teacher.pack == "on" and resolve_backend(cfg.model.backend) == "te":
            raise ValueError("teacher.pack=on needs the local attention path (block-diagonal masks); Transformer "
                             "Engine's causal kernels ignore them. Use teacher.pack=auto/off or model.backend=local")

    @classmethod
    def shows_solution(cls, hp) -> bool:
        """Does this path's teacher prompt show the row's reference solution under hparams ``hp``?"""
        return False

    @classmethod
    def row_fields(cls, cfg) -> list[tuple[tuple[str, ...], str]]:
        """The chat teacher prompt shows the row's reference solution (the inline one only the answer):
        without it the teacher would silently see the bare answer as its "solution"."""
        tok_dir = cfg.model.tokenizer_path or cfg.model.hf_path
        if not cls.shows_solution(cfg.algo.hparams) or template_name(cfg.teacher.template, tok_dir) != "chat":
            return []
        return [(SOLUTION_KEYS, f"the reference solution of algo.kind={cfg.algo.kind}'s teacher prompt (teacher.template=chat)")]

    @classmethod
    def resident_weights(cls, actor, hp) -> TeacherWeights:
        """The teacher's weights (its fp32 shadow in snapshot / EMA mode)."""
        return TeacherWeights(actor, hp.teacher_mode, hp.teacher_sync_interval, hp.ema_decay)

    def setup(self, ctx: PathSetup) -> None:
        super().setup(ctx)
        self.teacher = self.resident_weights(ctx.actor, self.hp)
        pack = self.cfg.teacher.pack   # decided from the backend the actor was built with (one resolution)
        self.packed = pack == "on" or (pack == "auto" and ctx.actor.backend == "local")
        log.info("teacher passes: %s", "packed (block-diagonal attention)" if self.packed
                 else "one sequence per row (Transformer Engine attention)")

    @abc.abstractmethod
    def plan(self, ro, step: int):
        """The step's teacher plan (``inputs.TeacherPlan``)."""

    def train_rows(self, ctx: UpdateContext, s, rows, lp, step: int, metrics: dict):
        """The plan's kept rows (their own, shorter padding) with the plan; none survive: the update is
        skipped and the teacher counter stays (docs/methods/self-distillation.md). A multi-turn row keeps its
        policy-token mask (``rollout_sequences``: tool / user tokens leave the loss and response-frame masks)."""
        ro = s.ro
        plan = self.plan(ro, step)
        metrics.update({"teacher/kept_frac": len(plan.keep) / len(ro),
                        "teacher/dropped_groups": plan.dropped_groups, "teacher/dropped_targets": plan.dropped_targets,
                        "teacher/k_mean": (sum(plan.n_neg) / len(plan.n_neg)) if plan.n_neg else 0.0,
                        "actor/update_skipped": 0.0 if plan.keep else 1.0})
        if not plan.keep:
            metrics["actor/update_successful"] = 0.0
            return rows.select([])
        keep = plan.keep
        sub = ro.select(keep)
        seqs = rollout_sequences(ctx, sub)
        ex = {k: v[keep] for k, v in rows.extras.items()}
        ex.update({"group_ids": sub.group_ids, "resp_pos": seqs.resp_pos, "resp_mask": seqs.resp_mask})
        return dataclasses.replace(rows, seqs=seqs, extras=ex, ro=sub, plan=plan)

    def mini_batch_inputs(self, ctx: UpdateContext, rows, hp, loss: str, step: int) -> tuple[dict, dict]:
        """The support passes of the mini-batch ``rows`` under θ̄ of this moment (``support.py``)."""
        return teacher_tensors(ctx, self, rows, hp, loss, step)

    def teacher_sequences(self, ctx: UpdateContext, rows, step: int) -> tuple[list[tuple], list[tuple[int, int]]]:
        """The teacher's (prompt, response) pairs of ``rows``, prompts left-truncated to fit
        ``max_model_len``, and each pair's owner ``(row j, slot)``: slot 0 the positive context, slot
        s > 0 negative s. The response is the whole sampled one (a multi-turn response with its tool / user
        turns, the teacher's context for the policy's next turn); which of its tokens the teacher scores is
        the row's response-frame mask (``support.teacher_tensors``)."""
        seqs, owner = [], []
        for j, prompts in enumerate(rows.plan.prompts):
            resp = rows.ro.response(j)
            for slot, prompt in enumerate(prompts):
                seqs.append((truncate_left(list(prompt), resp, self.cfg.rollout.max_model_len), resp))
                owner.append((j, slot))
        ctx.samples(step, "teacher", [list(p) + list(r) for p, r in seqs])
        return seqs, owner

    def after_optimizer_step(self) -> None:
        self.teacher.after_optimizer_step()

    def shadow_weights(self):
        return self.teacher

    def state_dict(self) -> dict:
        return self.teacher.state_dict()

    def load_state_dict(self, state: dict) -> None:
        self.teacher.load_state_dict(state)


@register_path("rlcsd_hints")
class HintsPath(TeacherPath):
    hparams = HintHParams
    provides = BASE_INPUTS | {"teacher_logp", "teacher_neg_logp", "teacher_neg_mask", "teacher_topk",
                              "teacher_neg_topk", "student_topk", "teacher_entropy", "step"}

    @classmethod
    def shows_solution(cls, hp) -> bool:
        return hp.source == "gt_cot"     # positive hint = the reference solution (else a correct sibling)

    def plan(self, ro, step: int):
        return plan_hints(ro, self.template, k_max=self.hp.k_max, source=self.hp.source,
                          rng=step_rng(self.cfg.trainer.seed, step))


@register_path("gt_teacher")
class GtTeacherPath(TeacherPath):
    provides = BASE_INPUTS | {"teacher_logp", "teacher_topk", "student_topk", "teacher_entropy", "step",
                              "srpo_log_u_mean"}

    @classmethod
    def shows_solution(cls, hp) -> bool:
        return True

    def plan(self, ro, step: int):
        return plan_gt(ro, self.template)
