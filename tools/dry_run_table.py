"""The dry run of every 7B–14B example config: its record and the table of docs/dry-run.md.

``python tools/dry_run_table.py [NAME ...]`` runs ``megatron-rl train --config examples/configs/NAME.yaml
--dry-run`` (every example but the ``tiny_cpu_*`` ones by default; the model's ``config.json`` from
``tests/fixtures/hf_configs/``) in this process's Python, one role per process as the command does, and writes
what each role measured (bytes by component, the peak and its phase, the seconds) to
``docs/dry-run-results.json``, then the table between the page's markers. The plan column is computed from the
code when the table is rendered, so a change to ``planning/memory.py`` shows there at once.

``tests/unit/test_dry_run_table.py`` checks that the page holds exactly :func:`table` of the record and that every
component the plan estimates is within 10% of what was measured (or 0.05 GiB: the RoPE tables and such);
``tests/unit/trainer/test_dryrun.py`` runs the suite's 8B example again and checks that the record holds what the
code measures now. A documentation generator, so it lives outside the package.
"""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

RECORD = REPO / "docs" / "dry-run-results.json"
PAGE = REPO / "docs" / "dry-run.md"
BEGIN, END = "<!-- dry-run-table: begin (python tools/dry_run_table.py) -->", "<!-- dry-run-table: end -->"
FIXTURES = REPO / "tests" / "fixtures" / "hf_configs"
#: a component's plan within this fraction of the measurement, or within ABS_SLACK bytes
REL_TOL, ABS_SLACK = 0.10, 0.05 * 2**30
COMPONENTS = ("weights", "grads", "optimizer", "reference", "teacher", "other", "activations", "logits", "mu", "push")


def examples() -> list[str]:
    """The 7B–14B example configs by name."""
    return sorted(p.stem for p in (REPO / "examples" / "configs").glob("*.yaml") if not p.stem.startswith("tiny_cpu_"))


def model_dir(name: str) -> Path:
    """The fixture folder of an example's model (its name's prefix)."""
    return next(d for d in sorted(FIXTURES.iterdir(), key=lambda d: -len(d.name)) if name.startswith(d.name))


def overrides(name: str) -> list[str]:
    return [f"model.hf_path={model_dir(name).relative_to(REPO)}"]


def record_of(name: str, results: list[dict], seconds: float) -> dict:
    """What the record keeps of one example's dry run."""
    from megatron_rl.trainer.dryrun.report import measured, peak_of

    roles = []
    for r in results:
        phase, peak = peak_of(r)
        roles.append({"pp_rank": r["role"]["pp_rank"], "rank": r["role"]["rank"], "peak": peak, "phase": phase,
                      "components": {k: int(v) for k, v in measured(r).items()}, "params": r["params"]["unique"],
                      "flops": r["phases"]["update"]["flops"]})
    return {"shape": results[0]["shape"]["text"], "seconds": round(seconds, 1), "roles": roles}


def run(names: list[str]) -> dict:
    """Dry-run ``names`` and update the record."""
    from megatron_rl.trainer.dryrun.run import run as dry_run

    rec = json.loads(RECORD.read_text()) if RECORD.exists() else {}
    for name in names:
        t0 = time.perf_counter()
        _, results = dry_run(str(REPO / "examples" / "configs" / f"{name}.yaml"), overrides(name))
        rec[name] = record_of(name, results, time.perf_counter() - t0)
        print(f"{name}: {rec[name]['seconds']} s", flush=True)
        RECORD.write_text(json.dumps(rec, indent=1, sort_keys=True) + "\n")
    return rec


def plan_of(name: str) -> tuple[str, dict[int, dict[str, float]]]:
    """(layout text, the plan's components by stage) of an example, from the code as it is."""
    from megatron_rl.planning.arch import load_arch
    from megatron_rl.trainer.dryrun.report import plan_stages
    from megatron_rl.trainer.dryrun.roles import layout_of
    from megatron_rl.trainer.dryrun.run import plan_inputs
    from megatron_rl.trainer.loop.preflight import load_checked

    cfg = load_checked(str(REPO / "examples" / "configs" / f"{name}.yaml"), overrides(name))
    layout = layout_of(cfg, env={})
    return layout.text(), plan_stages(load_arch(cfg.model.hf_path), plan_inputs(cfg, layout))


def off_components(role: dict, plan: dict[str, float]) -> list[tuple[str, float, float]]:
    """(component, measured, plan) of every component outside the tolerance (module docstring)."""
    out = []
    for k in COMPONENTS:
        m, p = role["components"][k], plan[k]
        if abs(m - p) > max(REL_TOL * m, ABS_SLACK):
            out.append((k, m, p))
    return out


def table(rec: dict) -> str:
    """The markdown table of the record, the plan column from the code."""
    from megatron_rl.trainer.dryrun.report import plan_total

    gib = 2**30
    lines = ["| config | layout | the step's micro-batches per DP rank | role | measured peak (phase) | plan | Δ "
             "| largest component Δ | push working set | update TFLOP | seconds |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for name in sorted(rec):
        layout, plans = plan_of(name)
        entry = rec[name]
        for role in entry["roles"]:
            plan = plans[role["pp_rank"]]
            total = plan_total(plan)
            worst = max(COMPONENTS, key=lambda k: abs(role["components"][k] - plan[k]))
            m, p = role["components"][worst], plan[worst]
            worst_text = f"{worst} {m / gib:.2f} vs {p / gib:.2f}" + (f" ({(m - p) / p * 100:+.1f}%)" if p else "")
            stage = f"stage {role['pp_rank']}, rank {role['rank']}"
            lines.append(f"| `{name}` | {layout} | {entry['shape'].removesuffix(' per DP rank')} | {stage} "
                         f"| {role['peak'] / gib:.2f} ({role['phase']}) | {total / gib:.2f} "
                         f"| {(role['peak'] - total) / total * 100:+.1f}% | {worst_text} | {role['components']['push'] / gib:.2f} "
                         f"| {role['flops'] / 1e12:.0f} | {entry['seconds']:g} |")
    return "\n".join(lines) + "\n"


def write_page(rec: dict) -> None:
    text = PAGE.read_text()
    head, rest = text.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    PAGE.write_text(f"{head}{BEGIN}\n{table(rec)}{END}{tail}")


if __name__ == "__main__":
    write_page(run(sys.argv[1:] or examples()))
