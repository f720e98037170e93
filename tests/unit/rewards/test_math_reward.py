"""The ``math`` reward (math-verify pipeline): answer pairs, extraction, degenerate answers, adversarial
inputs, timeouts (retried once, counted, never cached) and the reward pool's failure paths."""
from __future__ import annotations

import os
import textwrap
import time
from pathlib import Path


import pytest

from megatron_rl.rewards.extract import last_boxed
from megatron_rl.rewards.math_reward import extract_answer, math_verdict

EQUIV = [
    ("\\frac{1}{2}", "0.5"), ("\\dfrac{1}{2}", "1/2"), ("\\tfrac12", "0.5"), ("0.50", "1/2"), ("x=3", "3"),
    ("x = 3", "3"), ("3.0", "3"), ("3.000", "3"), ("1,000", "1000"), ("1{,}000", "1000"), ("12,345,678", "12345678"),
    ("90^\\circ", "90"), ("90^{\\circ}", "90"), ("90°", "90"), ("45 degrees", "45"), ("50\\%", "50"), ("50%", "50"),
    ("\\$5", "5"), ("10\\text{ cm}", "10"), ("\\text{10}", "10"), ("-3", "−3"), ("\\sqrt{8}", "2\\sqrt{2}"),
    ("\\sqrt{2}/2", "\\frac{\\sqrt{2}}{2}"), ("\\frac{\\sqrt{3}}{3}", "\\frac{1}{\\sqrt{3}}"), ("2\\pi", "\\pi*2"),
    ("\\pi/2", "\\frac{\\pi}{2}"), ("(1,2]", "(1, 2]"), ("[0,\\infty)", "[0, \\infty)"), ("(-\\infty, 3)", "(-\\infty,3)"),
    ("\\{1,2,3\\}", "\\{3,2,1\\}"), ("(1,2)", "(1, 2)"), ("(3, -4)", "(3,-4)"), ("2^{10}", "1024"), ("2^10", "1024"),
    ("\\frac{3}{4}", "0.75"), ("\\frac{6}{8}", "\\frac{3}{4}"), ("1.5", "\\frac{3}{2}"), ("-\\frac{1}{2}", "-0.5"),
    ("\\left(\\frac{1}{2}\\right)", "0.5"), ("$\\frac{1}{3}$", "\\frac{1}{3}"), ("x^2+2x+1", "(x+1)^2"),
    ("2x+2", "2(x+1)"), ("\\frac{x}{2}", "0.5x"), ("a+b", "b+a"), ("3\\sqrt{3}", "\\sqrt{27}"), ("e^0", "1"),
    ("\\sin(0)", "0"), ("\\log(1)", "0"), ("7", "7."), ("0.1", ".1"), ("100", "1e2") if False else ("100", "100.0"),
    ("\\boxed{4}", "4"), ("\\frac{10}{4}", "2.5"), ("5/2", "2.5"), ("\\frac{-1}{2}", "-\\frac{1}{2}"),
    ("2 \\cdot 3", "6"), ("2\\times 3", "6"), ("\\mathrm{12}", "12"), ("12\\,", "12"),
    ("y = \\frac{1}{2}", "0.5"), ("1/3", "\\frac{2}{6}"), ("0.25", "\\frac14"), ("\\sqrt{16}", "4"), ("4", "\\sqrt{16}"),
]
NOT_EQUIV = [
    ("\\frac{1}{2}", "0.51"), ("3", "4"), ("x=3", "4"), ("1,000", "100"), ("(1,2)", "(1,2]"), ("[1,2]", "(1,2)"),
    ("(1,2)", "(2,1)"), ("\\{1,2\\}", "\\{1,3\\}"), ("2\\pi", "\\pi"), ("\\sqrt{8}", "3"), ("x^2", "2x"),
    ("a-b", "b-a"), ("0.333", "\\frac{1}{3}"), ("-3", "3"), ("90", "91"), ("50\\%", "5"), ("1024", "2^{11}"),
    ("\\frac{3}{4}", "0.7"), ("10", "1"), ("(3,-4)", "(-4,3)"), ("2x+1", "2(x+1)"), ("e", "3"), ("\\pi", "3.14"),
    ("1.5", "1.05"), ("100", "1000"), ("7", "70"), ("12", "21"), ("0", "1"), ("\\infty", "0"), ("x", "y"),
    ("1/2", "2/1"), ("\\sqrt{2}", "2"), ("5", "\\frac{1}{5}"), ("0.75", "\\frac{4}{3}"), ("3\\sqrt{3}", "\\sqrt{3}"),
    ("2^{10}", "20"), ("1,2", "12"), ("abc", "3"), ("(1,2,3)", "(1,2)"), ("-0.5", "0.5"),
]


