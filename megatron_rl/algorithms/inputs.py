"""The input registry and the frozen per-step bundle every registered advantage and policy loss reads.

An INPUT is a named per-step tensor between whoever produces it (the update pipeline, a data path, a
plugin) and the functions that read it (an advantage, a loss). It is registered once, by whoever
introduces it (``register_input``: name, shape, dtype; the family module whose formulas read it, or
the data path / plugin that produces it), declared by the readers (``register_policy_loss(...,
needs=(...))``) and by the producers (``DataPath.provides``); the config load checks that the
method's path provides everything its functions need (``DataPath.validate``), so a missing input is
a one-line error at start-up, never a ``None`` at step 1.

Shapes name their dims: ``"N"`` the samples, ``"T"`` the response tokens (both checked against the
bundle's ``rewards`` / ``mask``), any other name a free dim, an int an exact size; ``()`` a scalar
(a Python number). An input with ``"T"`` is per-token, else per-sequence (:attr:`InputSpec.role`).
The trainer carries registered inputs generically: it slices / packs every per-row extra by its
leading dim, zeroes an input with a ``filler`` on padding copies (masks), gathers an input with a
``policy`` source from the current policy's log-probs at ``extras[index]`` and logs an input's
``diagnostic`` whenever it is present.

One :class:`AlgoInputs` is built per step (advantage time) and per micro-batch (update time): a
frozen mapping of the registered inputs it holds, with typed accessors (``x.teacher_logp`` is the
tensor or None for a registered name; ``x.tensor(name)`` raises naming a missing one).
"""
from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import FrozenInstanceError, dataclass
from types import MappingProxyType

import torch
from torch import Tensor

DTYPES = ("float", "int", "bool", "any")
POLICY_SOURCES = ("logp", "support")


@dataclass(frozen=True)
class InputSpec:
    """A registered input: ``shape`` (dims as in the module docstring), ``dtype`` (``float`` / ``int`` /
    ``bool`` / ``any``), what it is (``doc``); trainer-side handling: ``filler(v) -> v'`` the rows of a
    zero-mask padding copy (masks: zeros), ``policy`` (``"logp"``: the current policy's log-probs at
    positions ``extras[index]``; ``"support"``: its top-k support log-probs there), ``diagnostic(x) ->
    {metric: (sum, weight)}`` logged whenever the input is present."""

    name: str
    shape: tuple
    dtype: str = "float"
    doc: str = ""
    filler: Callable | None = None
    policy: str | None = None
    index: str = "resp_pos"
    diagnostic: Callable | None = None

    @property
    def role(self) -> str:
        """``"token"`` (has a ``T`` dim), ``"sequence"`` (leading ``N``, no ``T``) or ``"scalar"``."""
        return "scalar" if not self.shape else ("token" if "T" in self.shape else "sequence")

    def check(self, v, n: int, t: int) -> None:
        """``ValueError`` naming the input when ``v`` does not match its shape / dtype."""
        if self.role == "scalar":
            if not isinstance(v, (int, float)):
                raise ValueError(f"input {self.name!r} is a scalar, got {type(v).__name__}")  # noqa: TRY004
            return
        if not isinstance(v, Tensor):
            raise ValueError(f"input {self.name!r} must be a tensor, got {type(v).__name__}")  # noqa: TRY004
        want = {"N": n, "T": t}
        ok = v.dim() == len(self.shape) and all(
            (isinstance(d, int) and s == d) or (isinstance(d, str) and want.get(d, s) == s)
            for d, s in zip(self.shape, v.shape))
        if not ok:
            raise ValueError(f"input {self.name!r} has shape {tuple(v.shape)}; expected {self.shape} with N={n}, T={t}")
        kind = "bool" if v.dtype == torch.bool else "float" if v.dtype.is_floating_point else "int"
        if self.dtype != "any" and kind != self.dtype:
            raise ValueError(f"input {self.name!r} must be {self.dtype}, got {v.dtype}")


_INPUTS: dict = {}


def register_input(name: str, shape, dtype: str = "float", doc: str = "", *, filler: Callable | None = None,
                   policy: str | None = None, index: str = "resp_pos", diagnostic: Callable | None = None) -> InputSpec:
    """Register the input ``name`` (strict: twice, a name the bundle uses itself, an unknown dtype or
    policy source raise). Returns its :class:`InputSpec`."""
    if not name.isidentifier() or name.startswith("_") or hasattr(AlgoInputs, name):
        raise ValueError(f"input name {name!r} must be an identifier not starting with '_' and not an AlgoInputs method")
    if name in _INPUTS:
        raise ValueError(f"input {name!r} is already registered ({_INPUTS[name]})")
    if dtype not in DTYPES:
        raise ValueError(f"input {name!r}: dtype={dtype!r} not in {list(DTYPES)}")
    if policy is not None and policy not in POLICY_SOURCES:
        raise ValueError(f"input {name!r}: policy={policy!r} not in {list(POLICY_SOURCES)}")
    shape = tuple(shape)
    if shape and shape[0] != "N":
        raise ValueError(f"input {name!r}: shape {shape} must lead with 'N' (one row per sample) or be () (a scalar)")
    _INPUTS[name] = InputSpec(name, shape, dtype, doc, filler, policy, index, diagnostic)
    return _INPUTS[name]


