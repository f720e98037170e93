"""Partial rollouts on a long-tailed workload: synchronous, one-step-off and in-flight partial, one run.

Workload: groups of ``--n`` samples; every eighth prompt answers ``--tail``× longer (``--len`` tokens,
``--tail × --len`` for the eighth; the tiny policy is saved without an end token, so every response
runs to its ``max_tokens``, exactly). A step trains on ``--groups`` groups.

One ``vllm-async`` engine (vLLM-CPU ``AsyncLLM`` in a Ray actor, gloo pushes) serves all three modes
in turn; the trainer is a stand-in of fixed cost (``--train-s`` seconds of float32 matmuls on the
driver's core — the engine actor has the other core: ``async_source.core_plan``), followed by a real
weight push of the policy every step:

* sync — generate the step's groups, train, push (engines idle while training);
* one-step-off — the next step's groups are generated while the trainer trains; the push waits for
  them (a batch boundary: the long tail of each batch still holds the step);
* partial — :class:`~megatron_rl.rollout.partial_pool.PartialPool`: ``--groups`` + ``--extra`` groups in flight,
  a step takes the first ``--groups`` that finished, the push happens in flight, the tail finishes
  in a later step (staleness bound ``--bound``, policy drop; dropped groups are reported).

Reported per mode (after ``--skip`` warm-up steps): step seconds, trained response tokens per
second, the engine's idle fraction (no request in flight or generation paused for a push, measured
in the engine: ``AsyncVLLMEngine.busy_seconds``), per-token
staleness mean / max, the share of responses spanning a push — and each as a ratio against sync.

    .venv/bin/python benchmarks/bench_partial.py [--steps 8] [--skip 2] [--groups 8] [--extra 8] [--n 4]
                                                 [--len 24] [--tail 8] [--train-s 0.5] [--bound 3]
"""
from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import threading
import time
from pathlib import Path


def tiny_policy(d: Path) -> Path:
    """The tests' tiny Qwen3 with no end token (responses run to max_tokens)."""
    from tests.helpers.tiny_model import save_tiny_qwen3

    save_tiny_qwen3(d, max_positions=1024)
    cfg = json.loads((d / "config.json").read_text())
    cfg["eos_token_id"] = None
    (d / "config.json").write_text(json.dumps(cfg))
    gen = d / "generation_config.json"
    if gen.exists():
        g = json.loads(gen.read_text())
        g.pop("eos_token_id", None)
        gen.write_text(json.dumps(g))
    return d


def request_fn(args):
    from megatron_rl.rollout.engine import SamplingParams

    def request(i: int):
        prompt = [1] + [3 + (i * 7 + k) % 60 for k in range(6)]
        return prompt, SamplingParams(n=args.n, max_tokens=args.len * (args.tail if i % 8 == 7 else 1), seed=1000 + i)
    return request


def train_standin(seconds: float) -> None:
    """Fixed-cost trainer stand-in: fp32 matmuls for ``seconds`` on this thread's cores."""
    import torch

    a = torch.randn(256, 256)
    t_end = time.perf_counter() + seconds
    while time.perf_counter() < t_end:
        a = torch.tanh(a @ a * 1e-2)


def _groups(client, request, idx):
    """Generate prompts ``idx`` (blocking, grouped by submit/harvest so every mode uses one engine call path)."""
    for i in idx:
        client.submit(i, *request(i))
    got = client.harvest(wait_s=3600, min_groups=len(idx))
    return [c for _, cs in got for c in cs]


def run_sync(client, request, args, push):
    rows, nxt = [], 0
    for _ in range(args.steps):
        t0, b0 = time.perf_counter(), client.push_stats()[0]["busy_s"]
        comps = _groups(client, request, range(nxt, nxt + args.groups))
        nxt += args.groups
        train_standin(args.train_s)
        push()
        rows.append(_row(client, t0, b0, comps, 0, 0, 0.0, 0))
    return rows


def run_one_off(client, request, args, push):
    rows, box = [], {}
    gen = lambda lo: box.__setitem__(lo, _groups(client, request, range(lo, lo + args.groups)))  # noqa: E731
    gen(0)
    for s in range(args.steps):
        t0, b0 = time.perf_counter(), client.push_stats()[0]["busy_s"]
        comps = box.pop(s * args.groups)
        th = threading.Thread(target=gen, args=((s + 1) * args.groups,))
        th.start()
        train_standin(args.train_s)
        th.join()                       # the push waits at the batch boundary
        push()
        rows.append(_row(client, t0, b0, comps, 1 if s else 0, 1 if s else 0, 0.0, 0))
    return rows


