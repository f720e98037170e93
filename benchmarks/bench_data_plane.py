"""The rollout data plane at the recipes' batch sizes (issue 41): collect -> decode -> reward -> distribute ->
per-rank batch -> packing plan, before -> after, in one run.

Run:  python benchmarks/bench_data_plane.py [--tokens 9M] [--ranks 2] [--all] [--mem-limit-gb 8] [--json OUT]

No model: a stand-in engine answers ``generate`` at once with completions of the recipes' lengths (the
engines' own format, ``rollout/engine.Completion``: tuples of ids; the log-probs as a tuple of floats for
``before`` / ``packed``, as the engines gave them then, one float32 array per completion for ``after``, as
the vLLM engines give them now). Each path runs in its
own ``torch.distributed.run`` job of ``--ranks`` gloo ranks (so each rank's peak RSS is the path's own);
global rank 0 is the driver, as in training. Cases (``--tokens``; ``--all``: 1M, 9M and 67M at 2 and 4 ranks):

* ``1M``: 32 prompts x 8 samples, responses of 2k..6k tokens (mean 4k), prompts of 256..512;
* ``9M``: 256 prompts x 8 samples, the same lengths (the issue's 2,048 x 4,096);
* ``67M``: DAPO's recipe, 512 prompts x 16 samples, responses of 1k..15k tokens (mean 8k).

Paths:

* ``before``: the loop as it was — Python lists per sample (``list(c.response_ids)`` ...), one
  ``tokenizer.decode`` per sample, the whole object pickled through ``broadcast_object_list``;
* ``packed``: the first tensor change: ``rollout/rollouts.py`` (flat int32 / fp32 buffers, texts decoded in
  one batch) and the distribution as it was then (every tensor copied into one staging buffer and received as
  views of one buffer; each row's prompt ids pickled as Python ints);
* ``whole``: the same batch, whole to every rank, through ``runtime/broadcast.broadcast_object`` (large
  tensors broadcast from / into their own memory, rows' prompt ids as one int32 byte string each);
* ``after``: each DP replica its share (``trainer/pipeline/dispatch.deliver``, every rank one replica, the
  plain paths' delivery): every sample's metadata, the token rows of the replica's passes only, no texts;
  ``--mini-batches K`` (default 1) cuts the step into K optimizer steps, whose own DP splits add rows to
  a replica's share (``dispatch.step_rows``).

Every rank first does what a training rank has done before its first distribution (imports the batch's
modules, runs a collective): else the receivers' first unpickling imports them inside the timed stage.

Stages: ``collect`` (completions -> the batch object), ``decode`` (texts), ``reward`` (``rollouts.score``
with the ``exact`` reward: the bookkeeping, not a verifier's cost), ``distribute`` (driver -> every rank;
the slowest rank's time from a barrier to the object in hand, the median of :data:`REPEATS`), ``batch`` (each rank's padded sequence
batch of the whole step's rows, as every rank builds it: before ``sequences.build_seq_batch`` of the lists,
after ``sequences.rollout_sequences`` from the flat buffers) and
``plan`` (``packing.plan`` from the lengths). Memory: ``share`` = bytes of one DP rank's share of the
token data as int32 ids + fp32 log-probs (the whole batch's over the ranks); ``dist`` = the RSS a receiving rank (not the driver) added from
just before the distribution to its peak after it (max over the receivers), and ``dist / share``;
``batch`` = the RSS the batch stage added on top. A case whose estimated memory exceeds
``--mem-limit-gb`` for all ranks together (the shared host) is skipped and said so.

Goals (issue 41): distribute 9M tokens <= 0.3 s; a rank's memory <= 1.5x its share. The last line:
``data plane: 9M tokens, 2 ranks: distribute X s, per-rank memory Y x its share`` (the ``after`` path of
the first case).
"""
from __future__ import annotations

import argparse
import dataclasses
import importlib
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from types import SimpleNamespace

os.environ.setdefault("OMP_NUM_THREADS", "1")
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

#: name -> (prompts, samples per prompt, response min, response max, prompt min, prompt max)
CASES = {"1M": (32, 8, 2048, 6144, 256, 512), "9M": (256, 8, 2048, 6144, 256, 512),
         "67M": (512, 16, 1024, 15360, 256, 512)}
