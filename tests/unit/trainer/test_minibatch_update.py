"""The update pipeline's mini-batch x epoch loop (``trainer/update.optimizer_steps``) against a PPO
update computed BY HAND, mini-batch by mini-batch.

Policy: a context-free softmax over V = 3 tokens, π(y) = softmax(θ)_y at every position, trained
by :class:`SoftmaxActor` — a stand-in for ``PolicyActor`` that calls the real
:class:`~megatron_rl.trainer.pipeline.objective.Objective` per micro-batch exactly as ``PolicyActor.train_step``
/ ``_train_loss`` / ``_reduce_step`` do (L = Σ loss_sum / Σ normaliser over micro-batches, metrics
Σ num / Σ den) and then takes ONE plain SGD step θ ← θ − lr·∇L (no Adam, no grad clip), in float64.

Batch: 2 prompts x n = 2 rows, ``mini_batch_prompts=1`` -> 2 mini-batches of 2 rows, cut in order.
``old_logp`` = the initial policy's log-probs, so mini-batch 1 is on-policy (ρ ≡ 1) and mini-batch
2 sees the policy moved by mini-batch 1's step (lr = 4): token 0 gains (ρ ≈ 4.7 > c = 3), tokens 1
and 2 lose (ρ < 1 − ε).

The expected numbers come from ``_hand_*`` below: plain-Python float formulas written from the specs
(verl ``vanilla`` — /work/shared/specs/bicc_rcc_papo_and_verl_baselines.md "Policy loss vanilla",
token-mean over the mini-batch's valid tokens; RLCSD — /work/shared/specs/rlcsd_family_and_score.md
§1.5.2-1.5.3, both counts over the mini-batch) with the gradient written out analytically:
d log π(y)/dθ = e_y − π, and a clipped / dual-clipped token has zero gradient. They are ALSO written
below as literals (printed once by ``python tests/unit/trainer/test_minibatch_update.py``), so a
change on either side is caught.
"""
from __future__ import annotations

import math
import types

import pytest
import torch

from megatron_rl.config import load_config
from megatron_rl.trainer.policy.actor import TrainStepResult
from megatron_rl.trainer.pipeline.objective import SupportObjective
from megatron_rl.trainer.paths import DataPath
from megatron_rl.trainer.contract import SampleDump, UpdateContext
from megatron_rl.trainer.pipeline.update import Rows, mean_metrics, mini_batches, optimizer_steps
from megatron_rl.trainer.pipeline.sequences import build_seq_batch

V = 3
THETA0 = (-1.0, 0.0, 0.5)
LR = 4.0
EPOCHS_LR = 1.0                                       # the 2-epoch case: every step has a gradient
PAD = 0
PROMPTS = [[1, 2], [1, 2], [2, 1, 1], [2, 1, 1]]       # rows 0, 1: prompt 0; rows 2, 3: prompt 1
RESPONSES = [[0, 0], [1, 2, 1], [0, 1], [2, 1, 0]]
R = 3                                                  # response frame width
SEQ_LEN = 6
ADV_PPO = (1.0, -0.5, -1.0, 0.8)
ADV_RLCSD = (1.0, -0.3, -1.0, 0.8)
EPS_LOW, EPS_HIGH, DUAL_C = 0.2, 0.28, 3.0             # grpo with clip-higher 0.28, dual clip 3 (verl default c)
RLCSD_EPS, ETA = 0.2, 0.5
# RLCSD contrastive signal e per response token (spec §1.5.2): 0 / 2e-4 -> |r| <= δ (plain path);
# ±0.01 -> r = ±0.5·tanh(0.5); ±0.5 and ±1 -> r = ±0.5 (selected path). Row 1's first token: Ã = −0.3 + 0.5
# > 0 -> Â = 0 (sign-preserving clamp). Mini-batch 1: N_non = 2, N_sel = 3; mini-batch 2: N_non = 1, N_sel = 4.
E_TARGET = [[1.0, 0.0], [1.0, 0.01, 2e-4], [-1.0, 0.0], [0.5, -0.01, 1.0]]
NEG = [[[-0.5, -2.0], [-1.5, -0.7]],                   # row: per valid negative slot, its log-probs on the tokens
       [[-1.2, -0.3, -2.5]],
       [[-0.9, -1.1], [-0.4, -3.0]],
       [[-2.2, -0.6, -1.0]]]
K = 2


# ------------------------------------------------------------------ the hand computation (pure Python)

def _log_softmax(theta) -> list[float]:
    m = max(theta)
    lse = m + math.log(sum(math.exp(t - m) for t in theta))
    return [t - lse for t in theta]


