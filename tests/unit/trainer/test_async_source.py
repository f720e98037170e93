"""The asynchronous rollout producer (``trainer/loop/async_source.py``): the version schedule, overlap,
checkpoint/resume of what is in flight, errors, and the CPU split. ``collect`` here is a plain
function drawing prompts from the real :class:`DeterministicSampler`; the engines' part is covered
by the e2e tests (tests/e2e/test_resume.py, test_learning.py)."""
from __future__ import annotations

import threading
import time

import pytest

from megatron_rl.data.dataset import DeterministicSampler
from megatron_rl.trainer.loop.async_source import (
    PINNING_OFF,
    AsyncProducer,
    core_plan,
    core_split,
    engine_env,
    overlap,
    pin_local_trainer,
    restore_state,
)
from tests.helpers.dist import repo_env


class Engines:
    """Stand-in state of the engine pool: the weight version it holds and a log of (step, version)."""

    def __init__(self, sampler, gen_s=0.0):
        self.version, self.sampler, self.gen_s, self.log = 0, sampler, gen_s, []
        self.lock = threading.Lock()

    def collect(self, step):
        with self.lock:
            v = self.version
        idx = self.sampler.next_batch()
        time.sleep(self.gen_s)
        with self.lock:
            assert self.version == v, f"weights changed during the generation of step {step}"
        self.log.append((step, v))
        return {"step": step, "idx": idx, "version": v}


def _train(prod, eng, steps, first=1, train_s=0.0, stop_at=None):
    """The trainer side of the protocol: get -> (train) -> before_push -> push -> pushed."""
    out = []
    for t in range(first, steps + 1):
        tag, _ = prod.get(t)
        out.append(tag.data)
        time.sleep(train_s)
        prod.before_push(t)
        with eng.lock:
            eng.version = t
        prod.pushed(t)
        if stop_at == t:
            return out, prod.state_dict(t)
    return out, None


@pytest.mark.parametrize("k", [1, 2, 3])
def test_batch_j_is_generated_with_version_j_minus_1_minus_k(k):
    eng = Engines(DeterministicSampler(40, 4, seed=1), gen_s=0.005)
    prod = AsyncProducer(eng.collect, first_step=1, last_step=7, max_staleness=k, version=0,
                         sampler_state=eng.sampler.state_dict)
    got, _ = _train(prod, eng, 7, train_s=0.005)
    prod.close()
    assert [d["version"] for d in got] == [max(0, j - 1 - k) for j in range(1, 8)]
    fresh = DeterministicSampler(40, 4, seed=1)
    assert [d["idx"] for d in got] == [fresh.next_batch() for _ in range(7)], "prompts in the synchronous order"
    assert [s for s, _ in eng.log] == list(range(1, 8)), "each step generated once, in order"


def test_generation_overlaps_training():
    """gen 0.15 s + train 0.15 s per step: sync ~0.30 s/step, one-step-off ~0.15 s/step (+ first batch)."""
    eng = Engines(DeterministicSampler(40, 4), gen_s=0.15)
    prod = AsyncProducer(eng.collect, first_step=1, last_step=6, max_staleness=1, version=0)
    t0 = time.perf_counter()
    _train(prod, eng, 6, train_s=0.15)
    wall = time.perf_counter() - t0
    busy = prod.engine_busy(t0, time.perf_counter())
    prod.close()
    assert wall < 0.75 * 6 * 0.30, wall
    assert busy == pytest.approx(6 * 0.15, rel=0.3)


@pytest.mark.parametrize("k,stop", [(1, 2), (2, 3), (1, 6)], ids=["k1-mid", "k2-mid", "k1-end"])
def test_checkpoint_and_resume_reproduce_the_uninterrupted_batches(k, stop):
    steps = 6
    ref_eng = Engines(DeterministicSampler(20, 4, seed=3))
    prod = AsyncProducer(ref_eng.collect, first_step=1, last_step=steps, max_staleness=k, version=0,
                         sampler_state=ref_eng.sampler.state_dict)
    ref, _ = _train(prod, ref_eng, steps)
    prod.close()

    eng = Engines(DeterministicSampler(20, 4, seed=3), gen_s=0.01)
    prod = AsyncProducer(eng.collect, first_step=1, last_step=steps, max_staleness=k, version=0,
                         sampler_state=eng.sampler.state_dict)
    first, state = _train(prod, eng, steps, stop_at=stop)
    prod.close()      # the "crash": whatever was in flight is lost
    assert [t.step for t in state["pending"]] == list(range(stop + 1, min(stop + k, steps) + 1))

    eng2 = Engines(DeterministicSampler(20, 4, seed=3))     # a new process: weights = checkpoint's
    eng2.version = stop
    pending, sampler = restore_state(state, k)
    eng2.sampler.load_state_dict(sampler)
    prod = AsyncProducer(eng2.collect, first_step=stop + 1, last_step=steps, max_staleness=k, version=stop,
                         sampler_state=eng2.sampler.state_dict, pending=pending)
    rest, _ = _train(prod, eng2, steps, first=stop + 1)
    prod.close()
    assert first + rest == ref


