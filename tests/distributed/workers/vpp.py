"""Worker (2 ranks, PP=2, gloo): interleaved 1F1B with 2 virtual stages per rank reproduces the
non-interleaved schedule.

    torchrun --nproc_per_node=2 vpp.py OUT_JSON

A random 4-layer Qwen3 (HF dir written by rank 0); for vpp 1 and 2: init_parallel(pp=2, vpp), the policy
loaded from the dir, its log-probs of a fixed batch, one train_step of 4 micro-batches of 2 rows and one of a
single micro-batch (fewer than the pipeline's stages), one packed (a token budget that fits the batch in one
micro-batch: zero-mask fillers make up PP), the log-probs after them (padded and packed), and the HF tensors the weight sync streams (``hf_weights``) after the step. Records losses, grad
norms, the chunk layout and the max |differences| between the two schedules.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist

from tests.helpers.actor_common import fixed_batch, loss_abs, rl_loss


def make_hf(out: Path) -> Path:
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(0)
    cfg = Qwen3Config(vocab_size=250, hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4,
                      num_key_value_heads=2, head_dim=16, max_position_embeddings=64, rms_norm_eps=1e-6,
                      tie_word_embeddings=False)
    Qwen3ForCausalLM(cfg).float().save_pretrained(out, safe_serialization=True)
    return out


def run(hf: str, vpp: int) -> dict:
    from megatron_rl.models.provider import load_hf_config
    from megatron_rl.runtime.parallel import destroy_parallel, init_parallel
    from megatron_rl.trainer.policy.actor import PolicyActor, unwrap
    from megatron_rl.trainer.policy.optim import OptimSpec

    info = init_parallel(1, 2, seed=5, vpp=vpp)
    actor = PolicyActor(load_hf_config(hf), info, OptimSpec(lr=1e-3, clip_grad=1e9), temperature=0.7)
    actor.load_hf(hf)
    batch = fixed_batch()
    before = actor.forward_logprobs(batch, 2).logp
    batch.extras["old_logp"] = before.detach() - 0.05
    mags = [loss_abs(actor, batch, 2, "token-mean")]         # Σ|terms| of each step's loss, before it
    res = actor.train_step(batch, rl_loss(), micro_batch_size=2)
    mags.append(loss_abs(actor, batch, 2, "token-mean"))
    one = actor.train_step(batch, rl_loss(), micro_batch_size=8)     # a single micro-batch: fewer than PP
    from megatron_rl.trainer.pipeline.packing import TokenBudget

    mags.append(loss_abs(actor, batch, 2, "token-mean"))
    packed = actor.train_step(batch, rl_loss(), micro_batch_size=TokenBudget(128))   # packed: one micro-batch of rows
    packed_logp = actor.forward_logprobs(batch, TokenBudget(128)).logp
    after = actor.forward_logprobs(batch, 2).logp
    weights = {n: t.clone() for n, t in actor.hf_weights()}
    params = sum(int(t.numel()) for t in weights.values())
    layers = [[int(layer.layer_number) for layer in unwrap(c).decoder.layers] for c in actor.chunks]
    destroy_parallel()
    return {"loss": res.loss, "grad_norm": res.grad_norm, "loss_one_mb": one.loss, "grad_norm_one_mb": one.grad_norm,
            "loss_packed": packed.loss, "grad_norm_packed": packed.grad_norm, "packed_logp": packed_logp, "before": before, "after": after, "weights": weights,
            "layers": layers, "loss_abs": mags, "params": params, "tokens": int(batch.loss_mask.sum())}


def main(out: str) -> None:
    from megatron_rl.runtime.parallel import init_distributed

    init_distributed()
    hf = Path(out).parent / "hf4"
    if dist.get_rank() == 0 and not hf.exists():
        make_hf(hf)
    dist.barrier()
    a, b = run(str(hf), 1), run(str(hf), 2)
    rec = {"loss": [a["loss"], b["loss"]], "grad_norm": [a["grad_norm"], b["grad_norm"]],
           "loss_one_mb": [a["loss_one_mb"], b["loss_one_mb"]], "grad_norm_one_mb": [a["grad_norm_one_mb"], b["grad_norm_one_mb"]],
           "loss_abs": a["loss_abs"], "params": a["params"], "tokens": a["tokens"],
           "layers_vpp1": a["layers"], "layers_vpp2": b["layers"],
           "loss_packed": [a["loss_packed"], b["loss_packed"]], "grad_norm_packed": [a["grad_norm_packed"], b["grad_norm_packed"]],
           "logp_scale": float(torch.stack([a["before"].abs().max(), a["after"].abs().max()]).max()),
           "packed_logp_diff": float((a["packed_logp"] - b["packed_logp"]).abs().max()),
           "logp_before_diff": float((a["before"] - b["before"]).abs().max()),
           "logp_after_diff": float((a["after"] - b["after"]).abs().max()),
           "weights_same_names": sorted(a["weights"]) == sorted(b["weights"]),
           "weights_diff": max(float((a["weights"][k] - b["weights"][k]).abs().max()) for k in a["weights"])}
    recs = [None] * dist.get_world_size()
    dist.all_gather_object(recs, rec)
    if dist.get_rank() == 0:
        Path(out).write_text(json.dumps(recs))


if __name__ == "__main__":
    main(sys.argv[1])
