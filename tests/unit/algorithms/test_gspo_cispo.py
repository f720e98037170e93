"""GSPO / GSPO-token (``algorithms/gspo.py``) and CISPO (``algorithms/cispo.py``) against their reference
implementations, re-derived here from the references' formulas (per row, ``math`` scalars, no shared code):

* verl ``compute_policy_loss_gspo`` / ``compute_policy_loss_cispo`` — ``verl/trainer/ppo/core_algos.py``,
  volcengine/verl @ 012be9d9dcb7c38499f23616142870d2682757fc (GSPO) and the verl 0.9.1 release (both):
  GSPO-token ratio sg(s_i)·π_t/sg(π_t), log clamped at 10, max(−A s, −A clip(s)); CISPO
  −sg(clip(e^clamp(Δ, ±20), 1 − ε_low, 1 + ε_high))·A·lp.
* slime ``compute_gspo_kl`` + ``compute_policy_loss`` and ``compute_cispo_loss`` — ``slime/utils/ppo_utils.py``,
  THUDM/slime @ 501dae9c59e7203c88a0cd912892b152af5436a8: GSPO's ratio exp(−mean_t(old − lp)) with the
  gradient through the mean, optional dual clip; CISPO as verl without the ±20 clamp.

Hand values (float64, 6 decimals) of :data:`CASE` (ε = 0.2, dual clip 3):

    row 0  Δ = [0.3, 0.0, −0.6]  A = +1  mean −0.1  s = e^−0.1 = 0.904837  inside [0.8, 1.2]: L = −0.904837
    row 1  Δ = [0.9]             A = −1  s = e^0.9 = 2.459603   L = max(2.459603, 1.2) = 2.459603 (< c = 3)
    row 2  Δ = [0.5, 0.5]        A = +1  s = e^0.5 = 1.648721   L = max(−1.648721, −1.2) = −1.2 (clipped: no gradient)
    row 3  all masked (padding; its Δ = 9.9 must not count)       L = 0
    seq-mean-token-mean over the 3 rows with tokens: (−0.904837 + 2.459603 − 1.2) / 3 = 0.118255
"""
from __future__ import annotations

import math

import pytest
import torch

from megatron_rl.algorithms import (
    ALGO_KINDS,
    AlgoInputs,
    CISPOHParams,
    GSPOHParams,
    aggregate,
    cispo_loss,
    compute_policy_loss,
    gspo_loss,
    ppo_clip_loss,
)

D = torch.float64
OLD = [[-1.0, -2.0, -0.5], [-0.7, -1.0, -1.0], [-1.5, -0.2, -1.0], [-1.0, -1.0, -1.0]]
DELTA = [[0.3, 0.0, -0.6], [0.9, 9.9, 9.9], [0.5, 0.5, 9.9], [9.9, 9.9, 9.9]]
MASK = [[1, 1, 1], [1, 0, 0], [1, 1, 0], [0, 0, 0]]
ADV = [1.0, -1.0, 1.0, 1.0]


def t(x):
    return torch.tensor(x, dtype=D)


def case():
    old = t(OLD)
    lp = (old + t(DELTA)).requires_grad_(True)
    return lp, old, t(ADV), t(MASK)


def grad(loss, x):
    return torch.autograd.grad(loss, x)[0]


# ------------------------------------------------------------------------------ reference formulas


def verl_gspo(lp, old, adv, mask, lo, hi):
    """verl's GSPO-token, row by row: s_i,t = exp(min(sg(mean_t Δ) + lp_t − sg(lp_t), 10)); seq-mean-token-mean."""
    total, rows = 0.0, 0
    for i in range(lp.shape[0]):
        m = mask[i] > 0
        if not m.any():
            continue
        mean = sum(float(lp[i, j] - old[i, j]) for j in range(lp.shape[1]) if m[j]) / int(m.sum())
        terms = []
        for j in torch.nonzero(m).flatten().tolist():
            log_r = torch.clamp(mean + lp[i, j] - lp[i, j].detach(), max=10.0)
            r = torch.exp(log_r)
            a = adv[i] if adv.dim() == 1 else adv[i, j]
            terms.append(torch.maximum(-a * r, -a * torch.clamp(r, 1 - lo, 1 + hi)))
        total = total + sum(terms) / len(terms)
        rows += 1
    return total / rows


