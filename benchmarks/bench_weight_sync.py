"""Weight sync trainer -> vLLM engine actor vs one memcpy of the same bytes (same run).

Builds a Qwen3-style HF model of ``--mb`` MB (fp32), starts ONE vLLM (CPU build) engine as a Ray actor
on it, then times ``RolloutClient.update_weights`` (bucketing, ray.put, actor-side load_weights +
vLLM CPU re-pack of the linear weights) against a single ``torch.Tensor.copy_`` of the same total
bytes. Prints the ratio (goal: <= 2x the memcpy bound).

    .venv/bin/python benchmarks/bench_weight_sync.py [--mb 300] [--repeats 3]
"""
from __future__ import annotations

import argparse
import os
import tempfile
import time


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mb", type=int, default=300)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    import torch
    from safetensors.torch import load_file
    from transformers import Qwen3Config, Qwen3ForCausalLM

    from megatron_rl.rollout.ray_bridge import RolloutClient

    hidden = 1024
    per_layer = (4 * hidden * hidden + 3 * hidden * 2816) * 4
    layers = max(1, int(args.mb * 1e6 // per_layer))
    cfg = Qwen3Config(vocab_size=4096, hidden_size=hidden, intermediate_size=2816, num_hidden_layers=layers,
                      num_attention_heads=16, num_key_value_heads=16, head_dim=64, max_position_embeddings=256,
                      tie_word_embeddings=True, architectures=["Qwen3ForCausalLM"])
    d = tempfile.mkdtemp()
    Qwen3ForCausalLM(cfg).save_pretrained(d)
    w = load_file(os.path.join(d, "model.safetensors"))
    nbytes = sum(t.numel() * t.element_size() for t in w.values())
    client = RolloutClient("vllm", d, 1, {"max_model_len": 256, "kv_cache_gib": 1}, cpus_per_engine=1, threads_per_engine=2)
    client.update_weights(w.items())  # warm-up
    sync = []
    for _ in range(args.repeats):
        t0 = time.perf_counter()
        client.update_weights(w.items())
        sync.append(time.perf_counter() - t0)
    src = torch.empty(nbytes // 4)
    dst = torch.empty_like(src)
    dst.copy_(src)
    cp = []
    for _ in range(args.repeats):
        t0 = time.perf_counter()
        dst.copy_(src)
        cp.append(time.perf_counter() - t0)
    client.shutdown()
    s, c = min(sync), min(cp)
    print(f"model {nbytes / 1e6:.0f} MB ({layers} layers), 1 vLLM-CPU engine actor")
    print(f"weight sync (bucket+ray.put+load_weights+re-pack): {s * 1e3:.1f} ms = {nbytes / s / 1e9:.2f} GB/s")
    print(f"one memcpy of the same bytes:                       {c * 1e3:.1f} ms = {nbytes / c / 1e9:.2f} GB/s")
    print(f"ratio sync / memcpy = {s / c:.1f}x   (goal <= 2x)")


if __name__ == "__main__":
    main()
