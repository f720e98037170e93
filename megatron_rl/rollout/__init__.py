"""Rollout side: the engine registry (vLLM default, HF fallback, plugins), the Ray bridge, the weight transports.

Never imports megatron. Public: ``SamplingParams``, ``Completion``, ``RolloutEngine`` (protocol),
``register_engine`` / ``EngineCaps`` / ``engine_class`` / ``make_engine`` (``rollout/registry.py``),
the transports (``rollout/transport.py``), ``RolloutClient(engine, model_dir, num_engines, ...)``
with ``generate(prompt_ids, sampling)``, ``score(seqs, prompt_lens, temperature)``,
``update_weights(named_iter)``, ``kill_engine(i)``, ``stats()``, ``shutdown()``.

Importing the package imports nothing: its public names load on first access (PEP 562), and the
built-in engines register when the registry is first asked for one (``registry.BUILTIN``), so a
declaration module (the registry, the config that names an engine) imports no engine and no torch.
"""
from __future__ import annotations

import importlib

_PUBLIC = {"Completion": "engine", "RolloutEngine": "engine", "SamplingParams": "engine", "EngineCaps": "registry",
           "engine_class": "registry", "make_engine": "registry", "register_engine": "registry"}

__all__ = sorted(_PUBLIC)


def __getattr__(name: str):
    if name in _PUBLIC:
        return getattr(importlib.import_module(f"{__name__}.{_PUBLIC[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
