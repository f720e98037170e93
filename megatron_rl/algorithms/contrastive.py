"""Contrastive inputs: BiCC bilateral contexts and the RLCSD data path + token signal.

BiCC (Li, Lan, Qi, arXiv 2603.13134; docs/methods/bicc-rcc.md): each correct response is re-scored with the
group's incorrect traces in its context and vice versa. :func:`build_bicc_contexts` works on
token ids: q_prefix ⊕ header ⊕ trace₁ ⊕ sep ⊕ trace₂ … ⊕ q_suffix ⊕ o_i, with the target o_i
byte-identical to the rollout and the loss mask on o_i only. Context budget L_ctx (e.g.
floor(0.4·L_max)) counts header, traces and separators; traces are added in group order, the
first one that does not fit is right-truncated to the remaining budget and filling stops;
o_i is never truncated; traces are dropped from the end while the whole sequence exceeds the
model window. :func:`bicc_old_logp` is the ``old_logprob_context ∈ {plain, conditioned}`` switch.

RLCSD (Pan et al., arXiv 2606.11709; docs/methods/self-distillation.md): :func:`select_rlcsd_hints` (one positive hint,
up to K negatives, target excluded from its own pools, groups without both kinds dropped),
:func:`rlcsd_teacher_prompt` (symmetric template), :func:`rlcsd_signal` (e = ℓ_c − log-mean-exp
over the K valid negatives) and :func:`rlcsd_advantage` (tanh squash, clip, gate, additive
residual, sign-preserving clamp).

Departures from the reference code:
* BiCC: the release pairs each target with one opposite trace and keeps only the **last**
  pairing (slot overwrite), uses a placeholder SEP id 2, finds the prompt boundary with an
  argmax that is always 0, and swaps numerator/denominator contexts. We follow the paper-level
  description instead: the whole opposite set (budgeted), caller-supplied header/separator ids,
  explicit prompt split, and plain-q old log-probs by default (``conditioned`` is the switch).
* A target whose budget fits no trace token falls back to the plain prompt; it is counted in
  :class:`BiCCBatch` ``n_fallback`` and logged, never silently mixed.
* RLCSD rows with no valid negative raise (they must have been dropped by hint selection).
"""
from __future__ import annotations

import logging
import math
import random
import re
from dataclasses import dataclass
from typing import NamedTuple, Sequence

import torch
from torch import Tensor

from .inputs import register_input

log = logging.getLogger(__name__)

# ---------------------------------------------------------------------------------------- BiCC


@dataclass(frozen=True)
class BiCCSample:
    """One conditioned target. input_ids: q_prefix+C+q_suffix+o; loss_mask: 1 on o only;
    response_start: index of o's first token; context: traces used (group-local indices)."""

    index: int
    input_ids: list
    loss_mask: list
    response_start: int
    context: tuple
    context_len: int


class BiCCBatch(NamedTuple):
    """samples: conditioned targets (groups with both partitions); plain: indices left on q;
    n_fallback: targets of mixed groups whose budget fit no trace (also in ``plain``)."""

    samples: list
    plain: list
    n_fallback: int


def bicc_partition(rewards: Sequence[float], threshold: float = 0.5) -> list:
    """Correct iff reward > threshold (released code; works for {0,1} and DAPO's {±1})."""
    out = []
    for i, r in enumerate(rewards):
        if not math.isfinite(float(r)):
            raise ValueError(f"BiCC: non-finite reward at sample {i}: {r!r}")
        out.append(float(r) > threshold)
    return out


def _fill_context(traces: list, budget: int, header: list, sep: list) -> tuple[list, tuple]:
    """Header + traces (+ sep after each) within ``budget`` tokens; returns (ids, used idx)."""
    if budget < len(header) + 1:
        return [], ()
    ids, used = list(header), []
    for j, t in traces:
        room = budget - len(ids)
        if room <= 0:
            break
        piece = list(t) + list(sep)
        if len(piece) <= room:
            ids += piece
            used.append(j)
            continue
        ids += list(t)[:room]
        used.append(j)
        break
    return (ids, tuple(used)) if used else ([], ())


