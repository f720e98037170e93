"""Token-budget micro-batches: how every policy pass lays out its sequences (``trainer.max_tokens_per_micro_batch``).

A pass gets the GLOBAL batch as right-padded rows (``TrainBatch [N, S]``, one sequence per row). With a
:class:`TokenBudget` the actor does not run those rows; it plans (:func:`plan`):

    sequences --(LPT: longest first onto the DP rank with the fewest tokens)--> DP ranks
      --(first-fit decreasing into rows of L tokens)--> packed rows        L = longest sequence, rounded up
      --(consecutive chunks of <= budget // L rows)--> micro-batches       the same count on every DP rank
                                                                           (and, with PP, the same shape)
      --(without PP: each re-packed into its shortest rows)--> rows of L_m <= L  (``tighten``: a rank's
                                                                           last, partly filled rows)

Inside a packed row each sequence is one segment: positions restart at 0 and attention is
block-diagonal causal (``TrainBatch.extras["segment_ids"]``, ``batch.py``). A micro-batch
(:class:`PackedMicroBatch`) keeps the per-sequence view of its sequences (the global batch's rows:
extras, masks) and the map between the two frames, so log-probs, entropies and supports computed on the
packed rows come back in each sequence's own ``[S-1]`` target frame (:meth:`PackedMicroBatch.unpack`):
the losses, the response-frame gathers and the global normalisers never see the packing.

The budget counts row SLOTS (rows x L, padding included), which is what sets the activation memory.
A sequence longer than the budget is an error naming both numbers. Padded micro-batches (one sequence per
row, a fixed number of rows) stay available as ``trainer.max_tokens_per_micro_batch: 0`` with
``trainer.micro_batch_size`` rows.
"""
from __future__ import annotations

import dataclasses
import math

import torch

from megatron_rl.trainer.pipeline.batch import TrainBatch


@dataclasses.dataclass(frozen=True)
class TokenBudget:
    """Packed micro-batches of at most ``max_tokens`` row slots per DP rank; row lengths rounded up to
    ``multiple`` (8, times TP with sequence parallelism)."""

    max_tokens: int
    multiple: int = 8

    def __post_init__(self):
        if self.max_tokens < 2 or self.multiple < 1:
            raise ValueError(f"TokenBudget: max_tokens must be >= 2 and multiple >= 1, got {self.max_tokens}, {self.multiple}")


def micro_of(cfg, tp: int = 1) -> TokenBudget | int:
    """A run's micro-batching: ``TokenBudget(trainer.max_tokens_per_micro_batch)`` (rows a multiple of
    8 x TP), or the padded rows per micro-batch when the budget is 0."""
    t = cfg.trainer
    return TokenBudget(t.max_tokens_per_micro_batch, 8 * max(1, tp)) if t.max_tokens_per_micro_batch \
        else t.rows_per_micro_batch


def seq_lengths(batch: TrainBatch) -> list[int]:
    """Real length of each right-padded row: through its last response target (``loss_mask``) — the
    tokens after it are padding; a row without any target (a zero-mask padding copy) counts 2 tokens."""
    m = batch.loss_mask > 0
    has = m.any(1)
    last = torch.where(has, (m.shape[1] - 1) - m.flip(1).float().argmax(1), torch.zeros_like(has, dtype=torch.long))
    return [int(x) + 2 if h else 2 for x, h in zip(last.tolist(), has.tolist())]


def balance_dp(lengths: list[int], dp: int) -> list[list[int]]:
    """Sequence indices per DP rank so that TOKENS balance: longest first, each onto the rank with
    the fewest tokens so far (ties: fewer sequences, then lower rank); each rank's list in index order."""
    load = [(0, 0, r) for r in range(dp)]
    out: list[list[int]] = [[] for _ in range(dp)]
    for i in sorted(range(len(lengths)), key=lambda i: (-lengths[i], i)):
        tok, cnt, r = min(load)
        out[r].append(i)
        load[r] = (tok + lengths[i], cnt + 1, r)
    return [sorted(x) for x in out]


def ffd_rows(lengths: list[int], idx: list[int], row_len: int) -> list[list[int]]:
    """First-fit decreasing of sequences ``idx`` into rows of ``row_len`` tokens: each row's sequences
    in placement order."""
    rows: list[list[int]] = []
    fill: list[int] = []
    for i in sorted(idx, key=lambda i: (-lengths[i], i)):
        for r, used in enumerate(fill):
            if used + lengths[i] <= row_len:
                rows[r].append(i)
                fill[r] += lengths[i]
                break
        else:
            rows.append([i])
            fill.append(lengths[i])
    return rows


