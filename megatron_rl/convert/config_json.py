"""``ArchInfo`` straight from ``config.json``, without importing ``transformers``.

Importing a transformers config class pulls in torch._dynamo, torch.distributed.tensor and sympy
(~150 MB RSS and seconds of start-up): as much as the whole streaming conversion. Here the shape
facts are read from the JSON with the defaults of the HF config classes for the three supported
architectures; any other case (a shape key missing, an unknown ``model_type``) falls back to
:func:`megatron_rl.models.provider.model_arch_info` (transformers). Every HF tensor's shape is then
checked against the derived layout, so a wrong fact cannot pass silently.
"""
from __future__ import annotations

import json
import os
import types
from pathlib import Path

from megatron_rl.models.provider import ArchInfo, _rope, architecture, model_arch_info

REQUIRED = ("hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size", "vocab_size",
            "rms_norm_eps")
# defaults of the HF config classes for keys a config.json may leave out
_DEFAULTS = {
    "LlamaForCausalLM": {"num_key_value_heads": None, "head_dim": None, "max_position_embeddings": 2048},
    "Qwen2ForCausalLM": {"num_key_value_heads": 32, "head_dim": None, "max_position_embeddings": 32768},
    "Qwen3ForCausalLM": {"num_key_value_heads": 32, "head_dim": 128, "max_position_embeddings": 32768},
}


def config_path(hf_dir: str | os.PathLike) -> Path:
    """``hf_dir/config.json``, or ``hf_dir`` itself when it names a ``.json`` file."""
    p = Path(hf_dir)
    return p if p.is_file() and p.name.endswith(".json") else p / "config.json"


def read_config(hf_dir: str | os.PathLike) -> dict:
    p = config_path(hf_dir)
    if not p.is_file():
        raise FileNotFoundError(f"no config.json in {hf_dir}")
    return json.loads(p.read_text())


DTYPE_NAMES = {"float32": "float32", "fp32": "float32", "bfloat16": "bfloat16", "bf16": "bfloat16",
               "float16": "float16", "fp16": "float16"}


def parse_dtype(name: str):
    """``"bf16"`` / ``"bfloat16"`` / ... -> ``torch.bfloat16`` (``ValueError`` naming the choices)."""
    import torch  # lazy: defers torch to the call

    try:
        return getattr(torch, DTYPE_NAMES[str(name).removeprefix("torch.")])
    except KeyError:
        raise ValueError(f"unsupported dtype {name!r}; choose one of {', '.join(sorted(DTYPE_NAMES))}") from None


def with_dtype(cfg: dict, dtype) -> dict:
    """``cfg`` naming ``dtype`` as the weights' dtype (``dtype``, and ``torch_dtype`` when present:
    transformers 5 writes the former, older versions the latter)."""
    name = str(dtype).removeprefix("torch.")
    return {**cfg, "dtype": name, **({"torch_dtype": name} if "torch_dtype" in cfg else {})}


def arch_info(hf_dir: str | os.PathLike) -> tuple[ArchInfo, bool]:
    """(ArchInfo, True) from the JSON alone, or (ArchInfo via transformers, False) when it cannot."""
    d = read_config(hf_dir)
    arch = architecture(types.SimpleNamespace(**{k: d.get(k) for k in ("architectures", "model_type")}))
    if any(k not in d for k in REQUIRED) or d.get("model_type") not in ("llama", "qwen2", "qwen3"):
        return model_arch_info(hf_dir), False
    ns = types.SimpleNamespace(**{**_DEFAULTS[arch], "tie_word_embeddings": False, **d})
    if ns.num_key_value_heads is None:
        ns.num_key_value_heads = ns.num_attention_heads
    heads, kv = int(ns.num_attention_heads), int(ns.num_key_value_heads)
    if heads % kv:
        raise ValueError(f"num_attention_heads={heads} is not a multiple of num_key_value_heads={kv}")
    if arch == "LlamaForCausalLM" and (d.get("attention_bias") or d.get("mlp_bias")):
        raise ValueError("Llama with attention_bias/mlp_bias is not supported")
    theta, scaling = _rope(ns)
    return ArchInfo(
        architecture=arch, num_layers=int(ns.num_hidden_layers), hidden_size=int(ns.hidden_size),
        num_heads=heads, num_kv_heads=kv, head_dim=int(ns.head_dim or ns.hidden_size // heads),
        ffn_hidden_size=int(ns.intermediate_size), vocab_size=int(ns.vocab_size),
        tied_embeddings=bool(ns.tie_word_embeddings),
        qkv_bias=arch == "Qwen2ForCausalLM" or bool(d.get("attention_bias", False)),
        qk_norm=arch == "Qwen3ForCausalLM", rms_norm_eps=float(ns.rms_norm_eps), rope_theta=theta,
        rope_scaling=scaling, max_position_embeddings=int(ns.max_position_embeddings)), True