def build_bicc_contexts(prompt_ids: Sequence[Sequence[int]], response_ids: Sequence[Sequence[int]],
                        rewards: Sequence[float], group_ids: Sequence[int], *, budget_tokens: int,
                        header_ids: Sequence[int] = (), sep_ids: Sequence[int] = (),
                        insert_at: Sequence[int] | None = None, max_total_len: int | None = None,
                        threshold: float = 0.5) -> BiCCBatch:
    """Bilateral contexts for every target of the batch (token ids, no tokenizer needed).

    ``insert_at[i]`` is where the context goes inside prompt i (end of the user turn, before the
    assistant header); default: the end of the prompt. Shapes: lists of length N.
    """
    n = len(prompt_ids)
    if not (len(response_ids) == len(rewards) == len(group_ids) == n):
        raise ValueError(f"BiCC: prompt_ids/response_ids/rewards/group_ids lengths differ: "
                         f"{n}/{len(response_ids)}/{len(rewards)}/{len(group_ids)}")
    correct = bicc_partition(rewards, threshold)
    members: dict = {}
    for i, g in enumerate(group_ids):
        members.setdefault(int(g), []).append(i)
    samples, plain, fallback = [], [], 0
    for i in range(n):
        grp = members[int(group_ids[i])]
        opposite = [(j, response_ids[j]) for j in grp if correct[j] != correct[i]]
        if not opposite:
            plain.append(i)
            continue
        s = _conditioned(i, prompt_ids[i], response_ids[i], opposite, budget_tokens, list(header_ids),
                         list(sep_ids), None if insert_at is None else insert_at[i], max_total_len)
        if s is None:
            fallback += 1
            plain.append(i)
        else:
            samples.append(s)
    if fallback:
        log.warning("BiCC: %d target(s) fell back to the plain prompt (budget %d fits no trace)",
                    fallback, budget_tokens)
    return BiCCBatch(samples, plain, fallback)


def _conditioned(i, prompt, response, opposite, budget, header, sep, cut, max_total) -> BiCCSample | None:
    prompt = list(prompt)
    cut = len(prompt) if cut is None else int(cut)
    if not 0 <= cut <= len(prompt):
        raise ValueError(f"BiCC: insert_at={cut} outside prompt {i} of length {len(prompt)}")
    ctx, used = _fill_context(opposite, budget, header, sep)
    while used and max_total is not None and len(prompt) + len(ctx) + len(response) > max_total:
        opposite = [o for o in opposite if o[0] in used[:-1]]
        ctx, used = _fill_context(opposite, budget, header, sep)
    if not used:
        return None
    ids = prompt[:cut] + ctx + prompt[cut:] + list(response)
    start = len(ids) - len(response)
    return BiCCSample(i, ids, [0] * start + [1] * len(response), start, used, len(ctx))


def bicc_old_logp(mode: str, plain: Tensor, conditioned: Tensor) -> Tensor:
    """Denominator log-probs of the BiCC ratio: ``plain`` (paper: π_old(o|q)) or ``conditioned``
    (π_old(o|q⊕C), ratio 1 at the start). Shapes: [N, T] → [N, T] (detached)."""
    if mode not in ("plain", "conditioned"):
        raise ValueError(f"unknown bicc old_logprob_context {mode!r}; valid: ['conditioned', 'plain']")
    return (plain if mode == "plain" else conditioned).detach()

# --------------------------------------------------------------------------------------- RLCSD


class HintAssignment(NamedTuple):
    """target: sample index; positive: sibling index (None = GT solution); negatives: indices."""

    target: int
    positive: int | None
    negatives: tuple


class HintSelection(NamedTuple):
    """assignments for surviving targets; dropped_groups / dropped_targets: counts."""

    assignments: list
    dropped_groups: int
    dropped_targets: int