def _sgd(theta, grad_terms, lr):
    """θ − lr·Σ_t coef_t·(e_{y_t} − π) for terms (coef, y)."""
    p = [math.exp(v) for v in _log_softmax(theta)]
    g = [0.0] * V
    for coef, y in grad_terms:
        for j in range(V):
            g[j] += coef * ((1.0 if j == y else 0.0) - p[j])
    return [t - lr * gj for t, gj in zip(theta, g)], math.sqrt(sum(x * x for x in g))


def _entropy(theta) -> float:
    lp = _log_softmax(theta)
    return -sum(math.exp(v) * v for v in lp)


def _hand_vanilla_step(theta, rows, adv, lr=LR):
    """One token-mean verl-vanilla step on ``rows``; old = π_θ0. Returns (metrics, θ')."""
    lp, old = _log_softmax(theta), _log_softmax(THETA0)
    toks = [(y, adv[i]) for i in rows for y in RESPONSES[i]]
    n = len(toks)
    loss = clip = lower = kl = akl = 0.0
    terms = []
    for y, a in toks:
        d = max(-20.0, min(20.0, lp[y] - old[y]))
        r = math.exp(d)
        l1, l2 = -a * r, -a * min(max(r, 1 - EPS_LOW), 1 + EPS_HIGH)
        lc = max(l1, l2)
        clipped = l2 > l1                      # the clip term is the active (larger) one
        dual = a < 0 and lc > -a * DUAL_C      # dual clip: the constant −A·c is the active one
        loss += (-a * DUAL_C if dual else lc) / n
        clip += clipped / n
        lower += dual / n
        kl += -d / n
        akl += (math.expm1(d) - d) / n         # k3 = ρ − 1 − log ρ >= 0 (approx_kl)
        if not (clipped or dual):
            terms.append((-a * r / n, y))      # d(−Aρ)/d log π = −Aρ
    new, gnorm = _sgd(theta, terms, lr)
    return {"actor/loss": loss, "actor/pg_clipfrac": clip, "actor/pg_clipfrac_lower": lower, "actor/ppo_kl": kl,
            "actor/approx_kl": akl, "actor/entropy": _entropy(theta), "actor/grad_norm": gnorm, "actor/normaliser": float(n)}, new


def _neg_mix(i: int, t: int) -> float:
    """log of the uniform mixture of row i's valid negatives at response token t."""
    vals = [slot[t] for slot in NEG[i]]
    return math.log(sum(math.exp(v) for v in vals) / len(vals))


def _hand_signal(i: int, t: int) -> tuple[float, bool]:
    """(r, gate) of row i's response token t: e = ℓc − mix, r = clip(βλ·tanh(e/τ), ±2), g = |r| > δ."""
    e = _teacher_logp(i, t) - _neg_mix(i, t)
    r = max(-2.0, min(2.0, 1.0 * 0.5 * math.tanh(e / 0.02)))
    return r, abs(r) > 0.02


def _teacher_logp(i: int, t: int) -> float:
    return _neg_mix(i, t) + E_TARGET[i][t]


def _hand_counts(rows) -> tuple[int, int]:
    """(N_non, N_sel) over ``rows``' response tokens."""
    gates = [_hand_signal(i, t)[1] for i in rows for t in range(len(RESPONSES[i]))]
    return len(gates) - sum(gates), sum(gates)


def _hand_rlcsd_step(theta, rows, adv, counts=None, lr=LR):
    """One RLCSD two-path step: Σ_non ℓ(A)/N_non + η Σ_sel ℓ(Â)/N_sel, ℓ(a) = −min(ρa, clip(ρ, 1±ε)a);
    ``counts`` = (N_non, N_sel), default: those of ``rows``. Returns (metrics, θ', clip flags)."""
    lp, old = _log_softmax(theta), _log_softmax(THETA0)
    n_non, n_sel = counts or _hand_counts(rows)
    loss = abs_res = 0.0
    n_tok = sum(len(RESPONSES[i]) for i in rows)
    terms, clipped_on = [], {"non": 0, "sel": 0}
    for i in rows:
        a = adv[i]
        for t, y in enumerate(RESPONSES[i]):
            r, gate = _hand_signal(i, t)
            abs_res += abs(r) / n_tok
            if gate:
                tilde = a + r
                a_path = max(tilde, 0.0) if a > 0 else (min(tilde, 0.0) if a < 0 else 0.0)
                w, path = ETA / max(n_sel, 1), "sel"
            else:
                a_path, w, path = a, 1.0 / max(n_non, 1), "non"
            rho = math.exp(lp[y] - old[y])
            unclipped, clipped = rho * a_path, min(max(rho, 1 - RLCSD_EPS), 1 + RLCSD_EPS) * a_path
            loss += -min(unclipped, clipped) * w
            if clipped < unclipped:
                clipped_on[path] += 1
            else:
                terms.append((-a_path * rho * w, y))
    new, gnorm = _sgd(theta, terms, lr)
    return ({"actor/loss": loss, "rlcsd/sel_frac": n_sel / n_tok, "rlcsd/abs_residual": abs_res,
             "actor/entropy": _entropy(theta), "actor/grad_norm": gnorm}, new, clipped_on)


