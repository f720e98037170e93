"""Rollout side: engines (vLLM default, HF fallback), the Ray bridge, weight-sync buckets.

Never imports megatron. Public: ``SamplingParams``, ``Completion``, ``RolloutEngine`` (protocol),
``make_engine(kind, model_dir, **kw)``, ``RolloutClient(engine_kind, model_dir, num_engines, ...)``
with ``generate(prompt_ids, sampling)``, ``score(seqs, prompt_lens, temperature)``,
``update_weights(named_iter)``, ``kill_engine(i)``, ``stats()``, ``shutdown()``.
"""
from .engine import Completion, RolloutEngine, SamplingParams

__all__ = ["Completion", "RolloutEngine", "SamplingParams"]