def select_rlcsd_hints(rewards: Sequence[float], group_ids: Sequence[int], has_box: Sequence[bool], *,
                       k_max: int = 4, source: str = "self_rollout", rng: random.Random | None = None) -> HintSelection:
    """RLCSD hint sampling and filtering (docs/methods/self-distillation.md).

    P = {R > 0}; N = {R ≤ 0 and boxed}. self_rollout drops groups with P = ∅ or N = ∅
    (gt_cot: only N = ∅). Per target: C_i = P \\ {i}, W_i = N \\ {i}; drop i if C_i = ∅
    (self_rollout) or W_i = ∅; positive ~ U(C_i); negatives: w¹ ~ U(W_i) then a random
    permutation of the rest, K_i = min(K_max, |W_i|).
    """
    if source not in ("self_rollout", "gt_cot"):
        raise ValueError(f"unknown RLCSD hint source {source!r}; valid: ['gt_cot', 'self_rollout']")
    if k_max < 1:
        raise ValueError(f"rlcsd k_max must be >= 1, got {k_max}")
    rng = rng or random.Random(0)
    members: dict = {}
    for i, g in enumerate(group_ids):
        if not math.isfinite(float(rewards[i])):
            raise ValueError(f"RLCSD: non-finite reward at sample {i} (group {g}): {rewards[i]!r}")
        members.setdefault(int(g), []).append(i)
    out, dg, dt = [], 0, 0
    for g, idx in members.items():
        pos = [j for j in idx if float(rewards[j]) > 0]
        neg = [j for j in idx if float(rewards[j]) <= 0 and bool(has_box[j])]
        if not neg or (source == "self_rollout" and not pos):
            dg += 1
            continue
        for i in idx:
            c_pool = [j for j in pos if j != i]
            w_pool = [j for j in neg if j != i]
            if not w_pool or (source == "self_rollout" and not c_pool):
                dt += 1
                continue
            positive = rng.choice(c_pool) if source == "self_rollout" else None
            first = rng.choice(w_pool)
            rest = [j for j in w_pool if j != first]
            rng.shuffle(rest)
            out.append(HintAssignment(i, positive, tuple([first] + rest[:k_max - 1])))
    return HintSelection(out, dg, dt)


_BOX = re.compile(r"\\(?:boxed|fbox)\s*\{")


def last_boxed(text: str) -> str | None:
    """Content of the last ``\\boxed{...}`` (brace-matched), or None."""
    starts = [m.end() for m in _BOX.finditer(text)]
    for s in reversed(starts):
        depth, j = 1, s
        while j < len(text) and depth:
            depth += {"{": 1, "}": -1}.get(text[j], 0)
            j += 1
        if depth == 0:
            return text[s:j - 1]
    return None


COT_INSTRUCTION = "Please reason step by step, and put your final answer within \\boxed{}."
HINT_FRAMING = "Here is a reference solution to this problem."
HINT_BEGIN = "=== Reference Solution Begin ==="
HINT_END = "=== Reference Solution End ==="
HINT_CHECK = "Make sure you understand the reasoning behind each step."


def rlcsd_teacher_prompt(problem: str, hint_body: str, answer: str) -> str:
    """Teacher user turn (docs/methods/self-distillation.md). Wrong hints use the byte-identical scaffolding, including
    "Correct final answer:", so only ``hint_body`` and ``answer`` differ between hints."""
    return (f"Problem: {problem}\n\n{HINT_FRAMING}\n{HINT_BEGIN}\n{hint_body}\n\n"
            f"Correct final answer: {answer}\n{HINT_END}\n\n{HINT_CHECK}\n\n{COT_INSTRUCTION}")


def student_prompt(problem: str, *, train: bool = True) -> str:
    """Student user turn: "Problem: " prefix for training sources only, then the CoT sentence."""
    return f"{'Problem: ' if train else ''}{problem}\n\n{COT_INSTRUCTION}"


def hint_answer(hint_text: str, gt_answer: str) -> str:
    """Answer shown with a self-rollout hint: its last box, or the GT answer if it has none."""
    box = last_boxed(hint_text)
    return gt_answer if box is None else box