def _hand_ppo(schedule, lr=LR):
    """Hand steps over ``schedule`` (a list of mini-batch row lists, in order): metrics and θ after each."""
    theta, out = list(THETA0), []
    for rows in schedule:
        m, theta = _hand_vanilla_step(theta, rows, ADV_PPO, lr)
        out.append((m, theta))
    return out


def _hand_rlcsd(schedule, counts=None):
    theta, out = list(THETA0), []
    for rows in schedule:
        m, theta, flags = _hand_rlcsd_step(theta, rows, ADV_RLCSD, counts)
        out.append((m, theta, flags))
    return out


# ------------------------------------------------------------------ the literals (printed by __main__)

PPO_EXPECTED = [   # per mini-batch: loss, pg_clipfrac, pg_clipfrac_lower, ppo_kl, θ after its step
    (-0.1, 0.0, 0.0, 0.0, [0.551219339076, -0.93259958417, -0.118619754906]),
    (0.406067153185, 0.4, 0.2, -0.123577494043, [0.208101433546, -0.758586525893, 0.0504850923465]),
]
RLCSD_EXPECTED = [  # per mini-batch: loss, rlcsd/sel_frac, rlcsd/abs_residual, θ after its step
    (-0.588509763105, 0.6, 0.247211682394, [1.71292104796, -1.38036149867, -0.832559549281]),
    (1.94372598724, 0.8, 0.346211715726, [1.00542631149, -1.12962125582, -0.375805055675]),
]
EPOCHS_THETA = [   # θ after each optimizer step (epoch 0 mb 0, mb 1, epoch 1 mb 0, mb 1), lr = 1
    [-0.612195165231, -0.233149896042, 0.345345061273],
    [-0.89486023285, -0.207975618016, 0.602835850866],
    [-0.477815458727, -0.413849200824, 0.391664659552],
    [-0.824661256793, -0.275294642433, 0.599955899226],
]


# ------------------------------------------------------------------ the pipeline side

class SoftmaxActor:
    """``PolicyActor``'s training contract on a context-free softmax policy θ ∈ R^V (float64).

    ``train_step`` cuts ``batch`` into ``micro_batch_size`` rows (dp = 1), calls ``loss_fn(logp,
    entropy, mb)`` per micro-batch with ``logp = log softmax(θ)[mb.targets]`` ``[n, S-1]``, backprops
    each ``loss_sum``, divides the summed gradient by Σ normaliser (none when every normaliser is
    None), and steps θ ← θ − lr·grad. Records each call: lr_increment, the batch, its micro-batch count,
    its response-frame log-probs before the step, θ after."""

    def __init__(self, theta0=THETA0, lr: float = LR):
        self.theta = torch.nn.Parameter(torch.tensor(theta0, dtype=torch.float64))
        self.lr = lr
        self.calls: list[dict] = []

    def _logprobs(self, mb):
        lsm = torch.log_softmax(self.theta, -1)
        logp = lsm[mb.targets]
        return logp, (-(lsm.exp() * lsm).sum()).expand_as(logp)

    def train_step(self, batch, loss_fn, micro_batch_size, temperature=None, lr_increment=1) -> TrainStepResult:
        assert not (isinstance(loss_fn, SupportObjective) and loss_fn.support_key is not None)
        with torch.no_grad():
            lsm = torch.log_softmax(self.theta, -1)
            resp_logp = lsm[batch.targets].gather(1, batch.extras["resp_pos"]) * batch.extras["resp_mask"]
        self.theta.grad = None
        norm, loss_sum, none_norm, mets, n_mb = 0.0, 0.0, None, {}, 0
        for mb in batch.micro_batches(micro_batch_size):
            logp, ent = self._logprobs(mb)
            s, d, m = loss_fn(logp, ent, mb)
            none_norm = (d is None) if none_norm is None else none_norm
            assert (d is None) == none_norm, "normaliser None for some micro-batches only"
            if d is not None:
                norm += float(d)
            loss_sum += float(s.detach())
            if s.requires_grad:
                s.backward()
            for k, v in m.items():
                num, den = v if isinstance(v, tuple) else (torch.as_tensor(v).float().mean(), 1.0)
                acc = mets.setdefault(k, [0.0, 0.0])
                acc[0] += float(num)
                acc[1] += float(den)
            n_mb += 1
        grad = self.theta.grad if self.theta.grad is not None else torch.zeros_like(self.theta)
        if norm > 0:
            grad = grad / norm
        with torch.no_grad():
            self.theta -= self.lr * grad
        self.calls.append({"lr_increment": lr_increment, "batch": batch, "micro_batches": n_mb, "resp_logp": resp_logp,
                           "theta": self.theta.detach().tolist()})
        return TrainStepResult(loss=loss_sum / norm if norm > 0 else loss_sum, grad_norm=float(grad.norm()),
                               lr=self.lr, update_successful=True, normaliser=norm,
                               metrics={k: n / d if d else float("nan") for k, (n, d) in mets.items()}, timings={})


