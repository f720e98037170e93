"""The distribution the engines sample from, μ, as ONE definition: the HF engine samples from it and
reports its log-probs (``rollout/hf_engine.py``), the trainer scores its own tokens under it
(``trainer/policy/vocab_parallel.py``, vocabulary split over tensor-parallel ranks), and it is what
vLLM 0.32's sampler applies (``vllm/v1/sample/sampler.py`` ``Sampler.sample`` then
``ops/topk_topp_sampler.py`` ``apply_top_k_top_p_pytorch`` / ``apply_top_k_only`` — the CPU build's path).

Notation (one position): z ∈ R^V the logits, T the temperature, q = softmax(z / T).

1. temperature: z' = z / T (vLLM ``apply_temperature``);
2. min-p (vLLM ``MinPLogitsProcessor``, argmax-invariant, so after the temperature): drop i when
   q_i < min_p · max_j q_j;
3. top-k: drop i when z'_i is below the k-th largest value of what is left (ties with it kept; vLLM
   compares values, in both of its top-k paths);
4. top-p over r = softmax of what is left: sorted ascending, the token at sorted position i is dropped
   when the cumulative mass up to and including it is <= 1 − top_p, the last (largest) never. In exact
   arithmetic that keeps token i iff A_i < top_p, A_i = the mass of the tokens ahead of it in
   descending order. For distinct values that is {i : z'_i >= b} with the boundary
   b = min{z'_j : G(z'_j) < top_p}, G(τ) = Σ_{z'_k > τ} r_k. Ties at b: vLLM's sort puts the n_b tied
   tokens in some order and keeps the first n_keep of them in descending order, n_keep =
   #{i < n_b : G(b) + i·r_b < top_p} = clamp(ceil((top_p − G(b)) / r_b), 1, n_b).

μ = softmax over the kept set K. The log-prob of a token y the engine sampled is

    log μ(y) = z'_y − log Σ_{k∈K} exp(z'_k) = log q(y) − log M,     M = q(K) (the kept mass)

Ties at the top-p boundary: which n_keep of the n_b tied tokens vLLM keeps depends on its sort, but any
one of them may be the sampled token and every one has the same value, so K's mass is
G-part + n_keep·exp(b) and a tied y is scored as kept. The kept set is carried as weights w ∈ [0, 1]
per token (1 kept, n_keep / n_b on the boundary ties, 0 dropped): log Σ_K exp(z'_k) = log Σ_k w_k
exp(z'_k), and the HF engine samples from softmax(z' + log w) — the same mass on the tie group as vLLM,
spread evenly over it. A y outside K (possible only when trainer and engine disagree: numerics,
staleness) keeps the same formula, finite and continuous across the boundary; callers count such tokens.

The top-p boundary is found without the full row: a bisection over the order-preserving integer image
of the fp32 values (32 halvings reach one float), each step one reduction of Σ_{z'_k > τ} r_k over the
shards; the top-k threshold from each shard's k largest values (k·shards numbers, never the vocabulary).
Reductions across shards go through :class:`Collectives` (identity on a whole row; an all-reduce over
the tensor-parallel group in the trainer). Agreement with vLLM's own sort-and-cumsum is up to fp32
rounding of the masses (a boundary within one rounding of ``1 − top_p``).

Greedy decoding (T = 0) is not a sampling distribution here (``rollout.temperature`` > 0).
Shapes: ``z`` [..., W] (a shard of width W of the vocabulary, or the whole row).
"""
from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import NamedTuple

import torch
from torch import Tensor

_BISECT_STEPS = 33   # int keys of fp32 span < 2^33: 33 halvings leave adjacent keys


def _same(t: Tensor) -> Tensor:
    return t


class Collectives(NamedTuple):
    """How a row's reductions span the vocabulary shards: ``max`` / ``sum`` reduce a tensor over the
    shards (returning it), ``cat`` concatenates the last dimension over the shards in shard order."""

    max: Callable[[Tensor], Tensor] = _same
    sum: Callable[[Tensor], Tensor] = _same
    cat: Callable[[Tensor], Tensor] = _same


