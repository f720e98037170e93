"""Worker: packed teacher passes (trainer/paths/teacher/support.teacher_pass) equal direct single-sequence
computations of the same conditioned inputs, for several samples and every K = 1..4.

Usage: torchrun --nproc_per_node=N teacher_pass.py HF_DIR TP:PP [TP:PP ...]
The layouts run in turn in this process tree (megatron's groups destroyed and rebuilt between
them; one launch per world size instead of one per layout saves the torch + megatron imports);
rank 0 prints ``CASE tp=.. pp=..`` before a layout and ``OK`` after it passed.
The reference log-probs / top-k are computed one unpacked sequence at a time at θ0; then the live
weights are perturbed and the packed pass runs under the snapshot teacher (θ̄ = θ0): equal to
1e-5 in fp32, and the live weights must be back afterwards.
"""
from __future__ import annotations

import sys

import torch

from megatron_rl.trainer.pipeline.batch import make_batch
from megatron_rl.trainer.paths.teacher.inputs import pack
from megatron_rl.trainer.paths.teacher.support import teacher_pass
from megatron_rl.trainer.paths.teacher.weights import TeacherWeights
from tests.helpers.actor_common import VOCAB, build_actor

TOL = 1e-5
TOPK = 5


def main(hf: str, tp: int, pp: int) -> None:
    if torch.distributed.is_initialized() and torch.distributed.get_rank() == 0:
        print(f"CASE tp={tp} pp={pp}", flush=True)
    actor = build_actor(hf, tp, pp)
    g = torch.Generator().manual_seed(3)
    # 4 samples; sample j has K = j + 1 negatives -> K + 1 teacher prompts of different lengths
    seqs, max_resp = [], 6
    for j in range(4):
        resp = torch.randint(1, VOCAB, (int(torch.randint(2, max_resp + 1, (1,), generator=g)),), generator=g).tolist()
        for slot in range(j + 2):
            plen = int(torch.randint(3, 12, (1,), generator=g))
            seqs.append((torch.randint(1, VOCAB, (plen,), generator=g).tolist(), resp))
    # reference: each sequence alone (plain causal mask), current weights θ0
    ref_lp, ref_idx, ref_top = [], [], []
    for p, r in seqs:
        b = make_batch([p], [r], pad_id=0)
        out = actor.forward_support(b, 1, k=TOPK)
        cols = torch.arange(len(p) - 1, len(p) - 1 + len(r))
        ref_lp.append(out["token_logp"][0, cols])
        ref_idx.append(out["idx"][0, cols])
        ref_top.append(out["logp"][0, cols])
    teacher = TeacherWeights(actor, "snapshot", sync_interval=1000)
    params = [p for m in actor.bare_models() for p in m.parameters()]
    with torch.no_grad():
        for p in params:
            p.add_(0.05 * torch.randn_like(p))
    live = [p.detach().clone() for p in params]
    pk = pack(seqs, max_resp, pad_id=0, row_len=40, multiple=8 * tp)
    assert pk.batch.num_samples < len(seqs), "packing must put several sequences in a row"
    top = teacher_pass(actor, teacher, pk, dp=actor.groups.dp_size, mbs=2, k=TOPK)
    worst = worst_top = 0.0
    for m, (p, r) in enumerate(seqs):
        n = len(r)
        worst = max(worst, float((top["token_logp"][m, :n] - ref_lp[m]).abs().max()))
        assert torch.equal(top["idx"][m, :n], ref_idx[m]), f"seq {m}: top-k ids differ"
        worst_top = max(worst_top, float((top["logp"][m, :n] - ref_top[m]).abs().max()))
        assert float(pk.resp_mask[m, n:].sum()) == 0
    # gather mode at given ids (the sdpo/srpo/opsd_ectr path) equals the top-k values there
    gat = teacher_pass(actor, teacher, pk, dp=actor.groups.dp_size, mbs=2, index=top["idx"])
    worst_g = max(float((gat["logp"][m, :len(r)] - ref_top[m]).abs().max()) for m, (_, r) in enumerate(seqs))
    # teacher.pack=off (one sequence per row, plain causal mask: the Transformer Engine path)
    flat = teacher_pass(actor, teacher, pack(seqs, max_resp, pad_id=0, row_len=40, multiple=8 * tp, packed=False),
                        dp=actor.groups.dp_size, mbs=2)
    worst_u = max(float((flat["token_logp"][m, :len(r)] - ref_lp[m]).abs().max()) for m, (_, r) in enumerate(seqs))
    assert worst_u < TOL, worst_u
    assert all(torch.equal(a, b) for a, b in zip(live, params)), "live weights not restored after the teacher pass"
    assert max(worst, worst_top, worst_g) < TOL, (worst, worst_top, worst_g)
    if torch.distributed.get_rank() == 0:
        print(f"tp={tp} pp={pp}: {len(seqs)} teacher sequences in {pk.batch.num_samples} rows, pad_frac "
              f"{pk.pad_frac:.3f}; max |Δ| token {worst:.2e}, top-k {worst_top:.2e}, gather {worst_g:.2e}")
        print("OK", flush=True)


if __name__ == "__main__":
    from megatron_rl.runtime.parallel import destroy_parallel, init_distributed

    init_distributed()
    for case in sys.argv[2:]:
        tp, pp = map(int, case.split(":"))
        main(sys.argv[1], tp, pp)
        destroy_parallel()
