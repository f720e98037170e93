"""Worker: build every model the trainer builds and record where each tensor lives.

    python -m torch.distributed.run --nproc_per_node=1 model_device.py HF_DIR OUT_JSON

Cases (one process, one layout, TP=PP=1): the policy with the distributed optimizer on and off, each
in fp32 and bf16 (megatron's ``Float16Module`` + fp32 main params); the reference built from the HF
dir (``setup_run``'s way) and from the actor (``ReferencePolicy.from_actor``); the teacher's shadow
weights in snapshot and EMA mode. For each case: the trainer device (``megatron_rl.runtime.device``), every
parameter / buffer / optimizer main parameter / shadow tensor NOT on it, how many were checked, the
``use_cpu_initialization`` the build used, and a forward of the reference on a fixed batch (a model
left on the host fails there on CUDA).
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import torch


def _tensors(actor_like) -> list[tuple[str, torch.Tensor]]:
    out = []
    for i, c in enumerate(actor_like.chunks):
        out += [(f"chunk{i}.param.{n}", p) for n, p in c.named_parameters()]
        out += [(f"chunk{i}.buffer.{n}", b) for n, b in c.named_buffers()]
    opt = getattr(actor_like, "optimizer", None)
    if opt is not None:
        for k, g in enumerate(opt.param_groups):
            out += [(f"optimizer.group{k}.{j}", p) for j, p in enumerate(g["params"])]
    return out


def _record(name: str, tensors, dev: torch.device, config=None) -> dict:
    off = [f"{n}@{t.device}" for n, t in tensors if t.device != dev]
    rec = {"case": name, "checked": len(tensors), "off_device": off[:20], "n_off": len(off)}
    if config is not None:
        rec["use_cpu_initialization"] = bool(config.use_cpu_initialization)
    return rec


def main(hf_dir: str, out: str) -> None:
    from megatron_rl.models.provider import load_hf_config
    from megatron_rl.runtime.device import default_device, max_memory_allocated
    from megatron_rl.runtime.parallel import init_parallel
    from megatron_rl.trainer.policy.actor import PolicyActor, ReferencePolicy
    from megatron_rl.trainer.policy.optim import OptimSpec
    from megatron_rl.trainer.paths.teacher.weights import TeacherWeights
    from tests.helpers.actor_common import fixed_batch

    info = init_parallel(1, 1, seed=7)
    hf = load_hf_config(hf_dir)
    dev = default_device()
    recs = []
    batch = fixed_batch()
    for distopt in (True, False):
        for bf16 in (False, True):
            spec = OptimSpec(lr=1e-4, use_distributed_optimizer=distopt, bf16=bf16)
            actor = PolicyActor(hf, info, spec, temperature=1.0)
            actor.load_hf(hf_dir)
            tag = f"actor[distopt={int(distopt)},bf16={int(bf16)}]"
            recs.append(_record(tag, _tensors(actor), dev, actor.config))
            if distopt and not bf16:
                ref = ReferencePolicy(hf, 1.0, parallel_info=info)
                ref.load_hf(hf_dir)
                lp = ref.forward_logprobs(batch, 4).logp
                recs.append({**_record("reference[load_hf]", _tensors(ref), dev, ref.config),
                             "logp_sum": float(lp.sum())})
                for mode in ("snapshot", "ema"):
                    t = TeacherWeights(actor, mode)
                    recs.append(_record(f"teacher[{mode}]", [(f"shadow.{i}", s) for i, s in enumerate(t.shadow)], dev))
            if not distopt and bf16:
                ref = ReferencePolicy.from_actor(actor)
                ref.forward_logprobs(batch, 4)
                recs.append(_record("reference[from_actor,bf16]", _tensors(ref), dev, ref.config))
            del actor
    Path(out).write_text(json.dumps({"device": str(dev), "records": recs, "max_memory_allocated": max_memory_allocated()}))


if __name__ == "__main__":
    main(*sys.argv[1:3])
