"""The GPU bring-up's stages in one process (``tools/gpu_check.sh`` runs it; ``docs/gpu-status.md``).

    python tools/gpu_check_run.py --out DIR --work DIR [--shape qwen3-1.7b] [--seq-len 2048] [--rows 8] ...

Stages, in order, each appending its record to ``OUT/gpu_check.json`` as it finishes (rewritten whole and
atomically, so a run killed at any point still returns every finished stage):

``env``        device, torch / CUDA, the stack against the supported versions, Transformer Engine's import,
               the layer backend ``auto`` resolves to, the patches applied;
``checkpoint`` a random HF checkpoint of ``--shape`` drawn on the device in bf16 (``WORK/model``);
``actor``      the policy in bf16 with the distributed optimizer at DP = 1, and the reference;
``roundtrip``  HF -> Megatron -> HF bit for bit;
``parity``     per-token log-probs against HF transformers on the same device, fp32 and bf16;
``train``      ``--steps`` optimizer steps: tokens/s, model FLOP/s, MFU, the device peak beside ``plan``'s;
``scores``     bytes per S x S attention score element that autograd keeps, measured, beside ``plan``'s;
``export``     the trained weights as HF safetensors (``WORK/export``), loaded back bit for bit;
``offload``    ``offload("all")`` / ``onload()`` at full size: bytes, seconds, host memory, bit for bit;
``ipc``        packed weight buckets handed to a second process (CUDA IPC on a GPU);

then, with the models above released (:data:`LATE`):

``train_step`` one ``megatron-rl train`` step in its own process, world 1, the HF engine, a tiny model (the
               path of review row B1: start-up probe, μ pass, the update's frames); skipped where Ray is missing;
``mu_pass``    time and peak memory of the μ pass (``vocab_parallel_sampled_logprobs``, top-k 20 / top-p 0.95) on
               one 8192 x 151936 fp32 shard (256 rows on CPU), beside the plain log-prob pass;
``tests``      ``pytest tests/gpu`` with the time left of ``--budget-s``.

A stage whose inputs a failed stage did not make is recorded as skipped; a stage past ``--budget-s`` too; both
fail the run. A stage that needs what this machine lacks (``train_step``: Ray) records ``skipped`` with the
reason and ``ok`` true: not run, not a failure. ``--only`` runs the named stages alone (the others are not
recorded).
Big files (the checkpoints) go to ``--work``, never to ``--out``, which holds only small files (the JSON, the
tests' log). Exit status 0 when every stage is ok, 1 otherwise.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
import time
import traceback
from pathlib import Path

TOOLS = Path(__file__).resolve().parent
sys.path[:0] = [str(TOOLS.parent), str(TOOLS)]     # the checkout (not installed) and these modules

import gpu_check_moves as moves  # noqa: E402
import gpu_check_stages as stages  # noqa: E402

#: (name, function, what it needs from earlier stages)
PLAN = (("env", stages.stage_env, ()), ("checkpoint", stages.stage_checkpoint, ("info",)),
        ("actor", stages.stage_actor, ("hf_dir",)), ("roundtrip", stages.stage_roundtrip, ("actor",)),
        ("parity", stages.stage_parity, ("actor",)), ("train", stages.stage_train, ("actor",)),
        ("scores", stages.stage_scores, ("actor",)), ("export", moves.stage_export, ("trained",)),
        ("offload", moves.stage_offload, ("actor",)), ("ipc", moves.stage_ipc, ("actor",)))
#: after the models of :data:`PLAN` are released, before ``tests`` (need nothing of the earlier stages)
LATE = (("train_step", stages.stage_train_step, ()), ("mu_pass", stages.stage_mu_pass, ()))
#: every stage, in order
STAGES = tuple(n for n, _, _ in PLAN + LATE) + ("tests",)


class Record:
    """``OUT/gpu_check.json``: the run's settings and one entry per finished stage, rewritten atomically."""

    def __init__(self, path: Path, args: dict):
        self.path = path
        self.data = {"started": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                     "args": args, "stages": []}
        self._write()

    def add(self, rec: dict) -> None:
        self.data["stages"].append(rec)
        self._write()

    def _write(self) -> None:
        tmp = self.path.with_name(self.path.name + ".tmp")
        tmp.write_text(json.dumps(self.data, indent=1, default=str))
        os.replace(tmp, self.path)


def run_stage(record: Record, name: str, fn, state: dict, needs: tuple, deadline: float) -> bool:
    """Run one stage into ``record``; False when it failed or was skipped."""
    missing = [n for n in needs if n not in state]
    if missing or time.monotonic() > deadline:
        why = f"needs {', '.join(missing)} (an earlier stage failed)" if missing else "over --budget-s"
        record.add({"stage": name, "ok": False, "skipped": why})
        print(f"[gpu-check] {name}: skipped ({why})", flush=True)
        return False
    t0 = time.perf_counter()
    try:
        out = dict(fn(state) or {})
    except Exception as e:   # the stage's failure is its record; later stages still run where they can
        first = str(e).splitlines()[0] if str(e) else ""
        out = {"ok": False, "error": f"{type(e).__name__}: {first}",
               "traceback": traceback.format_exc().splitlines()[-8:]}
    ok = bool(out.pop("ok", True))
    rec = {"stage": name, "ok": ok, "seconds": round(time.perf_counter() - t0, 2), **out}
    record.add(rec)
    said = "FAILED" if not ok else "skipped" if isinstance(rec.get("skipped"), str) else "ok"
    shown = {k: v for k, v in rec.items() if k not in ("stage", "ok", "traceback")}
    shown = {**{k: shown.pop(k) for k in ("error", "skipped") if k in shown}, **shown}   # the why first
    print(f"[gpu-check] {name}: {said} " + json.dumps(shown, default=str)[:600], flush=True)
    return ok


