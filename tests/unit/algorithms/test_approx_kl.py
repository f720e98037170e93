"""``approx_kl``: the k3 term e^Δ − 1 − Δ of each token's log-ratio Δ = lp − old, masked-mean over the
tokens (``algorithms/kl.py: k3_log_ratio``), in every PPO-family loss beside ``ppo_kl`` (the mean of −Δ,
which can cancel). Expected values by hand or from the standard library's ``decimal`` at 60 digits
(e^Δ − 1 − Δ of the binary value the tensor holds, no cancellation left at that precision); the
property the e2e clip test relies on: a clipped token's term is at least
h(ε) = min(ε_high − ln(1 + ε_high), −ε_low − ln(1 − ε_low))."""
from __future__ import annotations

import decimal
import math

import pytest
import torch

from megatron_rl.algorithms import (
    cispo_loss,
    gspo_loss,
    k3_log_ratio,
    plain_clip_loss,
    ppo_clip_loss,
)
from tests.helpers.fp32_tolerance import U

F32 = torch.float32


def _k3(d: float) -> float:
    """e^d − 1 − d of the float d, to 60 significant digits, rounded once to float64."""
    with decimal.localcontext() as ctx:
        ctx.prec = 60
        x = decimal.Decimal(d)          # exact: every binary float is a finite decimal
        return float(x.exp() - 1 - x)


@pytest.mark.parametrize("d,want", [
    (math.log(2.0), 1.0 - math.log(2.0)),          # ρ = 2: 2 − 1 − ln 2
    (-math.log(2.0), math.log(2.0) - 0.5),          # ρ = 1/2: 1/2 − 1 + ln 2
    (1.0, math.e - 2.0),                             # e − 1 − 1
    (-20.0, 19.0 + math.exp(-20.0)),                 # e^-20 − 1 + 20
], ids=["log2", "-log2", "one", "-20"])
def test_k3_closed_forms(d, want):
    for dtype, unit in ((F32, U), (torch.float64, 2.0 ** -53)):
        x = torch.tensor([d], dtype=dtype)
        got = float(k3_log_ratio(x))
        exact = _k3(float(x))            # of the value the dtype holds
        assert abs(got - exact) <= 4 * unit * exact, (dtype, got, exact)
        assert abs(exact - want) <= 1e-6 * want if dtype is F32 else abs(exact - want) <= 1e-14 * want


def test_k3_is_zero_exactly_on_policy_and_positive_off_it():
    assert float(k3_log_ratio(torch.zeros(3, dtype=F32)).abs().sum()) == 0.0
    # every magnitude from one fp32 ulp of a log-prob near −1 to the ±20 clamp, both signs
    mags = torch.logspace(-20, math.log10(20.0), 4001, dtype=torch.float64).to(F32)
    d = torch.cat([mags, -mags])
    v = k3_log_ratio(d)
    assert bool((v > 0).all()), d[v <= 0]
    exact = torch.tensor([_k3(float(x)) for x in d], dtype=torch.float64)
    # series branch (|Δ| < 0.1): a few u; expm1 branch: ≤ (|e^Δ − 1| + |Δ|)·u/k3 + u ≤ 22u (at |Δ| = 0.1);
    # where k3 is an fp32 normal number (Δ²/2 ≥ 2^-126: |Δ| ≥ 2^-62.5 ≈ 1.5e-19; below, subnormals keep
    # fewer digits but stay > 0)
    normal = d.abs() >= 2.0 ** -62
    rel = ((v.double() - exact).abs() / exact)[normal].max()
    assert rel <= 24 * U, float(rel)


@pytest.mark.parametrize("d", [1e-7, -3e-7, 2.0 ** -20, 1e-4, -0.0999, 0.1, -0.1], ids=str)
def test_k3_small_log_ratios_do_not_cancel(d):
    """Where expm1(Δ) − Δ in fp32 loses every digit (Δ²/2 below half an ulp of Δ: |Δ| ≲ 1e-7) or most
    of them (1e-4: ~1e-3 relative), the series keeps fp32's precision: k3 ≈ Δ²/2 + Δ³/6."""
    x = torch.tensor([d], dtype=F32)
    exact = _k3(float(x))
    assert abs(float(k3_log_ratio(x)) - exact) <= 24 * U * exact
    if abs(d) < 2e-7:                    # what the series avoids: the naive form is off by > 10 %
        assert abs(float(torch.expm1(x) - x) - exact) > 0.1 * exact


def _batch():
    # Δ = lp − old per token: [[0.2, 0.5, −1.0], [0.2, 2.0, (off-mask) 0]]
    lp = torch.tensor([[-1.0, -0.5, -2.0], [-0.3, 0.0, -0.2]], dtype=torch.float64)
    old = torch.tensor([[-1.2, -1.0, -1.0], [-0.5, -2.0, -0.2]], dtype=torch.float64)
    a = torch.tensor([[1, 1, 1], [-0.5, -0.5, -0.5]], dtype=torch.float64)
    m = torch.tensor([[1, 1, 1], [1, 1, 0]], dtype=torch.float64)
    return lp, old, a, m


