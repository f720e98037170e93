"""Every change megatron_rl makes to third-party behaviour lives in this package.

Rules (STYLE.md §10):
* one small module per patch; its docstring says what it replaces, why, why behaviour is
  otherwise unchanged, and the min/max versions of the patched package it was checked on;
* nothing is applied at import time: :func:`apply_all` is called once at start-up by the
  process that needs it (trainer ranks: group ``"megatron"``; rollout engine actors: ``"vllm"``);
* a patch whose ``needed()`` is false (e.g. CPU patches on a CUDA machine) is skipped and logged;
  a NEEDED patch whose package version is outside its bounds is a start-up error (never applied
  blindly, never silently skipped);
* each patch has a test asserting the upstream symbol still exists with the expected signature
  (``tests/unit/test_patches.py``).

A patch module defines one module-level ``PATCH = Patch(...)``. Add the module name to
``_MODULES`` below (order matters: base patches first).
"""
from __future__ import annotations

import dataclasses
import importlib
import logging
from importlib import metadata
from typing import Callable

from packaging.version import Version

log = logging.getLogger("megatron_rl.patches")

# Module names (relative to this package), applied in this order.
_MODULES: tuple[str, ...] = (
    "cpu_cuda_device",
    "cpu_cuda_rng",
    "cpu_cuda_synchronize",
    "cpu_cuda_factories",
    "cpu_megatron_tensor_type",
    "cpu_megatron_tensor_cuda",
    "cpu_megatron_norm_sp",
    "megatron_distopt_torch_adam_load",
    "vllm_cpu_keep_linear_weights",
    "vllm_gpu_sort_sampler",
)


@dataclasses.dataclass(frozen=True)
class Patch:
    """One version-bounded change to a third-party package.

    Attributes:
        name: short identifier used in logs and in ``apply_all(only=...)``.
        group: ``"megatron"`` (trainer processes) or ``"vllm"`` (rollout engine processes).
        package: the distribution whose version bounds the patch (e.g. ``"megatron-core"``).
        min_version: lowest version checked (inclusive).
        max_version: first version NOT covered (exclusive) — an upper bound is mandatory.
        needed: returns True when the patch is required on this machine (e.g. no CUDA).
        apply: performs the patch; must be idempotent.
        symbols: the upstream symbols the patch replaces or wraps, as
            ``("pkg.module:attr.sub", ("param", ...) or None)``; the test suite asserts each still
            exists with exactly those parameter names (``None``: existence only).
    """

    name: str
    group: str
    package: str
    min_version: str
    max_version: str
    needed: Callable[[], bool]
    apply: Callable[[], None]
    symbols: tuple[tuple[str, tuple[str, ...] | None], ...] = ()


_applied: dict[str, str] = {}


def _dist_version(package: str) -> Version | None:
    try:
        return Version(metadata.version(package))
    except metadata.PackageNotFoundError:
        return None


def all_patches() -> list[Patch]:
    """Import every patch module and return its ``PATCH`` object (no patch is applied)."""
    return [importlib.import_module(f"{__name__}.{m}").PATCH for m in _MODULES]


def apply_all(groups: tuple[str, ...] = ("megatron",), only: tuple[str, ...] | None = None) -> dict[str, str]:
    """Apply the patches of ``groups`` that are needed here and whose bounds match.

    Returns ``{patch name: "applied" | "already" | "skipped: <reason>"}`` and logs one line each.
    """
    status: dict[str, str] = {}
    for p in all_patches():
        if p.group not in groups or (only is not None and p.name not in only):
            continue
        if p.name in _applied:
            status[p.name] = "already"
            continue
        ver = _dist_version(p.package)
        if ver is None:
            status[p.name] = f"skipped: {p.package} not installed"
        elif not p.needed():
            status[p.name] = "skipped: not needed on this machine"
        elif not (Version(p.min_version) <= Version(ver.base_version) < Version(p.max_version)):
            # needed here but never checked on this version: running unpatched would fail later
            # (or silently differ), so stop now with what to do
            raise RuntimeError(f"patch {p.name} is needed on this machine but covers {p.package} "
                               f"[{p.min_version}, {p.max_version}) and {ver} is installed; install a covered "
                               f"version (requirements/cpu.txt) or re-check the patch and widen its bounds")
        else:
            p.apply()
            _applied[p.name] = str(ver)
            status[p.name] = "applied"
        log.info("patch %-32s %s", p.name, status[p.name])
    return status


def resolve_symbol(path: str):
    """Return the object named ``"pkg.module:attr.sub"`` (imports the module)."""
    mod, _, attr = path.partition(":")
    obj = importlib.import_module(mod)
    for part in attr.split(".") if attr else ():
        obj = getattr(obj, part)
    return getattr(obj, "_mrl_orig", obj)  # the upstream object, even after apply_all()


def applied() -> dict[str, str]:
    """Names of the patches applied in this process, with the package version they matched."""
    return dict(_applied)
