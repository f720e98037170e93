"""Worker: checkpoint save / resume of the policy actor.

Usage: actor_checkpoint.py HF_DIR RUN_DIR OUT_JSON TP PHASE [PP=1]
  PHASE=full    4 training steps, checkpoint after steps 1 and 2 (keep_last=2); records every
                step's loss / grad norm and a post-step RNG draw.
  PHASE=resume  find_latest(RUN_DIR) -> load_checkpoint -> steps 3 and 4; records the same.
  PHASE=fresh   checkpoint BEFORE any optimizer step (a run whose updates were all skipped): the
                save must not change a weight, and steps 1, 2 must then equal the full run's.
Each step uses its own batch (seed = step) with old log-probs from a forward pass.
"""
from __future__ import annotations

import sys

import torch

from actor_common import build_actor, fixed_batch, rl_loss, write_json


def one_step(actor, step: int) -> dict:
    from megatron_rl.trainer.batch import TrainBatch

    b = fixed_batch(seed=100 + step)
    old = actor.forward_logprobs(b, micro_batch_size=2).logp
    b = TrainBatch(b.tokens, b.loss_mask, {**b.extras, "old_logp": old})
    r = actor.train_step(b, rl_loss("token-mean"), micro_batch_size=2)
    return {"step": step, "loss": r.loss, "grad_norm": r.grad_norm, "lr": r.lr,
            "rng": torch.rand(2).tolist()}


def main() -> None:
    hf_dir, run_dir, out, tp, phase = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5]
    pp = int(sys.argv[6]) if len(sys.argv) > 6 else 1
    from megatron_rl.trainer.checkpoint import find_latest, load_checkpoint, save_checkpoint

    # warm-up + cosine decay so the scheduler state matters on resume
    actor = build_actor(hf_dir, tp, pp, lr=1e-3, warmup_steps=1, decay_steps=6, decay_style="cosine", min_lr=1e-5)
    rec: dict = {"steps": []}
    if phase == "full":
        for step in (1, 2, 3, 4):
            rec["steps"].append(one_step(actor, step))
            if step in (1, 2):
                save_checkpoint(run_dir, step, actor, {"sampler_pos": 10 * step, "counters": {"step": step}},
                                keep_last=2)
    elif phase == "fresh":
        probe = fixed_batch(seed=3)
        before = actor.forward_logprobs(probe, 2).logp
        save_checkpoint(run_dir, 0, actor, {}, keep_last=2)
        assert torch.equal(actor.forward_logprobs(probe, 2).logp, before), "saving changed the weights"
        for step in (1, 2):
            rec["steps"].append(one_step(actor, step))
    else:
        latest = find_latest(run_dir)
        assert latest is not None and latest.name == "step_2", latest
        loaded = load_checkpoint(latest, actor)
        assert loaded.step == 2 and loaded.extra_state == {"sampler_pos": 20, "counters": {"step": 2}}, loaded
        assert actor.steps_done == 2
        rec["rng_restored"] = loaded.rng_restored
        probe = fixed_batch(seed=3)
        at_load = actor.forward_logprobs(probe, 2).logp          # consumes no RNG
        for step in (3, 4):
            rec["steps"].append(one_step(actor, step))
        # model-only load into a frozen reference reproduces the restored actor's log-probs
        from megatron_rl.trainer.actor import ReferencePolicy
        from megatron_rl.trainer.checkpoint import load_model_weights
        ref = ReferencePolicy(actor.hf_cfg, actor.temperature, parallel_info=actor.parallel_info)
        assert load_model_weights(latest, ref) == 2
        assert torch.equal(ref.forward_logprobs(probe, 2).logp, at_load)
    write_json(out, rec)
    print("OK", rec, flush=True)


if __name__ == "__main__":
    main()
