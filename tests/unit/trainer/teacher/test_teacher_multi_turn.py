"""The self-distillation family on multi-turn responses (docs/multi-turn.md): the teacher reads the whole
response (policy turns and tool / user turns) and every distillation term counts the policy's tokens only.

Oracles: each registered teacher loss (and its whole-mini-batch statistic) on a masked response equals the same
loss on the policy tokens alone laid out as a single-turn response (the tool columns cut out), and no value at a
tool token moves it; OPSD written out by hand over the policy tokens; the teacher path's rows keep the agent
loop's mask; the packed teacher rows score the mask-1 targets only. The teacher's log-probs against HF
transformers are in ``tests/distributed/workers/teacher_pass.py`` (a real actor).
"""
from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import pytest
import torch

from megatron_rl import algorithms as A
from megatron_rl.agent.loop import Trajectory
from megatron_rl.config import load_config
from megatron_rl.rollout import rollouts as R
from megatron_rl.trainer.contract import Rows, SampleDump, UpdateContext
from megatron_rl.trainer.paths.teacher.inputs import pack
from megatron_rl.trainer.paths.teacher.path import GtTeacherPath
from megatron_rl.trainer.pipeline.sequences import rollout_sequences
from tests.helpers.algo_builders import random_inputs

TEACHER_KINDS = ["rlcsd", "opsd", "sdpo", "srpo", "rlsd", "opsd_ectr", "rlsd_ectr"]
T = 8


def _tool_mask(n: int) -> torch.Tensor:
    """Policy turn, tool turn, policy turn (row-dependent lengths); some rows single-turn; row 0 ends early."""
    m = torch.ones(n, T, dtype=torch.float64)
    for i in range(n):
        if i % 3:
            a = 1 + i % 3
            m[i, a:a + 2 + i % 2] = 0
    m[0, -2:] = 0
    return m


#: the per-token inputs of the family and their response-token axis ([N, T], [N, T, k+1] supports, [N, K, T])
TOKEN_AXIS = {"logp": 1, "old_logp": 1, "ref_logp": 1, "tis_weights": 1, "teacher_logp": 1, "teacher_entropy": 1,
              "student_topk": 1, "teacher_topk": 1, "teacher_neg_topk": 1, "teacher_neg_logp": 2}


def _along(v: torch.Tensor, ax: int, x: torch.Tensor) -> torch.Tensor:
    """``x`` ``[N, T]`` broadcast to ``v`` with its T on axis ``ax``."""
    shape = [1] * v.dim()
    shape[0], shape[ax] = x.shape
    return x.reshape(shape).expand_as(v)


def _poison(x, mask: torch.Tensor):
    """Every per-token value at a masked (tool) position replaced by large junk."""
    g = torch.Generator().manual_seed(7)
    out = {k: torch.where(_along(x[k], ax, mask == 0), x[k] + 50.0 * torch.randn(x[k].shape, generator=g, dtype=x[k].dtype),
                          x[k]) for k, ax in TOKEN_AXIS.items() if k in x}
    return x.replace(**out)


def _compact(x, mask: torch.Tensor):
    """The policy tokens of each row moved to the front (tool columns cut out), mask 1 on them: the single-turn
    response the policy's tokens would make."""
    order = torch.argsort((mask == 0).to(torch.int8), dim=1, stable=True)     # kept positions first, in order
    out = {k: x[k].gather(ax, _along(x[k], ax, order)) for k, ax in TOKEN_AXIS.items() if k in x}
    out["mask"] = (torch.arange(T)[None] < mask.sum(1).long()[:, None]).to(mask.dtype)
    return x.replace(**out)


def _inputs(kind: str, seed: int = 0):
    x = random_inputs(seed, t=T)
    x = x.replace(mask=_tool_mask(len(x.rewards)), first_mask=None, first_logp=None, first_ref_logp=None)
    hp = A.algo_kind(kind).hparams()
    adv = A.compute_advantages(kind, x, hp)
    return x, hp, adv


@pytest.mark.parametrize("kind", TEACHER_KINDS)
def test_teacher_losses_count_policy_tokens_only(kind):
    x, hp, adv = _inputs(kind)
    want = A.compute_policy_loss(kind, x, adv, hp)
    for other in (_poison(x, x.mask), _compact(x, x.mask)):
        got = A.compute_policy_loss(kind, other, adv, hp)
        torch.testing.assert_close(got.loss, want.loss, rtol=0, atol=1e-12)
        for name, v in want.metrics.items():
            torch.testing.assert_close(got.metrics[name], v, rtol=0, atol=1e-12, msg=f"{kind}: metric {name}")


@pytest.mark.parametrize("kind", ["rlcsd", "srpo"])
def test_whole_mini_batch_statistics_count_policy_tokens_only(kind):
    """RLCSD's (N_non, N_sel) and SRPO's log mean(u): the trainer's mini-batch fields (``loss_batch_stats``)."""
    x, hp, adv = _inputs(kind)
    stats = A.loss_batch_stats(A.algo_kind(kind).loss)

    def fields(y):
        ex = {k: v for k, v in y.items() if isinstance(v, torch.Tensor)}
        ex.update(advantages=adv, resp_mask=y.mask)
        return {name: fn(ex, hp) for name, fn in stats.items()}

    want = fields(x)
    for other in (_poison(x, x.mask), _compact(x, x.mask)):
        for name, v in fields(other).items():
            torch.testing.assert_close(v, want[name], rtol=0, atol=1e-12)
    if kind == "rlcsd":     # every policy token is in one of the two paths, no tool token in either
        assert float(want["rlcsd_counts"][0].sum()) == float(x.mask.sum())


