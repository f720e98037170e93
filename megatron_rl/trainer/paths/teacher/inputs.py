"""Teacher inputs of the self-distillation methods: hint plans, teacher prompts, packed sequences.

Data paths (``path.py``; ``plan_hints`` / ``plan_gt``):

* ``rlcsd_hints`` (rlcsd, opsd_ectr, rlsd_ectr; docs/methods/self-distillation.md): hints are sibling rollouts. Groups
  without a correct and a usable (answer-bearing) incorrect rollout are dropped, targets whose
  own pools are empty are dropped, each surviving target i gets one positive c_i and K_i <= K_max
  negatives. Teacher inputs per target: slot 0 = z(c_i), slots 1..K_i = z(w_i^k).
* ``gt_teacher`` (opsd, sdpo, srpo, rlsd; docs/methods/self-distillation.md): one teacher input per sample, built from the
  dataset's reference solution and ground-truth answer. Nothing is dropped.

Every teacher input is ``teacher_prompt ++ response_i`` (the student's exact tokens), left-truncated
in the prompt when longer than ``max_len``. Templates:

* :class:`ChatHintTemplate` (docs/methods/self-distillation.md): the reference-solution user turn of
  ``algorithms.rlcsd_teacher_prompt`` through the tokenizer's chat template; a hint's answer is its
  last ``\\boxed{}`` (GT answer when a positive has none); rollouts with no box cannot be negatives.
* :class:`InlineHintTemplate` (template-less SentencePiece tasks, the CPU demo): the hint's answer
  tokens and a separator right after BOS, in front of the unchanged prompt — the serialisation the
  BiCC contexts use. Positive and negative hints share the same scaffolding (only the hint differs),
  which is the spec's symmetry invariant.

:func:`pack` bins all teacher sequences of a step into few rows (first-fit decreasing) with
block-diagonal attention (``TrainBatch`` ``segment_ids``), so the K+1 passes of many samples are a
handful of forward rows with little padding.
"""
from __future__ import annotations

import dataclasses
import math
import random
from collections.abc import Sequence
from pathlib import Path

import torch

from megatron_rl import algorithms as A
from megatron_rl.models.provider import model_arch_info
from megatron_rl.rewards.problem import problem_text
from megatron_rl.trainer.pipeline.batch import TrainBatch

# ------------------------------------------------------------------------------------ templates


class ChatHintTemplate:
    """Spec §1.3.5 teacher prompt through the chat template (thinking on when the template has it)."""

    name = "chat"

    def __init__(self, tokenizer, add_bos: bool = True):
        self.tok, self.add_bos = tokenizer, add_bos

    def answer_of(self, text: str) -> str | None:
        return A.last_boxed(text)

    def problem(self, row) -> str:
        """``extra_info.problem`` / ``question``, else the row's last user message (never the decoded
        templated prompt, which would carry the system turn and role markers)."""
        return problem_text(row)

    def prompt(self, row, body: str, answer: str) -> list[int]:
        content = A.rlcsd_teacher_prompt(self.problem(row), body, answer)
        text = self.tok.apply_chat_template([{"role": "user", "content": content}], add_generation_prompt=True)
        ids = self.tok.encode(text)
        bos = getattr(self.tok, "bos_id", None)
        return ([bos] + ids) if self.add_bos and bos is not None and bos >= 0 else ids


class InlineHintTemplate:
    """Hint answer + separator inserted at ``insert_at`` of the student prompt (CPU demo tasks)."""

    name = "inline"

    def __init__(self, tokenizer, insert_at: int = 1, sep: Sequence[int] = ()):
        self.tok, self.insert_at, self.sep = tokenizer, insert_at, list(sep)

    def answer_of(self, text: str) -> str | None:
        t = text.strip()
        return t or None

    def prompt(self, row, body: str, answer: str) -> list[int]:
        p = list(row.prompt_ids)
        at = min(self.insert_at, len(p))
        return p[:at] + self.tok.encode(answer) + self.sep + p[at:]


def template_name(name: str, tokenizer_dir: str) -> str:
    """What :func:`make_template` resolves ``name`` to for the tokenizer in ``tokenizer_dir``, without
    loading it (start-up checks): ``auto`` is inline for a SentencePiece model (``sp.model``), else chat."""
    if name != "auto":
        return name
    return "inline" if tokenizer_dir and (Path(tokenizer_dir) / "sp.model").is_file() else "chat"


def make_template(name: str, tokenizer):
    """``chat`` | ``inline`` | ``auto`` (inline for SentencePiece tokenizers without chat templates)."""
    if name == "auto":
        name = "inline" if hasattr(tokenizer, "sp") else "chat"
    if name == "chat":
        return ChatHintTemplate(tokenizer)
    if name == "inline":
        bos = getattr(tokenizer, "bos_id", None)
        return InlineHintTemplate(tokenizer, 1 if bos is not None and bos >= 0 else 0, tokenizer.encode(" "))
    raise ValueError(f"unknown teacher_template {name!r}; valid: ['auto', 'chat', 'inline']")

