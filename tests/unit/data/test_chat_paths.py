"""Data paths on the chat-template fixture's tokenizer: the exact token layouts the trainer builds,
decoded with special tokens and compared with what the chat template renders (issue 9 fixes 1-3)."""
from __future__ import annotations

import dataclasses

import pytest
import torch

from megatron_rl.algorithms import BiCCHParams, ScoreHParams
from megatron_rl.data import chat
from megatron_rl.data.dataset import PromptRow
from megatron_rl.rewards.problem import problem_text
from megatron_rl.rollout import rollouts as R
from megatron_rl.trainer.paths.bicc import BiccLayout, bicc_inputs
from megatron_rl.trainer.paths.two_attempts import second_turn
from tests.helpers.chat_fixture import messages, solution


def raw(tok, ids) -> str:
    return tok.tok.decode(list(ids), skip_special_tokens=False)


def render(tok, msgs, gen=True) -> str:
    return tok.apply_chat_template(msgs, add_generation_prompt=gen)


def enc(tok, text: str, eos: bool = True) -> list[int]:
    return tok.encode(text) + ([tok.eos_id] if eos else [])


WRONG1 = "<think>\n37 > 52\n</think>\n\n\\boxed{37}"
WRONG2 = "<think>\n52 > 37\n</think>\n\n\\boxed{25}"


def _group(tok):
    msgs = messages(37, 52)
    prompt = tok.encode(render(tok, msgs))
    resps = [enc(tok, solution(37, 52)), enc(tok, WRONG1), enc(tok, WRONG2)]
    rows = [PromptRow(0, tuple(prompt), "math", "52", {}, tuple(msgs))] * 3
    ro = R.Rollouts.from_lists(rows, [list(prompt)] * 3, resps, [[0.0] * len(r) for r in resps], ["stop"] * 3,
                    torch.zeros(3, dtype=torch.long), [], rewards=torch.tensor([1.0, 0.0, 0.0]),
                    correct=torch.tensor([True, False, False]))
    return msgs, ro


def test_bicc_traces_go_inside_the_user_turn(chat_tokenizer):
    tok = chat_tokenizer
    msgs, ro = _group(tok)
    layout = BiccLayout.of(tok)
    prompts, n_cond, n_fb = bicc_inputs(ro, BiCCHParams(context_frac=0.9), 200, 400, layout, tok.eos_id)
    assert (n_cond, n_fb) == (3, 0)
    user = msgs[1]["content"]
    # the correct target sees both wrong traces; each wrong target sees the correct one
    want0 = dict(msgs[1], content=user + chat.BICC_HEADER + WRONG1 + chat.BICC_DELIMITER + WRONG2 + chat.BICC_DELIMITER)
    want1 = dict(msgs[1], content=user + chat.BICC_HEADER + solution(37, 52) + chat.BICC_DELIMITER)
    assert raw(tok, prompts[0] + ro.responses[0]) == render(tok, [msgs[0], want0]) + solution(37, 52) + "<|im_end|>"
    assert raw(tok, prompts[1] + ro.responses[1]) == render(tok, [msgs[0], want1]) + WRONG1 + "<|im_end|>"
    # before the fix the traces were appended after "<|im_start|>assistant\n" with no header
    assert not raw(tok, prompts[0]).endswith(WRONG2 + chat.BICC_DELIMITER)


def test_bicc_budget_cuts_the_last_trace_not_the_target(chat_tokenizer):
    tok = chat_tokenizer
    msgs, ro = _group(tok)
    layout = BiccLayout.of(tok)
    l_max = 2 * (len(layout.header) + 5)      # budget floor(0.5 * l_max) = header + 5 trace tokens
    prompts, _, _ = bicc_inputs(ro, BiCCHParams(context_frac=0.5), l_max, 400, layout, tok.eos_id)
    want = dict(msgs[1], content=msgs[1]["content"] + chat.BICC_HEADER + raw(tok, ro.responses[1][:5]))
    assert raw(tok, prompts[0]) == render(tok, [msgs[0], want])
    assert prompts[0][-len(layout.turn_end.tail):] == list(layout.turn_end.tail)


def test_user_turn_end_rejects_a_prompt_without_generation_prompt(chat_tokenizer):
    tok = chat_tokenizer
    te = chat.UserTurnEnd.of(tok)
    assert raw(tok, te.tail) == "<|im_end|>\n<|im_start|>assistant\n"
    with pytest.raises(ValueError, match="end-of-user-turn"):
        te.insert_point(tok.encode(render(tok, messages(1, 2), gen=False)))


@pytest.mark.parametrize("truncated", [False, True], ids=["y1-ended", "y1-truncated"])
def test_score_second_prompt_is_the_template_over_four_turns(chat_tokenizer, truncated):
    tok = chat_tokenizer
    msgs = messages(37, 52)
    x1 = tok.encode(render(tok, msgs))
    y1 = enc(tok, WRONG1)
    if truncated:
        y1 = y1[:6]
    y1_text = raw(tok, y1).removesuffix("<|im_end|>")
    turn = second_turn(tok, ScoreHParams(instruction="Check your answer."))
    x2 = turn.second_prompt(x1, y1, tok.eos_id)
    want = msgs + [{"role": "assistant", "content": y1_text}, {"role": "user", "content": "Check your answer."}]
    assert raw(tok, x2) == render(tok, want)
    # y1's sampled ids sit verbatim right after x1 (its EOS shared with the closing <|im_end|>)
    assert x2[:len(x1) + len(y1)] == x1 + y1


def test_score_start_up_errors(chat_tokenizer):
    with pytest.raises(ValueError, match="instruction is empty"):
        second_turn(chat_tokenizer, ScoreHParams(instruction=""))
    with pytest.raises(ValueError, match="raise max_model_len"):
        second_turn(chat_tokenizer, ScoreHParams(instruction="again"), 64, 32, 128)


def test_grader_problem_text_precedence():
    msgs = ({"role": "system", "content": "sys"}, {"role": "user", "content": "What is 2+2?"})
    row = PromptRow(0, (1, 2, 3), "math", "4", {}, msgs)
    assert problem_text(row) == "What is 2+2?"          # never the token ids
    assert problem_text(dataclasses.replace(row, extra_info={"question": "Q"})) == "Q"
    assert problem_text(dataclasses.replace(row, extra_info={"question": "Q", "problem": "P"})) == "P"
    with pytest.raises(ValueError, match="no user message"):
        problem_text(dataclasses.replace(row, messages=()))


def test_dataset_keeps_messages_and_question(chat_tokenizer, tmp_path):
    from megatron_rl.data.dataset import PromptDataset
    from tests.helpers.chat_fixture import write_chat_task

    paths = write_chat_task(tmp_path, sizes={"train": 8})
    ds = PromptDataset.from_parquet(paths["train"], chat_tokenizer, 128)
    r = ds[0]
    assert r.messages[1]["role"] == "user" and r.extra_info["question"] == r.messages[1]["content"]
    assert raw(chat_tokenizer, r.prompt_ids) == render(chat_tokenizer, list(r.messages))
