"""In-flight partial rollouts as a rollout source of the loop (``rollout.partial.enable=true``, ``engine=vllm-async``).

The driver owns a :class:`~megatron_rl.rollout.partial_pool.PartialPool` over the engine pool: it keeps
``data.prompts_per_step + rollout.partial.extra_groups`` groups (``rollout.n`` samples of one prompt)
in flight. Step t takes the first ``prompts_per_step`` groups that finished and leaves the others
running; the weight push that ends the step is taken by the engines WHILE those requests run (pause
keep → load → prefix-cache reset → resume, ``rollout/vllm_async_engine.py``), so a response may span
pushes. Every response token carries the weight version that sampled it (``Rollouts.token_versions``).

Versions: the engines count pushes; the loop counts optimizer steps. At step t the trainer holds the
weights of step t − 1 and the engines hold the last push, so an engine version E maps to the step
version E − (E_now − (t − 1)) — the frame the update reads staleness in ((t − 1) − v, ``pipeline/sequences.behaviour``).

Staleness bound ``rollout.partial.max_staleness`` = k, ``rollout.partial.policy``: ``drop`` — a response
with a token older than k steps drops its group (counted; its prompt is consumed, never retried);
``mask`` — the group is trained and the tokens older than k steps leave the loss mask in the update
(``rows.staleness_keep``, from ``Rollouts.token_versions``; ``partial/masked_tokens``), a response
with no token left still drops its group (the pool's judgement, ``rollout/partial_pool.py``).

Off-policy correction (``algo.off_policy``, ``rows.off_policy_inputs``): the behaviour
log-prob of each token is the engine's log-prob at sampling time (``Rollouts.response_logp``, so
under the version that generated THAT token), the proximal one the trainer's recomputed log-prob
under its current weights (the old-log-prob pass every step runs) — the same decoupled ratio as
one-step-off rollouts, per token. A response is "stale" when any of its tokens is.

Prompts: pool index i is the i-th prompt of the sampler's epoch-wise shuffles (``data/dataset.epoch_permutation``,
the sampler's own); its sampling seed is ``rollouts.sampling_seed`` of (trainer seed, i) on the pool's
stream, so a regenerated group draws the same way under the same weights. A scored batch passes through
the path's declared hook ``shape`` (``contract.CollectHooks``: DAPO's overlong shaping, identity otherwise).

Audit: the driver appends ``{step, trained, dropped}`` (pool indices) to ``run_dir/partial_groups.jsonl``
per step; a resume first drops the rows after the checkpoint's step.

Resume: the checkpoint's ``async`` entry holds the pool's next fresh index and the indices in flight
or finished but untrained; ``--resume auto`` regenerates those from the start under the checkpoint's
weights (``PartialPool``): no index is lost or trained twice.
"""
from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path

import torch

from megatron_rl.data.dataset import epoch_permutation
from megatron_rl.rollout import rollouts as R
from megatron_rl.rollout.partial_pool import PartialPool, StalenessPolicy
from megatron_rl.runtime.broadcast import broadcast_object
from megatron_rl.trainer.contract import CollectHooks

GROUPS_FILE = "partial_groups.jsonl"
#: at close, the longest wait for the groups in flight to finish
DRAIN_S = 300.0


class PoolPrompts:
    """Pool index -> (dataset row index, sampling params): the sampler's epoch-wise permutations."""

    def __init__(self, cfg, dataset, eos_id: int | None):
        self.cfg, self.dataset, self.eos_id = cfg, dataset, eos_id
        self.n, self.seed = len(dataset), cfg.data.seed
        self._perms: dict[int, list[int]] = {}

    def row(self, i: int) -> int:
        e = i // self.n
        if e not in self._perms:
            self._perms = {e: epoch_permutation(self.n, self.seed, e)}
        return self._perms[e][i % self.n]

    def request(self, i: int) -> tuple[list[int], object]:
        sp = R.sampling_params(self.cfg, 0, eos_id=self.eos_id)
        seed = R.sampling_seed(self.cfg.trainer.seed, i, stream=1)
        return list(self.dataset[self.row(i)].prompt_ids), dataclasses.replace(sp, seed=seed)