# ------------------------------------------------------------------------------------ hint plans


@dataclasses.dataclass
class TeacherPlan:
    """keep: sample indices that stay in the update; prompts[j]: teacher prompts of kept sample j
    (slot 0 positive / GT, then negatives); n_neg[j] = K_j; dropped_* counts (rlcsd_hints only)."""

    keep: list[int]
    prompts: list[list[list[int]]]
    n_neg: list[int]
    dropped_groups: int = 0
    dropped_targets: int = 0

    @property
    def k_max(self) -> int:
        return max(self.n_neg, default=0)

    def select(self, js: list[int]) -> TeacherPlan:
        """The plan of kept samples ``js`` (positions in ``keep``), e.g. one mini-batch's rows."""
        return TeacherPlan([self.keep[j] for j in js], [self.prompts[j] for j in js], [self.n_neg[j] for j in js],
                           self.dropped_groups, self.dropped_targets)


#: ``extra_info`` keys of a row's reference solution (verl datasets: ``solution``; the chat fixture and
#: PAPO's grader: ``reference_solution``); the chat teacher prompt needs one (start-up check: ``preflight``)
SOLUTION_KEYS = ("solution", "reference_solution")


def _gt(row) -> tuple[str, str]:
    """(reference solution body, ground-truth answer) of a row; the answer alone when no solution
    (the inline template, which shows only the answer)."""
    ans = str(row.ground_truth)
    return str(next((row.extra_info[k] for k in SOLUTION_KEYS if row.extra_info.get(k)), ans)), ans


def plan_gt(ro, template) -> TeacherPlan:
    """gt_teacher: every sample kept, one teacher prompt each (the row's ground-truth solution)."""
    prompts = [[template.prompt(row, *_gt(row))] for row in ro.rows]
    return TeacherPlan(list(range(len(ro))), prompts, [0] * len(ro))


def plan_hints(ro, template, *, k_max: int = 4, source: str = "self_rollout",
               rng: random.Random | None = None) -> TeacherPlan:
    """rlcsd_hints: the hint plan of one step's rollouts ``ro`` (see the module docstring)."""
    answers = [template.answer_of(t) for t in ro.texts]
    sel = A.select_rlcsd_hints(ro.rewards.tolist(), ro.group_ids.tolist(), [a is not None for a in answers],
                               k_max=k_max, source=source, rng=rng)
    keep, prompts, n_neg = [], [], []
    for a in sel.assignments:
        row = ro.rows[a.target]
        if a.positive is None:
            pos = template.prompt(row, *_gt(row))
        else:
            pos = template.prompt(row, ro.texts[a.positive], answers[a.positive] or _gt(row)[1])
        negs = [template.prompt(row, ro.texts[j], answers[j]) for j in a.negatives]
        keep.append(a.target)
        prompts.append([pos] + negs)
        n_neg.append(len(negs))
    return TeacherPlan(keep, prompts, n_neg, sel.dropped_groups, sel.dropped_targets)

# ------------------------------------------------------------------------------------ packing


@dataclasses.dataclass
class Packed:
    """Packed teacher sequences. ``batch``: rows of length S (with ``segment_ids`` when packed), in
    decreasing ``row_used`` (the tokens up to a row's last real one); ``target_pos`` ``[M, R]`` flat
    index into the ``[rows * (S-1)]`` target frame of sequence m's response token r (read where
    ``resp_mask``, the scored tokens, is 1). The forward runs blocks of ``group_rows`` consecutive rows narrowed to their
    widest row (:meth:`widths`); ``slots`` counts each row at its block's width (not the copies the
    actor appends to fill a last micro-batch) and ``pad_frac = 1 - real_tokens / slots``."""

    batch: TrainBatch
    target_pos: torch.Tensor
    resp_mask: torch.Tensor
    pad_frac: float
    real_tokens: int
    row_used: list[int]
    multiple: int
    slots: int

    def widths(self, group_rows: int) -> list[int]:
        """Width of each block of ``group_rows`` consecutive rows: its widest row rounded up to
        ``multiple`` (never more than S)."""
        return _block_widths(self.row_used, group_rows, self.multiple)

    def width(self, lo: int, hi: int) -> int:
        """Width rows ``lo:hi`` run at: the widest rounded up to ``multiple``."""
        return _ceil(max(self.row_used[lo:hi]), self.multiple)

    def gather(self, x: torch.Tensor) -> torch.Tensor:
        """``[rows, S-1, ...]`` packed-frame values -> ``[M, R, ...]`` per sequence (0 off the mask)."""
        flat = x.reshape(-1, *x.shape[2:])
        out = flat[self.target_pos.reshape(-1)].reshape(*self.target_pos.shape, *x.shape[2:])
        m = self.resp_mask.reshape(*self.resp_mask.shape, *([1] * (x.dim() - 2))) > 0
        return torch.where(m, out, torch.zeros_like(out))


