"""The trainer's input bundle: token ids, the loss mask and per-sample / per-token extras.

Notation:
    N  samples (sequences) in the batch, S  padded sequence length (prompt + response).

Layout (right padding only):
    ``tokens[n, :]``      prompt ids, response ids, then pad ids up to S.
    ``loss_mask[n, t]``   1.0 where target ``tokens[n, t + 1]`` is a response token, else 0.0;
                          shape ``[N, S - 1]``, aligned with ``targets = tokens[:, 1:]`` and with the
                          log-probs returned by the actor.
    ``extras[k]``         any tensor whose first dim is N (advantages ``[N]``, old/ref log-probs
                          ``[N, S - 1]``, ...); sliced together with the tokens per micro-batch.

Attention: right padding means pad tokens only ever come *after* the real tokens, so the plain
causal mask is exact for every real position (a pad token can never be attended to by a real one).
Position ids are ``0..S-1`` for every row.

Packed rows (teacher passes, token-budget policy micro-batches: ``packing.py``): ``extras["segment_ids"]`` ``[N, S]`` int marks which sequence each
token belongs to (-1 = padding). The mask is then block-diagonal causal, ``[N, 1, S, S]``: token i
sees token j iff j <= i and both are in the same segment. Positions stay ``0..S-1``: RoPE scores
depend only on the offset i - j, so a segment starting at column c gives the same logits as the
sequence alone (up to float rounding of the larger angles; tested to 1e-5 in fp32).
"""
from __future__ import annotations

import dataclasses
from typing import Mapping

import torch
import torch.distributed as dist

from megatron_rl.algorithms.inputs import input_spec, is_input
from megatron_rl.runtime.device import default_device


RESP_MASK = "resp_mask"     #: the response-token mask every loss reads (the ``mask`` input)


