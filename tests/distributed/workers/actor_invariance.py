"""Worker: layouts (TP, PP, DP from the world size) each run the same three training steps.

Usage: actor_invariance.py HF_DIR OUT_DIR NAME:TP:PP:SP:MICRO_BATCH:DISTOPT[:OFFLOAD] [...]
Each case runs in turn in this process tree (megatron's groups destroyed and rebuilt between
cases, as in ``weight_transport.py``; one launch instead of one per layout saves the torch +
megatron imports) and records (rank 0, ``OUT_DIR/NAME.json``): sum of log-probs / entropies of
the forward pass, and per step the loss, grad norm and a metric. Also checks
ReferencePolicy.from_actor matches the actor bit-for-bit. With OFFLOAD (optimizer | all) the actor
offloads and onloads before every step: the released storages and the bit-exact return are checked
here, the unchanged steps by the test (against the same layout without offload).
"""
from __future__ import annotations

import sys

import torch

from tests.helpers.actor_common import (
    build_actor,
    fixed_batch,
    loss_abs,
    offload_round_trip,
    rl_loss,
    write_json,
)


def check_against_hf(hf_dir: str, batch, logp: torch.Tensor, temperature: float) -> None:
    """The actor's log-probs (temperature-scaled) equal HF eager Qwen3's on response tokens."""
    hf = _hf_model(hf_dir)
    with torch.no_grad():
        logits = hf(batch.tokens).logits[:, :-1] / temperature
    ref = torch.log_softmax(logits, -1).gather(-1, batch.targets.unsqueeze(-1)).squeeze(-1)
    diff = ((ref - logp) * batch.loss_mask).abs().max().item()
    print(f"max |logp - HF logp| on response tokens = {diff:.2e}", flush=True)
    assert diff <= 1e-4, diff


def _hf_model(hf_dir: str):
    """HF model from config + state dict. Not ``from_pretrained``: in a process where the megatron
    CPU patches are applied (they wrap ``torch.tensor``), transformers 5.x ``from_pretrained``
    leaves the non-persistent rotary ``inv_freq`` buffer uninitialised (observed)."""
    from pathlib import Path

    from safetensors.torch import load_file
    from transformers import AutoConfig, AutoModelForCausalLM

    cfg = AutoConfig.from_pretrained(hf_dir)
    cfg._attn_implementation = "eager"
    hf = AutoModelForCausalLM.from_config(cfg).float()
    sd = {}
    for f in sorted(Path(hf_dir).glob("*.safetensors")):
        sd.update(load_file(str(f)))
    hf.load_state_dict(sd, strict=True)
    return hf


def check_hf_round_trip(actor, hf_dir: str) -> None:
    """Right after load_hf, hf_weights() gives back every HF tensor bit-for-bit (on every rank)."""
    from safetensors.torch import load_file

    orig = load_file(f"{hf_dir}/model.safetensors")
    got = dict(actor.hf_weights())
    assert set(got) == set(orig), (set(got) ^ set(orig))
    for k, v in orig.items():
        assert torch.equal(got[k].cpu(), v), k


def check_export(actor, batch, logp: torch.Tensor, out_dir: str) -> None:
    """export_hf of the trained actor; HF (eager, fp32) reproduces the actor's log-probs."""
    actor.export_hf(out_dir)
    if torch.distributed.get_rank() == 0:
        hf = _hf_model(out_dir)
        with torch.no_grad():
            logits = hf(batch.tokens).logits[:, :-1] / actor.temperature
        ref = torch.log_softmax(logits, -1).gather(-1, batch.targets.unsqueeze(-1)).squeeze(-1)
        diff = ((ref - logp) * batch.loss_mask).abs().max().item()
        print(f"exported HF vs actor max |dlogp| = {diff:.2e}", flush=True)
        assert diff <= 1e-4, diff
    torch.distributed.barrier()


def minibatch_steps(actor, mbs: int) -> list[dict]:
    """The update pipeline (``trainer/update.optimizer_steps``) on 8 rows (4 prompts x n=2) cut into
    2 PPO mini-batches of 4 rows, GRPO's registered loss through the real Objective; per optimizer step
    (loss, grad norm, ratio statistics). Micro-batch size min(mbs, 4 / dp): 1, 2 or 4 rows."""
    import types

    from megatron_rl import algorithms as A
    from megatron_rl.config import load_config
    from megatron_rl.trainer.contract import SampleDump, UpdateContext
    from megatron_rl.trainer.paths.plain import PlainPath
    from megatron_rl.trainer.pipeline.update import Rows, optimizer_steps
    from megatron_rl.trainer.pipeline.sequences import build_seq_batch, response_frame

    info = actor.parallel_info
    m = max(1, min(mbs, 4 // info.dp))
    cfg = load_config(None, ["algo.kind=grpo", "data.prompts_per_step=4", "rollout.n=2", "rollout.max_tokens=12",
                             "trainer.mini_batch_prompts=2", f"trainer.micro_batch_size={m}"])
    g = torch.Generator().manual_seed(5)
    prompts = [torch.randint(1, 250, (int(torch.randint(2, 5, (1,), generator=g)),), generator=g).tolist() for _ in range(8)]
    resps = [torch.randint(1, 250, (int(torch.randint(3, 12, (1,), generator=g)),), generator=g).tolist() for _ in range(8)]
    sb = build_seq_batch(prompts, resps, 0, 16, 12)
    old = response_frame(actor.forward_logprobs(sb.batch, m).logp, sb)
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0, 1.0, 0.0, 1.0])
    gids = torch.arange(8) // 2
    hp = cfg.algo.hparams
    adv = A.compute_advantages("grpo", A.AlgoInputs(rewards=rewards.double(), group_ids=gids, mask=sb.resp_mask), hp).float()
    rows = Rows(sb, {"rewards": rewards, "group_ids": gids, "advantages": adv, "old_logp": old, "ref_logp": old.clone(),
                     "resp_pos": sb.resp_pos, "resp_mask": sb.resp_mask})
    run = types.SimpleNamespace(cfg=cfg, info=info, actor=actor, path=PlainPath(cfg, None), micro=m)
    out = optimizer_steps(run, rows, hp, step=1, ctx=UpdateContext(actor, info, m, SampleDump(0, False, None, ""), cfg, None))
    # Σ|terms| of each mini-batch's token-mean loss −A·ρ: the first is on-policy (ρ = 1); after a step
    # |loss_t| ≤ 1.2·A for A > 0 (clip-high 0.2 caps what the min takes) and ≤ 3·|A| for A < 0 (dual clip 3)
    n_tok = sb.resp_mask.sum(-1)
    bound = [torch.ones(8), torch.where(adv > 0, 1.0 + hp.clip_high, hp.dual_clip)]
    return [{**{k: float(r[k]) for k in ("actor/loss", "actor/grad_norm", "actor/ppo_kl", "actor/approx_kl", "actor/lr",
                                                 "mini_batch", "rows")},
             "loss_abs": float((b * adv.abs() * n_tok)[sl].sum() / n_tok[sl].sum()), "tokens": int(n_tok[sl].sum())}
            for r, sl, b in zip(out, (slice(0, 4), slice(4, 8)), bound)]


