"""Named benchmarks as the training run's held-out evaluation (``trainer.eval_benchmarks``).

The benchmarks' prepared files (``trainer.eval_data_dir/<name>/test.parquet``) are read into one
prompt set (each benchmark a contiguous block, at most ``trainer.eval_prompts`` problems each), so
the loop's evaluation samples them in one engine call at the ``trainer.eval_*`` settings and
reports the same table as ``megatron-rl eval --benchmarks`` (``eval/table.py``): logged metrics
``eval/<benchmark>/<metric>`` and ``eval/avg`` (= ``eval/acc``), and ``run_dir/eval/step_<N>.md``
with ``step_<N>.json``.
"""
from __future__ import annotations

import json
from pathlib import Path


def selected(cfg):
    """``(benchmarks, preset)`` named by ``trainer.eval_benchmarks`` or ``([], None)``; a one-line
    ``ValueError`` for an unknown name, a missing file, ``data.val`` set too, or SCoRe's two-attempt
    preset (``megatron-rl eval`` only)."""
    from megatron_rl.data.benchmarks import missing_files, resolve

    t = cfg.trainer
    if not t.eval_benchmarks:
        return [], None
    try:
        benchmarks, preset = resolve(t.eval_benchmarks)
    except ValueError as e:
        raise ValueError(f"trainer.eval_benchmarks: {e}") from None
    if cfg.data.val:
        raise ValueError(f"trainer.eval_benchmarks={t.eval_benchmarks} and data.val={cfg.data.val} are both set: the "
                         "benchmarks are the held-out evaluation; set data.val= (empty) or drop eval_benchmarks")
    if preset is not None and preset.two_attempt:
        raise ValueError(f"trainer.eval_benchmarks={preset.name}: the two-attempt protocol runs in megatron-rl eval "
                         "--benchmarks score; name its benchmarks (gsm8k,math) for single-attempt accuracy here")
    missing = missing_files(benchmarks, t.eval_data_dir)
    if missing:
        raise FileNotFoundError(f"trainer.eval_benchmarks: no {missing[0]} (trainer.eval_data_dir={t.eval_data_dir}; "
                                "make it with megatron-rl data prepare / data generate kk)")
    return benchmarks, preset


def benchmark_prompts(cfg, tok):
    """One :class:`~megatron_rl.data.dataset.PromptDataset` of the benchmarks' problems (at most
    ``eval_prompts`` each), with ``blocks`` = ``[(name, start, stop)]``; None when none are named."""
    from megatron_rl.data.dataset import PromptDataset

    benchmarks, _ = selected(cfg)
    if not benchmarks:
        return None
    rows, blocks = [], []
    for b in benchmarks:
        try:
            ds = PromptDataset.from_parquet(b.path(cfg.trainer.eval_data_dir), tok, cfg.data.max_prompt_len,
                                            cfg.data.on_error)
        except ValueError as e:
            raise ValueError(f"trainer.eval_benchmarks {b.name}: {e}") from None
        take = ds.rows[:cfg.trainer.eval_prompts]
        blocks.append((b.name, len(rows), len(rows) + len(take)))
        rows.extend(take)
    out = PromptDataset(rows)
    out.blocks = blocks
    return out


def table_metrics(cfg, val_set, correct: list[list[bool]], n: int, step: int, write: bool = True) -> dict:
    """The table of one evaluation from the correctness of every problem of ``val_set`` (in order);
    returns the flat metrics (``eval/acc`` = ``eval/avg``) and writes ``run_dir/eval/step_<step>.md|json``."""
    from megatron_rl.eval.bench import bench_runs
    from megatron_rl.eval.table import bench_entry, log_metrics, render_markdown, summarize_table

    benchmarks, preset = selected(cfg)
    runs = {r.bench.name: r for r in bench_runs(benchmarks, preset, n, None)}
    entries = {name: bench_entry(runs[name].bench.label, correct[a:b], runs[name].metric, runs[name].k,
                                 runs[name].column) for name, a, b in val_set.blocks}
    summary = summarize_table(entries)
    out = log_metrics(summary)
    out["eval/acc"] = out["eval/avg"]
    if write:
        d = Path(cfg.trainer.run_dir) / "eval"
        d.mkdir(parents=True, exist_ok=True)
        (d / f"step_{step}.md").write_text(render_markdown(summary))
        (d / f"step_{step}.json").write_text(json.dumps(summary, indent=1))
    return out