@dataclasses.dataclass(frozen=True)
class TrainBatch:
    """One batch of sequences for log-prob / training passes.

    Attributes:
        tokens: ``[N, S]`` int64 token ids, right-padded.
        loss_mask: ``[N, S-1]`` float32, 1 on response targets (``tokens[:, 1:]``).
        extras: name -> tensor with leading dim N (per-sample ``[N]`` or per-token ``[N, S-1]``).
    """

    tokens: torch.Tensor
    loss_mask: torch.Tensor
    extras: Mapping[str, torch.Tensor] = dataclasses.field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.tokens.dim() != 2:
            raise ValueError(f"TrainBatch.tokens must be [N, S], got shape {tuple(self.tokens.shape)}")
        if self.tokens.dtype not in (torch.int64, torch.int32):
            raise ValueError(f"TrainBatch.tokens must be integer ids, got {self.tokens.dtype}")
        n, s = self.tokens.shape
        if s < 2:
            raise ValueError(f"TrainBatch.tokens needs S >= 2 (one input and one target), got S={s}")
        if tuple(self.loss_mask.shape) != (n, s - 1):
            raise ValueError(
                f"TrainBatch.loss_mask must be [N, S-1] = {(n, s - 1)} (aligned with tokens[:, 1:]), "
                f"got {tuple(self.loss_mask.shape)}")
        for k, v in self.extras.items():
            if not isinstance(v, torch.Tensor):
                raise TypeError(f"TrainBatch.extras[{k!r}] must be a tensor, got {type(v).__name__}")
            if v.dim() == 0 or v.shape[0] != n:
                raise ValueError(f"TrainBatch.extras[{k!r}] must have leading dim N={n}, got {tuple(v.shape)}")
        object.__setattr__(self, "extras", dict(self.extras))

    @property
    def num_samples(self) -> int:
        return int(self.tokens.shape[0])

    @property
    def seq_len(self) -> int:
        return int(self.tokens.shape[1])

    @property
    def targets(self) -> torch.Tensor:
        """``[N, S-1]`` next-token targets ``tokens[:, 1:]``."""
        return self.tokens[:, 1:]

    def position_ids(self) -> torch.Tensor:
        """``[N, S]`` positions ``0..S-1`` (right padding keeps real positions contiguous); packed
        policy rows carry their own (``extras["position_ids"]``: restarting at 0 per sequence)."""
        if "position_ids" in self.extras:
            return self.extras["position_ids"]
        return torch.arange(self.seq_len, device=self.tokens.device).unsqueeze(0).expand(self.num_samples, -1)

    def attention_mask(self) -> torch.Tensor:
        """``[1, 1, S, S]`` bool causal mask in megatron's convention (True = masked out)."""
        s = self.seq_len
        causal = torch.triu(torch.ones(s, s, dtype=torch.bool, device=self.tokens.device), diagonal=1)[None, None]
        seg = self.extras.get("segment_ids")
        if seg is None:
            return causal
        return causal | (seg[:, None, :, None] != seg[:, None, None, :])

    def slice(self, start: int, stop: int) -> "TrainBatch":
        """Rows ``start:stop`` of every tensor (tokens, mask, extras)."""
        if not 0 <= start < stop <= self.num_samples:
            raise IndexError(f"TrainBatch.slice({start}, {stop}) out of range for N={self.num_samples}")
        return TrainBatch(self.tokens[start:stop], self.loss_mask[start:stop],
                          {k: v[start:stop] for k, v in self.extras.items()})

    def shard(self, rank: int, world: int) -> "TrainBatch":
        """The contiguous ``rank``-th of ``world`` equal parts (data-parallel split)."""
        if self.num_samples % world:
            raise ValueError(f"batch of {self.num_samples} samples does not split into {world} data-parallel ranks")
        per = self.num_samples // world
        return self.slice(rank * per, (rank + 1) * per)

    def micro_batches(self, micro_batch_size: int) -> list["TrainBatch"]:
        """Consecutive micro-batches of ``micro_batch_size`` rows (N must be divisible)."""
        if micro_batch_size <= 0 or self.num_samples % micro_batch_size:
            raise ValueError(
                f"micro_batch_size={micro_batch_size} must divide the (per-rank) batch size {self.num_samples}")
        return [self.slice(i, i + micro_batch_size) for i in range(0, self.num_samples, micro_batch_size)]

    def pad_to_multiple(self, multiple: int, pad_id: int = 0) -> "TrainBatch":
        """Right-pad S to a multiple of ``multiple`` (mask 0, per-token extras 0) — needed for SP."""
        s = self.seq_len
        extra = (-s) % multiple
        if extra == 0:
            return self
        n = self.num_samples
        tokens = torch.cat([self.tokens, self.tokens.new_full((n, extra), pad_id)], dim=1)
        mask = torch.cat([self.loss_mask, self.loss_mask.new_zeros((n, extra))], dim=1)
        extras = {}
        for k, v in self.extras.items():
            if k == "segment_ids":
                v = torch.cat([v, v.new_full((n, extra), -1)], dim=1)
            elif k == "position_ids":
                v = torch.cat([v, v.new_zeros((n, extra))], dim=1)
            elif v.dim() >= 2 and v.shape[1] == s - 1:
                v = torch.cat([v, v.new_zeros((n, extra, *v.shape[2:]))], dim=1)
            extras[k] = v
        return TrainBatch(tokens, mask, extras)

    def narrow(self, seq_len: int) -> TrainBatch:
        """The first ``seq_len`` columns: tokens and ``segment_ids`` ``[N, seq_len]``, loss mask and
        per-token extras ``[N, seq_len - 1, ...]`` (the inverse of :meth:`pad_to_multiple`). Under
        causal attention with positions ``0..S-1`` every kept column computes what it does in the
        full batch, so cutting columns that are padding in every row loses nothing."""
        s = self.seq_len
        if not 2 <= seq_len <= s:
            raise ValueError(f"TrainBatch.narrow({seq_len}) needs 2 <= seq_len <= S={s}")
        if seq_len == s:
            return self
        extras = {}
        for k, v in self.extras.items():
            if k == "segment_ids":
                v = v[:, :seq_len]
            elif v.dim() >= 2 and v.shape[1] == s - 1:
                v = v[:, :seq_len - 1]
            extras[k] = v
        return TrainBatch(self.tokens[:, :seq_len], self.loss_mask[:, :seq_len - 1], extras)

    def zero_masked(self) -> "TrainBatch":
        """A copy whose every mask is zero, so its rows add nothing to a loss, a normaliser or a metric:
        the padding copies of a padded batch and the filler of a packed one. Masks: ``loss_mask``,
        ``resp_mask`` and each extra registered as an input with a ``filler``
        (``algorithms.register_input``), which says what such a row holds (e.g. a mask of negative
        hints keeps one slot valid so the signal stays defined)."""
        ex = {k: v.clone() for k, v in self.extras.items()}
        for k, v in ex.items():
            filler = torch.zeros_like if k == RESP_MASK else (input_spec(k).filler if is_input(k) else None)
            if filler is not None:
                ex[k] = filler(v)
        return TrainBatch(self.tokens, torch.zeros_like(self.loss_mask), ex)

    def pad_rows_to_multiple(self, multiple: int) -> "TrainBatch":
        """Append zero-mask copies of row 0 (:meth:`zero_masked`; spec: zero-mask padding copies contribute
        nothing) until N is a multiple of ``multiple`` (the padded path's even DP x micro-batch split)."""
        extra = (-self.num_samples) % multiple
        if extra == 0:
            return self
        pad = self.slice(0, 1).zero_masked()
        idx = torch.zeros(extra, dtype=torch.long)
        return TrainBatch(torch.cat([self.tokens, pad.tokens[idx]]), torch.cat([self.loss_mask, pad.loss_mask[idx]]),
                          {k: torch.cat([v, pad.extras[k][idx]]) for k, v in self.extras.items()})

    def to(self, device: torch.device | str) -> "TrainBatch":
        return TrainBatch(self.tokens.to(device), self.loss_mask.to(device),
                          {k: v.to(device) for k, v in self.extras.items()})


