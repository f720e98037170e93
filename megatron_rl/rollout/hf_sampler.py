"""The HF engine's sampler (:func:`sample_step`): one draw from μ, the truncated distribution of
``megatron_rl/algorithms/sampling.py`` (temperature, min-p, top-k, top-p in vLLM's order: the ONE
definition the HF engine samples from and the trainer scores its tokens under), and the log-prob the
engine reports for it.

Which log-prob an engine reports (``rollout.logprobs``):

* ``processed`` (default; vLLM ``logprobs_mode="processed_logprobs"``): log μ(y), the behaviour
  policy actually sampled. The trainer scores the same tokens under its own μ (the log-prob pass,
  ``trainer/policy/vocab_parallel.py``), and every comparison with the engine — ``rollout/logprob_gap``,
  the mismatch metrics and guard, the off-policy / rollout-correction weights, ``rollout.verify_sync`` —
  reads that one, so they measure mismatch and staleness, not truncation (before, the gap held −log M,
  M the kept mass, on every truncated step). Whether the PPO ratio itself is taken under μ or under the
  full softmax is ``algo.ratio_space``.
* ``full``: log q(y), the full temperature-scaled softmax, compared with the trainer's full
  softmax; truncation is treated as part of the sampler (vLLM ``logprobs_mode="raw_logprobs"``: taken BEFORE temperature, so vLLM
  supports ``full`` at temperature 1 only; refused at start-up otherwise).

The start-up gate is not affected by either: it compares greedy completions scored by a
prompt-log-prob pass (no sampling processors) against the trainer, both at temperature 1.
"""
from __future__ import annotations

import torch

from ..algorithms.sampling import SamplingSpec, sampling_support


def sample_step(logits: torch.Tensor, temperature: float, top_k: int, top_p: float, min_p: float,
                logprobs: str, gen: torch.Generator) -> tuple[int, float]:
    """One draw from μ of a logits row [V] (CPU generator: the same draws on any device) and the
    log-prob the engine reports for it: log μ(y) (``processed``) or log q(y) at T (``full``)."""
    spec = SamplingSpec(temperature, top_k, top_p, min_p)
    z = logits.float() / temperature
    if not spec.truncates(z.shape[-1]):
        logp = z.log_softmax(-1)
        tok = int(torch.multinomial(logp.exp().cpu(), 1, generator=gen))
        return tok, float(logp[tok])
    sup = sampling_support(z, spec)
    tok = int(torch.multinomial((z + torch.log(sup.weights(z))).log_softmax(-1).exp().cpu(), 1, generator=gen))
    if logprobs == "full":
        return tok, float(z.log_softmax(-1)[tok])
    return tok, float(z[tok] - sup.log_z)
