"""HF -> Megatron conversion throughput vs a plain ``cp`` of the same files, and peak RSS vs model size.

Writes a synthetic Qwen3-style HF checkpoint (random fp32 weights, several safetensors shards,
written tensor by tensor — never a whole model in memory), then in the same run:
  * ``cp -r`` of the HF dir (baseline),
  * ``megatron-rl convert hf-to-mcore`` as one process, and under ``torchrun --nproc_per_node=2 --tp 2``,
timing each and sampling the peak RSS of the converting process tree (psutil, every 20 ms).

    .venv/bin/python benchmarks/bench_convert.py [--size-gb 1.5] [--keep DIR]
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
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


def timed(cmd: list[str], env=None) -> tuple[float, int]:
    """(wall seconds, peak summed RSS bytes of the process tree)."""
    import psutil

    t0 = time.perf_counter()
    p = subprocess.Popen(cmd, cwd=REPO, env={**os.environ, **(env or {})}, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    peak, stop = [0], threading.Event()

    def sample():
        proc = psutil.Process(p.pid)
        while not stop.is_set():
            try:
                tree = [proc] + proc.children(recursive=True)
                per = [q.memory_info().rss for q in tree]
                peak[0] = max(peak[0], max(per) if len(per) else 0) if "torch.distributed.run" in " ".join(cmd) else max(peak[0], sum(per))
            except psutil.Error:
                pass
            time.sleep(0.02)

    th = threading.Thread(target=sample, daemon=True)
    th.start()
    _, err = p.communicate()
    stop.set()
    th.join()
    if p.returncode:
        raise RuntimeError(f"{cmd} failed:\n{err.decode()[-3000:]}")
    return time.perf_counter() - t0, peak[0]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--size-gb", type=float, default=1.5)
    ap.add_argument("--keep", default=None)
    a = ap.parse_args()
    root = Path(a.keep or tempfile.mkdtemp(prefix="bench_convert_"))
    hf = root / "hf"
    if hf.exists():
        shutil.rmtree(hf)
    nbytes = write_checkpoint(hf, a.size_gb)
    files = list(hf.glob("*.safetensors"))
    print(f"synthetic Qwen3-style checkpoint: {nbytes / 1e9:.2f} GB in {len(files)} shards")
    t_cp, _ = timed(["cp", "-r", str(hf), str(root / "hf_copy")])
    gbps = lambda t: nbytes / t / 1e9  # noqa: E731
    print(f"cp -r:                         {t_cp:6.2f} s  {gbps(t_cp):5.2f} GB/s")
    env = {"OMP_NUM_THREADS": "1"}
    t1, rss1 = timed([sys.executable, "-m", "megatron_rl.convert.cli", "hf-to-mcore", "--hf", str(hf), "--out",
                      str(root / "mc1"), "--force"], env)
    print(f"hf-to-mcore, 1 process:        {t1:6.2f} s  {gbps(t1):5.2f} GB/s  throughput/cp = {t_cp / t1:.2f}x  "
          f"peak RSS = {rss1 / 1e9:.2f} GB = {rss1 / nbytes:.2f}x model")
    t2, rss2 = timed([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", "--master_port=29533",
                      "-m", "megatron_rl.convert.cli", "hf-to-mcore", "--hf", str(hf), "--out", str(root / "mc2"),
                      "--tp", "2", "--force"], env)
    print(f"hf-to-mcore, torchrun TP=2:    {t2:6.2f} s  {gbps(t2):5.2f} GB/s  throughput/cp = {t_cp / t2:.2f}x  "
          f"peak RSS per rank = {rss2 / 1e9:.2f} GB = {rss2 / nbytes:.2f}x model")
    print("goals: throughput >= 0.5x cp; peak RSS <= 0.3x model size")
    if not a.keep:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