def make_batch(prompts: list[list[int]], responses: list[list[int]], pad_id: int = 0,
               extras: Mapping[str, torch.Tensor] | None = None, seq_len: int | None = None) -> TrainBatch:
    """Build a right-padded :class:`TrainBatch` from prompt / response id lists.

    ``loss_mask[n, t] = 1`` iff ``len(prompt_n) - 1 <= t < len(prompt_n) + len(response_n) - 1``,
    i.e. exactly the positions whose target is a response token.
    """
    if len(prompts) != len(responses):
        raise ValueError(f"make_batch: {len(prompts)} prompts but {len(responses)} responses")
    lens = [len(p) + len(r) for p, r in zip(prompts, responses)]
    s = max(lens) if seq_len is None else seq_len
    if max(lens) > s:
        raise ValueError(f"make_batch: a sequence of length {max(lens)} exceeds seq_len={s}")
    tokens = torch.full((len(prompts), s), pad_id, dtype=torch.long)
    mask = torch.zeros((len(prompts), s - 1), dtype=torch.float32)
    for i, (p, r) in enumerate(zip(prompts, responses)):
        if len(p) == 0:
            raise ValueError(f"make_batch: prompt {i} is empty (the first response token needs a context)")
        tokens[i, : len(p) + len(r)] = torch.tensor(list(p) + list(r), dtype=torch.long)
        mask[i, len(p) - 1: len(p) + len(r) - 1] = 1.0
    return TrainBatch(tokens, mask, dict(extras or {}))


def broadcast_batch(batch: TrainBatch | None, src: int = 0, group: dist.ProcessGroup | None = None) -> TrainBatch:
    """Send ``batch`` from global rank ``src`` to every rank of ``group``; returns it everywhere.

    Metadata (keys, shapes, dtypes) goes first through ``broadcast_object_list``, then each tensor
    through ``broadcast``. Non-source ranks pass ``None``.
    """
    rank = dist.get_rank()
    if rank == src and batch is None:
        raise ValueError("broadcast_batch: the source rank must pass a TrainBatch, got None")
    if rank == src:
        items = [("tokens", batch.tokens), ("loss_mask", batch.loss_mask)] + \
                [(f"extras.{k}", v) for k, v in batch.extras.items()]
        meta = [[(n, tuple(t.shape), t.dtype) for n, t in items]]
    else:
        meta = [None]
    dist.broadcast_object_list(meta, src=src, group=group)
    dev = default_device() if dist.get_backend(group) == "nccl" else torch.device("cpu")
    out: dict[str, torch.Tensor] = {}
    for name, shape, dtype in meta[0]:
        if rank == src:
            t = dict(items)[name].contiguous().to(dev)
        else:
            t = torch.empty(shape, dtype=dtype, device=dev)
        dist.broadcast(t, src=src, group=group)
        out[name] = t
    extras = {n[len("extras."):]: t for n, t in out.items() if n.startswith("extras.")}
    return TrainBatch(out["tokens"], out["loss_mask"], extras)


def mini_batches(n_rows: int, rows_per_mini_batch: int) -> list[list[int]]:
    """Row indices of each mini-batch: consecutive chunks of ``rows_per_mini_batch`` (0 = one chunk of
    all rows); the last chunk is shorter when the rows do not divide (a filtered batch, as verl's
    ``DataProto.split``). No shuffle."""
    size = rows_per_mini_batch if rows_per_mini_batch > 0 else max(n_rows, 1)
    return [list(range(i, min(i + size, n_rows))) for i in range(0, n_rows, size)]
