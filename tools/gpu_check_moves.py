"""The bring-up's stages that move the trained weights (``tools/gpu_check_run.py``): the HF export read back,
offload / onload at full size, the packed-bucket hand-off to a second process, then ``tests/gpu/``.
Same contract as ``gpu_check_stages.py``: ``fn(state, args) -> record``.
Each stage imports the package inside its function on purpose: an import error (a module that moved, a
package the lent machine lacks) then fails that stage alone, with its line in the record.
"""
from __future__ import annotations

import os
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path

import torch

from gpu_check_ipc import fingerprint, receiver

GIB = 1 << 30
REPO = Path(__file__).resolve().parents[1]


def _named_params(model) -> dict[str, torch.Tensor]:
    from megatron_rl.trainer.policy.chunks import unwrap

    return {f"{i}.{n}": p for i, c in enumerate(model.chunks) for n, p in unwrap(c).named_parameters()}


def stage_export(state: dict, a) -> dict:
    """The trained weights exported as an HF checkpoint (``WORK/export``) and loaded back into the reference:
    every parameter equals the actor's bit for bit (Megatron -> HF -> Megatron)."""
    out = Path(a.work) / "export"
    t0 = time.perf_counter()
    state["actor"].export_hf(str(out))
    written = time.perf_counter() - t0
    state["ref"].load_hf(str(out))
    mine, back = _named_params(state["actor"]), _named_params(state["ref"])
    bad = [n for n, p in mine.items() if n not in back or not torch.equal(p.detach(), back[n].detach())]
    size = sum(f.stat().st_size for f in out.glob("*.safetensors"))
    return {"tensors": len(mine), "mismatched": bad[:10], "bytes": size, "write_s": round(written, 2), "ok": not bad}


def _score_buffer_bytes() -> int:
    from megatron.core import parallel_state as ps

    holder = getattr(ps, "_GLOBAL_MEMORY_BUFFER", None)
    return sum(t.numel() * t.element_size() for t in getattr(holder, "buffer", {}).values()) if holder else 0


def _state_fingerprints(actor) -> list[tuple[int, int]]:
    """Fingerprints of everything ``offload("all")`` parks: parameters, grad buffers, optimizer state."""
    from megatron_rl.trainer.policy.offload import trainer_tensors

    moved, _ = trainer_tensors("all", actor.optimizer, actor.chunks)
    seen, out = set(), []
    for t in moved:
        key = (t.untyped_storage().data_ptr(), t.storage_offset(), t.numel())
        if key not in seen and t.numel():
            seen.add(key)
            out.append(fingerprint(t.detach().reshape(-1).view(torch.uint8)))
    return out


def stage_offload(state: dict, a) -> dict:
    """``offload("all")`` and ``onload()`` at full size: bytes moved, seconds, device memory before / after,
    the host's resident memory, megatron's score buffer dropped, and the state back bit for bit."""
    import psutil

    from megatron_rl.runtime.device import memory_allocated, synchronize

    actor, proc = state["actor"], psutil.Process()
    before_fp = _state_fingerprints(actor)
    rec = {"allocated_before_gib": round(memory_allocated() / GIB, 3), "rss_before_gib": round(proc.memory_info().rss / GIB, 3),
           "score_buffer_before": _score_buffer_bytes()}
    t0 = time.perf_counter()
    moved = actor.offload("all")
    synchronize()
    rec.update(offload_s=round(time.perf_counter() - t0, 3), moved_gib=round(moved / GIB, 3),
               allocated_offloaded_gib=round(memory_allocated() / GIB, 3), score_buffer_after=_score_buffer_bytes(),
               rss_offloaded_gib=round(proc.memory_info().rss / GIB, 3))
    t0 = time.perf_counter()
    back = actor.onload()
    synchronize()
    rec.update(onload_s=round(time.perf_counter() - t0, 3), restored_gib=round(back / GIB, 3),
               allocated_after_gib=round(memory_allocated() / GIB, 3))
    rec["bitwise"] = _state_fingerprints(actor) == before_fp
    rec["ok"] = rec["bitwise"] and moved == back and moved > 0 and rec["score_buffer_after"] == 0
    return rec


