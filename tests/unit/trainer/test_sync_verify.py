"""``rollout.verify_sync``: when a push is verified, what the probe holds, the key's validation and
the stop's exit (the verification itself runs on real runs: tests/e2e/test_verify_sync.py)."""
from __future__ import annotations

import pytest

from megatron_rl.config import load_config
from megatron_rl.trainer.loop.stop import Halted
from megatron_rl.trainer.loop.sync_stage import PROBE_PREFIX, PROBE_PROMPTS, TOLERANCE, probe_prompts, verify_due


@pytest.mark.parametrize("spec, verified, due", [
    ("first", 0, [1, 2, 3]),   # the first push of the process, whatever its step (a resume starts later)
    ("first", 1, []),
    ("never", 0, []),
    ("every:2", 0, [1, 2, 3]),
    ("every:2", 1, [2]),
    ("every:1", 3, [1, 2, 3]),
])
def test_verify_due(spec, verified, due):
    assert [s for s in (1, 2, 3) if verify_due(spec, s, verified)] == due


def test_probe_has_a_shared_multi_block_prefix_within_the_model_length():
    rows = [[1, 10 + i, 11 + i, 12] for i in range(12)]
    probe = probe_prompts(rows, max_model_len=512, max_tokens=8)
    assert probe[:PROBE_PROMPTS] == rows[:PROBE_PROMPTS] and len(probe) == PROBE_PROMPTS + 2
    a, b = probe[-2:]
    assert a[:PROBE_PREFIX] == b[:PROBE_PREFIX] and a[PROBE_PREFIX:] == rows[0] and b[PROBE_PREFIX:] == rows[1]
    assert all(len(p) + 8 <= 512 for p in probe)
    short = probe_prompts(rows, max_model_len=64, max_tokens=8)   # the prefix shrinks to what fits
    assert max(len(p) for p in short) + 8 == 64
    assert probe_prompts(rows[:1], max_model_len=64, max_tokens=8)[-1] == probe_prompts(rows[:1], 64, 8)[-2]
    assert probe_prompts(rows, max_model_len=12, max_tokens=8) == rows[:PROBE_PROMPTS]   # no room: no prefix pair


def test_tolerances_fp32_tighter_than_bf16():
    assert TOLERANCE["float32"][0] < TOLERANCE["bfloat16"][0] and TOLERANCE["float32"][1] < TOLERANCE["bfloat16"][1]


@pytest.mark.parametrize("bad", ["sometimes", "every:0", "every:", "every:x", "First"])
def test_bad_verify_sync_is_rejected(bad):
    with pytest.raises(ValueError, match=r"rollout.verify_sync must be first\|every:N \(N >= 1\)\|never"):
        load_config(None, [f"rollout.verify_sync={bad}"])


def test_good_verify_sync_values_load():
    for v in ("first", "never", "every:3"):
        assert load_config(None, [f"rollout.verify_sync={v}"]).rollout.verify_sync == v


def test_halted_exits_1_with_its_line():
    e = Halted("[megatron-rl] stopped after step 3: why")
    assert e.code == "[megatron-rl] stopped after step 3: why"   # SystemExit(str): the line on stderr, status 1
    assert Halted("x", say=False).code == 1
