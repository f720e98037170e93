"""Worker (2 ranks, gloo): a real context-parallel group of 2 (``init_parallel(cp=2)``).

    torchrun --nproc_per_node=2 context_parallel.py OUT_JSON

1. the groups: DP (without CP) 1, DP x CP 2, the CP group the actor's ``Groups`` reads;
2. the ownership rule against Megatron-core's own ``utils.get_batch_on_this_cp_rank`` on that group;
3. ``gather_cp``: each rank's slice of a tensor gathered over the CP group recovers the full frame, and
   its backward hands each rank exactly its own rows of the gradient;
4. the actor's CP path (``LogProbModel._logprobs`` / ``_collect_support`` on a rank's slice of the logits,
   packed THD rows and padded rows): log-probs, entropy, top-k equal the unsplit computation on the
   full logits, and the logits' gradient, summed over the ranks' slices, equals the unsplit one.
Rank 0 writes the record; both ranks assert nothing themselves (the test does).
"""
from __future__ import annotations

import json
import sys

import torch
import torch.distributed as dist


def maxdiff(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).abs().max()) if a.numel() else 0.0


def actor_path(model, mb, full: torch.Tensor, temperature: float, rec: dict, tag: str) -> None:
    """``full`` [rows, L, V] logits; this rank's slice through the actor's CP code vs the unsplit one."""
    from megatron_rl.trainer.policy import cp_batch
    from megatron_rl.trainer.policy.context_parallel import unpartition
    from megatron_rl.trainer.policy.vocab_parallel import (
        vocab_parallel_logprobs,
        vocab_parallel_topk,
    )

    g = model.groups
    rows, length, vocab = full.shape
    fr = cp_batch.frame(mb, g.cp_size, g.cp_rank)
    cu_pad, ppos, idx, total = fr.cu_pad, fr.ppos, fr.idx, fr.total
    pad = full.new_zeros((total, vocab))
    pad[ppos] = full.reshape(rows * length, vocab)
    local = pad.index_select(0, idx)[None].clone().requires_grad_(True)
    mask = mb.loss_mask if not hasattr(mb, "seqs") else mb.batch.loss_mask
    w = torch.linspace(-1, 1, mask.numel()).reshape(mask.shape)

    out = model._logprobs(local, mb, temperature)        # {"logp", "entropy"} in the target frame
    lp_logp, lp_entropy = out["logp"], out["entropy"]
    ((lp_logp * mask * w).sum() + 0.1 * (lp_entropy * mask).sum()).backward()
    ref_in = full.clone().requires_grad_(True)
    ref = vocab_parallel_logprobs(ref_in[:, :-1] / temperature, mb.targets, None, vocab_size=vocab)
    ((ref.logp * mask * w).sum() + 0.1 * (ref.entropy * mask).sum()).backward()

    parts = [torch.empty_like(local.grad[0]) for _ in range(g.cp_size)]
    dist.all_gather(parts, local.grad[0].contiguous(), group=g.cp)
    grad = unpartition(parts, cu_pad).index_select(0, ppos).reshape(rows, length, vocab)

    tok, _, psp = cp_batch.model_inputs(fr)               # the model's inputs: this rank's tokens, whole-batch cu_seqlens
    tparts = [torch.empty_like(tok[0]) for _ in range(g.cp_size)]
    dist.all_gather(tparts, tok[0].contiguous(), group=g.cp)
    inputs_ok = (torch.equal(unpartition(tparts, cu_pad)[ppos], fr.tokens[0]) and torch.equal(psp.cu_seqlens_q, fr.cu)
                 and torch.equal(psp.cu_seqlens_q_padded, cu_pad) and psp.qkv_format == "thd"
                 and psp.max_seqlen_q == int((cu_pad[1:] - cu_pad[:-1]).max()))
    _, _, data = model._collect_support(temperature, 3, None, False, mb, local.detach())
    tk = vocab_parallel_topk(full[:, :-1] / temperature, 3, None, vocab_size=vocab)
    rec[tag] = {"logp": maxdiff(lp_logp, ref.logp), "entropy": maxdiff(lp_entropy, ref.entropy),
                "grad": maxdiff(grad, ref_in.grad), "grad_scale": float(ref_in.grad.abs().max()),
                "logit_scale": float(full.abs().max() / temperature), "vocab": vocab,
                "topk_logp": maxdiff(data["logp"], tk.logp), "topk_idx_same": bool(torch.equal(data["idx"], tk.idx)),
                "token_logp": maxdiff(data["token_logp"], ref.logp.detach()),
                "inputs_ok": inputs_ok, "local_tokens": int(local.shape[1]), "total_tokens": total, "shape": list(lp_logp.shape)}