def run_case(hf_dir: str, out: str, tp: int, pp: int, sp: bool, mbs: int, distopt: bool,
             offload: str = "none") -> None:
    from megatron_rl.runtime.parallel import destroy_parallel
    from megatron_rl.trainer.policy.actor import ReferencePolicy
    from megatron_rl.trainer.pipeline.batch import TrainBatch

    actor = build_actor(hf_dir, tp, pp, sp, use_distributed_optimizer=distopt, offload=offload)
    check_hf_round_trip(actor, hf_dir)
    ref = ReferencePolicy.from_actor(actor)
    batch = fixed_batch()
    lp = actor.forward_logprobs(batch, micro_batch_size=mbs, with_entropy=True)
    rlp = ref.forward_logprobs(batch, micro_batch_size=mbs)
    assert torch.equal(lp.logp, rlp.logp), "reference copy differs from the actor"
    m = batch.loss_mask
    if torch.distributed.get_world_size() == 1:
        check_against_hf(hf_dir, batch, lp.logp, actor.temperature)
    rec = {"logp_sum": float((lp.logp * m).sum()), "ent_sum": float((lp.entropy * m).sum()),
           "logp_first": lp.logp[0, :6].tolist(), "steps": [], "tokens": int(m.sum()),
           "params": sum(int(v.numel()) for _, v in actor.hf_weights())}
    # log μ under a truncating sampler (issue 42): the kept set found by reductions over TP shards
    from megatron_rl.algorithms.sampling import SamplingSpec

    actor.set_sampling(SamplingSpec(actor.temperature, top_k=5, top_p=0.8, min_p=0.01))
    mu = actor.forward_logprobs(batch, micro_batch_size=mbs, sampling=True)
    actor.set_sampling(None)
    rec.update(mu_logp_sum=float((mu.sampling_logp * m).sum()), mu_kept=float((mu.sampling_kept * m).sum()),
               mu_full_equal=bool(torch.equal(mu.logp, lp.logp)))
    batch = TrainBatch(batch.tokens, batch.loss_mask, {**batch.extras, "old_logp": lp.logp.detach()})
    for mode in ("token-mean", "seq-mean-token-mean", "token-sum"):
        if offload != "none":
            rec.setdefault("offloaded_bytes", []).append(offload_round_trip(actor, batch, mbs))
        magnitude = loss_abs(actor, batch, mbs, mode)
        r = actor.train_step(batch, rl_loss(mode), micro_batch_size=mbs)
        rec["steps"].append({"mode": mode, "loss": r.loss, "grad_norm": r.grad_norm, "lr": r.lr,
                             "ratio_mean": r.metrics["ratio_mean"], "ok": r.update_successful, "loss_abs": magnitude})
    after = actor.forward_logprobs(batch, micro_batch_size=mbs)
    rec["logp_sum_after"] = float((after.logp * m).sum())
    rec["logp_abs_change"] = float(((after.logp - lp.logp).abs() * m).sum())   # Σ|Δ log p|: no cancelling
    rec["ref_unchanged"] = bool(torch.equal(ref.forward_logprobs(batch, micro_batch_size=mbs).logp, lp.logp))
    check_export(actor, batch, after.logp, out + ".hf")
    destroy_parallel()      # the update pipeline's mini-batches start from the checkpoint's weights again
    rec["minibatch_steps"] = minibatch_steps(build_actor(hf_dir, tp, pp, sp, use_distributed_optimizer=distopt), mbs)
    write_json(out, rec)
    print("OK", rec, flush=True)


def main() -> None:
    from megatron_rl.runtime.parallel import destroy_parallel

    hf_dir, out_dir = sys.argv[1], sys.argv[2]
    for case in sys.argv[3:]:
        name, tp, pp, sp, mbs, distopt, *offload = case.split(":")
        run_case(hf_dir, f"{out_dir}/{name}.json", int(tp), int(pp), sp == "1", int(mbs), distopt == "1", *offload)
        destroy_parallel()


if __name__ == "__main__":
    main()
