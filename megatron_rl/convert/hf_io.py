"""Streaming safetensors I/O: read tensor by tensor, write shard by shard (never the whole model).

``HFReader(dir)`` indexes every ``*.safetensors`` file (via ``model.safetensors.index.json`` when
present, else the files' headers) and reads one tensor at a time. ``HFWriter(dir, plan)`` knows every
tensor's name / dtype / shape up front, writes each shard's header first and then appends tensors
as they come (no shard is ever buffered), and at ``close()`` writes the index json.
A corrupt or truncated file raises ``ValueError`` naming the file.
"""
from __future__ import annotations

import ctypes
import errno
import json
import math
import os
import shutil
import struct
from pathlib import Path

import torch

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "tokenizer.model",
                   "vocab.json", "merges.txt", "generation_config.json", "chat_template.jinja", "sp.model")


class HFReader:
    """Random access to the tensors of an HF safetensors checkpoint directory."""

    def __init__(self, hf_dir: str | os.PathLike):
        from safetensors import safe_open  # lazy: defers safetensors to the call

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


_PIECE = 8 << 20
_NO_KERNEL_COPY = {errno.EXDEV, errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP, errno.EBADF, errno.EPERM}


def byte_view(t: torch.Tensor) -> memoryview:
    """The bytes of the contiguous CPU tensor ``t`` as a memoryview, without copying and without
    ``Tensor.numpy()``: numpy's view marks the tensor's storage as not resizable for good, and a live
    model's parameters are often passed here as they are (a CPU tensor's ``.to("cpu")`` is itself),
    after which ``trainer.offload`` could no longer release them ("Trying to resize storage that is
    not resizable", issue 31). Valid while ``t`` is alive."""
    n = t.numel() * t.element_size()
    if not n:
        return memoryview(b"")
    if not t.is_contiguous() or t.device.type != "cpu":
        raise ValueError("byte_view needs a contiguous CPU tensor")
    return memoryview((ctypes.c_ubyte * n).from_address(t.data_ptr())).cast("B")


def copy_bytes(src: int, dst: int, off: int, n: int, pos: int, kernel: bool = True, what: str = "") -> tuple[int, bool]:
    """Copy ``src[off : off + n]`` to ``dst`` at ``pos``: ``os.copy_file_range`` (page cache to page
    cache, no user-space buffer) or, where the kernel cannot (``kernel`` False or it refuses),
    ``pread``/``pwrite`` in 8 MiB pieces. Returns (new ``pos``, whether kernel copy still works)."""
    while n:
        if kernel:
            try:
                k = os.copy_file_range(src, dst, n, off, pos)
            except OSError as e:
                if e.errno not in _NO_KERNEL_COPY:
                    raise
                kernel = False
                continue
        else:
            buf = os.pread(src, min(n, _PIECE), off)
            k = len(buf)
            view = memoryview(buf)
            while view.nbytes:
                w = os.pwrite(dst, view, pos + len(buf) - view.nbytes)
                view = view[w:]
        if k == 0:
            raise ValueError(f"corrupt {what or f'file (fd {src})'}: ends before byte {off + n}")
        n, off, pos = n - k, off + k, pos + k
    return pos, kernel


ST_DTYPES = {torch.float64: "F64", torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16",
             torch.int64: "I64", torch.int32: "I32", torch.int16: "I16", torch.int8: "I8", torch.uint8: "U8",
             torch.bool: "BOOL"}


