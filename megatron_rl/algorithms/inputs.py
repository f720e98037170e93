"""The frozen per-step input bundle passed to every registered advantage and policy loss.

One :class:`AlgoInputs` is built per step (advantage time) or per mini-batch (update time); each
registry entry declares which optional fields it needs, and :func:`missing_fields` /
``registry.check_inputs`` fail clearly at start-up or on the first step when the pipeline does
not provide them (STYLE.md §2). Shapes: N samples, T response tokens, K negative hints,
k+1 = top-k support plus tail bucket.
"""
from __future__ import annotations

from dataclasses import dataclass, fields

from torch import Tensor

#: field name → expected shape signature ("N", "NT", "NKT", "NK", "NTk", "int")
FIELD_SHAPES = {
    "rewards": "N", "group_ids": "N", "mask": "NT",
    "logp": "NT", "old_logp": "NT", "ref_logp": "NT", "tis_weights": "NT", "token_rewards": "NT",
    "greedy_rewards": "N", "process": "N", "correct": "N", "delta": "N",
    "teacher_logp": "NT", "teacher_neg_logp": "NKT", "teacher_neg_mask": "NK",
    "student_topk": "NTk", "teacher_topk": "NTk", "teacher_neg_topk": "NTk", "teacher_entropy": "NT",
    "first_logp": "N*", "first_ref_logp": "N*", "first_mask": "N*", "first_rewards": "N", "srpo_log_u_mean": "N",
    "rlcsd_counts": "N*",
    "step": "int",
}


@dataclass(frozen=True)
class AlgoInputs:
    """Everything a registered function may read; optional fields default to None.

    rewards [N] scalar reward (sum of token rewards); group_ids [N] int prompt group; mask [N, T];
    logp [N, T] current log-probs (with grad; None at advantage time); old_logp [N, T] behaviour
    log-probs (for BiCC: plain-q or conditioned, see ``bicc_old_logp``); ref_logp [N, T];
    tis_weights [N, T] truncated-IS weights; token_rewards [N, T] (ReMax returns);
    greedy_rewards [N] (ReMax baseline); process [N] PRM score; correct [N] bool (PAPO's C);
    delta [N] RCC confidence (else computed from old/ref); teacher_logp [N, T] teacher on the
    positive/GT hint; teacher_neg_logp [N, K, T] and teacher_neg_mask [N, K] (RLCSD negatives);
    student_topk / teacher_topk / teacher_neg_topk [N, T, k+1] support log-probs
    (``distill.topk_tail_support``); teacher_entropy [N, T] full-vocab teacher entropy (SRPO);
    first_* attempt-1 tensors [N, T1] and first_rewards [N] (SCoRe); srpo_log_u_mean [N] (equal
    values) the whole step's log mean_routed(exp(−β H_T)) so SRPO's weight is batch-global; rlcsd_counts [N, 2] (equal rows) the whole
    mini-batch's (N_non, N_sel) so RLCSD's two normalisers are batch-global; step: trainer step (RLSD λ).
    """

    rewards: Tensor
    group_ids: Tensor
    mask: Tensor
    logp: Tensor | None = None
    old_logp: Tensor | None = None
    ref_logp: Tensor | None = None
    tis_weights: Tensor | None = None
    token_rewards: Tensor | None = None
    greedy_rewards: Tensor | None = None
    process: Tensor | None = None
    correct: Tensor | None = None
    delta: Tensor | None = None
    teacher_logp: Tensor | None = None
    teacher_neg_logp: Tensor | None = None
    teacher_neg_mask: Tensor | None = None
    student_topk: Tensor | None = None
    teacher_topk: Tensor | None = None
    teacher_neg_topk: Tensor | None = None
    teacher_entropy: Tensor | None = None
    first_logp: Tensor | None = None
    first_ref_logp: Tensor | None = None
    first_mask: Tensor | None = None
    first_rewards: Tensor | None = None
    srpo_log_u_mean: Tensor | None = None
    rlcsd_counts: Tensor | None = None
    step: int | None = None

    def __post_init__(self) -> None:
        n, t = self.rewards.shape[0] if self.rewards.dim() == 1 else -1, self.mask.shape[-1]
        if self.rewards.dim() != 1:
            raise ValueError(f"AlgoInputs.rewards must be [N], got {tuple(self.rewards.shape)}")
        for f in fields(self):
            v = getattr(self, f.name)
            if v is None or f.name == "step":
                continue
            _check_shape(f.name, v, FIELD_SHAPES[f.name], n, t)

    def present(self) -> set:
        """Names of the fields that are set (not None)."""
        return {f.name for f in fields(self) if getattr(self, f.name) is not None}


def _check_shape(name: str, v: Tensor, sig: str, n: int, t: int) -> None:
    shape = tuple(v.shape)
    want = {"N": (n,), "NT": (n, t)}.get(sig)
    ok = shape == want if want is not None else (len(shape) == len(sig.replace("*", "T")) and shape[0] == n)
    if sig == "NKT":
        ok = len(shape) == 3 and shape[0] == n and shape[2] == t
    if sig == "NTk":
        ok = len(shape) == 3 and shape[:2] == (n, t)
    if sig == "NK":
        ok = len(shape) == 2 and shape[0] == n
    if not ok:
        raise ValueError(f"AlgoInputs.{name} has shape {shape}; expected {sig} with N={n}, T={t}")


def missing_fields(inputs: AlgoInputs, needed: set) -> list:
    """Sorted names in ``needed`` that ``inputs`` does not provide."""
    return sorted(needed - inputs.present())
