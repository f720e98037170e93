"""Worker (1 rank, CUDA): trainer.offload on the GPU. For each mode (bf16, distributed optimizer,
after two steps so Adam state exists): ``torch.cuda.memory_allocated`` drops by the bytes parked,
the reserved pool shrinks (the freed blocks go back to the driver), the host copies are pinned,
and onload returns every tensor bit for bit (``offload_round_trip``); records the next step and the
same step of a twin actor that never offloaded. Writes OUT_JSON (rank 0)."""
from __future__ import annotations

import sys

import torch

from tests.helpers.actor_common import (
    build_actor,
    fixed_batch,
    offload_round_trip,
    rl_loss,
    write_json,
)


def steps(actor, batch, n: int) -> list[float]:
    return [actor.train_step(batch, rl_loss(), micro_batch_size=4).loss for _ in range(n)]


def main() -> None:
    from megatron_rl.runtime.parallel import destroy_parallel
    from megatron_rl.trainer.pipeline.batch import TrainBatch

    hf_dir, out = sys.argv[1], sys.argv[2]
    rec = {}
    for mode in ("optimizer", "all"):
        runs = {}
        for twin in (mode, "none"):
            actor = build_actor(hf_dir, 1, 1, bf16=True, lr=1e-3, offload=twin)
            b = fixed_batch(seed=7)
            batch = TrainBatch(b.tokens, b.loss_mask, {**b.extras, "old_logp": actor.forward_logprobs(b, 4).logp})
            losses = steps(actor, batch, 2)
            if twin != "none":
                torch.cuda.synchronize()
                alloc, reserved = torch.cuda.memory_allocated(), torch.cuda.memory_reserved()
                moved = actor.offload()
                freed = alloc - torch.cuda.memory_allocated()
                shrunk = reserved - torch.cuda.memory_reserved()
                pinned = all(h.is_pinned() for h in actor._stash._host.values())
                actor.onload()
                rec[mode] = {"moved": moved, "freed": freed, "shrunk": shrunk, "pinned": pinned,
                             "round_trip_moved": offload_round_trip(actor, batch, 4)}
            losses += steps(actor, batch, 1)
            runs[twin] = losses + [float(actor.forward_logprobs(b, 4).logp.double().sum())]
            del actor
            destroy_parallel()
        rec[mode]["with"], rec[mode]["without"] = runs[mode], runs["none"]
    write_json(out, rec)
    print("OK", rec, flush=True)


if __name__ == "__main__":
    main()
