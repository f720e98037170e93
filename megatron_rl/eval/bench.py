"""``megatron-rl eval --benchmarks``: the papers' tables over prepared benchmark directories.

    megatron-rl eval --benchmarks aime24,aime25,amc23 --data-dir data --model M --n 12 --out o
    megatron-rl eval --benchmarks rlcsd_math --data-dir data --completions-dir C --out o
    megatron-rl eval --benchmarks score --data-dir data --model M --instruction "..." --out o

Each benchmark reads ``DATA_DIR/<name>/test.parquet`` (``data/benchmarks.py``): its rows' prompts
are what the model sees and their ``data_source`` selects the reward. Completions come from
``--completions-dir C`` (``C/<name>.jsonl`` in ``--completions``' format; with the two-attempt
protocol also ``C/<name>.attempt2.jsonl``, whose j-th response of a row corrects that row's j-th
first attempt) or are sampled by ``--model`` and written to ``OUT/completions/`` (reusable as
``--completions-dir``). SCoRe's second prompt is the first prompt, the first attempt's ids verbatim
and a new user turn carrying ``--instruction`` (the chat template's own text around it,
``data/chat.py`` NextUserTurn), as the training path builds it.

Writes ``OUT/summary.json`` (per benchmark mean@k, pass@k, the paper's value, problems; the
average), ``OUT/table.md`` (the papers' layout) and ``OUT/samples.jsonl``; prints the table.
"""
from __future__ import annotations

import dataclasses
import json
import logging
from pathlib import Path

from megatron_rl.data.benchmarks import Benchmark, Preset, missing_files, resolve
from megatron_rl.eval.bench_model import sample_benchmarks
from megatron_rl.eval.completions import load_completions, load_rows, score_responses
from megatron_rl.eval.out_dir import prepare_eval_out
from megatron_rl.eval.table import bench_entry, render_markdown, summarize_table, two_attempt_entry
from megatron_rl.rewards.sources import check_rows, row_reward, warn_unmatched

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class BenchRun:
    """How one benchmark is evaluated: samples per problem, the metric at k, the table column, and
    where n came from (for the messages)."""

    bench: Benchmark
    n: int
    metric: str
    k: int
    column: str
    n_from: str = "--n"


def bench_runs(benchmarks: list[Benchmark], preset: Preset | None, n: int | None, k: int | None) -> list[BenchRun]:
    """The ``--n`` / ``--k`` rules of ``--benchmarks``, all here:

    * n (completions read or sampled per problem) = ``--n``; else ``--k`` (one value: the table has one
      column per benchmark); else the preset's n; else the benchmark's paper value (``benchmarks.py``);
    * k = ``--k``; else the preset's k when n is the preset's; else n for a mean@ benchmark and
      min(its paper k, n) for a pass@ one;
    * the metric is the preset's, else the benchmark's; k <= n.
    """
    out = []
    for b in benchmarks:
        metric = preset.metric if preset else b.metric
        nn, n_from = ((n, "--n") if n else (k, "--k") if k else
                      (preset.n, f"the {preset.name} preset's") if preset else (b.k, f"the {b.name} benchmark's paper value"))
        kk = k or (preset.k if preset and nn == preset.n else (nn if metric == "mean" else min(b.k, nn)))
        if kk > nn:
            raise ValueError(f"{b.name}: {metric}@{kk} needs --n >= {kk}, got n={nn} ({n_from})")
        col = preset.label if preset and (nn, kk) == (preset.n, preset.k) else f"{metric}@{kk}"
        out.append(BenchRun(b, nn, metric, kk, col, n_from))
    return out


def read_bench_rows(run: BenchRun, data_dir) -> list[dict]:
    """The rows of a benchmark's prepared file; an unreadable or empty one is a line naming both."""
    import pyarrow as pa  # lazy: defers pyarrow to the call

    path = run.bench.path(data_dir)
    try:
        rows = load_rows(path)
    except (pa.ArrowException, OSError) as e:
        raise ValueError(f"benchmark {run.bench.name}: {path}: not a readable parquet file ({e}); prepare it again "
                         "with megatron-rl data prepare") from None
    except ValueError as e:
        raise ValueError(f"benchmark {run.bench.name}: {e}") from None
    if not rows:
        raise ValueError(f"benchmark {run.bench.name}: {path} has no rows; prepare it again with megatron-rl data prepare")
    return rows