def slime_gspo(lp, old, adv, mask, lo, hi, c=None):
    """slime: ppo_kl_i = Σ(old − lp)m / max(Σm, 1) (with gradient), ratio = e^(−ppo_kl_i) on every token,
    PPO clip and dual clip c; per-sample token mean, then the mean over samples."""
    total, rows = 0.0, 0
    for i in range(lp.shape[0]):
        m = mask[i] > 0
        if not m.any():
            continue
        idx = torch.nonzero(m).flatten()
        kl = (old[i, idx] - lp[i, idx]).sum() / max(int(m.sum()), 1)
        r = torch.exp(-kl)
        a = adv[i]
        l1 = torch.maximum(-r * a, -torch.clamp(r, 1 - lo, 1 + hi) * a)
        if c is not None and a < 0:
            l1 = torch.minimum(-c * a, l1)
        total = total + l1      # every token of the row carries the same loss: its token mean is l1
        rows += 1
    return total / rows


def cispo_ref(lp, old, adv, mask, lo, hi, clamp20=True):
    """verl (clamp20) / slime (no clamp): L_t = −sg(clip(r_t, 1 − lo, 1 + hi))·A·lp_t; token-mean."""
    terms = []
    for i, j in torch.nonzero(mask > 0).tolist():
        d = float(lp[i, j] - old[i, j])
        r = math.exp(max(-20.0, min(20.0, d)) if clamp20 else d)
        w = min(max(r, 1 - lo), 1 + hi)
        terms.append(-w * float(adv[i]) * lp[i, j])
    return sum(terms) / len(terms)


# ------------------------------------------------------------------------------ GSPO


def test_gspo_hand_values_and_the_clipped_row_has_no_gradient():
    lp, old, adv, mask = case()
    out = gspo_loss(lp, old, adv, mask, clip_low=0.2, clip_high=0.2, dual_clip=3.0)
    want = [[-0.904837] * 3, [2.459603, 0, 0], [-1.2, -1.2, 0], [0, 0, 0]]
    torch.testing.assert_close(out.loss_mat, t(want), atol=1e-6, rtol=0)
    loss = aggregate(out.loss_mat, mask, "seq-mean-token-mean")
    assert float(loss.detach()) == pytest.approx(0.118255, abs=1e-6)
    g = grad(loss, lp)
    # row 0: ∂/∂lp_t of −s/3 (token mean of 3 equal terms, 1/3 of the rows) = −s·(1/3)/3 on each token
    torch.testing.assert_close(g[0], t([-0.904837 / 9] * 3), atol=1e-6, rtol=0)
    assert float(g[1, 0]) == pytest.approx(2.459603 / 3, abs=1e-6)        # A = −1: ∂(s)/∂lp = s, /3 rows
    assert g[2].abs().max() == 0 and g[3].abs().max() == 0 and g[1, 1:].abs().max() == 0
    assert float(out.metrics["gspo_seq_clipfrac"]) == pytest.approx(2 / 3)   # rows 1 and 2 left [0.8, 1.2]
    assert float(out.metrics["pg_clipfrac"]) == pytest.approx(2 / 6)        # row 2's two tokens of the 6


@pytest.mark.parametrize("eps", [(0.2, 0.28), (3e-4, 4e-4), (0.0, 0.0)], ids=["dapo_eps", "paper_eps", "clip0"])
@pytest.mark.parametrize("dual", [None, 3.0], ids=["no_dual", "dual3"])
def test_gspo_sequence_form_is_slimes(eps, dual):
    lp, old, adv, mask = case()
    ours = aggregate(gspo_loss(lp, old, adv, mask, clip_low=eps[0], clip_high=eps[1], dual_clip=dual).loss_mat,
                     mask, "seq-mean-token-mean")
    ref = slime_gspo(lp, old, adv, mask, *eps, c=dual)
    torch.testing.assert_close(ours, ref, atol=1e-12, rtol=0)
    torch.testing.assert_close(grad(ours, lp), grad(ref, lp), atol=1e-12, rtol=0)


@pytest.mark.parametrize("eps", [(0.2, 0.28), (3e-4, 4e-4), (0.0, 0.0)], ids=["dapo_eps", "paper_eps", "clip0"])
@pytest.mark.parametrize("per_token", [False, True], ids=["seq_adv", "token_adv"])
def test_gspo_token_form_is_verls(eps, per_token):
    lp, old, adv, mask = case()
    if per_token:   # a per-token advantage: what GSPO-token is for
        adv = adv[:, None] * t([[1.0, 0.5, -2.0]] * 4)
    ours = aggregate(gspo_loss(lp, old, adv, mask, clip_low=eps[0], clip_high=eps[1], level="token").loss_mat,
                     mask, "seq-mean-token-mean")
    ref = verl_gspo(lp, old, adv, mask, *eps)
    torch.testing.assert_close(ours, ref, atol=1e-12, rtol=0)
    torch.testing.assert_close(grad(ours, lp), grad(ref, lp), atol=1e-12, rtol=0)


