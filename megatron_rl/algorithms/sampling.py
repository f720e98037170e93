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

Every rule keeps a set closed upwards in value, so one row's kept set is a boundary value b and the
weight of its ties, w_k = 1[z'_k > b] + f·1[z'_k = b] (:class:`Support`; f = n_keep / n_b, 1 without a
top-p tie), and nothing vocabulary-sized is kept. It is found from each shard's C largest values:
concatenated over the shards (C·shards numbers per row), sorted, and run through the rules above with
one cumsum. Every value above τ = the largest of the shards' C-th values is among them, so the result
is exact whenever the candidates hold the kept set and every tie at b: b > τ, and, where the mass top-p
renormalises by is read off the candidates (with top-k), the lowest value min-p and top-k keep > τ; for the rows where it is
not, C grows eightfold and those rows are redone, up to the whole shard (where it is exact by
construction). C = k + 32 with top-k (the kept set is the top k plus its ties), else
:data:`CANDIDATES`. Top-p without top-k needs the kept mass of the whole row (after min-p): one
exp-and-sum pass. Rows go in chunks of at most :data:`CHUNK_BYTES` of fp32 work space per shard.
Min-p is compared as exp(z'_i − max z') < min_p (q_i / q_max, the max's exp is 1; vLLM divides both
sides by the same sum first: a difference only within one rounding of the threshold). Reductions
across shards go through :class:`Collectives` (identity on a whole row; in the trainer one all-reduce
MAX for the row max and τ, one SUM for the row mass when top-p runs without top-k, one all-gather of
the candidates). Agreement with vLLM's own sort-and-cumsum is up to fp32 rounding of the cumulative
masses (a boundary within one rounding of ``1 − top_p``).

On a GPU, vLLM 0.32 would run a Triton kernel with another rule (exactly k at a tied k-th value, an
18-step pivot search for top-p, a different search for batches of at most 64 rows): the engines are
pinned to the sort path there (``patches/vllm_gpu_sort_sampler.py``, ``docs/sampling-and-evaluation.md``).

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

#: candidates per shard and row for top-p without top-k (grown eightfold for the rows they do not settle)
CANDIDATES = 512
#: extra candidates beyond top-k's k (ties at the k-th value)
TIE_SLACK = 32
#: fp32 work space per chunk of rows on one shard (rows per chunk = CHUNK_BYTES / (4 W)); ``plan`` counts
#: the μ pass's working set from these three constants (``planning/memory.py`` ``sampling_bytes``)
CHUNK_BYTES = 256 * 2**20


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
    """The kept set of each row: ``bound`` [...] b, the lowest kept value; ``frac`` [...] f, the weight of
    the tokens tied at b (n_keep / n_b on a top-p boundary tie, else 1); ``log_z`` [...] = log Σ_k w_k
    exp(z'_k), the normaliser of μ, with w_k = 1[z'_k > b] + f·1[z'_k = b] (module docstring)."""

    bound: Tensor
    frac: Tensor
    log_z: Tensor

    def weights(self, z: Tensor) -> Tensor:
        """w [..., W] of the values ``z`` [..., W] (a shard or the whole row, after the temperature)."""
        b, f = self.bound.unsqueeze(-1), self.frac.unsqueeze(-1)
        return (z > b).to(z.dtype) + (z == b).to(z.dtype) * f