class HFWriter:
    """Write named tensors as safetensors shards of at most ``max_shard_bytes``, one tensor at a time.

    ``plan`` lists every ``(name, dtype, shape)`` in the order they will be written, so each shard's
    header is known before its first byte: :meth:`write` appends the tensor's bytes to the open
    shard and keeps nothing (memory: the caller's one tensor). ``close`` checks that every planned
    tensor came and writes ``model.safetensors.index.json`` when there is more than one shard.
    Files are ordinary safetensors (8-byte header length, JSON header padded to 8 bytes, data).
    """

    def __init__(self, out_dir: str | os.PathLike, plan, max_shard_bytes: int = 2 << 30):
        self.dir = Path(out_dir)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.shards: list[list[tuple[str, torch.dtype, tuple[int, ...]]]] = []
        size = 0
        for name, dtype, shape in plan:
            n = math.prod(shape) * torch.empty((), dtype=dtype).element_size()
            if not self.shards or (self.shards[-1] and size + n > max_shard_bytes):
                self.shards.append([])
                size = 0
            self.shards[-1].append((name, dtype, tuple(shape)))
            size += n
        k = len(self.shards)
        self.files = ["model.safetensors"] if k == 1 else [f"model-{i + 1:05d}-of-{k:05d}.safetensors" for i in range(k)]
        self._order = [e for s in self.shards for e in s]
        self._shard_of = [i for i, s in enumerate(self.shards) for _ in s]
        self._next, self._shard, self._fd, self._pos, self._kernel, self.total_bytes = 0, -1, None, 0, True, 0

    def _open(self, i: int) -> None:
        self._close_fd()
        header, off = {"__metadata__": {"format": "pt"}}, 0
        for name, dtype, shape in self.shards[i]:
            n = math.prod(shape) * torch.empty((), dtype=dtype).element_size()
            header[name] = {"dtype": ST_DTYPES[dtype], "shape": list(shape), "data_offsets": [off, off + n]}
            off += n
        raw = json.dumps(header, separators=(",", ":")).encode()
        raw += b" " * (-len(raw) % 8)
        self._fd = os.open(self.dir / self.files[i], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        self._pos = 0
        self._put(memoryview(struct.pack("<Q", len(raw)) + raw))
        self._shard = i

    def _close_fd(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def _put(self, view: memoryview) -> None:
        while view.nbytes:
            n = os.pwrite(self._fd, view, self._pos)
            view, self._pos = view[n:], self._pos + n

    def _begin(self, name: str, dtype: torch.dtype, shape: tuple[int, ...]) -> int:
        """Check ``name`` is the next planned tensor, open its shard; returns its byte size."""
        if self._next >= len(self._order):
            raise ValueError(f"tensor {name!r} is not in the export plan (all {len(self._order)} written)")
        want = self._order[self._next]
        if (name, dtype, tuple(shape)) != want:
            raise ValueError(f"export out of plan: got {name!r} {dtype} {tuple(shape)}, expected {want}")
        if self._shard_of[self._next] != self._shard:
            self._open(self._shard_of[self._next])
        self._next += 1
        nbytes = math.prod(shape) * torch.empty((), dtype=dtype).element_size()
        self.total_bytes += nbytes
        return nbytes

    def write(self, name: str, tensor: torch.Tensor) -> None:
        """Append the next planned tensor (its name, dtype and shape must match the plan)."""
        self._begin(name, tensor.dtype, tuple(tensor.shape))
        t = tensor.detach().to("cpu").contiguous()
        if t.numel():
            self._put(byte_view(t))

    def copy(self, name: str, dtype: torch.dtype, shape: tuple[int, ...], ranges: list[tuple[int, int, int]]) -> None:
        """Append the next planned tensor from byte ranges ``(fd, offset, nbytes)`` of other files
        (its raw C-order bytes, in order): file to file, never through memory (``copy_bytes``)."""
        nbytes = self._begin(name, dtype, shape)
        if sum(r[2] for r in ranges) != nbytes:
            raise ValueError(f"{name}: byte ranges hold {sum(r[2] for r in ranges)} bytes, the tensor {nbytes}")
        for fd, off, n in ranges:
            self._pos, self._kernel = copy_bytes(fd, self._fd, off, n, self._pos, self._kernel,
                                                 f"checkpoint file holding {name!r}")

    def close(self) -> None:
        self._close_fd()
        if self._next != len(self._order):
            raise ValueError(f"export incomplete: {len(self._order) - self._next} planned tensor(s) never came, "
                             f"e.g. {self._order[self._next][0]!r}")
        if len(self.shards) > 1:
            weight_map = {name: f for f, s in zip(self.files, self.shards) for name, _, _ in s}
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
