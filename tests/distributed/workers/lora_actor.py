"""Worker: the LoRA policy actor (DDP + distributed optimizer + checkpoints) at one layout per case.

Usage: lora_actor.py HF_DIR OUT_DIR LABEL:TP:PP:MICRO:RECOMPUTE [...]   (MICRO: padded | packed; RECOMPUTE:
none | full). Per case (megatron's groups rebuilt between cases), rank 0 writes OUT_DIR/LABEL.json:

* log-probs of a fixed batch before any step (the base: B = 0), and after 2 steps with the adapters on and off
  (``AdapterOffReference``: must be the base again, bit for bit);
* whether every base weight is unchanged after the steps (bit for bit, against the HF files) and whether the
  adapters moved; the number of parameters the optimizer holds vs the adapters';
* exact resume: a checkpoint after step 1 loaded into a fresh actor, whose step 2 must equal the first actor's.
"""
from __future__ import annotations

import sys
from pathlib import Path

import torch

from tests.helpers.actor_common import fixed_batch, rl_loss, write_json


def build(hf_dir, tp, pp, recompute):
    from megatron_rl.models.lora import LoraSpec
    from megatron_rl.models.provider import load_hf_config, recompute_overrides
    from megatron_rl.runtime.parallel import init_parallel
    from megatron_rl.trainer.policy.actor import PolicyActor
    from megatron_rl.trainer.policy.optim import OptimSpec

    info = init_parallel(tp, pp, seed=1234)
    spec = OptimSpec(lr=1e-2, clip_grad=1e9, use_distributed_optimizer=True)
    actor = PolicyActor(load_hf_config(str(hf_dir)), info, spec, temperature=0.7,
                        recompute=recompute_overrides(recompute), lora=LoraSpec(4, 8.0), lora_seed=7)
    actor.load_hf(str(hf_dir))
    return actor


def step(actor, i, micro):
    from megatron_rl.trainer.pipeline.batch import TrainBatch

    b = fixed_batch(seed=100 + i)
    old = actor.forward_logprobs(b, micro_batch_size=2).logp
    b = TrainBatch(b.tokens, b.loss_mask, {**b.extras, "old_logp": old})
    r = actor.train_step(b, rl_loss("token-mean"), micro_batch_size=micro)
    return {"loss": r.loss, "grad_norm": r.grad_norm}


def run_case(hf_dir, out_dir, label, tp, pp, micro_kind, recompute):
    from safetensors.torch import load_file

    from megatron_rl.convert.live import iter_hf_tensors
    from megatron_rl.runtime.parallel import destroy_parallel
    from megatron_rl.trainer.pipeline.packing import TokenBudget
    from megatron_rl.trainer.policy.actor import AdapterOffReference
    from megatron_rl.trainer.state.checkpoint import load_checkpoint, save_checkpoint

    micro = TokenBudget(48) if micro_kind == "packed" else 2
    probe = fixed_batch(seed=5)
    actor = build(hf_dir, tp, pp, recompute)
    ref = AdapterOffReference(actor)
    lp0 = actor.forward_logprobs(probe, micro_batch_size=2).logp
    names = [(n, p) for c in actor.bare_models() for n, p in c.named_parameters() if p.requires_grad]
    adapters = [p for _, p in names]
    a0 = [p.detach().clone() for p in adapters]
    opt_params = sum(p.numel() for g in actor.optimizer.param_groups for p in g["params"])
    out = {"adapter_params_local": sum(p.numel() for p in adapters), "optimizer_params_local": opt_params,
           "dp": actor.groups.dp_size}
    run_dir = Path(out_dir) / f"{label}_run"
    s1 = step(actor, 1, micro)
    save_checkpoint(run_dir, 1, actor, {}, keep_last=2)
    s2 = step(actor, 2, micro)
    lp_on = actor.forward_logprobs(probe, micro_batch_size=2).logp
    lp_off = ref.forward_logprobs(probe, micro_batch_size=2).logp
    files = {}
    for f in Path(hf_dir).glob("*.safetensors"):
        files.update(load_file(str(f)))
    hf_now = dict(iter_hf_tensors(actor.bare_models(), actor.hf_cfg))
    from megatron_rl.models.lora import adapters_disabled

    with adapters_disabled(actor.chunks):
        base_now = dict(iter_hf_tensors(actor.bare_models(), actor.hf_cfg))
    out.update(step1=s1, step2=s2,
               off_equals_base=bool(torch.equal(lp_off, lp0)),
               on_minus_base=float((lp_on - lp0).abs().max()),
               base_unchanged=all(torch.equal(base_now[k], files[k]) for k in files),
               merged_differs=sorted(k for k in files if not torch.equal(hf_now[k], files[k])),
               adapters_moved=all(not torch.equal(p, q) for p, q in zip(adapters, a0) if p.ndim),
               unmoved=[n for (n, p), q in zip(names, a0) if torch.equal(p, q)])
    destroy_parallel()
    actor = build(hf_dir, tp, pp, recompute)
    load_checkpoint(run_dir / "checkpoints" / "step_1", actor)
    out["resumed_step2"] = step(actor, 2, micro)
    destroy_parallel()
    write_json(Path(out_dir) / f"{label}.json", out)


if __name__ == "__main__":
    hf, out_dir = sys.argv[1], sys.argv[2]
    for case in sys.argv[3:]:
        label, tp, pp, micro_kind, recompute = case.split(":")
        run_case(hf, out_dir, label, int(tp), int(pp), micro_kind, recompute)
    import torch.distributed as dist

    if dist.is_initialized():
        dist.destroy_process_group()
