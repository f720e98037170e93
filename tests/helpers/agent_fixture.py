"""A tiny chat model whose tokenizer carries a real tool-calling chat template, for the agent-loop tests.

The tokenizer is the chat fixture's (byte-level BPE with Qwen's special tokens, ``tests/helpers/chat_fixture.py``,
~2 s); its template is replaced by the Qwen3-family tool template vLLM ships
(``vllm/transformers_utils/chat_templates/template_minicpmv45.jinja``: ``<tools>`` in the system turn,
``<tool_call>`` blocks for an assistant message's ``tool_calls``, consecutive ``tool`` messages in one
``<|im_start|>user`` turn as ``<tool_response>`` blocks, Qwen3's ``enable_thinking`` and its dropping of
empty think blocks in earlier turns): the oracle the loop's tokens are compared with, written by neither side.
The model: a random 2-layer Qwen3 of that vocabulary (``chat_fixture.make_model``).
"""
from __future__ import annotations

import importlib.util
from pathlib import Path


def qwen3_tool_template() -> str:
    spec = importlib.util.find_spec("vllm")     # the file only: importing vllm is not needed
    return (Path(spec.origin).parent / "transformers_utils" / "chat_templates" / "template_minicpmv45.jinja").read_text()


def build_tool_model(d: Path, vocab_size: int = 384, extra_text: tuple[str, ...] = ()) -> Path:
    """Tokenizer (with the tool template; ``vocab_size`` / ``extra_text``: ``chat_fixture.train_tokenizer``'s)
    + random tiny Qwen3 saved in ``d``; returns ``d``."""
    from tests.helpers.chat_fixture import make_model, train_tokenizer

    d = Path(d)
    fast = train_tokenizer(d, vocab_size=vocab_size, extra_text=extra_text)
    fast.chat_template = qwen3_tool_template()
    fast.save_pretrained(str(d))
    make_model(d, fast).save_pretrained(str(d))
    return d


def conversation_ids(tok, prompt_ids, call: str, response: str, answer: str) -> tuple[list[int], list[int]]:
    """The token ids the agent loop builds for [prompt, a turn writing ``call``, the tool's ``response``, a turn
    writing ``answer``] (``agent/loop.py``'s construction) and the mask of the two assistant turns."""
    from megatron_rl.agent.loop import generation_prompt_ids
    from megatron_rl.agent.tool_calls import IM_END, render_tool_responses

    im_end = tok.encode(IM_END)
    turn1, obs = tok.encode(call) + im_end, tok.encode("\n" + render_tool_responses([response], None))
    turn2 = tok.encode(answer) + im_end
    ids = list(prompt_ids) + turn1 + obs + generation_prompt_ids(tok) + turn2
    mask = [0] * len(prompt_ids) + [1] * len(turn1) + [0] * (len(obs) + len(generation_prompt_ids(tok))) + [1] * len(turn2)
    return ids, mask


def warm_start(d: Path, seqs: list[tuple[list[int], list[int]]], steps: int = 300, lr: float = 3e-3, seed: int = 0) -> float:
    """Plain-torch SFT of the HF model in ``d`` on ``seqs`` (ids, mask: the loss on mask-1 targets), saved in
    place; returns the last loss (nats per target token)."""
    import torch
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_pretrained(str(d), dtype=torch.float32)
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    n = max(len(s) for s, _ in seqs)
    ids = torch.tensor([s + [0] * (n - len(s)) for s, _ in seqs])
    m = torch.tensor([k + [0] * (n - len(k)) for _, k in seqs], dtype=torch.float32)[:, 1:]
    loss = torch.tensor(0.0)
    for _ in range(steps):
        logp = torch.log_softmax(model(ids).logits[:, :-1].float(), -1).gather(-1, ids[:, 1:, None])[..., 0]
        loss = -(logp * m).sum() / m.sum()
        opt.zero_grad()
        loss.backward()
        opt.step()
        if loss.item() < 0.01:
            break
    model.save_pretrained(str(d))
    return loss.item()
