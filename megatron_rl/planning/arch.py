"""The shape of the model ``megatron-rl plan`` plans: :class:`ArchSpec`, read from a HF ``config.json``
(file or folder; Llama / Qwen2 / Qwen3 families) or a built-in preset (:data:`PRESETS`, ``--list-models``).

Only the facts memory depends on (hidden size, layers, heads, head dim, FFN size, vocabulary, tied
embeddings, QKV bias, QK norm); the memory model that uses them is ``memory.py``.
"""
from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

SUPPORTED_ARCHITECTURES = ("LlamaForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM")


@dataclass(frozen=True)
class ArchSpec:
    """The shape facts of a decoder-only model that memory depends on."""

    name: str
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    ffn: int
    vocab: int
    tied: bool
    qkv_bias: bool
    qk_norm: bool

    @classmethod
    def from_hf(cls, cfg: Mapping, name: str = "model") -> ArchSpec:
        """Build from a HF ``config.json`` dict (Llama / Qwen2 / Qwen3 families)."""
        arch = (cfg.get("architectures") or ["?"])[0]
        if arch not in SUPPORTED_ARCHITECTURES:
            raise ValueError(f"{name}: architecture {arch!r} is not supported; supported: {list(SUPPORTED_ARCHITECTURES)}")
        try:
            h, heads = int(cfg["hidden_size"]), int(cfg["num_attention_heads"])
            spec = cls(name=name, hidden=h, layers=int(cfg["num_hidden_layers"]), heads=heads,
                       kv_heads=int(cfg.get("num_key_value_heads") or heads),
                       head_dim=int(cfg.get("head_dim") or h // heads), ffn=int(cfg["intermediate_size"]),
                       vocab=int(cfg["vocab_size"]), tied=bool(cfg.get("tie_word_embeddings", False)),
                       qkv_bias=arch == "Qwen2ForCausalLM" or bool(cfg.get("attention_bias", False)),
                       qk_norm=arch == "Qwen3ForCausalLM")
        except KeyError as e:
            raise ValueError(f"{name}: config.json lacks the field {e.args[0]!r}") from None
        if spec.heads % spec.kv_heads:
            raise ValueError(f"{name}: num_attention_heads {spec.heads} is not a multiple of num_key_value_heads {spec.kv_heads}")
        return spec

    def total_params(self) -> int:
        """Unpadded parameter count, as HF reports it (sum of numel over the state dict)."""
        q, kv, h = self.heads * self.head_dim, self.kv_heads * self.head_dim, self.hidden
        layer = h * (q + 2 * kv) + q * h + 3 * h * self.ffn + 2 * h
        layer += self.qkv_bias * (q + 2 * kv) + self.qk_norm * 2 * self.head_dim
        return self.layers * layer + self.vocab * h * (1 if self.tied else 2) + h


def _preset(arch, h, L, a, k, f, v, tied, d=128, **kw) -> dict:
    model_type = {"LlamaForCausalLM": "llama", "Qwen2ForCausalLM": "qwen2", "Qwen3ForCausalLM": "qwen3"}[arch]
    return {"architectures": [arch], "model_type": model_type, "hidden_size": h, "num_hidden_layers": L, "num_attention_heads": a,
            "num_key_value_heads": k, "head_dim": d, "intermediate_size": f, "vocab_size": v,
            "tie_word_embeddings": tied, **kw}


#: Published shapes (config.json) of the models the example configs use.
PRESETS: dict[str, dict] = {
    "qwen3-1.7b": _preset("Qwen3ForCausalLM", 2048, 28, 16, 8, 6144, 151936, True),
    "qwen3-4b": _preset("Qwen3ForCausalLM", 2560, 36, 32, 8, 9728, 151936, True),
    "qwen3-8b": _preset("Qwen3ForCausalLM", 4096, 36, 32, 8, 12288, 151936, False),
    "qwen3-14b": _preset("Qwen3ForCausalLM", 5120, 40, 40, 8, 17408, 151936, False),
    "qwen2.5-3b": _preset("Qwen2ForCausalLM", 2048, 36, 16, 2, 11008, 151936, True),
    "qwen2.5-7b": _preset("Qwen2ForCausalLM", 3584, 28, 28, 4, 18944, 152064, False),
    "qwen2.5-14b": _preset("Qwen2ForCausalLM", 5120, 48, 40, 8, 13824, 152064, False),
    "llama3.1-8b": _preset("LlamaForCausalLM", 4096, 32, 32, 8, 14336, 128256, False),
}


def load_arch(model: str) -> ArchSpec:
    """``model`` is a preset name, a ``config.json`` path, or a folder holding one."""
    key = model.lower().replace("_", "-")
    if key in PRESETS:
        return ArchSpec.from_hf(PRESETS[key], name=key)
    p = Path(model)
    if p.is_dir():
        p = p / "config.json"
    if not p.is_file():
        raise ValueError(f"model {model!r}: not a preset ({', '.join(sorted(PRESETS))}) "
                         f"and no config.json found at {p}")
    try:
        cfg = json.loads(p.read_text())
    except json.JSONDecodeError as e:
        raise ValueError(f"{p}: not valid JSON ({e})") from None
    return ArchSpec.from_hf(cfg, name=str(model))
