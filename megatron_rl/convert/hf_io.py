"""Streaming safetensors I/O: read tensor by tensor, write shard by shard (never the whole model).

``HFReader(dir)`` indexes every ``*.safetensors`` file (via ``model.safetensors.index.json`` when
present, else the files' headers) and reads one tensor at a time. ``HFWriter(dir)`` buffers tensors
up to ``max_shard_bytes``, writes a shard, and at ``close()`` writes the index json.
A corrupt or truncated file raises ``ValueError`` naming the file.
"""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import torch

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "tokenizer.model",
                   "vocab.json", "merges.txt", "generation_config.json", "chat_template.jinja", "sp.model")


class HFReader:
    """Random access to the tensors of an HF safetensors checkpoint directory."""

    def __init__(self, hf_dir: str | os.PathLike):
        from safetensors import safe_open

        self.dir = Path(hf_dir)
        files = sorted(self.dir.glob("*.safetensors"))
        if not files:
            raise FileNotFoundError(f"no *.safetensors files in {self.dir}")
        self._handles = {}
        self.index: dict[str, Path] = {}
        for f in files:
            try:
                h = safe_open(str(f), framework="pt")
                keys = list(h.keys())
            except Exception as e:  # safetensors raises its own error types
                raise ValueError(f"corrupt safetensors file {f}: {e}") from e
            self._handles[f] = h
            for k in keys:
                if k in self.index:
                    raise ValueError(f"tensor {k!r} appears in both {self.index[k].name} and {f.name}")
                self.index[k] = f

    def names(self) -> list[str]:
        return list(self.index)

    def get(self, name: str) -> torch.Tensor:
        """Read one tensor (raises ``KeyError`` naming it when absent)."""
        try:
            f = self.index[name]
        except KeyError:
            raise KeyError(f"tensor {name!r} not found in {self.dir}") from None
        try:
            return self._handles[f].get_tensor(name)
        except Exception as e:
            raise ValueError(f"corrupt safetensors file {f}: cannot read {name!r}: {e}") from e

    def nbytes(self) -> int:
        return sum(f.stat().st_size for f in self._handles)


class HFWriter:
    """Write named tensors as safetensors shards of at most ``max_shard_bytes`` plus an index."""

    def __init__(self, out_dir: str | os.PathLike, max_shard_bytes: int = 2 << 30):
        self.dir = Path(out_dir)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.max = max_shard_bytes
        self._buf: dict[str, torch.Tensor] = {}
        self._bytes = 0
        self._shards: list[list[str]] = []
        self.total_bytes = 0

    def add(self, name: str, tensor: torch.Tensor) -> None:
        n = tensor.numel() * tensor.element_size()
        if self._buf and self._bytes + n > self.max:
            self._flush()
        self._buf[name] = tensor.detach().contiguous().cpu()
        self._bytes += n
        self.total_bytes += n

    def _flush(self) -> None:
        from safetensors.torch import save_file

        i = len(self._shards)
        save_file(self._buf, str(self.dir / f"model-{i:05d}.safetensors"), metadata={"format": "pt"})
        self._shards.append(list(self._buf))
        self._buf, self._bytes = {}, 0

    def close(self) -> None:
        if self._buf or not self._shards:
            self._flush()
        n = len(self._shards)
        weight_map = {}
        for i, names in enumerate(self._shards):
            final = "model.safetensors" if n == 1 else f"model-{i + 1:05d}-of-{n:05d}.safetensors"
            os.replace(self.dir / f"model-{i:05d}.safetensors", self.dir / final)
            weight_map.update({k: final for k in names})
        if n > 1:
            (self.dir / "model.safetensors.index.json").write_text(json.dumps(
                {"metadata": {"total_size": self.total_bytes}, "weight_map": weight_map}, indent=1))


def copy_tokenizer_files(src: str | os.PathLike, dst: str | os.PathLike) -> list[str]:
    """Copy the tokenizer / generation files present in ``src`` to ``dst``; returns their names."""
    copied = []
    for name in TOKENIZER_FILES:
        p = Path(src) / name
        if p.is_file():
            shutil.copy2(p, Path(dst) / name)
            copied.append(name)
    return copied
