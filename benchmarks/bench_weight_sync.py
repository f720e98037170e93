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

Then the engines' in-process push (``update_weights`` of ``vllm`` and ``vllm-async``: what the colocated
tests and any caller holding an engine use; issue 50), BEFORE vs AFTER in the same run, on the demo's model
(``megatron-rl demo``'s policy geometry, ~1 MB) and on the ``--mb`` model:

* before — the whole model packed into ONE buffer and cloned (the former ``weight_sync.pack_round``; for
  ``vllm-async`` sent as ``tobytes()``), one ``update_weights`` call;
* after — ``weight_sync.push_inline``: buckets of ``--bucket-mb``, each a buffer of its own.

Each (engine, model) runs in a child process of its own (a clean RSS baseline; vLLM's process-wide state);
peak transient = the peak private RSS (RSS − shared, sampled every 2 ms) of that process AND its children
(``vllm-async``'s engine core) above the start of the push, i.e. sender buffers plus what the engine allocates
to receive and load. Printed as after/before ratios of seconds and of peak bytes.

    .venv/bin/python benchmarks/bench_weight_sync.py [--mb 1100] [--bucket-mb 128] [--repeats 2]
    .venv/bin/python benchmarks/bench_weight_sync.py --inprocess-only [--mb 1100]   # the second table only
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from typing import Self

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


def make_demo_model(d: str) -> None:
    """The demo's policy geometry (``cli/demo.make_tiny_policy``: hidden 128, ffn 512, 2 layers, tied) with the
    chat fixture's 384-token vocabulary."""
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    cfg = Qwen3Config(vocab_size=384, hidden_size=128, intermediate_size=512, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, head_dim=32, max_position_embeddings=256, tie_word_embeddings=True,
                      architectures=["Qwen3ForCausalLM"])
    torch.manual_seed(0)
    Qwen3ForCausalLM(cfg).save_pretrained(d)


class TreeRSS:
    """Peak private RSS (RSS − shared) of this process plus its descendants, sampled every 2 ms, above the start."""

    def __enter__(self) -> Self:
        import psutil

        self._me, self._stop = psutil.Process(), False
        self.base = self.peak = self._now()
        self._t = threading.Thread(target=self._run, daemon=True)
        self._t.start()
        return self

    def _now(self) -> int:
        import psutil

        total = 0
        for p in [self._me, *self._me.children(recursive=True)]:
            try:
                m = p.memory_info()
            except psutil.Error:
                continue
            total += m.rss - m.shared
        return total

    def _run(self) -> None:
        while not self._stop:
            self.peak = max(self.peak, self._now())
            time.sleep(0.002)

    def __exit__(self, *exc) -> None:
        self._stop = True
        self._t.join()

    @property
    def extra(self) -> int:
        return self.peak - self.base


def whole_model_push(eng, kind: str, weights: dict) -> int:
    """The in-process push before issue 50: the whole model packed into one buffer (``pack_round``: a
    model-sized packing buffer, then a clone of it), in ONE ``update_weights`` call. Returns the bytes of
    packed buffers alive at once (the packing buffer and its clone)."""
    from megatron_rl.rollout.weight_sync import BucketPacker, RoundSource, update_info

    src = RoundSource.from_tensors(weights.items())
    packer = BucketPacker(src, max(1, src.total_bytes()))
    (buf,) = [view.clone() for _k, _lo, _hi, view in packer.buckets()]
    held = packer.peak_buffer_bytes + buf.numel()
    packer.close()
    info = {**update_info(src.metadata()), "buffer": buf}
    eng.weight_transfer("start_weight_update")
    try:
        if kind == "vllm-async":   # as it was sent then: a bytes copy through the engine core's msgpack
            eng._rpc("update_weights", {"update_info": {**info, "buffer": buf.numpy().tobytes()}})
        else:
            eng.weight_transfer("update_weights", update_info=info)
    finally:
        eng.weight_transfer("finish_weight_update")
    return held


def inprocess_child(kind: str, d: str, bucket: int, repeats: int) -> dict:
    """One engine of ``kind`` on model dir ``d``; best seconds and largest peak transient bytes per mode."""
    from safetensors.torch import load_file

    from megatron_rl.rollout.registry import make_engine

    w = load_file(os.path.join(d, "model.safetensors"))
    eng = make_engine(kind, d, max_model_len=256, kv_cache_gib=0.25)
    try:
        eng.update_weights(w.items(), bucket_bytes=bucket)   # warm-up
        whole_model_push(eng, kind, w)
        out = {"bytes": sum(t.numel() * t.element_size() for t in w.values())}
        for _ in range(repeats):
            for mode in ("after", "before"):
                with TreeRSS() as m:
                    t0 = time.perf_counter()
                    if mode == "after":
                        eng.update_weights(w.items(), bucket_bytes=bucket)
                        out["buckets"], held = eng.last_push["buckets"], eng.last_push["buffer_bytes"]
                    else:
                        held = whole_model_push(eng, kind, w)
                    wall = time.perf_counter() - t0
                r = out.setdefault(mode, {"s": wall, "peak": m.extra, "buffers": held})
                r["s"], r["peak"] = min(r["s"], wall), max(r["peak"], m.extra)
        return out
    finally:
        eng.shutdown()


def bench_inprocess(models: dict, bucket: int, repeats: int, engines: list[str]) -> None:
    rows = []
    for label, d in models.items():
        for kind in engines:
            p = subprocess.run([sys.executable, __file__, "--child", kind, d, str(bucket), str(repeats)],
                               capture_output=True, text=True, check=False,
                               env={**os.environ, "TOKENIZERS_PARALLELISM": "false"})
            if p.returncode != 0:
                raise SystemExit(f"in-process push, {kind} on {label}: child failed:\n{p.stderr[-3000:]}")
            rows.append((label, kind, json.loads(p.stdout.strip().splitlines()[-1])))
    print(f"\nin-process push (engine.update_weights), before = one whole-model buffer, after = {bucket >> 20} MB "
          "buckets; peak = private RSS of the process tree above the push's start")
    print(f"{'model':>10} {'MB':>6} {'engine':10} {'buckets':>7} {'before':>8} {'after':>8} {'s ratio':>8} "
          f"{'buffers before':>15} {'after':>9} {'ratio':>6} {'peak RSS before':>16} {'after':>9} {'ratio':>6}")
    for label, kind, r in rows:
        b, a = r["before"], r["after"]
        print(f"{label:>10} {r['bytes'] / 2**20:6.1f} {kind:10} {r['buckets']:7d} {b['s'] * 1e3:6.0f}ms {a['s'] * 1e3:6.0f}ms "
              f"{a['s'] / b['s']:7.2f}x {b['buffers'] / 2**20:13.1f}MB {a['buffers'] / 2**20:7.1f}MB "
              f"{a['buffers'] / b['buffers']:5.2f}x {b['peak'] / 2**20:14.1f}MB {a['peak'] / 2**20:7.1f}MB "
              + (f"{a['peak'] / b['peak']:5.2f}x" if b["peak"] >= 8 << 20 else "  n/a (below RSS resolution)"))
    print("ratio = after / before, same process, same run; buffers = packed buffers alive at once on the sending "
          "side (before: the model + its clone; after: the largest bucket); peak RSS adds what the engine allocates")


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        kind, d, bucket, repeats = sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
        print(json.dumps(inprocess_child(kind, d, bucket, repeats)))
        return
    ap = argparse.ArgumentParser()
    ap.add_argument("--mb", type=int, default=1100)
    ap.add_argument("--bucket-mb", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--backends", default="gloo,ray")
    ap.add_argument("--inprocess-engines", default="vllm,vllm-async")
    ap.add_argument("--inprocess-only", action="store_true", help="only the in-process push table")
    args = ap.parse_args()
    import torch
    from safetensors.torch import load_file

    d = tempfile.mkdtemp()
    layers = make_model(args.mb, d)
    if args.inprocess_only:
        demo = tempfile.mkdtemp()
        make_demo_model(demo)
        bench_inprocess({"demo": demo, f"{args.mb} MB": d}, args.bucket_mb << 20, args.repeats,
                        args.inprocess_engines.split(","))
        return
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
    if args.inprocess_engines:
        demo = tempfile.mkdtemp()
        make_demo_model(demo)
        bench_inprocess({"demo": demo, f"{args.mb} MB": d}, bucket, args.repeats, args.inprocess_engines.split(","))


if __name__ == "__main__":
    main()