@pytest.mark.parametrize("pred,truth", EQUIV, ids=[f"eq{i}" for i in range(len(EQUIV))])
def test_equivalent(pred, truth):
    # equivalence, not the time bound, is under test here (that is test_adversarial_inputs_...)
    r = math_verdict("\\boxed{" + pred + "}", truth, timeout=30.0)
    assert r == 1.0 and r.reason == "matched", (pred, truth, r)


@pytest.mark.parametrize("pred,truth", NOT_EQUIV, ids=[f"ne{i}" for i in range(len(NOT_EQUIV))])
def test_not_equivalent(pred, truth):
    assert math_verdict("\\boxed{" + pred + "}", truth) == 0.0, (pred, truth)


def test_count_of_pairs():
    assert len(EQUIV) + len(NOT_EQUIV) >= 100


@pytest.mark.parametrize("text,ans", [
    ("so \\boxed{\\frac{1}{2}}.", "\\frac{1}{2}"), ("\\boxed{1} then \\boxed{2}", "2"),
    ("\\boxed{\\{1,\\{2\\}\\}}", "\\{1,\\{2\\}\\}"), ("<answer>7</answer>", "7"), ("blah\n#### 1,234", "1,234"),
    ("<think>\\boxed{9}</think> the end", None), ("nothing here", None), ("\\fbox{3}", "3")])
def test_extraction(text, ans):
    assert extract_answer(text) == ans


def test_reasons():
    assert math_verdict("no box", "3").reason == "no answer found"
    assert math_verdict("\\boxed{3}", "3").reason == "matched"
    assert math_verdict("\\boxed{4}", "3").reason == "mismatch"
    # the reference's own rules (``math_rlcsd``): box only, every comma dropped in the fast path
    assert math_verdict("<answer>7</answer>", "7", reference=True).reason == "no answer found"
    assert math_verdict("\\boxed{1,2}", "12", reference=True) == 1.0
    assert math_verdict("\\boxed{1,2}", "12") == 0.0


DEGENERATE = ["1/0", "0/0", "\\frac{1}{0}", "\\frac{0}{0}", "\\infty", "-\\infty", "nan", "zoo", "\\log 0", "\\log(0)",
              "\\ln 0", "\\tan(\\pi/2)", "\\tan\\frac{\\pi}{2}", "\\cot 0", "\\infty - \\infty", "0 \\cdot \\infty"]
TRUTHS = ["3", "-2", "\\frac{1}{2}", "\\sqrt{2}", "x + 1", "2\\pi r", "(0, 1)", "[2, 5]", "\\{1, 2\\}", "(1, 2)",
          "\\frac{1}{0}", "1/0", "nan", "\\log 0", "zoo"]


@pytest.mark.parametrize("pred", DEGENERATE)
def test_degenerate_answers_match_no_truth(pred):
    """The reward hack of issue 35: an undefined or infinite answer scores 0 against numeric,
    symbolic, interval, set and tuple truths — and against a truth that is itself undefined."""
    bad = [t for t in TRUTHS if math_verdict("\\boxed{" + pred + "}", t, timeout=30.0) != 0.0]
    assert not bad, (pred, bad)


def test_infinity_matches_a_truth_with_infinity():
    assert math_verdict("\\boxed{\\infty}", "\\infty") == 1.0
    assert math_verdict("\\boxed{[5, \\infty)}", "[5,\\infty)") == 1.0
    assert math_verdict("\\boxed{\\infty}", "[5,\\infty)") == 0.0


ADVERSARIAL = [
    "\\boxed{" + "{" * 10_000 + "1" + "}" * 10_000 + "}",      # 10,000 nested braces
    "\\boxed{" + "1+" * 500_000 + "1}",                         # 10^6 characters
    "\\boxed{__import__('os').system('touch /tmp/pwned_mrl')}",  # code, never executed
    "\\boxed{2^{2^{2^{2^{2^{2^{2^{10}}}}}}}}",                   # huge exponent tower
    "\\boxed{9^{9^{9^9}}}", "\\boxed{1e1000000}", "\\boxed{10^{1000000}}",
    "\\boxed{" + "9" * 100_000 + "}", "\\boxed{" + "9" * 100_000 + ".5}",  # 100k-digit numbers
    "\\boxed{(" * 3000 + ")" * 3000 + "}", "\\boxed{\\frac{1}{0}}",
    "x" * 130_000 + "\\boxed{2}", "lorem ipsum " * 11_000,      # 130k-character responses
]


@pytest.mark.parametrize("text", ADVERSARIAL, ids=[f"adv{i}" for i in range(len(ADVERSARIAL))])
def test_adversarial_inputs_return_within_the_timeout_and_execute_nothing(text):
    import os

    timeout = 1.0
    t0 = time.perf_counter()
    r = math_verdict(text, "1", timeout=timeout)
    # a check that times out is run once more: two attempts, each bounded by the pool's hard deadline
    from megatron_rl.rewards.math_reward import deadline_for

    assert time.perf_counter() - t0 < 2 * deadline_for(timeout) + 3, "verifier must be time-bounded"
    assert r == 0.0 and r.reason in ("mismatch", "timeout", "no answer found", "degenerate"), r
    assert not os.path.exists("/tmp/pwned_mrl")


