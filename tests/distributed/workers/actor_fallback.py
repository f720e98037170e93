"""TEMPORARY minimal stand-ins for ``megatron_rl.parallel`` / ``models.provider`` / ``convert``
while those modules (other owners) have not landed; :func:`install` registers them only for the
names that cannot be imported, so the real modules always win once present.

Real implementations (no mocks): CPU patches from shared/notes/cpu_megatron_ray.md §2 (prose),
megatron parallel init over gloo, TransformerConfig/GPTModel from an HF Qwen3 config, and HF
safetensors -> megatron mapping with TP/PP slicing for dense Qwen3/Llama.
"""
from __future__ import annotations

import importlib
import inspect
import os
import sys
import types
from pathlib import Path

import torch


def _cpu(dev):
    if isinstance(dev, int) or (isinstance(dev, str) and dev.startswith("cuda")) or \
            (isinstance(dev, torch.device) and dev.type == "cuda"):
        return "cpu"
    return dev


def _patch_cpu() -> None:
    if getattr(torch, "_mrl_fallback_patched", False) or torch.cuda.is_available():
        return
    torch._mrl_fallback_patched = True
    torch.cuda.current_device = lambda: "cpu"
    torch.cuda.get_rng_state = lambda *a, **k: torch.get_rng_state()
    torch.cuda.random.get_rng_state = lambda *a, **k: torch.get_rng_state()
    torch.cuda.manual_seed = lambda seed: torch.default_generator.manual_seed(int(seed))
    torch.cuda.synchronize = lambda *a, **k: None
    from megatron.core.tensor_parallel import random as tpr
    tpr._set_cuda_rng_state = lambda st, *a, **k: torch.set_rng_state(st)
    tpr._get_cuda_rng_state = lambda *a, **k: torch.get_rng_state()
    for name in ("zeros", "tensor", "ones", "empty", "full", "arange", "zeros_like", "ones_like", "empty_like"):
        orig = getattr(torch, name)

        def wrap(*a, __orig=orig, **k):
            if "device" in k:
                k["device"] = _cpu(k["device"])
            return __orig(*a, **k)
        setattr(torch, name, wrap)
    orig_type = torch.Tensor.type

    def type_(self, *a, **k):
        if not a and not k:
            caller = inspect.currentframe().f_back.f_globals.get("__name__", "")
            t = orig_type(self)
            if caller.startswith("megatron") and t.startswith("torch.") and not t.startswith("torch.cuda"):
                return "torch.cuda." + t[len("torch."):]
            return t
        return orig_type(self, *a, **k)
    torch.Tensor.type = type_
    from megatron.core.transformer import torch_norm
    orig_new = torch_norm.WrappedTorchNorm.__new__

    def new(cls, config, *a, **k):
        sp = config.sequence_parallel
        config.sequence_parallel = False
        try:
            mod = orig_new(cls, config, *a, **k)
        finally:
            config.sequence_parallel = sp
        for p in mod.parameters():
            p.sequence_parallel = sp
        return mod
    torch_norm.WrappedTorchNorm.__new__ = new


