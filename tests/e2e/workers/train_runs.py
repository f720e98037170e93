"""Several ``megatron-rl train`` runs (config file + overrides) in ONE process with ONE vLLM engine pool
(Ray actor): the uninterrupted reference runs of tests/e2e/test_resume.py, which pay the process,
Ray and engine start once instead of once per run.

    python tests/e2e/workers/train_runs.py SPEC_JSON

SPEC_JSON: ``{"runs": [{"name": N, "config": PATH, "overrides": ["a.b=c", ...], "own_client": false}],
"out": DIR}``. Each run is ``loop.run(load_config(config, overrides))`` — what ``megatron-rl train``
runs — with the shared engine pool (``own_client``: one built from its own config, replacing the
shared one; asynchronous runs pin the trainer process for good, so such a run goes last). Writes
``DIR/results.json`` {name: {ok, secs, error?}}.
"""
from __future__ import annotations

import json
import os
import sys
import time
import traceback
from pathlib import Path


def main(spec_path: str) -> int:
    from megatron_rl.config import load_config
    from megatron_rl.console import quiet_console
    from megatron_rl.parallel import init_parallel
    from megatron_rl.trainer.loop import run
    from megatron_rl.trainer.setup import build_client

    quiet_console()
    spec = json.loads(Path(spec_path).read_text())
    out = Path(spec["out"])
    client, results = None, {}
    for r in spec["runs"]:
        t0 = time.time()
        try:
            cfg = load_config(r["config"], r.get("overrides", []))
            if client is None or r.get("own_client"):
                if client is not None:
                    client.shutdown()
                init_parallel(cfg.parallel.tp, cfg.parallel.pp, seed=cfg.trainer.seed)
                client = build_client(cfg)
            run(cfg, client=client)
            results[r["name"]] = {"ok": True}
        except BaseException as e:  # noqa: BLE001 - reported per run, the next run still runs
            results[r["name"]] = {"ok": False, "error": "".join(traceback.format_exception(e))[-4000:]}
        results[r["name"]]["secs"] = round(time.time() - t0, 1)
        print(f"[train_runs] {r['name']}: {results[r['name']]}", flush=True)
    if client is not None:
        client.shutdown()
    (out / "results.json").write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    os.environ.setdefault("WANDB_MODE", "offline")
    sys.exit(main(sys.argv[1]))
