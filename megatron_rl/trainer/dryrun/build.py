"""One rank role of the dry run: torch.distributed on the fake process group at the layout's world size and
this rank, Megatron's model-parallel state, the fake device, and every model the method holds, built by the
trainer's own classes as ``trainer/loop/setup.py`` builds them (``_build_policy``).

* the policy: :class:`~megatron_rl.trainer.policy.actor.PolicyActor` (provider chunks, Megatron DDP, the
  distributed optimizer), the reference (:class:`~megatron_rl.trainer.policy.actor.ReferencePolicy`) when the
  method's KL needs one, the teacher's shadow weights (the path's ``resident_weights``, ``trainer/paths/teacher/weights.py``) in snapshot / EMA
  mode; no weights are loaded (the values are meta); with ``lora.enable`` the policy carries its adapters (frozen
  base: DDP and the optimizer hold the adapters only) and the reference is the policy with its adapters off
  (:class:`~megatron_rl.trainer.policy.actor.AdapterOffReference`, no second model), as ``_build_policy`` builds them;
* as the GPU build makes them (``model.backend`` te / auto; a ``local`` config, which LoRA requires, keeps megatron's
  local attention and norms, as its run does): Transformer Engine's attention and norms (``te_standin.py``: stand-ins in
  megatron's local layer spec; packed micro-batches as THD), the fused SwiGLU (``bias_activation_fusion``,
  ``models/provider.py cuda_fusions``), the model built straight on the device (:meth:`FakeDevice.build`).

TP ranks, CP ranks and DP replicas of a stage are alike (``roles.py``); context parallelism needs Transformer
Engine's ring attention and is not simulated (refused, as on a CPU).
"""
from __future__ import annotations

import dataclasses
import os

import torch

from megatron_rl import algorithms as A
from megatron_rl.algorithms.hparams import TeacherHParams
from megatron_rl.algorithms.sampling import SamplingSpec
from megatron_rl.models.provider import load_hf_config, recompute_overrides
from megatron_rl.runtime import determinism, fake_device
from megatron_rl.runtime.parallel import init_parallel
from megatron_rl.trainer.dryrun.te_standin import use_te_memory
from megatron_rl.trainer.dryrun.roles import Layout, Role
from megatron_rl.trainer.loop.setup import _lora_spec, _optim_spec
from megatron_rl.trainer.paths import path_class
from megatron_rl.trainer.policy.actor import AdapterOffReference, PolicyActor, ReferencePolicy

#: TransformerConfig fields of the GPU build that a CPU build sets otherwise (``models/provider.py``
#: ``cuda_fusions``: the fused SwiGLU keeps its input only; TE's fused RoPE is left out: it needs TE's kernel)
GPU_BUILD = {"bias_activation_fusion": True}


@dataclasses.dataclass
class Models:
    """What the method holds on this rank."""

    actor: PolicyActor
    ref: ReferencePolicy | AdapterOffReference | None
    teacher: object | None           # the path's resident weights (TeacherWeights for the teacher family)
    info: object


def start_rank(layout: Layout, role: Role, seed: int = 1234) -> tuple[fake_device.FakeDevice, object]:
    """torch.distributed (fake), Megatron's groups (its gloo groups fake too) and seeds as ``role``'s rank; the
    fake device started. Returns (device, ParallelInfo)."""
    if layout.cp > 1:
        raise ValueError(f"dry run: parallel.cp={layout.cp} needs Transformer Engine's context-parallel attention, "
                         "which this CPU has not got; the dry run simulates cp=1 layouts")
    os.environ.setdefault("TORCHDYNAMO_DISABLE", "1")     # megatron's jit_fuser = torch.compile: eager on meta
    torch._dynamo.config.disable = True
    fake_device.init_fake_world(role.rank, layout.world)
    with fake_device.gloo_as_fake():
        info = init_parallel(layout.tp, layout.pp, seed=seed, sequence_parallel=layout.sequence_parallel,
                             vpp=layout.vpp, cp=layout.cp)
    if (info.pp_rank, info.tp_rank, info.cp_rank) != (role.pp_rank, role.tp_rank, role.cp_rank):
        raise RuntimeError(f"dry run: rank {role.rank} is {info} in Megatron's grid, not the role {role}")
    return fake_device.FakeDevice().start(), info


def build_models(cfg, info, dev: fake_device.FakeDevice) -> Models:
    """The policy, the reference and the teacher's shadow of ``cfg`` on this rank (module docstring)."""
    hf_cfg = load_hf_config(cfg.model.hf_path)
    overrides = {**recompute_overrides(cfg.model.recompute, cfg.model.recompute_method, cfg.model.recompute_num_layers),
                 **determinism.megatron_overrides(cfg.trainer.deterministic), **GPU_BUILD}
    r = cfg.rollout
    mu = SamplingSpec(r.temperature, r.top_k, r.top_p, r.min_p)
    te = cfg.model.backend != "local"      # the layers the run builds (LoRA: local only, preflight refuses te)
    with dev.build():
        actor = PolicyActor(hf_cfg, info, _optim_spec(cfg), temperature=r.temperature,
                            sequence_parallel=info.sequence_parallel, backend="local", fp8=None,
                            offload=cfg.trainer.offload, recompute=overrides, lora=_lora_spec(cfg),
                            lora_seed=cfg.lora.init_seed)
        ref = None
        if "ref_logp" in A.kind_required_inputs(cfg.algo.kind, cfg.algo.hparams) and cfg.lora.enable:
            ref = AdapterOffReference(actor)
        elif "ref_logp" in A.kind_required_inputs(cfg.algo.kind, cfg.algo.hparams):
            ref = ReferencePolicy(hf_cfg, r.temperature, info.sequence_parallel, cfg.model.bf16, parallel_info=info,
                                  backend="local")
    for model in (actor, ref if not isinstance(ref, AdapterOffReference) else None):
        if model is not None:
            if te:
                use_te_memory(model.chunks)
                model.backend = "te"          # packed micro-batches as THD, as on Transformer Engine
            model.set_sampling(mu, train=model is actor and cfg.algo.ratio_space == "sampling")
    hp = cfg.algo.hparams
    teacher = None
    if isinstance(hp, TeacherHParams) and hp.teacher_mode in ("snapshot", "ema"):
        teacher = path_class(cfg.algo.kind).resident_weights(actor, hp)   # the path's own copies
    return Models(actor, ref, teacher, info)
