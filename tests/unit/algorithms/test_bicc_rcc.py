"""BiCC and RCC (bicc, bicc_rcc): the contrastive advantage and its bases, RCC baselines and δ,
the bilateral contexts built over token ids, and the old-log-prob switch.

Spec vectors T-B1..T-B6 (../shared/specs/bicc_rcc_papo_and_verl_baselines.md §4), independently
derived cases and the vectorised estimators against the per-group loop."""
from __future__ import annotations

import math

import pytest
import torch

import megatron_rl.algorithms as A
from megatron_rl.algorithms import (
    bicc_advantage,
    bicc_old_logp,
    build_bicc_contexts,
    grpo_advantage,
    rcc_advantage,
    rcc_delta,
)
from megatron_rl.algorithms.reference import bicc_loop, rcc_loop
from tests.helpers.algo_builders import D, close, gid, random_batch, t

R = torch.tensor([1.0, 0.0, 0.0, 0.0, 1.0, 1.0, 0.0, 1.0], dtype=torch.float64)


G = torch.tensor([0, 0, 0, 0, 1, 1, 1, 1])


M = torch.ones(8, 3)


def adv(base: str, greedy=None) -> torch.Tensor:
    hp = A.BiCCHParams(base=base)
    x = A.AlgoInputs(rewards=R, group_ids=G, mask=M, greedy_rewards=greedy)
    return A.compute_advantages("bicc", x, hp)


def test_bicc_base_grpo_and_dapo_are_std_scaled():
    # group 0: mean 0.25, unbiased std sqrt(0.25) = 0.5 -> (1 - 0.25) / 0.5 = 1.5, (0 - 0.25)/0.5 = -0.5
    s = math.sqrt(1 / 3 * (0.75 ** 2 + 3 * 0.25 ** 2))
    want0 = [0.75 / (s + 1e-6)] + [-0.25 / (s + 1e-6)] * 3
    for base in ("grpo", "dapo"):
        assert torch.allclose(adv(base)[:4], torch.tensor(want0, dtype=torch.float64))


def test_bicc_base_drgrpo_is_unscaled():
    assert torch.allclose(adv("drgrpo"), torch.tensor([0.75, -0.25, -0.25, -0.25, 0.25, 0.25, -0.75, 0.25],
                                                      dtype=torch.float64))


def test_bicc_base_bicc_is_the_released_form():
    # group 0: n+ = 1, n- = 3 -> +sqrt(3), -sqrt(1/3)
    a = adv("bicc")
    assert math.isclose(a[0], math.sqrt(3)) and math.isclose(a[1], -math.sqrt(1 / 3))


def test_bicc_base_remax_needs_greedy_rewards():
    greedy = torch.tensor([0.0] * 4 + [1.0] * 4, dtype=torch.float64)
    assert torch.allclose(adv("remax", greedy), R - greedy)
    assert "greedy_rewards" in A.kind_required_inputs("bicc", A.BiCCHParams(base="remax"))
    with pytest.raises(ValueError, match="greedy_rewards"):
        adv("remax")


def test_bicc_base_validation_and_dapo_switches():
    with pytest.raises(ValueError, match="bicc base 'ppo' invalid"):
        A.BiCCHParams(base="ppo")
    hp = A.BiCCHParams(base="dapo", overlong_enable=True, overlong_buffer_len=2, filter_groups=True)
    assert hp.overlong_enable and hp.filter_groups


def test_bicc_bases_are_registry_attributes():
    """BiCC's base estimators are one registry (``register_bicc_base``): the hparams' check, BiCC's
    advantage, RCC's scale and the inputs a base needs all ask it, so a user's base works in each."""
    from megatron_rl.algorithms import registry as Reg

    assert A.bicc_base_names() == ["bicc", "dapo", "drgrpo", "grpo", "remax"]
    assert {n: A.bicc_base(n).scale for n in A.bicc_base_names()} == \
        {"bicc": "std_p", "dapo": "std_u", "drgrpo": "one", "grpo": "std_u", "remax": "greedy"}
    with pytest.raises(ValueError, match="scale='sqrt' not in"):
        A.register_bicc_base("halved", scale="sqrt")
    try:
        A.register_bicc_base("halved", scale="one")(lambda x, hp: 0.5 * (x.rewards - 0.5))
        torch.testing.assert_close(adv("halved"), 0.5 * (R - 0.5))                  # BiCC's advantage is the base's
        g = torch.zeros(2, dtype=torch.long)                                          # RCC: the base's scale ("one"
        torch.testing.assert_close(rcc_advantage(t([1, 0]), t([0.4, 0.0]), g, base="halved"),  # = Dr.GRPO's)
                                   rcc_advantage(t([1, 0]), t([0.4, 0.0]), g, base="drgrpo"))
        assert A.BiCCRCCHParams(base="halved").base == "halved"
        assert "greedy_rewards" not in A.kind_required_inputs("bicc", A.BiCCHParams(base="halved"))
        with pytest.raises(ValueError, match="bicc base 'halved' is already registered"):
            A.register_bicc_base("halved", scale="one")(lambda x, hp: x.rewards)
    finally:
        Reg._BICC_BASES.pop("halved", None)
    with pytest.raises(ValueError, match=r"rcc base 'halved' invalid; valid: \['bicc', 'dapo', 'drgrpo', 'grpo', 'remax'\]"):
        A.BiCCRCCHParams(base="halved")