def main(out: str) -> None:
    from megatron.core import parallel_state as ps
    from megatron.core.utils import get_batch_on_this_cp_rank
    from transformers import Qwen3Config

    from megatron_rl.runtime.parallel import destroy_parallel, init_parallel
    from megatron_rl.trainer.pipeline.batch import make_batch
    from megatron_rl.trainer.pipeline.packing import (
        RankMicroBatches,
        TokenBudget,
        plan,
        seq_lengths,
    )
    from megatron_rl.trainer.policy.context_parallel import (
        gather_cp,
        padded_cu_seqlens,
        partition_indices,
    )
    from megatron_rl.trainer.policy.logprob_model import LogProbModel

    info = init_parallel(1, 1, seed=3, cp=2)
    rank, rec = dist.get_rank(), {}
    model = LogProbModel(Qwen3Config(vocab_size=37), [], None, 1.0, False, info)
    g = model.groups
    rec["groups"] = {"info_dp": info.dp, "info_cp": info.cp, "cp_rank": info.cp_rank, "groups_cp": g.cp_size,
                     "groups_dp": g.dp_size, "dp": ps.get_data_parallel_world_size(),
                     "dp_cp": ps.get_data_parallel_world_size(with_context_parallel=True)}

    # 2. Megatron-core's split of one sequence (sbhd: [b, s]) on this very group is ours for cu = [0, s]
    seq = torch.arange(24)[None]
    theirs = get_batch_on_this_cp_rank({"tokens": seq.clone()})["tokens"][0]
    ours = partition_indices(torch.tensor([0, 24], dtype=torch.int32), 2, g.cp_rank)
    rec["megatron_split_same"] = bool(torch.equal(theirs, seq[0][ours]))

    # 3. gather_cp over the real group, forward and backward
    gen = torch.Generator().manual_seed(11)                   # same draws on both ranks
    cu_pad = padded_cu_seqlens(torch.tensor([0, 5, 17, 18, 30], dtype=torch.int32), 2)
    x = torch.randn(int(cu_pad[-1]), 4, generator=gen)
    mine = x.index_select(0, partition_indices(cu_pad, 2, g.cp_rank)).requires_grad_(True)
    full = gather_cp(mine, cu_pad, g.cp, g.cp_rank, 2)
    wt = torch.randn(full.shape, generator=gen)
    (full * wt).sum().backward()
    rec["gather_exact"] = bool(torch.equal(full.detach(), x))
    rec["gather_grad_own_rows"] = bool(torch.equal(mine.grad, wt.index_select(0, partition_indices(cu_pad, 2, g.cp_rank))))

    # 4. the actor's CP path: packed THD rows (sequences of odd lengths, padding runs) and padded rows
    lens = [13, 7, 22, 5, 9, 3]
    prompts = [torch.randint(1, 37, (2,), generator=gen).tolist() for _ in lens]
    resps = [torch.randint(1, 37, (n - 2,), generator=gen).tolist() for n in lens]
    b = make_batch(prompts, resps, seq_len=24)
    p = plan(seq_lengths(b), TokenBudget(64), dp=1)
    for m, mb in enumerate(RankMicroBatches(b, p, dp_rank=0, thd=True)):
        logits = torch.randn(mb.num_samples, mb.seq_len, 37, generator=gen) * 3
        actor_path(model, mb, logits, 0.7, rec, f"packed{m}")
    logits = torch.randn(b.num_samples, b.seq_len, 37, generator=gen) * 3
    actor_path(model, b, logits, 1.0, rec, "padded")

    destroy_parallel()
    if rank == 0:
        with open(out, "w") as f:
            json.dump(rec, f)
    dist.barrier()


if __name__ == "__main__":
    main(sys.argv[1])
