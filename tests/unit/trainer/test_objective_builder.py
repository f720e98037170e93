"""The one objective builder (trainer/objective.Objective over algorithms.objective_terms):
micro-batch invariance for every method, the KL rule, and the actor/kl_loss metric."""
from __future__ import annotations

import pytest
import torch

from megatron_rl import algorithms as A
from megatron_rl.trainer.pipeline.batch import TrainBatch
from megatron_rl.trainer.pipeline.objective import Objective, SupportObjective
from tests.helpers.fp32_tolerance import U64, reorder_rtol

N, S, R, K = 8, 10, 5, 3
#: micro-batch invariance bound: fp64 reductions over the vocabulary (20), the support and the N·R
#: response tokens (loss, metrics, KL), any order, for sums whose terms cancel up to 10^3-fold
#: (tests/helpers/fp32_tolerance.py): ~2e-11
TOL = reorder_rtol([20, K + 1, N * R, N * R], cond=1e3, unit=U64)


def _batch(kind: str, hp, seed: int = 0) -> TrainBatch:
    """A synthetic global batch with every extra the kind's loss reads (response at positions 3..7)."""
    g = torch.Generator().manual_seed(seed)
    resp_mask = (torch.rand(N, R, generator=g) > 0.25).float()
    resp_mask[:, 0] = 1.0
    resp_mask[5] = 0.0                               # a row with no valid token
    pos = (torch.arange(R) + 3).expand(N, R).clone()
    lp = lambda *shape: -torch.rand(*shape, generator=g) * 2
    ex = {"resp_pos": pos, "resp_mask": resp_mask, "rewards": (torch.rand(N, generator=g) > 0.5).float(),
          "group_ids": torch.arange(N) // 4, "advantages": torch.randn(N, generator=g), "old_logp": lp(N, R),
          "ref_logp": lp(N, R), "teacher_logp": lp(N, R), "teacher_neg_logp": lp(N, 2, R),
          "teacher_neg_mask": torch.ones(N, 2, dtype=torch.bool), "teacher_entropy": torch.rand(N, R, generator=g),
          "teacher_topk": torch.log_softmax(torch.randn(N, R, K + 1, generator=g), -1),
          "teacher_neg_topk": torch.log_softmax(torch.randn(N, R, K + 1, generator=g), -1),
          "support_idx": torch.randint(0, 20, (N, S - 1, K), generator=g),
          "first_pos": (torch.arange(R) + 1).expand(N, R).clone(), "first_mask": torch.ones(N, R),
          "first_ref_logp": lp(N, R), "first_rewards": torch.rand(N, generator=g)}
    for name, fn in A.loss_batch_stats(A.algo_kind(kind).loss).items():
        ex[name] = fn(ex, hp)
    mask = torch.zeros(N, S - 1)
    return TrainBatch(torch.zeros(N, S, dtype=torch.long), mask, ex)


def _step(kind, hp, batch, mbs, logits):
    """What PolicyActor.train_step does: Σ S / Σ D over micro-batches, metrics as Σ num / Σ den."""
    obj = Objective(kind, hp, batch, step=3)
    num, den, mets = 0.0, None, {}
    for i in range(0, N, mbs):
        mb = batch.slice(i, i + mbs)
        z = logits[i:i + mbs]
        logp = torch.log_softmax(z, -1)[..., 0]          # token log-probs [n, S-1]
        ent = -(torch.log_softmax(z, -1).exp() * torch.log_softmax(z, -1)).sum(-1)
        sup = torch.log_softmax(z, -1).gather(-1, mb.extras["support_idx"]) if obj.support_key else None
        s, d, m = obj(logp, ent, mb, sup) if sup is not None else obj(logp, ent, mb)
        num = num + s
        den = d if den is None else (den + d if d is not None else None)
        for k, (a, b) in m.items():
            acc = mets.setdefault(k, [0.0, 0.0])
            acc[0] += float(a)
            acc[1] += float(b)
    loss = num / den if den is not None else num
    return loss, {k: a / b for k, (a, b) in mets.items() if b}


