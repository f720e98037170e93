"""Rubric grader against a REAL local OpenAI-compatible HTTP server (127.0.0.1) that can be slow,
fail with 500s, return malformed JSON or unparsable scores."""
from __future__ import annotations

import pytest

from megatron_rl.rewards.breaker import CircuitBreaker
from megatron_rl.rewards.grader import RubricGrader, parse_score
from tests.helpers.fake_openai_server import control, start_server


@pytest.fixture(scope="module")
def server():
    proc, url = start_server(lifetime=120)
    yield url
    proc.kill()
    proc.wait()


@pytest.mark.parametrize("text,score", [("... \\boxed{1}", 1.0), ("\\boxed{0.5}", 0.5), ("<think>\\boxed{1}</think> \\boxed{0}", 0.0),
                                        ("\\boxed{0.7}", None), ("Score: 0.5", 0.5), ("the score is 1", 1.0),
                                        ("no idea", None), ("\\fbox{1}", 1.0)])
def test_parse_score(text, score):
    assert parse_score(text) == score


def _items(n, tag="a"):
    return [(f"problem {tag}{i}", "reference", f"solution {i}") for i in range(n)]


def test_ok_and_cache(server):
    control(server, mode="ok", score="0.5")
    g = RubricGrader(server, "judge", concurrency=4, timeout=5, retries=1, backoff=0.01)
    assert g.grade_batch(_items(6)) == [0.5] * 6
    assert g.grade_batch(_items(6)) == [0.5] * 6
    st = g.stats()
    assert st["grader/calls"] == 6 and st["grader/cache_hits"] == 6 and st["grader/fallbacks"] == 0


def test_timeouts_fall_back_and_are_counted(server):
    control(server, mode="slow", delay=2.0)
    g = RubricGrader(server, "judge", concurrency=8, timeout=0.2, retries=1, backoff=0.01, fallback=1.0)
    assert g.grade_batch(_items(4, "t")) == [1.0] * 4
    st = g.stats()
    assert st["grader/timeouts"] == 8 and st["grader/fallbacks"] == 4 and st["grader/retries"] == 4


def test_500_then_recovery(server):
    control(server, mode="error500")
    g = RubricGrader(server, "judge", timeout=2, retries=2, backoff=0.01, fallback=0.0)
    g.breaker = CircuitBreaker(failures=100)   # this test is about retries/caching; the breaker: test_grader_breaker.py
    assert g.grade_batch(_items(2, "e")) == [0.0, 0.0]
    assert g.stats()["grader/http_errors"] == 6 and g.stats()["grader/fallbacks"] == 2
    control(server, mode="ok", score="1")
    assert g.grade_batch(_items(2, "e")) == [1.0, 1.0]  # failures were not cached


def test_malformed_and_unparsable(server):
    control(server, mode="malformed")
    g = RubricGrader(server, "judge", timeout=2, retries=0, backoff=0.01)
    assert g.grade_batch(_items(1, "m")) == [0.0] and g.stats()["grader/malformed"] == 1
    control(server, mode="unparsable")
    g.unparsable_policy = "warn"   # one unreadable step: warned and counted (stop: test_grader_breaker.py)
    assert g.grade_batch(_items(1, "u")) == [0.0] and g.stats()["grader/unparsable"] == 1
    assert g.stats()["grader/unreadable_batches"] == 1


def test_empty_solution_or_reference_needs_no_call(server):
    g = RubricGrader(server, "judge")
    assert g.grade_batch([("p", "", "sol"), ("p", "ref", "  ")]) == [0.0, 0.0]
    assert g.stats()["grader/calls"] == 0


def test_server_down_counts_fallback():
    g = RubricGrader("http://127.0.0.1:9/v1", "judge", timeout=0.5, retries=1, backoff=0.01, fallback=0.5)
    assert g.grade_batch(_items(2, "d")) == [0.5, 0.5] and g.stats()["grader/fallbacks"] == 2
