"""Conversion throughput in both directions vs a plain ``cp`` of the same files, and peak RSS vs model size.

Writes a synthetic HF checkpoint (random weights, exact HF names, several safetensors shards, written
tensor by tensor through ``hf_io.HFWriter`` — never a whole model in memory), either a Qwen3-style
model of about ``--size-gb`` GB or a full-size architecture preset (``--arch qwen2.5-7b``: 7.6 B
parameters, 15.2 GB in bf16), then in one run:
  * ``cp -r`` of the HF dir (baseline; before every run of every command the previous output is
    removed and ``sync`` flushes dirty pages; the copy is deleted before the conversions run),
  * streaming ``megatron-rl convert hf-to-mcore`` (default engine) as one process,
  * the same under ``torchrun --nproc_per_node=2 --tp 2`` (each rank writes half of the chunks;
    ``--skip-torchrun`` leaves it out),
  * the old model-building path (``--engine model``) as one process (``--skip-old`` leaves it out),
  * streaming ``megatron-rl convert mcore-to-hf`` of the converted checkpoint as one process,
  * an import-only child (python + torch + torch's DCP + the converter modules): the RSS / time floor,
  * the round-trip check: every tensor of the exported HF dir against the original, byte for byte
    (dtype, shape, bytes; read a piece at a time).

Time: wall clock of the child (interpreter start and imports included) and, for the streaming runs,
the converter's own log line ("streamed / exported ... in X s": after imports, until the rename).
Peak RSS: ``resource.getrusage(RUSAGE_CHILDREN).ru_maxrss`` read in a fresh wrapper process after it
has waited for the command: the kernel high-water mark of the largest single process of the tree
(under torchrun: the largest rank). Goals: hf->mcore >= 0.5x cp throughput, mcore->hf >= 0.3x cp,
peak RSS <= 0.3x the checkpoint in each direction.

    .venv/bin/python benchmarks/bench_convert.py [--size-gb 1.5 | --arch qwen2.5-7b] [--dtype bfloat16]
        [--keep DIR] [--skip-old] [--skip-torchrun] [--repeat 3]
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
ARCHS = {  # full-size presets: the real models' config.json shape facts
    "qwen2.5-7b": {"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "hidden_size": 3584,
                   "intermediate_size": 18944, "num_hidden_layers": 28, "num_attention_heads": 28,
                   "num_key_value_heads": 4, "vocab_size": 152064, "tie_word_embeddings": False,
                   "rms_norm_eps": 1e-6, "max_position_embeddings": 32768, "rope_theta": 1000000.0},
}


def sized_config(size_gb: float, itemsize: int) -> dict:
    """A Qwen3-style config of about ``size_gb`` GB."""
    h, ffn, heads, kv, hd, vocab = 2048, 5632, 16, 8, 128, 32000
    per_layer = (h * heads * hd + 2 * h * kv * hd + heads * hd * h + 3 * h * ffn) * itemsize
    layers = max(2, round((size_gb * 1e9 - vocab * h * itemsize) / per_layer))
    return {"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "hidden_size": h, "intermediate_size": ffn,
            "num_hidden_layers": layers, "num_attention_heads": heads, "num_key_value_heads": kv, "head_dim": hd,
            "vocab_size": vocab, "tie_word_embeddings": True, "rms_norm_eps": 1e-6, "max_position_embeddings": 4096,
            "rope_theta": 1000000.0}


def write_checkpoint(out: Path, cfg: dict, dtype_name: str) -> int:
    """Random weights for every tensor of ``cfg``'s name map, written tensor by tensor (rows filled in
    blocks: memory is one tensor). Returns the bytes of weights."""
    import torch

    from megatron_rl.convert.config_json import parse_dtype, with_dtype
    from megatron_rl.convert.hf_io import HFWriter
    from megatron_rl.convert.live import hf_tensor_meta
    from megatron_rl.models.provider import model_arch_info

    dtype = parse_dtype(dtype_name)
    out.mkdir(parents=True)
    (out / "config.json").write_text(json.dumps(with_dtype(cfg, dtype)))
    plan = hf_tensor_meta(model_arch_info(out), dtype)
    writer = HFWriter(out, plan, max_shard_bytes=4 << 30)
    g = torch.Generator().manual_seed(0)
    for name, _, shape in plan:
        t = torch.empty(shape, dtype=dtype)
        flat = t.view(shape[0], -1) if len(shape) > 1 else t.view(1, -1)
        step = max(1, (16 << 20) // max(1, flat.shape[1]))
        for r in range(0, flat.shape[0], step):
            flat[r:r + step] = torch.randn(flat[r:r + step].shape, generator=g) * 0.02
        writer.write(name, t)
        del t, flat
    writer.close()
    return writer.total_bytes


_WRAP = ("import json, resource, subprocess, sys, time; t = time.perf_counter(); "
         "p = subprocess.run(sys.argv[1:], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE); "
         "w = time.perf_counter() - t; sys.stderr.write(p.stderr.decode(errors='replace')); "
         "print(json.dumps({'rc': p.returncode, 'wall': w, "
         "'maxrss': resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024}))")


def measured(cmd: list[str], env=None) -> dict:
    """{"wall": s, "maxrss": bytes, "inner": s or None} of ``cmd`` run under a fresh wrapper process."""
    p = subprocess.run([sys.executable, "-c", _WRAP, *cmd], cwd=REPO, env={**os.environ, **(env or {})},
                       capture_output=True, text=True)
    res = json.loads(p.stdout.strip().splitlines()[-1])
    if res["rc"]:
        raise RuntimeError(f"{cmd} failed:\n{p.stderr[-3000:]}")
    m = re.search(r"(?:streamed|exported) .* in ([0-9.]+) s", p.stderr)
    res["inner"] = float(m.group(1)) if m else None
    return res


def best(cmd: list[str], repeat: int, env=None, before=None) -> dict:
    """Fastest of ``repeat`` runs (peak RSS: the largest seen)."""
    runs = []
    for _ in range(repeat):
        if before:
            before()
        runs.append(measured(cmd, env))
    r = min(runs, key=lambda r: r["wall"])
    return {**r, "maxrss": max(x["maxrss"] for x in runs),
            "inner": min((x["inner"] for x in runs if x["inner"] is not None), default=None)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--size-gb", type=float, default=1.5)
    ap.add_argument("--arch", choices=sorted(ARCHS), default=None, help="full-size preset instead of --size-gb")
    ap.add_argument("--dtype", default="bfloat16", help="the synthetic checkpoint's dtype")
    ap.add_argument("--keep", default=None, help="work dir (kept afterwards); default a temp dir, deleted")
    ap.add_argument("--repeat", type=int, default=None, help="runs per measurement (the fastest is reported); "
                    "default 3, 1 with --arch")
    ap.add_argument("--skip-old", action="store_true", help="leave out the model-building path (slow, ~5x RSS)")
    ap.add_argument("--skip-torchrun", action="store_true")
    a = ap.parse_args()
    repeat = a.repeat or (1 if a.arch else 3)
    root = Path(a.keep or tempfile.mkdtemp(prefix="bench_convert_"))
    hf = root / "hf"
    from megatron_rl.convert.config_json import parse_dtype

    itemsize = parse_dtype(a.dtype).itemsize
    cfg = ARCHS[a.arch] if a.arch else sized_config(a.size_gb, itemsize)
    done = root / "hf.done"   # --keep: a finished synthetic checkpoint of the same config is reused
    t0 = time.perf_counter()
    if done.is_file() and json.loads(done.read_text()) == {"cfg": cfg, "dtype": a.dtype}:
        from megatron_rl.convert.safetensors_index import SafetensorsIndex

        idx = SafetensorsIndex(hf)
        nbytes = sum(idx[n].nbytes for n in idx.names())
    else:
        done.unlink(missing_ok=True)
        shutil.rmtree(hf, ignore_errors=True)
        nbytes = write_checkpoint(hf, cfg, a.dtype)
        done.write_text(json.dumps({"cfg": cfg, "dtype": a.dtype}))
    files = list(hf.glob("*.safetensors"))
    print(f"synthetic {a.arch or 'Qwen3-style'} checkpoint: {nbytes / 1e9:.2f} GB {a.dtype} in {len(files)} shards "
          f"(ready in {time.perf_counter() - t0:.0f} s)", flush=True)
    py, env = sys.executable, {"OMP_NUM_THREADS": "1"}
    cp_out = root / "hf_copy"

    def fresh(path: Path):
        """Before each run: remove its output and flush dirty pages, so no run pays for another's writeback."""
        def f():
            shutil.rmtree(path, ignore_errors=True)
            os.sync()
        return f

    cp_cmd = ["cp", "-r", str(hf), str(cp_out)]
    cp = best(cp_cmd, repeat, before=fresh(cp_out))
    fresh(cp_out)()
    t_cp = cp["wall"]   # lowered below if the repeat after the conversions is faster
    gbps = lambda t: nbytes / t / 1e9  # noqa: E731

    def report(label: str, r: dict, per_rank: bool = False) -> None:
        inner = "" if r["inner"] is None else (f"  (conversion itself {r['inner']:5.2f} s = "
                                              f"{t_cp / r['inner']:.2f}x cp)")
        print(f"{label:34s}{r['wall']:6.2f} s  {gbps(r['wall']):5.2f} GB/s  throughput/cp = {t_cp / r['wall']:.2f}x"
              f"{inner}  peak RSS{' per rank' if per_rank else ''} = {r['maxrss'] / 1e9:.2f} GB = "
              f"{r['maxrss'] / nbytes:.3f}x checkpoint", flush=True)

    print(f"{'cp -r:':34s}{t_cp:6.2f} s  {gbps(t_cp):5.2f} GB/s", flush=True)
    floor_imports = ("import torch, torch.distributed.checkpoint, megatron_rl.convert.cli, "
                     "megatron_rl.convert.checkpoints, megatron_rl.convert.stream, megatron_rl.convert.export")
    floor = best([py, "-c", floor_imports], repeat, env)
    report("imports only (floor):", floor)
    conv = [py, "-m", "megatron_rl.convert.cli", "hf-to-mcore", "--hf", str(hf)]
    results = [("hf-to-mcore stream, 1 process:", best(conv + ["--out", str(root / "mc1")], repeat, env,
                                                         fresh(root / "mc1")))]
    report(*results[0])
    if not a.skip_torchrun:
        tr = [py, "-m", "torch.distributed.run", "--nproc_per_node=2", "--master_port=29533",
              "-m", "megatron_rl.convert.cli", "hf-to-mcore", "--hf", str(hf), "--tp", "2"]
        results.append(("hf-to-mcore stream, torchrun TP=2:", best(tr + ["--out", str(root / "mc2")], repeat, env,
                                                                    fresh(root / "mc2"))))
        report(*results[-1], True)
        fresh(root / "mc2")()
    if not a.skip_old:
        report("hf-to-mcore --engine model, 1 proc:", best(conv + ["--out", str(root / "mc0"), "--engine", "model"], 1,
                                                           env, fresh(root / "mc0")))
        fresh(root / "mc0")()
    back = root / "hf_back"
    exp = [py, "-m", "megatron_rl.convert.cli", "mcore-to-hf", "--ckpt", str(root / "mc1"), "--out", str(back)]
    to_hf = best(exp, repeat, env, fresh(back))
    fresh(root / "mc1")()
    # the baseline again, after the conversions (on a shared machine the load drifts): the faster counts
    cp2 = best(cp_cmd, repeat, before=fresh(cp_out))
    fresh(cp_out)()
    print(f"{'cp -r again:':34s}{cp2['wall']:6.2f} s  {gbps(cp2['wall']):5.2f} GB/s  (baseline = the faster: "
          f"{min(t_cp, cp2['wall']):.2f} s)", flush=True)
    t_cp = min(t_cp, cp2["wall"])
    for label, r in results:
        report(label, r)
    report("mcore-to-hf stream, 1 process:", to_hf)
    t0 = time.perf_counter()
    from megatron_rl.convert.safetensors_index import diff_tensors

    n, bad = diff_tensors(hf, back)
    print(f"round trip hf -> mcore -> hf: {n - len(bad)}/{n} tensors bit-identical (dtype, shape, bytes)"
          f"{'' if not bad else f'; DIFFERENT: {bad[:5]}'} (checked in {time.perf_counter() - t0:.0f} s)")
    print("goals: hf->mcore throughput >= 0.5x cp, mcore->hf >= 0.3x cp; peak RSS <= 0.3x checkpoint")
    fresh(back)()
    if not a.keep:
        shutil.rmtree(root, ignore_errors=True)
    if bad:
        sys.exit(1)


if __name__ == "__main__":
    main()