def test_gspo_and_gspo_token_agree_with_sequence_advantages():
    """Paper §4.3: with A_i,t = A_i the two objectives have the same value and gradient; with per-token
    advantages they differ (the token form weighs each token's gradient by its own A)."""
    lp, old, adv, mask = case()
    seq, tok = (aggregate(gspo_loss(lp, old, adv, mask, clip_low=0.2, clip_high=0.2, level=lv).loss_mat, mask,
                          "seq-mean-token-mean") for lv in ("sequence", "token"))
    torch.testing.assert_close(seq, tok, atol=1e-12, rtol=0)
    torch.testing.assert_close(grad(seq, lp), grad(tok, lp), atol=1e-12, rtol=0)
    a2 = adv[:, None] * t([[1.0, 0.5, -2.0]] * 4)
    g_seq, g_tok = (grad(aggregate(gspo_loss(lp, old, a2, mask, clip_low=0.2, clip_high=0.2, level=lv).loss_mat,
                                   mask, "seq-mean-token-mean"), lp) for lv in ("sequence", "token"))
    # a max of |differences| (nothing cancels) on fixed float64 inputs (0.184 here, host-independent to ~1e-16):
    # 1e-3 sits nine orders above the 1e-12 to which the two forms agree with per-sequence advantages
    assert (g_seq - g_tok).abs().max() > 1e-3


@pytest.mark.parametrize("level", ["sequence", "token"])
def test_gspo_one_token_rows_are_ppo_clip(level):
    """A one-token response: s_i is the token's ratio, so GSPO is PPO's clip (value and gradient)."""
    old = t([[-1.0], [-0.3], [-2.0], [-0.1]])
    lp = (old + t([[0.4], [-0.5], [0.05], [-0.02]])).requires_grad_(True)
    adv, mask = t([1.0, -1.0, -0.5, 2.0]), torch.ones(4, 1, dtype=D)
    ours = gspo_loss(lp, old, adv, mask, clip_low=0.2, clip_high=0.28, level=level).loss_mat
    ppo = ppo_clip_loss(lp, old, adv, mask, clip_low=0.2, clip_high=0.28, dual_clip=None).loss_mat
    torch.testing.assert_close(ours, ppo, atol=1e-12, rtol=0)
    torch.testing.assert_close(grad(ours.sum(), lp), grad(ppo.sum(), lp), atol=1e-12, rtol=0)


@pytest.mark.parametrize("fn", ["gspo", "gspo_token", "cispo"])
def test_padding_counts_nowhere(fn):
    """Padded positions (any value) and an all-masked row change neither the loss nor the gradient of the
    other rows; the padded row's loss and gradient are exactly 0."""
    def run(pad_value):
        lp, old, adv, mask = case()
        lp = torch.where(mask > 0, lp, torch.full_like(lp, pad_value)).detach().requires_grad_(True)
        if fn == "cispo":
            out = cispo_loss(lp, old, adv, mask, clip_low=0.2, clip_high=0.2)
        else:
            out = gspo_loss(lp, old, adv, mask, clip_low=0.2, clip_high=0.2, level="token" if fn == "gspo_token" else "sequence")
        loss = aggregate(out.loss_mat, mask, "seq-mean-token-mean")
        return out.loss_mat.detach(), loss.detach(), grad(loss, lp)
    a, b = run(0.0), run(-37.0)
    for x, y in zip(a, b):
        assert torch.equal(x, y)
    assert a[0][3].abs().max() == 0 and a[2][3].abs().max() == 0
    assert a[2][torch.tensor(MASK) == 0].abs().max() == 0


@pytest.mark.parametrize("fn", ["gspo", "gspo_token", "cispo"])
def test_all_zero_advantages_give_zero_loss_and_gradient(fn):
    lp, old, _, mask = case()
    adv = torch.zeros(4, dtype=D)
    out = cispo_loss(lp, old, adv, mask) if fn == "cispo" else gspo_loss(lp, old, adv, mask, level="token" if fn == "gspo_token" else "sequence")
    loss = aggregate(out.loss_mat, mask, "token-mean")
    assert float(loss.detach()) == 0.0 and grad(loss, lp).abs().max() == 0