class CountingPath(DataPath):
    """A data path with no teacher that counts ``after_optimizer_step`` calls."""

    name = "test_counting"

    def __init__(self, cfg):
        super().__init__(cfg, tok=None)
        self.steps_after = 0

    def collect(self, ctx, step):
        raise AssertionError("not used by optimizer_steps")

    def after_optimizer_step(self) -> None:
        self.steps_after += 1


def _cfg(kind: str, *extra: str):
    return load_config(None, [f"algo.kind={kind}", "rollout.n=2", "data.prompts_per_step=2",
                              "trainer.mini_batch_prompts=1", "trainer.micro_batch_size=1", *extra])


def _run(cfg, lr: float = LR):
    """What ``optimizer_steps`` reads of a Run: cfg, info (dp, driver), path, actor, micro (the padded rows)."""
    info, micro, actor = types.SimpleNamespace(dp=1, tp=1, is_driver=True), cfg.trainer.rows_per_micro_batch, SoftmaxActor(lr=lr)
    ctx = UpdateContext(actor, info, micro, SampleDump(0, True, None, ""), cfg, None)   # what the path's hooks are handed
    return types.SimpleNamespace(cfg=cfg, info=info, micro=micro, path=CountingPath(cfg), actor=actor,
                                 update_context=lambda: ctx)


def _old_logp() -> torch.Tensor:
    """The initial policy's log-probs of every response token, response frame [N, R] (0 off the mask)."""
    lsm = torch.log_softmax(torch.tensor(THETA0, dtype=torch.float64), -1)
    out = torch.zeros(len(RESPONSES), R, dtype=torch.float64)
    for i, resp in enumerate(RESPONSES):
        out[i, :len(resp)] = lsm[torch.tensor(resp)]
    return out


def _rows(adv, teacher: bool = False) -> Rows:
    """The 4 rows as ``base_rows`` lays them out (+ RLCSD's teacher tensors supplied directly)."""
    seqs = build_seq_batch(PROMPTS, RESPONSES, PAD, SEQ_LEN, R)
    ex = {"rewards": torch.tensor([1.0, 0.0, 0.0, 1.0]), "group_ids": torch.tensor([0, 0, 1, 1]),
          "advantages": torch.tensor(adv, dtype=torch.float64), "old_logp": _old_logp(),
          "resp_pos": seqs.resp_pos, "resp_mask": seqs.resp_mask}
    if teacher:
        tl = torch.zeros(4, R, dtype=torch.float64)
        neg = torch.zeros(4, K, R, dtype=torch.float64)
        neg[1, 1] = neg[3, 1] = 5.0                # an invalid slot: would dominate the mixture if read
        nmask = torch.zeros(4, K, dtype=torch.bool)
        for i, resp in enumerate(RESPONSES):
            for t in range(len(resp)):
                tl[i, t] = _teacher_logp(i, t)
            for k, slot in enumerate(NEG[i]):
                neg[i, k, :len(slot)] = torch.tensor(slot, dtype=torch.float64)
                nmask[i, k] = True
        ex.update(teacher_logp=tl, teacher_neg_logp=neg, teacher_neg_mask=nmask)
    return Rows(seqs, ex)


def _close(got: dict, want: dict, tol: float = 1e-6):
    for k, v in want.items():
        assert got[k] == pytest.approx(v, abs=tol), (k, got[k], v)


# ------------------------------------------------------------------ tests

def test_mini_batches_in_order():
    assert mini_batches(4, 2) == [[0, 1], [2, 3]]
    assert mini_batches(5, 2) == [[0, 1], [2, 3], [4]]           # last chunk shorter
    assert mini_batches(4, 0) == [[0, 1, 2, 3]]                  # 0 = one chunk
    assert mini_batches(3, 8) == [[0, 1, 2]]
    assert mini_batches(0, 2) == [] and mini_batches(0, 0) == []


