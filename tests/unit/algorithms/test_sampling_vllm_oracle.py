"""μ's kept set against vLLM 0.32's own implementations, run on this CPU (``tests/helpers/vllm_samplers.py``):
the sort path ``apply_top_k_top_p_pytorch`` that the engines run (the CPU build's, and the GPU build's
through ``patches/vllm_gpu_sort_sampler.py``), and the Triton kernel a CUDA build would otherwise run,
under Triton's interpreter. Rows: random (N(0, 9)) and heavy-tie (bf16-rounded N(16, 4): ulp 0.125, ties
near rank 20 as in a bf16 model's logits); top-k 1 / 20 / off, top-p 0.5 / 0.95 / 1, min-p; the
vocabulary whole and split in 2 and 4 shards (uneven widths, so tie groups straddle shard boundaries),
with the candidate counts cut small so the rows that the first candidates do not settle are redone."""
from __future__ import annotations

import math

import pytest
import torch

from megatron_rl.algorithms import sampling as S
from megatron_rl.algorithms.sampling import SamplingSpec, sampling_support
from tests.helpers.shards import run_sharded

pytest.importorskip("vllm.v1.sample.ops.topk_topp_sampler")
from tests.helpers.vllm_samplers import kernel_paths, sort_path

V = 600
SHARDS = {1: [0, V], 2: [0, 310, V], 4: [0, 140, 290, 450, V]}
SPECS = [(1, 1.0, 0.0), (20, 1.0, 0.0), (-1, 0.5, 0.0), (-1, 0.95, 0.0), (20, 0.95, 0.0), (20, 0.5, 0.0),
         (-1, 1.0, 0.1), (20, 0.95, 0.05), (V, 0.95, 0.0)]


def _rows(kind: str, n: int = 24) -> torch.Tensor:
    g = torch.Generator().manual_seed(5)
    if kind == "random":
        return torch.randn(n, V, generator=g) * 3
    return (torch.randn(n, V, generator=g) * 2 + 16).bfloat16().float()


def _min_p(z: torch.Tensor, min_p: float) -> torch.Tensor:
    """vLLM's ``MinPLogitsProcessor.apply`` (softmax, max, compare), before top-k / top-p."""
    if min_p == 0.0:
        return z
    q = z.softmax(-1)
    return z.masked_fill(q < q.amax(-1, keepdim=True) * min_p, -math.inf)


@pytest.mark.parametrize("tp", [1, 2, 4], ids=lambda t: f"tp{t}")
@pytest.mark.parametrize("kind", ["random", "ties"])
def test_kept_set_is_vllm_sort_path(kind, tp, monkeypatch):
    """Tokens vLLM keeps have w > 0 here, and Σ w = vLLM's kept count: equal sets, except where vLLM's
    sort keeps n_keep of n_b tokens tied at the top-p boundary (which ones depends on its sort) and μ
    spreads the same mass over all n_b. log Σ w e^z = vLLM's logsumexp over its kept set. Tolerances:
    the count is Σ of fractions n_keep/n_b (fp32: 1e-4 over <= 600 terms); the normaliser an fp32 sum of
    <= 600 terms (1e-5 absolute, relative error ~V·2^-24)."""
    monkeypatch.setattr(S, "CANDIDATES", 16)
    monkeypatch.setattr(S, "TIE_SLACK", 1)
    z = _rows(kind)
    for k, p, mp in SPECS:
        spec = SamplingSpec(1.0, top_k=k, top_p=p, min_p=mp)
        ref = sort_path(_min_p(z, mp), k if k < V else -1, p)
        parts = run_sharded(lambda shard, col, spec=spec: sampling_support(shard, spec, col), z, SHARDS[tp])
        for sup in parts[1:]:
            assert torch.equal(sup.bound, parts[0].bound) and torch.equal(sup.frac, parts[0].frac)
        w = parts[0].weights(z)
        kept = torch.isfinite(ref)
        assert not (kept & (w == 0)).any(), (k, p, mp)
        assert not ((w == 1) & ~kept).any(), (k, p, mp)                  # extra tokens only tied (w < 1)
        torch.testing.assert_close(w.sum(-1), kept.sum(-1).float(), atol=1e-4, rtol=0)
        torch.testing.assert_close(parts[-1].log_z, torch.logsumexp(ref, -1), atol=1e-5, rtol=0)


def test_kernel_rule_differences_are_the_known_ones(tmp_path):
    """The Triton kernel (the GPU build's default, which the engines are pinned away from) against μ at TP 1
    and 4: its kept set is always inside μ's, and every difference is one of the kernel's two known rules:
    (a) top-k keeps exactly k, cutting the tokens tied at the k-th value by vocabulary index (μ and the sort
    path keep them all); (b) its top-p pivot search ends early (18 steps or a 1e-9 range, then the
    midpoint) and leaves out some of the lowest tokens μ keeps, so its kept mass is below the exact
    set's. Seen on heavy-tie rows and at top-p 0.95 on random rows; never at top-k 1 or top-p 0.5 on random rows."""
    cases, meta = [], []
    for kind, specs in (("random", ((1, 1.0), (-1, 0.5), (-1, 0.95))), ("ties", ((20, 1.0), (20, 0.95)))):
        z = _rows(kind, 8)
        for k, p in specs:
            cases.append((z, k, p))
            meta.append((kind, k, p))
    outs = kernel_paths(cases, tmp_path)
    for (z, k, p), out, (kind, _, _) in zip(cases, outs, meta):
        kern = torch.isfinite(out)
        for tp in (1, 4):
            spec = SamplingSpec(1.0, top_k=k, top_p=p)
            sup = run_sharded(lambda shard, col, spec=spec: sampling_support(shard, spec, col), z, SHARDS[tp])[0]
            ours = sup.weights(z) > 0
            assert not (kern & ~ours).any(), (kind, k, p)                       # never keeps more
            extra = ours & ~kern
            if p == 1.0:                                                        # (a) exactly k, ties cut
                assert (kern.sum(-1) == k).all()
                assert (z[extra] == (z.masked_fill(~kern, math.inf).amin(-1, keepdim=True).expand_as(z))[extra]).all()
            else:                                                               # (b) the lowest ones left out
                low = z.masked_fill(~kern, math.inf).amin(-1, keepdim=True)
                assert (z[extra] <= low.expand_as(z)[extra]).all(), (kind, k, p)
            if kind == "random" and (k == 1 or p == 0.5):
                assert not extra.any(), (kind, k, p)
