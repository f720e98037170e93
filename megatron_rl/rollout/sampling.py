"""The sampled distribution: temperature, min-p, top-k and top-p applied to one row of logits, in
vLLM's order, so the HF engine samples from (and reports the log-probs of) exactly what vLLM does.

Notation: z ∈ R^V the logits at one position, T the temperature, q = softmax(z / T).

1. temperature: z' = z / T;
2. min-p (vLLM's ``MinPLogitsProcessor``): drop tokens with q_i < min_p · max_j q_j;
3. top-k (``apply_top_k_top_p``): drop tokens whose logit is below the k-th largest (ties kept);
4. top-p: over the distribution left by 1–3, sorted ascending, drop tokens whose cumulative mass
   (from the smallest up, the token included) is <= 1 − top_p; the most likely token always stays.
   So the kept set is the smallest top set whose mass reaches top_p.

The processed distribution is μ = softmax over the kept logits (dropped tokens: −inf), which is
what both engines sample from. Shapes: ``logits`` (V,) or (B, V) -> same shape.

Which log-prob an engine reports (``rollout.logprobs``):

* ``processed`` (default; vLLM ``logprobs_mode="processed_logprobs"``): log μ(y), the behaviour
  policy actually sampled. An off-policy weight min(π_θ(y) / μ(y), C) then also corrects the
  truncation (π_θ is the trainer's full softmax at T: at staleness 0 the ratio is the kept mass
  M ≤ 1), and the per-step ``rollout/logprob_gap`` includes −log M on truncated steps.
* ``full``: log q(y), the full temperature-scaled softmax — what the trainer computes — so the gap
  and the weight measure only engine/trainer mismatch and staleness, and truncation is treated as
  part of the sampler (vLLM ``logprobs_mode="raw_logprobs"``: taken BEFORE temperature, so vLLM
  supports ``full`` at temperature 1 only; refused at start-up otherwise).

The start-up gate is not affected by either: it compares greedy completions scored by a
prompt-log-prob pass (no sampling processors) against the trainer, both at temperature 1.
"""
from __future__ import annotations

import torch


def processed_logits(logits: torch.Tensor, temperature: float, top_k: int = -1, top_p: float = 1.0,
                     min_p: float = 0.0) -> torch.Tensor:
    """z / T with the tokens dropped by min-p, top-k and top-p set to −inf (module docstring)."""
    z = logits.float() / temperature
    squeeze = z.dim() == 1
    z = z.unsqueeze(0) if squeeze else z.clone()
    if min_p > 0.0:
        q = z.softmax(-1)
        z = z.masked_fill(q < min_p * q.max(-1, keepdim=True).values, float("-inf"))
    if 0 < top_k < z.shape[-1]:
        kth = z.topk(top_k, dim=-1).values[:, -1:]
        z = z.masked_fill(z < kth, float("-inf"))
    if top_p < 1.0:
        zs, idx = z.sort(-1)
        cum = zs.softmax(-1).cumsum(-1)
        drop = cum <= 1.0 - top_p
        drop[:, -1] = False
        z = z.scatter(-1, idx, zs.masked_fill(drop, float("-inf")))
    return z.squeeze(0) if squeeze else z