def is_input(name: str) -> bool:
    """Whether ``name`` is a registered input."""
    return name in _INPUTS


def input_spec(name: str) -> InputSpec:
    """The registered input ``name`` (KeyError listing the valid names otherwise)."""
    if name not in _INPUTS:
        raise KeyError(f"unknown input {name!r}; registered: {sorted(_INPUTS)}")
    return _INPUTS[name]


def input_names() -> list:
    """Sorted registered input names."""
    return sorted(_INPUTS)


def unknown_inputs(names) -> list:
    """Sorted names among ``names`` that are not registered inputs."""
    return sorted(set(names) - set(_INPUTS))


class AlgoInputs(Mapping):
    """Frozen mapping ``input name -> value`` of one step / micro-batch; absent inputs are not stored.

    ``rewards [N]``, ``group_ids [N]`` and ``mask [N, T]`` are required (they set N and T); every other
    keyword must be a registered input (None = absent). ``x.<name>`` is the value or None for a
    registered name (AttributeError for an unregistered one); ``x.tensor(name)`` the value or a
    ValueError naming it; ``x.replace(**changes)`` a new bundle."""

    __slots__ = ("_values",)

    def __init__(self, rewards: Tensor, group_ids: Tensor, mask: Tensor, **inputs) -> None:
        if not (isinstance(rewards, Tensor) and rewards.dim() == 1):
            raise ValueError(f"AlgoInputs.rewards must be [N], got {getattr(rewards, 'shape', rewards)!r}")
        vals = {"rewards": rewards, "group_ids": group_ids, "mask": mask,
                **{k: v for k, v in inputs.items() if v is not None}}
        unknown = unknown_inputs(vals)
        if unknown:
            raise ValueError(f"AlgoInputs: unregistered input(s) {unknown}; registered: {input_names()} "
                             "(register_input declares a new one)")
        n, t = rewards.shape[0], mask.shape[-1]
        for k, v in vals.items():
            _INPUTS[k].check(v, n, t)
        object.__setattr__(self, "_values", MappingProxyType(vals))

    def __getattr__(self, name: str):
        if name.startswith("_"):
            raise AttributeError(name)
        if name in _INPUTS:
            return self._values.get(name)
        raise AttributeError(f"AlgoInputs has no input {name!r}; registered: {input_names()}")

    def __setattr__(self, name, value):
        raise FrozenInstanceError(f"AlgoInputs is frozen: cannot set {name!r} (use .replace)")

    def __getitem__(self, name: str):
        return self._values[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._values)

    def __len__(self) -> int:
        return len(self._values)

    def __repr__(self) -> str:
        return f"AlgoInputs({', '.join(sorted(self._values))})"

    def tensor(self, name: str) -> Tensor:
        """The input ``name``; ValueError naming it when this bundle does not hold it."""
        if name not in self._values:
            raise ValueError(f"input {name!r} is not in this step's AlgoInputs (holds {sorted(self._values)})")
        return self._values[name]

    def present(self) -> set:
        """Names of the inputs this bundle holds."""
        return set(self._values)

    def replace(self, **changes) -> AlgoInputs:
        """A new bundle with ``changes`` applied (None removes an input)."""
        return AlgoInputs(**{**self._values, **changes})


def missing_fields(inputs: AlgoInputs, needed: set) -> list:
    """Sorted names in ``needed`` that ``inputs`` does not provide."""
    return sorted(set(needed) - inputs.present())


# the inputs of every step, which the update pipeline itself fills (``BASE_INPUTS`` of the data paths
# minus what a path may leave out); family inputs are registered beside the formulas that read them
register_input("rewards", ("N",), "float", "scalar reward of each sample (sum of its token rewards)")
register_input("group_ids", ("N",), "int", "prompt group of each sample")
register_input("mask", ("N", "T"), "float", "response-token mask (the trainer's extras['resp_mask'])")
register_input("logp", ("N", "T"), "float", "current policy log-probs, with grad (update time only)",
               policy="logp", index="resp_pos")
register_input("old_logp", ("N", "T"), "float", "behaviour / proximal-policy log-probs")
register_input("ref_logp", ("N", "T"), "float", "reference-policy log-probs")
register_input("tis_weights", ("N", "T"), "float", "truncated-IS / rollout-correction weights of a stale batch")
register_input("correct", ("N",), "bool", "binary outcome of each sample")
register_input("step", (), "int", "trainer step")
