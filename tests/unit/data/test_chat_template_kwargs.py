"""``data.chat_template_kwargs`` reach every place a prompt is rendered through the chat template:
training (and in-training validation) prompts, eval prompts, BiCC contexts, teacher prompts and
SCoRe's second turn. On the chat fixture, whose template reads Qwen3's ``enable_thinking``
(``tests/helpers/chat_fixture.py``), ``enable_thinking=false`` opens every answer with an empty think block;
each layout is decoded with special tokens and compared with the expected text."""
from __future__ import annotations

import pytest
import torch

from megatron_rl.algorithms import BiCCHParams, ScoreHParams
from megatron_rl.data import chat
from megatron_rl.data.dataset import PromptDataset
from megatron_rl.data.tokenizer import load_tokenizer
from megatron_rl.rollout import rollouts as R
from megatron_rl.trainer.paths.bicc import BiccLayout, bicc_inputs
from megatron_rl.trainer.paths.teacher.inputs import ChatHintTemplate
from megatron_rl.trainer.paths.two_attempts import second_turn
from tests.helpers.chat_fixture import SYSTEM, question, solution, write_chat_task

OFF = "<think>\n\n</think>\n\n"
GEN = "<|im_start|>assistant\n"


@pytest.fixture(scope="module")
def toks(chat_tokenizer):
    d = chat_tokenizer.tok.name_or_path
    return {"default": chat_tokenizer, "on": load_tokenizer(d, {"enable_thinking": True}),
            "off": load_tokenizer(d, {"enable_thinking": False})}


@pytest.fixture(scope="module")
def task(tmp_path_factory):
    return write_chat_task(tmp_path_factory.mktemp("chat_kwargs"), sizes={"train": 4})["train"]


def raw(tok, ids) -> str:
    return tok.tok.decode(list(ids), skip_special_tokens=False)


def _user(q: str) -> str:
    return f"<|im_start|>system\n{SYSTEM}<|im_end|>\n<|im_start|>user\n{q}<|im_end|>\n"


@pytest.mark.parametrize(("mode", "opening"), [("default", GEN), ("on", GEN), ("off", GEN + OFF)])
def test_training_and_eval_prompts(toks, task, mode, opening):
    """The dataset (training prompts; in-training validation and ``megatron-rl eval`` load theirs the same
    way, from the tokenizer built with the run's / ``--chat-template-kwargs`` options)."""
    ds = PromptDataset.from_parquet(task, toks[mode], 256)
    q = ds[0].messages[1]["content"]
    assert raw(toks[mode], ds[0].prompt_ids) == _user(q) + opening


def test_bicc_context_stays_inside_the_user_turn(toks, task):
    tok = toks["off"]
    row = PromptDataset.from_parquet(task, tok, 256)[0]
    q = row.messages[1]["content"]
    wrong = "<think>\nno\n</think>\n\n\\boxed{1}"
    resps = [tok.encode(solution(37, 52)) + [tok.eos_id], tok.encode(wrong) + [tok.eos_id]]
    ro = R.Rollouts.from_lists([row] * 2, [list(row.prompt_ids)] * 2, resps, [[0.0] * len(r) for r in resps], ["stop"] * 2,
                    torch.zeros(2, dtype=torch.long), [], rewards=torch.tensor([1.0, 0.0]),
                    correct=torch.tensor([True, False]))
    layout = BiccLayout.of(tok)
    assert raw(tok, layout.turn_end.tail) == "<|im_end|>\n" + GEN + OFF
    prompts, n_cond, _ = bicc_inputs(ro, BiCCHParams(context_frac=0.9), 200, 400, layout, tok.eos_id)
    assert n_cond == 2
    assert raw(tok, prompts[0]) == _user(q + chat.BICC_HEADER + wrong + chat.BICC_DELIMITER) + GEN + OFF


def test_teacher_prompt(toks, task):
    tok = toks["off"]
    row = PromptDataset.from_parquet(task, tok, 256)[0]
    text = raw(tok, ChatHintTemplate(tok, add_bos=False).prompt(row, "52", "52"))
    assert text.startswith("<|im_start|>user\n") and text.endswith("<|im_end|>\n" + GEN + OFF)
    on = raw(toks["on"], ChatHintTemplate(toks["on"], add_bos=False).prompt(row, "52", "52"))
    assert on == text.removesuffix(OFF)


def test_score_second_turn(toks):
    tok = toks["off"]
    q = question(37, 52)
    x1 = tok.encode(_user(q) + GEN + OFF)
    y1 = tok.encode("\\boxed{37}") + [tok.eos_id]
    x2 = second_turn(tok, ScoreHParams(instruction="Check your answer.")).second_prompt(x1, y1, tok.eos_id)
    assert raw(tok, x2) == (_user(q) + GEN + OFF + "\\boxed{37}<|im_end|>\n<|im_start|>user\nCheck your answer."
                            "<|im_end|>\n" + GEN + OFF)
    assert x2[:len(x1) + len(y1)] == x1 + y1


def test_options_without_a_template_are_refused(tmp_path):
    from megatron_rl.data.tokenizer import SentencePieceTokenizer

    SentencePieceTokenizer.train(["abc def"] * 50, tmp_path, vocab_size=12)
    with pytest.raises(ValueError, match="no chat template"):
        load_tokenizer(tmp_path, {"enable_thinking": True})