def test_gspo_clip_zero_keeps_only_the_side_that_lowers_the_loss():
    """ε = 0: L = max(−A s, −A); the gradient flows only where −A s > −A (A > 0 with s < 1, A < 0 with s > 1)."""
    lp, old, adv, mask = case()
    out = gspo_loss(lp, old, adv, mask, clip_low=0.0, clip_high=0.0)
    # row 0: A=+1, s=0.904837<1 -> −s; row 1: A=−1, s=2.459603>1 -> s; row 2: A=+1, s=1.648721>1 -> −1
    torch.testing.assert_close(out.loss_mat, t([[-0.904837] * 3, [2.459603, 0, 0], [-1.0, -1.0, 0], [0] * 3]), atol=1e-6, rtol=0)
    g = grad(aggregate(out.loss_mat, mask, "seq-mean-token-mean"), lp)
    assert (g[0].abs() > 0).all() and g[1, 0] != 0 and g[2].abs().max() == 0


# ------------------------------------------------------------------------------ CISPO


def test_cispo_hand_values():
    """lp = −1 everywhere. Δ = [0.5, −3, 0] → r = [1.648721, 0.049787, 1]; ε_high 0.2, no lower bound
    (ε_low 10): r̂ = [1.2, 0.049787, 1]; A = 2: L = −r̂·A·lp = [2.4, 0.099574, 2]; ∂L/∂lp = −r̂·A."""
    lp = torch.full((1, 3), -1.0, dtype=D, requires_grad=True)
    old = lp.detach() - t([[0.5, -3.0, 0.0]])
    out = cispo_loss(lp, old, t([2.0]), torch.ones(1, 3, dtype=D), clip_low=10.0, clip_high=0.2)
    torch.testing.assert_close(out.loss_mat, t([[2.4, 0.099574, 2.0]]), atol=1e-6, rtol=0)
    torch.testing.assert_close(grad(out.loss_mat.sum(), lp), t([[-2.4, -0.099574, -2.0]]), atol=1e-6, rtol=0)
    assert float(out.metrics["pg_clipfrac"]) == pytest.approx(1 / 3)
    lower = cispo_loss(lp, old, t([2.0]), torch.ones(1, 3, dtype=D), clip_low=0.2, clip_high=0.2)   # r̂ ≥ 0.8
    torch.testing.assert_close(lower.loss_mat, t([[2.4, 1.6, 2.0]]), atol=1e-6, rtol=0)


@pytest.mark.parametrize("eps", [(10.0, 0.2), (0.2, 0.28), (0.0, 0.0), (1.0, 4.0)], ids=["verl_example", "ppo_eps", "clip0", "wide"])
@pytest.mark.parametrize("ref", ["verl", "slime"])
def test_cispo_is_the_references(eps, ref):
    lp, old, adv, mask = case()
    lp = torch.where(mask > 0, lp, torch.zeros_like(lp)).detach().requires_grad_(True)   # |Δ| < 20: both agree
    ours = aggregate(cispo_loss(lp, old, adv, mask, clip_low=eps[0], clip_high=eps[1]).loss_mat, mask, "token-mean")
    want = cispo_ref(lp, old, adv, mask, *eps, clamp20=ref == "verl")
    torch.testing.assert_close(ours, want, atol=1e-12, rtol=0)
    torch.testing.assert_close(grad(ours, lp), grad(want, lp), atol=1e-12, rtol=0)


def test_cispo_clip_zero_is_reinforce():
    """ε_low = ε_high = 0: r̂ = 1, L = −A·lp, token-mean gradient −A·m/N on every token (N = 6)."""
    lp, old, adv, mask = case()
    g = grad(aggregate(cispo_loss(lp, old, adv, mask, clip_low=0.0, clip_high=0.0).loss_mat, mask, "token-mean"), lp)
    torch.testing.assert_close(g, -adv[:, None] * t(MASK) / 6, atol=1e-15, rtol=0)


def test_cispo_one_token_rows_keep_their_gradient_where_ppo_drops_it():
    """A one-token row whose ratio left the trust region: PPO's clip zeroes its gradient, CISPO keeps −r̂·A."""
    old, lp = t([[-1.0]]), t([[-0.5]]).requires_grad_(True)       # r = e^0.5 = 1.648721 > 1.2
    adv, m = t([1.0]), torch.ones(1, 1, dtype=D)
    assert grad(ppo_clip_loss(lp, old, adv, m, dual_clip=None).loss_mat.sum(), lp).abs().max() == 0
    assert float(grad(cispo_loss(lp, old, adv, m, clip_high=0.2).loss_mat.sum(), lp)) == pytest.approx(-1.2)


