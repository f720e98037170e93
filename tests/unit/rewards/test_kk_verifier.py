"""The ``kk`` reward on the RLCSD and Logic-RL answer formats (zhiyuanhubj/Logic-RL kk.py: ``<answer>``
block, "(1) Zoey is a knight" lines, ground truth ``solution_text_format`` text or the row dict):
permutations, partial and extra people, hedges, self-contradictions, missing tags, case."""
from __future__ import annotations

import pytest

from megatron_rl.rewards.knights_knaves import kk_verdict
from megatron_rl.rewards.manager import RewardManager, get_reward

SOL_TEXT = "(1) Zoey is a knight\n(2) Oliver is a knave\n(3) Ethan is a knight"
LOGIC_RL_GT = {"solution_text_format": SOL_TEXT,
               "statements": "Zoey said: Oliver is a knave. Oliver said: Zoey is a knave and Ethan is a knave. Ethan said: Zoey is a knight."}
GTS = {"logicrl_dict": LOGIC_RL_GT, "logicrl_text": SOL_TEXT, "roles": {"Zoey": "knight", "Oliver": "knave", "Ethan": "knight"},
       "rlcsd_text": "Zoey is a knight, Oliver is a knave, Ethan is a knight"}
THINK = "<think>Assume Zoey is a knave. Then Oliver is a knight ... contradiction, so Zoey is a knight.</think>\n"
RIGHT_LINES = "(1) Zoey is a knight\n(2) Oliver is a knave\n(3) Ethan is a knight"

CASES = [  # (kind, response, expected)
    # ---- formats (Logic-RL answer block, RLCSD box, the three RLCSD phrasings)
    ("format", THINK + f"<answer>\n{RIGHT_LINES}\n</answer>", 1),
    ("format", THINK + "<answer>(1) Zoey is a knight (2) Oliver is a knave (3) Ethan is a knight</answer>", 1),
    ("format", "So: \\boxed{Zoey is a knight, Oliver is a knave, Ethan is a knight}", 1),
    ("format", "\\boxed{Zoey = knight, Oliver = knave, Ethan = knight}", 1),
    ("format", "\\boxed{Zoey: knight, Oliver: knave, Ethan: knight}", 1),
    ("format", "\\boxed{Zoey: Knight; Oliver = knave; Ethan is an knight}", 1),
    ("format", "<answer>Zoey: knight\nOliver: knave\nEthan: knight</answer>", 1),
    ("format", "<answer>\\boxed{Zoey is a knight, Oliver is a knave, Ethan is a knight}</answer>", 1),
    ("format", "\\boxed{Zoey is a knight, Oliver is a knave, Ethan is a knave}", 0),
    ("format", f"<answer>{RIGHT_LINES.replace('Oliver is a knave', 'Oliver is a knight')}</answer>", 0),
    # ---- permutations
    ("permutation", "<answer>(1) Ethan is a knight\n(2) Zoey is a knight\n(3) Oliver is a knave</answer>", 1),
    ("permutation", "\\boxed{Oliver is a knave, Ethan is a knight, Zoey is a knight}", 1),
    ("permutation", "\\boxed{Ethan = knight, Oliver = knave, Zoey = knight}", 1),
    ("permutation", "\\boxed{Ethan is a knave, Oliver is a knight, Zoey is a knight}", 0),
    ("permutation", "<answer>(1) Oliver is a knight\n(2) Zoey is a knave\n(3) Ethan is a knight</answer>", 0),
    # ---- partial and extra people
    ("partial", "\\boxed{Zoey is a knight, Oliver is a knave}", 0),
    ("partial", "<answer>(1) Zoey is a knight\n(2) Oliver is a knave</answer>", 0),
    ("partial", "<answer>(1) Zoey is a knight</answer>", 0),
    ("partial", "\\boxed{Zoey is a knight}", 0),
    ("extra", "\\boxed{Zoey is a knight, Oliver is a knave, Ethan is a knight, Mia is a knave}", 0),
    ("extra", f"<answer>{RIGHT_LINES}\n(4) Liam is a knight</answer>", 0),
    ("extra", "\\boxed{Zoey: knight, Oliver: knave, Ethan: knight, Ava: knight}", 0),
    # ---- hedges
    ("hedge", "\\boxed{Zoey is a knight or a knave, Oliver is a knave, Ethan is a knight}", 0),
    ("hedge", "<answer>(1) Zoey is a knight\n(2) Oliver is a knave or a knight\n(3) Ethan is a knight</answer>", 0),
    ("hedge", "\\boxed{Zoey is either a knight or a knave, Oliver is a knave, Ethan is a knight}", 0),
    ("hedge", "\\boxed{Zoey: knight/knave, Oliver: knave, Ethan: knight}", 0),
    ("hedge", "<answer>Zoey is a knight, Oliver is a knave, Ethan is a knight or knave</answer>", 0),
    ("hedge", "\\boxed{Zoey is a knight, Oliver is a knave, Ethan is a knights or knaves}", 0),
    ("hedge", "\\boxed{Zoey is a knight or perhaps a knave, Oliver is a knave, Ethan is a knight}", 0),
    # ---- self-contradictions
    ("contradiction", "\\boxed{Zoey is a knight, Oliver is a knave, Ethan is a knight. Actually, Zoey is a knave}", 0),
    ("contradiction", f"<answer>{RIGHT_LINES}\n(4) Zoey is a knave</answer>", 0),
    ("contradiction", "\\boxed{Zoey is a knight, Zoey is a knave, Oliver is a knave, Ethan is a knight}", 0),
    ("contradiction", "\\boxed{Zoey = knight, Oliver = knave, Ethan = knight, Oliver = knight}", 0),
    ("contradiction", "<answer>Zoey: knight, Oliver: knave, Ethan: knight, zoey: knave</answer>", 0),
    ("contradiction", "\\boxed{Zoey is a knight, Oliver is a knave, Ethan is a knight, Ethan is a knight}", 1),  # repeated, same role
    # ---- the last answer counts, refuted hypotheses outside it do not; no whole-response fallback
    ("last", "Suppose Zoey is a knave, Oliver is a knight, Ethan is a knave. That fails.\n"
             "\\boxed{Zoey is a knight, Oliver is a knave, Ethan is a knight}", 1),
    ("last", "\\boxed{Zoey is a knave, Oliver is a knight, Ethan is a knave} wait, recheck: "
             "\\boxed{Zoey is a knight, Oliver is a knave, Ethan is a knight}", 1),
    ("last", "\\boxed{Zoey is a knight, Oliver is a knave, Ethan is a knight} Hmm, no: "
             "\\boxed{Zoey is a knave, Oliver is a knave, Ethan is a knight}", 0),
    ("last", "<answer>(1) Zoey is a knave\n(2) Oliver is a knight\n(3) Ethan is a knave</answer>\nOn reflection "
             f"<answer>{RIGHT_LINES}</answer>", 1),
    ("last", "\\boxed{Zoey is a knave, Oliver is a knave, Ethan is a knight}\n" f"<answer>{RIGHT_LINES}</answer>", 1),
    # ---- missing tags / no answer
    ("missing", f"{RIGHT_LINES}", 0),                                          # no box, no block: not the whole text
    ("missing", THINK + f"{RIGHT_LINES}", 0),
    ("missing", f"<answer>{RIGHT_LINES}", 0),                                  # unclosed block
    ("missing", f"{RIGHT_LINES}</answer>", 0),
    ("missing", "<think>\\boxed{Zoey is a knight, Oliver is a knave, Ethan is a knight}</think> I am unsure.", 0),
    ("missing", "Zoey is a knave. Oliver is a knight.\n<answer></answer>", 0),
    ("missing", "", 0),
    # ---- case
    ("case", "\\boxed{zoey is a knight, oliver is a knave, ethan is a knight}", 1),
    ("case", "\\boxed{ZOEY IS A KNIGHT, OLIVER IS A KNAVE, ETHAN IS A KNIGHT}", 1),
    ("case", "<ANSWER>Zoey is a Knight, Oliver is a Knave, Ethan is a Knight</ANSWER>", 1),
    ("case", "<answer>(1) zoey is a knight\n(2) OLIVER IS A KNAVE\n(3) Ethan Is A Knight</answer>", 1),
    ("case", "\\boxed{zoey = KNIGHT, oliver = KNAVE, ethan = knave}", 0),
    ("case", "\\boxed{Zoey is a knight. He is telling the truth. Oliver is a knave, Ethan is a knight}", 1),
]


