"""Model construction for the policy classes: the provider's ``GPTModel`` chunks of this pipeline stage.

``build_chunks`` returns one chunk per virtual pipeline stage (one without interleaving), each on the
trainer's device and wrapped in ``Float16Module`` under bf16; ``unwrap`` strips DDP / Float16Module
wrappers back to the bare ``GPTModel``.
"""
from __future__ import annotations

import torch

from megatron_rl.models.provider import (build_gpt_model, check_cp_backend, cuda_fusions, resolve_model_backend,
                                         transformer_config_from_hf)
from megatron_rl.runtime.device import default_device
from megatron_rl.trainer.policy.schedule import Groups


def unwrap(module: torch.nn.Module) -> torch.nn.Module:
    """The bare ``GPTModel`` inside DDP / Float16Module wrappers."""
    while hasattr(module, "module"):
        module = module.module
    return module


def build_chunks(hf_cfg, bf16: bool, g: Groups, sequence_parallel: bool, backend: str = "local",
                  fp8: str | None = None, lora=None, lora_seed: int = 0,
                 **overrides):
    """(list of model chunks, TransformerConfig) from the provider for this pipeline stage, with the
    layer spec of ``backend`` (``models.provider.resolve_model_backend``), TE ``fp8``, the CUDA fusions
    of that backend (``models.provider.cuda_fusions``) and ``overrides`` (``TransformerConfig`` fields:
    the recompute settings, ``models.provider.recompute_overrides``).

    Every chunk is on the trainer's device (``device.default_device``) when this returns, whatever
    wraps it later: the distributed optimizer re-points ``param.data`` into its own buffers, but the
    reference and a plain-optimizer actor have no such step, and megatron's local norms are built on
    the host even without ``use_cpu_initialization``.

    ``lora`` (``models.lora.LoraSpec``): the targeted linears carry adapters (A random, B = 0:
    ``models.lora.init_adapters`` with ``lora_seed``), every other parameter is frozen (requires_grad False:
    DDP and the optimizer then hold the adapters only)."""
    from megatron.core import parallel_state as ps  # lazy: defers megatron to the call

    backend = resolve_model_backend(backend, fp8, sequence_parallel)
    check_cp_backend(g.cp_size, backend)
    if g.cp_size > 1:   # TE's THD attention with its p2p ring (KV chunks passed round the CP group)
        overrides = {"context_parallel_size": g.cp_size, "cp_comm_type": "p2p", **overrides}
    dtype = torch.bfloat16 if bf16 else torch.float32
    vpp = ps.get_virtual_pipeline_model_parallel_world_size() or 1    # interleaved 1F1B: vpp chunks per rank
    if vpp > 1:   # Megatron-LM's interleaved defaults: overlapped, unbatched p2p. Batched p2p at PP=2 posts the
        # activation and the gradient to the same peer in different orders on the two ranks, and gloo pairs them
        # by order: they were swapped (measured: a 230x grad norm); the unbatched path uses two groups
        overrides = {"virtual_pipeline_model_parallel_size": vpp, "overlap_p2p_comm": True, "batch_p2p_comm": False,
                     **overrides}
    config = transformer_config_from_hf(
        hf_cfg, tp=g.tp_size, pp=g.pp_size, sequence_parallel=sequence_parallel, params_dtype=dtype,
        calculate_per_token_loss=True, bf16=bf16, pipeline_dtype=dtype, fp8=fp8,
        **{**cuda_fusions(backend), **overrides})
    chunks = []
    for v in range(vpp):
        vp = v if vpp > 1 else None
        model = build_gpt_model(hf_cfg, config, backend=backend, vp_stage=vp, lora=lora,
                                pre_process=ps.is_pipeline_first_stage(ignore_virtual=vpp == 1, vp_stage=vp),
                                post_process=ps.is_pipeline_last_stage(ignore_virtual=vpp == 1, vp_stage=vp))
        model.to(default_device())
        if lora is not None:
            from megatron_rl.models.lora import freeze_base, init_adapters  # lazy: defers megatron to the call

            layers = model.decoder.layers
            init_adapters(model, int(layers[0].layer_number) - 1 if len(layers) else 0, lora_seed, g.tp_size,
                          ps.get_tensor_model_parallel_rank())
            freeze_base(model)
        if bf16:
            from megatron.core.transformer.module import Float16Module  # lazy: defers megatron to the call
            model = Float16Module(config, model)
        chunks.append(model)
    return chunks, config
