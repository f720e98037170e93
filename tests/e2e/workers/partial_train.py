"""``megatron-rl train``'s loop with in-flight partial rollouts (``rollout.partial.enable=true``, one ``vllm-async``
engine) on the chat fixture, driven by ``tests/e2e/test_partial_train.py``, one phase per process.

    python tests/e2e/workers/partial_train.py FIXTURE_DIR OUT_DIR a|b

GRPO as the chat-kinds matrix runs it (``chat_kinds.overrides``: 4 prompts x 4 samples a step), 2 extra
groups in flight, an ``optim.lr`` that moves the policy, a checkpoint every step, 9 steps; the engine
holds one group of each top-up across the next push on purpose (``LongTailClient``), so responses span
pushes on any host (the 48 tokens alone outlast a training step only on a slow or loaded one).

* ``a``: from scratch, policy ``drop`` with a staleness bound of 2. The test SIGKILLs this process's
  whole group (driver, Ray, the engine) in the middle of step 7, responses in flight.
* ``b``: a fresh process and engine, ``resume="auto"`` (the last complete checkpoint) up to step 9, policy
  ``mask`` with a bound of 0 — a response that spans a push has its pre-push tokens masked out of the
  next step's loss (``partial/masked_tokens``), one finished before that push is dropped.
  Writes ``OUT_DIR/results.json`` {start_b, secs_b}.

The run dir is ``OUT_DIR/run``."""
from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

PARTIAL = ["rollout.engine=vllm-async", "rollout.partial.enable=true", "rollout.partial.extra_groups=2",
           "trainer.mini_batch_prompts=2", "rollout.max_tokens=48", "optim.lr=1e-3", "trainer.ckpt_every=1",
           "trainer.keep_last=0", "trainer.steps=9"]
PHASE = {"a": ["rollout.partial.max_staleness=2", "rollout.partial.policy=drop"],
         "b": ["rollout.partial.max_staleness=0", "rollout.partial.policy=mask"]}


def main(fixture_dir: str, out_dir: str, phase: str) -> int:
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
    cfg = load_checked(None, [*base, *PARTIAL, *PHASE[phase]])
    client = build_client(cfg, client_cls=LongTailClient)   # a group of each top-up spans the next push (its docstring)
    try:
        t0 = time.time()
        res = run(cfg, resume="auto" if phase == "b" else None, client=client)
        out_res = {"start_b": res["start_step"], "secs_b": round(time.time() - t0, 1)}
    finally:
        client.shutdown()
    (out / "results.json").write_text(json.dumps(out_res))
    return 0


if __name__ == "__main__":
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    sys.exit(main(*sys.argv[1:4]))
