"""The ``process_reward`` data path (PAPO): the sampling path plus rubric process scores. The driver
starts grading right after the rollouts (``collect``) and the update waits for what is left after
the old/ref log-probs (``PendingGrades``), so grading overlaps the log-prob passes."""
from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import torch

from megatron_rl.algorithms.hparams import PAPOHParams
from megatron_rl.rewards.problem import problem_text
from megatron_rl.rewards.factory import build_grader
from megatron_rl.rewards.judge_client import JudgeRejected
from megatron_rl.rollout.rollouts import Rollouts
from megatron_rl.runtime.broadcast import broadcast_object

from .base import BASE_INPUTS, register_path
from megatron_rl.trainer.contract import CollectContext, PathSetup, UpdateContext
from .plain import PlainPath


def _grade_items(rollouts: Rollouts, every: bool = False) -> tuple[list[int], list[tuple[str, str, str]]]:
    """(indices of the CORRECT responses — every response with ``every`` (PRM-only ablation) —,
    their grader items (problem, reference, response))."""
    idx = [i for i in range(len(rollouts)) if every or bool(rollouts.correct[i])]
    items = []
    for i in idx:
        row = rollouts.rows[i]
        ref = row.extra_info.get("reference_solution") or row.extra_info.get("solution") or str(row.ground_truth)
        problem = problem_text(row)
        items.append((problem, ref, rollouts.texts[i]))
    return idx, items


def _process_tensor(n: int, idx: list[int], scores: list[float]) -> torch.Tensor:
    proc = torch.zeros(n)
    if idx:
        proc[idx] = torch.tensor(scores, dtype=torch.float32)
    return proc


def grade_process(rollouts: Rollouts, grader, every: bool = False) -> Rollouts:
    """PAPO process scores: the rubric grader is called for CORRECT responses only (incorrect -> 0
    without a call; every response with ``every``, the PRM-only ablation). Reference = the row's worked
    solution (``extra_info.solution`` / ``reference_solution``), else its ground-truth answer
    (synthetic tasks have no worked solution)."""
    idx, items = _grade_items(rollouts, every)
    rollouts.process = _process_tensor(len(rollouts), idx, grader.grade_batch(items) if idx else [])
    return rollouts


class PendingGrades:
    """Rubric grading running in a background thread while the trainer computes log-probs.

    ``start`` (rank 0) submits the grader calls for the correct responses and returns at once;
    ``finish`` (collective) waits for them on rank 0, broadcasts the process scores and stores them in
    ``rollouts.process``. The grader's own timeout / retries / fallback bound the wait, so an outage
    delays a step by at most the configured timeout budget and is counted in the grader stats; a
    grader that refuses the requests (``JudgeRejected``) stops every rank at this step.
    """

    def __init__(self):
        self.pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="rubric-grader")
        self.future = None
        self.idx: list[int] = []

    def start(self, rollouts: Rollouts, grader, every: bool = False) -> None:
        self.idx, items = _grade_items(rollouts, every)
        self.future = self.pool.submit(grader.grade_batch, items) if self.idx else None

    def finish(self, rollouts: Rollouts, is_driver: bool) -> float:
        """Collective; returns the seconds rank 0 waited for the grader (0 elsewhere)."""
        t0 = time.perf_counter()
        proc = None
        if is_driver:
            try:
                scores = self.future.result() if self.future is not None else []
                proc = _process_tensor(len(rollouts), self.idx, scores)
            except JudgeRejected as e:   # a misconfigured grader: every rank stops at this step (trainer/loop/rl_loop.py)
                proc = e
            self.future, self.idx = None, []
        proc = broadcast_object(proc)
        if isinstance(proc, JudgeRejected):
            raise proc
        rollouts.process = proc
        return time.perf_counter() - t0 if is_driver else 0.0

    def close(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)


@register_path("process_reward")
class ProcessRewardPath(PlainPath):
    multi_turn_unsupported = "PAPO's rubric grader reads a single-turn answer"
    hparams = PAPOHParams
    provides = BASE_INPUTS | {"process"}
    uses_grader = True
    defer_rewards = False    # collect grades the correct responses: it needs the rewards there

    def __init__(self, cfg, tok):
        super().__init__(cfg, tok)
        self.pending = PendingGrades()
        self.grader = None

    @classmethod
    def validate(cls, cfg) -> None:
        super().validate(cfg)
        if not cfg.reward.grader_url:
            raise ValueError(f"algo.kind={cfg.algo.kind!r} needs a rubric grader: set reward.grader_url "
                             "(an OpenAI-compatible endpoint, e.g. http://host:8000/v1)")

    def setup(self, ctx: PathSetup) -> None:
        super().setup(ctx)
        if ctx.is_driver:
            self.grader = build_grader(self.cfg)

    def collect(self, ctx: CollectContext, step: int):
        ro = super().collect(ctx, step)
        every = self.hp.reward_mode == "prm_only"
        if self.cfg.rollout.max_staleness > 0:
            # asynchronous rollouts: this runs on the producer thread, ahead of the update, which may
            # still be waiting for an earlier batch's grades; grade to completion here (off the
            # trainer's critical path already) instead of sharing the one pending slot
            return grade_process(ro, self.grader, every=every)
        self.pending.start(ro, self.grader, every=every)
        return ro

    def after_logprobs(self, ctx: UpdateContext, s, lp, metrics: dict) -> None:
        ro = s.ro
        if ro.process is not None:        # graded in collect (asynchronous rollouts)
            metrics["time/grader_wait"] = 0.0
            return
        metrics["time/grader_wait"] = self.pending.finish(ro, ctx.info.is_driver)
        metrics["time/grader_overlap"] = metrics["time/logprobs"]

    def driver_stats(self, ro) -> dict:
        out = dict(self.grader.stats())
        out["reward/process_mean"] = float(ro.process[ro.correct].mean()) if bool(ro.correct.any()) else 0.0
        return out

    def close(self) -> None:
        super().close()
        self.pending.close()
