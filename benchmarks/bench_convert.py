"""HF -> Megatron conversion throughput vs a plain ``cp`` of the same files, and peak RSS vs model size.

Writes a synthetic Qwen3-style HF checkpoint (random fp32 weights, several safetensors shards,
written tensor by tensor — never a whole model in memory), then in one run:
  * ``cp -r`` of the HF dir (baseline; page cache warm for every run; before every run of every
    command the previous output is removed and ``sync`` flushes dirty pages),
  * streaming ``megatron-rl convert hf-to-mcore`` (default engine) as one process,
  * the same under ``torchrun --nproc_per_node=2 --tp 2`` (each rank writes half of the chunks),
  * the old model-building path (``--engine model``) as one process (``--skip-old`` leaves it out),
  * an import-only child (python + torch + torch's DCP + the converter modules): the RSS / time floor.

Time: wall clock of the child (interpreter start and imports included) and, for the streaming runs,
the converter's own log line ("streamed ... in X s": after imports, until the rename).
Peak RSS: ``resource.getrusage(RUSAGE_CHILDREN).ru_maxrss`` read in a fresh wrapper process after it
has waited for the command: the kernel high-water mark of the largest single process of the tree
(under torchrun: the largest rank). It includes file-backed pages mapped by the process (torch's
shared libraries); the streaming converter itself neither mmaps nor reads the weights into memory.

    .venv/bin/python benchmarks/bench_convert.py [--size-gb 1.5] [--keep DIR] [--skip-old] [--repeat 3]
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


def write_checkpoint(out: Path, size_gb: float) -> int:
    import torch
    from safetensors.torch import save_file

    h, ffn, heads, kv, hd, vocab = 2048, 5632, 16, 8, 128, 32000
    per_layer = (h * heads * hd + 2 * h * kv * hd + heads * hd * h + 3 * h * ffn) * 4
    layers = max(2, round((size_gb * 1e9 - vocab * h * 4) / per_layer))
    cfg = {"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "hidden_size": h, "intermediate_size": ffn,
           "num_hidden_layers": layers, "num_attention_heads": heads, "num_key_value_heads": kv, "head_dim": hd,
           "vocab_size": vocab, "tie_word_embeddings": True, "rms_norm_eps": 1e-6, "max_position_embeddings": 4096,
           "rope_theta": 1000000.0, "torch_dtype": "float32"}
    out.mkdir(parents=True)
    (out / "config.json").write_text(json.dumps(cfg))
    g = torch.Generator().manual_seed(0)
    shards, cur, size, total, weight_map = [], {}, 0, 0, {}

    def flush():
        nonlocal cur, size
        name = f"model-{len(shards) + 1:05d}.safetensors"
        save_file(cur, str(out / name))
        shards.append(name)
        weight_map.update({k: name for k in cur})
        cur, size = {}, 0

    def add(name, *shape):
        nonlocal size, total
        t = torch.randn(*shape, generator=g) * 0.02
        cur[name] = t
        size += t.numel() * 4
        total += t.numel() * 4
        if size > 400e6:
            flush()

    add("model.embed_tokens.weight", vocab, h)
    for i in range(layers):
        p = f"model.layers.{i}."
        add(p + "self_attn.q_proj.weight", heads * hd, h)
        add(p + "self_attn.k_proj.weight", kv * hd, h)
        add(p + "self_attn.v_proj.weight", kv * hd, h)
        add(p + "self_attn.o_proj.weight", h, heads * hd)
        add(p + "self_attn.q_norm.weight", hd)
        add(p + "self_attn.k_norm.weight", hd)
        add(p + "mlp.gate_proj.weight", ffn, h)
        add(p + "mlp.up_proj.weight", ffn, h)
        add(p + "mlp.down_proj.weight", h, ffn)
        add(p + "input_layernorm.weight", h)
        add(p + "post_attention_layernorm.weight", h)
    add("model.norm.weight", h)
    flush()
    (out / "model.safetensors.index.json").write_text(json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}))
    return total


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
    m = re.search(r"streamed .* in ([0-9.]+) s", p.stderr)
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
    ap.add_argument("--keep", default=None)
    ap.add_argument("--repeat", type=int, default=3, help="runs per measurement (the fastest is reported)")
    ap.add_argument("--skip-old", action="store_true", help="leave out the model-building path (slow, ~5x RSS)")
    ap.add_argument("--skip-torchrun", action="store_true")
    a = ap.parse_args()
    root = Path(a.keep or tempfile.mkdtemp(prefix="bench_convert_"))
    hf = root / "hf"
    if hf.exists():
        shutil.rmtree(hf)
    nbytes = write_checkpoint(hf, a.size_gb)
    files = list(hf.glob("*.safetensors"))
    print(f"synthetic Qwen3-style checkpoint: {nbytes / 1e9:.2f} GB in {len(files)} shards")
    py, env = sys.executable, {"OMP_NUM_THREADS": "1"}
    cp_out = root / "hf_copy"
    def fresh(path: Path):
        """Before each run: remove its output and flush dirty pages, so no run pays for another's writeback."""
        def f():
            shutil.rmtree(path, ignore_errors=True)
            os.sync()
        return f

    cp = best(["cp", "-r", str(hf), str(cp_out)], a.repeat, before=fresh(cp_out))
    t_cp = cp["wall"]
    gbps = lambda t: nbytes / t / 1e9  # noqa: E731

    def report(label: str, r: dict, per_rank: bool = False) -> None:
        inner = "" if r["inner"] is None else (f"  (conversion itself {r['inner']:5.2f} s = "
                                              f"{t_cp / r['inner']:.2f}x cp)")
        print(f"{label:34s}{r['wall']:6.2f} s  {gbps(r['wall']):5.2f} GB/s  throughput/cp = {t_cp / r['wall']:.2f}x"
              f"{inner}  peak RSS{' per rank' if per_rank else ''} = {r['maxrss'] / 1e9:.2f} GB = "
              f"{r['maxrss'] / nbytes:.2f}x model")

    print(f"{'cp -r:':34s}{t_cp:6.2f} s  {gbps(t_cp):5.2f} GB/s")
    floor = best([py, "-c", "import torch, torch.distributed.checkpoint, megatron_rl.convert.cli, "
                  "megatron_rl.convert.checkpoints, megatron_rl.convert.stream"], a.repeat, env)
    report("imports only (floor):", floor)
    conv = [py, "-m", "megatron_rl.convert.cli", "hf-to-mcore", "--hf", str(hf)]
    report("hf-to-mcore stream, 1 process:", best(conv + ["--out", str(root / "mc1")], a.repeat, env, fresh(root / "mc1")))
    if not a.skip_torchrun:
        tr = [py, "-m", "torch.distributed.run", "--nproc_per_node=2", "--master_port=29533",
              "-m", "megatron_rl.convert.cli", "hf-to-mcore", "--hf", str(hf), "--tp", "2"]
        report("hf-to-mcore stream, torchrun TP=2:", best(tr + ["--out", str(root / "mc2")], a.repeat, env,
                                                          fresh(root / "mc2")), True)
    if not a.skip_old:
        report("hf-to-mcore --engine model, 1 proc:", best(conv + ["--out", str(root / "mc0"), "--engine", "model"], 1,
                                                           env, fresh(root / "mc0")))
    print("goals: throughput >= 0.5x cp; peak RSS <= 0.3x model size")
    if not a.keep:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
