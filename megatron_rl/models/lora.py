"""LoRA adapters on Megatron's tensor-parallel linears (megatron-core 0.16 has none), built through the layer spec.

Notation: a linear ``y = W x`` (W: [out, in]) gets ``y = W x + s · B (A x)`` with A: [r, in], B: [out, r],
s = alpha / r (Hu et al. 2021, eq. 3; PEFT's ``scaling``); W frozen, A and B trained.

Where the adapters go (HF projection -> Megatron module, its tensor-parallel kind)::

    q_proj k_proj v_proj   self_attention.linear_qkv   column (fused, rows grouped per KV head)
    o_proj                 self_attention.linear_proj  row
    gate_proj up_proj      mlp.linear_fc1              column (fused [gate; up])
    down_proj              mlp.linear_fc2              row

A fused module holds ONE ADAPTER PER HF PROJECTION (``lora_A.q`` / ``lora_B.q``, ``.k``, ``.v``; ``.gate``,
``.up``), not one rank-r adapter on the fused matrix: PEFT's per-projection adapters have independent A's,
so only this form converts to and from a PEFT adapter exactly. The parts' outputs are joined in the fused
layout of the base weight (``convert/transforms.py``): qkv per local KV group ``[q_g; k_g; v_g]``, fc1
``[gate_r; up_r]``.

Sharding (TP rank t of T), as the base weight is:

* column-parallel (qkv, fc1): A replicated [r, in]; B split along its output rows [out/T, r] (each part's
  rows chunked as the part's HF rows are: heads / KV heads / F contiguous per rank).
  ``y_t = W_t x + s · B_t (A x)``. ∂L/∂A = Σ_t B_tᵀ ∂L/∂y_t xᵀ is a sum over TP ranks: A enters through
  ``copy_to_tensor_model_parallel_region`` (identity forward, all-reduce of its gradient backward). The
  adapter's input gradient joins the base's: all-reduced (``allreduce_dgrad``) or reduce-scattered (sequence
  parallel: the adapter reads the gathered input) with it.
* row-parallel (proj, fc2): A split along its input [r, in/T]; B replicated [out, r]. The adapter's partial
  ``s · B (A_t x_t)`` is added to the base's partial product BEFORE the base's reduction (all-reduce, or
  reduce-scatter under sequence parallelism), so one reduction carries both. ∂L/∂B = Σ_t ∂L/∂y (A_t x_t)ᵀ is
  a sum over TP ranks: B enters through ``copy_to_tensor_model_parallel_region`` as A does above.

Why subclasses and an override of ``_forward_impl``: the adapter must read the base's input after its
sequence-parallel handling and add into the base's partial product before the reduction, which is the
method megatron's ``ColumnParallelLinear`` / ``RowParallelLinear`` call for the matrix product
(``_forward_impl(input, weight, ...)``, an overridable method in 0.16). The subclasses are put in place by
the layer spec (:func:`lora_layer_spec`), nothing is patched.

Initialisation (:func:`init_adapters`): A ~ U(−1/√in, 1/√in) (PEFT's ``kaiming_uniform_(a=√5)`` bound, with
``in`` the full input size), B = 0, so the policy starts as the base. Each full tensor is drawn from its own
generator seeded by (seed, global layer, module, part) and then sharded, so the adapters do not depend on
TP / PP.

Checkpoints: :meth:`sharded_state_dict` declares the adapters' sharding (B axis 0 / A replicated on column;
A axis 1 / B replicated on row), so dist_checkpointing reshards them as the base.
"""
from __future__ import annotations

import contextlib
import dataclasses
import hashlib
from collections.abc import Iterable, Iterator

import torch
import torch.nn.functional as F

#: HF projection names LoRA may target (PEFT's ``target_modules``), in HF layer order
TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")

#: Megatron module (in a decoder layer) -> (tensor-parallel kind, its parts: (part key, HF module path))
MODULES: dict[str, tuple[str, tuple[tuple[str, str], ...]]] = {
    "self_attention.linear_qkv": ("col", (("q", "self_attn.q_proj"), ("k", "self_attn.k_proj"),
                                          ("v", "self_attn.v_proj"))),
    "self_attention.linear_proj": ("row", (("o", "self_attn.o_proj"),)),
    "mlp.linear_fc1": ("col", (("gate", "mlp.gate_proj"), ("up", "mlp.up_proj"))),
    "mlp.linear_fc2": ("row", (("down", "mlp.down_proj"),)),
}


