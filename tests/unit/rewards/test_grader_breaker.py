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
