"""Worker (2 ranks, 2 GPUs, NCCL, Transformer Engine): context parallelism 2 reproduces CP 1.

    torchrun --nproc_per_node=2 context_parallel_te.py HF_DIR OUT_JSON

For CP 1 (DP 2) and CP 2 (DP 1) from the same HF weights (fp32, TE layers): packed log-probs (token budget)
and padded, masked top-k support (the teacher passes' path) of a fixed batch, then one ``train_step``
on packed micro-batches; records them for the test to compare (rank 0 writes). GPU only: not run on the
CPU development machine.
"""
from __future__ import annotations

import json
import sys

import torch.distributed as dist

from tests.helpers.actor_common import fixed_batch, rl_loss


def run(hf_dir: str, cp: int) -> dict:
    from megatron_rl.models.provider import load_hf_config
    from megatron_rl.runtime.parallel import destroy_parallel, init_parallel
    from megatron_rl.trainer.policy.actor import PolicyActor
    from megatron_rl.trainer.policy.optim import OptimSpec
    from megatron_rl.trainer.pipeline.packing import TokenBudget

    info = init_parallel(1, 1, seed=3, cp=cp)
    actor = PolicyActor(load_hf_config(hf_dir), info, OptimSpec(lr=1e-4, clip_grad=1e9), temperature=0.7, backend="te")
    actor.load_hf(hf_dir)
    batch = fixed_batch()
    budget = TokenBudget(64, 8)
    logp = actor.forward_logprobs(batch, budget).logp.detach()
    sup = actor.forward_support(batch, 4, k=3, masked=True)
    batch.extras["old_logp"] = logp - 0.05
    res = actor.train_step(batch, rl_loss(), micro_batch_size=budget)
    out = {"logp": (logp * batch.loss_mask).cpu().tolist(),
           "support_logp": (sup["token_logp"] * batch.loss_mask).cpu().tolist(),
           "loss": res.loss, "grad_norm": res.grad_norm, "normaliser": res.normaliser}
    destroy_parallel()
    return out


def main(hf_dir: str, out: str) -> None:
    rec = {f"cp{cp}": run(hf_dir, cp) for cp in (1, 2)}
    if dist.get_rank() == 0:
        with open(out, "w") as f:
            json.dump(rec, f)


if __name__ == "__main__":
    main(*sys.argv[1:3])
