"""The rollout-correction suite (``algorithms/correction.py``) against verl's definitions
(``rollout_corr_helper.py``: log-ratio old − rollout, exp(±20) safety bound in log space, sequence
ratio = exp of the masked SUM, geometric = exp of the masked MEAN, closed bands [L, U] with L = 1/U by
default, rejection rewrites the mask, IcePop zeroes the weight only). Spec-style vectors; every
expected number is hand-computed (float64, 6 decimals) in the comments.

δ = old − rollout on the four rows of :data:`OLD` / :data:`ROLL`:

    row A  δ = [0.1, 0.2, −0.1]   mask 111   S = 0.2    ρ = e^0.2  = 1.221403   g = e^(0.2/3) = 1.068939
    row B  δ = [0.5, 0.6, 9.9]    mask 110   S = 1.1    ρ = e^1.1  = 3.004166   g = e^0.55    = 1.733253
           (the padded token's 9.9 must not count: S would be 11.0)
    row C  δ = [−0.9, −0.1, 0.0]  mask 111   S = −1.0   ρ = e^−1   = 0.367879   g = e^(−1/3)  = 0.716531
    row D  δ = [5, 5, 5]          mask 000   S = 0      ρ = g = 1 (empty row: kept, no token)

token ratios e^δ:  A [1.105171, 1.221403, 0.904837]  B [1.648721, 1.822119, –]  C [0.406570, 0.904837, 1]
"""
from __future__ import annotations

import math

import pytest
import torch

from megatron_rl.algorithms.correction import (
    CORRECTION_MODES,
    BandHParams,
    GeoHParams,
    IcePopHParams,
    NoHParams,
    TruncateHParams,
    apply_correction,
    correction_recomputes,
    register_correction,
)
from megatron_rl.algorithms.offpolicy import off_policy_weights

D = torch.float64
ROLL = [[-1.0, -1.0, -1.0], [-2.0, -2.0, -2.0], [-0.5, -0.5, -0.5], [-3.0, -3.0, -3.0]]
DELTA = [[0.1, 0.2, -0.1], [0.5, 0.6, 9.9], [-0.9, -0.1, 0.0], [5.0, 5.0, 5.0]]
OLD = [[r + d for r, d in zip(rr, dd)] for rr, dd in zip(ROLL, DELTA)]
MASK = [[1, 1, 1], [1, 1, 0], [1, 1, 1], [0, 0, 0]]


def t(x):
    return torch.tensor(x, dtype=D)


def run(mode, hp, old=OLD, roll=ROLL, mask=MASK):
    return apply_correction(mode, t(old), t(roll), t(mask), hp)


def close(a, b, atol=1e-6):
    torch.testing.assert_close(a, t(b) if not isinstance(b, torch.Tensor) else b, atol=atol, rtol=0)


def m(out, key):
    return float(out.metrics[f"offpolicy/{key}"])


def test_registry_and_recompute_flags():
    assert sorted(CORRECTION_MODES) == ["bypass", "geo_rs", "icepop", "seq_mis", "seq_tis"]
    assert [correction_recomputes(k) for k in ("decoupled", "tis", "none", "seq_tis", "icepop", "bypass")] == \
        [True, True, True, True, True, False]
    with pytest.raises(ValueError, match="already registered"):
        register_correction("tis", NoHParams)(lambda *a: None)
    with pytest.raises(TypeError, match="BandHParams"):
        run("seq_mis", TruncateHParams())


def test_seq_tis_truncates_the_product():
    out = run("seq_tis", TruncateHParams(cap=2.0))
    close(out.weights, [[1.221403] * 3, [2.0, 2.0, 0.0], [0.367879] * 3, [0.0] * 3])   # B: min(3.004166, 2)
    assert out.keep is None
    # mean over the 8 response tokens: (3·1.221403 + 2·2 + 3·0.367879) / 8 = 8.767846 / 8
    assert m(out, "is_mean") == pytest.approx(1.095981, abs=1e-6) and m(out, "is_max") == pytest.approx(2.0)
    # sequence ratios vs [1/2, 2] over the 3 rows with tokens: B high, C low
    assert (m(out, "ratio_high_frac"), m(out, "ratio_low_frac")) == pytest.approx((1 / 3, 1 / 3))
    assert m(out, "masked_token_frac") == 0.0 and m(out, "rejected_seq_frac") == 0.0


