"""Train–inference mismatch metrics of a batch (``rollout/*``, every step, beside ``rollout/logprob_gap``).

Over the response tokens (mask m) of the samples, with the trainer's recomputed log-probs
``train`` (π_train, the proximal policy) and the engine's sampling log-probs ``gen`` (π_gen, the
behaviour policy), Δ_t = log π_train(y_t) − log π_gen(y_t):

* ``token_mult_prob_error`` = Σ_t m_t exp(|Δ_t|) / Σ_t m_t — NeMo-RL's definition
  (``nemo_rl/algorithms/loss_functions.py``, ``ClippedPGLossFn``: masked mean of exp(|gen − prev|));
  1 exactly when both sides agree; NeMo-RL's convergence tests call > 1.05 at equal precision a bug.
* ``gen_kl`` = Σ_t m_t (exp(Δ_t) − Δ_t − 1) / Σ_t m_t — the k3 estimator (Schulman 2020) of
  KL(π_gen ‖ π_train) from the tokens π_gen sampled (ratio r = π_train/π_gen); ≥ 0, 0 iff Δ = 0.
  NeMo-RL's ``gen_kl_error`` (k3 with the generation log-probs as samples) and verl's ``k3_kl``
  (``compute_offpolicy_metrics``, "KL(π_rollout ‖ π_training)") are this quantity.
* ``token_logprob_diff_max`` = max_t |Δ_t| over the masked tokens;
  ``seq_logprob_diff_max`` = max_i |Σ_t m_t Δ_t| — the sequence-level |Δ log p| (log of the
  sequence's probability ratio, the quantity sequence-level corrections threshold).
* ``beyond_token_frac`` = share of tokens whose ratio exp(Δ_t) lies outside the correction band
  [L, U]; ``beyond_seq_frac`` = share of rows (with any token) holding at least one such token.

Samples are split by staleness s_i (0: sampled with the trainer's own weights, the pure numerics gap;
> 0: the gap also holds the policy's change since, ``rollout.max_staleness``): the same metrics over
each part come with suffixes ``_fresh`` / ``_stale`` when ``split`` is asked and the part is not empty.
"""
from __future__ import annotations

import torch
from torch import Tensor

from .kl import k3_log_ratio

MISMATCH_KEYS = ("token_mult_prob_error", "gen_kl", "token_logprob_diff_max", "seq_logprob_diff_max",
                 "beyond_token_frac", "beyond_seq_frac")


def token_mult_prob_error(train: Tensor, gen: Tensor, mask: Tensor) -> Tensor:
    """Σ m·exp(|train − gen|) / Σ m (1 for an empty mask)."""
    m = mask.to(train.dtype)
    n = m.sum()
    if n == 0:
        return train.new_ones(())
    return (torch.exp((train - gen).abs()) * m).sum() / n


def gen_kl(train: Tensor, gen: Tensor, mask: Tensor) -> Tensor:
    """k3 estimate of KL(π_gen ‖ π_train): Σ m·(e^Δ − Δ − 1) / Σ m with Δ = train − gen (0 for an empty mask).

    Each term by :func:`~megatron_rl.algorithms.kl.k3_log_ratio` (no cancellation): ≥ 0 term by term, so the
    mean is ≥ 0 on any host (e^Δ − Δ − 1 in float64 rounds to ±1.1e-16 for |Δ| ≲ 1e-8, negative included)."""
    m = mask.to(train.dtype)
    d = (train - gen) * m
    return (k3_log_ratio(d) * m).sum() / m.sum().clamp_min(1.0)


def mismatch_metrics(train: Tensor, gen: Tensor, mask: Tensor, band: tuple[float, float] | None = None) -> dict:
    """Every metric of the module docstring over [N, T] inputs, as 0-d tensors (band None: no
    ``beyond_*`` entries). Empty mask: error 1, KL 0, maxima 0, fractions 0."""
    m = mask.to(train.dtype)
    d = (train - gen) * m
    zero = train.new_zeros(())
    rows = m.sum(-1) > 0
    out = {"token_mult_prob_error": token_mult_prob_error(train, gen, m), "gen_kl": gen_kl(train, gen, m),
           "token_logprob_diff_max": d.abs().max() if d.numel() else zero,
           "seq_logprob_diff_max": d.sum(-1).abs().max() if d.numel() else zero}
    if band is not None:
        lo, hi = band
        r = torch.exp(d)
        out_tok = ((r < lo) | (r > hi)).to(m.dtype) * m
        out["beyond_token_frac"] = out_tok.sum() / m.sum().clamp_min(1.0)
        out["beyond_seq_frac"] = ((out_tok.sum(-1) > 0) & rows).sum().to(m.dtype) / rows.sum().clamp_min(1).to(m.dtype)
    return out


def split_mismatch_metrics(train: Tensor, gen: Tensor, mask: Tensor, stale: Tensor,
                           band: tuple[float, float] | None = None, split: bool = False) -> dict:
    """``rollout/<metric>`` over all samples; with ``split`` also ``rollout/<metric>_fresh`` (s_i = 0)
    and ``rollout/<metric>_stale`` (s_i > 0) for the parts that have samples. Floats, computed in
    float64: in float32, exp(|Δ|) rounds to 1 below |Δ| ≈ 6e-8 and the error of an fp32 run would read
    1 or jump by 1.2e-7 steps."""
    train, gen = train.double(), gen.double()
    res = {f"rollout/{k}": float(v) for k, v in mismatch_metrics(train, gen, mask, band).items()}
    if split:
        for name, sel in (("fresh", stale == 0), ("stale", stale > 0)):
            if bool(sel.any()):
                part = mismatch_metrics(train[sel], gen[sel], mask[sel], band)
                res.update({f"rollout/{k}_{name}": float(v) for k, v in part.items()})
    return res
