"""Teacher-pass layout: pack's cost-aware choice of rows, width-trimmed blocks, TrainBatch.narrow."""
from __future__ import annotations

import random

import torch

from megatron_rl.trainer.paths.teacher.inputs import _cost, _ffd, attention_crossover, pack
from megatron_rl.trainer.paths.teacher.support import _width_groups
from megatron_rl.trainer.pipeline.batch import make_batch
from megatron_rl.trainer.pipeline.packing import TokenBudget


def bench_step(seed: int = 0) -> list[tuple[list[int], list[int]]]:
    """The benchmark's synthetic step: 128 rollouts, K = 4 -> 640 sequences of 80..296 tokens."""
    rng = random.Random(seed)
    tok = lambda n: [rng.randrange(4, 4096) for _ in range(n)]
    prompts, responses = [], []
    for _ in range(16):
        p = tok(rng.randint(24, 64))
        for _ in range(8):
            prompts.append(p)
            responses.append(tok(rng.randint(8, 96)))
    scaffold, seqs = tok(40), []
    for i, (p, r) in enumerate(zip(prompts, responses)):
        g0 = (i // 8) * 8
        for j in rng.sample([j for j in range(g0, g0 + 8) if j != i], 5):
            seqs.append((p + scaffold + responses[j], r))
    return seqs


def test_attention_crossover_of_the_bench_model():
    from transformers import Qwen3Config

    cfg = Qwen3Config(vocab_size=4096, hidden_size=256, intermediate_size=1024, num_hidden_layers=4,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=64, tie_word_embeddings=False)
    cfg.architectures = ["Qwen3ForCausalLM"]
    # (4 * (256*64*(8+4) + 3*256*1024) + 4096*256) / (4 * 2 * 4 * 64)
    assert attention_crossover(cfg) == 2432.0


def test_pack_prefers_short_rows_under_dense_attention():
    seqs = bench_step()
    lens = [len(p) + len(r) for p, r in seqs]
    pk = pack(seqs, 96, pad_id=0, row_len=1024, group_rows=8, attn_len=2432.0)
    # one sequence per row, widest first; blocks of 8 rows trimmed to their widest: 2.6 % padding
    assert pk.batch.num_samples == 640 and pk.batch.seq_len == 288
    assert pk.row_used == sorted(lens, reverse=True)
    assert pk.slots == 120128 and pk.real_tokens == sum(lens) == 117048
    assert abs(pk.pad_frac - (1 - 117048 / 120128)) < 1e-12
    # the layout it replaces: first-fit decreasing rows of 944 (the old choice), blocks of 2 rows
    _, fill = _ffd(lens, sorted(range(len(lens)), key=lambda i: -lens[i]), 944)
    old = _cost([944] * len(fill), 2, 8, 2432.0)
    assert len(fill) == 127 and round(old) == 167734
    assert round(_cost(pk.row_used, 8, 8, 2432.0)) == 129803       # 23 % less
    # every response token lands where target_pos says
    targets = pk.batch.targets.reshape(-1)
    for m, (_, r) in enumerate(seqs):
        assert targets[pk.target_pos[m, :len(r)]].tolist() == r


def test_pack_counts_slots_only_without_attention_cost():
    """attn_len = inf: the fewest slots; six 5-token sequences share a row (one per row: 6 x 8 slots)."""
    seqs = [([1] * 3, [2] * 2)] * 6 + [([1] * 20, [2] * 10)]
    pk = pack(seqs, 10, pad_id=0, row_len=32, multiple=8)
    assert tuple(pk.batch.tokens.shape) == (2, 32) and pk.row_used == [30, 30] and pk.slots == 64
    seg = pk.batch.extras["segment_ids"]
    assert seg[0, :30].tolist() == [6] * 30 and seg[1, :30].tolist() == [m for m in range(6) for _ in range(5)]


def test_width_groups_merge_equal_widths_and_fill_the_pipeline():
    seqs = [([1] * (n - 1), [2]) for n in (38, 9, 33, 40, 20, 18, 17, 30)]
    pk = pack(seqs, 1, pad_id=0, row_len=8, multiple=8, packed=False)
    assert pk.row_used == [40, 38, 33, 30, 20, 18, 17, 9]            # widest first
    assert pk.widths(1) == [40, 40, 40, 32, 24, 24, 24, 16] and pk.widths(2) == [40, 40, 24, 24]
    assert _width_groups(pk, 1, 2, 1) == [(0, 4, 40, 2), (4, 8, 24, 2)]
    assert _width_groups(pk, 2, 1, 1) == [(0, 4, 40, 1), (4, 8, 24, 1)]       # DP 2: a block is 2 rows
    assert _width_groups(pk, 1, 1, 1) == [(0, 3, 40, 1), (3, 4, 32, 1), (4, 7, 24, 1), (7, 8, 16, 1)]
    # two pipeline stages: a range holds >= 2 micro-batches (the 32-wide one takes a 24-wide one along)
    assert _width_groups(pk, 1, 1, 2) == [(0, 3, 40, 1), (3, 5, 32, 1), (5, 7, 24, 1), (7, 8, 16, 1)]
    # a token budget: as many rows as fit at each block's width (80 tokens: 2 rows of 40, 3 of 24), and
    # no more than are left (the last row alone, not padded with 4 copies to fill 5 rows of 16)
    assert _width_groups(pk, 1, TokenBudget(80), 1) == [(0, 4, 40, 2), (4, 7, 24, 3), (7, 8, 16, 1)]


def test_narrow_is_the_inverse_of_pad_to_multiple():
    b = make_batch([[1, 2, 3], [4]], [[5], [6, 7]], pad_id=0,
                   extras={"adv": torch.tensor([1.0, 2.0]), "old": torch.arange(6.0).view(2, 3),
                           "segment_ids": torch.tensor([[0, 0, 0, 0], [1, 1, 1, -1]])})
    wide = b.pad_to_multiple(8)
    assert wide.seq_len == 8 and wide.extras["old"].shape == (2, 7)
    back = wide.narrow(4)
    for k in ("adv", "old", "segment_ids"):
        assert torch.equal(back.extras[k], b.extras[k]), k
    assert torch.equal(back.tokens, b.tokens) and torch.equal(back.loss_mask, b.loss_mask)