@pytest.mark.parametrize("kind", sorted(A.ALGO_KINDS))
def test_every_method_is_micro_batch_invariant(kind):
    """Same loss, gradient and metrics for micro-batches of 1, 2, 4 and 8 rows (KL on). The logits are
    float64, so the micro-batch split (the order of the sums) moves nothing above :data:`TOL`, what fp64
    reordering allows here; the extras stay float32 (promoted), as the trainer hands them."""
    hp = A.algo_kind(kind).hparams(kl_loss_coef=0.05)
    batch = _batch(kind, hp)
    ref = None
    for mbs in (8, 4, 2, 1):
        logits = torch.randn(N, S - 1, 20, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
        logits = logits.requires_grad_(True)
        loss, mets = _step(kind, hp, batch, mbs, logits)
        grad, = torch.autograd.grad(loss, logits)
        if ref is None:
            ref = (loss.detach(), grad, mets)
            continue
        torch.testing.assert_close(loss.detach(), ref[0], rtol=TOL, atol=TOL)
        torch.testing.assert_close(grad, ref[1], rtol=TOL, atol=TOL)
        assert mets["actor/kl_loss"] == pytest.approx(ref[2]["actor/kl_loss"], rel=TOL, abs=TOL)


def _kl_only(kind: str, mode: str):
    """Objective with the policy-loss part zeroed out (advantages 0, plain ppo) to isolate the KL term."""
    hp = A.algo_kind(kind).hparams(kl_loss_coef=1.0, loss_agg_mode=mode, kl_loss_type="low_var_kl")
    batch = _batch(kind, hp)
    batch.extras["advantages"].zero_()
    logits = torch.randn(N, S - 1, 20, generator=torch.Generator().manual_seed(2))
    loss, mets = _step(kind, hp, batch, 2, logits)
    lp = torch.log_softmax(logits, -1)[..., 0].gather(1, batch.extras["resp_pos"])
    kl = A.kl_penalty(lp, batch.extras["ref_logp"], "low_var_kl")
    return loss, mets, kl, batch.extras["resp_mask"]


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"])
def test_kl_rule_same_mode_as_the_loss(mode):
    """Modes other than token-sum: the KL is aggregated like the policy loss, and logged as it enters."""
    loss, mets, kl, m = _kl_only("rlsd", mode)
    want = A.aggregate(kl, m, mode)
    torch.testing.assert_close(loss, want, rtol=1e-5, atol=1e-6)
    assert mets["actor/kl_loss"] == pytest.approx(float(want), rel=1e-5)


def test_kl_rule_token_sum_is_a_whole_batch_token_mean():
    """token-sum (RLCSD, self-normalised): KL = Σ k·m / N_tok of the whole batch, whatever the split."""
    hp = A.RLCSDHParams(kl_loss_coef=1.0)
    batch = _batch("rlcsd", hp)
    logits = torch.randn(N, S - 1, 20, generator=torch.Generator().manual_seed(2))
    loss1, mets = _step("rlcsd", hp, batch, 2, logits)
    loss0, _ = _step("rlcsd", A.RLCSDHParams(), batch, 2, logits)
    lp = torch.log_softmax(logits, -1)[..., 0].gather(1, batch.extras["resp_pos"])
    m = batch.extras["resp_mask"]
    want = (A.kl_penalty(lp, batch.extras["ref_logp"], "k3") * m).sum() / m.sum()
    torch.testing.assert_close(loss1 - loss0, want, rtol=1e-5, atol=1e-6)
    assert mets["actor/kl_loss"] == pytest.approx(float(want), rel=1e-5)


def test_builder_equals_full_batch_compute_policy_loss():
    """The trainer's micro-batched objective and the documented full-batch entry point agree."""
    hp = A.GRPOHParams(kl_loss_coef=0.1, loss_agg_mode="seq-mean-token-mean")
    batch = _batch("grpo", hp)
    logits = torch.randn(N, S - 1, 20, generator=torch.Generator().manual_seed(4))
    loss, _ = _step("grpo", hp, batch, 2, logits)
    ex = batch.extras
    lp = torch.log_softmax(logits, -1)[..., 0].gather(1, ex["resp_pos"])
    x = A.AlgoInputs(rewards=ex["rewards"], group_ids=ex["group_ids"], mask=ex["resp_mask"], logp=lp,
                     old_logp=ex["old_logp"], ref_logp=ex["ref_logp"])
    torch.testing.assert_close(loss, A.compute_policy_loss("grpo", x, ex["advantages"], hp).loss, rtol=1e-5, atol=1e-6)


def test_support_is_a_declared_protocol():
    """Losses declare their top-k support at registration; the builder exposes it to the actor."""
    assert {n: A.loss_support(n) for n in ("opsd", "sdpo", "srpo", "opsd_ectr", "ppo_clip", "rlcsd")} == \
        {"opsd": "teacher", "sdpo": "student", "srpo": "student", "opsd_ectr": "teacher", "ppo_clip": None, "rlcsd": None}
    sdpo = Objective("sdpo", A.SDPOHParams(), _batch("sdpo", A.SDPOHParams()))
    grpo = Objective("grpo", A.GRPOHParams(), _batch("grpo", A.GRPOHParams()))
    assert isinstance(sdpo, SupportObjective) and sdpo.support_key == "support_idx"
    assert grpo.support_key is None
    assert not isinstance(lambda logp, ent, mb: None, SupportObjective)
    with pytest.raises(ValueError, match="support='both' not in"):
        A.register_policy_loss("toy_support", support="both")