def test_seq_tis_cap_one_and_safety_bound():
    out = run("seq_tis", TruncateHParams(cap=1.0))                  # cap = 1: no sequence weighs above 1
    close(out.weights, [[1.0] * 3, [1.0, 1.0, 0.0], [0.367879] * 3, [0.0] * 3])
    # S = 30 is clamped to 20 in log space before exp: e^20 = 485165195.409790, then truncated
    big = run("seq_tis", TruncateHParams(cap=1e12), old=[[30.0]], roll=[[0.0]], mask=[[1]])
    assert float(big.weights[0, 0]) == pytest.approx(math.exp(20.0), rel=1e-12)


def test_seq_mis_rejects_rows_outside_the_band():
    out = run("seq_mis", BandHParams(upper=2.0))                    # L = 1/2 by default
    # A (1.221403) kept with its weight; B (3.004166 > 2) and C (0.367879 < 0.5) leave the mask; D kept
    close(out.keep, [[1.0] * 3, [0.0] * 3, [0.0] * 3, [1.0] * 3])
    close(out.weights, [[1.221403] * 3, [0.0] * 3, [0.0] * 3, [0.0] * 3])
    assert m(out, "masked_token_frac") == pytest.approx(5 / 8) and m(out, "rejected_seq_frac") == pytest.approx(2 / 3)
    assert m(out, "is_mean") == pytest.approx(1.221403, abs=1e-6)   # over the kept tokens (A's 3)
    # all in band / all out
    wide = run("seq_mis", BandHParams(upper=4.0, lower=0.25))
    close(wide.keep, [[1.0] * 3] * 4)
    close(wide.weights, [[1.221403] * 3, [3.004166, 3.004166, 0.0], [0.367879] * 3, [0.0] * 3])
    tight = run("seq_mis", BandHParams(upper=1.1, lower=1.05))      # no row with tokens in [1.05, 1.1]
    assert float(tight.keep[:3].sum()) == 0.0 and m(tight, "rejected_seq_frac") == 1.0
    assert m(tight, "is_mean") == 1.0                               # no kept token: the neutral value
    # closed band: a ratio equal to the bound is kept (e^0.2 against U = e^0.2)
    edge = run("seq_mis", BandHParams(upper=math.exp(0.2) + 1e-15, lower=0.1))
    assert float(edge.keep[0, 0]) == 1.0


def test_geo_rs_rejects_on_the_geometric_mean():
    out = run("geo_rs", GeoHParams(upper=1.1, lower=0.9))
    # g: A 1.068939 in, B 1.733253 out, C 0.716531 out, D 1 in; no IS weight
    assert out.weights is None
    close(out.keep, [[1.0] * 3, [0.0] * 3, [0.0] * 3, [1.0] * 3])
    assert (m(out, "ratio_high_frac"), m(out, "ratio_low_frac")) == pytest.approx((1 / 3, 1 / 3))
    preset = run("geo_rs", GeoHParams())                            # verl's preset band [0.999, 1.001]: all out
    assert float(preset.keep[:3].sum()) == 0.0 and m(preset, "masked_token_frac") == 1.0
    allin = run("geo_rs", GeoHParams(upper=2.0, lower=0.5))
    close(allin.keep, [[1.0] * 3] * 4)
    assert m(allin, "masked_token_frac") == 0.0


def test_icepop_zeroes_tokens_outside_the_band():
    out = run("icepop", IcePopHParams())                            # [0.5, 5]
    # C's first token (0.406570 < 0.5) gets 0; it stays in the mask (keep None)
    close(out.weights, [[1.105171, 1.221403, 0.904837], [1.648721, 1.822119, 0.0], [0.0, 0.904837, 1.0], [0.0] * 3])
    assert out.keep is None
    # mean over all 8 tokens, the zeroed one included: 7.607088... + 1 = 8.607088 / 8
    assert m(out, "is_mean") == pytest.approx(1.075886, abs=1e-6)
    assert m(out, "masked_token_frac") == pytest.approx(1 / 8) and m(out, "rejected_seq_frac") == pytest.approx(1 / 3)
    assert (m(out, "ratio_low_frac"), m(out, "ratio_high_frac")) == pytest.approx((1 / 8, 0.0))
    narrow = run("icepop", IcePopHParams(upper=1.2, lower=0.95))    # keeps 1.105171 and 1
    close(narrow.weights, [[1.105171, 0.0, 0.0], [0.0] * 3, [0.0, 0.0, 1.0], [0.0] * 3])