def test_mean_metrics():
    """Means over the steps that carry a key; time/ and teacher token counts summed; teacher/syncs the
    last; the per-step keys (epoch, mini_batch, rows) dropped; actor/optimizer_steps added."""
    per = [{"actor/loss": 1.0, "actor/pg_clipfrac": 0.0, "time/step": 0.5, "teacher/tokens": 10.0,
            "teacher/syncs": 1.0, "epoch": 0, "mini_batch": 0, "rows": 2, "actor/once": 4.0},
           {"actor/loss": 3.0, "actor/pg_clipfrac": 0.5, "time/step": 0.25, "teacher/tokens": 6.0,
            "teacher/syncs": 2.0, "epoch": 0, "mini_batch": 1, "rows": 2}]
    summed, last = ("teacher/sequences", "teacher/rows", "teacher/tokens"), ("teacher/syncs",)  # the teacher path's
    assert mean_metrics(per, summed, last) == {"actor/loss": 2.0, "actor/pg_clipfrac": 0.25, "time/step": 0.75,
                                 "teacher/tokens": 16.0, "teacher/syncs": 2.0, "actor/once": 4.0,
                                 "actor/optimizer_steps": 2.0}


def test_ppo_dual_clip_two_mini_batches_by_hand():
    """grpo's ppo_clip (verl vanilla, ε 0.2/0.28, c = 3), token-mean, 2 mini-batches x 2 micro-batches."""
    cfg = _cfg("grpo", "algo.grpo.kl_loss_coef=0", f"algo.grpo.clip_high={EPS_HIGH}", f"algo.grpo.dual_clip={DUAL_C}")
    hp = cfg.algo.hparams
    assert (hp.clip_low, hp.clip_high, hp.dual_clip, hp.loss_agg_mode) == (EPS_LOW, EPS_HIGH, DUAL_C, "token-mean")
    run, rows = _run(cfg), _rows(ADV_PPO)
    per = optimizer_steps(run, rows, hp, step=1)
    calls = run.actor.calls

    assert [(m["epoch"], m["mini_batch"], m["rows"]) for m in per] == [(0, 0, 2), (0, 1, 2)]
    assert [c["lr_increment"] for c in calls] == [1, 0] and run.path.steps_after == 2
    for k, c in enumerate(calls):      # mini-batch k = rows 2k, 2k+1 in order, 2 micro-batches of 1 row
        assert torch.equal(c["batch"].tokens, rows.seqs.batch.tokens[2 * k:2 * k + 2]) and c["micro_batches"] == 2
    # mini-batch 1 is on-policy: the actor's log-probs ARE old_logp, so ρ ≡ 1 and nothing clips
    assert torch.equal(calls[0]["resp_logp"], calls[0]["batch"].extras["old_logp"])
    assert per[0]["actor/pg_clipfrac"] == 0.0 and per[0]["actor/pg_clipfrac_lower"] == 0.0
    assert per[0]["actor/ppo_kl"] == 0.0 == per[0]["actor/approx_kl"]
    # mini-batch 2 sees mini-batch 1's step: the clip (ρ < 1 − ε with A < 0; ρ > 1 + ε_high with A > 0)
    # and the dual clip (A < 0, ρ > c) bind
    assert per[1]["actor/pg_clipfrac"] > 0 and per[1]["actor/pg_clipfrac_lower"] > 0

    hand = _hand_ppo([[0, 1], [2, 3]])
    for m, c, (want, theta), lit in zip(per, calls, hand, PPO_EXPECTED):
        _close(m, want)
        assert c["theta"] == pytest.approx(theta, abs=1e-6)
        assert m["actor/kl_loss"] == 0.0
        keys = ("actor/loss", "actor/pg_clipfrac", "actor/pg_clipfrac_lower", "actor/ppo_kl")
        assert [want[k] for k in keys] == pytest.approx(lit[:4], abs=1e-10)
        assert theta == pytest.approx(lit[4], abs=1e-10)


