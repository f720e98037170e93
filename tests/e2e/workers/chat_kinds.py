"""Every ``algo.kind`` for a few RL steps on the chat-template fixture, in ONE process with ONE vLLM
engine pool (Ray actor) reused across kinds — the engine start dominates a short run.

    python tests/e2e/workers/chat_kinds.py FIXTURE_DIR OUT_DIR GRADER_URL KIND [KIND ...]

Writes ``OUT_DIR/results.json`` {kind: {ok, secs, error?}}; each kind's run dir ``OUT_DIR/<kind>``
holds ``metrics.jsonl`` and ``samples.jsonl`` (``logging.dump_samples``).
"""
from __future__ import annotations

import json
import os
import sys
import time
import traceback
from pathlib import Path

STEPS = int(os.environ.get("CHAT_KINDS_STEPS", "2"))   # RL steps per kind


ASYNC = "@async"   # "<kind>@async": that kind one-step-off (rollout.max_staleness=1) for STEPS + 1 steps


def overrides(kind: str, fx: dict, out: Path, grader_url: str) -> list[str]:
    from megatron_rl.data.chat_fixture import SCORE_INSTRUCTION

    if kind.endswith(ASYNC):
        base = kind[: -len(ASYNC)]
        return [*overrides(base, fx, out, grader_url), f"trainer.run_dir={out / kind}", f"trainer.steps={STEPS + 1}",
                "rollout.max_staleness=1"]
    ov = [f"model.hf_path={fx['hf_path']}", f"data.train={fx['train']}", "data.val=", "data.prompts_per_step=4",
          "data.max_prompt_len=64", "rollout.n=4", "rollout.max_tokens=24", "rollout.max_model_len=320",
          "rollout.temperature=1.0", "rollout.kv_cache_gib=0.25", "optim.lr=1e-4", f"trainer.steps={STEPS}",
          "trainer.micro_batch_size=8",
          f"trainer.run_dir={out / kind}", "trainer.ckpt_every=0", "trainer.export_hf=false", "trainer.seed=7",
          "logging.wandb_mode=disabled", "logging.progress=false", "logging.dump_samples=2", f"algo.kind={kind}"]
    if kind in ("opsd", "sdpo", "srpo", "opsd_ectr"):
        ov.append(f"algo.{kind}.top_k=8")
    if kind == "score":
        ov += [f"algo.score.instruction={SCORE_INSTRUCTION}", "algo.score.stage1_steps=1"]
    if kind == "papo":
        ov += [f"reward.grader_url={grader_url}", "reward.grader_timeout=10", "reward.grader_retries=0"]
    if kind == "dapo":
        ov += ["algo.dapo.overlong_buffer_len=8", "algo.dapo.max_num_gen_batches=2", "algo.dapo.at_cap=fill"]
    return ov


def main(fixture_dir: str, out_dir: str, grader_url: str, kinds: list[str]) -> int:
    from megatron_rl.data.chat_fixture import build_chat_fixture
    from megatron_rl.parallel import init_parallel
    from megatron_rl.preflight import load_checked
    from megatron_rl.trainer.loop import run
    from megatron_rl.trainer.setup import build_client

    fx = build_chat_fixture(fixture_dir)
    out = Path(out_dir)
    init_parallel(1, 1, seed=0)
    client, results = None, {}
    for kind in kinds:
        t0 = time.time()
        try:
            cfg = load_checked(None, overrides(kind, fx, out, grader_url))
            if client is None:
                client = build_client(cfg)
            run(cfg, client=client)
            results[kind] = {"ok": True}
        except BaseException as e:  # noqa: BLE001 - reported per kind, the next kind still runs
            results[kind] = {"ok": False, "error": "".join(traceback.format_exception(e))[-4000:]}
        results[kind]["secs"] = round(time.time() - t0, 1)
        print(f"[chat_kinds] {kind}: {results[kind]}", flush=True)
    if client is not None:
        client.shutdown()
    (out / "results.json").write_text(json.dumps({"fixture": fx, "kinds": results}, indent=1))
    return 0


if __name__ == "__main__":
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    sys.exit(main(sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:]))