def completions_from_dir(cdir, run: BenchRun, rows: list, data_dir, attempt: int = 1) -> list[list[str]]:
    """``C/<name>.jsonl`` (attempt 2: ``C/<name>.attempt2.jsonl``): the first n responses of each row;
    every problem in it is one line naming the benchmark and the file."""
    f = Path(cdir) / (f"{run.bench.name}.jsonl" if attempt == 1 else f"{run.bench.name}.attempt2.jsonl")
    if not f.is_file():
        raise FileNotFoundError(f"--completions-dir {cdir}: no {f.name} for benchmark {run.bench.name}")
    try:
        comps = load_completions(f)
        if not comps:
            raise ValueError(f"{f} is empty: no completions")
        bad = sorted(i for i in comps if not 0 <= i < len(rows))
        if bad:
            raise ValueError(f"{f}: index {bad[0]} is out of range: {run.bench.path(data_dir)} has {len(rows)} rows "
                             f"(indices 0..{len(rows) - 1}); were the completions made for another file?")
        short = next((i for i in range(len(rows)) if len(comps.get(i, [])) < run.n), None)
        if short is not None:
            raise ValueError(f"{f}: row {short} has {len(comps.get(short, []))} completions, n={run.n} needs {run.n} "
                             f"per row (n: {run.n_from})")
    except ValueError as e:
        raise ValueError(f"benchmark {run.bench.name}: {e}") from None
    return [comps[i][:run.n] for i in range(len(rows))]


def score_table(runs: list[BenchRun], rows: dict, first: dict, second: dict | None, reward_by_source=None,
                reward_default: str | None = None):
    """``(summary, samples)``: every response scored by its row's reward; the table's numbers."""
    from megatron_rl.rewards.manager import RewardManager  # lazy: defers torch to the call

    rm = RewardManager(reward_by_source, default=reward_default)
    entries, samples = {}, []
    for r in runs:
        name = r.bench.name
        rewards = sorted({rm.name_of(x["data_source"], row_reward(x)) for x in rows[name]})
        if rewards != [r.bench.reward]:
            log.warning("%s: its rows' data_source selects reward %s (the paper's: %s)", name, rewards, r.bench.reward)
        c1 = [[v >= 1.0 for v in vs] for vs in score_responses(rows[name], first[name], rm)]
        if second is None:
            entries[name] = bench_entry(r.bench.label, c1, r.metric, r.k, r.column, ",".join(rewards))
        else:
            c2 = [[v >= 1.0 for v in vs] for vs in score_responses(rows[name], second[name], rm)]
            entries[name] = two_attempt_entry(r.bench.label, c1, c2, ",".join(rewards))
        for i, cs in enumerate(c1):
            for j, c in enumerate(cs):
                samples.append({"benchmark": name, "row": i, "sample": j, "correct": c,
                                **({"correct2": c2[i][j]} if second is not None else {})})
    return summarize_table(entries, two_attempt=second is not None), samples


def write_outputs(out, summary: dict, samples: list, meta: dict) -> str:
    """``summary.json`` (+ the run's settings), ``table.md``, ``samples.jsonl``; returns the markdown."""
    out = Path(out)
    md = render_markdown(summary)
    (out / "table.md").write_text(md)
    (out / "summary.json").write_text(json.dumps({**meta, **summary}, indent=1))
    with open(out / "samples.jsonl", "w") as f:
        for s in samples:
            f.write(json.dumps(s) + "\n")
    return md