BYTES_PER_TOKEN = {"before": 110, "packed": 14, "whole": 14, "after": 14}   # estimates per rank (lists of objects vs buffers + texts)
REPEATS = 3   # distributions per job: the stage's time is their median
BATCH_BYTES = 24   # per row slot of the padded batch: tokens int64 + loss mask fp32 + resp_pos int64 + resp_mask fp32


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _peak() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


# ---- the stand-in engine --------------------------------------------------------------------------


class StandInEngine:
    """``generate`` of the engines' interface, answered at once: ``n`` completions per prompt whose
    lengths are drawn uniformly from the case's range (seeded); ids and log-probs are slices of one long
    template tuple (the objects are shared, as a real engine's would not be: the driver's RSS is a floor)."""

    def __init__(self, resp_min: int, resp_max: int, vocab: int, seed: int = 0, arrays: bool = False):
        import numpy as np

        self.rng = np.random.default_rng(seed)
        self.resp_min, self.resp_max = resp_min, resp_max
        self.ids = tuple(self.rng.integers(0, vocab, 2 * resp_max).tolist())
        self.lps = tuple(float(x) for x in (-self.rng.exponential(1.0, 2 * resp_max)).astype(np.float32))
        self.arrays = np.asarray(self.lps, dtype=np.float32) if arrays else None

    def generate(self, prompts, sampling):
        from megatron_rl.rollout.engine import Completion

        out = []
        for i, p in enumerate(prompts):
            for j in range(sampling.n):
                n = int(self.rng.integers(self.resp_min, self.resp_max + 1))
                o = int(self.rng.integers(0, self.resp_max))
                lps = self.lps[o:o + n] if self.arrays is None else self.arrays[o:o + n].copy()
                out.append(Completion(i, j, tuple(p), self.ids[o:o + n], lps, "length" if n == self.resp_max else "stop"))
        return out


def _rows(prompts: int, pmin: int, pmax: int, vocab: int):
    import numpy as np

    from megatron_rl.data.dataset import PromptRow

    rng = np.random.default_rng(1)
    return [PromptRow(i, tuple(rng.integers(0, vocab, int(rng.integers(pmin, pmax + 1))).tolist()), "bench", "42", {})
            for i in range(prompts)]


# ---- the two paths ----------------------------------------------------------------------------------


@dataclasses.dataclass
class LegacyRollouts:
    """The loop's batch before issue 41 (fields as they were): Python lists per sample."""

    rows: list
    prompts: list
    responses: list
    rollout_logp: list
    finish: list
    group_ids: object
    texts: list = dataclasses.field(default_factory=list)
    rewards: object = None
    correct: object = None
    greedy_rewards: object = None
    stats: dict = dataclasses.field(default_factory=dict)
    process: object = None
    weight_version: int | None = None


def _collect_before(rows, comps, tok, t: dict):
    import torch

    t0 = time.perf_counter()
    out_rows, prompts, resps, lps, fin, gids = [], [], [], [], [], []
    for c in comps:
        out_rows.append(rows[c.prompt_index])
        prompts.append(list(c.prompt_ids))
        resps.append(list(c.response_ids))
        lps.append(list(c.logprobs))
        fin.append(c.finish_reason)
        gids.append(c.prompt_index)
    t1 = time.perf_counter()
    texts = [tok.decode(c.response_ids) for c in comps]
    t["collect"], t["decode"] = t1 - t0, time.perf_counter() - t1
    return LegacyRollouts(out_rows, prompts, resps, lps, fin, torch.tensor(gids, dtype=torch.long), texts)


def _collect_after(rows, comps, tok, t: dict):
    from megatron_rl.rollout import rollouts as R

    t0 = time.perf_counter()
    ro = R.from_completions(rows, comps, None)
    t1 = time.perf_counter()
    ro.texts = R.decode_batch(tok, ro.response_ids, ro.response_offsets)
    t["collect"], t["decode"] = t1 - t0, time.perf_counter() - t1
    return ro


