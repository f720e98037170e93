"""The mismatch guard's decision (``trainer/loop/guard.py``) and the graceful-stop status it exits with;
the stop itself on a real run is ``tests/e2e/test_chat_methods.py::test_mismatch_guard_stops_the_run``."""
from __future__ import annotations

from megatron_rl.config import load_config
from megatron_rl.trainer.loop import guard
from megatron_rl.trainer.loop.stop import GUARD_EXIT, Stopped
from tests.helpers.dist import free_port


def test_guard_reads_the_fresh_samples_and_the_limit():
    sync = load_config(None, ["rollout.mismatch_limit=1.01"])
    assert guard.guard_metric(sync) == "rollout/token_mult_prob_error"
    assert guard.over_limit(sync, {"rollout/token_mult_prob_error": 1.02}) == 1.02
    assert guard.over_limit(sync, {"rollout/token_mult_prob_error": 1.01}) is None      # at the limit: within
    assert guard.over_limit(sync, {}) is None                                            # not measured
    assert str(guard.over_limit(sync, {"rollout/token_mult_prob_error": float("nan")})) == "nan"   # a NaN trips it
    off = load_config(None, ["rollout.mismatch_limit=0"])
    assert guard.over_limit(off, {"rollout/token_mult_prob_error": 9.0}) is None
    # asynchronous: a stale batch's error holds the policy's own change, only the fresh part is judged
    asy = load_config(None, ["rollout.mismatch_limit=1.01", "rollout.max_staleness=1"])
    assert guard.over_limit(asy, {"rollout/token_mult_prob_error": 1.5, "rollout/token_mult_prob_error_stale": 1.5}) is None
    assert guard.over_limit(asy, {"rollout/token_mult_prob_error_fresh": 1.5}) == 1.5
    assert guard.message(asy, 1.5) == ("rollout/token_mult_prob_error_fresh = 1.5 exceeds "
                                       "rollout.mismatch_limit = 1.01")
    assert guard.agreed(1.5) == 1.5 and guard.agreed(None) is None   # no process group: the local value


def test_guard_stop_exit_status():
    e = Stopped(0, "why")
    assert e.code == GUARD_EXIT == 3 and e.reason == "why" and e.signum == 0
    assert Stopped(15).code == 143


def _agree_worker(rank: int, port: int, out) -> None:
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    try:   # only rank 0's metrics decide: rank 1 saw nothing over the limit, rank 0 did
        out.put((rank, guard.agreed(1.5 if rank == 0 else None)))
    finally:
        dist.destroy_process_group()


def test_every_rank_takes_rank_zeros_decision():
    """Two gloo ranks: the guard's value is rank 0's on both, so all ranks stop at the same boundary."""
    import torch.multiprocessing as mp

    port = free_port()
    ctx = mp.get_context("fork")   # the children inherit the imported torch (a spawn re-imports it: ~20 s here)
    q = ctx.Queue()
    procs = [ctx.Process(target=_agree_worker, args=(r, port, q)) for r in range(2)]
    for p in procs:
        p.start()
    got = dict(q.get(timeout=120) for _ in procs)
    for p in procs:
        p.join(timeout=60)
    assert got == {0: 1.5, 1: 1.5} and all(p.exitcode == 0 for p in procs)
