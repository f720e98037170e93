"""Whether a config's GPUs hold what it allocates, and what to change when they do not: one line naming the
component that weighs most and the config keys that shrink it.

Both sides use it: ``train``'s start-up on a GPU (``trainer/loop/preflight_resources.py`` ``check_device_memory``,
from :func:`plan_components`: ``planning/memory.py``'s estimate, which the dry run keeps within 10% per
component) and the dry run (``trainer/dryrun/run.py``, from the components it measured). Pure arithmetic: no
torch, no megatron.
"""
from __future__ import annotations

from megatron_rl.planning.memory import GIB, PlanReport

#: component -> what lowers it, in config keys
KNOBS = {
    "weights": "raise parallel.tp or parallel.pp (the weights are split over them)",
    "grads": "raise parallel.tp or parallel.pp (the fp32 main grads follow the weights)",
    "optimizer": "add data-parallel GPUs (optim.use_distributed_optimizer shards Adam's state over them) or raise "
                 "parallel.tp / parallel.pp",
    "reference": "raise parallel.tp or parallel.pp (the reference copy follows the weights)",
    "teacher": "raise parallel.tp or parallel.pp, or use the method's live teacher_mode (no fp32 shadow)",
    "copies": "raise parallel.tp or parallel.pp (the reference / teacher copies follow the weights)",
    "activations": "set model.recompute=full, lower trainer.max_tokens_per_micro_batch, or raise parallel.tp with "
                   "parallel.sequence_parallel=true / parallel.pp",
    "logits": "lower trainer.max_tokens_per_micro_batch or raise parallel.tp (the vocabulary is split over TP)",
    "mu": "lower trainer.max_tokens_per_micro_batch or set algo.ratio_space=full",
    "other": "lower trainer.max_tokens_per_micro_batch (sequence parallelism's gather buffer is one micro-batch)",
    "buffers": "lower trainer.max_tokens_per_micro_batch (sequence parallelism's gather buffer is one micro-batch)",
    "rollout": "lower rollout.gpu_memory_utilization or raise rollout.tensor_parallel_size",
    "trainer state": "set trainer.offload=optimizer|all (the trainer's state leaves the GPU while the engines "
                     "generate) or lower rollout.gpu_memory_utilization",
    "overhead": "nothing in the config: the CUDA context and NCCL buffers (plan --overhead-gib)",
}


def refusal(components: dict[str, float], device_bytes: float, where: str) -> str | None:
    """None when the components fit ``device_bytes``; else one line: the total against the device, the largest
    component and what lowers it (:data:`KNOBS`)."""
    total = sum(components.values())
    if total <= device_bytes:
        return None
    name = max(components, key=components.get)
    return (f"{where}: {total / GIB:.1f} GiB per GPU exceed the device's {device_bytes / GIB:.1f} GiB; the largest "
            f"part is {name} ({components[name] / GIB:.1f} GiB): {KNOBS[name]}")


def plan_components(rep: PlanReport) -> tuple[str, dict[str, float]]:
    """The phase that sets ``rep``'s peak and its components (bytes): the update (training state, activations,
    logits, μ, buffers, overhead, a slept or resident engine) or, colocated, the generation (what the trainer keeps
    resident + the engine's share)."""
    i = rep.inputs
    if i.colocated and rep.generation_peak > rep.update_peak:
        return "the generation (colocated)", {"rollout": rep.rollout_total, "copies": rep.extra_copies,
                                              "trainer state": rep.trainer_resident - rep.overhead - rep.extra_copies,
                                              "overhead": rep.overhead}
    if not i.colocated and rep.rollout_total > rep.train_total:
        return "the rollout GPUs (separate)", {"rollout": rep.rollout_total}
    engine = (rep.overhead if i.engine_sleep else rep.rollout_weights + rep.rollout_kv) if i.colocated else 0
    parts = {"weights": rep.weights, "grads": rep.grads, "optimizer": rep.optimizer, "copies": rep.extra_copies,
             "activations": rep.activations, "logits": rep.logits, "mu": rep.sampling, "buffers": rep.buffers,
             "overhead": rep.overhead + engine}
    return f"the update ({rep.stage} pipeline stage)", parts
