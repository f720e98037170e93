"""Weight sync trainer -> vLLM-CPU engine actor, every CPU backend, vs one memcpy of the same bytes.

Builds a Qwen3-style HF model of ``--mb`` MB (fp32, default 1100 MB), then for each backend (gloo,
ray) starts ONE vLLM (CPU build) engine as a Ray actor on it and times ``RolloutClient.
update_weights`` (after a warm-up round), split by stage:

* produce — the sender's iterator (here in-memory HF tensors: ~0; the TP/PP gather of a real
  trainer is not part of this benchmark),
* pack — copies into the two reusable bucket buffers,
* transfer — the rest of the sender's wall time (gloo broadcast / ``ray.put`` + waiting for the
  engine to take the bucket),
* engine load — vLLM's ``load_weights`` inside the layerwise reload, which also re-packs each layer
  for the CPU GEMM as soon as it is complete (vLLM interleaves the two; not separable without
  patching vLLM),
* engine finish — ``finalize_layerwise_reload`` (+ the tied-weight re-pack).

Ratio = (sender wall − engine load − engine finish) / one ``copy_`` of the same bytes measured in
the same run. The engine's receive overlaps its loading of the previous bucket, so the ratio is an
upper bound of the transport's own cost. Also prints the sender's peak extra private memory (RSS −
shared, sampled every 2 ms; asserted <= 2 buckets + 64 MB) and the shared pages it wrote (Ray's
object store for the ray backend).

    .venv/bin/python benchmarks/bench_weight_sync.py [--mb 1100] [--bucket-mb 128] [--repeats 2]
"""
from __future__ import annotations

import argparse
import os
import tempfile
import time

from megatron_rl.runtime.memwatch import PeakRSS


def make_model(mb: int, d: str) -> int:
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    hidden, ffn = 1024, 2816
    per_layer = (4 * hidden * hidden + 3 * hidden * ffn) * 4
    layers = max(1, int(mb * 1e6 // per_layer))
    cfg = Qwen3Config(vocab_size=4096, hidden_size=hidden, intermediate_size=ffn, num_hidden_layers=layers,
                      num_attention_heads=16, num_key_value_heads=16, head_dim=64, max_position_embeddings=256,
                      tie_word_embeddings=True, architectures=["Qwen3ForCausalLM"])
    torch.manual_seed(0)
    Qwen3ForCausalLM(cfg).save_pretrained(d)
    return layers


def bench_backend(backend: str, d: str, weights: dict, bucket: int, repeats: int) -> dict:
    from megatron_rl.rollout.client import RolloutClient
    from megatron_rl.rollout.weight_sync import RoundSource

    client = RolloutClient("vllm", d, 1, {"max_model_len": 256, "kv_cache_gib": 1}, cpus_per_engine=1,
                           threads_per_engine=2, sync_backend=backend, bucket_bytes=bucket)
    try:
        client.update_weights(RoundSource.from_tensors(weights.items()))  # warm-up (opens the group)
        client.engine_transfer_stats()
        best = None
        for _ in range(repeats):
            with PeakRSS() as rss:
                t0 = time.perf_counter()
                client.update_weights(RoundSource.from_tensors(weights.items()))
                wall = time.perf_counter() - t0
            eng = client.engine_transfer_stats()[0]
            row = {**client.last_sync, "wall_s": wall, "rss_extra": rss.peak - rss.base,
                   "shm_extra": rss.shared_peak - rss.shared_base, **eng}
            if best is None or wall < best["wall_s"]:
                best = row
        return best
    finally:
        client.shutdown()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mb", type=int, default=1100)
    ap.add_argument("--bucket-mb", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--backends", default="gloo,ray")
    args = ap.parse_args()
    import torch
    from safetensors.torch import load_file

    d = tempfile.mkdtemp()
    layers = make_model(args.mb, d)
    w = load_file(os.path.join(d, "model.safetensors"))
    nbytes = sum(t.numel() * t.element_size() for t in w.values())
    bucket = args.bucket_mb << 20
    rows = {b: bench_backend(b, d, w, bucket, args.repeats) for b in args.backends.split(",")}
    src = torch.ones(nbytes // 4)
    dst = torch.zeros_like(src)
    cp = []
    for _ in range(max(3, args.repeats)):
        t0 = time.perf_counter()
        dst.copy_(src)
        cp.append(time.perf_counter() - t0)
    c = min(cp)
    print(f"model {nbytes / 1e6:.0f} MB ({layers} layers, fp32), 1 vLLM-CPU engine actor per backend, "
          f"bucket {args.bucket_mb} MB; one memcpy of the same bytes: {c * 1e3:.1f} ms ({nbytes / c / 1e9:.1f} GB/s)")
    print(f"{'backend':8} {'wall':>8} {'produce':>8} {'pack':>8} {'transfer':>9} {'eng.recv':>9} {'eng.load':>9} "
          f"{'eng.fin':>8} {'transport/memcpy':>17} {'sender +private':>16} {'+shared':>8} {'2 buckets':>10}")
    for b, r in rows.items():
        transport = r["wall_s"] - r["load_s"] - r["finish_s"]
        print(f"{b:8} {r['wall_s'] * 1e3:7.0f}ms {r['produce_s'] * 1e3:7.0f}ms {r['pack_s'] * 1e3:7.0f}ms "
              f"{r['transfer_s'] * 1e3:8.0f}ms {r['recv_s'] * 1e3:8.0f}ms {r['load_s'] * 1e3:8.0f}ms "
              f"{r['finish_s'] * 1e3:7.0f}ms {transport / c:16.1f}x {r['rss_extra'] / 2**20:14.0f}MB "
              f"{r['shm_extra'] / 2**20:6.0f}MB {2 * bucket / 2**20:8.0f}MB")
        if r["rss_extra"] > 2 * bucket + (64 << 20):
            raise SystemExit(f"{b}: sender peak extra private memory {r['rss_extra'] / 2**20:.0f} MB exceeds 2 buckets + 64 MB")
    print("transport = wall - engine load - engine finish (the engine's receive overlaps its loading); "
          "+shared = object-store pages the sender wrote (ray: <= 2 buckets in flight)")


if __name__ == "__main__":
    main()