LOSSES = {
    "ppo_clip": lambda lp, old, a, m: ppo_clip_loss(lp, old, a, m, clip_low=0.2, clip_high=0.28, dual_clip=3.0),
    "plain_clip": lambda lp, old, a, m: plain_clip_loss(lp, old, a, m, clip_eps=0.2),
    "gspo": lambda lp, old, a, m: gspo_loss(lp, old, a, m),
    "gspo_token": lambda lp, old, a, m: gspo_loss(lp, old, a, m, level="token"),
    "cispo": lambda lp, old, a, m: cispo_loss(lp, old, a, m),
}


@pytest.mark.parametrize("name", sorted(LOSSES))
def test_every_ppo_family_loss_reports_the_token_mean_of_k3(name):
    lp, old, a, m = _batch()
    out = LOSSES[name](lp.clone().requires_grad_(True), old, a, m)
    # by hand: (e^.2 − 1.2)·2 + (e^.5 − 1.5) + (e^-1 − 1 + 1) + (e^2 − 3) over the 5 tokens = 0.989692
    want = (2 * _k3(0.2) + _k3(0.5) + _k3(-1.0) + _k3(2.0)) / 5
    assert want == pytest.approx(0.9896924654, abs=1e-9)
    got = out.metrics["approx_kl"]
    assert got.dim() == 0 and not got.requires_grad
    assert float(got) == pytest.approx(want, rel=1e-12)
    # on-policy (old = lp): exactly 0, as ppo_kl
    on = LOSSES[name](lp, lp.clone(), a, m).metrics
    assert float(on["approx_kl"]) == 0.0 == float(on["ppo_kl"])


def test_signed_ppo_kl_cancels_where_approx_kl_cannot():
    """Δ = ±0.3 on two tokens: ppo_kl (mean −Δ) is 0 although both ratios moved; approx_kl is their k3 mean."""
    lp = torch.tensor([[0.3, -0.3]], dtype=torch.float64)
    out = ppo_clip_loss(lp, torch.zeros_like(lp), torch.tensor([1.0], dtype=torch.float64), torch.ones_like(lp))
    assert float(out.metrics["ppo_kl"]) == 0.0
    assert float(out.metrics["approx_kl"]) == pytest.approx((_k3(0.3) + _k3(-0.3)) / 2, rel=1e-12)


def _h(clip_low: float, clip_high: float) -> float:
    """The least k3 of a ratio outside [1 − ε_low, 1 + ε_high] (k3 = ρ − 1 − ln ρ falls to 0 at ρ = 1 on both
    sides); ε_low ≥ 1: no lower bound."""
    lo = -clip_low - math.log1p(-clip_low) if clip_low < 1 else math.inf
    return min(clip_high - math.log1p(clip_high), lo)


def test_h_by_hand():
    assert _h(0.2, 0.28) == pytest.approx(-0.2 - math.log(0.8))       # 0.023144 < 0.28 − ln 1.28 = 0.033140
    assert _h(0.2, 0.28) == pytest.approx(0.0231435513, abs=1e-10)
    assert _h(10.0, 0.2) == pytest.approx(0.2 - math.log(1.2))         # CISPO: the upper side only


@pytest.mark.parametrize("name,kw,eps", [
    ("ppo_clip", {"clip_low": 0.2, "clip_high": 0.28, "dual_clip": 3.0}, (0.2, 0.28)),
    ("plain_clip", {"clip_eps": 0.2}, (0.2, 0.2)),
    ("cispo", {"clip_low": 10.0, "clip_high": 0.2}, (10.0, 0.2)),
])
def test_a_clipped_token_carries_at_least_h(name, kw, eps):
    """fp32, 20,000 tokens with Δ ~ N(0, 0.3²) around the clip boundaries: every clipped token's k3 term is
    ≥ h(ε)·(1 − 64u) (the ratio's exp and the thresholds' fp32 rounding move the boundary by ≤ 3u·ε in
    Δ, i.e. ≤ 3u·ε/h ≤ 37u of h; the k3 rounding adds ≤ 20u there), so approx_kl ≥ h·pg_clipfrac."""
    fn = {"ppo_clip": ppo_clip_loss, "plain_clip": plain_clip_loss, "cispo": cispo_loss}[name]
    g = torch.Generator().manual_seed(0)
    old = -torch.rand(100, 200, generator=g) * 3
    lp = old + torch.randn(100, 200, generator=g) * 0.3
    a = torch.randn(100, 200, generator=g)
    m = (torch.rand(100, 200, generator=g) < 0.9).to(F32)
    out = fn(lp, old, a, m, **kw)
    h = _h(*eps) * (1 - 64 * U)
    d = (lp - old).double()
    ratio = d.exp()
    hit = (ratio > 1 + eps[1]) | (ratio < 1 - eps[0])
    k3 = k3_log_ratio(lp - old)
    assert bool((k3[hit & (m > 0)] >= h).all())
    clip, kl = float(out.metrics["pg_clipfrac"]), float(out.metrics["approx_kl"])
    assert clip > 0.05 and kl >= h * clip, (clip, kl, h)
