"""The 7B–14B example configs' plans: the docs' layout table and the plan lines of their headers.

Each example under ``examples/configs/`` (but the ``tiny_cpu_*`` ones) names in its header the
``megatron-rl plan --config ...`` command that plans it, and under it the figures that plan prints
(``# plan (GiB per GPU of 78): ...``). the layout table of docs/plan-and-memory.md: :func:`layout_table` renders it from those
command lines; ``python tools/example_plans.py`` prints it and ``tests/unit/test_plan_config.py``
checks that the page holds exactly that text, that every example fits as configured, and that the
header figures are the current ones. A documentation generator, so it lives outside the package:
``megatron_rl.planning.config`` (``plan --config``) need not parse command lines of the CLI.
"""
from __future__ import annotations

import re
import shlex
from pathlib import Path

from megatron_rl.cli import parse_command
from megatron_rl.cli.plan import report_for
from megatron_rl.planning.memory import GIB, fits

REPO = Path(__file__).resolve().parents[1]
CONFIGS = REPO / "examples" / "configs"


def header_plan_line(path: Path) -> str | None:
    """The ``megatron-rl plan ...`` command in an example config's header comment, if any."""
    m = re.search(r"^#\s+(megatron-rl plan .*)$", path.read_text(), re.MULTILINE)
    return m.group(1) if m else None


def figures_line(rep) -> str:
    """The plan figures an example's header states under its plan command (``tests/unit/test_plan_config.py``
    pins them): GiB per GPU against the budget."""
    i = rep.inputs
    if i.colocated:
        parts = [f"training {rep.train_total / GIB:.1f}", f"update {rep.update_peak / GIB:.1f}",
                 f"generation {rep.generation_peak / GIB:.1f}"]
    else:
        parts = [f"training {rep.train_total / GIB:.1f}", f"rollout {rep.rollout_total / GIB:.1f}"]
    return f"plan (GiB per GPU of {i.gpu_mem_gib:g}): " + ", ".join(parts) + f", peak {rep.peak / GIB:.1f}"


def header_figures(path: Path) -> str | None:
    """The ``# plan (GiB per GPU ...): ...`` line of an example's header, if any."""
    m = re.search(r"^#\s+(plan \(GiB per GPU .*)$", path.read_text(), re.MULTILINE)
    return m.group(1) if m else None


def example_report(path: Path):
    """The plan of an example config, from its header's ``megatron-rl plan --config`` line."""
    line = header_plan_line(path)
    if line is None:
        raise ValueError(f"{path.name}: header lacks a 'megatron-rl plan --config ...' line")
    args = parse_command(shlex.split(line)[1:]).args
    if args.config and not Path(args.config).is_absolute():
        args.config = str(REPO / args.config)           # the header's path is relative to the repository
    return report_for(args)


def _row(path: Path) -> str:
    """One table row: the example's layout, micro-batch, placement and the plan's peaks."""
    def g(b: int) -> str:
        return f"{b / GIB:.1f}"

    rep = example_report(path)
    i = rep.inputs
    train_gpus, roll_gpus = i.tp * i.pp * i.cp * i.dp, i.rollout_engines * i.rollout_tp
    cp = f"×CP{i.cp}" if i.cp > 1 else ""
    if i.colocated:
        layout = f"TP{i.tp}×PP{i.pp}{cp}×DP{i.dp} ({train_gpus}), {i.rollout_engines} engines × TP{i.rollout_tp} on them"
        coloc = f"{g(rep.peak)} = max({g(rep.update_peak)}, {g(rep.generation_peak)})"
    else:
        layout = (f"TP{i.tp}×PP{i.pp}{cp}×DP{i.dp} ({train_gpus}) + {i.rollout_engines} engines × "
                  f"TP{i.rollout_tp} ({roll_gpus})")
        coloc = "— (own GPUs)"
    where = "colocated" if i.colocated else "separate"
    return (f"| `{path.stem}` | {rep.arch.name} | {layout} | {i.micro_batch_text()} | {where} / {i.offload} "
            f"| {g(rep.train_total)} | {g(rep.rollout_total)} | {coloc} | {'yes' if fits(rep) else 'NO'} |")


def layout_table() -> str:
    """The layout table of docs/plan-and-memory.md (markdown): per 7B–14B example, the plan as configured."""
    head = ("| config | model | layout (GPUs) | micro-batch per DP rank | placement / trainer.offload | train peak "
            "| rollout peak | colocated peak: max(update, generation) | fits 78 GiB |")
    lines = [head, "|---|---|---|---|---|---|---|---|---|"]
    lines += [_row(p) for p in sorted(CONFIGS.glob("*.yaml")) if not p.stem.startswith("tiny_cpu_")]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    print(layout_table(), end="")
