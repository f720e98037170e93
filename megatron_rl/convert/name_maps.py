"""Declarative Megatron <-> HF name maps: the single source of truth for parameter names.

One map per HF ``architectures[0]``. ``{}`` is the layer index (global, 0-based). Each rule names
the Megatron parameter, the HF tensor(s) it is made of, the transform that joins them
(``transforms.py``) and how the Megatron tensor is split over tensor-parallel ranks:

* ``col``   column-parallel: dim 0 (QKV by KV groups, fc1 as ``[gate_r; up_r]`` per rank)
* ``row``   row-parallel: dim 1
* ``vocab`` vocab-parallel: dim 0, padded to ``padded_vocab_size``
* ``rep``   replicated on every TP rank (norms)

Weight sync, ``tools/convert`` and the HF exporter all read these rules.
"""
from __future__ import annotations

import dataclasses
import re

from megatron_rl.models.provider import ArchInfo


@dataclasses.dataclass(frozen=True)
class Rule:
    """One Megatron parameter and the HF tensors it is built from."""

    mcore: str
    hf: tuple[str, ...]
    transform: str = "identity"  # identity | qkv | gate_up
    tp: str = "rep"  # col | row | vocab | rep

    @property
    def per_layer(self) -> bool:
        return "{}" in self.mcore

    def at(self, layer: int | None) -> "Rule":
        """The rule with the layer placeholder filled in."""
        if not self.per_layer:
            return self
        return Rule(self.mcore.format(layer), tuple(h.format(layer) for h in self.hf), self.transform, self.tp)


_L, _H = "decoder.layers.{}.", "model.layers.{}."
_DENSE = (
    Rule("embedding.word_embeddings.weight", ("model.embed_tokens.weight",), tp="vocab"),
    Rule("decoder.final_layernorm.weight", ("model.norm.weight",)),
    Rule(_L + "input_layernorm.weight", (_H + "input_layernorm.weight",)),
    Rule(_L + "self_attention.linear_qkv.weight",
         (_H + "self_attn.q_proj.weight", _H + "self_attn.k_proj.weight", _H + "self_attn.v_proj.weight"),
         "qkv", "col"),
    Rule(_L + "self_attention.linear_proj.weight", (_H + "self_attn.o_proj.weight",), tp="row"),
    Rule(_L + "pre_mlp_layernorm.weight", (_H + "post_attention_layernorm.weight",)),
    Rule(_L + "mlp.linear_fc1.weight", (_H + "mlp.gate_proj.weight", _H + "mlp.up_proj.weight"), "gate_up", "col"),
    Rule(_L + "mlp.linear_fc2.weight", (_H + "mlp.down_proj.weight",), tp="row"),
)
_LM_HEAD = Rule("output_layer.weight", ("lm_head.weight",), tp="vocab")
_QKV_BIAS = Rule(_L + "self_attention.linear_qkv.bias",
                 (_H + "self_attn.q_proj.bias", _H + "self_attn.k_proj.bias", _H + "self_attn.v_proj.bias"),
                 "qkv", "col")
_QK_NORM = (Rule(_L + "self_attention.q_layernorm.weight", (_H + "self_attn.q_norm.weight",)),
            Rule(_L + "self_attention.k_layernorm.weight", (_H + "self_attn.k_norm.weight",)))

NAME_MAPS: dict[str, tuple[Rule, ...]] = {
    "LlamaForCausalLM": _DENSE,
    "Qwen2ForCausalLM": _DENSE + (_QKV_BIAS,),
    "Qwen3ForCausalLM": _DENSE + _QK_NORM,
}

# Transformer Engine layer spec fuses the pre-attention / pre-MLP norms into the linear layers.
TE_RENAMES = {"input_layernorm.weight": "self_attention.linear_qkv.layer_norm_weight",
              "pre_mlp_layernorm.weight": "mlp.linear_fc1.layer_norm_weight"}


def rules_for(arch: ArchInfo) -> tuple[Rule, ...]:
    """Rules of an architecture (``lm_head`` only when embeddings are untied)."""
    try:
        rules = NAME_MAPS[arch.architecture]
    except KeyError:
        raise ValueError(f"no name map for {arch.architecture!r}; supported: {', '.join(sorted(NAME_MAPS))}") from None
    return rules if arch.tied_embeddings else rules + (_LM_HEAD,)


def expand(arch: ArchInfo, layers: range | None = None) -> list[Rule]:
    """Concrete rules for ``layers`` (default all) plus the non-layer rules, in HF order."""
    layers = range(arch.num_layers) if layers is None else layers
    rules = rules_for(arch)
    head = [r for r in rules if not r.per_layer and r.mcore.startswith("embedding")]
    tail = [r for r in rules if not r.per_layer and not r.mcore.startswith("embedding")]
    return head + [r.at(i) for i in layers for r in rules if r.per_layer] + tail


def expected_hf_names(arch: ArchInfo) -> set[str]:
    """Every HF tensor name a complete checkpoint of ``arch`` holds."""
    return {h for r in expand(arch) for h in r.hf}


_LAYER_RE = re.compile(r"^decoder\.layers\.(\d+)\.(.*)$")


def local_to_global(name: str, layer_offset: int) -> str:
    """Megatron chunk-local parameter name -> global name (pipeline stages number layers from 0)."""
    m = _LAYER_RE.match(name)
    if m is None:
        return name
    return f"decoder.layers.{int(m.group(1)) + layer_offset}.{m.group(2)}"


def canonical_local_name(name: str) -> str:
    """Map TE-spec fused norm names back to the local-spec names the rules use."""
    for local, te in TE_RENAMES.items():
        if name.endswith(te):
            return name[: -len(te)] + local
    return name