def run_benchmarks(a, preset: Preset | None, benchmarks: list[Benchmark]) -> dict:
    """The whole ``--benchmarks`` run (arguments already checked); returns the summary."""
    runs = bench_runs(benchmarks, preset, a.n, a.k_given[0] if a.k_given else None)
    two = a.two_attempt or bool(preset and preset.two_attempt)
    rows = {r.bench.name: read_bench_rows(r, a.data_dir) for r in runs}
    by_source, default = getattr(a, "reward_by_source", None), getattr(a, "reward", None)
    seen: set[str] = set()
    for r in runs:   # every row has a reward (the eval flags' choices, the row's, the table's) before any engine
        seen |= set(check_rows(f"benchmark {r.bench.name} ({r.bench.path(a.data_dir)})", str(r.bench.path(a.data_dir)),
                               by_source, default, flag="--reward-by-source"))
    warn_unmatched("--reward-by-source", by_source, seen, "the benchmarks " + ", ".join(r.bench.name for r in runs))
    if a.completions_dir:
        first = {r.bench.name: completions_from_dir(a.completions_dir, r, rows[r.bench.name], a.data_dir) for r in runs}
        second = ({r.bench.name: completions_from_dir(a.completions_dir, r, rows[r.bench.name], a.data_dir, 2)
                   for r in runs} if two else None)
        prepare_eval_out(a.out, a.force, keep=a.completions_dir)
    else:
        prepare_eval_out(a.out, a.force)
        first, second = sample_benchmarks(a, runs, two)
    summary, samples = score_table(runs, rows, first, second, by_source, default)
    meta = {"data_dir": str(a.data_dir), "preset": preset.name if preset else None,
            "source": a.model or a.completions_dir}
    md = write_outputs(a.out, summary, samples, meta)
    print(md, end="")
    return summary


def check_bench_args(a) -> str | None:
    """``--data`` xor ``--benchmarks`` (with ``--data-dir`` and every prepared file there); the
    sampling defaults (the preset's, else T 1.0, top-p 1.0, top-k -1); greedy only with n 1; the
    two-attempt protocol's instruction. Sets ``a.preset`` / ``a.bench_list``."""
    a.preset, a.bench_list = None, []
    if bool(a.data) == bool(a.benchmarks):
        return "give --data FILE or --benchmarks NAMES (with --data-dir), one of them"
    if not a.benchmarks:
        if a.completions_dir or a.data_dir or a.two_attempt:
            return "--completions-dir, --data-dir and --two-attempt go with --benchmarks"
        a.temperature, a.top_p, a.top_k = (1.0 if a.temperature is None else a.temperature,
                                           1.0 if a.top_p is None else a.top_p, -1 if a.top_k is None else a.top_k)
        return None
    if a.completions:
        return "--completions FILE goes with --data; with --benchmarks use --completions-dir DIR"
    if not a.data_dir:
        return "--benchmarks needs --data-dir DIR (DIR/<benchmark>/test.parquet, made by megatron-rl data prepare)"
    try:
        a.bench_list, a.preset = resolve(a.benchmarks)
    except ValueError as e:
        return str(e)
    missing = missing_files(a.bench_list, a.data_dir)
    if missing and (Path(a.data_dir) / "test.parquet").is_file():
        return (f"--data-dir {a.data_dir} holds a test.parquet itself: --data-dir is the folder above the benchmark "
                f"folders (DIR/<benchmark>/test.parquet); pass --data-dir {Path(a.data_dir).parent}")
    if missing:
        return f"--data-dir {a.data_dir}: no {missing[0]} (prepare it with megatron-rl data prepare / data generate kk)"
    p = a.preset
    a.temperature = (p.temperature if p else 1.0) if a.temperature is None else a.temperature
    a.top_p = (p.top_p if p else 1.0) if a.top_p is None else a.top_p
    a.top_k = (p.top_k if p else -1) if a.top_k is None else a.top_k
    if a.completions_dir and not Path(a.completions_dir).is_dir():
        return f"--completions-dir {a.completions_dir}: no such directory"
    two = a.two_attempt or bool(p and p.two_attempt)
    if two and a.model and not (a.instruction or "").strip():
        return "the two-attempt protocol with --model needs --instruction TEXT (SCoRe's self-correction instruction)"
    if a.k_given and len(a.k_given) > 1:
        return (f"--k {','.join(map(str, a.k_given))}: --benchmarks reports one metric per benchmark (the table's "
                "column): give one k (n defaults to it); for several k score each benchmark with --data FILE --k ...")
    try:
        runs = bench_runs(a.bench_list, p, a.n, a.k_given[0] if a.k_given else None)
    except ValueError as e:
        return str(e)
    if a.temperature == 0 and a.model and any(r.n > 1 for r in runs):
        return "--temperature 0 is greedy decoding: one sample per problem (--n 1)"
    a.n_checked = max(r.n for r in runs)
    return None
