"""μ, the sampled distribution (``algorithms/sampling.py``): against a hand-written reference of vLLM
0.32's CPU sampler (``vllm/v1/sample/ops/topk_topp_sampler.py`` ``apply_top_k_top_p_pytorch``: sort
ascending, top-k by the k-th value, cumsum, drop where <= 1 − p, last kept; min-p as
``MinPLogitsProcessor``), closed forms on a 5-token vocabulary, the edge cases (top-k 1, a top-p that
keeps one token, ties at both boundaries, min-p) and a vocabulary split into shards (the reductions
the trainer's tensor-parallel pass runs, here over the shards of one tensor). vLLM's own functions and
engine are the oracle in ``tests/e2e/test_rollout_vllm.py``."""
from __future__ import annotations

import math

import pytest
import torch

from megatron_rl.algorithms.sampling import (
    SamplingSpec,
    in_support,
    sampled_logprobs,
    sampling_support,
)
from tests.helpers.shards import run_sharded

# probabilities 0.5, 0.25, 0.15, 0.06, 0.04 (logits = log p, temperature 1)
P = torch.tensor([0.5, 0.25, 0.15, 0.06, 0.04])


def vllm_reference(z: torch.Tensor, spec: SamplingSpec) -> torch.Tensor:
    """Processed logits of rows ``z`` [B, V] written from vLLM 0.32's code path (temperature, min-p,
    then top-k / top-p on the ascending sort), float64 so the reference's own rounding is negligible."""
    z = z.double() / spec.temperature
    if spec.min_p > 0:
        q = z.softmax(-1)
        z = z.masked_fill(q < q.amax(-1, keepdim=True) * spec.min_p, -math.inf)
    zs, idx = z.sort(-1)
    if spec.top_k > 0:
        kth = zs.gather(1, torch.full((z.shape[0], 1), z.shape[1] - spec.top_k))
        zs = zs.masked_fill(zs < kth, -math.inf)
    if spec.top_p < 1:
        drop = zs.softmax(-1).cumsum(-1) <= 1 - spec.top_p
        drop[:, -1] = False
        zs = zs.masked_fill(drop, -math.inf)
    return z.scatter(-1, idx, zs)


@pytest.mark.parametrize(("kw", "kept"), [
    pytest.param({"top_k": 1}, {0}, id="top_k=1"),
    pytest.param({"top_k": 2}, {0, 1}, id="top_k=2"),
    pytest.param({"top_p": 0.3}, {0}, id="top_p-keeps-one-token"),
    pytest.param({"top_p": 0.7}, {0, 1}, id="top_p=0.7"),
    pytest.param({"top_p": 0.76}, {0, 1, 2}, id="top_p=0.76"),
    pytest.param({"min_p": 0.25}, {0, 1, 2}, id="min_p=0.25-keeps-q>=0.125"),
    pytest.param({"top_k": 3, "top_p": 0.8}, {0, 1}, id="top_k-then-top_p-renormalised"),
    # min-p 0.1 drops .04; top-k 4 keeps the rest; over {.5,.25,.15,.06}/.96 the ascending cumsum .0625 <= .1
    pytest.param({"min_p": 0.1, "top_k": 4, "top_p": 0.9}, {0, 1, 2}, id="all-three"),
])
def test_closed_forms_on_five_tokens(kw, kept):
    """log μ(y) = log p_y − log Σ_kept p (the kept sets from the cumulative masses .04 .10 .25 .50 1)."""
    spec = SamplingSpec(**kw)
    z = P.log()[None].expand(5, 5)
    y = torch.arange(5)
    lp = sampled_logprobs(z, y, spec)
    mass = float(P[sorted(kept)].sum())
    for i in range(5):
        assert math.isclose(float(lp[i]), math.log(P[i]) - math.log(mass), abs_tol=1e-6), (i, kw)
    assert set(torch.nonzero(in_support(z, y, spec)).flatten().tolist()) == kept


def test_top_p_exactly_reached_in_exact_arithmetic():
    """top_p = 0.75 = 0.5 + 0.25: the third token's mass ahead (0.75) is not < 0.75, it is dropped."""
    p = torch.tensor([0.5, 0.25, 0.125, 0.0625, 0.0625], dtype=torch.float32)   # dyadic: exact in fp32
    w = sampling_support(p.log()[None], SamplingSpec(top_p=0.75)).weights(p.log()[None])
    assert w.tolist() == [[1.0, 1.0, 0.0, 0.0, 0.0]]


def test_ties_at_the_top_k_boundary_are_all_kept():
    """vLLM compares values with the k-th largest: ties with it stay (4 tokens kept at k = 2)."""
    z = torch.tensor([[2.0, 1.0, 1.0, 1.0, 0.0]])
    w = sampling_support(z, SamplingSpec(top_k=2)).weights(z)
    assert w.tolist() == [[1.0, 1.0, 1.0, 1.0, 0.0]]


