"""BiCC bilateral contexts over token ids, RLCSD hint selection and the teacher prompt template."""
from __future__ import annotations

import random

import pytest
import torch

from megatron_rl.algorithms import (bicc_old_logp, build_bicc_contexts, hint_answer, last_boxed,
                                    rlcsd_teacher_prompt, select_rlcsd_hints, student_prompt)

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


def test_rlcsd_boundary_groups():
    # group 0: one correct (dropped, empty positive pool) + 3 boxed wrong (kept, positive = 0)
    # group 1: one boxed wrong (dropped, W empty) + 2 correct (kept, K = 1)
    # group 2: all correct → dropped; group 3: all wrong → dropped (self_rollout)
    rewards = [1, 0, 0, 0, 0, 1, 1, 1, 1, 0, 0]
    groups = [0, 0, 0, 0, 1, 1, 1, 2, 2, 3, 3]
    box = [True] * 11
    sel = select_rlcsd_hints(rewards, groups, box, rng=random.Random(3))
    by = {a.target: a for a in sel.assignments}
    assert sorted(by) == [1, 2, 3, 5, 6]
    assert all(by[i].positive == 0 for i in (1, 2, 3))
    assert sorted(by[1].negatives) == [2, 3] and by[5].negatives == (4,) and by[5].positive == 6
    assert sel.dropped_groups == 2 and sel.dropped_targets == 2
    gt = select_rlcsd_hints(rewards, groups, box, source="gt_cot")
    assert {a.target for a in gt.assignments} >= {9, 10, 0}  # all-wrong group kept under gt_cot
    assert all(a.positive is None for a in gt.assignments)


def test_rlcsd_sampling_is_uniform_over_the_pool():
    counts = {2: 0, 3: 0, 4: 0}
    rng = random.Random(0)
    for _ in range(3000):
        a = select_rlcsd_hints([1, 1, 0, 0, 0], [0] * 5, [True] * 5, k_max=1, rng=rng).assignments[0]
        counts[a.negatives[0]] += 1
    assert all(900 < c < 1100 for c in counts.values()), counts


def test_teacher_prompt_symmetry_and_answers():
    good = rlcsd_teacher_prompt("What is 2+2?", "2+2=4", "4")
    bad = rlcsd_teacher_prompt("What is 2+2?", "2+2=5", "5")
    assert good.startswith("Problem: What is 2+2?\n\n")
    assert "=== Reference Solution Begin ===" in good and "=== Reference Solution End ===" in good
    assert good.replace("2+2=4", "X").replace("answer: 4", "answer: Y") == \
        bad.replace("2+2=5", "X").replace("answer: 5", "answer: Y")
    assert "Correct final answer: 5" in bad  # wrong hints keep the same label
    assert good.endswith("\\boxed{}.") and student_prompt("Q").endswith("\\boxed{}.")
    assert student_prompt("Q").startswith("Problem: Q") and student_prompt("Q", train=False).startswith("Q")
    assert last_boxed(r"a \boxed{1} b \boxed{\frac{1}{2}} c") == r"\frac{1}{2}"
    assert hint_answer("no box here", "42") == "42" and hint_answer(r"\boxed{7}", "42") == "7"
