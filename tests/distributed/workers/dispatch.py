"""Worker (4 ranks, gloo): a step's batch delivered in shares (``trainer/pipeline/dispatch.deliver``).

    torchrun --nproc_per_node=4 dispatch.py OUT_JSON

Layout as Megatron's with TP = 2, DP = 2 (TP fastest): replica 0 = ranks {0, 1} (the driver and a peer),
replica 1 = ranks {2, 3}. Every rank checks what it received against the whole batch (rebuilt from the
same seed): a share's rows are the whole batch's, bit for bit, its metadata all of the batch's; the
engine frame assembled over the DP group (ranks {0, 2} and {1, 3}) equals ``behaviour_matrix`` of the
whole batch; the batch of a path that does not share rows out (and an exception) arrives whole. Then
the same batch as DP = 4 (every rank its own replica; the driver alone in replica 0: no group, nothing sent).
"""
from __future__ import annotations

import json
import random
import sys


def _batch(n: int):
    import torch

    from megatron_rl.rollout.rollouts import Rollouts

    rng = random.Random(5)
    prompts = [[rng.randrange(3, 900) for _ in range(rng.randint(1, 9))] for _ in range(n)]
    resps = [[rng.randrange(3, 900) for _ in range(rng.randint(1, 40))] for _ in range(n)]
    logps = [[-rng.random() * 6 for _ in r] for r in resps]
    return Rollouts.from_lists([{"g": i // 4} for i in range(n)], prompts, resps, logps, ["stop"] * n,
                               [i // 4 for i in range(n)], [f"text {i}" for i in range(n)],
                               rewards=torch.arange(n, dtype=torch.float32), correct=torch.arange(n) % 2 == 0)


def main(out: str) -> None:
    import torch
    import torch.distributed as dist

    from megatron_rl.algorithms.offpolicy import behaviour_matrix
    from megatron_rl.runtime.parallel import ParallelInfo, init_distributed
    from megatron_rl.trainer.pipeline import dispatch
    from megatron_rl.trainer.pipeline.packing import TokenBudget
    from megatron_rl.trainer.pipeline.sequences import engine_frame

    init_distributed(timeout_s=120)
    rank = dist.get_rank()
    info = ParallelInfo(rank=rank, world=4, tp=2, pp=1, dp=2, tp_rank=rank % 2, pp_rank=0, dp_rank=rank // 2)
    dp_groups = [dist.new_group([0, 2]), dist.new_group([1, 3])]
    micro, n, rows_mb = TokenBudget(64), 24, 8
    whole = _batch(n)
    kw = {"info": info, "micro": micro, "rows_per_mini_batch": rows_mb}
    got = dispatch.deliver(whole if rank == 0 else None, shares_rows=True, **kw)
    lengths = (whole.prompt_lens + whole.response_lens).tolist()
    held, owned = dispatch.step_rows(lengths, micro, 2, rows_mb)
    rec = {"rank": rank, "n": len(got), "held": got.held_rows(), "expect_held": list(range(n)) if rank == 0 else held[info.dp_rank],
           "owned": got.share.owned.tolist(), "expect_owned": owned[info.dp_rank]}
    rec["rows_equal"] = all(got.prompt(i) == whole.prompt(i) and got.response(i) == whole.response(i)
                            and torch.equal(got.held_tokens(i)[2], whole.held_tokens(i)[2]) for i in got.held_rows())
    rec["meta_equal"] = (torch.equal(got.prompt_lens, whole.prompt_lens) and torch.equal(got.response_lens, whole.response_lens)
                         and torch.equal(got.rewards, whole.rewards) and torch.equal(got.correct, whole.correct)
                         and torch.equal(got.group_ids, whole.group_ids) and got.finish == whole.finish)
    rec["token_bytes"] = sum(t.numel() * t.element_size() for t in (got.prompt_ids, got.response_ids, got.response_logp))
    rec["whole_token_bytes"] = sum(t.numel() * t.element_size() for t in (whole.prompt_ids, whole.response_ids, whole.response_logp))
    like = torch.zeros(n, 32)
    frame = engine_frame(got, like, dp_groups[info.tp_rank])
    rec["frame_equal"] = bool(torch.equal(frame, behaviour_matrix(whole.rollout_logp, like)))
    again = dispatch.deliver(_batch(n) if rank == 0 else None, shares_rows=False, **kw)   # BiCC, the teacher family
    rec["whole_when_not_shared"] = again.share is None and list(again.texts) == list(whole.texts) and again.responses == whole.responses
    err = dispatch.deliver(ValueError("x") if rank == 0 else None, shares_rows=True, **kw)
    rec["exception_whole"] = isinstance(err, ValueError)
    if rank != 0:
        rec["texts"] = len(got.texts)
    # DP = 4 (every rank its own replica; the driver alone in replica 0, nothing sent there)
    info4 = ParallelInfo(rank=rank, world=4, tp=1, pp=1, dp=4, tp_rank=0, pp_rank=0, dp_rank=rank)
    got4 = dispatch.deliver(_batch(n) if rank == 0 else None, info=info4, micro=micro, rows_per_mini_batch=rows_mb,
                            shares_rows=True)
    held4, owned4 = dispatch.step_rows(lengths, micro, 4, rows_mb)
    rec["dp4"] = {"held": got4.held_rows() == (list(range(n)) if rank == 0 else held4[rank]),
                  "owned": got4.share.owned.tolist() == owned4[rank],
                  "rows_equal": all(got4.response(i) == whole.response(i) for i in got4.held_rows())}
    dist.all_gather_object(all_recs := [None] * 4, rec)
    if rank == 0:
        with open(out, "w") as f:
            json.dump(all_recs, f)
    dist.destroy_process_group()   # (gloo groups alive at interpreter exit abort it now and then: parallel.destroy_parallel)


if __name__ == "__main__":
    main(*sys.argv[1:])