# ----- parallel -----------------------------------------------------------------------------
def init_parallel(tp: int = 1, pp: int = 1, *, seed: int, sequence_parallel: bool = False):
    import torch.distributed as dist
    from megatron.core import parallel_state as ps
    from megatron.core.tensor_parallel import model_parallel_cuda_manual_seed

    _patch_cpu()
    from megatron_rl import patches
    patches.apply_all(("megatron",))
    if not dist.is_initialized():
        dist.init_process_group("gloo")
    ps.initialize_model_parallel(tensor_model_parallel_size=tp, pipeline_model_parallel_size=pp)
    torch.manual_seed(seed)
    model_parallel_cuda_manual_seed(seed)
    return types.SimpleNamespace(tp=tp, pp=pp, dp=dist.get_world_size() // (tp * pp), sequence_parallel=sequence_parallel)


def destroy_parallel() -> None:
    from megatron.core import parallel_state as ps
    ps.destroy_model_parallel()


# ----- provider -----------------------------------------------------------------------------
def load_hf_config(d: str):
    from transformers import AutoConfig
    return AutoConfig.from_pretrained(d)


def padded_vocab_size(hf_cfg, tp: int) -> int:
    m = 128 * tp
    return -(-hf_cfg.vocab_size // m) * m


def transformer_config_from_hf(hf_cfg, *, tp, pp, sequence_parallel, params_dtype, **overrides):
    import torch.nn.functional as F
    from megatron.core.transformer import TransformerConfig

    kw = dict(num_layers=hf_cfg.num_hidden_layers, hidden_size=hf_cfg.hidden_size,
              num_attention_heads=hf_cfg.num_attention_heads, num_query_groups=hf_cfg.num_key_value_heads,
              kv_channels=getattr(hf_cfg, "head_dim", None) or hf_cfg.hidden_size // hf_cfg.num_attention_heads,
              ffn_hidden_size=hf_cfg.intermediate_size, normalization="RMSNorm", layernorm_epsilon=hf_cfg.rms_norm_eps,
              gated_linear_unit=True, activation_func=F.silu, add_bias_linear=False, add_qkv_bias=False,
              qk_layernorm=hf_cfg.model_type == "qwen3", hidden_dropout=0.0, attention_dropout=0.0,
              tensor_model_parallel_size=tp, pipeline_model_parallel_size=pp, sequence_parallel=sequence_parallel,
              params_dtype=params_dtype, pipeline_dtype=params_dtype, batch_p2p_sync=False,
              use_cpu_initialization=True)
    kw.update(overrides)
    return TransformerConfig(**kw)


def build_gpt_model(hf_cfg, config, pre_process=True, post_process=True):
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec

    spec = get_gpt_layer_local_spec(qk_layernorm=config.qk_layernorm, normalization="RMSNorm")
    return GPTModel(config, spec, vocab_size=padded_vocab_size(hf_cfg, config.tensor_model_parallel_size),
                    max_sequence_length=hf_cfg.max_position_embeddings, pre_process=pre_process,
                    post_process=post_process, share_embeddings_and_output_weights=hf_cfg.tie_word_embeddings,
                    position_embedding_type="rope", rotary_base=int(getattr(hf_cfg, "rope_theta", None) or
                                                                   hf_cfg.rope_parameters["rope_theta"]))


# ----- convert ------------------------------------------------------------------------------
def _hf_to_full_megatron(sd: dict, hf_cfg) -> dict:
    nh, nkv = hf_cfg.num_attention_heads, hf_cfg.num_key_value_heads
    hd = getattr(hf_cfg, "head_dim", None) or hf_cfg.hidden_size // nh
    out = {"embedding.word_embeddings.weight": sd["model.embed_tokens.weight"],
           "decoder.final_layernorm.weight": sd["model.norm.weight"],
           "output_layer.weight": sd.get("lm_head.weight", sd["model.embed_tokens.weight"])}
    for i in range(hf_cfg.num_hidden_layers):
        h, m = f"model.layers.{i}.", f"decoder.layers.{i}."
        q = sd[h + "self_attn.q_proj.weight"].view(nkv, nh // nkv * hd, -1)
        k = sd[h + "self_attn.k_proj.weight"].view(nkv, hd, -1)
        v = sd[h + "self_attn.v_proj.weight"].view(nkv, hd, -1)
        out[m + "self_attention.linear_qkv.weight"] = torch.cat([q, k, v], dim=1).reshape(-1, q.shape[-1])
        out[m + "self_attention.linear_proj.weight"] = sd[h + "self_attn.o_proj.weight"]
        out[m + "input_layernorm.weight"] = sd[h + "input_layernorm.weight"]
        out[m + "pre_mlp_layernorm.weight"] = sd[h + "post_attention_layernorm.weight"]
        out[m + "mlp.linear_fc1.weight"] = (sd[h + "mlp.gate_proj.weight"], sd[h + "mlp.up_proj.weight"])
        out[m + "mlp.linear_fc2.weight"] = sd[h + "mlp.down_proj.weight"]
        if h + "self_attn.q_norm.weight" in sd:
            out[m + "self_attention.q_layernorm.weight"] = sd[h + "self_attn.q_norm.weight"]
            out[m + "self_attention.k_layernorm.weight"] = sd[h + "self_attn.k_norm.weight"]
    return out


def _shard(name: str, full, tp: int, r: int, target_shape):
    if isinstance(full, tuple):                                   # gate/up: rank r holds [gate_r; up_r]
        return torch.cat([full[0].chunk(tp)[r], full[1].chunk(tp)[r]])
    if "word_embeddings" in name or "output_layer" in name:
        pad = target_shape[0] * tp - full.shape[0]
        full = torch.cat([full, full.new_zeros(pad, full.shape[1])])
        return full.chunk(tp)[r]
    if "linear_qkv.weight" in name:
        return full.chunk(tp)[r]
    if "linear_proj.weight" in name or "linear_fc2.weight" in name:
        return full.chunk(tp, dim=1)[r]
    return full


def load_hf_into_model(model_chunks, hf_dir, parallel_info):
    from megatron.core import parallel_state as ps
    from safetensors.torch import load_file

    hf_cfg = load_hf_config(hf_dir)
    sd = {}
    for f in sorted(Path(hf_dir).glob("*.safetensors")):
        sd.update(load_file(str(f)))
    full = _hf_to_full_megatron(sd, hf_cfg)
    tp, r = ps.get_tensor_model_parallel_world_size(), ps.get_tensor_model_parallel_rank()
    for model in model_chunks:
        offset = model.decoder.layers[0].layer_number - 1 if len(model.decoder.layers) else 0
        with torch.no_grad():
            for name, p in model.state_dict().items():
                if name.endswith("_extra_state") or "rotary" in name:
                    continue
                key = name
                if name.startswith("decoder.layers."):
                    parts = name.split(".")
                    parts[2] = str(int(parts[2]) + offset)
                    key = ".".join(parts)
                if key not in full:
                    raise KeyError(f"fallback loader: no HF source for {key}")
                p.copy_(_shard(key, full[key], tp, r, p.shape).to(p.dtype))


def install() -> None:
    """Register the stand-ins under the real names that cannot be imported yet."""
    me = sys.modules[__name__]
    for modname, names in (("megatron_rl.parallel", ("init_parallel", "destroy_parallel")),
                           ("megatron_rl.models.provider", ("load_hf_config", "transformer_config_from_hf",
                                                            "build_gpt_model", "padded_vocab_size")),
                           ("megatron_rl.convert", ("load_hf_into_model",))):
        try:
            mod = importlib.import_module(modname)
            if all(hasattr(mod, n) for n in names):
                continue
        except ImportError:
            mod = types.ModuleType(modname)
            sys.modules[modname] = mod
        print(f"[actor_fallback] using stand-in for {modname}", file=sys.stderr, flush=True)
        for n in names:
            if not hasattr(mod, n):
                setattr(mod, n, getattr(me, n))


os.environ.setdefault("OMP_NUM_THREADS", "1")