def rlcsd_signal(pos_logp: Tensor, neg_logp: Tensor, neg_mask: Tensor, **hparams) -> Tensor:
    """e_t = ℓc_t − [logsumexp_k ℓw_t^k − log K_i] over the valid negatives (log of the uniform
    mixture). Shapes: pos [N, T], neg [N, K, T], neg_mask [N, K] (bool) → e [N, T], no grad.
    ``hparams`` may carry the RLCSD knobs (unused here, accepted so one dict feeds both calls)."""
    _check_hparams(hparams)
    valid = neg_mask.bool()
    if neg_logp.dim() != 3 or valid.shape != neg_logp.shape[:2] or pos_logp.shape != neg_logp[:, 0].shape:
        raise ValueError(f"rlcsd_signal shapes: pos {tuple(pos_logp.shape)}, neg {tuple(neg_logp.shape)}, "
                         f"neg_mask {tuple(neg_mask.shape)}; expected [N,T], [N,K,T], [N,K]")
    k = valid.sum(-1)
    if bool((k == 0).any()):
        raise ValueError(f"rlcsd_signal: row {int(torch.nonzero(k == 0)[0, 0])} has no valid negative "
                         "(hint selection should have dropped it)")
    w = torch.where(valid[..., None], neg_logp.detach(), torch.full_like(neg_logp, -torch.inf))
    mix = torch.logsumexp(w, dim=1) - torch.log(k.to(neg_logp.dtype))[:, None]
    return pos_logp.detach() - mix


class RLCSDAdvantage(NamedTuple):
    """advantages: per-token advantage actually used (Â on gated tokens, A elsewhere) [N, T];
    adv_hat: Â everywhere [N, T]; gate: bool [N, T]; residual r [N, T]."""

    advantages: Tensor
    adv_hat: Tensor
    gate: Tensor
    residual: Tensor


_RLCSD_KEYS = {"tau", "beta", "lam", "delta", "clip_lo", "clip_hi", "eta", "k_max", "clip_eps", "source"}


def _check_hparams(hp: dict) -> None:
    bad = sorted(set(hp) - _RLCSD_KEYS)
    if bad:
        raise ValueError(f"unknown RLCSD hyper-parameter(s) {bad}; valid: {sorted(_RLCSD_KEYS)}")


def rlcsd_advantage(adv: Tensor, signal: Tensor, mask: Tensor, *, tau: float = 0.02, beta: float = 1.0,
                    lam: float = 0.5, delta: float = 0.02, clip_lo: float = -2.0, clip_hi: float = 2.0,
                    **extra) -> RLCSDAdvantage:
    """s = tanh(e/τ); r = clip(βλs, c_lo, c_hi); g = 1[|r| > δ]·m; Ã = A + g·r;
    Â = max(Ã, 0) if A > 0, min(Ã, 0) if A < 0, 0 if A = 0. All under no-grad.
    Shapes: adv [N] (or [N, T]), signal e [N, T], mask [N, T]."""
    _check_hparams(extra)
    e = signal.detach()
    a = adv.detach().to(e.dtype)
    a = a[:, None].expand_as(e) if a.dim() == 1 else a
    r = torch.clamp(beta * lam * torch.tanh(e / tau), clip_lo, clip_hi)
    gate = (r.abs() > delta) & mask.bool()
    tilde = a + gate.to(e.dtype) * r
    hat = torch.where(a > 0, tilde.clamp_min(0), torch.where(a < 0, tilde.clamp_max(0), torch.zeros_like(a)))
    return RLCSDAdvantage(torch.where(gate, hat, a), hat, gate, r)



def _neg_mask_filler(v: Tensor) -> Tensor:
    """A padding copy's negatives: none valid but slot 0, so the contrastive signal stays defined."""
    z = torch.zeros_like(v)
    z[:, 0] = 1
    return z


# RLCSD's inputs (the hint path provides them, its loss reads them); K = negative hints per sample
register_input("teacher_neg_logp", ("N", "K", "T"), "float", "teacher log-probs under each wrong hint")
register_input("teacher_neg_mask", ("N", "K"), "bool", "which negative-hint slots are real", filler=_neg_mask_filler)
register_input("rlcsd_counts", ("N", 2), "float", "whole mini-batch (N_non, N_sel) on every row")
