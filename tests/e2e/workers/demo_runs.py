"""Several RL runs in ONE process with ONE vLLM engine pool (Ray actor): the e2e tests' fixed cost per
run (imports, Ray, the engine start, ~35 s on 2 cores) is paid once instead of once per run.

    python tests/e2e/workers/demo_runs.py SPEC_JSON

SPEC_JSON::

    {"warm": {"algo": "rlsd", "run_dir": "...", "warm_threshold": 0.45}   # a fresh demo warm start, or
     "init_from": "...",                                                   # an earlier demo run dir, or neither
     "runs": [{"name": "rlcsd", "algo": "rlcsd", "steps": 40, "overrides": ["a.b=c"], "own_client": false},
              {"name": "ref", "config": "examples/configs/x.yaml", "overrides": [...]}, ...],
     "out": "DIR"}

A run with ``algo`` is what ``python -m megatron_rl.cli.demo --algo ALGO --steps N --init-from WARM -o ...``
does (same ``demo_config``, same ``loop.run``), in ``OUT/<name>``; a run with ``config`` is what
``megatron-rl train --config CONFIG OVERRIDES...`` does (``loop.run(load_checked(...))``; its run dir is
its own ``trainer.run_dir``). ``own_client``: the run gets an engine pool built from its own config
(asynchronous runs: their engines are pinned to their own cores; the trainer process is pinned for
good, so such a run goes last); otherwise the pool of the warm start or of the first run is reused.
Writes ``OUT/results.json`` {name: {ok, before, after, secs, error?}}.
"""
from __future__ import annotations

import json
import os
import sys
import time
import traceback
from pathlib import Path


def main(spec_path: str) -> int:
    from megatron_rl.cli import demo as D
    from megatron_rl.runtime.console import quiet_console
    from megatron_rl.runtime.parallel import init_parallel
    from megatron_rl.trainer.loop.preflight import load_checked
    from megatron_rl.trainer.loop.rl_loop import run
    from megatron_rl.trainer.loop.setup import build_client

    quiet_console()
    spec = json.loads(Path(spec_path).read_text())
    out = Path(spec["out"]).resolve()
    out.mkdir(parents=True, exist_ok=True)
    if spec.get("warm"):
        w = spec["warm"]
        warm = Path(w["run_dir"]).resolve()
        args = D.build_parser().parse_args(["--algo", w["algo"], "--run-dir", str(warm),
                                            "--warm-threshold", str(w.get("warm_threshold", 0.30))])
        paths, tok, init_hf = D.prepare(warm, args.seed)
        D.warm_start_phase(D.demo_config(args, warm, paths, init_hf), warm, tok, args)   # starts the engine pool
    elif spec.get("init_from"):
        warm = Path(spec["init_from"]).resolve()
    results: dict = {}
    for r in spec["runs"]:
        t0 = time.time()
        try:
            if "config" in r:
                cfg = load_checked(r["config"], r.get("overrides", []))
            else:
                argv = ["--algo", r["algo"], "--steps", str(r["steps"]), "--run-dir", str(out / r["name"]),
                        "--init-from", str(warm)]
                for o in r.get("overrides", []):
                    argv += ["-o", o]
                args = D.build_parser().parse_args(argv)
                cfg = D.demo_config(args, out / r["name"], {s: warm / "data" / f"{s}.parquet" for s in ("train", "val", "test")},
                                    warm / "sft_hf")
            if D._CLIENT[0] is None or r.get("own_client"):
                if D._CLIENT[0] is not None:
                    D._CLIENT[0].shutdown()
                init_parallel(cfg.parallel.tp, cfg.parallel.pp, seed=cfg.trainer.seed)
                D._CLIENT[0] = build_client(cfg)
            summary = run(cfg, client=D._CLIENT[0], overwrite=True)
            results[r["name"]] = {"ok": True, "before": summary.get("val_acc_before"), "after": summary.get("val_acc_after")}
        except BaseException as e:  # noqa: BLE001 - reported per run, the next run still runs
            results[r["name"]] = {"ok": False, "error": "".join(traceback.format_exception(e))[-4000:]}
        results[r["name"]]["secs"] = round(time.time() - t0, 1)
        print(f"[demo_runs] {r['name']}: {results[r['name']]}", flush=True)
    if D._CLIENT[0] is not None:
        D._CLIENT[0].shutdown()
    (out / "results.json").write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    os.environ.setdefault("WANDB_MODE", "offline")
    sys.exit(main(sys.argv[1]))