@dataclasses.dataclass(frozen=True)
class LoraSpec:
    """What the layer spec builds: rank r, alpha (s = alpha / r) and the targeted HF projections."""

    rank: int
    alpha: float
    targets: tuple[str, ...] = TARGETS

    def __post_init__(self):
        if self.rank < 1:
            raise ValueError(f"LoRA rank must be >= 1, got {self.rank}")
        bad = sorted(set(self.targets) - set(TARGETS))
        if bad or not self.targets:
            raise ValueError(f"LoRA target_modules {bad or '[]'} invalid; valid: {list(TARGETS)}")

    @property
    def scaling(self) -> float:
        """s = alpha / r."""
        return self.alpha / self.rank

    def parts(self, module: str) -> tuple[str, ...]:
        """The targeted part keys of a Megatron module (``q``, ``k`` ... in its fused order)."""
        return tuple(k for k, hf in MODULES[module][1] if hf.split(".")[-1] in self.targets)


def is_adapter_param(name: str) -> bool:
    """Is ``name`` (a parameter name of a model chunk) a LoRA adapter's?"""
    return ".lora_A." in name or ".lora_B." in name


class _LoraMixin:
    """The adapter state and arithmetic shared by the column and row classes (see the module docstring)."""

    lora_kind = "col"

    def _lora_init(self, lora: LoraSpec, module: str) -> None:
        cfg = self.config
        tp = self.tp_group.size() if self.tp_group is not None else 1
        self.lora_spec, self.lora_module, self.lora_enabled = lora, module, True
        self.lora_parts = lora.parts(module)
        d, heads, groups = cfg.kv_channels, cfg.num_attention_heads, cfg.num_query_groups or cfg.num_attention_heads
        rows = {"q": heads * d // tp, "k": groups * d // tp, "v": groups * d // tp,
                "gate": cfg.ffn_hidden_size // tp, "up": cfg.ffn_hidden_size // tp}
        self.lora_rows = {k: rows.get(k, 0) for k, _ in MODULES[module][1]}   # local output rows per part (column)
        self.lora_groups = groups // tp
        dev = self.weight.device
        dtype = self.weight.dtype
        if self.lora_kind == "col":
            a_shape = {k: (lora.rank, self.input_size) for k in self.lora_parts}
            b_shape = {k: (self.lora_rows[k], lora.rank) for k in self.lora_parts}
        else:
            a_shape = {k: (lora.rank, self.input_size_per_partition) for k in self.lora_parts}
            b_shape = {k: (self.output_size, lora.rank) for k in self.lora_parts}
        self.lora_A = torch.nn.ParameterDict({k: torch.nn.Parameter(torch.zeros(s, device=dev, dtype=dtype))
                                              for k, s in a_shape.items()})
        self.lora_B = torch.nn.ParameterDict({k: torch.nn.Parameter(torch.zeros(s, device=dev, dtype=dtype))
                                              for k, s in b_shape.items()})
        for p in (*self.lora_A.values(), *self.lora_B.values()):
            p.allreduce = True        # megatron's DDP flag: reduced over data-parallel ranks (not an expert param)

    def _tp_sum(self, p: torch.Tensor) -> torch.Tensor:
        """``p`` whose gradient is summed over the TP group (identity forward)."""
        if self.tp_group is None or self.tp_group.size() == 1:
            return p
        from megatron.core.tensor_parallel.mappings import copy_to_tensor_model_parallel_region  # lazy: megatron

        return copy_to_tensor_model_parallel_region(p, group=self.tp_group)

    def _join(self, parts: dict[str, torch.Tensor], like: torch.Tensor) -> torch.Tensor:
        """Per-part outputs [..., rows_k] -> the fused layout [..., Σ rows_k] (untargeted parts: zeros)."""
        full = {k: parts[k] if k in parts else like.new_zeros(*like.shape[:-1], n) for k, n in self.lora_rows.items()}
        if self.lora_module != "self_attention.linear_qkv":
            return torch.cat(list(full.values()), dim=-1)
        g = self.lora_groups
        lead = like.shape[:-1]
        return torch.cat([full[k].reshape(*lead, g, -1) for k in ("q", "k", "v")], dim=-1).reshape(*lead, -1)

    def lora_delta(self, x: torch.Tensor) -> torch.Tensor:
        """s · B (A x) of this rank, in the base's partial-output layout (column: its rows; row: to be reduced)."""
        s = self.lora_spec.scaling
        if self.lora_kind == "col":
            out = {k: F.linear(F.linear(x, self._tp_sum(self.lora_A[k])), self.lora_B[k]) for k in self.lora_parts}
            return s * self._join(out, x.new_empty(*x.shape[:-1], 1))
        k = self.lora_parts[0]
        return s * F.linear(F.linear(x, self.lora_A[k]), self._tp_sum(self.lora_B[k]))

    def _forward_impl(self, input, weight, *args, **kwargs):
        out = super()._forward_impl(input, weight, *args, **kwargs)
        if not self.lora_enabled or not self.lora_parts:
            return out
        x = input
        if self.lora_kind == "col" and kwargs.get("sequence_parallel"):
            from megatron.core.tensor_parallel.mappings import gather_from_sequence_parallel_region  # lazy: megatron

            x = gather_from_sequence_parallel_region(input, tensor_parallel_output_grad=True, group=self.tp_group)
        elif self.lora_kind == "col" and kwargs.get("allreduce_dgrad") and self.tp_group.size() > 1:
            from megatron.core.tensor_parallel.mappings import copy_to_tensor_model_parallel_region  # lazy: megatron

            x = copy_to_tensor_model_parallel_region(input, group=self.tp_group)   # the base all-reduces its own dgrad
        return out + self.lora_delta(x).to(out.dtype)

    @torch.no_grad()
    def merged_weight(self) -> torch.Tensor:
        """This rank's shard of W + s · B A (the base's layout), or W itself when the adapters are off."""
        w = self.weight.detach()
        if not self.lora_enabled or not self.lora_parts:
            return w
        s = self.lora_spec.scaling
        if self.lora_kind == "col":   # [in, rows_k] per part, joined on the row dimension, transposed back
            parts = {k: (self.lora_B[k].float() @ self.lora_A[k].float()).T for k in self.lora_parts}
            delta = self._join(parts, w.new_empty(w.shape[1], 1, dtype=torch.float32)).T
        else:
            k = self.lora_parts[0]
            delta = self.lora_B[k].float() @ self.lora_A[k].float()
        return (w.float() + s * delta).to(w.dtype)

    def sharded_state_dict(self, prefix="", sharded_offsets=(), metadata=None):
        """The base's sharding plus the adapters': column B along rows (A replicated), row A along columns."""
        from megatron.core.transformer.utils import make_sharded_tensors_for_checkpoint  # lazy: megatron

        axes = {"weight": 0, "bias": 0} if self.lora_kind == "col" else {"weight": 1}
        ab = "lora_B" if self.lora_kind == "col" else "lora_A"
        axes.update({f"{ab}.{k}": 0 if self.lora_kind == "col" else 1 for k in self.lora_parts})
        return make_sharded_tensors_for_checkpoint(self.state_dict(prefix="", keep_vars=True), prefix, axes,
                                                   sharded_offsets, tp_group=self.tp_group,
                                                   dp_cp_group=metadata["dp_cp_group"])


def _lora_class(base: type, kind: str) -> type:
    """A subclass of megatron's ``base`` linear with adapters (built by the spec with ``lora`` / ``module``)."""

    def __init__(self, *args, lora: LoraSpec, module: str, **kwargs):
        base.__init__(self, *args, **kwargs)
        self._lora_init(lora, module)

    return type(f"Lora{base.__name__}", (_LoraMixin, base), {"__init__": __init__, "lora_kind": kind,
                                                              "__doc__": f"{base.__name__} with LoRA adapters."})


_CLASSES: dict[tuple[type, str], type] = {}


def lora_class(base: type, kind: str) -> type:
    """One adapter class per (megatron linear, kind), made once (pickling and isinstance stay stable)."""
    if (base, kind) not in _CLASSES:
        _CLASSES[base, kind] = _lora_class(base, kind)
    return _CLASSES[base, kind]


def lora_layer_spec(spec, lora: LoraSpec):
    """The decoder layer ``spec`` (megatron ``ModuleSpec`` of the local backend) with the targeted linears
    replaced by their adapter classes; a module with no targeted part keeps megatron's class."""
    from megatron.core.tensor_parallel import ColumnParallelLinear, RowParallelLinear  # lazy: megatron
    from megatron.core.transformer.spec_utils import ModuleSpec  # lazy: megatron

    spec = _copy_spec(spec)
    for module, (kind, _) in MODULES.items():
        if not lora.parts(module):
            continue
        owner_name, attr = module.split(".")
        owner = getattr(spec.submodules, owner_name).submodules
        cls = getattr(owner, attr)
        cls = cls.module if isinstance(cls, ModuleSpec) else cls
        want = ColumnParallelLinear if kind == "col" else RowParallelLinear
        if not (isinstance(cls, type) and issubclass(cls, want)):
            raise TypeError(f"LoRA needs megatron's {want.__name__} at {module} (the local layer spec, "
                             f"model.backend=local); this spec builds {getattr(cls, '__name__', cls)}")
        setattr(owner, attr, ModuleSpec(module=lora_class(cls, kind), params={"lora": lora, "module": module}))
    return spec


def _copy_spec(spec):
    """A copy of the spec tree down to the linears' owners (the caller's spec is left as it was)."""
    spec = dataclasses.replace(spec, submodules=dataclasses.replace(spec.submodules))
    for name in ("self_attention", "mlp"):
        sub = getattr(spec.submodules, name)
        setattr(spec.submodules, name, dataclasses.replace(sub, submodules=dataclasses.replace(sub.submodules)))
    return spec


def lora_modules(model: torch.nn.Module, layer_offset: int = 0) -> Iterator[tuple[int, str, _LoraMixin]]:
    """``(global layer index, module name in the layer, module)`` of every adapter module of a chunk."""
    for name, m in model.named_modules():
        if isinstance(m, _LoraMixin):
            parts = name.split(".")
            i = parts.index("layers")
            yield int(parts[i + 1]) + layer_offset, ".".join(parts[i + 2:]), m


def _seed(seed: int, layer: int, module: str, part: str) -> int:
    return int.from_bytes(hashlib.sha256(f"{seed}/{layer}/{module}/{part}".encode()).digest()[:8], "little") >> 1


def tp_shard(full: torch.Tensor, kind: str, which: str, tp: int, rank: int) -> torch.Tensor:
    """This TP rank's slice of a full adapter tensor: column B by rows, row A by columns, else replicated."""
    if tp == 1 or (kind, which) not in (("col", "B"), ("row", "A")):
        return full
    return full.chunk(tp, dim=0 if which == "B" else 1)[rank]


@torch.no_grad()
def init_adapters(model: torch.nn.Module, layer_offset: int, seed: int, tp: int = 1, tp_rank: int = 0) -> None:
    """A ~ U(−1/√in, 1/√in), B = 0 (module docstring), from a generator per full tensor: TP/PP-independent."""
    for layer, module, m in lora_modules(model, layer_offset):
        kind = m.lora_kind
        for k in m.lora_parts:
            a = m.lora_A[k]
            full_in = a.shape[1] * (tp if kind == "row" else 1)
            g = torch.Generator().manual_seed(_seed(seed, layer, module, k))
            full = (torch.rand(a.shape[0], full_in, generator=g, dtype=torch.float64) * 2 - 1) / full_in ** 0.5
            a.copy_(tp_shard(full, kind, "A", tp, tp_rank).to(a.dtype))
            m.lora_B[k].zero_()


def freeze_base(model: torch.nn.Module) -> int:
    """requires_grad False on every parameter but the adapters'; returns the number of adapter parameters.

    The embedding's output is then marked as requiring grad (a forward hook): with the embedding frozen nothing
    upstream of the first layer needs a gradient, and megatron's full recompute (``CheckpointFunction``, an
    autograd function) would hand back an output that needs none, so no gradient would reach the adapters
    inside it (measured: grad norm 0 at ``model.recompute=full``)."""
    n = 0
    for name, p in model.named_parameters():
        p.requires_grad_(is_adapter_param(name))
        n += p.numel() if p.requires_grad else 0
    emb = getattr(model, "embedding", None)
    if emb is not None and not getattr(emb, "_lora_input_grads", False):
        emb.register_forward_hook(lambda _m, _i, out: out.requires_grad_(True) if torch.is_grad_enabled() else out)
        emb._lora_input_grads = True
    return n


@contextlib.contextmanager
def adapters_disabled(chunks: Iterable[torch.nn.Module]):
    """Within the block every adapter of ``chunks`` is off: the chunks compute the base model (the KL reference
    with no second model in memory)."""
    mods = [m for c in chunks for m in c.modules() if isinstance(m, _LoraMixin)]
    before = [m.lora_enabled for m in mods]
    for m in mods:
        m.lora_enabled = False
    try:
        yield
    finally:
        for m, b in zip(mods, before):
            m.lora_enabled = b


def has_adapters(chunks: Iterable[torch.nn.Module]) -> bool:
    return any(isinstance(m, _LoraMixin) for c in chunks for m in c.modules())
