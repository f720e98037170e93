"""The sampling data paths: ``plain`` (GRPO, DAPO, Dr.GRPO, RLOO, …) and ``greedy`` (ReMax).

    collect (driver):  [round]*  ->  (dynamic sampling: keep informative groups, fill)
        round = sample rollout.n per prompt -> reward -> (overlong shaping) -> (greedy baseline)
    update: the shared pipeline (``trainer/pipeline/update.py``) on the sampled sequences as they are

Composable pieces, chosen once at start-up from the method's typed hparams: DAPO's soft overlong
shaping and dynamic sampling run for every method whose hparams derive from ``SamplingHParams``
(DAPO, BiCC) when switched on; the greedy baseline (one greedy rollout per prompt, ReMax) runs
when the path's :meth:`PlainPath.wants_greedy` says so (``greedy``; BiCC with ``base=remax``).
"""
from __future__ import annotations

import logging
from typing import ClassVar

from megatron_rl import algorithms as A
from megatron_rl.algorithms.hparams import SamplingHParams
from megatron_rl.rollout import rollouts as R
from megatron_rl.rollout.pending_rewards import PendingRewards

from .agent_rollouts import AgentRollouts
from .base import BASE_INPUTS, DataPath, register_path
from megatron_rl.trainer.contract import CollectContext, UpdateContext

log = logging.getLogger("megatron_rl.loop")


@register_path("plain")
class PlainPath(DataPath):
    """Sample, reward, train (module docstring)."""

    kl_in_reward = True
    shares_rows = True       # its hooks read per-sample fields only (rewards, greedy baseline, process scores)
    #: score the batch beside the old / ref log-prob passes (``rollout/pending_rewards.py``) when the
    #: collection itself reads no reward (no dynamic sampling, no greedy baseline) and runs in step with
    #: the update (``rollout.max_staleness=0``); a subclass whose ``collect`` reads rewards says False
    defer_rewards: ClassVar[bool] = True
    multi_turn_unsupported: ClassVar[str] = ""

    def __init__(self, cfg, tok):
        super().__init__(cfg, tok)
        self.sampling = self.hp if isinstance(self.hp, SamplingHParams) else None
        self.greedy = self.wants_greedy(self.hp)
        self.deferred = PendingRewards() if self.defers_rewards() else None
        self.agent = AgentRollouts(cfg, tok) if cfg.multi_turn.enable else None

    def generate(self, ctx: CollectContext, idx: list[int], sampling):
        """One generation batch of rows ``idx``: the plain rollout, or the agent loops' (``multi_turn.enable``)."""
        if self.agent is not None:
            return self.agent.generate(ctx.client, ctx.train_set, idx, sampling)
        return R.generate(ctx.client, ctx.train_set, idx, sampling, self.tok)

    def defers_rewards(self) -> bool:
        """Are this run's rewards scored beside the log-prob passes (``defer_rewards``)?"""
        dynamic = self.sampling is not None and self.sampling.filter_groups
        sync = self.cfg.rollout.max_staleness == 0 and not self.cfg.rollout.partial.enable   # partial: scored in its source
        return self.defer_rewards and sync and not self.greedy and not dynamic

    @classmethod
    def wants_greedy(cls, hp) -> bool:
        return False

    @classmethod
    def partial_refusal(cls, hp) -> str:
        """The partial source replaces :meth:`collect` by one sampled group per prompt: this path's own
        collection, unless a greedy baseline, dynamic sampling or a subclass's ``collect`` adds to it."""
        if cls.wants_greedy(hp) or cls.collect is not PlainPath.collect:
            return f"the {cls.name!r} path collects more than one sampled group per prompt"
        if isinstance(hp, SamplingHParams) and hp.filter_groups:
            return "dynamic sampling draws generation rounds until groups are informative"
        return ""

    @classmethod
    def provides_for(cls, hp) -> set:
        return set(cls.provides) | ({"greedy_rewards"} if cls.wants_greedy(hp) else set())

    @classmethod
    def validate(cls, cfg) -> None:
        super().validate(cfg)
        hp = cfg.algo.hparams
        if isinstance(hp, SamplingHParams) and hp.overlong_enable and hp.overlong_buffer_len > cfg.rollout.max_tokens:
            raise ValueError(f"algo.{cfg.algo.kind}.overlong_buffer_len={hp.overlong_buffer_len} must be <= "
                             f"rollout.max_tokens={cfg.rollout.max_tokens} (DAPO overlong shaping); lower it or set "
                             "overlong_enable=false")

    def collect(self, ctx: CollectContext, step: int):
        if self.sampling is not None and self.sampling.filter_groups:
            return collect_dynamic(self, ctx, step, self.sampling)
        if self.deferred is not None:    # scored on the driver's worker thread; joined after the log-prob passes
            ro = self.generate(ctx, ctx.sampler.next_batch(), R.sampling_params(self.cfg, step, 0, eos_id=self.tok.eos_id))
            self.deferred.start(ro, ctx.rewards, self.shape)
            return ro
        return self.round(ctx, step, 0)

    def shape(self, ro):
        """DAPO's soft overlong shaping of a scored batch (when the method switches it on)."""
        if self.sampling is not None and self.sampling.overlong_enable:
            return R.overlong_shaping(ro, self.sampling, self.cfg.rollout.max_tokens)
        return ro

    def join_rewards(self, ctx: UpdateContext, s, metrics: dict) -> None:
        """The deferred rewards land on every rank (``time/reward_wait``: the driver's wait for them)."""
        if self.deferred is not None:
            metrics["time/reward_wait"] = self.deferred.finish(s.ro, ctx.info.is_driver)

    def close(self) -> None:
        super().close()
        if self.deferred is not None:
            self.deferred.close()

    def round(self, ctx: CollectContext, step: int, round_: int):
        """One generation batch: sample ``rollout.n`` per prompt, score, DAPO overlong shaping, and the
        greedy baseline (driver)."""
        cfg, tok = self.cfg, self.tok
        idx = ctx.sampler.next_batch()
        part = self.shape(R.score(self.generate(ctx, idx, R.sampling_params(cfg, step, round_, eos_id=tok.eos_id)),
                                  ctx.rewards))
        if self.greedy:
            sp = R.sampling_params(cfg, step, round_ + 1, greedy=True, eos_id=tok.eos_id)
            g = R.score(R.generate(ctx.client, ctx.train_set, idx, sp, tok), ctx.rewards)
            part.greedy_rewards = g.rewards.repeat_interleave(cfg.rollout.n)
        return part


