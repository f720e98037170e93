"""Tokenizers: HF (``AutoTokenizer``) and SentencePiece models behind one small protocol.

``load_tokenizer(dir)`` picks by the files present: ``sp.model`` -> :class:`SentencePieceTokenizer`,
``tokenizer.json`` / ``tokenizer_config.json`` -> :class:`HFTokenizer`.

The CPU demo trains a character-level SentencePiece model on the task text at start-up
(:meth:`SentencePieceTokenizer.train`), so nothing is downloaded. Its chat template is the
plain concatenation of the message contents (a tiny policy needs no role markup).
"""
from __future__ import annotations

import io
import os
import shutil
from pathlib import Path
from typing import Protocol, Sequence


class Tokenizer(Protocol):
    vocab_size: int
    bos_id: int | None
    eos_id: int
    pad_id: int

    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: Sequence[int]) -> str: ...

    def decode_batch(self, seqs: Sequence[Sequence[int]]) -> list[str]: ...   # optional: decode of each

    def apply_chat_template(self, messages: list[dict], add_generation_prompt: bool = True) -> str: ...

    def save(self, out_dir: str | os.PathLike) -> None: ...


class SentencePieceTokenizer:
    """A SentencePiece model (ids: unk 0, bos 1, eos 2, pad 3)."""

    FILE = "sp.model"

    def __init__(self, model_file: str | os.PathLike):
        import sentencepiece as spm  # lazy: defers sentencepiece to the call

        self.path = Path(model_file)
        self.sp = spm.SentencePieceProcessor(model_file=str(self.path))
        self.vocab_size = self.sp.get_piece_size()
        self.bos_id, self.eos_id, self.pad_id = self.sp.bos_id(), self.sp.eos_id(), self.sp.pad_id()
        self.unk_id = self.sp.unk_id()   # what a character outside the vocabulary becomes
        if self.eos_id < 0 or self.pad_id < 0:
            raise ValueError(f"{model_file}: SentencePiece model needs eos and pad ids")

    @classmethod
    def train(cls, texts: Sequence[str], out_dir: str | os.PathLike, vocab_size: int | None = None,
              model_type: str = "char") -> "SentencePieceTokenizer":
        """Train on ``texts`` (char model: vocab = distinct characters + 4 specials)."""
        import sentencepiece as spm  # lazy: defers sentencepiece to the call

        if not texts:
            raise ValueError("cannot train a tokenizer on no text")
        chars = sorted(set("".join(texts)))
        vocab_size = vocab_size or len(chars) + 4
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        buf = io.BytesIO()
        spm.SentencePieceTrainer.train(
            sentence_iterator=iter(list(texts)), model_writer=buf, vocab_size=vocab_size, model_type=model_type,
            character_coverage=1.0, unk_id=0, bos_id=1, eos_id=2, pad_id=3, add_dummy_prefix=False,
            remove_extra_whitespaces=False, normalization_rule_name="identity", minloglevel=2)
        (out / cls.FILE).write_bytes(buf.getvalue())
        return cls(out / cls.FILE)

    def encode(self, text: str) -> list[int]:
        return list(self.sp.encode(text))

    def decode(self, ids: Sequence[int]) -> str:
        ids = [int(i) for i in ids if int(i) not in (self.eos_id, self.pad_id, self.bos_id)]
        return self.sp.decode(ids)

    def decode_batch(self, seqs: Sequence[Sequence[int]]) -> list[str]:
        """``decode`` of each sequence, in one SentencePiece call."""
        drop = {self.eos_id, self.pad_id, self.bos_id}
        return list(self.sp.decode([[int(i) for i in s if int(i) not in drop] for s in seqs])) if seqs else []

    def apply_chat_template(self, messages: list[dict], add_generation_prompt: bool = True) -> str:
        return "".join(m["content"] for m in messages)

    def save(self, out_dir: str | os.PathLike) -> None:
        Path(out_dir).mkdir(parents=True, exist_ok=True)
        if Path(out_dir, self.FILE).resolve() != self.path.resolve():
            shutil.copy2(self.path, Path(out_dir) / self.FILE)


