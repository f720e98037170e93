"""Registries of advantage estimators and policy losses, strict at both ends (STYLE.md §1–2).

* ``@register_advantage(name, needs=(...))`` — ``fn(inputs: AlgoInputs, hp) -> Tensor[N]``.
* ``@register_policy_loss(name, needs=(...))`` — ``fn(inputs, advantages, hp) -> LossOutput``
  (per-token ``loss_mat`` + metrics; aggregation is separate) or ``MaskedLossOutput``.
* Registering a name twice raises; an unknown name raises listing the sorted valid names.
* ``needs`` names the registered inputs (``inputs.register_input``) a function reads beyond
  ``rewards`` / ``group_ids`` / ``mask``; a name not registered (yet) raises at registration;
  ``required_inputs(adv, loss, hp)`` is their union (plus what ``hp`` implies, e.g. ``ref_logp``
  for a KL loss) for start-up checks; ``check_inputs`` validates a concrete bundle.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from .inputs import AlgoInputs, input_names, missing_fields, unknown_inputs


@dataclass(frozen=True)
class Entry:
    """A registered function, the optional inputs it needs, and an optional hp → extra needs hook."""

    name: str
    fn: Callable
    needs: frozenset
    hp_needs: Callable | None = None
    support: str | None = None      #: policy losses: who picks the top-k support ("teacher" | "student")
    batch_stats: dict = field(default_factory=dict)  #: policy losses: statistic field -> fn(extras, hp)

    def needs_for(self, hp=None) -> set:
        """Static needs plus those implied by ``hp``."""
        extra = self.hp_needs(hp) if (self.hp_needs is not None and hp is not None) else set()
        return set(self.needs) | set(extra)


_ADVANTAGES: dict = {}
_LOSSES: dict = {}


SUPPORT_SIDES = ("teacher", "student")


def _register(table: dict, kind: str, name: str, needs, hp_needs, support=None, batch_stats=None):
    batch_stats = dict(batch_stats or {})
    if not all(callable(f) for f in batch_stats.values()):
        raise TypeError(f"{kind} {name!r}: batch_stats maps a field name to fn(extras, hp) -> Tensor")
    unknown = unknown_inputs(set(needs) | set(batch_stats))
    if unknown:
        raise ValueError(f"{kind} {name!r} declares unregistered input(s) {unknown} (register_input them first); "
                         f"registered: {input_names()}")
    if support is not None and support not in SUPPORT_SIDES:
        raise ValueError(f"{kind} {name!r}: support={support!r} not in {list(SUPPORT_SIDES)}")

    def deco(fn: Callable) -> Callable:
        if name in table:
            raise ValueError(f"{kind} {name!r} is already registered (by {table[name].fn.__qualname__})")
        table[name] = Entry(name, fn, frozenset(needs), hp_needs, support, dict(batch_stats))
        return fn
    return deco


def register_advantage(name: str, needs=(), hp_needs: Callable | None = None):
    """Decorator registering ``fn(inputs, hp) -> Tensor[N]`` under ``name``."""
    return _register(_ADVANTAGES, "advantage", name, needs, hp_needs)


def register_policy_loss(name: str, needs=(), hp_needs: Callable | None = None, support: str | None = None,
                         batch_stats=None):
    """Decorator registering ``fn(inputs, advantages, hp) -> LossOutput`` under ``name``.

    ``support`` declares what the loss needs from the actor beyond the sampled tokens' log-probs:
    ``"teacher"`` / ``"student"`` = the current policy's full-vocab log-probs at a top-k support chosen
    by that side (the trainer gathers them with gradient at the ids the data path stored; the loss
    then reads ``student_topk``). None: nothing more.

    ``batch_stats`` maps registered inputs holding WHOLE-mini-batch statistics (equal rows),
    which the loss reads when present so that a micro-batch's share does not depend on the split, to
    ``fn(extras, hp) -> Tensor`` computing one from the mini-batch's per-row inputs (no grad); the
    update pipeline calls it once per mini-batch, before its micro-batches (``trainer/pipeline/update.py``)."""
    return _register(_LOSSES, "policy loss", name, needs, hp_needs, support, batch_stats)


def loss_batch_stats(name: str) -> dict:
    """Whole-mini-batch statistics the registered loss ``name`` declared: {field: fn(extras, hp)}."""
    return _lookup(_LOSSES, "policy loss", name).batch_stats


def loss_support(name: str) -> str | None:
    """The top-k support side the registered loss ``name`` declared (None: no support)."""
    return _lookup(_LOSSES, "policy loss", name).support


def _load_builtins() -> None:
    from . import builtin  # noqa: F401  (registers the built-in functions on first import)


def _lookup(table: dict, kind: str, name: str) -> Entry:
    _load_builtins()
    if name not in table:
        raise KeyError(f"unknown {kind} {name!r}; valid: {sorted(table)}")
    return table[name]


@dataclass(frozen=True)
class BiCCBase:
    """An estimator BiCC and BiCC + RCC may use as ``algo.<kind>.base``: ``fn(inputs, hp) -> Tensor[N]``
    is BiCC's advantage with it, ``scale`` how RCC scales its centred reward (``advantages.RCC_SCALES``),
    ``needs`` the optional inputs it reads."""

    name: str
    fn: Callable
    scale: str
    needs: frozenset


_BICC_BASES: dict = {}


def register_bicc_base(name: str, scale: str, needs=()):
    """Decorator registering ``fn(inputs, hp) -> Tensor[N]`` as a BiCC / RCC base estimator ``name``
    (``algo.bicc.base=name``); duplicates, unknown fields and unknown scales raise."""
    from .advantages import RCC_SCALES

    unknown = unknown_inputs(needs)
    if unknown:
        raise ValueError(f"bicc base {name!r} declares unregistered input(s) {unknown}; registered: {input_names()}")
    if scale not in RCC_SCALES:
        raise ValueError(f"bicc base {name!r}: scale={scale!r} not in {list(RCC_SCALES)}")

    def deco(fn: Callable) -> Callable:
        if name in _BICC_BASES:
            raise ValueError(f"bicc base {name!r} is already registered (by {_BICC_BASES[name].fn.__qualname__})")
        _BICC_BASES[name] = BiCCBase(name, fn, scale, frozenset(needs))
        return fn
    return deco


def bicc_base(name: str) -> BiCCBase:
    """The registered BiCC / RCC base ``name`` (KeyError listing the valid names otherwise)."""
    _load_builtins()
    if name not in _BICC_BASES:
        raise KeyError(f"unknown bicc base {name!r}; valid: {sorted(_BICC_BASES)}")
    return _BICC_BASES[name]


def bicc_base_names() -> list:
    """Sorted registered BiCC / RCC base estimator names."""
    _load_builtins()
    return sorted(_BICC_BASES)


def get_advantage(name: str) -> Callable:
    """The registered advantage function ``name`` (KeyError listing valid names otherwise)."""
    return _lookup(_ADVANTAGES, "advantage", name).fn


def get_policy_loss(name: str) -> Callable:
    """The registered policy-loss function ``name`` (KeyError listing valid names otherwise)."""
    return _lookup(_LOSSES, "policy loss", name).fn


def advantage_names() -> list:
    """Sorted registered advantage names."""
    _load_builtins()
    return sorted(_ADVANTAGES)


def policy_loss_names() -> list:
    """Sorted registered policy-loss names."""
    _load_builtins()
    return sorted(_LOSSES)


def required_inputs(adv_name: str, loss_name: str, hp=None) -> set:
    """Registered inputs the pair needs (advantage time ∪ update time)."""
    adv = _lookup(_ADVANTAGES, "advantage", adv_name)
    loss = _lookup(_LOSSES, "policy loss", loss_name)
    return adv.needs_for(hp) | loss.needs_for(hp)


def advantage_inputs(adv_name: str, hp=None) -> set:
    """Inputs needed by the advantage alone (what the rollout side must produce)."""
    return _lookup(_ADVANTAGES, "advantage", adv_name).needs_for(hp)


def loss_inputs(loss_name: str, hp=None) -> set:
    """Inputs needed by the loss alone (update time)."""
    return _lookup(_LOSSES, "policy loss", loss_name).needs_for(hp)


def check_inputs(inputs: AlgoInputs, needed: set, where: str) -> None:
    """Raise ``ValueError`` naming the missing fields of ``inputs`` for ``where``."""
    missing = missing_fields(inputs, set(needed))
    if missing:
        raise ValueError(f"{where} needs input(s) {missing} that this step's AlgoInputs does not provide")