@register_path("greedy")
class GreedyPath(PlainPath):
    """ReMax: the plain path plus one greedy rollout per prompt (its reward is the baseline)."""

    provides = BASE_INPUTS | {"greedy_rewards"}
    multi_turn_unsupported = "ReMax's greedy baseline is a single-turn rollout (its reward would not be a baseline of the trajectories')"

    @classmethod
    def wants_greedy(cls, hp) -> bool:
        return True


def collect_dynamic(path: PlainPath, ctx: CollectContext, step: int, hp: SamplingHParams):
    """DAPO dynamic sampling (docs/methods/grpo.md DAPO): keep groups whose metric is not uniform, over successive
    generation batches, until ``prompts_per_step`` groups are kept; then the first ``prompts_per_step``.
    ``max_num_gen_batches`` ≤ 0: unlimited (a warning every 10 batches); at the cap ``at_cap=raise``
    stops the run (the reference's behaviour), ``at_cap=fill`` completes the batch with uniform
    groups of this step's batches — each group at most once — counted as ``dynamic/padded_groups``."""
    cfg = path.cfg
    need, n = cfg.data.prompts_per_step, cfg.rollout.n
    ds = A.DynamicSampler(need, max(0, hp.max_num_gen_batches))
    kept, spare = [], []
    while not ds.ready:
        if hp.max_num_gen_batches > 0 and ds.batches >= hp.max_num_gen_batches:
            if hp.at_cap == "raise":
                raise RuntimeError(f"dynamic sampling: {ds.kept_prompts}/{need} informative groups after "
                                   f"max_num_gen_batches={hp.max_num_gen_batches} generation batches at step {step}; "
                                   f"raise algo.{cfg.algo.kind}.max_num_gen_batches (<= 0: unlimited) or set at_cap=fill")
            break
        part = path.round(ctx, step, ds.batches)
        metric = part.correct.float() if hp.filter_metric == "acc" else part.rewards
        keep = ds.add(metric, part.group_ids).tolist()
        kept.append(part.select(keep))
        spare.append(part.select(sorted(set(range(len(part))) - set(keep))))
        if hp.max_num_gen_batches <= 0 and ds.batches % 10 == 0:
            log.warning("dynamic sampling: %d generation batches so far at step %d, %d/%d informative groups",
                        ds.batches, step, ds.kept_prompts, need)
    return fill(kept, spare, need, n, ds)


def fill(kept: list, spare: list, need: int, n: int, ds):
    """The first ``need`` kept groups, completed (fill mode) by whole uniform groups never used before."""
    parts = [p for p in kept if len(p)]
    have = sum(len(p) for p in parts) // n
    padded = 0
    for p in spare:
        if have + padded >= need:
            break
        take = min(len(p) // n, need - have - padded)
        if take:
            parts.append(p.select(list(range(take * n))))
            padded += take
    ro = R.concat(parts)
    ro = ro.select(list(range(min(len(ro), need * n))))
    ro.stats = {**ro.stats, "dynamic/gen_rounds": ds.batches, "dynamic/padded_groups": padded,
                "dynamic/filtered_groups": ds.filtered_prompts}
    return ro