def _packed_broadcast(obj):
    """``runtime/broadcast.broadcast_object`` as the first tensor change left it (path ``packed``): every
    tensor copied into one staging buffer, received as views of one buffer; the rows' prompt ids pickled
    as Python ints (the dataclass's default pickling)."""
    import copyreg
    import io

    import torch
    import torch.distributed as dist

    from megatron_rl.data.dataset import PromptRow
    from megatron_rl.runtime import broadcast as B

    if dist.get_rank() == 0:
        tensors: list = []
        f = io.BytesIO()
        p = B._Pickler(f, tensors)
        p.dispatch_table = {**copyreg.dispatch_table, PromptRow: lambda r: (copyreg.__newobj__, (PromptRow,), dict(r.__dict__))}
        p.dump(obj)
        flat, spec = B.pack(tensors)
        box = [(f.getvalue(), spec, flat.numel())]
    else:
        box = [None]
    dist.broadcast_object_list(box, src=0)
    skeleton, spec, nbytes = box[0]
    buf = flat if dist.get_rank() == 0 else torch.empty(nbytes, dtype=torch.uint8)
    dist.broadcast(buf, src=0)
    return obj if dist.get_rank() == 0 else B.join_tensors(skeleton, B.unpack(buf, spec))


def _distribute(path: str, ro, mini_batches: int = 1):
    import torch.distributed as dist

    if path == "before":
        box = [ro]
        dist.broadcast_object_list(box, src=0)
        return box[0]
    if path == "packed":
        return _packed_broadcast(ro)
    from megatron_rl.runtime.broadcast import broadcast_object

    if path == "whole":
        return broadcast_object(ro)
    from megatron_rl.runtime.parallel import ParallelInfo
    from megatron_rl.trainer.pipeline.dispatch import deliver
    from megatron_rl.trainer.pipeline.packing import TokenBudget

    rank, world = dist.get_rank(), dist.get_world_size()
    info = ParallelInfo(rank=rank, world=world, tp=1, pp=1, dp=world, tp_rank=0, pp_rank=0, dp_rank=rank)
    rows_per_mb = 0                # (only the driver plans the shares)
    if ro is not None:
        ro.share = None            # the driver's batch of an earlier repeat
        rows_per_mb = -(-len(ro) // mini_batches)
    return deliver(ro, info=info, micro=TokenBudget(1 << 30), rows_per_mini_batch=rows_per_mb, shares_rows=True)


def _warm_up() -> None:
    """What a training rank has done before its first step's distribution: imported the batch's modules
    (the first unpickling would otherwise import them inside the timed stage) and run collectives on the
    group (gloo's pairs connected)."""
    import torch
    import torch.distributed as dist

    for mod in ("megatron_rl.data.dataset", "megatron_rl.rollout.rollouts", "megatron_rl.runtime.broadcast",
                "megatron_rl.trainer.pipeline.dispatch"):
        importlib.import_module(mod)
    dist.broadcast_object_list([dist.get_rank()], src=0)
    dist.broadcast(torch.zeros(1 << 16, dtype=torch.uint8), src=0)


# ---- one rank of one path ---------------------------------------------------------------------------


def _driver(case: str, path: str, tok_dir: str, t: dict):
    from megatron_rl.data.tokenizer import load_tokenizer
    from megatron_rl.rewards.manager import RewardManager
    from megatron_rl.rollout import rollouts as R
    from megatron_rl.rollout.engine import SamplingParams

    prompts, n, rmin, rmax, pmin, pmax = CASES[case]
    tok = load_tokenizer(tok_dir)
    rows = _rows(prompts, pmin, pmax, tok.vocab_size)
    t0 = time.perf_counter()
    comps = StandInEngine(rmin, rmax, tok.vocab_size, arrays=path in ("whole", "after")).generate([list(r.prompt_ids) for r in rows],
                                                                SamplingParams(n=n, max_tokens=rmax))
    t["engine"] = time.perf_counter() - t0
    ro = (_collect_before if path == "before" else _collect_after)(rows, comps, tok, t)
    del comps
    t0 = time.perf_counter()
    R.score(ro, RewardManager(default="exact"))
    t["reward"] = time.perf_counter() - t0
    return ro


def _batch_and_plan(ro, dp: int, t: dict, mem: dict, limit: float) -> None:
    from megatron_rl.trainer.pipeline.packing import TokenBudget, seq_lengths
    from megatron_rl.trainer.pipeline.packing import plan as pack_plan
    from megatron_rl.trainer.pipeline.sequences import build_seq_batch, rollout_sequences

    lens = [len(p) + len(r) for p, r in zip(ro.prompts, ro.responses)] if not hasattr(ro, "response_lens") \
        else (ro.prompt_lens + ro.response_lens).tolist()
    r_max = max(len(r) for r in ro.responses) if not hasattr(ro, "response_lens") else int(ro.response_lens.max())
    s = -(-max(lens) // 8) * 8
    need = len(lens) * (s + r_max) * BATCH_BYTES / 2 * dp
    if need > limit:
        mem["batch_skipped"] = f"needs ~{need / 2**30:.1f} GiB on {dp} ranks"
        return
    base = _rss()
    t0 = time.perf_counter()
    if hasattr(ro, "response_lens"):   # after: straight from the flat buffers, as the plain paths do
        ctx = SimpleNamespace(padded_len=lambda m: -(-m // 8) * 8, cfg=SimpleNamespace(rollout=SimpleNamespace(max_tokens=r_max)),
                              tok=SimpleNamespace(pad_id=0))
        sb = rollout_sequences(ctx, ro)
    else:                              # before: the lists, padded one sample at a time
        sb = build_seq_batch(ro.prompts, ro.responses, 0, s, r_max)
    t1 = time.perf_counter()
    pack_plan(seq_lengths(sb.batch), TokenBudget(2 * s), dp)
    t["batch"], t["plan"] = t1 - t0, time.perf_counter() - t1
    mem["batch"] = max(0, _peak() - base)


def worker(case: str, path: str, tok_dir: str, out: str, limit: float, mini_batches: int = 1) -> None:
    import torch.distributed as dist

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    t: dict = {}
    ro = _driver(case, path, tok_dir, t) if rank == 0 else None
    _warm_up()
    base, times = _rss(), []
    for k in range(REPEATS):      # the median of REPEATS (a shared host's noise); memory: the first one's
        dist.barrier()
        t0 = time.perf_counter()
        got = _distribute(path, ro, mini_batches)
        times.append(time.perf_counter() - t0)
        if k == 0:
            mem = {"dist": max(0, _peak() - base)}
        if k < REPEATS - 1:
            del got
    ro = got
    t["distribute"] = sorted(times)[len(times) // 2]
    _batch_and_plan(ro, world, t, mem, limit)
    tokens = int(sum(len(r) for r in ro.responses)) if path == "before" else int(ro.response_offsets[-1])
    prompt_tokens = int(sum(len(p) for p in ro.prompts)) if path == "before" else int(ro.prompt_offsets[-1])
    res = {"rank": rank, "t": t, "mem": mem, "peak": _peak(), "tokens": tokens + prompt_tokens,
           "share_bytes": (prompt_tokens * 4 + tokens * 8) / world}
    if path == "after":
        res["held_rows"] = len(ro.held_rows())
    with open(f"{out}.{rank}", "w") as f:
        json.dump(res, f)
    dist.destroy_process_group()


# ---- the driver script --------------------------------------------------------------------------------


def _estimate(case: str, ranks: int, path: str) -> float:
    prompts, n, rmin, rmax, pmin, pmax = CASES[case]
    tokens = prompts * n * ((rmin + rmax) / 2 + (pmin + pmax) / 2)
    return tokens * BYTES_PER_TOKEN[path] * ranks + tokens * 16   # + the stand-in's completions


def run_case(case: str, ranks: int, path: str, tok_dir: str, limit: float, mini_batches: int = 1) -> dict:
    est = _estimate(case, ranks, path)
    if est > limit:
        return {"skipped": f"needs ~{est / 2**30:.1f} GiB for {ranks} ranks > --mem-limit-gb"}
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "r")
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [REPO, os.environ.get("PYTHONPATH")])),
               "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
        cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={ranks}", "--master_addr=127.0.0.1",
               f"--master_port={_free_port()}", os.path.abspath(__file__), "--worker", case, path, tok_dir, out, str(limit), str(mini_batches)]
        p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=3600)
        if p.returncode:
            raise RuntimeError(f"{case} {ranks} ranks {path}: rc {p.returncode}\n{p.stdout[-2000:]}\n{p.stderr[-4000:]}")
        per = [json.load(open(f"{out}.{r}")) for r in range(ranks)]
    return summarize(per)


