"""The papers' evaluation table from per-benchmark correctness (``eval --benchmarks``, in-training eval).

Per benchmark (rows = problems, each with n samples): mean@k and pass@k (``metrics.py``; the
paper's metric is one of them), the number of problems; the average row is the unweighted mean of
the benchmarks' values (the papers' "Avg" columns). SCoRe's two-attempt protocol (Kumar et al.,
arXiv:2409.12917 §5): over all first attempts y1 and their corrections y2,

    Accuracy@t1 = mean 1[y1 correct],  Accuracy@t2 = mean 1[y2 correct],  Δ(t1, t2) = t2 − t1,
    Δ^{i→c} = mean 1[y1 wrong, y2 correct],  Δ^{c→i} = mean 1[y1 correct, y2 wrong]

(so Δ = Δ^{i→c} − Δ^{c→i}). Values are fractions; the markdown shows percentages with one decimal.
"""
from __future__ import annotations

from .metrics import row_metrics

TWO_ATTEMPT_COLUMNS = (("attempt1", "attempt 1"), ("attempt2", "attempt 2"), ("delta", "Δ"),
                       ("i_to_c", "Δ i→c"), ("c_to_i", "Δ c→i"))


def bench_entry(label: str, correct: list[list[bool]], metric: str, k: int, column: str, reward: str = "") -> dict:
    """One benchmark's numbers: ``mean@k`` and ``pass@k`` over its problems, ``value`` = the paper's one."""
    if not correct:
        raise ValueError(f"{label}: no problems to evaluate")
    ms = [row_metrics(c, (k,)) for c in correct]
    out = {key: sum(m[key] for m in ms) / len(ms) for key in (f"mean@{k}", f"pass@{k}")}
    return {"label": label, "problems": len(correct), "samples": len(correct[0]), "metric": f"{metric}@{k}",
            "column": column, "value": out[f"{metric}@{k}"], **out, **({"reward": reward} if reward else {})}


def two_attempt_entry(label: str, first: list[list[bool]], second: list[list[bool]], reward: str = "") -> dict:
    """SCoRe's numbers for one benchmark (``second[i][j]`` corrects ``first[i][j]``)."""
    pairs = [(a, b) for r1, r2 in zip(first, second, strict=True) for a, b in zip(r1, r2, strict=True)]
    if not pairs:
        raise ValueError(f"{label}: no problems to evaluate")
    n = len(pairs)
    t1, t2 = sum(a for a, _ in pairs) / n, sum(b for _, b in pairs) / n
    return {"label": label, "problems": len(first), "samples": len(first[0]), "attempt1": t1, "attempt2": t2,
            "delta": t2 - t1, "i_to_c": sum((not a) and b for a, b in pairs) / n,
            "c_to_i": sum(a and not b for a, b in pairs) / n, **({"reward": reward} if reward else {})}


def summarize_table(entries: dict[str, dict], two_attempt: bool = False) -> dict:
    """``{"benchmarks": entries, "average": {...}, "problems": total}``: the average of each column over
    the benchmarks that report it."""
    if two_attempt:
        avg = {key: sum(e[key] for e in entries.values()) / len(entries) for key, _ in TWO_ATTEMPT_COLUMNS}
    else:
        avg = {}
        for col in dict.fromkeys(e["column"] for e in entries.values()):
            vals = [e["value"] for e in entries.values() if e["column"] == col]
            avg[col] = sum(vals) / len(vals)
    return {"benchmarks": entries, "average": avg, "problems": sum(e["problems"] for e in entries.values()),
            "two_attempt": two_attempt}


def _pct(x: float, signed: bool = False) -> str:
    return f"{100 * x:+.1f}" if signed else f"{100 * x:.1f}"


def render_markdown(summary: dict) -> str:
    """The table: rows = benchmarks (+ "Average"), columns = the metric(s), then "Problems"."""
    entries, avg = summary["benchmarks"], summary["average"]
    if summary["two_attempt"]:
        cols = [label for _, label in TWO_ATTEMPT_COLUMNS]
        rows = [[e["label"], *(_pct(e[key], key != "attempt1" and key != "attempt2")
                               for key, _ in TWO_ATTEMPT_COLUMNS), str(e["problems"])] for e in entries.values()]
        last = [_pct(avg[key], key != "attempt1" and key != "attempt2") for key, _ in TWO_ATTEMPT_COLUMNS]
    else:
        cols = list(avg)
        rows = [[e["label"], *(_pct(e["value"]) if e["column"] == c else "" for c in cols), str(e["problems"])]
                for e in entries.values()]
        last = [_pct(avg[c]) for c in cols]
    rows.append(["Average", *last, str(summary["problems"])])
    head = ["Benchmark", *cols, "Problems"]
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join(["---"] + ["---:"] * (len(head) - 1)) + "|"]
    return "\n".join(lines + ["| " + " | ".join(r) + " |" for r in rows]) + "\n"


def log_metrics(summary: dict, prefix: str = "eval") -> dict[str, float]:
    """Flat metrics for the training log: ``eval/<bench>/<metric>`` and ``eval/avg`` (the average of the
    first column; attempt 2's for the two-attempt protocol)."""
    out: dict[str, float] = {}
    for name, e in summary["benchmarks"].items():
        if summary["two_attempt"]:
            out.update({f"{prefix}/{name}/{key}": e[key] for key, _ in TWO_ATTEMPT_COLUMNS})
        else:
            out[f"{prefix}/{name}/{e['metric']}"] = e["value"]
    first = "attempt2" if summary["two_attempt"] else next(iter(summary["average"]))
    out[f"{prefix}/avg"] = summary["average"][first]
    return out
