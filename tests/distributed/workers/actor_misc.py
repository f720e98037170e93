"""Worker (2 ranks, TP=2, bf16): broadcast_batch, a bf16 SFT-style run that must lower the loss,
clear errors on bad batch sizes, ReferencePolicy staying frozen, and trainer.offload=optimizer
parking the Adam state, fp32 main params and grad buffers (weights stay) and returning them bit for
bit. Prints OK."""
from __future__ import annotations

import sys

import torch
import torch.distributed as dist

from tests.helpers.actor_common import build_actor, fixed_batch, offload_round_trip


def main() -> None:
    hf_dir = sys.argv[1]
    from megatron_rl.trainer.policy.actor import ReferencePolicy
    from megatron_rl.trainer.pipeline.batch import broadcast_batch
    from megatron_rl.trainer.pipeline.objective import partial_aggregate

    actor = build_actor(hf_dir, 2, 1, sp=True, bf16=True, lr=3e-3, offload="optimizer")
    rank = dist.get_rank()
    src = fixed_batch(seed=7) if rank == 0 else None
    batch = broadcast_batch(src, src=0)
    ref_batch = fixed_batch(seed=7)
    assert torch.equal(batch.tokens, ref_batch.tokens) and torch.equal(batch.loss_mask, ref_batch.loss_mask)
    assert torch.equal(batch.extras["advantages"], ref_batch.extras["advantages"])

    ref = ReferencePolicy.from_actor(actor)
    before = ref.forward_logprobs(batch, micro_batch_size=4).logp

    def sft(logp, entropy, mb):
        s, d = partial_aggregate(-logp, mb.loss_mask, "token-mean")
        return s, d, {"nll": (-(logp * mb.loss_mask).sum(), mb.loss_mask.sum())}

    losses = [actor.train_step(batch, sft, micro_batch_size=4).loss for _ in range(6)]
    assert all(torch.isfinite(torch.tensor(losses))), losses
    assert losses[-1] < losses[0] - 0.5, losses
    assert torch.equal(ref.forward_logprobs(batch, micro_batch_size=4).logp, before), "reference moved"
    parked = offload_round_trip(actor, batch, 4)     # bf16: the fp32 main params are their own tensors
    if rank == 0:
        print("offload=optimizer parked bytes", parked)
    # a NaN loss stops the step before the optimizer touches the weights, naming the step
    from megatron_rl.trainer.policy.actor import NonFiniteLossError
    w_before = actor.forward_logprobs(batch, micro_batch_size=4).logp
    try:
        actor.train_step(batch, lambda lp, ent, mb: (lp.sum() * float("nan"), None, {}), micro_batch_size=4)
    except NonFiniteLossError as e:
        assert "optimizer step 7" in str(e), e
    else:
        raise AssertionError("NaN loss was not reported")
    assert actor.steps_done == 6
    assert torch.equal(actor.forward_logprobs(batch, micro_batch_size=4).logp, w_before)
    # forward passes pad odd sizes internally; training refuses them with a clear message
    full = actor.forward_logprobs(batch, micro_batch_size=4).logp
    odd = actor.forward_logprobs(batch.slice(0, 5), micro_batch_size=2).logp
    assert odd.shape == (5, batch.seq_len - 1)
    torch.testing.assert_close(odd, full[:5], rtol=0, atol=1e-3)   # bf16, different micro-batching
    for bad, msg in ((3, "micro_batch_size 3"), (16, "micro_batch_size 16")):
        try:
            actor.train_step(batch, sft, micro_batch_size=bad)
        except ValueError as e:
            assert msg in str(e), e
        else:
            raise AssertionError(f"micro_batch_size={bad} should fail")
    if rank == 0:
        print("bf16 losses", [round(x, 4) for x in losses])
        print("OK", flush=True)


if __name__ == "__main__":
    main()