def _candidates(z: Tensor, c: int, rows: Tensor | None = None) -> Tensor:
    """The ``c`` largest values [R, c] of each row of ``z`` (of ``rows`` only, copied in chunks of
    :data:`CHUNK_BYTES`), descending (−inf where the shard is narrower than c)."""
    cc = min(c, z.shape[-1])
    if rows is None:
        top = z.topk(cc, dim=-1).values if cc < z.shape[-1] else z.sort(-1, descending=True).values
    else:
        step = max(1, CHUNK_BYTES // (4 * max(1, z.shape[-1])))
        top = torch.cat([_candidates(z.index_select(0, rows[i:i + step]), cc) for i in range(0, len(rows), step)])
    if cc < c:
        top = torch.cat([top, top.new_full((top.shape[0], c - cc), float("-inf"))], -1)
    return top


def _row_mass(z: Tensor, m: Tensor, min_p: float, col: Collectives) -> Tensor:
    """Σ_k exp(z'_k − m) over the tokens min-p keeps (exp ≥ min_p), over the shards, in row chunks."""
    rows = max(1, CHUNK_BYTES // (4 * max(1, z.shape[-1])))
    out = []
    for i in range(0, z.shape[0], rows):
        e = (z[i:i + rows] - m[i:i + rows, None]).exp_()
        if min_p > 0.0:
            e.masked_fill_(e < min_p, 0.0)
        out.append(e.sum(-1))
    return col.sum(torch.cat(out) if out else m.new_zeros(0))


def _rules(v: Tensor, m: Tensor, mass: Tensor | None, spec: SamplingSpec) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """(b, f, Σ_k w_k exp(v_k − m), the lowest value min-p and top-k keep) of candidate rows ``v`` [R, N]
    sorted descending, by the module docstring's rules; ``mass`` the kept mass after min-p of the whole
    row (None: that of the candidates, which then must hold every token min-p and top-k keep)."""
    e = torch.exp(v - m[:, None])                               # −inf padding -> 0
    keep = torch.isfinite(v) & (e >= spec.min_p)
    if spec.top_k > 0:
        keep &= v >= v[:, min(spec.top_k, v.shape[1]) - 1, None]
    ek = e * keep
    n = keep.sum(-1)                                            # >= 1: the max always passes
    low = v.gather(1, (n - 1)[:, None]).squeeze(1)
    if spec.top_p < 1.0:
        r = ek / (ek.sum(-1) if mass is None else mass)[:, None]
        ahead = torch.cumsum(r, -1) - r                        # mass ahead in descending order
        n = (keep & (ahead < spec.top_p)).sum(-1).clamp_min(1)
    b = v.gather(1, (n - 1)[:, None]).squeeze(1)
    above = v > b[:, None]
    n_b = (v == b[:, None]).sum(-1)
    f = (n - above.sum(-1)).to(v.dtype) / n_b.to(v.dtype)
    return b, f, (e * above).sum(-1) + f * n_b * torch.exp(b - m), low


def _support_rows(z: Tensor, spec: SamplingSpec, col: Collectives) -> Support:
    """:func:`sampling_support` on rows ``z`` [R, W] (fp32)."""
    c = spec.top_k + TIE_SLACK if spec.top_k > 0 else CANDIDATES
    top = _candidates(z, c)
    m = col.max(top[:, 0].clone())
    m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
    mass = _row_mass(z, m, spec.min_p, col) if spec.top_p < 1.0 and spec.top_k <= 0 else None
    b, f, s = (torch.empty_like(m) for _ in range(3))
    rows = torch.arange(z.shape[0], device=z.device)
    while True:
        tau = col.max(top[:, -1].clone())                       # every value above tau is a candidate
        v = col.cat(top).sort(-1, descending=True).values
        bb, ff, ss, low = _rules(v, m[rows], None if mass is None else mass[rows], spec)
        b[rows], f[rows], s[rows] = bb, ff, ss
        todo = ~(bb > tau) if mass is not None else ~(low > tau)   # low <= b: the candidates hold all
        if not bool(todo.any()):
            break
        rows, c = rows[todo], c * 8                             # the same rows on every shard: tau, v agree
        top = _candidates(z, c, rows)
    return Support(b, f, m + torch.log(s))


def row_blocks(t: Tensor) -> list[tuple[int, ...]]:
    """Indices of ``t`` [..., W] whose ``t[i]`` are 2-D [rows, W] views (no copy of a sliced tensor,
    which ``reshape(-1, W)`` would make)."""
    lead = t.shape[:-2]
    if not lead:
        return [()]
    return [tuple(int(x) for x in ix) for ix in torch.cartesian_prod(*(torch.arange(n) for n in lead)).reshape(-1, len(lead))]


@torch.no_grad()
def sampling_support(z: Tensor, spec: SamplingSpec, col: Collectives = WHOLE_ROW) -> Support:
    """The kept set of ``z`` = logits / T ([..., W]; a shard's real columns, no padding) under ``spec``'s
    min-p, top-k and top-p (the module docstring, in vLLM's order), as :class:`Support` [...]."""
    z = z if z.dtype == torch.float32 else z.float()
    if z.dim() == 1:
        return Support(*(t.squeeze(0) for t in sampling_support(z[None], spec, col)))
    out = Support(*(z.new_empty(z.shape[:-1]) for _ in range(3)))
    for ix in row_blocks(z):
        rows = z[ix]
        if spec.truncates():
            step = max(1, CHUNK_BYTES // (4 * max(1, rows.shape[-1])))
            parts = [_support_rows(rows[i:i + step], spec, col) for i in range(0, rows.shape[0], step)]
            sup = Support(*(torch.cat(t) for t in zip(*parts)))
        else:
            m = col.max(rows.amax(-1))
            m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
            sup = Support(torch.full_like(m, float("-inf")), torch.ones_like(m),
                          m + torch.log(_row_mass(rows, m, 0.0, col)))
        for dst, src in zip(out, sup):
            dst[ix] = src
    return out


def processed_logits(logits: Tensor, temperature: float, top_k: int = -1, top_p: float = 1.0,
                     min_p: float = 0.0) -> Tensor:
    """z / T + log w over a whole row ([V] or [B, V]): the logits μ samples from (dropped tokens −inf;
    boundary ties of top-p share their kept mass evenly, module docstring). ``log_softmax`` of it is
    log μ on the kept tokens."""
    spec = SamplingSpec(temperature, top_k, top_p, min_p)
    z = logits.float() / temperature
    if not spec.truncates(z.shape[-1]):
        return z
    return z + torch.log(sampling_support(z, spec).weights(z))


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
    return z.gather(-1, tokens.long().unsqueeze(-1)).squeeze(-1) >= sampling_support(z, spec).bound