def test_rlcsd_two_path_clip_by_hand():
    """rlcsd (two-path plain clip, ε 0.2, η 0.5, token-sum with the mini-batch's own N_non / N_sel),
    teacher tensors supplied in the rows (a path without a per-mini-batch input hook: no support pass); both paths clip on mini-batch 2."""
    cfg = _cfg("rlcsd", f"algo.rlcsd.eta={ETA}")
    hp = cfg.algo.hparams
    assert (hp.clip_low, hp.eta, hp.tau, hp.beta, hp.lam, hp.delta, hp.loss_agg_mode, hp.kl_loss_coef) == \
        (RLCSD_EPS, ETA, 0.02, 1.0, 0.5, 0.02, "token-sum", 0.0)
    run, rows = _run(cfg), _rows(ADV_RLCSD, teacher=True)
    assert type(run.path).mini_batch_inputs is DataPath.mini_batch_inputs    # no support pass of its own
    per = optimizer_steps(run, rows, hp, step=1)
    calls = run.actor.calls

    assert [(m["epoch"], m["mini_batch"], m["rows"]) for m in per] == [(0, 0, 2), (0, 1, 2)]
    assert [c["lr_increment"] for c in calls] == [1, 0] and run.path.steps_after == 2
    # the batch statistic is the mini-batch's own (N_non, N_sel), on every row, not the batch's (3, 7)
    assert _hand_counts([0, 1]) == (2, 3) and _hand_counts([2, 3]) == (1, 4) and _hand_counts(range(4)) == (3, 7)
    for c, want in zip(calls, [(2.0, 3.0), (1.0, 4.0)]):
        assert c["batch"].extras["rlcsd_counts"].tolist() == [list(want)] * 2
    assert torch.equal(calls[0]["resp_logp"], calls[0]["batch"].extras["old_logp"])

    hand = _hand_rlcsd([[0, 1], [2, 3]])
    assert hand[0][2] == {"non": 0, "sel": 0}                        # on-policy: ρ ≡ 1
    assert hand[1][2]["non"] > 0 and hand[1][2]["sel"] > 0           # the clip binds on both paths
    for m, c, (want, theta, _), lit in zip(per, calls, hand, RLCSD_EXPECTED):
        _close(m, want)
        assert m["actor/normaliser"] == 0.0 and m["actor/kl_loss"] == 0.0      # token-sum: no division
        assert c["theta"] == pytest.approx(theta, abs=1e-6)
        keys = ("actor/loss", "rlcsd/sel_frac", "rlcsd/abs_residual")
        assert [want[k] for k in keys] == pytest.approx(lit[:3], abs=1e-10)
        assert theta == pytest.approx(lit[3], abs=1e-10)
    # the counts matter: normalising by the whole batch's (3, 7) gives other numbers
    other = _hand_rlcsd([[0, 1], [2, 3]], counts=(3, 7))
    assert abs(other[0][0]["actor/loss"] - per[0]["actor/loss"]) > 1e-2
    assert abs(other[1][0]["actor/loss"] - per[1]["actor/loss"]) > 1e-2


class TeacherTensorsPath(CountingPath):
    """A path that hands the RLCSD teacher tensors to each mini-batch through its ``mini_batch_inputs``
    hook (as the teacher family's support passes do), keyed by the mini-batch's rows."""

    def __init__(self, cfg, full: Rows):
        super().__init__(cfg)
        self.full, self.seen = full, []

    def mini_batch_inputs(self, ctx, rows, hp, loss, step):
        # which rows: matched by their advantages (distinct in ADV_RLCSD), not by the mini-batch's order
        idx = [int(torch.nonzero(self.full.extras["advantages"] == a)[0, 0]) for a in rows.extras["advantages"]]
        self.seen.append((idx, ctx.micro, loss, step))
        keys = ("teacher_logp", "teacher_neg_logp", "teacher_neg_mask")
        return {k: self.full.extras[k][idx] for k in keys}, {"teacher/rows": float(len(idx))}


def test_mini_batch_inputs_hook_feeds_the_loss_per_mini_batch():
    """The same two RLCSD optimizer steps (the hand-computed ones) when the teacher tensors come from
    the path's ``mini_batch_inputs`` hook per mini-batch instead of the rows; the hook sees each
    mini-batch's rows in order, the update context and the loss; its metrics join the step's."""
    cfg = _cfg("rlcsd", f"algo.rlcsd.eta={ETA}")
    hp, full = cfg.algo.hparams, _rows(ADV_RLCSD, teacher=True)
    run = _run(cfg)
    path = TeacherTensorsPath(cfg, full)
    run.path = path
    bare = _rows(ADV_RLCSD)
    per = optimizer_steps(run, bare, hp, step=1)
    assert [(i, loss, step) for i, _, loss, step in path.seen] == [([0, 1], "rlcsd", 1), ([2, 3], "rlcsd", 1)]
    assert all(m == cfg.trainer.rows_per_micro_batch for _, m, _, _ in path.seen)
    assert [m["teacher/rows"] for m in per] == [2.0, 2.0] and path.steps_after == 2
    for m, c, (want, theta, _) in zip(per, run.actor.calls, _hand_rlcsd([[0, 1], [2, 3]])):
        _close(m, want)
        assert c["theta"] == pytest.approx(theta, abs=1e-6)
    # the rows themselves carried no teacher tensor: the loss read the hook's
    assert "teacher_logp" not in bare.extras and "teacher_logp" in run.actor.calls[0]["batch"].extras


