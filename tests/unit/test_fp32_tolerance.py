"""The reduction-order bounds of ``tests/helpers/fp32_tolerance.py`` against real fp32 sums: the same
terms summed in other orders and blockings (sequential, reversed, pairwise, torch's vectorised sum,
float64 as the exact value) stay within γ̃_n·Σ|x|, and far within the worst case γ_n·Σ|x|."""
from __future__ import annotations

import math

import pytest
import torch

from tests.helpers.fp32_tolerance import U, cond, gamma, gamma_prob, reorder_rtol


def test_constants_and_closed_forms():
    assert U == 2.0 ** -24 and gamma(0) == 0.0
    assert gamma(1000) == pytest.approx(1000 * U / (1 - 1000 * U))
    assert gamma_prob(10_000) == pytest.approx(8 * 100 * U, rel=1e-4)       # ≈ λ√n·u for n·u ≪ 1
    assert gamma_prob(10_000) < gamma(10_000) / 10
    assert reorder_rtol([101], cond=3.0, passes=2) == pytest.approx(2 * 3 * 2 * gamma_prob(100))
    assert cond(5.0, -0.5) == 10.0 and cond(1.0, 2.0) == 1.0 and cond(1.0, 0.0) == math.inf
    with pytest.raises(ValueError):
        reorder_rtol([10], cond=0.5)


def _orders(x: torch.Tensor) -> list[float]:
    def seq(v):
        s = torch.zeros((), dtype=torch.float32)
        for c in v.split(1024):                       # blocked left-to-right accumulation in fp32
            s = s + c.sum()
        return float(s)

    def pairwise(v):
        while v.numel() > 1:
            if v.numel() % 2:
                v = torch.cat([v, v.new_zeros(1)])
            v = v[0::2] + v[1::2]
        return float(v[0])
    return [float(x.sum()), seq(x), seq(x.flip(0)), pairwise(x), float(x.view(-1, 4).sum(0).sum()),
            float(torch.cumsum(x, 0)[-1])]


@pytest.mark.parametrize("n", [100, 10_000, 300_000])
@pytest.mark.parametrize("signs", ["positive", "mixed"])
def test_real_fp32_sums_stay_within_the_bound(n, signs):
    g = torch.Generator().manual_seed(n)
    x = torch.rand(n, generator=g, dtype=torch.float64) * 2 + 0.1
    if signs == "mixed":
        x = x * torch.where(torch.rand(n, generator=g) < 0.5, -1.0, 1.0).double()
    exact, mag = float(x.sum()), float(x.abs().sum())
    x32 = x.float()
    exact32 = float(x32.double().sum())                 # the fp32 terms' exact sum (inputs already rounded)
    for got in _orders(x32):
        assert abs(got - exact32) <= gamma_prob(n - 1) * mag, (got, exact32)
        assert abs(got - exact32) <= gamma(n - 1) * mag
    assert abs(exact32 - exact) <= U * mag              # rounding the inputs themselves