class PartialRollouts:
    """The loop's handle on partial rollouts (the ``SyncRollouts`` / ``AsyncRollouts`` interface);
    only the driver owns the pool. ``resume``: the pool state of the checkpoint's ``async`` entry."""

    def __init__(self, run, resume: dict | None = None):
        cfg, self.run, self.is_driver = run.cfg, run, run.info.is_driver
        self.path: CollectHooks = run.path
        self.pool, self.last, self.waited = None, {}, 0.0
        self._busy_mark: tuple[float, float] | None = None   # driver: (wall, engines' generating seconds) at a step's start
        if self.is_driver:
            r = cfg.rollout
            self.prompts = PoolPrompts(cfg, run.train_set, run.tok.eos_id)
            self.log = Path(cfg.trainer.run_dir) / GROUPS_FILE
            keep = [x for x in (self.log.read_text().splitlines() if self.log.is_file() else [])
                    if x and json.loads(x)["step"] <= run.state.step]
            self.log.write_text("".join(x + "\n" for x in keep))
            self.pool = PartialPool(run.client, self.prompts.request, groups_per_step=cfg.data.prompts_per_step,
                                    extra=r.partial.extra_groups,
                                    policy=StalenessPolicy(r.partial.max_staleness, r.partial.policy), resume=resume)

    def _collect(self, step: int):
        run = self.run
        engine_v = int(run.client.stats()["rollout/weight_version"])
        shift = engine_v - (step - 1)            # engine version -> step version (module docstring)
        groups, m = self.pool.take(trainer_version=engine_v)
        comps = [dataclasses.replace(c, prompt_index=j) for j, g in enumerate(groups) for c in g.completions]
        rows = [run.train_set[self.prompts.row(g.index)] for g in groups]
        ro = R.from_completions(rows, comps, run.tok)
        ro.token_versions = (ro.token_versions.to(torch.int64) - shift).to(torch.int32)
        ro = self.path.shape(R.score(ro, run.rewards))   # the path's declared hook (contract.CollectHooks)
        m["partial/dropped_total"] = float(self.pool.dropped)
        m["partial/prompts_consumed"] = float(self.pool.next_index - len(self.pool.state_dict()["pending"]))
        ro.stats = {**ro.stats, **m}
        with self.log.open("a") as f:
            f.write(json.dumps({"step": step, "trained": [g.index for g in groups], "dropped": self.pool.last_dropped}) + "\n")
        return ro

    def next(self, step: int) -> tuple[object, dict]:
        """Collective: the batch of ``step`` (taken on the driver, broadcast) and ``{gen_s}``."""
        t0 = time.perf_counter()
        if self.is_driver:
            self._busy_mark = (time.perf_counter(), self._engine_busy()[0])
        data = self._collect(step) if self.is_driver else None
        self.waited = time.perf_counter() - t0
        return broadcast_object(data), {"gen_s": self.waited}

    def before_push(self, step: int) -> None:
        return None   # the push is taken in flight: nothing to drain

    def pushed(self, step: int) -> None:
        return None

    def state(self, step: int) -> dict | None:
        """Driver: the checkpoint's ``async`` entry (the pool's indices; the sampler is unused here)."""
        if not self.is_driver:
            return None
        return {"partial": self.pool.state_dict(), "sampler": self.run.sampler.state_dict()}

    def _engine_busy(self) -> tuple[float, int]:
        """Seconds the engines have generated, summed over the pool (``AsyncVLLMEngine.busy_seconds``), and
        the number of engines."""
        stats = self.run.client.push_stats()
        return float(sum(s["busy_s"] for s in stats)), len(stats)

    def metrics(self, t0: float, t1: float, gen_s: float) -> dict:
        """The trainer's wait for finished groups, and the engines' idle fraction over the step as the
        engines measure it: 1 − Δ(generating seconds) / (engines × Δwall), where an engine generates while
        a request is in flight and it is not paused for a push — so the pauses of the in-flight push and
        the moments every group in flight has finished and waits for the trainer count as idle (driver;
        the other ranks report the trainer's part only)."""
        out = {"time/gen_batch": gen_s, "perf/trainer_idle_frac": gen_s / max(t1 - t0, 1e-9)}
        if self.is_driver and self._busy_mark is not None:
            (wall, busy0), (busy, n) = self._busy_mark, self._engine_busy()
            dt = max(time.perf_counter() - wall, 1e-9) * n
            out["perf/engine_idle_frac"] = min(1.0, max(0.0, 1.0 - (busy - busy0) / dt))
        return out

    def close(self, wait_s: float = DRAIN_S) -> None:
        """Driver: let the groups still in flight finish and discard them (a checkpoint already lists them
        for regeneration), so the engine pool is idle for whoever uses it next (the same process's next run)."""
        if self.pool is None:
            return
        deadline = time.monotonic() + wait_s
        while self.run.client.in_flight() and time.monotonic() < deadline:
            self.run.client.harvest(wait_s=min(5.0, max(0.0, deadline - time.monotonic())),
                                    min_groups=len(self.run.client.in_flight()))
