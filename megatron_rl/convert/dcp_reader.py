"""Read regions of tensors out of a ``torch.distributed.checkpoint`` (DCP) directory, chunk by chunk.

The inverse of ``dcp_writer``: the ``.metadata`` file (read with DCP's own ``FileSystemReader``)
lists, per key, the dtype, the global shape and the stored chunks with their byte ranges
(``storage_data``). :meth:`DcpReader.read` assembles any box of a global tensor from the chunks that
overlap it, so it reads checkpoints saved at any TP / PP (megatron's TP shards, PP stages' layers,
the converter's TP=1 chunks, a training checkpoint's model keys next to its optimizer state).

Why not DCP's ``FileSystemReader.read_data`` / megatron's ``dist_checkpointing.load``: those read a
whole chunk record into a ``BytesIO`` and ``torch.load`` it (two to three copies of the chunk) and
need the destination state dict (a built model, megatron's process groups). Here a chunk record
(``torch.save`` of one tensor: an uncompressed zip) is opened only far enough to find where its
storage bytes start, and those bytes are ``pread`` straight into the destination tensor when the
chunk is one contiguous piece of it (else into one chunk-sized buffer, then copied). A record this
cannot frame (compressed, a storage larger than the chunk, transform descriptors) is read the
generic way (``torch.load`` of its bytes), so any DCP checkpoint still reads.
"""
from __future__ import annotations

import io
import math
import os
import struct
import zipfile
from pathlib import Path

import torch
from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint.metadata import MetadataIndex, TensorStorageMetadata

_MAX_READ = 1 << 30  # per pread call (Linux caps one read at ~2 GiB)


class _RangeFile(io.RawIOBase):
    """Read-only, seekable view of ``fd[start : start + length]`` (for ``zipfile``)."""

    def __init__(self, fd: int, start: int, length: int):
        self.fd, self.start, self.length, self.pos = fd, start, length, 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self.pos

    def seek(self, off: int, whence: int = 0) -> int:
        self.pos = {0: off, 1: self.pos + off, 2: self.length + off}[whence]
        return self.pos

    def read(self, n: int = -1) -> bytes:
        n = self.length - self.pos if n is None or n < 0 else min(n, self.length - self.pos)
        data = os.pread(self.fd, max(n, 0), self.start + self.pos)
        self.pos += len(data)
        return data

    def readinto(self, b) -> int:
        data = self.read(len(b))
        b[: len(data)] = data
        return len(data)


def pread_into(fd: int, offset: int, t: torch.Tensor, what: str = "") -> None:
    """Fill the contiguous tensor ``t`` with ``fd[offset : offset + t.nbytes]``."""
    view = memoryview(t.reshape(-1).view(torch.uint8).numpy()) if t.numel() else memoryview(b"")
    done = 0
    while done < len(view):
        n = os.preadv(fd, [view[done: done + _MAX_READ]], offset + done)
        if n == 0:
            raise ValueError(f"corrupt checkpoint file: {what} ends {len(view) - done} bytes early")
        done += n


