"""The evaluation protocol's numbers, shared by ``megatron-rl eval`` and in-training validation.

Notation: a row (problem) has n samples y_1..y_n of which c are correct.

* mean@k = (1/k) Σ_{j<=k} 1[y_j correct] — the mean accuracy of the first k samples (the papers'
  "avg@k" / "mean@12": k = n, the accuracy averaged over all samples of a row);
* pass@k = 1 − C(n−c, k) / C(n, k) — the unbiased estimator (Chen et al. 2021, eq. 1) of the chance
  that at least one of k samples is correct, from all n (k <= n).

Both are averaged over rows, per data source and overall.
"""
from __future__ import annotations

import math
from collections import defaultdict


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k for one problem with n samples of which c are correct."""
    if k > n:
        raise ValueError(f"pass@{k} needs at least {k} samples, got {n}")
    if n - c < k:
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def row_metrics(correct: list[bool], ks: tuple[int, ...]) -> dict[str, float]:
    """``{"mean@k": .., "pass@k": ..}`` of one row for every k in ``ks`` (``correct``: its n samples)."""
    out = {}
    for k in ks:
        if len(correct) < k:
            raise ValueError(f"mean@{k} / pass@{k} need {k} samples per row, got {len(correct)}")
        out[f"mean@{k}"] = sum(correct[:k]) / k
        out[f"pass@{k}"] = pass_at_k(len(correct), sum(correct), k)
    return out


def summarize(rows: list[tuple[str, list[bool]]], ks: tuple[int, ...]) -> dict:
    """Overall and per-``data_source`` means of :func:`row_metrics` over ``rows`` = (source, correct)."""
    per_src: dict[str, list[dict]] = defaultdict(list)
    for src, correct in rows:
        per_src[src].append(row_metrics(correct, ks))
    allm = [m for ms in per_src.values() for m in ms]
    if not allm:
        raise ValueError("no rows to evaluate")

    def mean(ms: list[dict]) -> dict:
        return {key: sum(m[key] for m in ms) / len(ms) for key in ms[0]}

    return {**mean(allm), "by_source": {s: {**mean(ms), "rows": len(ms)} for s, ms in per_src.items()}}
