"""SCoRe's rollout as one interaction on the agent loop (``trainer/paths/two_attempts.py``, ``self_correct`` of
``agent/interactions.py``), on a real engine (``HFEngine``) and real tokenizers.

Oracles: on the chat fixture's tokenizer, the chat template's own rendering of [system, user, assistant(y1),
user(instruction)] + the generation prompt (``apply_chat_template``) is the context attempt 2 is sampled in;
on the demo's character tokenizer (no template) that context is x1 ++ y1 (its EOS kept) ++ ids("R="), as the
demo's warm start writes it (``cli/demo._score_warm_pairs``). Each case once with y1 ending on EOS (a model whose
EOS embedding is a multiple of the last prompt token's, its layers' outputs zeroed: greedy then answers EOS) and
once cut by ``rollout.max_tokens`` (the random model).
"""
from __future__ import annotations

from types import SimpleNamespace

import pytest

from megatron_rl.algorithms import ScoreHParams
from megatron_rl.rollout.engine import SamplingParams
from megatron_rl.trainer.paths.two_attempts import (
    DEMO_INSTRUCTION,
    attempt_budgets,
    attempts_of,
    instruction_ids,
    second_turn,
)

SYSTEM = {"role": "system", "content": "You are a helpful assistant."}
USER = {"role": "user", "content": "Which is larger, 37 or 52?"}
INSTR = "There might be an error in the solution above. Correct it."
MAX = 4


def _eos_after(d, last_id: int, eos_id: int) -> None:
    """Make the model answer EOS after ``last_id``: residual = embeddings (layer outputs zeroed, final norm 1),
    E[eos] = 10·E[last_id] (tied head: EOS's logit is 10× the last token's own, far above every other here)."""
    import torch
    from transformers import AutoModelForCausalLM

    m = AutoModelForCausalLM.from_pretrained(str(d))
    with torch.no_grad():
        for layer in m.model.layers:
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
        m.model.norm.weight.fill_(1.0)
        e = m.model.embed_tokens.weight
        e[eos_id] = 10 * e[last_id]
    m.save_pretrained(str(d))


@pytest.fixture(scope="module")
def chat(tmp_path_factory):
    from megatron_rl.data.tokenizer import load_tokenizer
    from megatron_rl.rollout.hf_engine import HFEngine
    from tests.helpers.chat_fixture import make_model, train_tokenizer

    out = {}
    for case in ("cut", "eos"):
        d = tmp_path_factory.mktemp(f"score_chat_{case}")
        make_model(d, train_tokenizer(d)).save_pretrained(str(d))
        tok = load_tokenizer(d)
        if case == "eos":
            _eos_after(d, tok.encode(tok.apply_chat_template([SYSTEM, USER], True))[-1], tok.eos_id)
        out[case] = (tok, HFEngine(str(d), max_model_len=256))
    return out


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    from megatron_rl.data.tokenizer import load_tokenizer
    from megatron_rl.rollout.hf_engine import HFEngine
    from tests.helpers.tiny_model import add_char_tokenizer, save_tiny_qwen3

    out = {}
    for case in ("cut", "eos"):
        d = add_char_tokenizer(tmp_path_factory.mktemp(f"score_demo_{case}"), "R 0123456789=")
        tok = load_tokenizer(d)
        save_tiny_qwen3(d, vocab_size=tok.vocab_size, bos_token_id=tok.bos_id, eos_token_id=tok.eos_id,
                        pad_token_id=tok.pad_id)
        if case == "eos":
            _eos_after(d, tok.encode("=")[0], tok.eos_id)
        out[case] = (tok, HFEngine(str(d), max_model_len=64))
    return out


def _rollout(tok, eng, prompt: list[int], turn_ids: list[int], instruction: str, case: str):
    """The SCoRe path's loop and interaction (as ``TwoAttemptsPath`` builds them) on one prompt, 4 samples: the EOS
    model's y1 is EOS alone; the random model's has some cut at MAX tokens."""
    from megatron_rl.agent.loop import agent_loop_class

    loop = agent_loop_class("tool_agent")(tok, None, attempt_budgets(MAX, len(turn_ids)))
    sp = SamplingParams(n=4, temperature=1.0, max_tokens=MAX, seed=5, stop_token_ids=(tok.eos_id,))
    trajs = loop.run(eng, [prompt], sp, None, [{"name": "self_correct", "instruction": instruction, "turn_ids": turn_ids}])
    assert len(trajs) == 4 and all(t.turns == 2 and t.interaction_turns == 1 for t in trajs)
    first = [(t.response_ids[:t.response_mask.index(0)], t.turn_finish[0]) for t in trajs]
    if case == "eos":
        assert first == [([tok.eos_id], "stop")] * 4
    else:
        assert any(f == "length" and len(y1) == MAX and y1[-1] != tok.eos_id for y1, f in first), first
    return trajs


@pytest.mark.parametrize("case", ["cut", "eos"])
def test_chat_correction_turn_is_the_templates_next_user_turn(chat, case):
    tok, eng = chat[case]
    prompt = tok.encode(tok.apply_chat_template([SYSTEM, USER], True))
    turn = second_turn(tok, ScoreHParams(instruction=INSTR))
    for t in _rollout(tok, eng, prompt, list(turn.suffix), INSTR, case):
        k, e = t.turn_starts[1], t.response_mask.index(0)
        y1 = t.response_ids[:e]
        content = tok.tok.decode(y1[:-1] if y1[-1] == tok.eos_id else y1, skip_special_tokens=False)
        want = tok.apply_chat_template([SYSTEM, USER, {"role": "assistant", "content": content},
                                        {"role": "user", "content": INSTR}], True)
        # y1's ids are kept as sampled (a random y1 re-encodes otherwise): the text is the template's, and with an
        # empty content (the EOS case) the ids are its ids too
        assert tok.tok.decode(list(prompt) + t.response_ids[:k], skip_special_tokens=False) == want
        if case == "eos":
            assert content == "" and list(prompt) + t.response_ids[:k] == tok.encode(want)
        assert t.response_mask == [1] * e + [0] * (k - e) + [1] * (len(t.response_ids) - k)
        assert all(lp == 0.0 for lp in t.logprobs[e:k])


@pytest.mark.parametrize("case", ["cut", "eos"])
def test_demo_correction_turn_follows_y1_with_its_eos(demo, case):
    tok, eng = demo[case]
    prompt = tok.encode("R 1234=")
    ids = instruction_ids(tok, ScoreHParams())
    assert ids == tok.encode(DEMO_INSTRUCTION)
    trajs = _rollout(tok, eng, prompt, ids, DEMO_INSTRUCTION, case)
    rows = [SimpleNamespace(prompt_ids=prompt)]
    two = attempts_of(trajs, rows, tok)
    for i, t in enumerate(trajs):
        y1 = two.first.responses[i]
        assert two.second.prompts[i] == prompt + y1 + ids     # y1 WITH its EOS, then "R="
        assert two.second.prompts[i] + two.second.responses[i] == prompt + t.response_ids