@dataclasses.dataclass
class PackedMicroBatch:
    """One packed micro-batch: the model's rows (``batch``: tokens ``[rows, L]``, ``segment_ids``,
    restarting positions) and the per-sequence view (``seqs``: its sequences as rows of the global
    batch, ``[n, S]``). ``index [n, S-1]``: flat position in the packed target frame ``[rows * (L-1)]``
    of each sequence's target t (valid where ``valid``); ``owner``: global row index of each sequence
    (-1 for a zero-mask filler that keeps the micro-batch count equal across DP ranks)."""

    batch: TrainBatch
    seqs: TrainBatch
    index: torch.Tensor
    valid: torch.Tensor
    owner: list[int]
    thd: bool = False         # run as one THD sequence batch (Transformer Engine; ``thd_layout``)

    @property
    def schedule_shape(self) -> tuple[int, int]:
        """(sequence length, micro-batch size) the pipeline's p2p buffers see: ``(rows x L, 1)`` as THD."""
        return (self.batch.num_samples * self.batch.seq_len, 1) if self.thd else (self.batch.seq_len, self.batch.num_samples)

    # the actor's schedule treats a micro-batch like a TrainBatch (shape, device, model inputs)
    @property
    def num_samples(self) -> int:
        return self.batch.num_samples

    @property
    def seq_len(self) -> int:
        return self.batch.seq_len

    @property
    def tokens(self) -> torch.Tensor:
        return self.batch.tokens

    @property
    def targets(self) -> torch.Tensor:
        return self.batch.targets

    @property
    def extras(self):
        return self.batch.extras

    def position_ids(self) -> torch.Tensor:
        return self.batch.position_ids()

    def attention_mask(self) -> torch.Tensor:
        return self.batch.attention_mask()

    def to(self, device) -> PackedMicroBatch:
        return PackedMicroBatch(self.batch.to(device), self.seqs.to(device), self.index.to(device),
                                self.valid.to(device), self.owner, self.thd)

    def unpack(self, x: torch.Tensor) -> torch.Tensor:
        """``[rows, L-1, ...]`` packed-frame values -> ``[n, S-1, ...]`` per sequence (0 beyond it)."""
        flat = x.reshape(-1, *x.shape[2:])[self.index.reshape(-1)]
        out = flat.reshape(*self.index.shape, *x.shape[2:])
        v = self.valid.reshape(*self.valid.shape, *([1] * (x.dim() - 2)))
        return torch.where(v, out, torch.zeros((), dtype=out.dtype, device=out.device))

    def pack_target(self, x: torch.Tensor) -> torch.Tensor:
        """``[n, S-1, ...]`` per-sequence target-frame values -> ``[rows, L-1, ...]`` (0 elsewhere)."""
        rows, l1 = self.batch.num_samples, self.batch.seq_len - 1
        out = x.new_zeros((rows * l1, *x.shape[2:]))
        v = self.valid.reshape(-1)
        out[self.index.reshape(-1)[v]] = x.reshape(-1, *x.shape[2:])[v]
        return out.reshape(rows, l1, *x.shape[2:])


@dataclasses.dataclass
class PackPlan:
    """Where every sequence of a global batch goes: ``ranks[r]`` the micro-batches of DP rank r, each a
    list of packed rows (lists of global row indices); ``row_len`` L; the padded slots' share.
    ``mb_row_len[r][m]`` (<= L): the row length of micro-batch m of rank r when micro-batches may differ
    in shape (no pipeline parallelism; :func:`tighten`); None: every micro-batch at L."""

    ranks: list[list[list[list[int]]]]
    row_len: int
    lengths: list[int]
    mb_row_len: list[list[int]] | None = None

    @property
    def micro_batches(self) -> int:
        return len(self.ranks[0])

    def row_len_of(self, rank: int, mb: int, same_shape: bool = False) -> int:
        """Row length of micro-batch ``mb`` of DP rank ``rank`` (``same_shape``: L)."""
        return self.row_len if same_shape or self.mb_row_len is None else self.mb_row_len[rank][mb]

    def slots(self, same_shape: bool = False) -> int:
        """Token slots the passes process (``same_shape``: every micro-batch of a rank at its widest, rows of L)."""
        if same_shape:
            return sum(len(rk) * max(1, max(len(mb) for mb in rk)) * self.row_len for rk in self.ranks)
        return sum(max(1, len(mb)) * self.row_len_of(r, m) for r, rk in enumerate(self.ranks) for m, mb in enumerate(rk))

    def pad_frac(self, same_shape: bool = False) -> float:
        """Padded slots / processed slots."""
        return 1.0 - sum(self.lengths) / max(self.slots(same_shape), 1)

    def rank_tokens(self) -> list[int]:
        return [sum(self.lengths[i] for mb in rk for row in mb for i in row) for rk in self.ranks]


