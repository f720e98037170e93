"""A micro-batch on one context-parallel rank (``parallel.cp`` > 1): its THD frame, the model inputs
of the rank's two chunks per sequence, and per-token terms computed on the rank's slice returned in
the unsplit target frame. The index arithmetic and the CP gather are ``context_parallel.py``.

Every micro-batch runs as THD under CP: packed rows by their segments (``packing.thd_layout``; padding
runs are sequences too), padded rows (the teacher passes) one sequence per row. Each THD sequence is
padded to a multiple of 2·cp; Megatron-core's THD + CP contract (``utils.get_thd_batch_on_this_cp_rank``)
takes ``cu_seqlens`` of the real lengths and ``cu_seqlens_*_padded`` of the padded offsets, both of the
whole batch, with the tokens of this rank only. GPU (TE) for the model; the rest runs on CPU
(``tests/distributed/test_context_parallel.py``).
"""
from __future__ import annotations

import dataclasses
from collections.abc import Callable

import torch

from megatron_rl.trainer.policy.context_parallel import (
    gather_cp,
    padded_cu_seqlens,
    padded_positions,
    partition_indices,
)


@dataclasses.dataclass(frozen=True)
class CPFrame:
    """``tokens`` / ``pos`` ``[1, T]`` (unpadded THD), ``cu`` / ``cu_pad`` cumulative real / 2·cp-padded
    lengths, ``ppos`` each token's padded position, ``idx`` this rank's positions in the padded frame."""

    tokens: torch.Tensor
    pos: torch.Tensor
    cu: torch.Tensor
    cu_pad: torch.Tensor
    ppos: torch.Tensor
    idx: torch.Tensor

    @property
    def total(self) -> int:
        return int(self.cu_pad[-1])


def frame(mb, cp: int, rank: int, sp_tp: int = 1) -> CPFrame:
    """The :class:`CPFrame` of micro-batch ``mb`` (a ``PackedMicroBatch`` with ``thd`` or a padded
    ``TrainBatch``) on CP rank ``rank`` of ``cp``; ``sp_tp``: the TP size under sequence parallelism
    (sequences padded to 2·cp·tp so each rank's tokens split evenly over TP), else 1."""
    from megatron_rl.trainer.pipeline.packing import thd_layout

    if getattr(mb, "thd", False):
        tokens, pos, cu, _ = thd_layout(mb)
    else:
        rows, length = mb.num_samples, mb.seq_len
        tokens = mb.tokens.reshape(1, -1)
        pos = mb.position_ids().expand(rows, length).reshape(1, -1)
        cu = (torch.arange(rows + 1, device=tokens.device) * length).to(torch.int32)
    cu_pad = padded_cu_seqlens(cu, cp, sp_tp)
    ppos = padded_positions(cu, cu_pad)
    return CPFrame(tokens, pos, cu, cu_pad, ppos, partition_indices(cu_pad, cp, rank).to(ppos.device))


def rank_frame(mb, groups, sequence_parallel: bool) -> CPFrame:
    """:func:`frame` on this rank of ``groups`` (``schedule.Groups``)."""
    return frame(mb, groups.cp_size, groups.cp_rank, groups.tp_size if sequence_parallel else 1)


def model_inputs(fr: CPFrame):
    """``(tokens [1, n_local], positions [1, n_local], PackedSeqParams)`` for the model's forward."""
    from megatron.core.packed_seq_params import PackedSeqParams

    tok = fr.tokens.new_zeros((1, fr.total))
    tok[0, fr.ppos] = fr.tokens[0]
    pos = fr.pos.new_zeros((1, fr.total))
    pos[0, fr.ppos] = fr.pos[0]
    longest = int((fr.cu_pad[1:] - fr.cu_pad[:-1]).max())
    psp = PackedSeqParams(qkv_format="thd", cu_seqlens_q=fr.cu, cu_seqlens_kv=fr.cu, cu_seqlens_q_padded=fr.cu_pad,
                          cu_seqlens_kv_padded=fr.cu_pad, max_seqlen_q=longest, max_seqlen_kv=longest)
    return tok.index_select(1, fr.idx), pos.index_select(1, fr.idx), psp


def per_token(mb, fr: CPFrame, logits: torch.Tensor, temperature: float, fn: Callable, inputs, group, rank: int,
              cp: int) -> dict[str, torch.Tensor]:
    """Per-token terms ``fn(z, *inputs) -> {key: [1, n_local, ...]}`` on this rank's slice (``logits``
    ``[1, n_local, V]``, ``z`` = logits / temperature; ``inputs`` in the target frame ``[rows, L-1, ...]``,
    sliced the same way), gathered over the CP group (differentiable) and returned in the target frame
    ``[rows, L-1, ...]``, as the unsplit path computes them from ``logits[:, :-1]``."""
    rows, length = mb.num_samples, mb.seq_len
    ppos, idx = fr.ppos.to(logits.device), fr.idx.to(logits.device)

    def local(x: torch.Tensor) -> torch.Tensor:          # [rows, L-1, ...] -> [1, n_local, ...]
        full = x.new_zeros((rows, length, *x.shape[2:]))
        full[:, :-1] = x
        pad = x.new_zeros((fr.total, *x.shape[2:]))
        pad[ppos] = full.reshape(rows * length, *x.shape[2:])
        return pad.index_select(0, idx)[None]

    z = logits / temperature if temperature != 1.0 else logits
    out = {}
    for key, v in fn(z, *(local(x) for x in inputs)).items():
        full = gather_cp(v[0], fr.cu_pad.to(v.device), group, rank, cp).index_select(0, ppos)
        out[key] = full.reshape(rows, length, *full.shape[1:])[:, :-1]
    return out
