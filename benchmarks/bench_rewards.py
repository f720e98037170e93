"""The ``math`` reward serially vs on the reward pool, 4,096 responses in the same run.

Responses are 1–8k characters of reasoning prose ending in a boxed answer, a third each right (an
equivalent form of the truth), wrong, and adversarial (10,000 nested braces, 100k-digit numbers,
``1e1000000``, 130k-character responses, answers with no box, and a few ``9^{9^{9^9}}`` towers that
run into the timeout). Every (answer, truth) pair is distinct, so no verdict cache helps either side.
Serial = one reward worker (``RewardPool(workers=1)``: the same guard, one check at a time); pool =
one worker per CPU the process may use (``os.sched_getaffinity``), as training scores them. Prints
wall times, the speed-up and the per-response latency (median / p99 / max, measured in the worker).

Run: ``python benchmarks/bench_rewards.py [--n 4096] [--timeout 5] [--quick]``.
"""
from __future__ import annotations

import argparse
import random
import statistics
import time

FILL = ("We consider the constraint, expand the product, and collect like terms; then we check the boundary "
        "cases one by one against the original equation. ")


def _pair(rng: random.Random, k: int) -> tuple[str, str, str]:
    """(truth, a right answer, a wrong answer), distinct for every k."""
    a, b = k + 2, k + 3 + rng.randrange(5)
    kind = k % 6
    if kind == 0:
        return f"\\frac{{{a}}}{{{b}}}", f"\\dfrac{{{2 * a}}}{{{2 * b}}}", f"\\frac{{{b}}}{{{a}}}"
    if kind == 1:
        return f"{a}\\sqrt{{2}}", f"\\sqrt{{{2 * a * a}}}", f"{a}\\sqrt{{3}}"
    if kind == 2:
        return f"({a}, {b}]", f"\\left({a},{b}\\right]", f"[{a}, {b}]"
    if kind == 3:
        return f"{a}x^2 + {b}x", f"x({a}x+{b})", f"{a}x^2 - {b}x"
    if kind == 4:
        return f"\\begin{{pmatrix}}{a}\\\\{b}\\end{{pmatrix}}", f"\\begin{{bmatrix}}{a}\\\\{b}\\end{{bmatrix}}", \
            f"\\begin{{pmatrix}}{b}\\\\{a}\\end{{pmatrix}}"
    return f"{a * 1000 + b}", f"{a},{b:03d}", f"{a * 1000 + b + 1}"


def _adversarial(rng: random.Random, k: int, slow: bool) -> str:
    if slow:
        return f"\\boxed{{9^{{9^{{9^{{{9 + k}}}}}}}}}"
    kind = (k // 3) % 6
    if kind == 0:
        return "\\boxed{" + "{" * 10_000 + str(k) + "}" * 10_000 + "}"
    if kind == 1:
        return "\\boxed{" + str(k) + "9" * 100_000 + "}"
    if kind == 2:
        return f"\\boxed{{1e{1_000_000 + k}}}"
    if kind == 3:
        return "x" * 130_000 + f"\\boxed{{{k}}}"
    if kind == 4:
        return FILL * 20 + f"so the answer is {k}."          # no box
    return "\\boxed{" + "1+" * 20_000 + str(k) + "}"


def make(n: int, seed: int = 0, slow: int = 4) -> list[tuple[str, str, str]]:
    """``n`` (kind, response, truth) with 1–8k characters of prose before each answer."""
    rng = random.Random(seed)
    out = []
    for k in range(n):
        truth, right, wrong = _pair(rng, k)
        prose = (FILL * 70)[: rng.randint(1000, 8000)]
        kind = ("right", "wrong", "adversarial")[k % 3]
        if kind == "adversarial":
            resp = prose + _adversarial(rng, k, slow=(k // 3) < slow)
        else:
            resp = prose + f" Therefore the answer is $\\boxed{{{right if kind == 'right' else wrong}}}$."
        out.append((kind, resp, truth))
    return out


def run(pool, cases, timeout: float) -> tuple[float, list]:
    t0 = time.perf_counter()
    res = pool.map("megatron_rl.rewards.registry:score_timed", [("math", r, t, timeout) for _, r, t in cases])
    return time.perf_counter() - t0, res


def _stats(lat: list[float]) -> str:
    s = sorted(lat)
    p99 = s[min(len(s) - 1, int(0.99 * len(s)))]
    return f"median {statistics.median(s) * 1e3:.1f} ms, p99 {p99 * 1e3:.0f} ms, max {s[-1]:.2f} s"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, default=4096)
    ap.add_argument("--timeout", type=float, default=5.0, help="math-verify budget per answer (reference: 5 s)")
    ap.add_argument("--slow", type=int, default=4, help="adversarial answers that run into the timeout")
    ap.add_argument("--quick", action="store_true", help="256 responses, 1 slow one, 2 s timeout (smoke test)")
    a = ap.parse_args()
    if a.quick:
        a.n, a.slow, a.timeout = 256, 1, 2.0

    from megatron_rl.rewards.math_reward import deadline_for
    from megatron_rl.rewards.pool import RewardPool, cpu_count

    cases = make(a.n, slow=a.slow)
    chars = [len(r) for _, r, _ in cases]
    print(f"{a.n} responses ({sum(k == 'right' for k, _, _ in cases)} right, {sum(k == 'wrong' for k, _, _ in cases)} "
          f"wrong, {sum(k == 'adversarial' for k, _, _ in cases)} adversarial), {min(chars)}-{max(chars)} chars, "
          f"timeout {a.timeout:g} s; CPUs available: {cpu_count()}")
    results = {}
    for label, workers in (("serial", 1), ("pool", 0)):
        pool = RewardPool(workers=workers, deadline_s=deadline_for(a.timeout))
        pool.map("megatron_rl.rewards.registry:score_one", [("math", "\\boxed{1}", "1")] * pool.size)  # start the workers
        wall, res = run(pool, cases, a.timeout)
        pool.close()
        lat = [r[1] if isinstance(r, tuple) else deadline_for(a.timeout) for r in res]   # a killed task: its deadline
        vals = [float(r[0]) if isinstance(r, tuple) else float(r) for r in res]
        results[label] = (wall, vals)
        right = sum(v == 1.0 for (k, _, _), v in zip(cases, vals) if k == "right")
        bad = sum(v != 0.0 for (k, _, _), v in zip(cases, vals) if k != "right")
        print(f"{label:6s} ({pool.size} worker{'s' if pool.size > 1 else ''}): {wall:7.1f} s wall, "
              f"{a.n / wall:6.1f} responses/s; per response {_stats(lat)}; right answers accepted "
              f"{right}/{a.n // 3 + (a.n % 3 > 0)}, wrong/adversarial accepted {bad}; "
              f"timeouts {pool.stats['timeouts']} (retries {pool.stats['retries']}, killed {pool.stats['killed']})")
    assert results["serial"][1] == results["pool"][1], "serial and pool verdicts differ"
    print(f"speed-up (serial wall / pool wall): {results['serial'][0] / results['pool'][0]:.2f}x  (same verdicts)")


if __name__ == "__main__":
    main()
