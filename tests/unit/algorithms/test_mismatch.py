"""Train–inference mismatch metrics (``algorithms/mismatch.py``) on hand-computed values.

train − gen = Δ:  row 0  [0.3, 0.3, 0.2]  mask 111   (sequence Δ = 0.8)
                  row 1  [0.5, 7.0, 7.0]  mask 100   (padding 7.0 must not count; sequence Δ = 0.5)
token_mult_prob_error = (2·e^0.3 + e^0.2 + e^0.5) / 4 = (2·1.349859 + 1.221403 + 1.648721) / 4 = 1.392461
gen_kl (k3)           = (2·(e^0.3 − 1.3) + (e^0.2 − 1.2) + (e^0.5 − 1.5)) / 4 = 0.269842 / 4 = 0.067461
token max |Δ| = 0.5, sequence max |Σ Δ| = 0.8; band [0.5, 1.5]: only e^0.5 = 1.648721 is beyond:
1/4 tokens, 1/2 sequences. Staleness [0, 1]: fresh = row 0: (2·1.349859 + 1.221403) / 3 = 1.307040,
stale = row 1: e^0.5 = 1.648721.
"""
from __future__ import annotations

import math

import pytest
import torch

from megatron_rl.algorithms.mismatch import (
    gen_kl,
    mismatch_metrics,
    split_mismatch_metrics,
    token_mult_prob_error,
)

D = torch.float64
GEN = torch.tensor([[-1.0, -2.0, -0.5], [-0.7, -1.0, -1.0]], dtype=D)
TRAIN = GEN + torch.tensor([[0.3, 0.3, 0.2], [0.5, 7.0, 7.0]], dtype=D)
MASK = torch.tensor([[1, 1, 1], [1, 0, 0]], dtype=D)


def test_values_by_hand():
    got = {k: float(v) for k, v in mismatch_metrics(TRAIN, GEN, MASK, band=(0.5, 1.5)).items()}
    assert got["token_mult_prob_error"] == pytest.approx(1.392461, abs=1e-6)
    assert got["gen_kl"] == pytest.approx(0.067461, abs=1e-6)
    assert got["token_logprob_diff_max"] == pytest.approx(0.5) and got["seq_logprob_diff_max"] == pytest.approx(0.8)
    assert got["beyond_token_frac"] == pytest.approx(0.25) and got["beyond_seq_frac"] == pytest.approx(0.5)


def test_nemo_rl_reference_case():
    """NeMo-RL's own parity case: generation (−1, −2), policy (−1.5, −1.5): mult error e^0.5, gen_kl cosh(0.5) − 1."""
    g, p, m = torch.tensor([[-1.0, -2.0]], dtype=D), torch.tensor([[-1.5, -1.5]], dtype=D), torch.ones(1, 2, dtype=D)
    assert float(token_mult_prob_error(p, g, m)) == pytest.approx(math.exp(0.5), abs=1e-12)
    assert float(gen_kl(p, g, m)) == pytest.approx(math.cosh(0.5) - 1.0, abs=1e-12)


def test_direction_of_gen_kl():
    """k3 with r = π_train/π_gen over tokens sampled by π_gen: KL(π_gen ‖ π_train). For a 2-token
    vocabulary π_gen = (0.8, 0.2), π_train = (0.5, 0.5), the π_gen-weighted mean of k3 is exactly
    KL(π_gen ‖ π_train) = 0.8 ln 1.6 + 0.2 ln 0.4 = 0.192745 (k3 is unbiased for it)."""
    lg, lt = torch.log(torch.tensor([0.8, 0.2], dtype=D)), torch.log(torch.tensor([0.5, 0.5], dtype=D))
    k3 = torch.exp(lt - lg) - (lt - lg) - 1.0
    assert float((torch.tensor([0.8, 0.2], dtype=D) * k3).sum()) == pytest.approx(0.192745, abs=1e-6)
    per_token = [float(gen_kl(lt[i].reshape(1, 1), lg[i].reshape(1, 1), torch.ones(1, 1, dtype=D))) for i in range(2)]
    assert per_token == pytest.approx(k3.tolist())


def test_gen_kl_of_a_near_perfect_match_is_positive():
    """Δ = 1.0041532541208779e-12 (float64): e^Δ − Δ − 1 evaluated as written rounds to −1.1e-16, so a healthy
    run's ``0 <= gen_kl`` would hang on the host's rounding; each k3 term is taken without cancellation
    (``kl.k3_log_ratio``): Δ²/2 (1 + Δ/3) to float64 precision, by hand 5.0416687e-25."""
    d = 1.0041532541208779e-12
    dt = torch.tensor([[d]], dtype=D)
    assert float(torch.exp(dt) - dt - 1.0) < 0.0                  # the naive form, for the record
    got = float(gen_kl(dt, torch.zeros_like(dt), torch.ones_like(dt)))
    assert got == pytest.approx(d * d / 2, rel=1e-12) and got > 0.0


def test_agreement_and_empty_mask():
    same = mismatch_metrics(GEN, GEN.clone(), MASK, band=(0.5, 2.0))
    assert float(same["token_mult_prob_error"]) == 1.0 and float(same["gen_kl"]) == 0.0
    assert float(same["beyond_token_frac"]) == 0.0 and float(same["seq_logprob_diff_max"]) == 0.0
    empty = mismatch_metrics(TRAIN, GEN, torch.zeros_like(MASK), band=(0.5, 2.0))
    assert float(empty["token_mult_prob_error"]) == 1.0 and float(empty["gen_kl"]) == 0.0
    assert float(empty["token_logprob_diff_max"]) == 0.0 and float(empty["beyond_seq_frac"]) == 0.0
    assert "beyond_token_frac" not in mismatch_metrics(TRAIN, GEN, MASK)


def test_split_by_staleness():
    stale = torch.tensor([0, 1])
    res = split_mismatch_metrics(TRAIN, GEN, MASK, stale, band=(0.5, 1.5), split=True)
    assert res["rollout/token_mult_prob_error"] == pytest.approx(1.392461, abs=1e-6)
    assert res["rollout/token_mult_prob_error_fresh"] == pytest.approx(1.307040, abs=1e-6)
    assert res["rollout/token_mult_prob_error_stale"] == pytest.approx(math.exp(0.5), abs=1e-6)
    assert res["rollout/seq_logprob_diff_max_fresh"] == pytest.approx(0.8)
    fresh_only = split_mismatch_metrics(TRAIN, GEN, MASK, torch.zeros(2, dtype=torch.long), split=True)
    assert "rollout/gen_kl_fresh" in fresh_only and not any(k.endswith("_stale") for k in fresh_only)
    assert not any(k.endswith(("_fresh", "_stale")) for k in split_mismatch_metrics(TRAIN, GEN, MASK, stale))