def test_two_epochs_four_optimizer_steps_in_order():
    """ppo_epochs = 2: epoch 0 mb 0, mb 1, epoch 1 mb 0, mb 1 (old log-probs and advantages fixed),
    the LR schedule advanced only before the first; one micro-batch per mini-batch here."""
    cfg = _cfg("grpo", "algo.grpo.kl_loss_coef=0", f"algo.grpo.clip_high={EPS_HIGH}", f"algo.grpo.dual_clip={DUAL_C}",
               "trainer.ppo_epochs=2", "trainer.micro_batch_size=2")
    run, rows = _run(cfg, lr=EPOCHS_LR), _rows(ADV_PPO)
    per = optimizer_steps(run, rows, cfg.algo.hparams, step=3)
    calls = run.actor.calls

    assert [(m["epoch"], m["mini_batch"], m["rows"]) for m in per] == [(0, 0, 2), (0, 1, 2), (1, 0, 2), (1, 1, 2)]
    assert [c["lr_increment"] for c in calls] == [1, 0, 0, 0] and run.path.steps_after == 4
    assert [c["micro_batches"] for c in calls] == [1, 1, 1, 1]
    for k, c in enumerate(calls):
        assert torch.equal(c["batch"].tokens, rows.seqs.batch.tokens[2 * (k % 2):2 * (k % 2) + 2])
    # epoch 1 is off the old policy: approx_kl (a mean of k3 terms >= 0, none cancelling) > 0; ppo_kl's
    # signed terms could sum to 0 while the policy moved, so it is not the witness
    assert per[0]["actor/approx_kl"] == 0.0 < per[2]["actor/approx_kl"]

    hand = _hand_ppo([[0, 1], [2, 3]] * 2, lr=EPOCHS_LR)
    for m, c, (want, theta), lit in zip(per, calls, hand, EPOCHS_THETA):
        _close(m, want)
        assert want["actor/grad_norm"] > 0
        assert c["theta"] == pytest.approx(theta, abs=1e-6)
        assert theta == pytest.approx(lit, abs=1e-10)
    mean = mean_metrics(per)
    assert mean["actor/optimizer_steps"] == 4.0
    assert mean["actor/loss"] == pytest.approx(sum(w["actor/loss"] for w, _ in hand) / 4, abs=1e-6)
    # a second call is a new RL step: its first optimizer step advances the schedule again
    optimizer_steps(run, rows, cfg.algo.hparams, step=4)
    assert [c["lr_increment"] for c in calls[4:]] == [1, 0, 0, 0]


# ------------------------------------------------------------------ partial rollouts: the staleness mask

#: token versions of the 4 responses; at step 4 the trainer holds version 3, so with bound k = 1 the
#: staleness (3 − v) leaves out row 0 entirely ([2, 2]) and row 3's first token ([2, 1, 0])
VERSIONS = [[1, 1], [2, 3, 3], [3, 3], [1, 2, 3]]
STALE_STEP, BOUND = 4, 1
PARTIAL = ["algo.grpo.kl_loss_coef=0", "rollout.engine=vllm-async", "rollout.partial.enable=true", "trainer.mini_batch_prompts=0",
           f"rollout.partial.max_staleness={BOUND}"]


def _partial_rows(cfg, versions, hand_mask=None) -> tuple[Rows, dict]:
    """``base_rows`` + ``fold_keep`` (what ``update`` does between them: nothing for this path) on the 4 rows
    as sampled on-policy (engine log-probs = θ0's, so every decoupled weight is exactly 1) with per-token
    ``versions``; ``hand_mask``: [(row, token)] zeroed in ``resp_mask`` by hand. Returns (rows, metrics)."""
    from megatron_rl.rollout.rollouts import Rollouts
    from megatron_rl.trainer.contract import LogProbs, Sampled
    from megatron_rl.trainer.pipeline import rows as P
    from megatron_rl.trainer.pipeline.sequences import behaviour

    old = _old_logp()
    ro = Rollouts.from_lists([None] * 4, PROMPTS, RESPONSES, [old[i, :len(r)].tolist() for i, r in enumerate(RESPONSES)],
                             ["stop"] * 4, [0, 0, 1, 1], rewards=torch.tensor([1.0, 0.0, 0.0, 1.0]),
                             token_versions=torch.tensor([v for vs in versions for v in vs], dtype=torch.int32))
    seqs = build_seq_batch(PROMPTS, RESPONSES, PAD, SEQ_LEN, R)
    for i, t in hand_mask or ():
        seqs.resp_mask[i, t] = 0.0
    metrics: dict = {}
    rows = P.base_rows(cfg, Sampled(ro, seqs, cfg.algo.hparams), LogProbs(None, None, old, None),
                       behaviour(ro, seqs.resp_mask, STALE_STEP),
                       torch.tensor(ADV_PPO, dtype=torch.float64)[:, None].expand(4, R).clone(), metrics)
    return P.fold_keep(rows), metrics


