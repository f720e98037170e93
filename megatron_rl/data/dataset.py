"""Parquet prompt datasets (verl columns) and the deterministic, resumable sampler."""
from __future__ import annotations

import dataclasses
import logging
import os
from typing import Any

import numpy as np
import torch

log = logging.getLogger("megatron_rl.data")
REQUIRED = ("prompt", "data_source", "reward_model")


@dataclasses.dataclass(frozen=True)
class PromptRow:
    index: int
    prompt_ids: tuple[int, ...]
    data_source: str
    ground_truth: Any
    extra_info: dict
    messages: tuple = ()
    """The row's chat messages ({role, content}) as in the parquet ``prompt`` column."""
    reward: str = ""
    """The reward the row names (``reward_model.reward``: rows of ``megatron-rl data prepare``), "" for none
    (its ``data_source`` selects one, ``rewards/sources.py``)."""
    agent_name: str = ""
    """The agent loop the row names (verl's ``agent_name`` column: ``single_turn_agent``, ``tool_agent``), ""
    for none (``multi_turn.loop``; read only with ``multi_turn.enable``, docs/multi-turn.md)."""

    def __reduce__(self):
        """Pickled (a step's batch to every rank, checkpoints) with its prompt ids as one int32 byte
        string: no Python int per prompt token in the pickle; read back as the same tuple of ints."""
        fields = [getattr(self, f.name) for f in dataclasses.fields(self)]
        if not isinstance(self.prompt_ids, tuple):
            return (PromptRow, tuple(fields))
        return (_row_from_bytes, (np.asarray(self.prompt_ids, dtype=np.int32).tobytes(), fields[:1] + fields[2:]))


def _row_from_bytes(ids: bytes, rest: list) -> PromptRow:
    """The inverse of ``PromptRow.__reduce__``."""
    return PromptRow(rest[0], tuple(np.frombuffer(ids, dtype=np.int32).tolist()), *rest[1:])


class PromptDataset:
    """Rows of a verl-convention parquet file, chat-templated and tokenised."""

    def __init__(self, rows: list[PromptRow], skipped: int = 0, unknown: "UnknownChars | None" = None):
        if not rows:
            raise ValueError("prompt dataset is empty")
        self.rows, self.skipped = rows, skipped
        self.unknown = unknown or UnknownChars()

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, i: int) -> PromptRow:
        return self.rows[i]

    @classmethod
    def from_parquet(cls, path: str | os.PathLike, tokenizer, max_prompt_len: int, on_error: str = "raise",
                     add_bos: bool = True) -> "PromptDataset":
        """Load, template and tokenise. ``on_error="skip"`` drops bad rows (counted, logged)."""
        import pyarrow.parquet as pq  # lazy: defers pyarrow to the call

        if on_error not in ("raise", "skip"):
            raise ValueError(f"on_error must be 'raise' or 'skip', got {on_error!r}")
        table = pq.read_table(path)
        missing = [c for c in REQUIRED if c not in table.column_names]
        if missing:
            raise ValueError(f"{path}: missing column(s) {missing}; a verl prompt file needs {list(REQUIRED)}")
        rows, skipped, unknown = [], 0, UnknownChars()
        for i, r in enumerate(table.to_pylist()):
            try:
                rows.append(_row(i, r, tokenizer, max_prompt_len, add_bos))
            except ValueError as e:
                if on_error == "raise":
                    raise ValueError(f"{path}: row {i}: {e}") from None
                skipped += 1
                log.warning("%s: skipping row %d: %s", path, i, e)
            else:
                unknown.count(rows[-1], tokenizer)
        if not rows:
            raise ValueError(f"{path}: no prompt rows" + (f" ({skipped} of {table.num_rows} skipped as unusable, "
                                                          "see the warnings above)" if skipped else " (an empty file)"))
        if unknown.rows:
            log.warning("%s: %s", path, unknown.describe(len(rows)))
        return cls(rows, skipped, unknown)


