"""The ``process_reward`` data path (PAPO): the sampling path plus rubric process scores. The driver
starts grading right after the rollouts (``collect``) and the update waits for what is left after
the old/ref log-probs (``PendingGrades``), so grading overlaps the log-prob passes."""
from __future__ import annotations

from megatron_rl.algorithms.hparams import PAPOHParams

from . import BASE_INPUTS, register_path
from .sampling import PlainPath


@register_path("process_reward")
class ProcessRewardPath(PlainPath):
    hparams = PAPOHParams
    provides = BASE_INPUTS | {"process"}
    uses_grader = True

    def __init__(self, cfg, tok):
        from megatron_rl.trainer.rollout_stage import PendingGrades

        super().__init__(cfg, tok)
        self.pending = PendingGrades()
        self.grader = None

    @classmethod
    def validate(cls, cfg) -> None:
        super().validate(cfg)
        if not cfg.reward.grader_url:
            raise ValueError(f"algo.kind={cfg.algo.kind!r} needs a rubric grader: set reward.grader_url "
                             "(an OpenAI-compatible endpoint, e.g. http://host:8000/v1)")

    def setup(self, run) -> None:
        super().setup(run)
        if run.info.is_driver:
            from megatron_rl.trainer.setup import build_grader

            self.grader = build_grader(self.cfg)

    def collect(self, step: int):
        ro = super().collect(step)
        every = self.hp.reward_mode == "prm_only"
        if self.cfg.rollout.max_staleness > 0:
            # asynchronous rollouts: this runs on the producer thread, ahead of the update, which may
            # still be waiting for an earlier batch's grades; grade to completion here (off the
            # trainer's critical path already) instead of sharing the one pending slot
            from megatron_rl.trainer.rollout_stage import grade_process

            return grade_process(ro, self.grader, every=every)
        self.pending.start(ro, self.grader, every=every)
        return ro

    def after_logprobs(self, s, lp, metrics: dict) -> None:
        ro = s.ro
        if ro.process is not None:        # graded in collect (asynchronous rollouts)
            metrics["time/grader_wait"] = 0.0
            return
        metrics["time/grader_wait"] = self.pending.finish(ro, self.run.info.is_driver)
        metrics["time/grader_overlap"] = metrics["time/logprobs"]

    def driver_stats(self, ro) -> dict:
        out = dict(self.grader.stats())
        out["reward/process_mean"] = float(ro.process[ro.correct].mean()) if bool(ro.correct.any()) else 0.0
        return out

    def close(self) -> None:
        self.pending.close()
