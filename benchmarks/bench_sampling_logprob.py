"""Time and peak memory of the μ pass (log-probs under the engines' truncated sampling distribution)
against the plain vocab-parallel log-prob at the same shape, measured in the same run.

Run:  python benchmarks/bench_sampling_logprob.py [--tokens 256] [--vocab 151936] [--tp 1 2]

For each TP size it re-launches itself under ``torchrun --nproc_per_node=<tp>`` (gloo, one thread per
rank). Each rank holds its fp32 logits shard ``[T, V/tp]`` (bf16-rounded values, so ties occur as they
do in a bf16 model's logits; rows N(0, σ²) with σ = 5, whose top-p 0.95 set is a few hundred tokens)
and runs, without gradient (the old / reference log-prob pass):

* ``plain``: :func:`megatron_rl.trainer.policy.vocab_parallel.vocab_parallel_logprobs` (log q + entropy);
* ``mu <spec>``: :func:`megatron_rl.trainer.policy.vocab_parallel.vocab_parallel_sampled_logprobs`;

and, with gradient (the training forward and backward with ``algo.ratio_space=sampling``), ``plain`` and
``mu top-k 20 top-p 0.95``. Time: mean of 3 calls after a warm-up, worst rank. Peak memory: the peak
resident set size above the baseline (``/proc/self/clear_refs`` resets ``VmHWM``;
``MALLOC_MMAP_THRESHOLD_`` pinned low so freed tensors leave RSS), worst rank, as
``bench_vocab_parallel.py``. Ratios are against ``plain`` of the same mode; goal <= 1.5x in both.
The last line: ``mu pass: top-k 20 top-p 0.95: X x time, Y x memory of the plain log-prob`` (TP 1).
"""
from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

from bench_vocab_parallel import _peak_delta   # the same peak-RSS measure (this script runs from benchmarks/)

REPO = Path(__file__).resolve().parents[1]
SPECS = {"top-k 20 top-p 0.95": {"top_k": 20, "top_p": 0.95}, "top-p 0.95": {"top_p": 0.95},
         "top-k 50 top-p 0.95 min-p 0.02": {"top_k": 50, "top_p": 0.95, "min_p": 0.02}}
HEADLINE = "top-k 20 top-p 0.95"


def _seconds(fn, reps: int = 3) -> float:
    fn()
    t = time.perf_counter()
    for _ in range(reps):
        fn()
    return (time.perf_counter() - t) / reps


def _worker(tokens: int, vocab: int) -> None:
    import torch
    import torch.distributed as dist

    from megatron_rl.algorithms.sampling import SamplingSpec
    from megatron_rl.trainer.policy.vocab_parallel import (
        vocab_parallel_logprobs,
        vocab_parallel_sampled_logprobs,
    )

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    width = -(-vocab // world)
    g = torch.Generator().manual_seed(0)
    full = (5 * torch.randn(tokens, width * world, generator=g)).bfloat16().float()
    shard = full[:, rank * width:(rank + 1) * width].clone()
    targets = full[:, :vocab].argmax(-1)
    del full
    group = dist.group.WORLD

    def plain(grad: bool):
        def run():
            x = shard.requires_grad_(grad)
            with torch.set_grad_enabled(grad):
                out = vocab_parallel_logprobs(x, targets, group, vocab_size=vocab)
                if grad:
                    (out.logp.sum() + out.entropy.sum()).backward()
                    x.grad = None
        return run

    def mu(spec: SamplingSpec, grad: bool):
        def run():
            x = shard.requires_grad_(grad)
            with torch.set_grad_enabled(grad):
                out = vocab_parallel_sampled_logprobs(x, targets, spec, group, vocab_size=vocab)
                if grad:
                    out.logp.sum().backward()
                    x.grad = None
        return run

    cases = [("no grad", "plain", plain(False))]
    cases += [("no grad", f"mu {name}", mu(SamplingSpec(1.0, **kw), False)) for name, kw in SPECS.items()]
    cases += [("fwd+bwd", "plain", plain(True)), ("fwd+bwd", f"mu {HEADLINE}", mu(SamplingSpec(1.0, **SPECS[HEADLINE]), True))]
    res = []
    for mode, name, fn in cases:
        dist.barrier()
        sec = _seconds(fn)
        dist.barrier()
        res.append([sec, float(_peak_delta(fn))])
    worst = torch.tensor(res, dtype=torch.float64)
    dist.all_reduce(worst, op=dist.ReduceOp.MAX)
    if rank == 0:
        mib = shard.numel() * 4 / 2**20
        print(f"T={tokens} V={vocab} tp={world}: fp32 logits shard {mib:.0f} MiB/rank")
        base = {}
        for (mode, name, _), (sec, peak) in zip(cases, worst.tolist()):
            base.setdefault(mode, (sec, peak))
            b_sec, b_peak = base[mode]
            print(f"| {world} | {mode} | {name} | {sec * 1e3:.1f} ms | {sec / b_sec:.2f}x | {peak / 2**20:.0f} MiB "
                  f"| {peak / max(b_peak, 1.0):.2f}x |", flush=True)
            if mode == "no grad" and name == f"mu {HEADLINE}":
                headline = (sec / b_sec, peak / max(b_peak, 1.0))
        with open(os.environ["BENCH_OUT"], "a") as f:
            f.write(f"{world} {headline[0]} {headline[1]}\n")
    dist.destroy_process_group()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=256)
    ap.add_argument("--vocab", type=int, default=151936)
    ap.add_argument("--tp", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.worker:
        _worker(a.tokens, a.vocab)
        return
    out = REPO / ".bench_sampling_logprob.tmp"
    out.unlink(missing_ok=True)
    env = dict(os.environ, OMP_NUM_THREADS="1", MALLOC_MMAP_THRESHOLD_="65536", BENCH_OUT=str(out),
               PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    print("| tp | mode | pass | time | x plain | peak extra RSS | x plain |\n|---|---|---|---|---|---|---|")
    for tp in a.tp:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={tp}", "--master_addr=127.0.0.1",
               f"--master_port={port}", __file__, "--worker", f"--tokens={a.tokens}", f"--vocab={a.vocab}"]
        if subprocess.run(cmd, env=env, cwd=REPO, check=False).returncode:
            sys.exit(1)
    lines = out.read_text().split()
    out.unlink()
    t, m = float(lines[1]), float(lines[2])
    print(f"mu pass: {HEADLINE}: {t:.2f} x time, {m:.2f} x memory of the plain log-prob")


if __name__ == "__main__":
    main()
