"""Shared pieces of the actor worker scripts: a tiny random HF Qwen3 checkpoint, a fixed batch,
a representative RL loss, and the actor set-up for a given layout.

Not a test module (no ``test_`` prefix); imported by the workers (run as scripts) and the tests.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import torch

VOCAB = 250          # not a multiple of 128: TP=2 pads to 256 -> padded rows are exercised
SEQ = 16
N = 8


def make_tiny_hf(out_dir: str | Path, seed: int = 0) -> Path:
    """Random tiny Qwen3ForCausalLM (2 layers, hidden 64, GQA 4/2, head_dim 16) saved as safetensors."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    out = Path(out_dir)
    if (out / "config.json").exists():
        return out
    torch.manual_seed(seed)
    cfg = Qwen3Config(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=64,
                      rope_theta=10000.0, rms_norm_eps=1e-6, tie_word_embeddings=False, initializer_range=0.2)
    model = Qwen3ForCausalLM(cfg).float()
    with torch.no_grad():                     # non-trivial norm weights so every mapping matters
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(1 + 0.2 * torch.randn_like(p))
    model.save_pretrained(out, safe_serialization=True)
    return out


def fixed_batch(seed: int = 1):
    """N=8 right-padded sequences of length <= SEQ with varied prompt/response lengths + advantages."""
    from megatron_rl.trainer.pipeline.batch import make_batch

    g = torch.Generator().manual_seed(seed)
    prompts, responses = [], []
    for i in range(N):
        pl = int(torch.randint(2, 6, (1,), generator=g))
        rl = int(torch.randint(1, SEQ - pl + 1, (1,), generator=g))
        prompts.append(torch.randint(1, VOCAB, (pl,), generator=g).tolist())
        responses.append(torch.randint(1, VOCAB, (rl,), generator=g).tolist())
    adv = torch.randn(N, generator=g, dtype=torch.float32)
    return make_batch(prompts, responses, pad_id=0, extras={"advantages": adv}, seq_len=SEQ)


def rl_loss(mode: str = "token-mean", ent_coef: float = 0.01):
    """PPO-style surrogate ``-A * exp(logp - old_logp) - c * H`` aggregated with ``mode``."""
    from megatron_rl.trainer.pipeline.objective import partial_aggregate

    def loss_fn(logp, entropy, mb):
        ratio = torch.exp(logp - mb.extras["old_logp"])
        mat = -mb.extras["advantages"].unsqueeze(-1) * ratio - ent_coef * entropy
        s, d = partial_aggregate(mat, mb.loss_mask, mode)
        m = mb.loss_mask
        return s, d, {"ratio_mean": ((ratio * m).sum(), m.sum()), "entropy_mb_mean": (entropy * m).sum() / m.sum()}
    return loss_fn


def loss_abs(actor, batch, mbs: int, mode: str, ent_coef: float = 0.01) -> float:
    """Σ|terms| of ``rl_loss(mode)`` at the current weights: the same aggregation of |A|·ρ + c·H (the
    magnitude the loss is summed from; its ratio to |loss| is the reduction's condition number)."""
    from megatron_rl.algorithms.losses import aggregate

    with torch.no_grad():
        lp = actor.forward_logprobs(batch, micro_batch_size=mbs, with_entropy=True)
        mat = batch.extras["advantages"].abs().unsqueeze(-1) * torch.exp(lp.logp - batch.extras["old_logp"]) + ent_coef * lp.entropy
        return float(aggregate(mat.double(), batch.loss_mask, mode))


def build_actor(hf_dir: str | Path, tp: int, pp: int, sp: bool = False, seed: int = 1234, offload: str = "none",
                backend: str = "local", **optim):
    """init_parallel + PolicyActor (fp32) loaded from ``hf_dir``."""
    from megatron_rl.models.provider import load_hf_config
    from megatron_rl.runtime.parallel import init_parallel
    from megatron_rl.trainer.policy.actor import PolicyActor
    from megatron_rl.trainer.policy.optim import OptimSpec

    info = init_parallel(tp, pp, seed=seed, sequence_parallel=sp)
    hf_cfg = load_hf_config(str(hf_dir))
    spec = OptimSpec(**{"lr": 1e-4, "clip_grad": 1e9, "use_distributed_optimizer": True, **optim})
    actor = PolicyActor(hf_cfg, info, spec, temperature=0.7, sequence_parallel=sp, offload=offload, backend=backend)
    actor.load_hf(str(hf_dir))
    return actor


def offload_round_trip(actor, batch, mbs: int) -> int:
    """offload(): what the mode names is released (storage 0 bytes), the rest stays; a train step
    is refused; onload() gives every optimizer-state, main-param, grad and param tensor back bit for bit."""
    from megatron_rl.trainer.policy.offload import (
        grad_buffer_tensors,
        optimizer_tensors,
        param_tensors,
    )

    opt, grads, params = optimizer_tensors(actor.optimizer), grad_buffer_tensors(actor.chunks), param_tensors(actor.chunks)
    every = opt + grads + params
    before = [t.detach().clone() for t in every]
    weights = {p.untyped_storage().data_ptr() for p in params}
    gone = [t for t in grads + opt if t.dim() > 0 and t.untyped_storage().data_ptr() not in weights]
    gone += params if actor.offload_mode == "all" else []   # fp32 main shards that are weight views stay with them
    moved = actor.offload()
    assert moved > 0 and actor.offloaded
    assert all(t.untyped_storage().nbytes() == 0 for t in gone), "offload left device copies"
    if actor.offload_mode == "optimizer":
        assert all(p.untyped_storage().nbytes() > 0 for p in params), "optimizer mode moved the weights"
    refused = [lambda: actor.train_step(batch, rl_loss(), micro_batch_size=mbs)]
    if actor.offload_mode == "all":   # export, weight sync, checkpoints and forward passes read the weights
        refused += [actor.bare_models, lambda: actor.forward_logprobs(batch, mbs)]
    for call in refused:
        try:
            call()
        except RuntimeError as e:
            assert "call onload() first" in str(e), e
        else:
            raise AssertionError("ran while offloaded")
    assert actor.onload() == moved and not actor.offloaded
    for t, b in zip(every, before):
        assert t.dtype == b.dtype and torch.equal(t, b), "onload changed a tensor"
    return moved


def write_json(path: str | Path, obj) -> None:
    import torch.distributed as dist

    if dist.get_rank() == 0:
        Path(path).write_text(json.dumps(obj, indent=1))


os.environ.setdefault("OMP_NUM_THREADS", "1")