@pytest.mark.parametrize("base", ["grpo", "dapo", "drgrpo", "bicc", "remax"])
def test_rcc_composes_with_every_base(base):
    greedy = torch.zeros(8, dtype=torch.float64)
    delta = torch.zeros(8, dtype=torch.float64)       # δ constant -> Cov = 0 -> RCC baseline = base baseline
    hp = A.BiCCRCCHParams(base=base)
    x = A.AlgoInputs(rewards=R, group_ids=G, mask=M, greedy_rewards=greedy, delta=delta,
                     old_logp=torch.zeros(8, 3), ref_logp=torch.zeros(8, 3))
    a = A.compute_advantages("bicc_rcc", x, hp)
    assert torch.isfinite(a).all() and a.shape == (8,)


PROMPT = [100, 101, 102, 103]          # user turn ...; insert before the last two (end-of-turn, assistant)


RESP = [[11, 12], [21, 22, 23], [31], [41, 42]]


HEADER, SEP = [900], [901]


def test_TB6_context_assignment():
    out = build_bicc_contexts([PROMPT] * 4, RESP, [1, 0, 1, 0], [0] * 4, budget_tokens=100,
                              header_ids=HEADER, sep_ids=SEP, insert_at=[2] * 4)
    by = {s.index: s for s in out.samples}
    assert by[0].context == (1, 3) and by[2].context == (1, 3)
    assert by[1].context == (0, 2) and by[3].context == (0, 2)
    s0 = by[0]
    assert s0.input_ids == [100, 101, 900, 21, 22, 23, 901, 41, 42, 901, 102, 103, 11, 12]
    assert s0.loss_mask == [0] * 12 + [1, 1]
    for s in out.samples:  # the target is byte-identical and carries the only loss tokens
        assert s.input_ids[s.response_start:] == RESP[s.index]
        assert sum(s.loss_mask) == len(RESP[s.index])
    all_ok = build_bicc_contexts([PROMPT] * 4, RESP, [1, 1, 1, 1], [0] * 4, budget_tokens=100)
    assert all_ok.samples == [] and all_ok.plain == [0, 1, 2, 3] and all_ok.n_fallback == 0


def test_budget_truncates_last_trace_and_never_the_target():
    # budget 5: header(1) + trace 21,22,23 + sep = 5 → full; next trace does not fit → stop
    out = build_bicc_contexts([PROMPT] * 4, RESP, [1, 0, 1, 0], [0] * 4, budget_tokens=5, header_ids=HEADER,
                              sep_ids=SEP)
    s0 = next(s for s in out.samples if s.index == 0)
    assert s0.context == (1,) and s0.context_len == 5
    # budget 3: header + first 2 tokens of the first trace (right-truncated), then stop
    out = build_bicc_contexts([PROMPT] * 4, RESP, [1, 0, 1, 0], [0] * 4, budget_tokens=3, header_ids=HEADER,
                              sep_ids=SEP)
    s0 = next(s for s in out.samples if s.index == 0)
    assert s0.input_ids == PROMPT + [900, 21, 22] + [11, 12]


def test_budget_too_small_falls_back_and_is_counted(caplog):
    out = build_bicc_contexts([PROMPT] * 4, RESP, [1, 0, 1, 0], [0] * 4, budget_tokens=1, header_ids=HEADER)
    assert out.samples == [] and out.n_fallback == 4 and out.plain == [0, 1, 2, 3]
    assert "fell back" in caplog.text


def test_model_window_drops_traces_from_the_end():
    # full context would be 1 + (3+1) + (2+1) = 8; window 4 + 8 + 2 = 14 > 12 → drop trace 3
    out = build_bicc_contexts([PROMPT] * 4, RESP, [1, 0, 1, 0], [0] * 4, budget_tokens=100, header_ids=HEADER,
                              sep_ids=SEP, max_total_len=12)
    s0 = next(s for s in out.samples if s.index == 0)
    assert s0.context == (1,) and len(s0.input_ids) <= 12


