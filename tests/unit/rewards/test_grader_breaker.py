"""Grader outage: the circuit breaker skips a dead grader at once (issue 10), against REAL local
endpoints: a closed port on 127.0.0.1 (connection refused) and the fake OpenAI server (500s, then ok)."""
from __future__ import annotations

import logging
import socket
import time

import pytest

from megatron_rl.rewards.breaker import CircuitBreaker
from megatron_rl.rewards.grader import RubricGrader
from tests.helpers.fake_openai_server import control, start_server


def _items(n, tag):
    return [(f"problem {tag} {i}", "reference", f"solution {i}") for i in range(n)]


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_refused_connections_open_the_breaker_and_skip_the_retries(caplog):
    url = f"http://127.0.0.1:{_closed_port()}/v1"
    slow = RubricGrader(url, "judge", concurrency=2, timeout=1, retries=3, backoff=0.2, fallback=0.0)
    slow.breaker = CircuitBreaker(failures=10 ** 6, cooldown=60)      # effectively no breaker: the old cost
    t0 = time.perf_counter()
    assert slow.grade_batch(_items(8, "a")) == [0.0] * 8
    t_without = time.perf_counter() - t0
    g = RubricGrader(url, "judge", concurrency=2, timeout=1, retries=3, backoff=0.2, fallback=0.5)
    g.breaker = CircuitBreaker(failures=3, cooldown=60)
    with caplog.at_level(logging.WARNING, logger="megatron_rl.grader"):
        t0 = time.perf_counter()
        assert g.grade_batch(_items(8, "b")) == [0.5] * 8
        t_with = time.perf_counter() - t0
    s = g.stats()
    assert s["grader/breaker_opens"] == 1 and s["grader/fallbacks"] == 8
    assert s["grader/calls"] <= 4 and s["grader/breaker_skips"] >= 6       # 32 attempts without the breaker
    assert t_with < t_without / 3, (t_with, t_without)
    msgs = [r.getMessage() for r in caplog.records]
    assert any("3 consecutive failed requests" in m and "skipping it for 60 s" in m for m in msgs), msgs
    assert any("8 of 8 grades used the fallback score 0.5" in m for m in msgs), msgs


@pytest.fixture(scope="module")
def server():
    proc, url = start_server(lifetime=60)
    yield url
    proc.kill()
    proc.wait()


def test_half_open_probe_closes_the_breaker_when_the_grader_is_back(server):
    now = [0.0]
    g = RubricGrader(server, "judge", concurrency=1, timeout=5, retries=0, backoff=0.01, fallback=0.0)
    g.breaker = CircuitBreaker(failures=2, cooldown=30, clock=lambda: now[0])
    control(server, mode="error500")
    assert g.grade_batch(_items(4, "c")) == [0.0] * 4
    assert g.breaker.state == "open" and g.stats()["grader/calls"] == 2        # 2 failures, then skipped
    control(server, mode="ok", score="1")
    assert g.grade_batch(_items(2, "d")) == [0.0, 0.0]                          # still cooling down: no call
    assert g.stats()["grader/calls"] == 2
    now[0] = 31.0                                                                # cooldown over: half-open
    assert g.grade_batch(_items(2, "e")) == [1.0, 1.0]
    assert g.breaker.state == "closed" and g.stats()["grader/calls"] == 4


def test_garbage_replies_open_the_breaker_and_a_step_ends_within_its_limits(server):
    """Issue 31 ("Stuck"): a grader answering HTTP 200 with a body that is not a chat completion. Before,
    each grade paid its retries (3, backoff 1+2+4 s) and the breaker never opened: 64 grades took 57.9 s.
    Now a garbage reply is a breaker failure: the requests in flight when it opens (concurrency) pay
    at most their first backoff, every later grade is skipped at once."""
    control(server, mode="malformed")
    g = RubricGrader(server, "judge")                  # the config defaults: concurrency 8, retries 3, backoff 1 s
    g.breaker = CircuitBreaker(5, 60.0)               # reward.grader_breaker_failures / _cooldown defaults
    t0 = time.perf_counter()
    assert g.grade_batch(_items(64, "garbage")) == [0.0] * 64
    dt = time.perf_counter() - t0
    s = g.stats()
    assert s["grader/breaker_opens"] == 1 and s["grader/fallbacks"] == 64 and s["grader/malformed"] <= 8
    assert s["grader/calls"] <= 8 and s["grader/breaker_skips"] >= 56
    assert dt < 3 * g.backoff + 2.0, dt                # one backoff of the in-flight requests, not 64 x (1+2+4) s / 8


def test_the_start_up_probe_refuses_a_grader_answering_garbage(server, tmp_path):
    from megatron_rl.config import load_config
    from megatron_rl.trainer.loop.preflight import check_grader

    control(server, mode="malformed")
    cfg = load_config(None, ["algo.kind=papo", f"reward.grader_url={server}", "reward.grader_timeout=5",
                             f"data.train={tmp_path / 'none.parquet'}"])
    with pytest.raises(ValueError, match=r"a rubric request to model 'judge' failed at start-up: HTTP 200 but not a chat "
                                         r"completion: '\{not json'"):
        check_grader(cfg)


def test_refused_requests_stop_every_rank_at_the_step(server):
    """A 4xx on every request (here vLLM's max_tokens refusal): not retried, the server's text logged, and
    when the breaker opens on them the pending grades end in JudgeRejected (the loop stops there)."""
    from megatron_rl.rewards.judge_client import JudgeRejected
    from megatron_rl.trainer.paths.process_reward import PendingGrades

    control(server, mode="error400")
    g = RubricGrader(server, "judge", concurrency=2, retries=3, backoff=0.01)
    g.breaker = CircuitBreaker(3, 60.0)
    pending = PendingGrades()
    try:
        pending.idx = list(range(6))       # what PendingGrades.start submits for 6 correct responses
        pending.future = pending.pool.submit(g.grade_batch, [(f"q{i}", "s", f"answer {i}") for i in range(6)])
        with pytest.raises(JudgeRejected, match=r"HTTP 400: max_tokens=16384 cannot be greater than max_model_len=8192"):
            pending.finish(_Sized(6), is_driver=True)
    finally:
        pending.close()
    s = g.stats()
    assert s["grader/retries"] == 0 and 3 <= s["grader/client_errors"] <= 4 and s["grader/breaker_opens"] == 1


class _Sized:
    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n