class DcpReader:
    """The tensors of one DCP checkpoint directory (``dist/`` of a megatron-rl checkpoint)."""

    def __init__(self, directory: str | os.PathLike):
        self.dir = Path(directory)
        if not (self.dir / ".metadata").is_file():
            raise FileNotFoundError(f"{self.dir}/.metadata missing: not a torch_dist checkpoint")
        try:
            self.md = FileSystemReader(str(self.dir)).read_metadata()
        except Exception as e:  # unpickling a damaged file raises anything
            raise ValueError(f"corrupt checkpoint metadata {self.dir / '.metadata'}: {e}") from e
        self._fds: dict[str, int] = {}
        self._payload: dict[tuple, int | None] = {}

    def close(self) -> None:
        for fd in self._fds.values():
            os.close(fd)
        self._fds = {}

    def __enter__(self) -> DcpReader:  # noqa: PYI034
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def tensor_keys(self) -> list[str]:
        """Every tensor key (model, and for a training checkpoint the optimizer's too)."""
        return [k for k, v in self.md.state_dict_metadata.items() if isinstance(v, TensorStorageMetadata)]

    def _tensor_md(self, key: str):
        md = self.md.state_dict_metadata.get(key)
        if not isinstance(md, TensorStorageMetadata):
            raise KeyError(f"checkpoint {self.dir} has no tensor {key!r}" + ("" if md is None else " (it is a byte object)"))
        return md

    def dtype(self, key: str) -> torch.dtype:
        return self._tensor_md(key).properties.dtype

    def shape(self, key: str) -> tuple[int, ...]:
        return tuple(self._tensor_md(key).size)

    def _fd(self, rel: str) -> int:
        if rel not in self._fds:
            self._fds[rel] = os.open(self.dir / rel, os.O_RDONLY)
        return self._fds[rel]

    def _data_offset(self, info, nbytes: int) -> int | None:
        """Absolute file offset of the raw storage bytes of the record ``info`` (``None``: not framable)."""
        where = (info.relative_path, info.offset)
        if where not in self._payload:
            self._payload[where] = None
            if not getattr(info, "transform_descriptors", None):
                fd = self._fd(info.relative_path)
                try:
                    with zipfile.ZipFile(_RangeFile(fd, info.offset, info.length)) as z:
                        data = [i for i in z.infolist() if "/data/" in i.filename and not i.filename.endswith("/")]
                        if len(data) == 1 and data[0].compress_type == zipfile.ZIP_STORED and data[0].file_size == nbytes:
                            local = os.pread(fd, 30, info.offset + data[0].header_offset)
                            n_name, n_extra = struct.unpack("<HH", local[26:30])
                            self._payload[where] = info.offset + data[0].header_offset + 30 + n_name + n_extra
                except (zipfile.BadZipFile, struct.error):
                    pass
        return self._payload[where]

    def _read_chunk_into(self, key: str, chunk, dtype: torch.dtype, dst: torch.Tensor) -> None:
        """The whole stored ``chunk`` of ``key`` into ``dst`` (its shape, contiguous)."""
        info = self.md.storage_data[MetadataIndex(key, torch.Size(chunk.offsets))]
        nbytes = dst.numel() * dst.element_size()
        at = self._data_offset(info, nbytes)
        what = f"{self.dir / info.relative_path} record of {key!r} at {tuple(chunk.offsets)}"
        if at is not None:
            pread_into(self._fd(info.relative_path), at, dst, what)
            return
        raw = os.pread(self._fd(info.relative_path), info.length, info.offset)
        if len(raw) != info.length:
            raise ValueError(f"corrupt checkpoint: {what} is cut short ({len(raw)} of {info.length} bytes)")
        try:
            t = torch.load(io.BytesIO(raw), weights_only=True)
        except Exception as e:  # torch.load raises RuntimeError, pickle errors, ...
            raise ValueError(f"corrupt checkpoint: {what} does not load ({e})") from e
        if tuple(t.shape) != tuple(dst.shape):
            raise ValueError(f"corrupt checkpoint: {what} holds shape {tuple(t.shape)}, metadata says {tuple(dst.shape)}")
        dst.copy_(t.to(dtype))

    def row_ranges(self, key: str, prefix: tuple[int, ...], row0: int, rows: int,
                   dtype: torch.dtype) -> list[tuple[int, int, int]] | None:
        """Where the rows ``[row0, row0 + rows)`` (dim ``len(prefix)``) at leading index ``prefix`` of
        tensor ``key`` lie on disk, as ``(fd, offset, nbytes)`` pieces in order, or ``None`` when they
        are not plain byte ranges (stored in another dtype than ``dtype``, a chunk split along a later
        dim — a row-parallel TP shard —, or a record that cannot be framed): then :meth:`read`."""
        md = self._tensor_md(key)
        if md.properties.dtype != dtype:
            return None

        k, g = len(prefix), tuple(md.size)
        itemsize = torch.empty((), dtype=dtype).element_size()
        row_bytes = math.prod(g[k + 1:]) * itemsize
        out: list[tuple[int, int, int]] = []
        r = row0
        while r < row0 + rows:
            ch = next((c for c in md.chunks
                       if all(o <= i < o + n for o, n, i in zip(c.offsets[:k], c.sizes[:k], prefix))
                       and c.offsets[k] <= r < c.offsets[k] + c.sizes[k]
                       and tuple(c.sizes[k + 1:]) == g[k + 1:]), None)
            if ch is None:
                return None
            info = self.md.storage_data[MetadataIndex(key, torch.Size(ch.offsets))]
            at = self._data_offset(info, math.prod(ch.sizes) * itemsize)
            if at is None:
                return None
            # C order inside the chunk: index of (prefix, r, 0, ...) relative to the chunk's offsets
            idx = 0
            for d, (o, n) in enumerate(zip(ch.offsets[: k + 1], ch.sizes[: k + 1])):
                idx = idx * n + ((prefix[d] if d < k else r) - o)
            m = min(row0 + rows, ch.offsets[k] + ch.sizes[k]) - r
            fd, off, n = self._fd(info.relative_path), at + idx * row_bytes, m * row_bytes
            if out and out[-1][0] == fd and out[-1][1] + out[-1][2] == off:
                out[-1] = (fd, out[-1][1], out[-1][2] + n)
            else:
                out.append((fd, off, n))
            r += m
        return out

    def read(self, key: str, offsets: tuple[int, ...] | None = None, sizes: tuple[int, ...] | None = None) -> torch.Tensor:
        """The box ``global[offsets : offsets + sizes]`` of tensor ``key`` (default: all of it), in
        its stored dtype. ``ValueError`` when the stored chunks do not cover the box."""
        md = self._tensor_md(key)
        dtype, gshape = md.properties.dtype, tuple(md.size)
        offsets = tuple(offsets) if offsets is not None else (0,) * len(gshape)
        sizes = tuple(sizes) if sizes is not None else gshape
        out = torch.empty(sizes, dtype=dtype)
        covered = 0
        for ch in md.chunks:
            c_off, c_size = tuple(ch.offsets), tuple(ch.sizes)
            lo = [max(a, b) for a, b in zip(c_off, offsets)]
            hi = [min(a + s, b + t) for a, s, b, t in zip(c_off, c_size, offsets, sizes)]
            if any(h <= lo_ for lo_, h in zip(lo, hi)):
                continue
            dst = out[tuple(slice(lo_ - o, h - o) for lo_, h, o in zip(lo, hi, offsets))]
            whole = lo == list(c_off) and hi == [a + s for a, s in zip(c_off, c_size)]
            if whole and dst.is_contiguous():
                self._read_chunk_into(key, ch, dtype, dst)
            else:
                buf = torch.empty(c_size, dtype=dtype)
                self._read_chunk_into(key, ch, dtype, buf)
                dst.copy_(buf[tuple(slice(lo_ - o, h - o) for lo_, h, o in zip(lo, hi, c_off))])
            covered += math.prod(h - lo_ for lo_, h in zip(lo, hi))
        if covered != math.prod(sizes):
            raise ValueError(f"checkpoint {self.dir}: the stored chunks of {key!r} cover {covered} of the "
                             f"{math.prod(sizes)} elements at {offsets} + {sizes}")
        return out
