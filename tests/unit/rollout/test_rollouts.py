"""The tensor ``Rollouts`` (issue 41): built from the engines' completions it reads back exactly what they
held; select / concat keep every per-token and per-sample field aligned; texts decoded in one batch equal
HF's own per-sample ``decode``; a batch survives the out-of-band pickling of ``runtime/broadcast.py``
bit for bit; rewards scored beside the log-prob passes equal those scored before them."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from megatron_rl.data.dataset import PromptRow
from megatron_rl.rewards.manager import RewardManager
from megatron_rl.rollout import rollouts as R
from megatron_rl.rollout.engine import Completion
from megatron_rl.rollout.pending_rewards import PendingRewards
from megatron_rl.runtime import broadcast as B


def _comps(rng, prompts: int = 3, n: int = 2) -> list[Completion]:
    out = []
    for i in range(prompts):
        p = tuple(rng.integers(0, 300, int(rng.integers(1, 6))).tolist())
        for j in range(n):
            k = int(rng.integers(1, 9))
            lp = tuple(float(x) for x in (-rng.exponential(1.0, k)).astype(np.float32))   # fp32 values, as vLLM's
            out.append(Completion(i, j, p, tuple(rng.integers(0, 300, k).tolist()), lp, "stop" if k < 8 else "length"))
    return out


def test_from_completions_reads_back_what_the_engine_returned(chat_tokenizer):
    comps = _comps(np.random.default_rng(0))
    rows = [PromptRow(i, (), "math", "1", {}) for i in range(3)]
    ro = R.from_completions(rows, comps, chat_tokenizer)
    assert ro.prompt_ids.dtype == ro.response_ids.dtype == torch.int32 and ro.response_logp.dtype == torch.float32
    assert ro.prompts == [list(c.prompt_ids) for c in comps]
    assert ro.responses == [list(c.response_ids) for c in comps]
    assert ro.rollout_logp == [list(c.logprobs) for c in comps]          # exact: fp32 values stored in fp32
    assert ro.group_ids.tolist() == [c.prompt_index for c in comps] and ro.rows == [rows[c.prompt_index] for c in comps]
    assert ro.finish == [c.finish_reason for c in comps] and len(ro) == len(comps)
    assert ro.texts == [chat_tokenizer.tok.decode(list(c.response_ids), skip_special_tokens=True) for c in comps]
    assert [ro.response(i) for i in range(len(ro))] == ro.responses
    with pytest.raises(RuntimeError, match="empty response for sample 1"):
        R.from_completions(rows, [comps[0], dataclasses.replace(comps[1], response_ids=(), logprobs=())], None)
    # the vLLM engines' float32 arrays (rollout/vllm_requests.py): the same buffer, bit for bit
    arrays = [dataclasses.replace(c, logprobs=np.asarray(c.logprobs, dtype=np.float32)) for c in comps]
    assert R.from_completions(rows, arrays, None).response_logp.view(torch.int32).equal(ro.response_logp.view(torch.int32))
    with pytest.raises(RuntimeError, match="engine returned 1 log-probs for the 2 tokens of sample 0"):
        R.from_completions(rows, [dataclasses.replace(comps[0], response_ids=(1, 2), logprobs=np.zeros(1, np.float32))], None)


def test_select_and_concat_keep_the_fields_aligned():
    comps = _comps(np.random.default_rng(1), prompts=4)
    ro = R.from_completions([None] * 4, comps, None)
    ro.rewards, ro.correct = torch.arange(8, dtype=torch.float32), torch.arange(8) % 2 == 0
    idx = [5, 0, 4, 3]
    sub = ro.select(idx)
    assert sub.responses == [ro.responses[i] for i in idx] and sub.prompts == [ro.prompts[i] for i in idx]
    assert sub.rollout_logp == [ro.rollout_logp[i] for i in idx]
    assert sub.group_ids.tolist() == [0, 1, 0, 2]                         # dense, in order of appearance
    assert sub.rewards.tolist() == [5.0, 0.0, 4.0, 3.0] and sub.correct.tolist() == [False, True, True, False]
    assert len(ro.select([])) == 0 and ro.select([]).response_offsets.tolist() == [0]
    both = R.concat([sub, ro.select([1, 2])])
    assert both.responses == sub.responses + [ro.responses[1], ro.responses[2]]
    assert both.group_ids.tolist() == [0, 1, 0, 2, 3, 4] and both.rewards.tolist() == [5.0, 0.0, 4.0, 3.0, 1.0, 2.0]
    sub.greedy_rewards = torch.zeros(4)
    with pytest.raises(ValueError, match="greedy_rewards is set in some generation rounds"):
        R.concat([sub, ro.select([1])])


def test_tensors_travel_outside_the_pickle_bit_for_bit():
    ro = R.from_completions([None] * 6, _comps(np.random.default_rng(2)), None)
    ro.rewards, ro.correct = torch.tensor([0.1, float("nan"), -0.0, 1e-40, 3.0, 2.0]), torch.tensor([True, False] * 3)
    ro.texts = ["a", "é😀", "", "x\udc80", "\x00b", "z" * 300]   # non-ASCII, a lone surrogate, a NUL
    obj = {"ro": ro, "view": torch.arange(12.0).reshape(3, 4)[:, 1], "empty": torch.zeros(0, 2, dtype=torch.int64)}
    skeleton, tensors = B.split_tensors(obj)
    flat, spec = B.pack(tensors)
    back = B.join_tensors(skeleton, B.unpack(flat.clone(), spec))
    assert all(off % 16 == 0 for _, _, off in spec)
    for f in dataclasses.fields(ro):
        a, b = getattr(ro, f.name), getattr(back["ro"], f.name)
        if f.name == "texts":             # one UTF-8 buffer, decoded when read
            assert isinstance(b, R.Texts) and b == a and [b[i] for i in range(6)] == a and b[-1] == a[-1]
        elif isinstance(a, torch.Tensor):   # same bytes (NaN, -0.0 and a subnormal included)
            assert a.dtype == b.dtype and a.shape == b.shape and a.view(torch.uint8).equal(b.view(torch.uint8)), f.name
        else:
            assert a == b, f.name
    assert back["view"].tolist() == [1.0, 5.0, 9.0] and back["empty"].shape == (0, 2)
    assert len(skeleton) < 2000                                           # the token data is not in it


def test_rewards_scored_beside_the_passes_equal_the_inline_ones():
    comps = _comps(np.random.default_rng(3))
    rows = [PromptRow(i, (), "reverse", "x", {}) for i in range(3)]
    texts = ["x", " x ", "y", "x", "", "x"]
    inline = R.score(dataclasses.replace(R.from_completions(rows, comps, None), texts=texts), RewardManager())
    ro = dataclasses.replace(R.from_completions(rows, comps, None), texts=texts)
    pending = PendingRewards()
    pending.start(ro, RewardManager(), shape=lambda r: dataclasses.replace(r, stats={**r.stats, "shaped": 1.0}))
    with pytest.raises(RuntimeError, match="never joined"):
        pending.start(ro, RewardManager())
    assert ro.rewards is None                                             # nothing lands before the join
    assert pending.finish(ro, is_driver=True) >= 0.0
    assert ro.rewards.tolist() == inline.rewards.tolist() == [1.0, 1.0, 0.0, 1.0, 0.0, 1.0]
    assert ro.correct.tolist() == inline.correct.tolist() and ro.stats == {**inline.stats, "shaped": 1.0}
    pending.close()


def test_rollout_sequences_equal_the_list_built_batch():
    """``sequences.rollout_sequences`` (from the flat buffers) against ``build_seq_batch`` of the lists
    (the pipeline's builder before issue 41): the same tensors, responses longer than the frame cut."""
    from types import SimpleNamespace

    from megatron_rl.trainer.contract import UpdateContext
    from megatron_rl.trainer.pipeline.sequences import build_seq_batch, rollout_sequences

    ro = R.from_completions([None] * 3, _comps(np.random.default_rng(4), prompts=3), None)
    for max_resp in (8, 5):
        ctx = UpdateContext(None, SimpleNamespace(tp=1), 0, None, SimpleNamespace(rollout=SimpleNamespace(max_tokens=max_resp)),
                            SimpleNamespace(pad_id=299))
        got = rollout_sequences(ctx, ro)
        want = build_seq_batch(ro.prompts, ro.responses, 299, ctx.seq_len(ro.prompts, ro.responses), max_resp)
        assert got.batch.tokens.shape[1] % 8 == 0
        for a, b in ((got.batch.tokens, want.batch.tokens), (got.batch.loss_mask, want.batch.loss_mask),
                     (got.resp_pos, want.resp_pos), (got.resp_mask, want.resp_mask),
                     (got.batch.extras["resp_pos"], want.batch.extras["resp_pos"])):
            assert a.dtype == b.dtype and torch.equal(a, b)
        assert sorted(got.batch.extras) == sorted(want.batch.extras)
