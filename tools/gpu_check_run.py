"""The bring-up run of ``tools/gpu_check.sh``: a 2-step actor + reference run on a random model of a
published shape, and ``megatron-rl plan``'s estimate of the same job beside the measured peak.

    python tools/gpu_check_run.py --out DIR [--shape qwen3-1.7b] [--seq-len 4096] [--rows 4] [--steps 2]

What runs: a random HF checkpoint of ``--shape`` (a preset of ``megatron_rl/cli/plan_arch.py``; ``tiny`` for a CPU
smoke run) written to ``DIR/model`` in bf16 on CUDA (fp32 on CPU); the policy (``PolicyActor``, the layer
backend ``auto`` resolves to, distributed optimizer, ``model.recompute`` of ``--recompute``) and a frozen
reference (``ReferencePolicy``) loaded from it, as ``setup_run`` builds them; ``--steps`` optimizer steps
of a PPO-style loss with a k3 KL to the reference on ``--rows`` random sequences of ``--seq-len`` tokens
(padded micro-batches of one sequence). Printed and written to ``DIR/gpu_check.json``: the losses, the
device's peak allocation (``torch.cuda.max_memory_allocated``; 0 on CPU) and plan's training total for
the same layout without its fixed overhead (the CUDA context is not an allocation).
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

TINY = {"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "hidden_size": 64, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "intermediate_size": 128, "vocab_size": 256,
        "tie_word_embeddings": True}


def write_random_model(shape: str, out: Path, bf16: bool) -> dict:
    """A random HF checkpoint of ``shape`` in ``out`` (config.json + one safetensors file); its config dict."""
    import torch
    from safetensors.torch import save_file
    from transformers import AutoConfig, AutoModelForCausalLM

    from megatron_rl.cli.plan_arch import PRESETS

    hf = dict(TINY if shape == "tiny" else PRESETS[shape])
    hf.update(max_position_embeddings=40960, rms_norm_eps=1e-6, rope_theta=1e6, bos_token_id=1, eos_token_id=2,
              pad_token_id=0, torch_dtype="bfloat16" if bf16 else "float32")
    cfg = AutoConfig.for_model(**hf)
    with torch.device("meta"):                # names and shapes only; the tensors are drawn directly
        names = {n: p.shape for n, p in AutoModelForCausalLM.from_config(cfg).named_parameters()}
    g = torch.Generator().manual_seed(0)
    dtype = torch.bfloat16 if bf16 else torch.float32
    tensors = {n: (torch.ones(s) if "norm" in n else torch.randn(s, generator=g) * 0.02).to(dtype) for n, s in names.items()}
    out.mkdir(parents=True, exist_ok=True)
    cfg.save_pretrained(str(out))
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    return hf


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True, help="work folder (model, gpu_check.json)")
    p.add_argument("--shape", default="qwen3-1.7b", help="a preset of megatron_rl/cli/plan_arch.py, or tiny")
    p.add_argument("--seq-len", type=int, default=4096)
    p.add_argument("--rows", type=int, default=4, help="sequences per step (one per micro-batch)")
    p.add_argument("--steps", type=int, default=2)
    p.add_argument("--recompute", choices=("none", "selective", "full"), default="none")
    a = p.parse_args(argv)

    import torch

    from megatron_rl.runtime import device
    from megatron_rl.models.provider import load_hf_config, recompute_overrides
    from megatron_rl.runtime.parallel import init_parallel
    from megatron_rl.cli.plan_arch import ArchSpec
    from megatron_rl.cli.plan_memory import GIB, PlanInputs, estimate
    from megatron_rl.trainer.loop.preflight import check_backend
    from megatron_rl.trainer.policy.actor import PolicyActor, ReferencePolicy
    from megatron_rl.trainer.pipeline.batch import make_batch
    from megatron_rl.trainer.pipeline.objective import partial_aggregate
    from megatron_rl.trainer.policy.optim import OptimSpec

    out = Path(a.out)
    cuda = device.has_cuda()
    t0 = time.perf_counter()
    hf = write_random_model(a.shape, out / "model", bf16=cuda)
    print(f"[gpu-check] random {a.shape} checkpoint written in {time.perf_counter() - t0:.0f} s", flush=True)
    info = init_parallel(1, 1, seed=0)

    class _Cfg:   # what check_backend reads: the layer backend auto resolves to here
        class model:  # noqa: N801
            backend, fp8 = "auto", None

        class parallel:  # noqa: N801
            sequence_parallel, tp, cp = False, 1, 1

    backend = check_backend(_Cfg)
    hf_cfg = load_hf_config(str(out / "model"))
    actor = PolicyActor(hf_cfg, info, OptimSpec(lr=1e-6, bf16=cuda), temperature=1.0, backend=backend,
                        recompute=recompute_overrides(a.recompute, "uniform", 1))
    actor.load_hf(str(out / "model"))
    ref = ReferencePolicy(hf_cfg, 1.0, bf16=cuda, parallel_info=info, backend=backend)
    ref.load_hf(str(out / "model"))
    g = torch.Generator().manual_seed(1)
    vocab, half = int(hf["vocab_size"]), a.seq_len // 2
    prompts = [torch.randint(3, vocab, (half,), generator=g).tolist() for _ in range(a.rows)]
    resps = [torch.randint(3, vocab, (a.seq_len - half,), generator=g).tolist() for _ in range(a.rows)]
    batch = make_batch(prompts, resps, pad_id=0, extras={"advantages": torch.randn(a.rows, generator=g)}, seq_len=a.seq_len)
    batch.extras["ref_logp"] = ref.forward_logprobs(batch, 1).logp
    batch.extras["old_logp"] = actor.forward_logprobs(batch, 1).logp

    def loss_fn(logp, entropy, mb):   # PPO surrogate + k3 KL to the reference (token-mean)
        ratio = torch.exp(logp - mb.extras["old_logp"])
        d = mb.extras["ref_logp"] - logp
        mat = -mb.extras["advantages"].unsqueeze(-1) * ratio + 1e-3 * (torch.exp(d) - d - 1)
        s, n = partial_aggregate(mat, mb.loss_mask, "token-mean")
        return s, n, {}

    losses = []
    for _ in range(a.steps):
        res = actor.train_step(batch, loss_fn, micro_batch_size=1)
        losses.append(res.loss)
        print(f"[gpu-check] step {len(losses)}: loss {res.loss:.6f} grad_norm {res.grad_norm:.4f}", flush=True)
    measured = device.max_memory_allocated()
    plan = estimate(ArchSpec.from_hf(hf, a.shape), PlanInputs(
        tp=1, pp=1, dp=1, micro_batch=1, seq_len=a.seq_len, dtype="bf16" if cuda else "fp32", reference=True,
        recompute=a.recompute, fused_swiglu=cuda, colocated=False, rollout_seqs=1, overhead_gib=0))
    rec = {"shape": a.shape, "backend": backend, "cuda": cuda, "losses": losses, "max_memory_allocated": measured,
           "plan_train_total": plan.train_total, "plan_parts": {k: getattr(plan, k) for k in (
               "weights", "grads", "optimizer", "extra_copies", "activations", "logits")}}
    (out / "gpu_check.json").write_text(json.dumps(rec, indent=1))
    ratio = f" (measured / plan = {measured / plan.train_total:.2f})" if measured else " (no CUDA: nothing measured)"
    print(f"[gpu-check] plan training total {plan.train_total / GIB:.2f} GiB (without overhead) vs "
          f"torch.cuda.max_memory_allocated {measured / GIB:.2f} GiB{ratio}", flush=True)
    import math

    ok = all(math.isfinite(x) for x in losses)
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
