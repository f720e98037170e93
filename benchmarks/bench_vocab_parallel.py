"""Peak memory of vocab-parallel log-probs + entropy at TP=2 vs gathering the full logits.

Run:  python benchmarks/bench_vocab_parallel.py [--tokens 2048] [--vocab 32000]

It re-launches itself under ``torchrun --nproc_per_node=2`` (gloo). Each rank holds its fp32
logits shard ``[T, V/2]`` (as the output layer of a TP=2 model would produce) and runs, forward
*and* backward of ``sum(logp) + sum(entropy)``:

* ``vocab_parallel``: :func:`megatron_rl.trainer.policy.vocab_parallel.vocab_parallel_logprobs`
  (max / sum-exp / target-logit / sum p·z all-reduces, shard-sized tensors only);
* ``gather``: all-gather the shards into full ``[T, V]`` logits, then ``log_softmax`` + gather
  + ``-(p * log p).sum`` with autograd on the full tensor (what a TP-unaware loss would do).

Measurement method: the peak resident set size of the worker process above the baseline
(inputs already allocated). Before each variant we run ``gc``, write ``5`` to
``/proc/self/clear_refs`` (Linux: resets the ``VmHWM`` high-water mark to the current RSS) and read
``VmRSS``; after it we read ``VmHWM``. ``MALLOC_MMAP_THRESHOLD_`` is pinned low so every large
tensor is an ``mmap`` that is returned to the OS on free, i.e. RSS tracks live tensor bytes and
the two variants do not reuse each other's cached pages. Each variant runs twice (warm-up, then
measured) and the worse rank is reported. The printed ratio is ``peak(vocab_parallel) /
peak(gather)``; the goal is <= 0.6.
"""
from __future__ import annotations

import argparse
import gc
import os
import re
import socket
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _status(key: str) -> int:
    """``key`` from /proc/self/status in bytes."""
    with open("/proc/self/status") as f:
        return int(re.search(rf"{key}:\s+(\d+) kB", f.read()).group(1)) * 1024


def _peak_delta(fn) -> int:
    gc.collect()
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    base = _status("VmRSS")
    fn()
    gc.collect()
    return _status("VmHWM") - base


def _worker(tokens: int, vocab: int) -> None:
    import torch
    import torch.distributed as dist

    from megatron_rl.trainer.policy.vocab_parallel import full_vocab_logprobs, vocab_parallel_logprobs

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(rank)
    width = vocab // world
    shard = torch.randn(tokens, width)
    targets = torch.randint(0, vocab, (tokens,))

    def vocab_parallel() -> None:
        x = shard.requires_grad_()
        out = vocab_parallel_logprobs(x, targets, dist.group.WORLD, vocab_size=vocab)
        (out.logp.sum() + out.entropy.sum()).backward()
        x.grad = None

    def gather() -> None:
        parts = [torch.empty_like(shard) for _ in range(world)]
        dist.all_gather(parts, shard.detach())
        full = torch.cat(parts, dim=-1).requires_grad_()
        del parts
        out = full_vocab_logprobs(full, targets)
        (out.logp.sum() + out.entropy.sum()).backward()
        grad_shard = full.grad[:, rank * width:(rank + 1) * width].clone()   # what this rank needs
        del grad_shard

    res = {}
    for name, fn in (("vocab_parallel", vocab_parallel), ("gather", gather)):
        fn()
        dist.barrier()
        res[name] = _peak_delta(fn)
        dist.barrier()
    peaks = torch.tensor([res["vocab_parallel"], res["gather"]], dtype=torch.float64)
    dist.all_reduce(peaks, op=dist.ReduceOp.MAX)
    if rank == 0:
        shard_mb = shard.numel() * 4 / 2**20
        vp, ga = peaks.tolist()
        print(f"tokens={tokens} vocab={vocab} tp={world} fp32 logits shard={shard_mb:.1f} MiB/rank")
        print(f"peak extra RSS (worst rank): vocab_parallel={vp / 2**20:.1f} MiB  gather={ga / 2**20:.1f} MiB")
        print(f"ratio vocab_parallel/gather = {vp / ga:.3f}  (goal <= 0.6)")
    dist.destroy_process_group()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=2048)
    ap.add_argument("--vocab", type=int, default=32000)
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.worker:
        _worker(a.tokens, a.vocab)
        return
    env = dict(os.environ, OMP_NUM_THREADS="1", MALLOC_MMAP_THRESHOLD_="65536",
               PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", "--master_addr=127.0.0.1",
           f"--master_port={port}", __file__, "--worker", f"--tokens={a.tokens}", f"--vocab={a.vocab}"]
    sys.exit(subprocess.run(cmd, env=env, cwd=REPO).returncode)


if __name__ == "__main__":
    main()
