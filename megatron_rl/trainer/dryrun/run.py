"""``megatron-rl train --config C --dry-run [a.b=c ...]``: every rank role of C's layout simulated on this CPU, one
process each (``worker.py``), and the report (``report.py``): measured memory beside ``megatron-rl plan``'s, the
oracles, and the last line ``dry run: R rank roles, peak X GiB on rank K (plan Y GiB), parameters Z B over all
ranks``. No engines, no Ray, no data: the batch is made from the config's length limits (``step.py``).

``model.hf_path`` needs only the model's ``config.json`` (``tests/fixtures/hf_configs/`` holds those of the
examples' models). Exit status 0; 2 when the config is refused (as ``train``), 1 when a role fails.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from megatron_rl.models.provider import padded_vocab_size
from megatron_rl.planning.arch import load_arch
from megatron_rl.planning.config import config_inputs
from megatron_rl.planning.memory import GIB, PlanInputs
from megatron_rl.planning.verdict import refusal
from megatron_rl.trainer.dryrun import oracles
from megatron_rl.trainer.dryrun.report import DEVICES, measured, peak_of, plan_stages, plan_total, role_table
from megatron_rl.trainer.dryrun.roles import Layout, Role, layout_of, roles
from megatron_rl.trainer.dryrun.worker import MARK
from megatron_rl.trainer.loop.preflight import load_checked


class RoleFailed(RuntimeError):
    """A role's process ended without its result."""


def simulate_role(config: str, overrides: list[str], layout: Layout, role: Role, timeout_s: float = 1800) -> dict:
    """Run ``worker.py`` for ``role`` in a fresh process; its result."""
    import dataclasses  # lazy: only the role's request needs it

    req = {"config": config, "overrides": list(overrides), "layout": dataclasses.asdict(layout),
           "role": dataclasses.asdict(role)}
    env = {**os.environ, "TORCHDYNAMO_DISABLE": "1", "TOKENIZERS_PARALLELISM": "false"}
    env.pop("WORLD_SIZE", None)
    env.pop("RANK", None)
    r = subprocess.run([sys.executable, "-m", "megatron_rl.trainer.dryrun.worker", json.dumps(req)],
                       capture_output=True, text=True, env=env, timeout=timeout_s, check=False)
    for line in r.stdout.splitlines():
        if line.startswith(MARK):
            return json.loads(line[len(MARK):])
    tail = "\n".join((r.stderr or r.stdout).strip().splitlines()[-25:])
    raise RoleFailed(f"dry run: role {role} (rank {role.rank}) failed, exit {r.returncode}:\n{tail}")


def plan_inputs(cfg, layout: Layout) -> PlanInputs:
    """``megatron-rl plan --config``'s inputs for ``cfg`` at the dry run's DP."""
    return PlanInputs(**config_inputs(cfg), dp=layout.dp)


def check_model(cfg) -> None:
    """``model.hf_path`` must hold a ``config.json`` (the shape is all the dry run needs)."""
    if not (Path(cfg.model.hf_path) / "config.json").is_file():
        raise FileNotFoundError(f"dry run: model.hf_path={cfg.model.hf_path} has no config.json; pass "
                                "model.hf_path=DIR holding the model's config.json (tests/fixtures/hf_configs/<model> "
                                "for the examples' models)")


def run(config: str, overrides: list[str]) -> tuple[str, list[dict]]:
    """Simulate every role of ``config``; (the report, the roles' results)."""
    try:
        cfg = load_checked(config, overrides)
    except FileNotFoundError as e:
        raise FileNotFoundError(f"{e}; the dry run needs the config.json only: model.hf_path=DIR "
                                "(tests/fixtures/hf_configs/<model> for the examples' models)") from None
    check_model(cfg)
    layout = layout_of(cfg)
    t0 = time.perf_counter()
    results = [simulate_role(config, overrides, layout, role) for role in roles(layout)]
    return format_report(cfg, config, layout, results, time.perf_counter() - t0), results


