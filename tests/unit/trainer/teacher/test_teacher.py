"""Teacher data path pieces: hint plans (spec §1.5.1 consequences), teacher templates, packing with
block-diagonal masks, teacher weight modes, and the TP=1 top-k / gather supports vs full-vocab math."""
from __future__ import annotations

import math
import random
from types import SimpleNamespace

import pytest
import torch

from megatron_rl import algorithms as A
from megatron_rl.trainer.paths.teacher.inputs import (
    ChatHintTemplate,
    InlineHintTemplate,
    pack,
    plan_gt,
    plan_hints,
    truncate_left,
)
from megatron_rl.trainer.paths.teacher.weights import TeacherWeights
from megatron_rl.trainer.pipeline.batch import make_batch
from megatron_rl.trainer.policy.vocab_parallel import (
    vocab_parallel_gather_logprobs,
    vocab_parallel_topk,
    with_tail,
)


class CharTok:
    """A real (tiny) character tokenizer: id = ord(c)."""

    bos_id = 1

    def encode(self, s):
        return [ord(c) for c in s]

    def decode(self, ids):
        return "".join(chr(i) for i in ids if i > 1)

    def apply_chat_template(self, msgs, add_generation_prompt=True):
        return "".join(f"<{m['role']}>{m['content']}" for m in msgs) + ("<assistant>" if add_generation_prompt else "")


class RO(SimpleNamespace):
    def __len__(self):
        return len(self.rewards)


def make_ro(rewards, texts, gids, gt="42"):
    rows = [SimpleNamespace(prompt_ids=(1, 80, 81), ground_truth=gt, extra_info={"problem": "What?"})
            for _ in rewards]
    return RO(rows=rows, texts=texts, rewards=torch.tensor(rewards, dtype=torch.float32), group_ids=torch.tensor(gids))


def test_plan_rlcsd_drops_and_k():
    box = lambda a: f"so \\boxed{{{a}}}"
    # group 0: 1 correct, 3 wrong boxed -> the correct one is dropped (no other positive)
    # group 1: all correct -> dropped; group 2: 2 correct, 1 wrong boxed + 1 wrong unboxed
    texts = [box(42), box(1), box(2), box(3), box(42), box(42), box(42), box(42), box(42), box(42), box(7), "none"]
    rewards = [1, 0, 0, 0, 1, 1, 1, 1, 1, 1, 0, 0]
    gids = [0] * 4 + [1] * 4 + [2] * 4
    tmpl = ChatHintTemplate(CharTok())
    plan = plan_hints(make_ro(rewards, texts, gids), tmpl, k_max=4, rng=random.Random(0))
    assert plan.dropped_groups == 1
    # group 0: target 0 dropped; targets 1-3 keep with K = 2 (the other two wrong boxed)
    # group 2: targets 8, 9 keep K=1; target 10 (the only boxed wrong) dropped; target 11 (unboxed) keeps K=1
    assert sorted(plan.keep) == [1, 2, 3, 8, 9, 11]
    kk = dict(zip(plan.keep, plan.n_neg))
    assert kk == {1: 2, 2: 2, 3: 2, 8: 1, 9: 1, 11: 1}
    assert plan.dropped_targets == 2
    for j, i in enumerate(plan.keep):
        assert len(plan.prompts[j]) == kk[i] + 1
        text = CharTok().decode(plan.prompts[j][0])
        assert "Correct final answer: 42" in text and "Problem: What?" in text
    # symmetry: a wrong hint uses the same scaffolding, only body and answer differ
    j = plan.keep.index(8)
    neg = CharTok().decode(plan.prompts[j][1])
    assert "Correct final answer: 7" in neg and "=== Reference Solution Begin ===" in neg and "=== Reference Solution End ===" in neg


def test_plan_gt_teacher_keeps_everything():
    ro = make_ro([0, 1, 0], ["a", "b", "c"], [0, 0, 1])
    ro.rows[0].extra_info["solution"] = "because"
    tok = CharTok()
    plan = plan_gt(ro, InlineHintTemplate(tok, 1, tok.encode(" ")))
    assert plan.keep == [0, 1, 2] and plan.n_neg == [0, 0, 0]
    assert plan.prompts[0][0] == [1] + tok.encode("42 ") + [80, 81]     # inline: answer + sep after BOS


def test_plan_no_survivor_is_empty():
    ro = make_ro([1, 1, 0, 0], ["\\boxed{1}"] * 4, [0, 0, 1, 1])
    plan = plan_hints(ro, ChatHintTemplate(CharTok()), rng=random.Random(0))
    assert plan.keep == [] and plan.dropped_groups == 2


def test_truncate_left():
    assert truncate_left([1, 2, 3, 4], [9, 9], 5) == [2, 3, 4]
    assert truncate_left([1, 2], [9], 5) == [1, 2]
    with pytest.raises(ValueError, match="no room"):
        truncate_left([1, 2], [9] * 5, 5)


def test_pack_layout_and_mask():
    seqs = [([1, 2, 3], [4, 5]), ([6], [7, 8, 9]), ([1, 2, 3, 4, 5, 6], [7]), ([2], [3])]
    pk = pack(seqs, max_resp=3, pad_id=0, row_len=8, multiple=8)
    assert pk.batch.seq_len == 8 and pk.real_tokens == 5 + 4 + 7 + 2
    assert math.isclose(pk.pad_frac, 1 - 18 / (pk.batch.num_samples * 8))
    seg, tok = pk.batch.extras["segment_ids"], pk.batch.tokens
    targets = pk.batch.targets.reshape(-1)
    for m, (p, r) in enumerate(seqs):
        got = targets[pk.target_pos[m, :len(r)]].tolist()
        assert got == r, (m, got, r)                      # response targets land where expected
        assert int((seg == m).sum()) == len(p) + len(r)
    mask = pk.batch.attention_mask()                       # True = masked
    for row in range(pk.batch.num_samples):
        for i in range(8):
            for j in range(8):
                same = seg[row, i] == seg[row, j]
                assert bool(mask[row, 0, i, j]) == (j > i or not bool(same))
    assert tok.shape == seg.shape