def summarize(per: list[dict]) -> dict:
    drv, recv = per[0], per[1:]
    t = dict(drv["t"])
    for k in ("distribute", "batch", "plan"):
        if all(k in r["t"] for r in per):
            t[k] = max(r["t"][k] for r in per)
    share = drv["share_bytes"]
    dist_b = max(r["mem"]["dist"] for r in recv)
    out = {"t": t, "tokens": drv["tokens"], "share_mb": share / 2**20, "dist_mb": dist_b / 2**20,
           "dist_x_share": dist_b / share, "peak_mb": [r["peak"] / 2**20 for r in per]}
    if "held_rows" in drv:
        out["held_rows"] = [r["held_rows"] for r in recv]
    if "batch" in recv[0]["mem"]:
        out["batch_mb"] = max(r["mem"]["batch"] for r in recv) / 2**20
    else:
        out["batch_skipped"] = recv[0]["mem"]["batch_skipped"]
    return out


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _tokenizer(d: str) -> str:
    sys.path.insert(0, REPO)
    from pathlib import Path

    from tests.helpers.chat_fixture import (
        train_tokenizer,  # the suite's tiny byte-level BPE (Qwen specials)
    )

    train_tokenizer(Path(d))
    return d


STAGES = ("collect", "decode", "reward", "distribute", "batch", "plan")