def attention_crossover(hf_cfg) -> float:
    """Row width at which a token's dense attention costs as much as the rest of its forward (MACs):

        S* = (L * (h * d * (2 n_q + 2 n_kv) + 3 h f) + V h) / (L * 2 n_q d)

    (per layer: q/k/v/o projections and the gated MLP; the output layer once; attention over a row of
    width S: QK^T and PV, 2 S n_q d, dense over the whole row because the block-diagonal mask is
    applied to a full ``[S, S]`` score matrix). A row of width w then costs ``w (1 + w / S*)``.
    The benchmark's model (hidden 256, 4 layers, vocab 4096) gives S* = 2432; measured on the CPU
    local path, core attention took 34 % of a pass over rows of 944 (crossover ~1860: the mask and
    softmax passes over the scores add to the MACs)."""
    a = model_arch_info(hf_cfg)
    h, d, nq, nkv, L = a.hidden_size, a.head_dim, a.num_heads, a.num_kv_heads, a.num_layers
    linear = L * (h * d * (2 * nq + 2 * nkv) + 3 * h * a.ffn_hidden_size) + a.vocab_size * h
    return linear / (L * 2 * nq * d)


def _ceil(x: int, m: int) -> int:
    return -(-x // m) * m


def _block_widths(used: list[int], group_rows: int, multiple: int) -> list[int]:
    group_rows = max(1, min(group_rows, len(used)))     # few rows: the teacher pass shrinks the micro-batch
    return [_ceil(max(used[i:i + group_rows]), multiple) for i in range(0, len(used), group_rows)]


def _cost(used: list[int], group_rows: int, multiple: int, attn_len: float) -> float:
    """Forward cost of rows ``used`` (decreasing) run in blocks of ``group_rows`` narrowed to their
    widest row (a short last block is padded with copies, as the actor does): sum of rows * w (1 + w / S*)."""
    g = max(1, min(group_rows, len(used)))
    return sum(g * w * (1.0 + w / attn_len) for w in _block_widths(used, group_rows, multiple))


def _ffd(lens: list[int], order: list[int], s: int) -> tuple[list[tuple[int, int]], list[int]]:
    """First-fit decreasing into rows of ``s`` tokens: (row, offset) per item, and each row's fill."""
    fill: list[int] = []
    place = [(0, 0)] * len(lens)
    for i in order:
        for r, used in enumerate(fill):
            if used + lens[i] <= s:
                place[i] = (r, used)
                fill[r] += lens[i]
                break
        else:
            place[i] = (len(fill), 0)
            fill.append(lens[i])
    return place, fill


def _ffd_widths(longest: int, top: int, multiple: int) -> list[int]:
    """Row widths tried by :func:`pack`: ``longest``, then steps of 1/8 (multiples of ``multiple``), and ``top``."""
    out, s = [], longest
    while s < top:
        out.append(s)
        s = max(s + multiple, _ceil(s + s // 8, multiple))
    return out + [top]


def pack(seqs: Sequence[tuple[Sequence[int], Sequence[int]]], max_resp: int, pad_id: int, row_len: int,
         multiple: int = 8, packed: bool = True, group_rows: int = 1, attn_len: float = math.inf,
         masks: Sequence[torch.Tensor] | None = None) -> Packed:
    """Lay out ``(prompt, response)`` pairs in rows for the teacher forward. Prompts must be non-empty.

    Candidate layouts: one sequence per row, and (``packed``) first-fit-decreasing bins of width s for
    s from the longest sequence up to ``row_len`` (rounded up to ``multiple``; geometric steps of
    1/8). Rows are ordered by decreasing fill and the forward runs blocks of ``group_rows`` rows (the
    teacher pass's ``dp * micro_batch``) narrowed to their widest row, so the chosen layout is the one
    of least :func:`_cost`: rows * w (1 + w / ``attn_len``) summed over the blocks (``attn_len``:
    :func:`attention_crossover` of the model; inf counts slots only). Long rows pad little but cost
    quadratically in dense attention: the benchmark's 640 sequences of 80..296 tokens (S* = 2432) cost
    129.8k one per row in blocks of 8 (2.6 % padding), 167.7k packed into 127 rows of 944 in blocks of 2.
    The search stops once the best layout is within 2 % of the floor (every row as wide as its fill)
    or FFD at width s cannot beat it (all its rows but one are over half full).

    ``packed=True`` marks each row's sequences in ``segment_ids`` (block-diagonal causal mask); with
    ``packed=False`` (attention kernels that take no such mask) it is one sequence per row under the
    plain causal mask.

    ``masks[i]`` (response frame, at least ``min(len(response_i), max_resp)`` entries): which response tokens of
    sequence i the teacher scores (a multi-turn response: the policy's tokens, not the tool / user tokens,
    which stay in the row as context); None scores every response token. Unscored tokens are off ``resp_mask``
    and the loss mask, so the pass computes nothing there and :meth:`Packed.gather` gives 0."""
    if not seqs:
        raise ValueError("pack: no sequences")
    lens = [len(p) + len(r) for p, r in seqs]
    if min(len(p) for p, _ in seqs) == 0:
        raise ValueError("pack: an empty teacher prompt (the first response token needs a context)")
    longest = _ceil(max(lens), multiple)
    top = max(longest, _ceil(row_len, multiple))
    order = sorted(range(len(seqs)), key=lambda i: (-lens[i], i))
    one_per_row = [(0, 0)] * len(seqs)
    for r, i in enumerate(order):
        one_per_row[i] = (r, 0)
    real = sum(lens)
    floor = real + sum(n * n for n in lens) / attn_len     # no layout costs less (every row is >= its fill)
    best, best_cost = None, math.inf
    for s in [None] + (_ffd_widths(longest, top, multiple) if packed else []):
        if s is not None and (best_cost <= 1.02 * floor or (real - s / 2) * (1 + s / (2 * attn_len)) >= best_cost):
            break       # FFD rows but one are over half full: tokens cost >= 1 + s / (2 S*) each from here on
        place, fill = (one_per_row, [lens[i] for i in order]) if s is None else _ffd(lens, order, s)
        rank = sorted(range(len(fill)), key=lambda r: (-fill[r], r))          # rows by decreasing fill
        used = [fill[r] for r in rank]
        c = _cost(used, group_rows, multiple, attn_len)
        if c < best_cost:
            new_row = {r: j for j, r in enumerate(rank)}
            best, best_cost = ([(new_row[r], off) for r, off in place], used), c
    place, used = best
    rows = len(used)
    tokens, seg, tpos, rmask, loss_mask = _lay_out(seqs, place, rows, _ceil(used[0], multiple), max_resp, pad_id,
                                                   masks)
    g = max(1, min(group_rows, rows))
    slots = sum(min(g, rows - b * g) * w for b, w in enumerate(_block_widths(used, group_rows, multiple)))
    extras = {"segment_ids": seg} if packed else {}
    return Packed(TrainBatch(tokens, loss_mask, extras), tpos, rmask, 1.0 - real / slots, real, used, multiple,
                  slots)


def _lay_out(seqs, place: list, rows: int, s: int, max_resp: int, pad_id: int, masks=None):
    """The tensors of a layout: sequence i at ``place[i] = (row, offset)`` in ``rows`` rows of width ``s``:
    tokens and segment ids ``[rows, s]``, the flat target position and mask of each response token
    ``[N, max_resp]`` (``masks[i]`` where given: the scored tokens), and the loss mask ``[rows, s-1]``."""
    tokens = torch.full((rows, s), pad_id, dtype=torch.long)
    seg = torch.full((rows, s), -1, dtype=torch.long)
    tpos = torch.zeros((len(seqs), max_resp), dtype=torch.long)
    rmask = torch.zeros((len(seqs), max_resp))
    loss_mask = torch.zeros((rows, s - 1))
    for i, ((p, r), (row, off)) in enumerate(zip(seqs, place)):
        n = len(p) + len(r)
        tokens[row, off:off + n] = torch.tensor(list(p) + list(r), dtype=torch.long)
        seg[row, off:off + n] = i
        k = min(len(r), max_resp)
        cols = torch.arange(off + len(p) - 1, off + len(p) - 1 + k)
        tpos[i, :k] = row * (s - 1) + cols
        m = 1.0 if masks is None else (torch.as_tensor(masks[i][:k], dtype=torch.float32) > 0).float()
        rmask[i, :k] = m
        loss_mask[row, cols] = m
    return tokens, seg, tpos, rmask, loss_mask



def truncate_left(prompt: list[int], response: Sequence[int], max_len: int) -> list[int]:
    """Drop prompt tokens from the left so ``prompt ++ response`` fits ``max_len`` (docs/methods/self-distillation.md)."""
    over = len(prompt) + len(response) - max_len
    if over <= 0:
        return prompt
    if over >= len(prompt):
        raise ValueError(f"response of {len(response)} tokens leaves no room for a teacher prompt in {max_len}")
    return prompt[over:]