@pytest.mark.parametrize("gt", sorted(GTS))
def test_kk_cases_on_every_ground_truth_form(gt):
    """>= 50 cases x 4 ground-truth forms: at least 48 right per form and no hedged, contradictory or
    tag-less answer accepted."""
    assert len(CASES) >= 50
    wrong = [(k, r, e) for k, r, e in CASES if get_reward("kk")(r, GTS[gt]) != e]
    assert len(CASES) - len(wrong) >= 48, wrong
    accepted_bad = [(k, r) for k, r, e in CASES if k in ("hedge", "contradiction", "missing") and not e
                    and get_reward("kk")(r, GTS[gt]) != 0.0]
    assert not accepted_bad
    assert not wrong, wrong


def test_reasons_and_the_reference_rule():
    assert kk_verdict("\\boxed{Zoey is a knight or a knave, Oliver is a knave, Ethan is a knight}", SOL_TEXT).reason == "hedged"
    assert kk_verdict("\\boxed{Zoey is a knight, Zoey is a knave, Oliver is a knave, Ethan is a knight}",
                      SOL_TEXT).reason == "contradiction"
    assert kk_verdict(RIGHT_LINES, SOL_TEXT).reason == "no answer found"
    # the RLCSD reference (``kk_rlcsd``): the first occurrence of a name wins, box only
    ref = get_reward("kk_rlcsd")
    assert ref("\\boxed{Zoey is a knight, Zoey is a knave, Oliver is a knave, Ethan is a knight}", SOL_TEXT) == 1.0
    assert ref(f"<answer>{RIGHT_LINES}</answer>", SOL_TEXT) == 0.0
    with pytest.raises(ValueError, match="empty or unreadable"):
        kk_verdict("\\boxed{Zoey is a knight}", {"solution_text_format": "", "statements": ""})


@pytest.mark.parametrize("source", ["kk_logic", "kk", "knights_knaves", "kk_4to8", "kk_4to8_test", "kk_9", "kk_10", "kk_11"])
def test_kk_data_sources_map_to_kk(source):
    from megatron_rl.data.dataset import PromptRow

    rb = RewardManager().score([PromptRow(0, (1,), source, LOGIC_RL_GT, {})], [f"<answer>{RIGHT_LINES}</answer>"])
    assert rb.reward.tolist() == [1.0]