def test_token_tis_is_verl_token_level():
    """``tis`` (offpolicy.py) is verl's token-level TIS: min(exp(clip20(δ)), C)·m on every sample."""
    out = off_policy_weights(t(OLD), t(ROLL), t(MASK), torch.zeros(4, dtype=torch.long), mode="tis", cap=2.0)
    close(out.weights, [[1.105171, 1.221403, 0.904837], [1.648721, 1.822119, 0.0], [0.406570, 0.904837, 1.0], [0.0] * 3])
    one = off_policy_weights(t(OLD), t(ROLL), t(MASK), torch.zeros(4, dtype=torch.long), mode="tis", cap=1.0)
    close(one.weights, [[1.0, 1.0, 0.904837], [1.0, 1.0, 0.0], [0.406570, 0.904837, 1.0], [0.0] * 3])


def test_empty_mask_and_singleton():
    empty = [[0, 0, 0]] * 4
    for mode, hp in (("seq_tis", TruncateHParams()), ("seq_mis", BandHParams()), ("geo_rs", GeoHParams()),
                     ("icepop", IcePopHParams())):
        out = run(mode, hp, mask=empty)
        if out.weights is not None:
            assert float(out.weights.abs().sum()) == 0.0, mode
        assert m(out, "masked_token_frac") == 0.0 and m(out, "rejected_seq_frac") == 0.0, mode
        assert m(out, "is_mean") == 1.0, mode
    # one row, one token with ρ = 3
    one = dict(old=[[math.log(3.0)]], roll=[[0.0]], mask=[[1]])
    assert float(run("seq_tis", TruncateHParams(cap=2.0), **one).weights) == pytest.approx(2.0)
    assert float(run("seq_mis", BandHParams(upper=2.0), **one).keep) == 0.0
    assert float(run("icepop", IcePopHParams(), **one).weights) == pytest.approx(3.0)
    assert float(run("geo_rs", GeoHParams(), **one).keep) == 0.0


def test_bypass_has_nothing_to_weight():
    out = run("bypass", NoHParams())
    assert out.weights is None and out.keep is None and out.metrics == {}


def test_weights_carry_no_gradient():
    old = t(OLD).requires_grad_(True)
    out = apply_correction("seq_mis", old, t(ROLL), t(MASK), BandHParams(upper=4.0, lower=0.25))
    assert not out.weights.requires_grad


def test_hparams_validation():
    for bad, msg in ((lambda: BandHParams(upper=0.0), "upper must be a finite number > 0"),
                     (lambda: BandHParams(upper=2.0, lower=3.0), "lower .* must be <="),
                     (lambda: TruncateHParams(cap=0.5), "cap must be >= 1"),
                     (lambda: IcePopHParams(lower=float("nan")), "lower must be a finite")):
        with pytest.raises(ValueError, match=msg):
            bad()
    assert BandHParams(upper=4.0).band() == (0.25, 4.0) and GeoHParams().band() == (0.999, 1.001)


def test_config_builds_the_modes_dataclass_and_round_trips():
    """``algo.correction`` becomes the mode's typed dataclass (its defaults when unset) and survives the
    run's config dump (``to_dict`` -> ``from_dict``); the built-in modes keep their earlier dump."""
    from megatron_rl.config import from_dict, load_config

    cfg = load_config(None, ["algo.off_policy=seq_mis", "algo.correction.upper=3"])
    assert cfg.algo.correction == BandHParams(upper=3.0) and cfg.algo.correction.band() == (1 / 3, 3.0)
    assert from_dict(cfg.to_dict()) == cfg and cfg.to_dict()["algo"]["correction"] == {"upper": 3.0, "lower": None}
    assert load_config(None, ["algo.off_policy=icepop"]).algo.correction == IcePopHParams()
    plain = load_config(None, [])
    assert plain.algo.correction is None and "correction" not in plain.to_dict()["algo"]
