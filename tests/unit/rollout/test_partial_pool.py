"""Per-token staleness and the two policies of partial rollouts (``algorithms/staleness.py``, the rule the pool of ``rollout/partial_pool.py`` and the update share), from their
definitions: s_t = V − v_t; drop keeps a response only if max_t s_t <= k; mask keeps the tokens with
s_t <= k (the old-version prefix goes), a response with none left is dropped."""
from __future__ import annotations

import pytest
import torch

from megatron_rl.algorithms.staleness import StalenessPolicy, staleness, staleness_mask

V = torch.tensor


@pytest.mark.parametrize("versions,trainer,want", [
    ([3, 3, 3], 3, [0, 0, 0]),                 # sampled by the trainer's own weights
    ([1, 1, 2, 3], 3, [2, 2, 1, 0]),           # spans two pushes
    ([], 5, []),                                # empty response
], ids=["fresh", "spans-two-pushes", "empty"])
def test_token_staleness(versions, trainer, want):
    assert staleness(trainer, V(versions, dtype=torch.int64)).tolist() == want


def test_a_token_newer_than_the_trainer_is_an_error():
    with pytest.raises(ValueError, match="ahead of the trainer"):
        staleness(3, V([2, 4]))


@pytest.mark.parametrize("versions,k,mode,want", [
    ([1, 1, 2, 3], 2, "drop", [True] * 4),      # max s = 2 <= 2
    ([1, 1, 2, 3], 1, "drop", None),            # max s = 2 > 1: the response goes
    ([1, 1, 2, 3], 1, "mask", [False, False, True, True]),   # the version-1 prefix is masked
    ([1, 1, 2, 3], 0, "mask", [False, False, False, True]),
    ([0, 0], 1, "mask", None),                  # nothing left
    ([0, 0], 3, "drop", [True, True]),
], ids=["drop-keeps", "drop-rejects", "mask-prefix", "mask-bound-0", "mask-all-stale", "drop-within"])
def test_policies(versions, k, mode, want):
    got = staleness_mask(V(versions, dtype=torch.int64), 3, StalenessPolicy(k, mode))
    assert (got if got is None else got.tolist()) == want


def test_bad_policies_fail_in_one_line():
    with pytest.raises(ValueError, match="bound must be >= 0"):
        StalenessPolicy(-1)
    with pytest.raises(ValueError, match="drop|mask"):
        StalenessPolicy(1, "clip")


def test_rollouts_carry_each_tokens_version_through_select_and_concat():
    """``Completion.versions`` -> ``Rollouts.token_versions`` (int32, aligned with the response tokens),
    kept by select / concat like the other per-token fields; a pool mixing labelled and unlabelled
    completions is refused."""
    from megatron_rl.rollout.engine import Completion
    from megatron_rl.rollout.rollouts import concat, from_completions

    comps = [Completion(0, 0, (1, 5), (7, 8, 9), (-0.1, -0.2, -0.3), "stop", (3, 3, 4)),
             Completion(0, 1, (1, 5), (6,), (-0.5,), "length", (4,)),
             Completion(1, 0, (1, 6), (9, 9), (-0.7, -0.8), "stop", (2, 4))]
    ro = from_completions(["a", "b"], comps, None)
    assert ro.token_versions.dtype == torch.int32 and ro.token_versions.tolist() == [3, 3, 4, 4, 2, 4]
    sub = ro.select([2, 0])
    assert sub.token_versions.tolist() == [2, 4, 3, 3, 4] and sub.responses == [[9, 9], [7, 8, 9]]
    assert concat([ro, sub]).token_versions.tolist() == [3, 3, 4, 4, 2, 4, 2, 4, 3, 3, 4]
    assert from_completions(["a"], [Completion(0, 0, (1,), (2,), (-1.0,), "stop")], None).token_versions is None
    with pytest.raises(RuntimeError, match="per-token weight versions and others not"):
        from_completions(["a", "b"], comps[:1] + [Completion(1, 0, (1,), (2,), (-1.0,), "stop")], None)


def test_the_engines_generating_clock_stops_while_nothing_runs_or_a_push_pauses():
    """``AsyncVLLMEngine``'s clock behind ``perf/engine_idle_frac`` (its ``_mark`` state changes, driven here
    in the order its loop thread makes them): time counts only while a request is in flight AND generation
    is not paused for a push; two overlapping requests count once. Oracle: the wall clock read around each
    state change bounds the generating time from below and above."""
    import time

    from megatron_rl.rollout.vllm_async_engine import AsyncVLLMEngine

    e = object.__new__(AsyncVLLMEngine)   # the clock's state only: no vLLM engine behind it
    e._active, e._paused, e._busy_s, e._t_mark = 0, False, 0.0, time.perf_counter()
    marks = []

    def change(fn, *a, **kw):
        t0 = time.perf_counter()
        fn(*a, **kw)
        marks.append((t0, time.perf_counter()))
        time.sleep(0.02)

    change(lambda: None)               # idle: nothing in flight
    change(e._begin)                   # 1: a request starts
    change(e._begin)                   # 2: a second one overlaps it
    change(e._mark, paused=True)       # 3: a push pauses both
    change(e._mark, paused=False)      # 4: resumed
    change(e._end)                     # 5
    change(e._end)                     # 6: nothing in flight
    e._mark()
    (_, _), (a0, a1), _, (b0, b1), (c0, c1), _, (d0, d1) = marks
    lo, hi = (b0 - a1) + (d0 - c1), (b1 - a0) + (d1 - c0)   # generating: marks 1..3 and 4..6
    assert lo <= e._busy_s <= hi and e._active == 0, (lo, e._busy_s, hi)
    assert e._busy_s < (d0 - a1) - (c0 - b1) + 1e-3 < d0 - a1   # the pause (>= 20 ms) is left out
