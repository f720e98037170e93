"""Worker of ``tests/e2e/test_streamed_push.py``: one real vLLM-CPU engine (``vllm`` in-process, or ``vllm-async``
with its spawned engine core) built on model A, pushed model B's weights through its in-process
``update_weights`` in small buckets, and what the test's oracle needs written to a JSON file.

    python streamed_push.py vllm|vllm-async OUT.json MODEL_A MODEL_B BUCKET_BYTES

A process of its own per engine: vLLM's import sets process-wide state (environment, the in-process engine
switch of the sync engine), and the async engine's core is spawned (hence the ``__main__`` guard).
"""
from __future__ import annotations

import json
import sys
import time

import torch

PREFIX = 300        # shared by the prompts: 2 KV blocks of vLLM-CPU's 128, cached under A before the push
MAX_LEN = 1024


def prompts(seed: int, k: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    prefix = [1] + torch.randint(3, 250, (PREFIX,), generator=g).tolist()
    return [prefix + torch.randint(3, 250, (5,), generator=g).tolist() for _ in range(k)]


def rows(comps) -> list[dict]:
    return [{"prompt": list(c.prompt_ids), "response": list(c.response_ids), "logprobs": [float(x) for x in c.logprobs],
             "versions": list(c.versions)} for c in comps]


def mismatches(held: dict, want: dict) -> list[str]:
    return sorted(n for n, t in want.items() if n not in held or not torch.equal(held[n], t))


def sync_engine(a: str, b: str, bucket: int) -> dict:
    from safetensors.torch import load_file

    from megatron_rl.rollout.engine import SamplingParams
    from megatron_rl.rollout.vllm_engine import VLLMEngine
    from megatron_rl.rollout.weight_sync import BucketPacker, RoundSource, update_info

    w_a, w_b = load_file(f"{a}/model.safetensors"), load_file(f"{b}/model.safetensors")
    eng = VLLMEngine(a, max_model_len=MAX_LEN, kv_cache_gib=0.25)
    ps = prompts(0, 4)
    eng.generate(ps[:2], SamplingParams(greedy=True, max_tokens=4))   # the shared prefix cached under A
    t0 = time.perf_counter()
    eng.update_weights(w_b.items(), bucket_bytes=bucket)
    push = {**eng.last_push, "wall_s": time.perf_counter() - t0}
    comps = eng.generate(ps, SamplingParams(n=2, max_tokens=24, seed=5))
    out = {"push": push, "comps": rows(comps), "bad_b": mismatches(eng.hf_named_parameters(), w_b)}

    # negative control: the same lifecycle with the two REUSED buffers of the transports' packer. vLLM's layerwise
    # reload keeps the views it was handed until a layer is complete (the padded-vocabulary embedding and lm_head:
    # until finish), so a later bucket overwrites them: what push_inline's buffer-per-bucket prevents
    src = RoundSource.from_tensors(w_a.items())
    eng.weight_transfer("start_weight_update")
    for _k, lo, hi, view in BucketPacker(src, bucket).buckets():
        eng.weight_transfer("update_weights", update_info={**update_info(src.metadata(), lo, hi), "buffer": view})
    eng.weight_transfer("finish_weight_update")
    out["bad_a_reused"] = mismatches(eng.hf_named_parameters(), w_a)
    eng.update_weights(w_a.items(), bucket_bytes=bucket)
    out["bad_a_streamed"] = mismatches(eng.hf_named_parameters(), w_a)
    eng.shutdown()
    return out


def async_engine(a: str, b: str, bucket: int) -> dict:
    import dataclasses
    import pickle

    from safetensors.torch import load_file
    from vllm.v1.serial_utils import MsgpackEncoder

    from megatron_rl.rollout.engine import SamplingParams
    from megatron_rl.rollout.vllm_async_engine import AsyncVLLMEngine, core_payload
    from megatron_rl.rollout.weight_sync import BucketPacker, RoundSource, update_info

    w_a, w_b = load_file(f"{a}/model.safetensors"), load_file(f"{b}/model.safetensors")
    eng = AsyncVLLMEngine(a, max_model_len=MAX_LEN, kv_cache_gib=0.25)
    try:
        ps = prompts(1, 4)
        eng.generate(ps[:2], SamplingParams(greedy=True, max_tokens=4))   # the shared prefix cached under A
        sp = SamplingParams(n=2, max_tokens=MAX_LEN - PREFIX - 16, seed=11)
        for k, p in enumerate(ps):
            eng.submit(k, p, dataclasses.replace(sp, seed=11 + k))
        time.sleep(0.3)
        t0 = time.perf_counter()
        eng.update_weights(w_b.items(), bucket_bytes=bucket)          # in flight: B, version 1
        push = {**eng.last_push, "wall_s": time.perf_counter() - t0}
        got = eng.harvest(wait_s=600, min_groups=len(ps))
        comps = [c for _k, cs in sorted(got, key=lambda kc: kc[0]) for c in cs]
        out = {"push": push, "comps": rows(comps), "bad_b": mismatches(eng.hf_named_parameters(), w_b),
               "stats": {k: v for k, v in eng.push_stats().items() if k != "busy_s"}}

        # the route CUDA IPC handles take into the engine core (core_payload -> the worker extension's
        # mrl_update_weights -> the worker's update_weights), driven here with CPU buckets: A again, version 2
        src = RoundSource.from_tensors(w_a.items())
        eng.weight_transfer("start_weight_update")
        try:
            for _k, lo, hi, view in BucketPacker(src, bucket, reuse=False).buckets():
                payload = {"payload": pickle.dumps({**update_info(src.metadata(), lo, hi), "buffer": view.clone()})}
                eng._rpc("mrl_update_weights", payload)
        finally:
            eng.weight_transfer("finish_weight_update")
        out["bad_a_pickled_route"] = mismatches(eng.hf_named_parameters(), w_a)

        # vLLM's own encoder (what carries a collective_rpc into the engine core): raw IPC handles are refused,
        # the adapted payloads are not
        raw = {"names": ["x"], "dtype_names": ["float32"], "shapes": [[4]], "tensor_sizes": [16],
               "ipc_handles": {"GPU-0": (torch.Tensor, torch.Size([4]), (1,), 0, torch.UntypedStorage, torch.float32,
                                         0, b"handle", 16, 0, False, b"ref", 0, b"event", True)}}
        enc = MsgpackEncoder()
        try:
            enc.encode(("update_weights", {"update_info": raw}))
            out["raw_ipc_refused"] = False
        except TypeError:
            out["raw_ipc_refused"] = True
        enc.encode(core_payload("update_weights", {"update_info": raw}))
        enc.encode(core_payload("update_weights", {"update_info": {**raw, "ipc_handles": None,
                                                                    "buffer": torch.zeros(64, dtype=torch.uint8)}}))
        return out
    finally:
        eng.shutdown()


if __name__ == "__main__":
    kind, path, model_a, model_b, bucket_bytes = sys.argv[1:6]
    res = (sync_engine if kind == "vllm" else async_engine)(model_a, model_b, int(bucket_bytes))
    with open(path, "w") as f:
        json.dump(res, f)