def _row(case: str, ranks: int, path: str, r: dict) -> str:
    if "skipped" in r:
        return f"| {case} | {ranks} | {path} | skipped: {r['skipped']} |" + " |" * 8
    t = r["t"]
    cells = [f"{t[s]:.2f}" if s in t else "–" for s in STAGES]
    batch = f"{r['batch_mb']:.0f}" if "batch_mb" in r else "skipped"
    return (f"| {case} | {ranks} | {path} | " + " | ".join(cells) +
            f" | {r['share_mb']:.0f} | {r['dist_mb']:.0f} ({r['dist_x_share']:.2f}x) | {batch} | "
            f"{max(r['peak_mb']):.0f} |")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tokens", choices=sorted(CASES), default="9M")
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--all", action="store_true", help="1M, 9M, 67M at 2 and 4 ranks")
    ap.add_argument("--paths", default="before,packed,whole,after")
    ap.add_argument("--mini-batches", type=int, default=1, help="optimizer steps per RL step (the after path's shares)")
    ap.add_argument("--mem-limit-gb", type=float, default=8.0, help="skip a case estimated above this (all ranks)")
    ap.add_argument("--json", default=None)
    a = ap.parse_args(argv)
    cases = [(c, k) for c in ("1M", "9M", "67M") for k in (2, 4)] if a.all else [(a.tokens, a.ranks)]
    limit = a.mem_limit_gb * 2**30
    res = {}
    print("| case | ranks | path | " + " | ".join(f"{s} s" for s in STAGES) +
          " | share MB | dist MB (x share) | batch MB | peak MB |")
    print("|" + "---|" * (len(STAGES) + 7))
    with tempfile.TemporaryDirectory() as d:
        tok = _tokenizer(d)
        for case, ranks in cases:
            for path in a.paths.split(","):
                r = res[f"{case}/{ranks}/{path}"] = run_case(case, ranks, path, tok, limit, a.mini_batches)
                print(_row(case, ranks, path, r), flush=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(res, f, indent=1)
    case, ranks = cases[0]
    r = res.get(f"{case}/{ranks}/after", {})
    if "t" in r:
        print(f"data plane: {case} tokens, {ranks} ranks: distribute {r['t']['distribute']:.2f} s, "
              f"per-rank memory {r['dist_x_share']:.2f} x its share")
    return 0


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        worker(*sys.argv[2:6], float(sys.argv[6]), int(sys.argv[7]))
        sys.exit(0)
    sys.exit(main())
