"""``megatron-rl demo --task tools``: tool use learned by RL, on the embedded CPU default, in a few minutes
(docs/tool-use-demo.md).

1. write the products task (``data/tool_task.py``: ``What is 482 * 37?``, the ``calculator`` tool);
2. train a byte-level BPE tokenizer (digits one by one) with a ChatML tool template (:data:`TOOL_TEMPLATE`) and
   build a tiny Qwen3 from a config (no download);
3. a short supervised warm start (plain torch) on tool-call traces, only some of which call the tool;
4. GRPO with the agent loop (``multi_turn.enable``, ``examples/configs/tiny_cpu_grpo_tools.yaml``), the held-out
   evaluation running the same loop before and after RL;
5. print held-out accuracy, tool-call rate and tool success before / after RL.
"""
from __future__ import annotations

import os
import random
import time
from pathlib import Path

from megatron_rl.data import tool_task as T

CONFIG = Path(__file__).resolve().parents[2] / "examples" / "configs" / "tiny_cpu_grpo_tools.yaml"
#: the held-out rows the demo evaluates on, sampled (``trainer.eval_*`` of the example config)
SIZES = {"train": 4000, "val": 200}

TOOL_TEMPLATE = (
    "{%- for m in messages %}"
    "{%- if m.role == 'system' %}"
    "{{- '<|im_start|>system\\n' + m.content }}"
    "{%- if tools %}{{- '\\n\\n<tools>' }}{%- for t in tools %}{{- ' ' + t.function.name }}{%- endfor %}"
    "{{- ' </tools>' }}{%- endif %}"
    "{{- '<|im_end|>\\n' }}"
    "{%- elif m.role == 'tool' %}"
    "{%- if loop.first or messages[loop.index0 - 1].role != 'tool' %}{{- '<|im_start|>user' }}{%- endif %}"
    "{{- '\\n<tool_response>\\n' + m.content + '\\n</tool_response>' }}"
    "{%- if loop.last or messages[loop.index0 + 1].role != 'tool' %}{{- '<|im_end|>\\n' }}{%- endif %}"
    "{%- elif m.role == 'assistant' %}"
    "{{- '<|im_start|>assistant\\n' + (m.content or '') }}"
    "{%- for c in (m.tool_calls or []) %}"
    "{%- if not loop.first or m.content %}{{- '\\n' }}{%- endif %}"
    "{{- '<tool_call>\\n{\"name\": \"' + c.function.name + '\", \"arguments\": ' + (c.function.arguments | tojson)"
    " + '}\\n</tool_call>' }}"
    "{%- endfor %}"
    "{{- '<|im_end|>\\n' }}"
    "{%- else %}"
    "{{- '<|im_start|>' + m.role + '\\n' + m.content + '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)
"""A ChatML template with hermes tool calls, written for the demo: the system turn names the ``tools`` in
``<tools>`` (their names, not their JSON schemas: a calculator's schema is ~200 tokens, most of what a tiny model
attends over), an assistant message's ``tool_calls`` are ``<tool_call>`` blocks after its content, consecutive
``tool`` messages share one ``user`` turn as ``<tool_response>`` blocks (Qwen2.5's layout, no think blocks): the
text the agent loop builds turn by turn (``agent/tool_calls.py``), so the tokenization check sees no drift."""


def build_tiny_tool_model(out_dir: Path, texts: list[str], seed: int = 0, vocab_size: int = 512,
                          hidden: int = 128, layers: int = 2) -> Path:
    """A byte-level BPE tokenizer trained on ``texts`` (digits split one by one, Qwen's special tokens,
    ``<|im_end|>`` the end of a turn) with :data:`TOOL_TEMPLATE`, and a random tiny Qwen3 of its vocabulary,
    saved as one HF dir."""
    import torch  # lazy: defers torch to the call
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers  # lazy: defers tokenizers
    from transformers import GenerationConfig, PreTrainedTokenizerFast, Qwen3Config, Qwen3ForCausalLM  # lazy: torch

    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True),
                                                 pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)])
    bpe.decoder = decoders.ByteLevel()
    bpe.train_from_iterator(texts, trainer=trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=specials,
                                                               show_progress=False,
                                                               initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tok = PreTrainedTokenizerFast(tokenizer_object=bpe, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                                  additional_special_tokens=["<|im_start|>"], model_max_length=1024)
    tok.chat_template = TOOL_TEMPLATE
    out_dir.mkdir(parents=True, exist_ok=True)
    tok.save_pretrained(str(out_dir))
    cfg = Qwen3Config(vocab_size=-(-len(tok) // 64) * 64, hidden_size=hidden, intermediate_size=4 * hidden,
                      num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2, head_dim=32,
                      max_position_embeddings=512, tie_word_embeddings=True, rms_norm_eps=1e-6, rope_theta=10000.0,
                      bos_token_id=None, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
                      architectures=["Qwen3ForCausalLM"])
    torch.manual_seed(seed)
    model = Qwen3ForCausalLM(cfg)
    model.generation_config = GenerationConfig(eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    model.save_pretrained(str(out_dir))
    return out_dir


def trace_ids(tok, conv: list[dict]) -> tuple[list[int], list[int]]:
    """A warm-start conversation as the agent loop builds its tokens (the prompt rendered by the template, each
    assistant turn ``encode(text) + <|im_end|>``, a tool turn ``encode("\\n" + its <tool_response> turn)`` + the
    generation prompt) and its mask (1 on the assistant's tokens)."""
    from megatron_rl.agent.loop import generation_prompt_ids  # lazy: the agent package on use
    from megatron_rl.agent.tool_calls import IM_END, render_tool_responses  # lazy: the agent package on use

    head = [m for m in conv if m["role"] in ("system", "user")]
    ids = list(tok.encode(tok.apply_chat_template(head, True)))
    mask = [0] * len(ids)
    end = list(tok.encode(IM_END))
    for m in conv[len(head):]:
        part = list(tok.encode(m["content"])) + end if m["role"] == "assistant" else \
            list(tok.encode("\n" + render_tool_responses([m["content"]], None))) + generation_prompt_ids(tok)
        ids += part
        mask += [int(m["role"] == "assistant")] * len(part)
    return ids, mask


def warm_start(model_dir: Path, seqs: list[tuple[list[int], list[int]]], steps: int, lr: float = 3e-3,
               batch: int = 32, seed: int = 0, log=print) -> float:
    """Plain-torch SFT of the HF model in ``model_dir`` on ``seqs`` (ids, mask: the loss on mask-1 targets),
    ``steps`` Adam steps of ``batch`` random sequences, saved in place; returns the last loss (nats per token)."""
    import torch  # lazy: defers torch to the call
    from transformers import AutoModelForCausalLM  # lazy: defers transformers to the call

    torch.manual_seed(seed)
    rng = random.Random(seed)
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    loss = torch.tensor(0.0)
    for step in range(1, steps + 1):
        pick = rng.sample(seqs, min(batch, len(seqs)))
        n = max(len(s) for s, _ in pick)
        ids = torch.tensor([s + [0] * (n - len(s)) for s, _ in pick])
        m = torch.tensor([k + [0] * (n - len(k)) for _, k in pick], dtype=torch.float32)[:, 1:]
        logp = torch.log_softmax(model(ids).logits[:, :-1].float(), -1).gather(-1, ids[:, 1:, None])[..., 0]
        loss = -(logp * m).sum() / m.sum()
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step % 50 == 0 or step == steps:
            log(f"[demo] warm start step {step}: loss {loss.item():.3f}")
    model.save_pretrained(str(model_dir))
    return loss.item()


def corpus(pairs: list[tuple[int, int]]) -> list[str]:
    """The tokenizer's training text: the task's conversations as the template renders them, the special
    tokens left out (the tokenizer splits them off before its BPE, so they take no part in the merges)."""
    out = []
    for a, b in pairs:
        n = a * b
        out.append(f"system\n{T.SYSTEM}\n\n<tools> calculator </tools>\nuser\n{T.question(a, b)}\nassistant\n"
                   f"{T.call_text(a, b)}\nuser\n<tool_response>\n{n}\n</tool_response>\nassistant\n#### {n}\n")
    return out


def prepare(run_dir: Path, seed: int, call_frac: float, sft_steps: int) -> tuple[dict, Path]:
    """Steps 1-3: the task's parquet files, the tiny tool model, its warm start; ``(paths, sft_hf)``."""
    from transformers.utils import logging as hf_logging  # lazy: defers transformers to the call

    from megatron_rl.agent.tools import ToolSet  # lazy: the agent package on use
    from megatron_rl.data.tokenizer import load_tokenizer  # lazy: defers transformers to the call

    hf_logging.disable_progress_bar()   # the console keeps the [demo] lines (no save / load bars)
    paths = T.write_task(run_dir / "data", seed, SIZES)
    pairs = T.split_pairs(seed, SIZES)["train"]
    hf = build_tiny_tool_model(run_dir / "sft_hf", corpus(pairs[:2000]), seed)
    tok = load_tokenizer(hf, {"tools": ToolSet(["calculator"]).schemas()})
    conv = T.traces(pairs, call_frac, seed)
    print(f"[demo] warm start: {sft_steps} steps on {len(conv)} traces, {call_frac:.0%} of them calling the calculator")
    warm_start(hf, [trace_ids(tok, c) for c in conv], sft_steps, seed=seed)
    return paths, hf


def tools_config(args, run_dir: Path, paths: dict, hf_dir) -> object:
    """The example config (:data:`CONFIG`) with the demo's files and the command line's choices."""
    from megatron_rl.trainer.loop.preflight import load_checked  # lazy: the trainer on use

    ov = [f"model.hf_path={hf_dir}", f"data.train={paths['train']}", f"data.val={paths['val']}",
          f"trainer.run_dir={run_dir}", f"trainer.seed={args.seed + 1}", f"algo.kind={args.algo}"]
    ov += [f"trainer.steps={args.steps}"] if args.steps is not None else []
    ov += [f"rollout.engine={args.engine}"] if args.engine is not None else []
    ov += [f"optim.lr={args.lr}"] if args.lr is not None else []
    return load_checked(str(CONFIG), ov + list(args.override))


def main_tools(args) -> int:
    """``megatron-rl demo --task tools`` (module docstring)."""
    from megatron_rl.runtime.console import format_summary, quiet_console  # lazy: the trainer on use
    from megatron_rl.runtime.usage import begin_run  # lazy: the trainer on use
    from megatron_rl.trainer.loop.rl_loop import run  # lazy: the trainer on use

    run_dir = Path(args.run_dir).resolve()     # checked by demo.main: new, empty or an earlier demo's
    tools_config(args, run_dir, {"train": "", "val": ""}, "")   # --steps, --lr, -o ...: checked before any file
    quiet_console()   # console: [demo] lines, warnings, progress bar; INFO + library warnings -> run_dir/train.log
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    os.environ.setdefault("WANDB_MODE", "offline")
    t0 = time.time()
    print(f"[demo] run dir {run_dir}")
    paths, hf = prepare(run_dir, args.seed, args.call_frac, args.sft_steps)
    cfg = tools_config(args, run_dir, paths, hf)
    begin_run()   # arguments and config accepted: from here an error is a runtime error (exit 1)
    print(f"[demo] RL: algo={args.algo} with the calculator, {cfg.trainer.steps} steps x {cfg.data.prompts_per_step} "
          f"prompts x G={cfg.rollout.n}; held-out: {cfg.trainer.eval_prompts} prompts x {cfg.trainer.eval_n} samples")
    summary = run(cfg, overwrite=True, keep=[run_dir / "data", run_dir / "sft_hf"])   # a re-run starts over
    print(format_summary(summary, title=f"done in {time.time() - t0:.0f} s", prefix="[demo] "), flush=True)
    return 0
