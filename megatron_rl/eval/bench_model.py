"""Sampling the benchmarks' completions from a model for ``eval --benchmarks --model`` (one engine
for every benchmark; SCoRe's second attempt from the first attempt's ids, ``bench.py``)."""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from megatron_rl.data import chat
from megatron_rl.data.tokenizer import load_tokenizer
from megatron_rl.eval.completions import model_lengths, open_engine


def _second_turn(tok, instruction: str):
    """``(x1, y1) -> x2``: the chat template's next user turn carrying ``instruction`` after y1's ids
    (``data/chat.py`` NextUserTurn, as SCoRe's training path), or ``x1 ++ y1 ++ ids(instruction)``
    on a template-less tokenizer; and the number of ids it adds."""
    if chat.has_chat_template(tok):
        turn = chat.NextUserTurn.of(tok, instruction)
        return (lambda x1, y1: turn.second_prompt(list(x1), list(y1), tok.eos_id)), len(turn.suffix)
    ids = list(tok.encode(instruction))
    return (lambda x1, y1: list(x1) + list(y1) + ids), len(ids)


def _params(a, n: int, max_tokens: int, eos_id):
    from megatron_rl.rollout.engine import SamplingParams  # lazy: defers torch to the call

    greedy = a.temperature == 0
    return SamplingParams(n=n, temperature=1.0 if greedy else a.temperature, top_p=a.top_p, top_k=a.top_k,
                          min_p=a.min_p, max_tokens=max_tokens, seed=a.seed, stop_token_ids=(eos_id,), greedy=greedy)


def _write(path: Path, comps, tok) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as f:
        for c in comps:
            f.write(json.dumps({"index": c.prompt_index, "response": tok.decode(c.response_ids)}) + "\n")


def sample_benchmarks(a, runs, two_attempt: bool):
    """``(first, second)``: ``{benchmark: [[response text] per row]}`` (second None without the
    two-attempt protocol); the completions are written to ``OUT/completions/``."""
    from megatron_rl.data.dataset import PromptDataset  # lazy: defers torch to the call

    tok = load_tokenizer(a.model, a.chat_template_kwargs)
    sets = {r.bench.name: PromptDataset.from_parquet(r.bench.path(a.data_dir), tok, max_prompt_len=1 << 20)
            for r in runs}
    longest = max(len(row.prompt_ids) for ds in sets.values() for row in ds.rows)
    second_prompt, extra = _second_turn(tok, a.instruction) if two_attempt else (None, 0)
    max_tokens, context = model_lengths(a.model, longest + (extra if two_attempt else 0), a.max_tokens)
    if two_attempt:   # x2 = x1 + y1 + turn, then y2
        max_tokens, context = model_lengths(a.model, longest + extra + max_tokens, max_tokens)
    eng = open_engine(a.engine, a.model, context, a.tp)
    first, second = {}, ({} if two_attempt else None)
    out = Path(a.out) / "completions"
    for r in runs:
        ds, name = sets[r.bench.name], r.bench.name
        c1 = sorted(eng.generate([list(x.prompt_ids) for x in ds.rows], _params(a, r.n, max_tokens, tok.eos_id)),
                    key=lambda c: (c.prompt_index, c.sample_index))
        _write(out / f"{name}.jsonl", c1, tok)
        first[name] = _group(c1, len(ds.rows), tok)
        if two_attempt:
            x2 = [second_prompt(c.prompt_ids, c.response_ids) for c in c1]
            c2 = sorted(eng.generate(x2, _params(a, 1, max_tokens, tok.eos_id)), key=lambda c: c.prompt_index)
            c2 = [dataclasses.replace(c, prompt_index=c1[c.prompt_index].prompt_index,
                                      sample_index=c1[c.prompt_index].sample_index) for c in c2]
            _write(out / f"{name}.attempt2.jsonl", c2, tok)
            second[name] = _group(c2, len(ds.rows), tok)
    return first, second


def _group(comps, rows: int, tok) -> list[list[str]]:
    out: list[list[str]] = [[] for _ in range(rows)]
    for c in comps:
        out[c.prompt_index].append(tok.decode(c.response_ids))
    return out
