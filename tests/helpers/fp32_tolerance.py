"""Tolerances from the arithmetic: how far two fp32 evaluations of the same value may drift apart when
they differ only in the ORDER of their reductions (another micro-batch split, DP / TP / PP layout,
another SIMD width or thread count of the host's kernels) — never a number tuned until it passed.

Derivation (Higham, *Accuracy and Stability of Numerical Algorithms*, 2nd ed., §3.1 and §4.2).
fp32 rounds each operation to within a relative u = 2^-24. A sum of n terms, in ANY order and with any
blocking (pairwise, SIMD lanes, per-rank partial sums added later), satisfies

    |fl(Σ x_i) − Σ x_i| ≤ γ_{n−1} Σ |x_i|,     γ_k = k·u / (1 − k·u),

and a dot product of length k the same with the terms x_i = a_i b_i. That worst case assumes every
rounding error aligned; with the errors independent and mean-zero (the probabilistic model of Higham &
Mary, SIAM J. Sci. Comput. 41(5), 2019, Thm 2.4) the bound is

    |fl(Σ x_i) − Σ x_i| ≤ γ̃_n(λ) Σ |x_i|,      γ̃_n(λ) = exp(λ·√n·u + n·u²/(1 − u)) − 1 ≈ λ·√n·u,

with probability at least 1 − 2n·exp(−λ²(1 − u)²/2): λ = 8 (:data:`LAMBDA`) leaves a failure probability
below 3e-14·n, far under one in the life of the suite, where the worst case (γ_n at n = 10^5: 6e-3)
would be too loose to catch a lost token. :func:`reorder_rtol` uses γ̃. A value that passes through
stages of such reductions of lengths k_1 … k_L (a forward pass: the matmuls' inner dimensions, the
norms, the soft-max over the vocabulary; the backward pass: the transposed products and the weight
gradients summed over tokens; the final sum over tokens) carries, to first order and with each stage
taken as well-conditioned (RMSNorm keeps the tiny test models' activations O(1)), a relative error
of at most Σ_l γ_{k_l} with respect to the MAGNITUDES it is built from. Two evaluations each within that
bound of the exact value differ by at most twice it. The final reduction's cancellation enters as its
condition number κ = Σ|x_i| / |Σ x_i| (a GRPO loss sums advantages of both signs: κ ≫ 1):

    |a − b| / |b|  ≤  2 · κ · Σ_l γ_{k_l}              (:func:`reorder_rtol`)

After s optimizer steps the weights themselves carry the previous passes' error (Adam's first-order
update lr·g/(|g| + ε) has a relative condition ε/(|g| + ε) ≤ 1 in each coordinate), so a value measured
after s steps is bounded by (s + 1) times the one-pass bound (``passes``).
"""
from __future__ import annotations

import math

U = 2.0 ** -24     #: fp32 unit roundoff
U64 = 2.0 ** -53   #: fp64 unit roundoff (a test that computes in float64 to make its sums order-independent)
LAMBDA = 8.0       #: λ of the probabilistic bound γ̃_n(λ): failure probability ≤ 2n·e^(−λ²/2) ≈ 2.5e-14·n


def gamma(n: int) -> float:
    """γ_n = n·u / (1 − n·u): the relative error bound of a length-n fp32 reduction (in any order)."""
    if n * U >= 1:
        raise ValueError(f"gamma({n}): n·u >= 1, no bound")
    return n * U / (1 - n * U)


def gamma_prob(n: int, lam: float = LAMBDA, unit: float = U) -> float:
    """γ̃_n(λ) = exp(λ√n·u + n·u²/(1 − u)) − 1: the probabilistic bound of a length-n reduction (fp32; ``unit=U64``: fp64)."""
    return math.expm1(lam * math.sqrt(n) * unit + n * unit * unit / (1 - unit))


def reorder_rtol(lengths, cond: float = 1.0, passes: int = 1, lam: float = LAMBDA, unit: float = U) -> float:
    """Relative tolerance 2·cond·passes·Σ γ̃_k(λ) over the reduction ``lengths`` a value passes through
    (module docstring). ``cond`` ≥ 1 is the final reduction's Σ|x| / |Σx|; ``unit`` the precision's u."""
    if cond < 1 or passes < 1:
        raise ValueError(f"cond must be >= 1 and passes >= 1, got {cond}, {passes}")
    return 2.0 * cond * passes * sum(gamma_prob(max(int(k) - 1, 0), lam, unit) for k in lengths)


def cond(abs_sum: float, value: float) -> float:
    """κ = Σ|x| / |Σx| of a reduction (≥ 1; an exact zero sum gives inf)."""
    return max(1.0, abs_sum / abs(value)) if value != 0 else float("inf")


def transformer_forward(hidden: int, ffn: int, head_dim: int, n_heads: int, n_kv: int, layers: int, vocab: int,
                        seq: int) -> list[int]:
    """Reduction lengths of one token's log-prob / entropy through a pre-norm GQA transformer (Qwen3):
    per layer RMSNorm (hidden), q/k/v projections (hidden), q/k RMSNorm (head_dim), QKᵀ (head_dim), soft-max
    and PV (seq each), o-projection (n_heads·head_dim), RMSNorm, gate/up (hidden), down (ffn); then the final
    RMSNorm, the LM head (hidden), log-sum-exp and the entropy over the vocabulary."""
    per_layer = [hidden, hidden, head_dim, head_dim, seq, seq, n_heads * head_dim, hidden, hidden, ffn]
    return per_layer * layers + [hidden, hidden, vocab, vocab]


def transformer_backward(hidden: int, ffn: int, head_dim: int, n_heads: int, n_kv: int, layers: int, vocab: int,
                         seq: int, tokens: int) -> list[int]:
    """Reduction lengths of a gradient coordinate: the transposed products back through every layer (the
    LM head over the vocabulary, down over hidden, gate/up over 2·ffn, o over hidden, q/k/v over
    (n_heads + 2·n_kv)·head_dim, attention over seq) and the weight gradient's sum over the tokens."""
    per_layer = [hidden, 2 * ffn, hidden, (n_heads + 2 * n_kv) * head_dim, seq, seq, head_dim]
    return [vocab] + per_layer * layers + [tokens]


def tiny_qwen3_path(cfg: dict, seq: int, tokens: int, params: int | None = None) -> list[int]:
    """Forward + backward + the final token sum of the HF config ``cfg`` (a ``config.json`` dict), plus the
    sum of squares of the gradient norm over ``params`` coordinates when given."""
    dims = (cfg["hidden_size"], cfg["intermediate_size"], cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"],
            cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["num_hidden_layers"], cfg["vocab_size"], seq)
    out = transformer_forward(*dims) + transformer_backward(*dims, tokens) + [tokens]
    return out + ([params] if params else [])