class HFTokenizer:
    """``transformers.AutoTokenizer`` (local files only).

    ``chat_template_kwargs`` (``data.chat_template_kwargs``, e.g. ``{"enable_thinking": True}`` for
    Qwen3) are passed to every rendering of the chat template, so each place that renders a prompt
    (training and eval prompts, BiCC contexts, teacher prompts, SCoRe's second turn) sees the same
    options: they all render through :meth:`apply_chat_template`."""

    def __init__(self, path: str | os.PathLike, chat_template_kwargs: dict | None = None):
        from transformers import AutoTokenizer  # lazy: defers transformers to the call

        self.tok = AutoTokenizer.from_pretrained(str(path), local_files_only=True)
        self.chat_template_kwargs = dict(chat_template_kwargs or {})
        if self.chat_template_kwargs and self.tok.chat_template is None:
            raise ValueError(f"data.chat_template_kwargs={self.chat_template_kwargs} is set but the tokenizer in "
                             f"{path} has no chat template to pass them to")
        self.vocab_size = len(self.tok)
        self.bos_id = self.tok.bos_token_id
        self.eos_id = self.tok.eos_token_id
        self.pad_id = self.tok.pad_token_id if self.tok.pad_token_id is not None else self.eos_id
        self.unk_id = self.tok.unk_token_id   # None for byte-level vocabularies, which know every character

    def encode(self, text: str) -> list[int]:
        return list(self.tok.encode(text, add_special_tokens=False))

    def decode(self, ids: Sequence[int]) -> str:
        return self.tok.decode(list(ids), skip_special_tokens=True)

    def decode_batch(self, seqs: Sequence[Sequence[int]]) -> list[str]:
        """``decode`` of each sequence: one call into the Rust tokenizer when ``decode`` adds no Python
        clean-up of its own (``clean_up_tokenization_spaces`` off, or skipped for BPE as transformers does),
        else ``decode`` per sequence."""
        backend = getattr(self.tok, "backend_tokenizer", None)
        if backend is None or self._cleans_up():
            return [self.decode(s) for s in seqs]
        return backend.decode_batch([list(s) for s in seqs], skip_special_tokens=True)

    def _cleans_up(self) -> bool:
        if not getattr(self.tok, "clean_up_tokenization_spaces", False):
            return False
        bpe = type(self.tok.backend_tokenizer.model).__name__ == "BPE"
        return not bpe or bool(getattr(self.tok, "clean_up_tokenization_spaces_for_bpe_even_though_it_will_corrupt_output", False))

    def apply_chat_template(self, messages: list[dict], add_generation_prompt: bool = True) -> str:
        if self.tok.chat_template is None:
            return "".join(m["content"] for m in messages)
        return self.tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=add_generation_prompt,
                                            **self.chat_template_kwargs)

    def save(self, out_dir: str | os.PathLike) -> None:
        self.tok.save_pretrained(str(out_dir))


def load_tokenizer(path: str | os.PathLike, chat_template_kwargs: dict | None = None) -> Tokenizer:
    """Tokenizer from a directory holding ``sp.model`` or HF tokenizer files; ``chat_template_kwargs``:
    options of every chat-template rendering (HF only; a SentencePiece model has no template to take them)."""
    p = Path(path)
    if (p / SentencePieceTokenizer.FILE).is_file():
        if chat_template_kwargs:
            raise ValueError(f"data.chat_template_kwargs={chat_template_kwargs} is set but {p} holds a SentencePiece "
                             "model, which has no chat template")
        return SentencePieceTokenizer(p / SentencePieceTokenizer.FILE)
    if (p / "tokenizer.json").is_file() or (p / "tokenizer_config.json").is_file():
        return HFTokenizer(p, chat_template_kwargs)
    raise FileNotFoundError(f"no tokenizer in {p} (expected {SentencePieceTokenizer.FILE} or tokenizer.json)")
