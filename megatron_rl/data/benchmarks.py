"""Named benchmarks and the seed papers' evaluation tables (``megatron-rl eval --benchmarks``,
``trainer.eval_benchmarks``).

A benchmark is a prepared directory ``DATA_DIR/<name>/test.parquet`` (``megatron-rl data prepare``,
``data generate kk``): its rows carry the paper's prompt and the ``data_source`` that selects the
reference's reward, so evaluation needs nothing else from here but the layout, the label and the
paper's metric. A preset is one paper's table — its benchmarks, metric and sampling:

=============  ===========================================  =================================  ==============================
preset         benchmarks                                   metric                             sampling (paper)
=============  ===========================================  =================================  ==============================
``rlcsd_math`` AMC23, AIME24, AIME25                        mean@12                            T 0.6, top-p 0.95, top-k 20
``kk``         KK 4–8, KK 9, KK 10, KK 11                   pass@1 (one sample)                T 0.6, top-p 0.95, top-k 20
``bicc``       MATH-500, AMC23, AIME24, AIME25              pass@1 averaged over 32 = mean@32  T 0.6, top-p 0.95
``papo``       OlympiadBench, MATH-500, AIME24, AIME25,     avg@4 = mean@4                     T 0.7
               GPQA-Diamond
``score``      GSM8K, MATH                                  attempt 1, attempt 2, Δ            greedy
=============  ===========================================  =================================  ==============================

Sources: RLCSD (THU-BPM/RLCSD README and configs: validation mean@12 for math, pass@1 for K&K);
BiCC (arXiv paper: Pass@1 averaged over 32 runs); PAPO (paper: avg@4, validation n 4 at T 0.7);
SCoRe (Kumar et al., arXiv:2409.12917: Accuracy@t1, Accuracy@t2, Δ(t1, t2), Δ^{i→c}, Δ^{c→i}).
"""
from __future__ import annotations

import dataclasses
from pathlib import Path


@dataclasses.dataclass(frozen=True)
class Benchmark:
    """One prepared evaluation set: ``DATA_DIR/<directory>/<split>.parquet``; ``reward``: the reward its
    rows' ``data_source`` is expected to select; ``metric`` / ``k``: its first paper's number."""

    name: str
    label: str
    reward: str
    metric: str = "mean"
    k: int = 1
    directory: str = ""
    split: str = "test"

    def path(self, data_dir: str | Path) -> Path:
        return Path(data_dir) / (self.directory or self.name) / f"{self.split}.parquet"


@dataclasses.dataclass(frozen=True)
class Preset:
    """One paper's table: its benchmarks, metric (``mean`` / ``pass``) at k with n samples per problem,
    its column label, its sampling and whether it is SCoRe's two-attempt protocol."""

    name: str
    benchmarks: tuple[str, ...]
    metric: str
    k: int
    n: int
    label: str
    temperature: float
    top_p: float = 1.0
    top_k: int = -1
    two_attempt: bool = False


BENCHMARKS: dict[str, Benchmark] = {b.name: b for b in (
    Benchmark("math500", "MATH-500", "math", "mean", 32),
    Benchmark("aime24", "AIME24", "math", "mean", 12),
    Benchmark("aime25", "AIME25", "math", "mean", 12),
    Benchmark("amc23", "AMC23", "math", "mean", 12),
    Benchmark("olympiadbench", "OlympiadBench", "papo_math", "mean", 4),
    Benchmark("gpqa_diamond", "GPQA-Diamond", "gpqa", "mean", 4),
    Benchmark("gsm8k", "GSM8K", "score_exact_match", "mean", 1),
    Benchmark("math", "MATH", "score_exact_match_math", "mean", 1),
    Benchmark("kk_4_8", "KK 4–8", "kk", "pass", 1),
    Benchmark("kk_9", "KK 9", "kk", "pass", 1),
    Benchmark("kk_10", "KK 10", "kk", "pass", 1),
    Benchmark("kk_11", "KK 11", "kk", "pass", 1),
)}

PRESETS: dict[str, Preset] = {p.name: p for p in (
    Preset("rlcsd_math", ("amc23", "aime24", "aime25"), "mean", 12, 12, "mean@12", 0.6, 0.95, 20),
    Preset("kk", ("kk_4_8", "kk_9", "kk_10", "kk_11"), "pass", 1, 1, "pass@1", 0.6, 0.95, 20),
    Preset("bicc", ("math500", "amc23", "aime24", "aime25"), "mean", 32, 32, "pass@1 (avg of 32)", 0.6, 0.95),
    Preset("papo", ("olympiadbench", "math500", "aime24", "aime25", "gpqa_diamond"), "mean", 4, 4, "avg@4", 0.7),
    Preset("score", ("gsm8k", "math"), "mean", 1, 1, "accuracy", 0.0, two_attempt=True),
)}


def resolve(spec: str | list[str] | tuple[str, ...]) -> tuple[list[Benchmark], Preset | None]:
    """``"aime24,amc23"`` or a list of names -> the benchmarks, in order; a single preset name ->
    its benchmarks and the preset. An unknown name is a one-line error listing the valid ones."""
    names = [s.strip() for s in (spec.split(",") if isinstance(spec, str) else spec) if s.strip()]
    if not names:
        raise ValueError("no benchmark named; valid: " + ", ".join([*BENCHMARKS, *PRESETS]))
    if len(names) == 1 and names[0] in PRESETS:
        p = PRESETS[names[0]]
        return [BENCHMARKS[b] for b in p.benchmarks], p
    bad = [x for x in names if x not in BENCHMARKS]
    if bad:
        hint = " (a preset stands alone)" if bad[0] in PRESETS else ""
        raise ValueError(f"unknown benchmark {bad[0]!r}{hint}; benchmarks: {', '.join(BENCHMARKS)}; "
                         f"presets: {', '.join(PRESETS)}")
    if len(set(names)) != len(names):
        raise ValueError(f"benchmark named twice in {','.join(names)}")
    return [BENCHMARKS[x] for x in names], None


def missing_files(benchmarks: list[Benchmark], data_dir: str | Path) -> list[Path]:
    """The prepared files that are not there (checked before any engine starts)."""
    return [b.path(data_dir) for b in benchmarks if not b.path(data_dir).is_file()]
