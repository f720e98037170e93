"""The dry run's process for one rank role: ``python -m megatron_rl.trainer.dryrun.worker '<json>'``.

It loads the config as ``train`` does, starts the role's rank (``build.py``), builds every model the method
holds, measures what they hold (``measure.py``), runs one RL step (``step.py``), and prints one line,
:data:`MARK` followed by a JSON object: the role, its parameters, the static components, the phases, the
batch and the seconds each part took. One process per role: each has its own fake world and Megatron state.
"""
from __future__ import annotations

import json
import sys
import time

MARK = "DRYRUN-RESULT "


def simulate(request: dict) -> dict:
    """The measurements of one role (module docstring); ``request``: config, overrides, layout, role."""
    t0 = time.perf_counter()
    from megatron_rl.models.provider import padded_vocab_size  # lazy: the worker's imports are its start-up
    from megatron_rl.trainer.dryrun.build import build_models, start_rank  # lazy: as above
    from megatron_rl.trainer.dryrun.measure import param_counts, static_bytes  # lazy: as above
    from megatron_rl.trainer.dryrun.roles import Layout, Role  # lazy: as above
    from megatron_rl.trainer.dryrun.step import run_step, step_shape  # lazy: as above
    from megatron_rl.trainer.loop.preflight import load_checked  # lazy: as above

    cfg = load_checked(request["config"], request["overrides"])
    layout, role = Layout(**request["layout"]), Role(**request["role"])
    dev, info = start_rank(layout, role, seed=cfg.trainer.seed)
    t1 = time.perf_counter()
    models = build_models(cfg, info, dev)
    t2 = time.perf_counter()
    static = static_bytes(dev, models)
    hf = models.actor.hf_cfg
    counts = param_counts(models, layout.tp, padded_vocab_size(hf, layout.tp), int(hf.vocab_size))
    shape = step_shape(cfg, layout)
    phases = run_step(cfg, models, dev, shape)
    static_after = static_bytes(dev, models)            # Adam's state exists after the first step
    return {"role": request["role"], "params": counts, "static_built": static, "static": static_after,
            "phases": phases, "shape": {**vars(shape), "slots": shape.slots, "text": shape.text()},
            "seconds": {"start": round(t1 - t0, 1), "build": round(t2 - t1, 1),
                        "step": round(time.perf_counter() - t2, 1)}}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    out = simulate(json.loads(argv[0]))
    print(MARK + json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
