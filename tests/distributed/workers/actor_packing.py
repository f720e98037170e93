"""Worker: packed (token-budget) vs padded micro-batches of the same global batch, per layout.

Usage: actor_packing.py HF_DIR OUT_DIR NAME:TP:PP:SP[:BACKEND] [...]   (BACKEND local | te; te needs CUDA)

A long-tailed batch (16 sequences, lengths 3..44 tokens) through the real PolicyActor (fp32): per-sequence
log-probs / entropy (``forward_logprobs``), teacher-style supports (``forward_support`` top-k and at given
ids), and one optimizer step per method family (GRPO's PPO clip, RLCSD's two-path loss with its teacher
tensors and whole-batch counts, SCoRe's two attempts, SDPO's student support at train time) through the
real Objective — each once padded (2-row micro-batches) and once packed (a 96-token budget), from the same
weights (the step is taken on a fresh actor each time). Rank 0 writes ``OUT_DIR/NAME.json``.
"""
from __future__ import annotations

import sys

import torch

from tests.helpers.actor_common import build_actor, write_json

KINDS = ("grpo", "rlcsd", "score", "sdpo")
N, R, K = 16, 40, 4


def long_tailed(seed: int = 3):
    """16 sequences: prompts of 2..5 tokens, responses log-normal 1..40 (max / median >= 8)."""
    from megatron_rl.trainer.pipeline.sequences import build_seq_batch

    g = torch.Generator().manual_seed(seed)
    lens = torch.exp(1.2 + 0.9 * torch.randn(N, generator=g)).clamp(1, R).long().tolist()   # log-normal, same on every rank
    lens[0] = R
    prompts = [torch.randint(1, 250, (int(torch.randint(2, 6, (1,), generator=g)),), generator=g).tolist() for _ in range(N)]
    resps = [torch.randint(1, 250, (n,), generator=g).tolist() for n in lens]
    return build_seq_batch(prompts, resps, 0, 48, R), lens


def method_extras(kind: str, hp, sb, seed: int = 0) -> dict:
    """Every extra the kind's loss reads, in the response frame of ``sb`` (synthetic teacher tensors)."""
    from megatron_rl import algorithms as A

    g = torch.Generator().manual_seed(seed)
    lp = lambda *shape: -torch.rand(*shape, generator=g) * 2
    m = sb.resp_mask
    N = m.shape[0]
    ex = {"resp_pos": sb.resp_pos, "resp_mask": m, "rewards": (torch.rand(N, generator=g) > 0.5).float(),
          "group_ids": torch.arange(N) // 4, "advantages": torch.randn(N, generator=g), "old_logp": lp(N, R) * m,
          "ref_logp": lp(N, R) * m}
    if kind == "rlcsd":
        ex.update({"teacher_logp": lp(N, R), "teacher_neg_logp": lp(N, 2, R), "teacher_neg_mask": torch.ones(N, 2, dtype=torch.bool)})
    if kind == "score":
        ex.update({"first_pos": (sb.resp_pos - 1).clamp_min(0), "first_mask": m, "first_ref_logp": lp(N, R) * m,
                   "first_rewards": (torch.rand(N, generator=g) > 0.5).float()})
    if kind == "sdpo":
        ex.update({"teacher_topk": torch.log_softmax(torch.randn(N, R, K + 1, generator=g), -1),
                   "support_idx": torch.randint(0, 250, (N, sb.batch.seq_len - 1, K), generator=g)})
    for name, fn in A.loss_batch_stats(A.algo_kind(kind).loss).items():
        ex[name] = fn(ex, hp)
    return ex


def measured(kind: str, hp, batch):
    """The real :class:`Objective`, which also sums the magnitudes its loss is built from: Σ over the micro-
    batches of the aggregation of |loss_mat| plus β·|KL sum|, beside the signed loss sums; summed over every
    rank after the step, their ratio is the final reduction's condition number κ (TP / PP copies cancel)."""
    from megatron_rl.algorithms.losses import partial_aggregate
    from megatron_rl.algorithms.objective import objective_terms
    from megatron_rl.algorithms.registry import get_policy_loss
    from megatron_rl.trainer.pipeline.objective import Objective

    class Measured(Objective):
        def __call__(self, logp, entropy, mb, support=None):
            out = super().__call__(logp, entropy, mb, support)
            with torch.no_grad():
                x, adv = self.inputs(logp.detach(), mb, support), mb.extras["advantages"]
                o = get_policy_loss(self.loss)(x, adv, self.hp)
                mask = o.mask if len(o) > 2 else x.mask
                pg = partial_aggregate(o.loss_mat.abs(), mask, self.hp.loss_agg_mode, scale_factor=self.hp.loss_scale_factor)
                kl = objective_terms(self.kind, x, adv, self.hp, batch_tokens=self.batch_tokens).kl_sum
                self.sums += torch.stack([pg.loss_sum.double() + self.hp.kl_loss_coef * kl.abs().double(), out[0].detach().double()])
            return out

    obj = Measured(kind, hp, batch, step=1)
    obj.sums = torch.zeros(2, dtype=torch.float64)
    return obj


def condition(obj) -> float:
    """κ = Σ|terms| / |Σ terms| of the step's loss over every rank (``measured``)."""
    nccl = torch.distributed.get_backend() == "nccl"        # the te backend on CUDA (tests/gpu/test_packing_thd.py)
    s = obj.sums.to("cuda" if nccl else "cpu", copy=True)
    torch.distributed.all_reduce(s)
    s = s.cpu()
    return max(1.0, float(s[0] / s[1].abs())) if s[1] != 0 else float("inf")