# ------------------------------------------------------------------------------ kinds and hparams


def test_kinds_and_paper_defaults():
    g, c = ALGO_KINDS["gspo"], ALGO_KINDS["cispo"]
    assert (g.advantage, g.loss, g.hparams, g.path) == ("grpo", "gspo", GSPOHParams, "plain")
    assert (c.advantage, c.loss, c.hparams, c.path) == ("grpo", "cispo", CISPOHParams, "plain")
    hp = GSPOHParams()   # arXiv 2507.18071 §5.1 (verl recipe/gspo): 3e-4 / 4e-4, sequence mean, no KL
    assert (hp.clip_low, hp.clip_high, hp.loss_agg_mode, hp.kl_loss_coef, hp.dual_clip, hp.level) == \
        (3e-4, 4e-4, "seq-mean-token-mean", 0.0, None, "sequence")
    hp = CISPOHParams()  # arXiv 2506.13585: no lower bound, token-mean, no KL
    assert (hp.clip_low, hp.clip_high, hp.loss_agg_mode, hp.kl_loss_coef, hp.dual_clip) == (10.0, 0.2, "token-mean", 0.0, None)


def test_hparams_reject_bad_values():
    with pytest.raises(ValueError, match="gspo level 'tokens'"):
        GSPOHParams(level="tokens")
    with pytest.raises(ValueError, match=r"clip_low=1.5 must be in \[0, 1\)"):
        GSPOHParams(clip_low=1.5)
    with pytest.raises(ValueError, match="cispo has no dual clip"):
        CISPOHParams(dual_clip=3.0)
    with pytest.raises(ValueError, match="cispo clip ranges must be >= 0"):
        CISPOHParams(clip_high=-0.1)
    assert CISPOHParams(clip_low=1.0).clip_low == 1.0   # ε_low ≥ 1 is CISPO's "no lower bound"


@pytest.mark.parametrize("kind", ["gspo", "cispo"])
def test_kind_objective_through_the_registry(kind):
    """compute_policy_loss(kind) = the pure function aggregated with the kind's mode (plus nothing: no KL)."""
    lp, old, adv, mask = case()
    x = AlgoInputs(rewards=t([1.0, 0.0, 1.0, 0.0]), group_ids=torch.tensor([0, 0, 1, 1]), mask=mask, logp=lp, old_logp=old)
    hp = ALGO_KINDS[kind].hparams()
    obj = compute_policy_loss(kind, x, adv, hp)
    fn = gspo_loss if kind == "gspo" else cispo_loss
    want = aggregate(fn(lp, old, adv, mask, clip_low=hp.clip_low, clip_high=hp.clip_high).loss_mat, mask, hp.loss_agg_mode)
    torch.testing.assert_close(obj.loss, want, atol=1e-15, rtol=0)
    assert float(obj.kl_loss) == 0.0 and "pg_clipfrac" in obj.metrics and "ppo_kl" in obj.metrics


def test_gradcheck_cispo_with_frozen_weight():
    """CISPO's weight sg(r̂) moves with lp but carries no gradient (so a finite difference of the loss is
    not its gradient: ``test_every_kind`` leaves it out): gradcheck −r̂·A·lp with r̂ frozen, and the
    registered kind's gradient is exactly that one, through the whole kind pipeline (GRPO advantages)."""
    from megatron_rl.algorithms import compute_advantages
    from tests.helpers.algo_builders import random_inputs

    base = random_inputs(seed=3)
    hp = CISPOHParams(clip_low=0.1, clip_high=0.1)       # both bounds act on this batch
    adv = compute_advantages("cispo", base, hp)
    w = torch.clamp(torch.exp(base.logp - base.old_logp), 0.9, 1.1)
    assert bool((w == 0.9).any() and (w == 1.1).any())

    def frozen(v):
        return aggregate(-w * adv[:, None] * v * base.tis_weights, base.mask, "token-mean")
    var = base.logp.clone().requires_grad_(True)
    assert torch.autograd.gradcheck(frozen, (var,), eps=1e-6, atol=1e-5)
    g = grad(compute_policy_loss("cispo", base.replace(logp=var), adv, hp).loss, var)
    torch.testing.assert_close(g, grad(frozen(var), var), atol=1e-15, rtol=0)
    assert float(g.abs().sum()) > 0