def stage_ipc(state: dict, a) -> dict:
    """The actor's HF weights packed into ``--bucket-mib`` device buckets and handed, one by one, to a spawned
    process through ``torch.multiprocessing`` (CUDA IPC on a GPU, shared memory on CPU): its fingerprint of
    every bucket equals the sender's (``gpu_check_ipc.py``)."""
    import torch.multiprocessing as mp

    from megatron_rl.rollout.weight_sync import BucketPacker, RoundSource
    from megatron_rl.runtime.device import default_device

    dev = default_device()
    source = RoundSource.from_tensors(state["actor"].hf_weights())
    packer = BucketPacker(source, a.bucket_mib << 20, alloc=lambda n: torch.empty(n, dtype=torch.uint8, device=dev))
    ctx = mp.get_context("spawn")
    inbox, outbox = ctx.Queue(), ctx.Queue()
    child = ctx.Process(target=receiver, args=(inbox, outbox), daemon=True)
    child.start()
    bad, where, sent, t0 = [], set(), 0, time.perf_counter()
    try:
        for k, _lo, _hi, view in packer.buckets():
            mine = fingerprint(view)
            inbox.put((k, view))
            got_k, theirs, dev_name = outbox.get(timeout=a.ipc_timeout)
            where.add(dev_name)
            sent += view.numel()
            if got_k != k or theirs != mine:
                bad.append(k)
        seconds = time.perf_counter() - t0
    finally:
        inbox.put(None)
        child.join(timeout=60)
        packer.close()
    return {"buckets": len(packer.plan), "bytes": sent, "seconds": round(seconds, 3),
            "gib_per_s": round(sent / GIB / seconds, 2) if seconds else None, "receiver_device": sorted(where),
            "mismatched_buckets": bad, "ok": not bad and child.exitcode == 0}


def stage_tests(state: dict, a, timeout_s: float) -> dict:
    """``pytest tests/gpu`` in a subprocess (this environment), at most ``timeout_s``: counts, failures, skips."""
    junit = Path(a.work) / "tests_gpu.xml"
    log = Path(a.out) / "tests_gpu.log"
    cmd = [sys.executable, "-m", "pytest", str(REPO / "tests" / "gpu"), "-q", "-rs", "-p", "no:cacheprovider",
           f"--junitxml={junit}", "-o", "junit_family=xunit1"]
    with open(log, "w") as f:
        try:
            rc = subprocess.run(cmd, cwd=REPO, stdout=f, stderr=subprocess.STDOUT, timeout=max(timeout_s, 1),
                                env={**os.environ, "PYTHONUNBUFFERED": "1"}).returncode
        except subprocess.TimeoutExpired:
            return {"ok": False, "error": f"tests/gpu ran past {timeout_s:.0f} s (see tests_gpu.log)"}
    if not junit.is_file():
        return {"ok": False, "exit_status": rc, "error": "pytest wrote no report (see tests_gpu.log)"}
    root = ET.parse(junit).getroot()
    cases = list(root.iter("testcase"))
    failed = [f"{c.get('classname')}::{c.get('name')}" for c in cases if c.find("failure") is not None or c.find("error") is not None]
    skipped = sorted({(c.find("skipped").get("message") or "")[:120] for c in cases if c.find("skipped") is not None})
    passed = len(cases) - len(failed) - sum(c.find("skipped") is not None for c in cases)
    return {"exit_status": rc, "tests": len(cases), "passed": passed, "failed": failed,
            "skipped": sum(c.find("skipped") is not None for c in cases), "skip_reasons": skipped,
            "ok": rc in (0, 5) and not failed}
