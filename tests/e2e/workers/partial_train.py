"""``megatron-rl train``'s loop with in-flight partial rollouts (``rollout.partial=true``, one ``vllm-async``
engine) on the chat fixture, driven by ``tests/e2e/test_partial_train.py``.

    python tests/e2e/workers/partial_train.py FIXTURE_DIR OUT_DIR

GRPO as the chat-kinds matrix runs it (``chat_kinds.overrides``: 4 prompts x 4 samples a step), 2 extra
groups in flight, a staleness bound of 2 steps, an ``optim.lr`` that moves the policy. The groups a step
submits start right before its update, so the ones still running at its push span it. Phase A: steps 1..6
with a checkpoint each step; phase B: ``resume="auto"`` up to step 8 in the same process with the same
engine (the pool's pending groups regenerated from their seeds). Writes ``OUT_DIR/results.json``
{secs_a, secs_b, start_b}; the run dir is ``OUT_DIR/run``."""
from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

PARTIAL = ["rollout.engine=vllm-async", "rollout.partial=true", "rollout.partial_extra_groups=2",
           "rollout.partial_max_staleness=2", "trainer.mini_batch_prompts=2",
           "rollout.max_tokens=48", "optim.lr=1e-3", "trainer.ckpt_every=1", "trainer.keep_last=0"]


def main(fixture_dir: str, out_dir: str) -> int:
    from chat_kinds import overrides

    from megatron_rl.runtime.parallel import init_parallel
    from megatron_rl.trainer.loop.preflight import load_checked
    from megatron_rl.trainer.loop.rl_loop import run
    from megatron_rl.trainer.loop.setup import build_client
    from tests.helpers.chat_fixture import build_chat_fixture
    from tests.helpers.inflight_faults import LongTailClient

    fx = build_chat_fixture(fixture_dir)
    out = Path(out_dir)
    init_parallel(1, 1, seed=0)
    base = [o.replace(f"trainer.run_dir={out / 'grpo'}", f"trainer.run_dir={out / 'run'}") for o in overrides("grpo", fx, out, "")]
    cfg_a = load_checked(None, [*base, *PARTIAL, "trainer.steps=6"])
    client = build_client(cfg_a, client_cls=LongTailClient)   # some responses outlast every push (its docstring)
    res = {}
    try:
        t0 = time.time()
        run(cfg_a, client=client)
        res["secs_a"] = round(time.time() - t0, 1)
        t0 = time.time()
        res["start_b"] = run(load_checked(None, [*base, *PARTIAL, "trainer.steps=8"]), resume="auto", client=client)["start_step"]
        res["secs_b"] = round(time.time() - t0, 1)
    finally:
        client.shutdown()
    (out / "results.json").write_text(json.dumps(res))
    return 0


if __name__ == "__main__":
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    sys.exit(main(sys.argv[1], sys.argv[2]))