def test_pad_to_multiple_keeps_segments():
    pk = pack([([1, 2], [3])], max_resp=1, pad_id=0, row_len=3, multiple=1)
    b = pk.batch.pad_to_multiple(4)
    assert b.extras["segment_ids"].tolist() == [[0, 0, 0, -1]]


class Holder(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(3, 2)


def test_teacher_modes_and_swap():
    model = Holder()
    actor = SimpleNamespace(bare_models=lambda: [model])
    w0 = model.lin.weight.detach().clone()
    snap = TeacherWeights(actor, "snapshot", sync_interval=2)
    ema = TeacherWeights(actor, "ema", ema_decay=0.5)
    fixed = TeacherWeights(actor, "fixed")
    with torch.no_grad():
        model.lin.weight.add_(1.0)
    w1 = model.lin.weight.detach().clone()
    for t in (snap, ema, fixed):
        t.after_optimizer_step()
    with snap.swapped():
        assert torch.equal(model.lin.weight, w0)           # counter 1 < 2: still θ0
    assert torch.equal(model.lin.weight, w1)               # restored
    with ema.swapped():
        assert torch.allclose(model.lin.weight, 0.5 * w0 + 0.5 * w1)
    with fixed.swapped():
        assert torch.equal(model.lin.weight, w1)
    snap.after_optimizer_step()                            # 2nd optimizer step: snapshot refresh
    with snap.swapped():
        assert torch.equal(model.lin.weight, w1)
    assert snap.state_dict() == {"mode": "snapshot", "counter": 0, "syncs": 1}
    with pytest.raises(RuntimeError), snap.swapped():
        raise RuntimeError("boom")
    assert torch.equal(model.lin.weight, w1)               # restored on error too
    with pytest.raises(ValueError, match="teacher_mode"):
        TeacherWeights(actor, "lora")


def test_topk_and_gather_match_full_vocab():
    torch.manual_seed(0)
    z = torch.randn(3, 4, 11, dtype=torch.float64)
    z[0, 0, 2] = z[0, 0, 5] = z[0, 0].max() + 1           # a tie: the lower id wins
    tk = vocab_parallel_topk(z, 4)
    ref = torch.log_softmax(z, -1)
    ref_idx = torch.sort(z, dim=-1, descending=True, stable=True).indices[..., :4]
    assert torch.equal(tk.idx, ref_idx) and tk.idx[0, 0, 0] == 2
    assert torch.allclose(tk.logp, ref.gather(-1, ref_idx))
    assert torch.allclose(tk.entropy, -(ref.exp() * ref).sum(-1))
    # the distillation support equals algorithms.topk_tail_support
    (sup,) = A.topk_tail_support(z, k=4)
    assert torch.allclose(with_tail(tk.logp), sup)
    # gather: values and gradient d logp_u / d z_j = 1[j = u] - p_j
    zz = z.clone().requires_grad_(True)
    out = vocab_parallel_gather_logprobs(zz, ref_idx)
    g = torch.randn_like(out)
    (out * g).sum().backward()
    z2 = z.clone().requires_grad_(True)
    (torch.log_softmax(z2, -1).gather(-1, ref_idx) * g).sum().backward()
    assert torch.allclose(out, ref.gather(-1, ref_idx)) and torch.allclose(zz.grad, z2.grad)


def test_topk_respects_vocab_padding():
    z = torch.zeros(1, 6)
    z[0, 5] = 10.0                                          # padded column must never be chosen
    tk = vocab_parallel_topk(z, 2, vocab_size=5)
    assert 5 not in tk.idx.tolist()[0]
    assert torch.allclose(tk.logp.exp().sum(), torch.tensor(2 / 5))


def test_block_diagonal_batch_mask_shape():
    b = make_batch([[1, 2]], [[3]], pad_id=0)
    assert b.attention_mask().shape == (1, 1, 3, 3)


def test_pack_off_is_one_sequence_per_row():
    seqs = [([1, 2], [3, 4]), ([5], [6])]
    pk = pack(seqs, max_resp=2, pad_id=0, row_len=64, multiple=8, packed=False)
    assert pk.batch.num_samples == 2 and "segment_ids" not in pk.batch.extras
    assert pk.batch.tokens[0, :4].tolist() == [1, 2, 3, 4] and pk.batch.tokens[1, :2].tolist() == [5, 6]
    targets = pk.batch.targets.reshape(-1)
    assert targets[pk.target_pos[0]].tolist() == [3, 4] and targets[pk.target_pos[1, :1]].tolist() == [6]


def test_pack_on_with_transformer_engine_fails_at_startup():
    from megatron_rl.config import load_config
    from megatron_rl.trainer.loop.preflight import load_checked

    with pytest.raises(ValueError, match="teacher.pack=on needs the local attention path"):
        load_checked(None, ["algo.kind=rlsd", "teacher.pack=on", "model.backend=te"])
    with pytest.raises(ValueError, match="teacher.pack invalid"):
        load_config(None, ["teacher.pack=maybe"])