#: a whole vocabulary row in one tensor (no reduction across shards)
WHOLE_ROW = Collectives()


@dataclasses.dataclass(frozen=True)
class SamplingSpec:
    """The sampling parameters that shape μ (``rollout.temperature``, ``top_k``, ``top_p``, ``min_p``)."""

    temperature: float = 1.0
    """T > 0."""
    top_k: int = -1
    """Top-k (-1 or 0 = off)."""
    top_p: float = 1.0
    """Top-p in (0, 1] (1 = off)."""
    min_p: float = 0.0
    """Min-p in [0, 1] (0 = off)."""

    def __post_init__(self):
        if not (self.temperature > 0 and math.isfinite(self.temperature)):
            raise ValueError(f"sampling temperature must be a finite number > 0, got {self.temperature}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if not 0.0 <= self.min_p <= 1.0:
            raise ValueError(f"min_p must be in [0, 1], got {self.min_p}")

    def truncates(self, vocab_size: int | None = None) -> bool:
        """Whether any of min-p / top-k / top-p can drop a token (else μ = q)."""
        k_on = self.top_k > 0 and (vocab_size is None or self.top_k < vocab_size)
        return self.min_p > 0.0 or self.top_p < 1.0 or k_on


class Support(NamedTuple):
    """The kept set of each row as weights ``w`` [..., W] (1 kept, n_keep/n_b on top-p boundary ties,
    0 dropped; module docstring) and ``log_z`` [...] = log Σ_k w_k exp(z'_k), the normaliser of μ."""

    w: Tensor
    log_z: Tensor


def _log_sum_exp(z: Tensor, w: Tensor | None, col: Collectives) -> Tensor:
    """log Σ_k w_k exp(z_k) over the shards (w None: all 1). Rows whose every weight is 0 give −inf."""
    m = col.max(z.amax(-1))
    m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
    e = torch.exp(z - m.unsqueeze(-1))
    s = col.sum((e if w is None else e * w).sum(-1))
    return m + torch.log(s)


def _float_key(x: Tensor) -> Tensor:
    """Order-preserving int64 image of fp32 values (a < b ⇔ key(a) < key(b); −0 = +0)."""
    i = x.float().contiguous().view(torch.int32).to(torch.int64)
    return torch.where(i >= 0, i, -(i & 0x7FFFFFFF))


def _key_float(k: Tensor) -> Tensor:
    """Inverse of :func:`_float_key`."""
    i = torch.where(k >= 0, k, (-k) | 0x80000000)
    i = torch.where(i >= 2**31, i - 2**32, i)
    return i.to(torch.int32).view(torch.float32)


def _min_p(z: Tensor, min_p: float, col: Collectives) -> Tensor:
    """z with the tokens below min_p · max q set to −inf (vLLM: softmax, amax, compare)."""
    m = col.max(z.amax(-1)).unsqueeze(-1)
    e = torch.exp(z - m)
    q = e / col.sum(e.sum(-1)).unsqueeze(-1)
    qmax = col.max(q.amax(-1)).unsqueeze(-1)
    return z.masked_fill(q < qmax * min_p, float("-inf"))


def _top_k(z: Tensor, k: int, col: Collectives) -> Tensor:
    """z with the tokens below the k-th largest value set to −inf (ties kept): each shard's k largest,
    concatenated over the shards, then the k-th of those."""
    kk = min(k, z.shape[-1])
    local = z.topk(kk, dim=-1).values
    if kk < k:
        local = torch.cat([local, local.new_full((*local.shape[:-1], k - kk), float("-inf"))], -1)
    kth = col.cat(local).topk(k, dim=-1).values[..., -1:]
    return z.masked_fill(z < kth, float("-inf"))


def _top_p_weights(z: Tensor, top_p: float, col: Collectives) -> Tensor:
    """Weights of the top-p kept set of the finite entries of z (module docstring, step 4)."""
    finite = torch.isfinite(z)
    lse = _log_sum_exp(z, None, col).unsqueeze(-1)
    r = torch.exp(z - lse)                                   # softmax of what min-p / top-k left
    big = torch.finfo(torch.float32).max
    lo = _float_key(col.max(torch.where(finite, -z, torch.full_like(z, -big)).amax(-1)).neg()) - 1
    hi = _float_key(col.max(z.amax(-1)))                     # G(max) = 0 < top_p: hi is always valid
    for _ in range(_BISECT_STEPS):                           # invariant: G(lo) >= top_p > G(hi)
        mid = lo + (hi - lo) // 2
        g = col.sum((r * (z > _key_float(mid).unsqueeze(-1))).sum(-1))
        ok = g < top_p
        hi, lo = torch.where(ok, mid, hi), torch.where(ok, lo, mid)
    b = _key_float(hi).unsqueeze(-1)                         # the boundary value: a token's value
    above = z > b
    tie = z == b
    g_b = col.sum((r * above).sum(-1))
    n_b = col.sum(tie.sum(-1).to(z.dtype))
    r_b = torch.exp(b.squeeze(-1) - lse.squeeze(-1))
    n_keep = torch.clamp(torch.ceil((top_p - g_b) / r_b), min=1.0)
    n_keep = torch.minimum(n_keep, n_b.clamp_min(1.0))
    return above.to(z.dtype) + tie.to(z.dtype) * (n_keep / n_b.clamp_min(1.0)).unsqueeze(-1)


@torch.no_grad()
def sampling_support(z: Tensor, spec: SamplingSpec, col: Collectives = WHOLE_ROW) -> Support:
    """The kept set of ``z`` = logits / T ([..., W], fp32; padding columns −inf) under ``spec``'s
    min-p, top-k and top-p (the module docstring, in vLLM's order), as :class:`Support`."""
    z = z.float()
    x = _min_p(z, spec.min_p, col) if spec.min_p > 0.0 else z
    if spec.top_k > 0:
        x = _top_k(x, spec.top_k, col)
    if spec.top_p < 1.0:
        w = _top_p_weights(x, spec.top_p, col)
    else:
        w = torch.isfinite(x).to(z.dtype)
    return Support(w, _log_sum_exp(z, w, col))


def processed_logits(logits: Tensor, temperature: float, top_k: int = -1, top_p: float = 1.0,
                     min_p: float = 0.0) -> Tensor:
    """z / T + log w over a whole row ([V] or [B, V]): the logits μ samples from (dropped tokens −inf;
    boundary ties of top-p share their kept mass evenly, module docstring). ``log_softmax`` of it is
    log μ on the kept tokens."""
    spec = SamplingSpec(temperature, top_k, top_p, min_p)
    z = logits.float() / temperature
    if not spec.truncates(z.shape[-1]):
        return z
    return z + torch.log(sampling_support(z, spec).w)


def sampled_logprobs(logits: Tensor, tokens: Tensor, spec: SamplingSpec) -> Tensor:
    """log μ(y) = z'_y − log Σ_k w_k exp(z'_k) of ``tokens`` [...] under whole rows ``logits`` [..., V]
    (no gradient through the kept set; the reference the vocab-parallel trainer pass is tested against
    and what the HF engine reports)."""
    z = logits.float() / spec.temperature
    sup = sampling_support(z, spec)
    return z.gather(-1, tokens.long().unsqueeze(-1)).squeeze(-1) - sup.log_z


def in_support(logits: Tensor, tokens: Tensor, spec: SamplingSpec) -> Tensor:
    """Bool [...]: whether each token is in the kept set of its row (boundary ties count as kept)."""
    z = logits.float() / spec.temperature
    w = sampling_support(z, spec).w
    return w.gather(-1, tokens.long().unsqueeze(-1)).squeeze(-1) > 0