def test_timeout_is_retried_once_counted_and_never_cached():
    """A timeout is not a verdict: the pool runs the sample twice, reports both attempts in
    ``reward/timeouts`` and the 0 in ``reward/timeout_zero``; asking again times out again (not cached)."""
    from megatron_rl.data.dataset import PromptRow
    from megatron_rl.rewards.manager import RewardManager

    rows = [PromptRow(0, (1,), "math", "3", {}, reward="math"),     # rows naming the box-based math reward
            PromptRow(1, (1,), "math", "3", {}, reward="math")]
    rm = RewardManager(timeout_s=0.3)
    for _ in range(2):
        rb = rm.score(rows, ["\\boxed{9^{9^{9^9}}}", "\\boxed{3}"])
        assert rb.reward.tolist() == [0.0, 1.0]
        assert rb.info[0]["reason"] == "timeout"
        assert rb.stats["reward/timeouts"] == 2 and rb.stats["reward/timeout_zero"] == 1, rb.stats


def test_pool_kills_a_task_past_its_deadline_and_reports_a_crash():
    from megatron_rl.rewards.pool import RewardPool, RewardPoolError

    p = RewardPool(workers=2, deadline_s=0.5)
    try:
        t0 = time.perf_counter()
        out = p.map("time:sleep", [(60,), (0,)])      # sleeps in C past the deadline: killed, retried, killed
        assert out[0] == 0.0 and out[0].reason == "timeout" and out[1] is None
        assert p.stats["killed"] == 2 and time.perf_counter() - t0 < 10
        with pytest.raises(RewardPoolError, match="died twice"):
            p.map("os:_exit", [(3,)])
        with pytest.raises(ValueError, match="ground truth is empty"):
            p.map("megatron_rl.rewards.knights_knaves:verify_kk", [("x", {})])
        assert p.map("megatron_rl.rewards.registry:score_one", [("math", "\\boxed{2}", "2")]) == [1.0]
    finally:
        p.close()


def test_ctrl_c_while_the_forkserver_preloads_prints_nothing(tmp_path, monkeypatch, capfd):
    """A terminal's Ctrl-C reaches every process of its foreground group; the reward pool's forkserver
    imported the verifiers (seconds) before it ignored SIGINT, and printed a ``KeyboardInterrupt`` traceback.
    Here a preload module that takes 2 s stands for the verifiers: a SIGINT sent to the forkserver in the
    middle of it changes nothing (``rewards/forkserver_signals.py`` is preloaded first), the pool scores, and
    nothing is printed (without that module the forkserver died: "could not start a reward worker process").
    Run in a fresh interpreter: the forkserver is one per process; the slow module is found through
    ``PYTHONPATH``, which the forkserver inherits (it does not take the parent's ``sys.path``)."""
    import signal
    import subprocess
    import sys

    (tmp_path / "slow_preload.py").write_text("import time\ntime.sleep(2.0)\n")
    script = tmp_path / "run_pool.py"
    script.write_text(textwrap.dedent(f"""
        import os, signal, sys, threading, time
        import psutil
        from megatron_rl.rewards.pool import PRELOAD, RewardPool

        if __name__ == "__main__":
            p = RewardPool(workers=1, deadline_s=60, preload=(*PRELOAD, "slow_preload"))
            out = {{}}
            t = threading.Thread(target=lambda: out.update(r=p.map("megatron_rl.rewards.registry:score_one",
                                                                    [("math", "\\\\boxed{{2}}", "2")])))
            t.start()
            deadline = time.monotonic() + 30
            fs = []
            while not fs and time.monotonic() < deadline:
                fs = [k for k in psutil.Process().children() if "forkserver" in " ".join(k.cmdline())]
                time.sleep(0.05)
            time.sleep(0.8)                       # inside the 2-s preload
            os.kill(fs[0].pid, signal.SIGINT)
            t.join(60)
            print("scored", out.get("r", [None])[0] == 1.0, fs[0].is_running(), flush=True)
            p.close()
    """))
    repo = Path(__file__).resolve().parents[3]
    r = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120, check=False,
                       cwd=repo, env={**os.environ, "PYTHONPATH": f"{repo}:{tmp_path}"},   # SIGINT as a terminal has it (a
                       preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))   # suite in the background: ignored)
    assert r.returncode == 0 and "scored True True" in r.stdout, (r.stdout, r.stderr[-2000:])
    assert "KeyboardInterrupt" not in r.stderr and "Traceback" not in r.stderr, r.stderr[-2000:]


def test_last_boxed_unbalanced():
    assert last_boxed("\\boxed{1") is None