def test_collect_error_surfaces_on_the_trainer_thread():
    def collect(step):
        if step == 2:
            raise ValueError("engine exploded")
        return step

    prod = AsyncProducer(collect, first_step=1, last_step=4, max_staleness=1, version=0)
    assert prod.get(1)[0].data == 1
    with pytest.raises(RuntimeError, match="asynchronous rollout failed .* engine exploded"):
        prod.before_push(1)
    prod.close()


def test_resume_with_other_staleness_is_refused_and_bad_pending_rejected():
    tag_state = {"max_staleness": 2, "pending": ["x"], "sampler": {}}
    with pytest.raises(ValueError, match="max_staleness=2"):
        restore_state(tag_state, 1)
    assert restore_state(None, 1) == ([], None)
    with pytest.raises(ValueError, match="max_staleness"):
        AsyncProducer(lambda s: s, first_step=1, last_step=3, max_staleness=0, version=0)


def test_core_plan_and_overlap():
    p = core_plan([0, 1], trainer_procs=1)
    assert p.trainer == (frozenset({0}),) and p.engines == frozenset({1})
    p = core_plan(list(range(8)), trainer_procs=2)
    assert p.engines == frozenset({4, 5, 6, 7}) and p.trainer == (frozenset({0, 2}), frozenset({1, 3}))
    assert core_plan([3], 1).engines == frozenset({3})
    assert overlap([(0.0, 1.0), (2.0, 3.0)], 0.5, 2.5) == pytest.approx(1.0)


def test_no_pinning_and_no_engine_cores_with_cuda(caplog):
    """Review row S4: an overlapped run (async / partial) pins the trainer to the first half of the cores and
    hands the engines the rest on CPU only; with CUDA the decision is None — no trainer pinning, no engine
    core environment — and the rank logs one line saying pinning is off and why."""
    assert core_split(True, range(16), 2) is None and engine_env(None) is None
    assert core_split(False, range(16), 2) == core_plan(list(range(16)), 2)
    assert engine_env(core_split(False, [0, 1, 2, 3], 1)) == {"MEGATRON_RL_CPU_CORES": "2,3", "OMP_NUM_THREADS": "2"}
    with caplog.at_level("INFO", logger="megatron_rl.trainer.async"):
        assert pin_local_trainer(None, 0) is None
    lines = [r.getMessage() for r in caplog.records if r.name == "megatron_rl.trainer.async"]
    assert lines == [PINNING_OFF] and "not pinned" in PINNING_OFF and "CUDA" in PINNING_OFF


PIN_CPU = """
import json, os
from megatron_rl.trainer.loop.async_source import core_split, pin_local_trainer
plan = core_split(False, sorted(os.sched_getaffinity(0)), 1)
mine = pin_local_trainer(plan, 0)
print(json.dumps({"mine": sorted(mine), "now": sorted(os.sched_getaffinity(0)), "engines": sorted(plan.engines)}))
"""


def test_cpu_branch_pins_the_trainer_to_its_cores():
    """The CPU branch, in a fresh process (pinning is process-wide): the trainer runs on its cores of the
    plan afterwards, disjoint from the engines'."""
    import json
    import os
    import subprocess
    import sys

    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("one core: nothing to split")
    out = json.loads(subprocess.run([sys.executable, "-c", PIN_CPU], capture_output=True, text=True, check=True,
                                    env=repo_env()).stdout.strip().splitlines()[-1])
    assert out["now"] == out["mine"] and out["mine"] and not set(out["mine"]) & set(out["engines"])


