"""The Megatron ``dist_checkpointing`` layout of a model, derived from its HF config alone.

This is what ``GPTModel.sharded_state_dict(prefix="")`` (local layer spec) saves through the
``torch_dist`` backend, written at TP = PP = 1 granularity (every chunk is a main replica), so that
``dist_checkpointing.load`` reshards it to any TP / PP:

* non-layer tensors: key = Megatron name, one chunk = the whole tensor.
  ``embedding.word_embeddings.weight`` / ``output_layer.weight`` are ``[Vp, h]`` with the vocab
  padded to ``Vp = padded_vocab_size(tp)`` (zero rows); ``output_layer`` only when untied.
* layer tensors are stacked over layers: key = ``decoder.layers.<name>`` (layer index dropped,
  input / pre-MLP norms under their TE names ``self_attention.linear_qkv.layer_norm_weight`` /
  ``mlp.linear_fc1.layer_norm_weight``), global shape ``[L, *shape]``, layer i = chunk at offset
  ``(i, 0, ...)`` of size ``(1, *shape)``.
* ``linear_fc1`` (SwiGLU) is two chunks per layer: gate at ``(i, 0, 0)`` and up at ``(i, F, 0)``,
  each ``(1, F, h)`` (megatron's swiglu factory; the TP-independent form of ``[gate; up]``).
* ``linear_qkv`` rows are grouped per KV head g: ``[q rows of group g; k_g; v_g]`` (``transforms``).
* per layer i, a ``None`` extra state of each linear module is a byte object
  ``decoder.layers.<module>._extra_state/shard_<i>_<L>``.

A chunk is described by :class:`Segment` s (row ranges of HF tensors, or zero rows) that, laid end
to end, are its C-order bytes: the converter copies them without building the tensor.
"""
from __future__ import annotations

import dataclasses
import math

from megatron_rl.convert import name_maps
from megatron_rl.convert.live import full_shape
from megatron_rl.models.provider import ArchInfo, padded_vocab_size

EXTRA_STATE_MODULES = ("self_attention.linear_proj", "self_attention.linear_qkv", "mlp.linear_fc1", "mlp.linear_fc2")


@dataclasses.dataclass(frozen=True)
class Segment:
    """Rows ``[row0, row0 + rows)`` of HF tensor ``hf`` (``hf=None``: that many zero rows)."""

    hf: str | None
    row0: int
    rows: int


@dataclasses.dataclass(frozen=True)
class Chunk:
    """One stored piece of a tensor: ``global[offsets : offsets + sizes]`` = the segments, concatenated."""

    key: str
    global_shape: tuple[int, ...]
    offsets: tuple[int, ...]
    sizes: tuple[int, ...]
    segments: tuple[Segment, ...]

    @property
    def numel(self) -> int:
        return math.prod(self.sizes)


@dataclasses.dataclass(frozen=True)
class ObjectEntry:
    """A byte object (``torch.save([None])``): a module's empty extra state."""

    key: str


def stacked_key(local: str) -> str:
    """``decoder.layers.3.input_layernorm.weight`` -> ``decoder.layers.self_attention.linear_qkv.layer_norm_weight``."""
    parts = local.split(".")
    rest = ".".join(parts[3:])
    for loc, te in name_maps.TE_RENAMES.items():
        if rest == loc:
            rest = te
    return "decoder.layers." + rest


def _qkv_segments(rule: name_maps.Rule, arch: ArchInfo) -> tuple[Segment, ...]:
    q, k, v = rule.hf
    per, d = arch.num_heads // arch.num_kv_heads * arch.head_dim, arch.head_dim
    out = []
    for g in range(arch.num_kv_heads):
        out += [Segment(q, g * per, per), Segment(k, g * d, d), Segment(v, g * d, d)]
    return tuple(out)


def rule_chunks(rule: name_maps.Rule, arch: ArchInfo, tp: int = 1) -> list[Chunk]:
    """The stored chunks of one concrete (layer-filled) rule."""
    shape = full_shape(rule, arch)
    if not rule.mcore.startswith("decoder.layers."):
        segs = (Segment(rule.hf[0], 0, shape[0]),)
        if rule.tp == "vocab":
            vp = padded_vocab_size(arch, tp)
            segs += (Segment(None, 0, vp - shape[0]),) if vp > shape[0] else ()
            shape = (vp, *shape[1:])
        return [Chunk(rule.mcore, shape, (0,) * len(shape), shape, segs)]
    layer = int(rule.mcore.split(".")[2])
    key, gshape = stacked_key(rule.mcore), (arch.num_layers, *shape)
    zeros = (0,) * len(shape)
    if rule.transform == "gate_up":
        f = shape[0] // 2
        half = (1, f, *shape[1:])
        return [Chunk(key, gshape, (layer, *zeros), half, (Segment(rule.hf[0], 0, f),)),
                Chunk(key, gshape, (layer, f, *zeros[1:]), half, (Segment(rule.hf[1], 0, f),))]
    segs = _qkv_segments(rule, arch) if rule.transform == "qkv" else (Segment(rule.hf[0], 0, shape[0]),)
    return [Chunk(key, gshape, (layer, *zeros), (1, *shape), segs)]


def extra_state_keys(arch: ArchInfo, layers: range | None = None) -> list[ObjectEntry]:
    """Byte-object keys of the layers' (empty) extra states."""
    layers = range(arch.num_layers) if layers is None else layers
    return [ObjectEntry(f"decoder.layers.{m}._extra_state/shard_{i}_{arch.num_layers}")
            for i in layers for m in EXTRA_STATE_MODULES]


def mcore_layout(arch: ArchInfo, tp: int = 1) -> tuple[list[Chunk], list[ObjectEntry]]:
    """Every stored chunk (in HF order: embedding, layer 0 .. L-1, final norm, lm head) and byte object."""
    chunks = [c for r in name_maps.expand(arch) for c in rule_chunks(r, arch, tp)]
    return chunks, extra_state_keys(arch)
