"""Worker: engine + Megatron actor colocated on ONE GPU, taking turns as ``trainer/loop/colocate.py`` orders
(``tests/gpu/test_colocated_gpu.py``; needs CUDA).

Usage: colocated_gpu.py HF_DIR OUT_JSON ENGINE   ENGINE: vllm | hf

1. The trainer alone: one update; its peak ``torch.cuda.memory_allocated`` (``trainer_peak``).
2. The engine on the same GPU, the actor's weights pushed; greedy generations and log-probs of a
   fixed batch; then it sleeps (level 2): ``slept_engine`` = what it still holds.
3. wake (weights) -> push the same weights -> wake (KV): generations and log-probs again (must equal).
4. A colocated step: sleep -> update (peak recorded) -> wake (weights) -> push -> wake (KV) -> generate.

Device-wide bytes (``mem_get_info``) are recorded beside torch's: vLLM's sleep-mode pool is its own.
"""
from __future__ import annotations

import sys

from tests.helpers.actor_common import fixed_batch, rl_loss, write_json


def used() -> int:
    """Device-wide bytes in use, with this process's allocator cache handed back first: the trainer's freed
    activations (and the HF engine's freed blocks, same process) would otherwise count as used, and an
    engine allocating from that cache would show no growth."""
    import torch

    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    free, total = torch.cuda.mem_get_info()
    return total - free


def update(actor) -> None:
    from megatron_rl.trainer.pipeline.batch import TrainBatch

    b = fixed_batch(seed=7)
    old = actor.forward_logprobs(b, micro_batch_size=4).logp
    actor.train_step(TrainBatch(b.tokens, b.loss_mask, {**b.extras, "old_logp": old}), rl_loss("token-mean"),
                     micro_batch_size=4)


def main() -> None:
    import torch

    from megatron_rl.models.provider import load_hf_config
    from megatron_rl.runtime.parallel import init_parallel
    from megatron_rl.rollout.engine import SamplingParams
    from megatron_rl.trainer.policy.actor import PolicyActor
    from megatron_rl.trainer.loop.colocate import Colocation
    from megatron_rl.trainer.policy.optim import OptimSpec

    hf_dir, out, kind = sys.argv[1], sys.argv[2], sys.argv[3]
    info = init_parallel(1, 1, seed=1234)
    actor = PolicyActor(load_hf_config(hf_dir), info, OptimSpec(lr=1e-4, clip_grad=1e9, use_distributed_optimizer=True),
                        temperature=1.0)
    actor.load_hf(hf_dir)
    rec = {"engine": kind}

    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    update(actor)                                                     # 1. the trainer alone
    rec["trainer_peak"] = torch.cuda.max_memory_allocated()
    rec["before_engine"], rec["used_before_engine"] = torch.cuda.memory_allocated(), used()

    if kind == "vllm":                                                # 2. the engine beside it
        from megatron_rl.rollout.vllm_engine import VLLMEngine

        eng = VLLMEngine(hf_dir, max_model_len=128, gpu_memory_utilization=0.3, enable_sleep_mode=True)
    else:
        from megatron_rl.rollout.hf_engine import HFEngine

        eng = HFEngine(hf_dir, max_model_len=128, device="cuda")
    colo = Colocation(engines=eng, offload_trainer=getattr(actor, "offload", lambda: None),
                      onload_trainer=getattr(actor, "onload", lambda: None))
    eng.update_weights(actor.hf_weights())
    prompts, sp = [[5, 17, 30, 42], [7, 7, 100, 9, 3]], SamplingParams(max_tokens=6, greedy=True)

    def outputs():
        comps = eng.generate(prompts, sp)
        seqs = [list(c.prompt_ids) + list(c.response_ids) for c in comps]
        return [list(c.response_ids) for c in comps], eng.score(seqs, [len(p) for p in prompts])

    rec["ids_before"], rec["logp_before"] = outputs()
    torch.cuda.synchronize()
    rec["engine_awake"], rec["used_engine_awake"] = torch.cuda.memory_allocated(), used()
    colo.after_generate()                                             # engines sleep (level 2), trainer onloads
    torch.cuda.synchronize()
    rec["slept_engine"] = torch.cuda.memory_allocated() - rec["before_engine"]
    rec["used_slept"] = used()
    colo.before_push()                                                # 3. same weights back
    eng.update_weights(actor.hf_weights())
    colo.after_push()
    rec["ids_after"], rec["logp_after"] = outputs()

    colo.after_generate()                                             # 4. a colocated step
    torch.cuda.reset_peak_memory_stats()
    update(actor)
    rec["update_peak"] = torch.cuda.max_memory_allocated()
    rec["used_after_update"] = used()
    colo.before_push()
    eng.update_weights(actor.hf_weights())
    colo.after_push()
    rec["ids_next"], _ = outputs()
    write_json(out, rec)


if __name__ == "__main__":
    main()
