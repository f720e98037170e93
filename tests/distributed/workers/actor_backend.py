"""Worker: which layer classes the actor builds for each ``model.backend`` / ``model.fp8`` setting,
and (``--step``) one train step's log-probs, for the CPU-vs-CUDA comparison of ``tests/gpu``.

Usage: actor_backend.py HF_DIR OUT_JSON [SETTINGS]   SETTINGS: comma list of backend[:fp8] (default
``local,auto,te,auto:e4m3,local:e4m3``). Records per setting either the built classes (attention
projection, MLP projection, core attention) and the resolved backend, or the start-up error; for
settings that build, log-probs of a fixed batch before and after one optimizer step.
"""
from __future__ import annotations

import sys

from tests.helpers.actor_common import fixed_batch, rl_loss, write_json


def build(hf_dir: str, info, backend: str, fp8):
    from megatron_rl.models.provider import load_hf_config
    from megatron_rl.trainer.policy.actor import PolicyActor
    from megatron_rl.trainer.policy.optim import OptimSpec

    spec = OptimSpec(lr=1e-3, clip_grad=1e9, use_distributed_optimizer=True, bf16=fp8 is not None)
    actor = PolicyActor(load_hf_config(hf_dir), info, spec, temperature=1.0, backend=backend, fp8=fp8)
    actor.load_hf(hf_dir)
    return actor


def classes(actor) -> dict:
    layer = actor.bare_models()[0].decoder.layers[0]
    return {"linear_qkv": type(layer.self_attention.linear_qkv).__name__,
            "linear_fc1": type(layer.mlp.linear_fc1).__name__,
            "core_attention": type(layer.self_attention.core_attention).__name__}


def one_step(actor) -> dict:
    from megatron_rl.trainer.pipeline.batch import TrainBatch

    b = fixed_batch(seed=7)
    before = actor.forward_logprobs(b, micro_batch_size=4).logp
    tb = TrainBatch(b.tokens, b.loss_mask, {**b.extras, "old_logp": before})
    r = actor.train_step(tb, rl_loss("token-mean"), micro_batch_size=4)
    after = actor.forward_logprobs(b, micro_batch_size=4).logp
    m = b.loss_mask.bool()
    return {"loss": float(r.loss), "logp_before": before.float().cpu()[m].tolist(),
            "logp_after": after.float().cpu()[m].tolist()}


def main() -> None:
    from megatron_rl.runtime.parallel import init_parallel

    hf_dir, out = sys.argv[1], sys.argv[2]
    settings = (sys.argv[3] if len(sys.argv) > 3 else "local,auto,te,auto:e4m3,local:e4m3").split(",")
    info = init_parallel(1, 1, seed=1234)
    rec = {}
    for s in settings:
        backend, _, fp8 = s.partition(":")
        try:
            actor = build(hf_dir, info, backend, fp8 or None)
        except ValueError as e:
            rec[s] = {"error": str(e)}
            continue
        rec[s] = {"backend": actor.backend, **classes(actor), **one_step(actor)}
    write_json(out, rec)


if __name__ == "__main__":
    main()
