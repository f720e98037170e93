"""Worker: vocab-parallel log-probs / entropy at TP=2 (plain gloo) vs the full-vocab reference.

Every rank builds the same full logits (seeded), keeps its contiguous shard, and compares values
and gradients (w.r.t. its shard) with the reference computed on the full tensor. Prints ``OK``.
"""
from __future__ import annotations

import torch
import torch.distributed as dist

from megatron_rl.algorithms.sampling import SamplingSpec, sampling_support
from megatron_rl.trainer.policy.vocab_parallel import (full_vocab_logprobs, vocab_parallel_gather_logprobs,
                                                vocab_parallel_logprobs, vocab_parallel_sampled_logprobs,
                                                vocab_parallel_topk)


def check(vocab_size: int, padded: int, dtype: torch.dtype, tol: float) -> None:
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    full = (4 * torch.randn(3, 5, padded, dtype=torch.float64)).to(dtype)
    targets = torch.randint(0, vocab_size, (3, 5))
    w1, w2 = torch.randn(3, 5, dtype=dtype), torch.randn(3, 5, dtype=dtype)
    width = padded // world
    shard = full[..., rank * width:(rank + 1) * width].clone().requires_grad_()
    out = vocab_parallel_logprobs(shard, targets, dist.group.WORLD, vocab_size=vocab_size)
    ref_in = full.clone().requires_grad_()
    ref = full_vocab_logprobs(ref_in, targets, vocab_size=vocab_size)
    torch.testing.assert_close(out.logp, ref.logp, rtol=0, atol=tol)
    torch.testing.assert_close(out.entropy, ref.entropy, rtol=0, atol=tol)
    (out.logp * w1 + out.entropy * w2).sum().backward()
    (ref.logp * w1 + ref.entropy * w2).sum().backward()
    torch.testing.assert_close(shard.grad, ref_in.grad[..., rank * width:(rank + 1) * width], rtol=0, atol=tol)
    print(f"rank{rank} V={vocab_size}/{padded} {dtype} max|dlogp|={(out.logp - ref.logp).abs().max():.2e} "
          f"max|dH|={(out.entropy - ref.entropy).abs().max():.2e}", flush=True)


def check_supports(vocab_size: int, padded: int, k: int) -> None:
    """Top-k ids / log-probs / entropy and the differentiable gather at those ids, vs full vocab."""
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(1)
    full = 3 * torch.randn(2, 4, padded, dtype=torch.float64)
    full[0, 0, 3] = full[0, 0, padded // world + 1] = full[0, 0].max() + 1     # a tie across ranks: lower id wins
    width = padded // world
    shard = full[..., rank * width:(rank + 1) * width].clone()
    tk = vocab_parallel_topk(shard, k, dist.group.WORLD, vocab_size=vocab_size)
    ref = torch.log_softmax(full[..., :vocab_size], -1)
    ref_idx = torch.sort(full[..., :vocab_size], dim=-1, descending=True, stable=True).indices[..., :k]
    assert torch.equal(tk.idx, ref_idx), (tk.idx[0, 0], ref_idx[0, 0])
    torch.testing.assert_close(tk.logp, ref.gather(-1, ref_idx), rtol=0, atol=1e-12)
    torch.testing.assert_close(tk.entropy, -(ref.exp() * ref).sum(-1), rtol=0, atol=1e-12)
    sh = shard.clone().requires_grad_()
    out = vocab_parallel_gather_logprobs(sh, ref_idx, dist.group.WORLD, vocab_size=vocab_size)
    w = torch.randn_like(out)
    (out * w).sum().backward()
    ref_in = full.clone().requires_grad_()
    r = torch.log_softmax(ref_in[..., :vocab_size], -1).gather(-1, ref_idx)
    (r * w).sum().backward()
    torch.testing.assert_close(out, r.detach(), rtol=0, atol=1e-12)
    torch.testing.assert_close(sh.grad, ref_in.grad[..., rank * width:(rank + 1) * width], rtol=0, atol=1e-12)
    print(f"rank{rank} supports V={vocab_size}/{padded} k={k} ok", flush=True)


def check_sampled(vocab_size: int, padded: int, spec: SamplingSpec) -> None:
    """log μ of sampled tokens (min-p / top-k / top-p, ``algorithms/sampling.py``) and its gradient at
    TP=2 vs the whole-row definition: z_y − log Σ w exp(z) with w chosen on the whole row. Row 0 is flat
    (every token tied: the top-p boundary tie spans both ranks). fp32: the kept set is bit-identical
    (its masses are compared within rounding, counted below); values 1e-5 (fp32 log-sum-exp over <= 64)."""
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(2)
    full = 2 * torch.randn(4, 6, padded)
    full[0] = 0.0
    z = full[..., :vocab_size]
    w = sampling_support(z, spec).weights(z)
    targets = torch.multinomial((z + w.log()).softmax(-1).reshape(-1, vocab_size), 1).reshape(4, 6)
    width = padded // world
    shard = full[..., rank * width:(rank + 1) * width].clone().requires_grad_()
    out = vocab_parallel_sampled_logprobs(shard, targets, spec, dist.group.WORLD, vocab_size=vocab_size)
    ref_in = full.clone().requires_grad_()
    rz = ref_in[..., :vocab_size]
    ref = rz.gather(-1, targets[..., None]).squeeze(-1) - torch.logsumexp(rz + w.log(), -1)
    torch.testing.assert_close(out.logp, ref, rtol=0, atol=1e-5)
    assert bool(out.kept.all()), out.kept
    g = torch.randn_like(ref)
    (out.logp * g).sum().backward()
    (ref * g).sum().backward()
    torch.testing.assert_close(shard.grad, ref_in.grad[..., rank * width:(rank + 1) * width], rtol=0, atol=1e-5)
    print(f"rank{rank} sampled V={vocab_size}/{padded} {spec} max|dlogp|={(out.logp - ref).abs().max():.2e}", flush=True)


def main() -> None:
    dist.init_process_group("gloo")
    check(vocab_size=16, padded=16, dtype=torch.float64, tol=1e-12)
    check(vocab_size=13, padded=16, dtype=torch.float64, tol=1e-12)   # rank 1 holds 3 padded columns
    check(vocab_size=7, padded=16, dtype=torch.float64, tol=1e-12)    # rank 1 holds only padding
    check(vocab_size=50, padded=64, dtype=torch.float32, tol=1e-5)
    check_supports(vocab_size=16, padded=16, k=5)
    check_supports(vocab_size=13, padded=16, k=6)     # padded columns never chosen
    for spec in (SamplingSpec(0.2, top_p=0.7), SamplingSpec(1.0, top_k=3), SamplingSpec(1.0, min_p=0.1),
                 SamplingSpec(0.7, top_k=5, top_p=0.8, min_p=0.05), SamplingSpec(1.0, top_k=1)):
        check_sampled(vocab_size=50, padded=64, spec=spec)    # rank 1 holds 14 padded columns
    dist.barrier()
    if dist.get_rank() == 0:
        print("OK", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