def test_bicc_errors_and_old_logp_switch():
    with pytest.raises(ValueError, match="non-finite reward at sample 1"):
        build_bicc_contexts([PROMPT] * 2, RESP[:2], [1, float("nan")], [0, 0], budget_tokens=10)
    with pytest.raises(ValueError, match="lengths differ"):
        build_bicc_contexts([PROMPT] * 2, RESP, [1, 0], [0, 0], budget_tokens=10)
    plain, cond = torch.zeros(1, 2), torch.ones(1, 2, requires_grad=True)
    assert bicc_old_logp("plain", plain, cond) is not cond
    assert not bicc_old_logp("conditioned", plain, cond).requires_grad
    with pytest.raises(ValueError, match="valid"):
        bicc_old_logp("mixed", plain, cond)


def test_bicc_pair_is_plus_minus_one():
    # G = 2, one of each: n+ = n− = 1 → A = ±sqrt(1/1); the objective is ρ+ − ρ− (spec §1.2 with G = 2 …
    # (1/G)ΣAρ = (ρ+ − ρ−)/2 = sqrt(1·1)/2·(ρ+ − ρ−)).
    torch.testing.assert_close(bicc_advantage(t([0, 1]), torch.zeros(2, dtype=torch.long)), t([-1, 1]))


def test_rcc_two_samples_closed_form():
    # r = [1, 0], δ = [a, b]: r − r̄ = [½, −½], δ − δ̄ = [(a−b)/2, (b−a)/2] → Cov = (a−b)/4,
    # b_RCC = ½ + (a−b)/2. With a = 0.4, b = 0: Cov 0.1, baseline 0.7 → Dr.GRPO A = [0.3, −0.7];
    # std_p = ½ → A = [0.6, −1.4].
    g = torch.zeros(2, dtype=torch.long)
    torch.testing.assert_close(rcc_advantage(t([1, 0]), t([0.4, 0.0]), g, base="drgrpo"), t([0.3, -0.7]))
    torch.testing.assert_close(rcc_advantage(t([1, 0]), t([0.4, 0.0]), g, base="bicc"), t([0.6, -1.4]))
    # group sum is −2·G·Cov/s (spec property): −2·2·0.1/1 = −0.4
    assert math.isclose(float(rcc_advantage(t([1, 0]), t([0.4, 0.0]), g, base="drgrpo").sum()), -0.4)


T_B1 = [
    ([1, 0, 0, 0], [1.732051] + [-0.577350] * 3, [1.499997] + [-0.499999] * 3),
    ([1, 1, 0, 0], [1, 1, -1, -1], [0.866024] * 2 + [-0.866024] * 2),
    ([1, 1, 1, 0], [0.577350] * 3 + [-1.732051], [0.499999] * 3 + [-1.499997]),
    ([1, 1, 1, 1], [0] * 4, [0] * 4),
    ([1, 0, 0, 0, 0, 0, 0, 0], [2.645751] + [-0.377964] * 7, [2.474867] + [-0.353552] * 7),
]


@pytest.mark.parametrize("r,bicc,verl", T_B1, ids=["1of4", "2of4", "3of4", "4of4", "1of8"])
def test_TB1_bicc_vs_verl_grpo(r, bicc, verl):
    close(bicc_advantage(t(r), gid(len(r))), bicc)
    close(grpo_advantage(t(r), gid(len(r))), verl)
    close(grpo_advantage(t(r), gid(len(r)), scale="std_pop"), bicc)  # contrastive = population-std GRPO


def test_TB2_margin_identity():
    r = t([1, 1, 0, 0, 0, 0, 0, 0])
    rho = t([1.2, 1.0, 1.0, 0.9, 0.8, 1.0, 1.1, 0.8])
    a = bicc_advantage(r, gid(8))
    close((a * rho).mean(), 0.0721688)
    close((a * rho).mean(), (12 ** 0.5) / 8 * (1.1 - 0.9333333333333333))