def plan(lengths: list[int], budget: TokenBudget, dp: int, min_micro_batches: int = 1) -> PackPlan:
    """The packing of a global batch with sequence ``lengths`` over ``dp`` ranks (module docstring);
    at least ``min_micro_batches`` per rank (zero-mask fillers where sequences run out: Megatron's
    interleaved schedule needs as many micro-batches as pipeline stages)."""
    if not lengths:
        raise ValueError("packing: no sequences")
    longest = max(lengths)
    row_len = -(-longest // budget.multiple) * budget.multiple
    if row_len > budget.max_tokens:
        raise ValueError(f"a sequence of {longest} tokens (row length {row_len}) does not fit "
                         f"trainer.max_tokens_per_micro_batch={budget.max_tokens}; raise the budget to at least {row_len}")
    per_mb = budget.max_tokens // row_len
    rows = [ffd_rows(lengths, idx, row_len) for idx in balance_dp(lengths, dp)]
    k = max(1, min_micro_batches, max(math.ceil(len(r) / per_mb) for r in rows))
    ranks = []
    for r in rows:
        if len(r) < k:      # too few rows for k micro-batches: one sequence per row, then fillers
            r = [[i] for row in r for i in row]
        size = max(1, math.ceil(len(r) / k))
        mbs = [r[j:j + size] for j in range(0, len(r), size)][:k]
        ranks.append(mbs + [[] for _ in range(k - len(mbs))])
    tight = [[tighten(lengths, mb, row_len, budget.multiple) for mb in rk] for rk in ranks]
    return PackPlan([[rows for rows, _ in rk] for rk in tight], row_len, list(lengths),
                    [[n for _, n in rk] for rk in tight])


def tighten(lengths: list[int], rows: list[list[int]], row_len: int, multiple: int) -> tuple[list[list[int]], int]:
    """A micro-batch's sequences re-packed (first-fit decreasing) into at most as many rows of the
    shortest length (a ``multiple``, below ``row_len``) that holds them, so a micro-batch of partly filled
    rows (a rank's last rows) stops paying for their empty tails: ``(rows, length)``; unchanged when no
    shorter length fits, and for an empty micro-batch (its filler row needs ``row_len``). The rows fit
    into rows of ``row_len`` too, so pipeline parallelism (one shape for all) runs them at ``row_len``."""
    seqs = [i for row in rows for i in row]
    if not seqs:
        return rows, row_len
    need = max(max(lengths[i] for i in seqs), -(-sum(lengths[i] for i in seqs) // len(rows)))
    for n in range(-(-need // multiple) * multiple, row_len, multiple):
        packed = ffd_rows(lengths, seqs, n)
        if len(packed) <= len(rows):
            return packed, n
    return rows, row_len


def build_micro_batch(batch: TrainBatch, rows: list[list[int]], row_len: int, n_rows: int, lengths: list[int],
                      pad_id: int = 0, pack_keys=()) -> PackedMicroBatch:
    """The :class:`PackedMicroBatch` of packed ``rows`` (global row indices) of ``batch``, padded to
    ``n_rows`` rows of ``row_len``; no rows: one zero-mask filler copy of row 0 (contributes nothing).
    ``pack_keys``: target-frame extras ``[N, S-1, ...]`` the model side reads (vocabulary ids of a
    support), also laid out in the packed frame."""
    owner = [i for row in rows for i in row]
    filler = not owner
    if filler:
        rows, owner = [[0]], [0]
    s1 = batch.seq_len - 1
    tokens = torch.full((n_rows, row_len), pad_id, dtype=batch.tokens.dtype)
    seg = torch.full((n_rows, row_len), -1, dtype=torch.long)
    pos = torch.zeros((n_rows, row_len), dtype=torch.long)
    loss_mask = torch.zeros((n_rows, row_len - 1), dtype=batch.loss_mask.dtype)
    index = torch.zeros((len(owner), s1), dtype=torch.long)
    valid = torch.zeros((len(owner), s1), dtype=torch.bool)
    j = 0
    for r, row in enumerate(rows):
        off = 0
        for i in row:
            n = lengths[i]
            tokens[r, off:off + n] = batch.tokens[i, :n]
            seg[r, off:off + n] = j
            pos[r, off:off + n] = torch.arange(n)
            loss_mask[r, off:off + n - 1] = batch.loss_mask[i, :n - 1]
            index[j, :n - 1] = r * (row_len - 1) + off + torch.arange(n - 1)
            valid[j, :n - 1] = True
            off += n
            j += 1
    sel = torch.tensor(owner, dtype=torch.long)
    seqs = TrainBatch(batch.tokens[sel], batch.loss_mask[sel], {k: v[sel] for k, v in batch.extras.items()})
    if filler:
        seqs = seqs.zero_masked()
        loss_mask.zero_()
    model = TrainBatch(tokens, loss_mask, {"segment_ids": seg, "position_ids": pos})
    mb = PackedMicroBatch(model, seqs, index, valid, [-1] if filler else owner)
    for k in pack_keys:
        model.extras[k] = mb.pack_target(seqs.extras[k])
    return mb


def unpacked_collection(collect, mb, logits: torch.Tensor):
    """A forward-only collection ``collect(mb, logits) -> (zero, count, data)`` of a packed micro-batch
    with ``data`` unpacked into its sequences' frame, and the global rows it holds under ``"_owner"``
    (``[-1]`` marks a filler); a padded micro-batch's collection as is."""
    z, n, data = collect(mb, logits)
    if isinstance(mb, PackedMicroBatch):
        data = {k: mb.unpack(v) for k, v in data.items()}
        data["_owner"] = mb.owner
    return z, n, data


class RankMicroBatches:
    """DP rank ``dp_rank``'s micro-batches of ``batch`` under plan ``pp``, each built when the schedule
    reads it (:func:`build_micro_batch`) and dropped after its pass: only the micro-batch in flight holds
    its packed rows and its sequences' copies, as only a padded micro-batch's views are alive (the
    padded path slices views of the batch), so packing adds no batch-sized copies to the peak.
    ``same_shape`` (pipeline parallelism: the p2p buffers are sized once) pads each to the rank's
    widest with empty rows; ``thd``: the micro-batches run as THD (Transformer Engine)."""

    def __init__(self, batch: TrainBatch, pp: PackPlan, dp_rank: int, pad_id: int = 0, pack_keys=(),
                 same_shape: bool = False, thd: bool = False):
        self.batch, self.plan, self.rank = batch, pp, dp_rank
        self.pad_id, self.pack_keys, self.thd = pad_id, tuple(pack_keys), thd
        mbs = pp.ranks[dp_rank]
        widest = max(1, max(len(mb) for mb in mbs))
        self.shapes = [(pp.row_len_of(dp_rank, m, same_shape), widest if same_shape else max(1, len(mb)))
                       for m, mb in enumerate(mbs)]       # (row length, rows) of each micro-batch

    def __len__(self) -> int:
        return len(self.shapes)

    def __getitem__(self, m: int) -> PackedMicroBatch:
        if not -len(self) <= m < len(self):
            raise IndexError(m)
        row_len, n_rows = self.shapes[m]
        mb = build_micro_batch(self.batch, self.plan.ranks[self.rank][m], row_len, n_rows, self.plan.lengths,
                               self.pad_id, self.pack_keys)
        mb.thd = self.thd
        return mb

    def __iter__(self):
        return (self[m] for m in range(len(self)))

    @property
    def schedule_shapes(self) -> list[tuple[int, int]]:
        """:attr:`PackedMicroBatch.schedule_shape` of each micro-batch, without building it."""
        return [(n * length, 1) if self.thd else (length, n) for length, n in self.shapes]


def thd_layout(batch: TrainBatch) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, int]:
    """Packed rows as Transformer Engine's THD input (GPU path; TE's causal kernels ignore a dense mask):
    ``(tokens [1, T], position_ids [1, T], cu_seqlens [segments + 1] int32, max_seqlen)`` with T = rows x L.
    Every run of one segment id in a row is one THD sequence — padding runs too, so ``cu_seqlens`` covers
    all T tokens and the output reshapes back to ``[rows, L, ...]``."""
    seg = batch.extras["segment_ids"]
    rows, length = seg.shape
    flat = seg.reshape(-1)
    row_start = torch.zeros_like(flat, dtype=torch.bool)
    row_start[::length] = True
    change = torch.ones_like(flat, dtype=torch.bool)
    change[1:] = flat[1:] != flat[:-1]
    starts = torch.nonzero(change | row_start).reshape(-1)
    cu = torch.cat([starts, torch.tensor([rows * length], device=starts.device)]).to(torch.int32)
    return (batch.tokens.reshape(1, -1), batch.position_ids().reshape(1, -1), cu,
            int((cu[1:] - cu[:-1]).max()))