def test_opsd_by_hand_over_policy_tokens():
    """ℓ_t = Σ_u min(p_T(u)(log p_T(u) − log p_S(u)), κ); the loss is its mean over the mask-1 tokens."""
    x, hp, adv = _inputs("opsd")
    got = A.compute_policy_loss("opsd", x, adv, hp).loss
    terms = []
    for i in range(x.mask.shape[0]):
        for t in range(T):
            if x.mask[i, t] > 0:
                pt, ps = x.teacher_topk[i, t], x.student_topk[i, t]
                terms.append(sum(min(float(pt[u].exp() * (pt[u] - ps[u])), hp.jsd_token_clip)
                                 for u in range(pt.shape[0])) * float(x.tis_weights[i, t]))
    assert float(got) == pytest.approx(sum(terms) / len(terms), abs=1e-12)


# ------------------------------------------------------------------ the teacher path's rows and packed sequences

MASKS = [[1, 1, 0, 0, 0, 1, 1], [1, 1, 1], [1, 0, 0, 1, 1, 1]]


class CharTok:
    """A real (tiny) character tokenizer: id = ord(c)."""

    bos_id, pad_id, eos_id = 1, 0, 2

    def encode(self, s):
        return [ord(c) for c in s]

    def decode(self, ids):
        return "".join(chr(i) for i in ids if i > 2)


def _rollouts():
    rows = [SimpleNamespace(prompt_ids=(1, 80 + i, 81), ground_truth=str(i), extra_info={}) for i in range(3)]
    trajs = [Trajectory(i, 0, rows[i].prompt_ids, [60 + 2 * i + k for k in range(len(m))],
                        [-0.5 if b else 0.0 for b in m], m) for i, m in enumerate(MASKS)]
    ro = R.from_completions(rows, trajs, CharTok())
    ro.rewards = torch.tensor([1.0, 0.0, 1.0])
    return ro


def test_teacher_rows_keep_the_policy_mask_and_pack_scores_it():
    cfg = load_config(None, ["algo.kind=rlsd", "teacher.template=inline", "rollout.max_tokens=8",
                             "rollout.max_model_len=64", "rollout.n=2"])
    tok = CharTok()
    path = GtTeacherPath(cfg, tok)
    ctx = UpdateContext(None, SimpleNamespace(tp=1), 1, SampleDump(0, True, None, ""), cfg, tok)
    ro = _rollouts()
    seqs = rollout_sequences(ctx, ro)
    base = Rows(seqs, {"advantages": torch.zeros(3), "resp_pos": seqs.resp_pos, "resp_mask": seqs.resp_mask}, ro=ro)
    rows = path.train_rows(ctx, SimpleNamespace(ro=ro), base, None, 1, {})
    assert rows.plan.keep == [0, 1, 2]
    for i, m in enumerate(MASKS):
        want = torch.tensor(m + [0] * (8 - len(m)), dtype=torch.float32)
        assert torch.equal(rows.extras["resp_mask"][i], want) and torch.equal(rows.seqs.resp_mask[i], want)
        assert rows.seqs.batch.loss_mask[i].tolist()[2:2 + len(m)] == [float(b) for b in m]
        assert rows.seqs.batch.loss_mask[i].sum() == sum(m)
    # the teacher reads the whole response after its prompt (the hint after BOS) and scores the policy tokens
    tseqs, owner = path.teacher_sequences(ctx, rows, 1)
    assert [list(r) for _, r in tseqs] == [ro.response(i) for i in range(3)]
    assert [p[:2] for p, _ in tseqs] == [[1] + tok.encode(str(i)) for i in range(3)]
    pk = pack(tseqs, 8, pad_id=0, row_len=32, masks=[rows.seqs.resp_mask[j] for j, _ in owner])
    targets = pk.batch.targets.reshape(-1)
    for m, (p, r) in enumerate(tseqs):
        on = torch.tensor(MASKS[m]) > 0
        assert torch.equal(pk.resp_mask[m, :len(r)] > 0, on) and pk.resp_mask[m, len(r):].sum() == 0
        assert targets[pk.target_pos[m, :len(r)][on]].tolist() == torch.tensor(r)[on].tolist()
    assert int(pk.batch.loss_mask.sum()) == sum(map(sum, MASKS))   # the pass's outputs: policy targets only
    vals = torch.arange(1.0, 1.0 + pk.batch.loss_mask.numel()).reshape(pk.batch.loss_mask.shape)
    got = pk.gather(vals)
    assert bool((got[pk.resp_mask == 0] == 0).all()) and bool((got[pk.resp_mask > 0] > 0).all())
    unmasked = pack(tseqs, 8, pad_id=0, row_len=32)                 # single-turn layout: every response token
    assert torch.equal(unmasked.batch.tokens, pk.batch.tokens) and unmasked.real_tokens == pk.real_tokens
    assert dataclasses.replace(unmasked, resp_mask=pk.resp_mask).gather(vals).equal(got)
    path.close()