def test_config_keys_validated_at_start_up():
    from megatron_rl.config import load_config

    cfg = load_config(None, ["rollout.max_staleness=2", "algo.off_policy=tis", "algo.tis_cap=3"])
    assert (cfg.rollout.max_staleness, cfg.algo.off_policy, cfg.algo.tis_cap) == (2, "tis", 3.0)
    assert cfg.to_dict()["algo"]["off_policy"] == "tis"
    assert load_config(None, []).rollout.max_staleness == 0 and load_config(None, []).algo.off_policy == "decoupled"
    for bad, words in [("rollout.max_staleness=-1", "max_staleness must be an integer >= 0"),
                       ("rollout.max_staleness=0.5", "expected an integer"),
                       ("algo.off_policy=clip", "algo.off_policy must be one of"),
                       ("algo.tis_cap=0.9", "algo.tis_cap must be a finite number >= 1")]:
        with pytest.raises(ValueError, match=words):
            load_config(None, [bad])


@pytest.mark.parametrize("over,words", [
    (["algo.kind=score", "rollout.max_staleness=1"], "algo.kind='score' .*cannot run with rollout.max_staleness=1"),
    (["algo.kind=score", "algo.off_policy=tis"], "algo.kind='score' .*cannot run with algo.off_policy=tis"),
], ids=["score-async", "score-tis"])
def test_paths_that_cannot_run_async_fail_at_start_up(over, words):
    from megatron_rl.trainer.loop.preflight import load_checked

    with pytest.raises(ValueError, match=words):
        load_checked(None, over)


def test_off_policy_inputs_use_the_batch_weight_version():
    """``rows.off_policy_inputs``: staleness = (step − 1) − ro.weight_version; behaviour =
    the engine log-probs of each response; a synchronous batch (no version) gets no weights."""
    import math

    import torch

    from megatron_rl.config import load_config
    from megatron_rl.rollout.rollouts import Rollouts
    from megatron_rl.trainer.pipeline.rows import off_policy_inputs
    from megatron_rl.trainer.pipeline.sequences import behaviour

    ro = Rollouts.from_lists(rows=[None, None], prompts=[[1], [1]], responses=[[5, 6], [7]], logps=[[-1.0, -0.5], [-2.0]],
                  finish=["stop", "stop"], group_ids=torch.tensor([0, 0]))
    old = torch.tensor([[-0.9, -0.5], [-1.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0]])
    cfg = load_config(None, [])
    w, m = off_policy_inputs(cfg, old, mask, behaviour(ro, mask, step=4))
    assert w is None and m["offpolicy/staleness_max"] == 0.0
    ro.weight_version = 1
    assert ro.select([1, 0]).weight_version == 1
    w, m = off_policy_inputs(cfg, old, mask, behaviour(ro, mask, step=4))
    torch.testing.assert_close(w, torch.tensor([[math.exp(0.1), 1.0], [2.0, 0.0]]))
    assert m["offpolicy/staleness_mean"] == 2.0 and abs(m["offpolicy/is_clipped_frac"] - 1 / 3) < 1e-6
    none = load_config(None, ["algo.off_policy=none"])
    assert off_policy_inputs(none, old, mask, behaviour(ro, mask, step=4))[0] is None


def test_wall_clock_metrics_carry_a_timing_prefix():
    """The exact-resume and multi-node tests compare every metric but the timings (``time/``, ``perf/``):
    the idle fractions, both loops', are wall-clock ratios and must carry such a prefix (CI once failed
    on ``async/trainer_idle_frac`` differing between a 1-node and a 2-node run)."""
    from megatron_rl.trainer.loop.async_source import sync_metrics
    from tests.helpers.cluster import TIMING

    got = sync_metrics(0.25, 1.0)
    assert got == {"time/gen_batch": 0.25, "perf/trainer_idle_frac": 0.25, "perf/engine_idle_frac": 0.75}
    assert all(k.startswith(TIMING) for k in got)


def test_a_grader_refusing_its_requests_in_the_producer_stops_the_step():
    """PAPO's grades are taken on the producer thread with max_staleness > 0: a JudgeRejected there reaches
    the loop as itself (one line, every rank), not as a wrapped RuntimeError."""
    from megatron_rl.rewards.judge_client import JudgeRejected
    from megatron_rl.trainer.loop.async_source import AsyncRollouts

    def collect(step):
        if step == 2:
            raise JudgeRejected("grader refused 5 consecutive requests: HTTP 400: max_tokens too large")
        return [step]

    src = AsyncRollouts(collect, is_driver=True, first_step=1, last_step=3, max_staleness=1, version=0)
    try:
        assert src.next(1)[0] == [1]
        src.pushed(1)
        with pytest.raises(JudgeRejected, match="HTTP 400: max_tokens too large"):
            src.next(2)
    finally:
        src.close()
