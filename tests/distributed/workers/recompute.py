"""Worker (2 ranks, gloo): activation recompute reproduces the loss and every gradient of no recompute.

    torchrun --nproc_per_node=2 recompute.py HF_DIR OUT_JSON [BACKEND]

Layouts TP=2 (sequence parallel) and PP=2, each with ``model.recompute`` none / selective / full uniform
(1 layer per unit) / full block (1 layer): one ``train_step`` on a fixed batch from the same HF weights;
records the loss, the grad norm and every parameter's ``main_grad`` max |difference| against none, and
how often the first layer's core attention and MLP ran forward in the step (twice when recomputed).
"""
from __future__ import annotations

import json
import sys

import torch
import torch.distributed as dist

from tests.helpers.actor_common import fixed_batch, rl_loss

CASES = {"none": {}, "selective": {"recompute_granularity": "selective"},
         "full_uniform": {"recompute_granularity": "full", "recompute_method": "uniform", "recompute_num_layers": 1},
         "full_block": {"recompute_granularity": "full", "recompute_method": "block", "recompute_num_layers": 1}}


def step(hf_dir, tp, pp, recompute, backend="local"):
    from megatron_rl.models.provider import load_hf_config
    from megatron_rl.runtime.parallel import init_parallel
    from megatron_rl.trainer.policy.actor import PolicyActor
    from megatron_rl.trainer.policy.optim import OptimSpec

    info = init_parallel(tp, pp, seed=3, sequence_parallel=tp > 1)
    actor = PolicyActor(load_hf_config(hf_dir), info, OptimSpec(lr=1e-4, clip_grad=1e9), temperature=0.7,
                        sequence_parallel=tp > 1, recompute=recompute, backend=backend)
    actor.load_hf(hf_dir)
    batch = fixed_batch()
    batch.extras["old_logp"] = actor.forward_logprobs(batch, 4).logp.detach() - 0.05
    from megatron_rl.trainer.policy.actor import unwrap

    layer = unwrap(actor.chunks[0]).decoder.layers[0]            # forward calls in the step: 2x when recomputed
    calls = {"core_attn": 0, "mlp": 0}
    hooks = [layer.self_attention.core_attention.register_forward_hook(lambda *a: calls.__setitem__("core_attn", calls["core_attn"] + 1)),
             layer.mlp.register_forward_hook(lambda *a: calls.__setitem__("mlp", calls["mlp"] + 1))]
    res = actor.train_step(batch, rl_loss(), micro_batch_size=2)
    for h in hooks:
        h.remove()
    grads = {n: p.main_grad.detach().clone() for c in actor.chunks for n, p in c.named_parameters()}
    return res, grads, actor.config.recompute_granularity, calls


def main(hf_dir: str, out: str, backend: str = "local") -> None:
    from megatron_rl.runtime.parallel import destroy_parallel

    rec = {}
    for tp, pp in ((2, 1), (1, 2)):
        base, base_g, _, base_calls = step(hf_dir, tp, pp, {}, backend)
        for name, kw in CASES.items():
            res, g, gran, calls = step(hf_dir, tp, pp, kw, backend)
            worst = max(float((g[n] - base_g[n]).abs().max()) for n in base_g)
            t = torch.tensor([worst], dtype=torch.float64)
            dist.all_reduce(t, op=dist.ReduceOp.MAX)
            rec[f"tp{tp}pp{pp}/{name}"] = {"granularity": gran, "loss": res.loss, "base_loss": base.loss,
                                           "grad_norm": res.grad_norm, "base_grad_norm": base.grad_norm,
                                           "max_grad_diff": float(t), "n_grads": len(base_g),
                                           "calls": calls, "base_calls": base_calls}
        destroy_parallel()
    if dist.get_rank() == 0:
        with open(out, "w") as f:
            json.dump(rec, f)


if __name__ == "__main__":
    main(*sys.argv[1:4])