def test_ties_at_the_top_p_boundary_keep_vllm_s_count():
    """Four equal tokens of mass 0.2 below one of 0.2 (all equal: 5 x 0.2), top_p 0.5: vLLM's ascending
    cumsum .2 .4 .6 .8 1 drops the first two sorted positions -> 3 kept whichever ids its sort put there;
    here every tie carries weight 3/5 and μ(y) = 0.2 / 0.6 for each (the mass vLLM keeps)."""
    z = torch.zeros(1, 5)
    sup = sampling_support(z, SamplingSpec(top_p=0.5))
    torch.testing.assert_close(sup.weights(z), torch.full((1, 5), 0.6))
    lp = sampled_logprobs(z.expand(5, 5), torch.arange(5), SamplingSpec(top_p=0.5))
    torch.testing.assert_close(lp, torch.full((5,), math.log(0.2 / 0.6)))
    ref = vllm_reference(z, SamplingSpec(top_p=0.5))
    assert int(torch.isfinite(ref).sum()) == 3


def test_ties_below_the_top_p_boundary_stay_whole():
    """[.4, .2, .2, .2]: top_p 0.5 -> mass ahead of the .2 block is .4 < .5, then .6, .8: one tie kept."""
    p = torch.tensor([[0.4, 0.2, 0.2, 0.2]])
    w = sampling_support(p.log(), SamplingSpec(top_p=0.5)).weights(p.log())
    torch.testing.assert_close(w, torch.tensor([[1.0, 1 / 3, 1 / 3, 1 / 3]]))


@pytest.mark.parametrize("spec", [SamplingSpec(0.2, top_p=0.7), SamplingSpec(1.0, top_k=3), SamplingSpec(1.0, min_p=0.1),
                                  SamplingSpec(0.7, top_k=20, top_p=0.9, min_p=0.02), SamplingSpec(1.3, top_p=0.95),
                                  SamplingSpec(1.0, top_k=1)],
                         ids=["T0.2-p0.7", "k3", "minp0.1", "k20-p0.9-minp0.02", "T1.3-p0.95", "k1"])
def test_random_rows_match_the_vllm_reference(spec):
    """128 rows of 1000 logits (scale 3): same kept set and log μ as the reference. Tolerance: the fp32
    log-sum-exp over <= 1000 terms (relative error ~V·2^-24 ≈ 6e-5 of a sum of O(1)) -> 1e-4 absolute;
    a kept set may differ only where a cumulative mass sits within fp32 rounding of 1 − p (counted: 0)."""
    g = torch.Generator().manual_seed(0)
    z = torch.randn(128, 1000, generator=g) * 3
    ref = vllm_reference(z, spec)
    y = torch.multinomial(ref.softmax(-1).float(), 1, generator=g).squeeze(-1)
    want = ref.log_softmax(-1).gather(1, y[:, None]).squeeze(-1)
    got = sampled_logprobs(z, y, spec)
    torch.testing.assert_close(got.double(), want, atol=1e-4, rtol=0)
    kept = sampling_support(z / spec.temperature, spec).weights(z / spec.temperature) > 0
    assert torch.equal(kept, torch.isfinite(ref))


def test_shards_give_the_whole_row_result():
    """The vocabulary split in 4 shards (one of them narrower): every shard's weights and the shared
    normaliser equal the whole row's (bit-identical reductions are not promised: 1e-6)."""
    g = torch.Generator().manual_seed(1)
    z = torch.randn(64, 203, generator=g) * 2
    spec = SamplingSpec(0.8, top_k=30, top_p=0.8, min_p=0.01)
    whole = sampling_support(z / spec.temperature, spec)
    bounds = [0, 51, 102, 153, 203]
    got = _run_sharded(z / spec.temperature, spec, bounds)
    zz = z / spec.temperature
    torch.testing.assert_close(torch.cat([s.weights(zz[:, bounds[i]:bounds[i + 1]]) for i, s in enumerate(got)], -1),
                               whole.weights(zz))
    for s in got:
        torch.testing.assert_close(s.log_z, whole.log_z, atol=1e-6, rtol=0)


def _run_sharded(z: torch.Tensor, spec: SamplingSpec, bounds: list[int]):
    return run_sharded(lambda shard, col: sampling_support(shard, spec, col), z, bounds)


def test_bad_specs_fail_clearly():
    for kw, word in (({"temperature": 0.0}, "temperature"), ({"top_p": 0.0}, "top_p"), ({"min_p": 2.0}, "min_p")):
        with pytest.raises(ValueError, match=word):
            SamplingSpec(**kw)