def one_step(hf_dir, tp, pp, sp, kind: str, sb, micro, backend: str = "local") -> dict:
    import dataclasses

    from megatron_rl import algorithms as A
    from megatron_rl.runtime.parallel import destroy_parallel

    actor = build_actor(hf_dir, tp, pp, sp, backend=backend)
    hp = A.algo_kind(kind).hparams(kl_loss_coef=0.05)
    batch = dataclasses.replace(sb.batch, extras=method_extras(kind, hp, sb))
    obj = measured(kind, hp, batch)
    r = actor.train_step(batch, obj, micro)
    out = {"loss": r.loss, "grad_norm": r.grad_norm, "kl": r.metrics.get("actor/kl_loss", 0.0), "cond": condition(obj),
           "tokens": int(sb.resp_mask.sum()), "params": sum(int(v.numel()) for _, v in actor.hf_weights())}
    destroy_parallel()
    return out


def run_case(hf_dir: str, out: str, tp: int, pp: int, sp: bool, backend: str = "local") -> None:
    from megatron_rl.runtime.parallel import destroy_parallel
    from megatron_rl.trainer.pipeline.packing import TokenBudget

    sb, lens = long_tailed()
    budget = TokenBudget(96)
    rec = {"lens": lens}
    actor = build_actor(hf_dir, tp, pp, sp, backend=backend)
    for name, micro in (("padded", 2), ("packed", budget)):
        lp = actor.forward_logprobs(sb.batch, micro, with_entropy=True)
        top = actor.forward_support(sb.batch, micro, k=K)
        rec[name] = {"logp": (lp.logp * sb.batch.loss_mask).tolist(), "entropy": (lp.entropy * sb.batch.loss_mask).tolist(),
                     "topk_logp": (top["logp"] * sb.batch.loss_mask[..., None]).tolist(),
                     "topk_idx": (top["idx"] * sb.batch.loss_mask[..., None].long()).tolist()}
        at = actor.forward_support(_with(sb.batch, "ids", top["idx"]), micro, index_key="ids")
        rec[name]["at_ids"] = (at["logp"] * sb.batch.loss_mask[..., None]).tolist()
    destroy_parallel()
    for kind in KINDS:
        for name, micro in (("padded", 2), ("packed", budget)):
            rec[name][kind] = one_step(hf_dir, tp, pp, sp, kind, sb, micro, backend)
    if torch.distributed.get_world_size() // (tp * pp) == 2:
        rec["filler"] = filler_case(hf_dir, tp, pp, sp, backend)
    write_json(out, rec)
    print("OK", {k: rec[k][kind] for k in ("padded", "packed") for kind in KINDS}, flush=True)


def filler_case(hf_dir, tp, pp, sp, backend) -> dict:
    """DP=2, three sequences of 43, 43 and 42 tokens and a 48-token budget (one row per micro-batch):
    rank 0 runs two micro-batches, rank 1 its one sequence and then a zero-mask filler. The padded path
    runs the same sequences plus one zero-mask padding copy (``TrainBatch.pad_rows_to_multiple``), one row per
    micro-batch. Loss, grad norm and every metric must agree: neither the filler nor the padding copy
    adds a row to any average (RLCSD: the KL share of token-sum losses; SCoRe: its attempt-1 mask; GRPO
    with seq-mean-token-mean: the rows weighing its metrics)."""
    import dataclasses

    from megatron_rl import algorithms as A
    from megatron_rl.runtime.parallel import destroy_parallel
    from megatron_rl.trainer.pipeline.packing import TokenBudget, plan, seq_lengths
    from megatron_rl.trainer.pipeline.sequences import build_seq_batch

    g = torch.Generator().manual_seed(7)
    sb = build_seq_batch([torch.randint(1, 250, (3,), generator=g).tolist() for _ in range(3)],
                         [torch.randint(1, 250, (n,), generator=g).tolist() for n in (R, R, R - 1)], 0, 48, R)
    out = {"tokens": 3 * R - 1, "rank_micro_batches": [[len(mb) for mb in rk] for rk in plan(seq_lengths(sb.batch), TokenBudget(48), 2).ranks]}
    for kind, kw in (("rlcsd", {}), ("score", {}), ("grpo", {"loss_agg_mode": "seq-mean-token-mean"})):
        hp = A.algo_kind(kind).hparams(kl_loss_coef=0.05, **kw)
        batch = dataclasses.replace(sb.batch, extras=method_extras(kind, hp, sb))
        for name, b, micro in (("padded", batch.pad_rows_to_multiple(2), 1), ("packed", batch, TokenBudget(48))):
            actor = build_actor(hf_dir, tp, pp, sp, backend=backend)
            obj = measured(kind, hp, b)
            r = actor.train_step(b, obj, micro)
            out.setdefault(name, {})[kind] = {"loss": r.loss, "grad_norm": r.grad_norm, **r.metrics}
            out.setdefault("cond", {})[f"{name}/{kind}"] = condition(obj)
            destroy_parallel()
    return out


def _with(batch, key, value):
    import dataclasses

    return dataclasses.replace(batch, extras={**batch.extras, key: value})


def main() -> None:
    hf_dir, out_dir = sys.argv[1], sys.argv[2]
    for case in sys.argv[3:]:
        name, tp, pp, sp, *backend = case.split(":")
        run_case(hf_dir, f"{out_dir}/{name}.json", int(tp), int(pp), sp == "1", *backend)


if __name__ == "__main__":
    main()