@dataclasses.dataclass
class UnknownChars:
    """Characters of the prompts and ground truths that the tokenizer maps to its unknown token,
    counted per file (a logged, counted fallback: the row still trains, but a ground truth the policy
    cannot write scores 0 for ever). Byte-level vocabularies (no unknown token) never count any."""

    rows: int = 0            # rows with an unknown character in the prompt or the ground truth
    answer_rows: int = 0     # of which the ground truth has one
    chars: set = dataclasses.field(default_factory=set)

    def count(self, row: PromptRow, tokenizer) -> None:
        unk = getattr(tokenizer, "unk_id", None)
        if unk is None or unk < 0:
            return
        in_prompt = unk in row.prompt_ids
        answer = row.ground_truth if isinstance(row.ground_truth, str) else ""
        in_answer = bool(answer) and unk in tokenizer.encode(answer)
        if not (in_prompt or in_answer):
            return
        self.rows += 1
        self.answer_rows += in_answer
        if len(self.chars) < 8:
            text = "".join(m["content"] for m in row.messages) + answer
            self.chars.update(c for c in set(text) if unk in tokenizer.encode(c))

    def describe(self, total: int) -> str:
        shown = ", ".join(repr(c) for c in sorted(self.chars)[:5])
        return (f"{self.rows} of {total} rows hold characters the tokenizer does not know ({shown}), read as its "
                f"unknown token; {self.answer_rows} of them in the ground truth, which the policy can never write "
                "(reward 0): fix the data or use a tokenizer that covers them")


def _row(i: int, r: dict, tokenizer, max_len: int, add_bos: bool) -> PromptRow:
    msgs = r["prompt"]
    if not isinstance(msgs, list) or not all(isinstance(m, dict) and "content" in m for m in msgs):
        raise ValueError("'prompt' must be a list of chat messages {role, content}")
    text = tokenizer.apply_chat_template(msgs, add_generation_prompt=True)
    if not text.strip():
        raise ValueError("empty prompt")
    ids = tokenizer.encode(text)
    if add_bos and tokenizer.bos_id is not None and tokenizer.bos_id >= 0:
        ids = [tokenizer.bos_id] + ids
    if len(ids) > max_len:
        raise ValueError(f"prompt has {len(ids)} tokens > max_prompt_len={max_len}")
    rm = r.get("reward_model")
    if rm is not None and not isinstance(rm, dict):
        raise ValueError(f"'reward_model' must be a mapping {{ground_truth: ...}}, got {type(rm).__name__} {str(rm)[:40]!r}")
    gt = (rm or {}).get("ground_truth")
    if gt is None:
        raise ValueError("reward_model.ground_truth is missing")
    return PromptRow(i, tuple(ids), str(r["data_source"]), gt, dict(r.get("extra_info") or {}),
                     tuple({"role": str(m.get("role", "user")), "content": str(m["content"])} for m in msgs),
                     str((rm or {}).get("reward") or ""), str(r.get("agent_name") or ""))


def epoch_permutation(n: int, seed: int, epoch: int) -> list[int]:
    """The order of ``n`` rows in ``epoch`` (``data.seed``): THE shuffle of the sampler and of the partial
    rollouts' prompt pool (``trainer/loop/partial_source.PoolPrompts``), one definition."""
    g = torch.Generator().manual_seed(seed * 100_003 + epoch)
    return torch.randperm(n, generator=g).tolist()


class DeterministicSampler:
    """Epoch-wise shuffled index batches; ``state_dict()`` (epoch, position) resumes exactly."""

    def __init__(self, n: int, batch_size: int, seed: int = 0):
        if batch_size < 1 or batch_size > n:
            raise ValueError(f"batch_size must be in [1, {n}], got {batch_size}")
        self.n, self.batch_size, self.seed = n, batch_size, seed
        self.epoch, self.pos = 0, 0
        self._perm = self._make_perm()

    def _make_perm(self) -> list[int]:
        return epoch_permutation(self.n, self.seed, self.epoch)

    def next_batch(self) -> list[int]:
        if self.pos + self.batch_size > self.n:
            self.epoch, self.pos = self.epoch + 1, 0
            self._perm = self._make_perm()
        out = self._perm[self.pos:self.pos + self.batch_size]
        self.pos += self.batch_size
        return out

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "pos": self.pos, "seed": self.seed, "n": self.n}

    def load_state_dict(self, st: dict) -> None:
        if st["n"] != self.n or st["seed"] != self.seed:
            raise ValueError(f"sampler state is for n={st['n']} seed={st['seed']}, this dataset has n={self.n} seed={self.seed}")
        self.epoch, self.pos = int(st["epoch"]), int(st["pos"])
        self._perm = self._make_perm()
