"""Grader outage: the circuit breaker skips a dead grader at once (issue 10), against REAL local
endpoints: a closed port on 127.0.0.1 (connection refused) and the fake OpenAI server (500s, then ok)."""
from __future__ import annotations

import logging
import time

import pytest

from megatron_rl.rewards.breaker import CircuitBreaker
from megatron_rl.rewards.grader import RubricGrader
from tests.helpers.dist import free_port
from tests.helpers.fake_openai_server import control, start_server


def _items(n, tag):
    return [(f"problem {tag} {i}", "reference", f"solution {i}") for i in range(n)]


def test_refused_connections_open_the_breaker_and_skip_the_retries(caplog):
    url = f"http://127.0.0.1:{free_port()}/v1"
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
    from megatron_rl.trainer.loop.preflight_judge import check_grader

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


# ---------------------------------------------------------------- a judge that cannot be read (issue 40)

@pytest.mark.parametrize("outcome", [False, True], ids=["rubric", "outcome"])
def test_the_start_up_probe_refuses_a_judge_whose_reply_has_no_verdict(server, tmp_path, outcome):
    """A well-formed reply with no score the parser reads ("I cannot decide.") is refused at start-up in one line
    quoting the reply's start, for the rubric grader and for papo_math's outcome verifier."""
    from megatron_rl.config import load_config
    from megatron_rl.trainer.loop.preflight_judge import check_grader

    control(server, mode="unparsable")
    over = ["algo.kind=grpo", "reward.default=papo_math"] if outcome else ["algo.kind=papo", "reward.outcome_verifier=false"]
    cfg = load_config(None, [*over, f"reward.grader_url={server}", "reward.grader_timeout=5",
                             f"data.train={tmp_path / 'none.parquet'}"])
    what = "outcome" if outcome else "rubric"
    with pytest.raises(ValueError, match=rf"the {what} judge 'judge' answered the start-up request with no verdict its "
                                         r"parser reads .*its reply begins 'I cannot decide\.'") as e:
        check_grader(cfg)
    assert "\n" not in str(e.value)
    control(server, mode="ok")
    check_grader(cfg)   # a judge that answers in its format passes


@pytest.mark.parametrize("policy", ["stop", "warn"])
def test_a_step_of_mostly_unparsable_replies_is_a_counted_breaker_failure(server, policy, caplog):
    """Every reply unparsable (the small-model judge of issue 40): not PAPO silently training as GRPO -- the
    batch is counted (``grader/unreadable_batches``), is a breaker failure, and the policy stops or warns."""
    from megatron_rl.rewards.judge_client import JudgeUnreadable
    from megatron_rl.rewards.outcome_judge import OutcomeVerifier

    control(server, mode="unparsable")
    for judge, run in ((RubricGrader(server, "judge", timeout=5, retries=0), lambda j: j.grade_batch(_items(6, policy))),
                       (OutcomeVerifier(server, "judge", timeout=5, retries=0),
                        lambda j: j.verify_batch([(f"q {policy} {i}", "\\boxed{3}", "4") for i in range(6)]))):
        judge.breaker = CircuitBreaker(failures=5, cooldown=60, name=judge.name)
        judge.unparsable_policy = policy
        with caplog.at_level(logging.WARNING, logger="megatron_rl.grader"):
            if policy == "stop":
                with pytest.raises(JudgeUnreadable, match=r"6 of 6 replies of this step had no verdict its parser reads"):
                    run(judge)
            else:
                run(judge)
                assert any("6 of 6 replies" in r.getMessage() and "policy=warn" in r.getMessage() for r in caplog.records)
        st = judge.stats()
        assert st[f"{judge.name}/unreadable_batches"] == 1.0 and st[f"{judge.name}/unparsable"] == 6.0
        assert judge.breaker.consecutive == 1    # one breaker failure for the step
    control(server, mode="ok")