def _hand_on_policy_step(tokens) -> tuple[float, list[float], float]:
    """One on-policy token-mean step (ρ ≡ 1: nothing clips) on ``tokens`` = [(row, t)]: loss = −Σ A/n,
    θ − lr·Σ (−A/n)(e_y − π); an empty set: loss 0, no step."""
    n = len(tokens)
    if n == 0:
        return 0.0, list(THETA0), 0.0
    new, gnorm = _sgd(list(THETA0), [(-ADV_PPO[i] / n, RESPONSES[i][t]) for i, t in tokens], LR)
    return -sum(ADV_PPO[i] for i, _ in tokens) / n, new, gnorm


def _train(cfg, rows):
    run = _run(cfg)
    per = optimizer_steps(run, rows, cfg.algo.hparams, step=STALE_STEP)
    assert len(per) == 1
    return per[0], run.actor.calls[0]["theta"]


def test_staleness_mask_equals_the_loss_mask_zeroed_by_hand():
    """``rollout.partial.policy=mask``: the update under the staleness mask is the update of the same
    batch under ``drop`` (which masks nothing in the pipeline) with the over-stale tokens' loss mask zeroed
    by hand — and both are the hand-computed step over the 7 tokens left."""
    cfg = _cfg("grpo", *PARTIAL, "rollout.partial.policy=mask")
    rows, metrics = _partial_rows(cfg, VERSIONS)
    stale = [(0, 0), (0, 1), (3, 0)]
    assert metrics["partial/masked_tokens"] == 3.0 and "correction_keep" not in rows.extras
    hand_rows, hand_metrics = _partial_rows(_cfg("grpo", *PARTIAL, "rollout.partial.policy=drop"), VERSIONS, stale)
    assert "partial/masked_tokens" not in hand_metrics
    assert torch.equal(rows.extras["resp_mask"], hand_rows.extras["resp_mask"])
    m, theta = _train(cfg, rows)
    m_hand, theta_hand = _train(cfg, hand_rows)
    assert theta == theta_hand and m["actor/loss"] == m_hand["actor/loss"]
    kept = [(i, t) for i, r in enumerate(RESPONSES) for t in range(len(r)) if (i, t) not in stale]
    loss, want, gnorm = _hand_on_policy_step(kept)
    _close(m, {"actor/loss": loss, "actor/grad_norm": gnorm, "actor/normaliser": 7.0})   # float32 masks / weights
    assert theta == pytest.approx(want, abs=1e-6)


def test_staleness_mask_without_a_stale_token_is_the_drop_update():
    fresh = [[3] * len(r) for r in RESPONSES]
    rows, metrics = _partial_rows(_cfg("grpo", *PARTIAL, "rollout.partial.policy=mask"), fresh)
    drop_rows, _ = _partial_rows(_cfg("grpo", *PARTIAL, "rollout.partial.policy=drop"), fresh)
    assert metrics["partial/masked_tokens"] == 0.0
    m, theta = _train(_cfg("grpo", *PARTIAL), rows)
    m_drop, theta_drop = _train(_cfg("grpo", *PARTIAL), drop_rows)
    assert theta == theta_drop and m["actor/loss"] == m_drop["actor/loss"]
    loss, want, _ = _hand_on_policy_step([(i, t) for i, r in enumerate(RESPONSES) for t in range(len(r))])
    assert m["actor/loss"] == pytest.approx(loss, abs=1e-6) and theta == pytest.approx(want, abs=1e-6)


def test_staleness_mask_of_an_all_stale_batch_contributes_nothing():
    """Every token over the bound: loss 0, gradient 0, θ unchanged — no NaN from the empty normaliser."""
    cfg = _cfg("grpo", *PARTIAL, "rollout.partial.policy=mask")
    rows, metrics = _partial_rows(cfg, [[1] * len(r) for r in RESPONSES])
    assert metrics["partial/masked_tokens"] == 10.0 and float(rows.extras["resp_mask"].sum()) == 0.0
    m, theta = _train(cfg, rows)
    assert (m["actor/loss"], m["actor/grad_norm"], m["actor/normaliser"]) == (0.0, 0.0, 0.0)
    assert theta == list(THETA0)


if __name__ == "__main__":
    torch.set_printoptions(precision=12)
    print("ppo (mini-batches [0,1], [2,3])")
    for m, th in _hand_ppo([[0, 1], [2, 3]]):
        print({k: round(v, 12) for k, v in m.items()}, [round(t, 12) for t in th])
    print("rlcsd", _hand_counts([0, 1]), _hand_counts([2, 3]), _hand_counts([0, 1, 2, 3]))
    for m, th, fl in _hand_rlcsd([[0, 1], [2, 3]]):
        print({k: round(v, 12) for k, v in m.items()}, [round(t, 12) for t in th], fl)
    print("epochs")
    for m, th in _hand_ppo([[0, 1], [2, 3]] * 2, lr=EPOCHS_LR):
        print({k: round(v, 12) for k, v in m.items()}, [round(t, 12) for t in th])
