"""Rollout side: the engine registry (vLLM default, HF fallback, plugins), the Ray bridge, the weight transports.

Never imports megatron. Public: ``SamplingParams``, ``Completion``, ``RolloutEngine`` (protocol),
``register_engine`` / ``EngineCaps`` / ``engine_class`` / ``make_engine`` (``rollout/registry.py``),
the transports (``rollout/transport.py``), ``RolloutClient(engine, model_dir, num_engines, ...)``
with ``generate(prompt_ids, sampling)``, ``score(seqs, prompt_lens, temperature)``,
``update_weights(named_iter)``, ``kill_engine(i)``, ``stats()``, ``shutdown()``.

Importing the package registers the built-in engines (their modules import vLLM / transformers only
when an engine is built).
"""
from . import hf_engine, vllm_async_engine, vllm_engine  # noqa: F401  (the built-in engines' registrations)
from .engine import Completion, RolloutEngine, SamplingParams
from .registry import EngineCaps, engine_class, make_engine, register_engine

__all__ = ["Completion", "EngineCaps", "RolloutEngine", "SamplingParams", "engine_class", "make_engine", "register_engine"]