T_B3 = [
    ([1, 0, 1, 0], [0.3, -0.1, 0.2, 0.0], [0.606217, -1.125831, 0.606217, -1.125831], [0.7, -1.3, 0.7, -1.3],
     [0.35, -0.65, 0.35, -0.65]),
    ([1, 0, 0, 0], [0.4, 0.1, 0.0, -0.1], [1.199998] + [-0.799998] * 3, [1.385641] + [-0.923760] * 3, None),
    ([1, 1, 1, 0, 0, 0, 0, 0], [0.30, 0.20, 0.25, 0.05, 0.00, -0.05, 0.10, 0.00],
     [0.999299] * 3 + [-0.932881] * 5, [1.068298] * 3 + [-0.997293] * 5, None),
]


@pytest.mark.parametrize("r,d,verl,pop,dr", T_B3, ids=["2of4", "1of4", "3of8"])
def test_TB3_rcc_given_delta(r, d, verl, pop, dr):
    close(rcc_advantage(t(r), t(d), gid(len(r)), base="grpo"), verl)
    close(rcc_advantage(t(r), t(d), gid(len(r)), base="bicc"), pop)
    if dr is not None:
        close(rcc_advantage(t(r), t(d), gid(len(r)), base="drgrpo"), dr)


def test_TB3_constant_delta_and_all_correct():
    r = t([1, 1, 0, 0])
    close(rcc_advantage(r, t([0.5] * 4), gid(4)), grpo_advantage(r, gid(4)))
    close(rcc_advantage(t([1, 1, 1, 1]), t([0.1, 0.2, 0.3, 0.4]), gid(4)), [0] * 4)


def _tb4():
    old = [[-0.1, -0.2, -0.05], [-0.5, -0.4], [-0.2, -0.1, -0.1, -0.3], [-0.6, -0.7]]
    ref = [[-0.2, -0.3, -0.1], [-0.5, -0.3], [-0.3, -0.1, -0.2, -0.3], [-0.5, -0.6]]
    T = 4
    o, f, m = torch.zeros(4, T, dtype=D), torch.zeros(4, T, dtype=D), torch.zeros(4, T, dtype=D)
    for i, (a, b) in enumerate(zip(old, ref)):
        o[i, :len(a)], f[i, :len(b)], m[i, :len(a)] = t(a), t(b), 1
    o[1, 2:] = 7.0  # garbage off-mask must not leak into δ
    return o, f, m


@pytest.mark.parametrize("mode,delta,adv", [
    ("sum", [0.25, -0.10, 0.20, -0.20], [0.541265, -1.190783, 0.541265, -1.190783]),
    ("mean", [0.083333, -0.05, 0.05, -0.10], [0.743337, -0.988711, 0.743337, -0.988711]),
])
def test_TB4_delta_from_token_logprobs(mode, delta, adv):
    o, f, m = _tb4()
    d = rcc_delta(o, f, m, mode)
    close(d, delta)
    close(rcc_advantage(t([1, 0, 1, 0]), d, gid(4)), adv)


def test_TB5_released_dpo_variant_sign_is_not_reproduced():
    """T-B5 documents the sign issue of the released ``format_grpo_as_contrastive``; we recompute
    its numbers here (test-only, from the spec's description) and check that our BiCC estimator
    gives correct samples positive advantages instead."""
    r = t([1, 0, 1, 0])
    s, s_ref = t([-50, -60, -55, -40]), t([-52, -58, -55, -45])
    delta = (s - torch.logsumexp(s, 0)) - (s_ref - torch.logsumexp(s_ref, 0))
    beta, adv, cnt = 0.1, torch.zeros(4, dtype=D), torch.zeros(4, dtype=D)
    for i in (0, 2):
        for j in (1, 3):
            g = torch.sigmoid(beta * (delta[i] - delta[j])) - 1
            adv[i] += beta * g
            adv[j] -= beta * g
            cnt[i] += 1
            cnt[j] += 1
    close(adv / cnt, [-0.048788, 0.042574, -0.053631, 0.059845])
    ours = bicc_advantage(r, gid(4))
    assert bool((ours[r > 0.5] > 0).all()) and bool((ours[r < 0.5] < 0).all())


def test_bicc_and_bicc_equals_population_grpo_on_binary():
    r, ids, _, _ = random_batch(2)
    a = bicc_advantage(r, ids)
    torch.testing.assert_close(a, bicc_loop(r, ids), atol=1e-12, rtol=0)
    torch.testing.assert_close(a, grpo_advantage(r, ids, scale="std_pop"), atol=1e-9, rtol=1e-9)


@pytest.mark.parametrize("binary", [True, False], ids=["binary", "graded"])
def test_rcc_matches_loop(binary):
    r, ids, delta, _ = random_batch(3, binary=binary)
    torch.testing.assert_close(rcc_advantage(r, delta, ids), rcc_loop(r, delta, ids), atol=1e-9, rtol=1e-9)