def run_partial(client, request, args, push):
    from megatron_rl.rollout.partial_pool import PartialPool, StalenessPolicy

    pool = PartialPool(client, request, groups_per_step=args.groups, extra=args.extra,
                       policy=StalenessPolicy(args.bound, "drop"))
    rows = []
    for _ in range(args.steps):
        t0, b0 = time.perf_counter(), client.push_stats()[0]["busy_s"]
        groups, m = pool.take(trainer_version=client.push_stats()[0]["version"])
        train_standin(args.train_s)
        push()
        comps = [c for g in groups for c in g.completions]
        rows.append(_row(client, t0, b0, comps, m["partial/staleness_mean"], m["partial/staleness_max"],
                         m["partial/span_frac"], m["partial/dropped_groups"]))
    for _ in range(60):   # let the groups still in flight finish before the next mode
        if not client.in_flight():
            break
        client.harvest(wait_s=10, min_groups=len(client.in_flight()))
    return rows


def _row(client, t0, b0, comps, st_mean, st_max, span, dropped) -> dict:
    dt = time.perf_counter() - t0
    busy = client.push_stats()[0]["busy_s"] - b0
    return {"step_s": dt, "tokens_s": sum(len(c.response_ids) for c in comps) / dt, "idle": max(0.0, 1 - busy / dt),
            "stale_mean": st_mean, "stale_max": st_max, "span": span, "dropped": dropped}


def summary(rows: list[dict], skip: int) -> dict:
    rows = rows[skip:]
    agg = {"stale_max": max, "dropped": sum}
    return {k: agg.get(k, statistics.mean)([r[k] for r in rows]) for k in rows[0]}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    for k, v in (("steps", 8), ("skip", 2), ("groups", 8), ("extra", 8), ("n", 4), ("len", 24), ("tail", 8), ("bound", 3)):
        p.add_argument(f"--{k}", type=int, default=v)
    p.add_argument("--train-s", type=float, default=0.5)
    args = p.parse_args()

    from safetensors.torch import load_file

    from megatron_rl.rollout.client import RolloutClient
    from megatron_rl.trainer.loop.async_source import engine_env, local_plan, pin_trainer

    plan = local_plan()
    pin_trainer(plan, 0)
    with tempfile.TemporaryDirectory() as tmp:
        model = tiny_policy(Path(tmp) / "policy")
        client = RolloutClient("vllm-async", str(model), num_engines=1, sync_backend="gloo", actor_env=engine_env(plan),
                               engine_kwargs={"max_model_len": 1024, "kv_cache_gib": 0.25})
        w = load_file(str(model / "model.safetensors"))
        push = lambda: client.update_weights(w.items())  # noqa: E731
        push()
        request = request_fn(args)
        try:
            res = {name: summary(fn(client, request, args, push), args.skip)
                   for name, fn in (("sync", run_sync), ("one-step-off", run_one_off), ("partial", run_partial))}
        finally:
            client.shutdown()
    base = res["sync"]
    print(f"{'mode':14s} {'step s':>8s} {'tokens/s':>9s} {'idle':>6s} {'stale mean/max':>15s} {'span':>5s} "
          f"{'dropped':>7s} {'step x sync':>11s} {'tok/s x sync':>12s}")
    for name, r in res.items():
        print(f"{name:14s} {r['step_s']:8.2f} {r['tokens_s']:9.0f} {r['idle']:6.2f} {r['stale_mean']:7.2f}/{r['stale_max']:<7.0f} "
              f"{r['span']:5.2f} {r['dropped']:7.0f} {r['step_s'] / base['step_s']:11.2f} {r['tokens_s'] / base['tokens_s']:12.2f}")
    print(f"partial rollouts: {res['partial']['tokens_s'] / res['one-step-off']['tokens_s']:.2f}x one-step-off tokens/s "
          f"(goal 1.3x) on a 1-in-8 {args.tail}x long tail")


if __name__ == "__main__":
    main()