def format_report(cfg, config: str, layout: Layout, results: list[dict], seconds: float) -> str:
    """The whole report (``report.py``'s tables, the oracles, the last line)."""
    arch = load_arch(cfg.model.hf_path)
    inp = plan_inputs(cfg, layout)
    plans = plan_stages(arch, inp)
    shape = results[0]["shape"]["text"]
    lines = [f"dry run of {config} ({cfg.algo.kind}): model {cfg.model.hf_path}, {arch.total_params() / 1e9:.3f} B "
             f"parameters", f"layout {layout.text()}; the step's batch: {shape}", ""]
    for res in results:
        role = Role(**res["role"])
        lines += role_table(res, role.name(layout), plans.get(role.pp_rank))
        lines.append(f"  seconds: start {res['seconds']['start']}, build {res['seconds']['build']}, step "
                     f"{res['seconds']['step']} (" + ", ".join(f"{k} {v['seconds']}" for k, v in res["phases"].items())
                     + ")")
        lines.append("")
    lines += oracle_lines(cfg, layout, arch, results)
    lines += verdict_lines(results)
    lines.append(last_line(layout, results, plans, seconds))
    return "\n".join(lines)


def oracle_lines(cfg, layout: Layout, arch, results: list[dict]) -> list[str]:
    """Parameters over all ranks against transformers' count; the most loaded rank's weight + optimizer bytes
    against Megatron-LM's estimate (``oracles.py``)."""
    total = sum(r["params"]["unique"] for r in results)
    hf = oracles.hf_param_count(cfg.model.hf_path)
    padded = padded_vocab_size(cfg.model.hf_path, layout.tp)
    est = oracles.megatron_state_bytes(arch, padded, layout.tp, layout.pp, layout.dp, layout.cp,
                                       cfg.optim.use_distributed_optimizer, cfg.model.bf16)
    state = max(sum(r["static"][k] for k in ("weights", "grads", "optimizer")) for r in results)
    local = max(r["params"]["local"] for r in results)
    head = [(f"oracle: parameters over all ranks {total:,} vs transformers' model {hf:,}: "
             f"{'equal' if total == hf else f'DIFFER by {total - hf:+,}'}")]
    if cfg.lora.enable:   # a frozen base: Megatron-LM's estimate (every weight trained) does not apply
        most = max(r["params"].get("adapters", 0) for r in results)
        return head + [(f"oracle: LoRA (lora.rank={cfg.lora.rank}): the base frozen, at most {most:,} adapter "
                        "parameters on a rank; Megatron-LM's estimate trains every weight and is not held against this "
                        "run (the plan column counts the adapters' grads and optimizer state)")]
    return head + [(f"oracle: most loaded rank {local:,} parameters, weights + grads + optimizer {state / GIB:.2f} GiB vs "
                    f"Megatron-LM's estimate {est.params:,} x {est.bytes_per_param:g} B = {est.bytes / GIB:.2f} GiB "
                    f"({(state - est.bytes) / est.bytes * 100:+.3f}%)")]


def verdict_lines(results: list[dict]) -> list[str]:
    """Per device of ``report.DEVICES`` the most loaded rank does not fit: the line ``train`` would refuse it with
    (``planning/verdict.py``), from the components measured."""
    top = max(results, key=lambda r: peak_of(r)[1])
    out = []
    for name, device in DEVICES:
        if line := refusal(measured(top), device, f"dry run: rank {top['role']['rank']} on a {name} GPU"):
            out.append(line)
    return out


def last_line(layout: Layout, results: list[dict], plans: dict, seconds: float) -> str:
    """``dry run: R rank roles, peak X GiB on rank K (plan Y GiB), parameters Z B over all ranks``."""
    top = max(results, key=lambda r: peak_of(r)[1])
    plan = plans.get(top["role"]["pp_rank"])
    plan_text = f"{plan_total(plan) / GIB:.2f} GiB" if plan else "n/a"
    total = sum(r["params"]["unique"] for r in results)
    return (f"dry run: {len(results)} rank roles, peak {peak_of(top)[1] / GIB:.2f} GiB on rank {top['role']['rank']} "
            f"(plan {plan_text}), parameters {total / 1e9:.3f} B over all ranks")


def main(config: str, overrides: list[str]) -> int:
    """The command (module docstring)."""
    try:
        text, _ = run(config, overrides)
    except RoleFailed as e:
        print(str(e), file=sys.stderr)
        return 1
    print(text)
    return 0