def parse(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True, help="small results: gpu_check.json, tests_gpu.log")
    p.add_argument("--work", required=True, help="big files: the random checkpoint, the export (not --out)")
    p.add_argument("--shape", default="qwen3-1.7b", help="a preset of megatron_rl/planning/arch.py, or tiny")
    p.add_argument("--seq-len", type=int, default=2048, help="tokens per training row (local attention: 6 B per "
                   "S x S element per layer; 2048 keeps Qwen3-1.7B at ~50 GiB by plan, 4096 would not fit 80 GB)")
    p.add_argument("--rows", type=int, default=8, help="rows per optimizer step (one per micro-batch)")
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--recompute", choices=("none", "selective", "full"), default="none")
    p.add_argument("--parity-len", type=int, default=512, help="tokens per row of the parity check")
    p.add_argument("--score-len", type=int, default=256, help="shortest row of the attention-score measurement")
    p.add_argument("--tol-fp32", type=float, default=2e-3, help="max |log-prob difference| vs HF in fp32")
    p.add_argument("--tol-bf16", type=float, default=0.1, help="max |log-prob difference| vs HF in bf16")
    p.add_argument("--bucket-mib", type=int, default=512, help="bucket size of the IPC hand-off")
    p.add_argument("--ipc-timeout", type=float, default=120.0, help="seconds to wait for one bucket's answer")
    p.add_argument("--budget-s", type=float, default=480.0, help="no stage starts after this many seconds")
    p.add_argument("--no-tests", dest="tests", action="store_false", help="skip the tests/gpu stage")
    p.add_argument("--train-step-timeout", type=float, default=300.0, help="seconds the train_step command may run")
    p.add_argument("--mu-rows", type=int, default=0, help="rows of the mu_pass shard (0: 8192 on CUDA, 256 on CPU)")
    p.add_argument("--mu-vocab", type=int, default=151936, help="vocabulary columns of the mu_pass shard")
    p.add_argument("--mu-repeats", type=int, default=3, help="timed repeats of each mu_pass pass (after a warm-up)")
    p.add_argument("--only", default="", help=f"comma-separated stages to run alone, of: {','.join(STAGES)}")
    a = p.parse_args(argv)
    for k in ("seq_len", "rows", "steps", "parity_len", "score_len", "bucket_mib", "mu_vocab", "mu_repeats"):
        if getattr(a, k) < (2 if k in ("seq_len", "parity_len", "score_len") else 1):
            p.error(f"--{k.replace('_', '-')} must be positive (got {getattr(a, k)})")
    if a.mu_rows < 0:
        p.error(f"--mu-rows must be positive, or 0 for the default (got {a.mu_rows})")
    a.only = tuple(x for x in a.only.split(",") if x)
    if unknown := [x for x in a.only if x not in STAGES]:
        p.error(f"--only: unknown stage(s) {','.join(unknown)}; stages: {','.join(STAGES)}")
    return a


def main(argv=None) -> int:
    a = parse(argv)
    out, work = Path(a.out), Path(a.work)
    out.mkdir(parents=True, exist_ok=True)
    work.mkdir(parents=True, exist_ok=True)
    record = Record(out / "gpu_check.json", vars(a))
    deadline = time.monotonic() + a.budget_s
    state: dict = {}

    def wanted(name: str) -> bool:
        return not a.only or name in a.only

    for name, fn, needs in PLAN:
        if wanted(name):
            run_stage(record, name, lambda s, fn=fn: fn(s, a), state, needs, deadline)
    cuda = state.get("cuda")
    state.clear()                          # the models go before the train step's and the tests' processes
    import gc

    gc.collect()
    stages.release_memory()
    if cuda is not None:
        state["cuda"] = cuda
    else:                                  # (env did not run: --only)
        from megatron_rl.runtime.device import has_cuda

        state["cuda"] = has_cuda()
    for name, fn, needs in LATE:
        if wanted(name):
            run_stage(record, name, lambda s, fn=fn: fn(s, a), state, needs, deadline)
    if a.tests and wanted("tests"):
        run_stage(record, "tests", lambda s: moves.stage_tests(s, a, deadline - time.monotonic()), state, (), deadline)
    recs = record.data["stages"]
    ok = all(r["ok"] for r in recs)
    skipped = [r["stage"] for r in recs if r["ok"] and isinstance(r.get("skipped"), str)]
    print(f"[gpu-check] {'all stages ok' if ok else 'FAILED: ' + ', '.join(r['stage'] for r in recs if not r['ok'])}"
          f"{' (skipped: ' + ', '.join(skipped) + ')' if skipped else ''}; record: {out / 'gpu_check.json'}", flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
