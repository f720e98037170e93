"""Weight-sync verification (``rollout.verify_sync``) on real training runs, with faults injected.

    python tests/e2e/workers/verify_sync.py WORK_DIR

In ONE process (``loop.run(cfg, client=...)`` as the demo calls it), on the demo's tiny GRPO task with
its random-init policy (positions raised to 512: rotary, so only the config changes; prompts then
fit a 400-token shared probe prefix, 3 KV blocks of vLLM-CPU's 128): a healthy 2-step run verified
at every push, then one 2-step run per fault, each expected to stop after step 1 (the first verified
push). Faults come through the real seams of ``tests/helpers/sync_faults.py`` (an engine pool that
alters what it pushes; an engine that skips its cache reset) and, for the dtype, an engine pool
built in bfloat16 under an fp32 trainer. Writes ``WORK_DIR/results.json``: per case the exit
(``ok`` or the stop line), the steps logged, the verification metrics and whether step 1 was
checkpointed.

The ``lora_adapter`` case (``lora.push: adapter``, issue 54): the same healthy 2-step run with LoRA adapters whose
engine serves the pushed adapters through vLLM's LoRA support; its reward is the share of digits in the
response (registered here: ``digit_share``), which varies inside a group even for the random-init policy, so
the advantages, and with them the adapters' ``B``, are non-zero after step 1: every verified push then compares
Megatron's log-probs with the engine serving a non-trivial adapter. Its PEFT export's largest |B| is recorded.
"""
from __future__ import annotations

import json
import sys
import time
import traceback
from pathlib import Path

CASES = [("healthy", None), ("skip_tensor", "skip:model.layers.1.mlp.down_proj.weight"), ("swap_qk", "swap_qk"),
         ("stale_cache", "stale_cache"), ("engine_dtype", "bfloat16"), ("lora_adapter", None)]
LORA = ["lora.enable=true", "lora.push=adapter", "lora.rank=8", "lora.alpha=16", "reward.by_source={reverse: digit_share}",
        "optim.weight_decay=0.0", "trainer.export_hf=true"]


def digit_share(response: str, ground_truth) -> float:
    """The share of digits in ``response``: a reward that differs inside a group of random responses."""
    return sum(ch.isdigit() for ch in response) / max(1, len(response))


def overrides(setup: dict, run_dir: Path, verify: str) -> list[str]:
    return [f"model.hf_path={setup['hf']}", f"data.train={setup['train']}", "data.val=", "data.prompts_per_step=4",
            "rollout.n=4", "rollout.max_tokens=8", "rollout.max_model_len=512", "rollout.kv_cache_gib=0.25",
            "trainer.steps=2", "trainer.micro_batch_size=16", "trainer.eval_every=0", "trainer.ckpt_every=0",
            "trainer.export_hf=false", f"trainer.run_dir={run_dir}", "logging.progress=false",
            "logging.wandb_mode=disabled", f"rollout.verify_sync={verify}",
            # the random-init policy earns no reward (zero advantages, zero gradients): decoupled weight
            # decay is what moves every matrix, by 5 % a step
            "optim.lr=0.05", "optim.weight_decay=1.0"]


def prepare(root: Path) -> dict:
    from megatron_rl.cli.demo import prepare as demo_prepare

    paths, _tok, hf = demo_prepare(root, seed=0)
    cfg = json.loads((Path(hf) / "config.json").read_text())
    cfg["max_position_embeddings"] = 512
    (Path(hf) / "config.json").write_text(json.dumps(cfg))
    return {"train": str(paths["train"]), "hf": str(hf)}


def main(work: str) -> int:
    from megatron_rl.rewards.registry import register_reward
    from megatron_rl.runtime.parallel import init_parallel
    from megatron_rl.trainer.loop.preflight import load_checked
    from megatron_rl.trainer.loop.rl_loop import run
    from megatron_rl.trainer.loop.setup import client_args
    from tests.helpers.sync_faults import FaultyClient

    register_reward("digit_share")(digit_share)

    root = Path(work)
    setup = prepare(root / "setup")
    init_parallel(1, 1, seed=0)
    results, clients = {}, {}

    def pool(cfg, dtype=None):
        a = client_args(cfg)
        kw = {**a["engine_kwargs"], **({"dtype": dtype} if dtype else {})}
        key = (kw["dtype"], kw.get("lora_rank", 0))
        if key not in clients:
            clients[key] = FaultyClient(a["engine"], a["model"], 1, kw, cpus_per_engine=a["cpus_per_engine"],
                                        sync_backend=a["sync_backend"], bucket_bytes=a["bucket_bytes"])
        return clients[key]

    for name, fault in CASES:
        t0, run_dir = time.time(), root / name
        cfg = load_checked(None, overrides(setup, run_dir, "every:1" if name in ("healthy", "lora_adapter") else "first")
                           + (["rollout.logprob_gate=1.0"] if name == "engine_dtype" else [])
                           + (LORA if name == "lora_adapter" else []))
        client = pool(cfg, fault if name == "engine_dtype" else None)
        client.arm(fault if name in ("skip_tensor", "swap_qk") else None, clean=1)   # the start-up push stays sound
        client.set_engine_fault(fault if name == "stale_cache" else None)
        r = results[name] = {}
        try:
            run(cfg, client=client)
            r["exit"] = "ok"
        except SystemExit as e:
            r["exit"] = str(e.code)
        except BaseException as e:  # noqa: BLE001 - reported per case, the next case still runs
            r["exit"] = "error: " + "".join(traceback.format_exception(e))[-3000:]
        client.arm(None)
        client.set_engine_fault(None)
        rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()] \
            if (run_dir / "metrics.jsonl").is_file() else []
        r.update(steps=[x["step"] for x in rows], verify=[{k: v for k, v in x.items() if k.startswith("sync/") or k == "time/verify"} for x in rows],
                 checkpoint_1=(run_dir / "checkpoints" / "step_1" / "COMPLETE").is_file(), secs=round(time.time() - t0, 1))
        if name == "lora_adapter" and (run_dir / "adapter").is_dir():
            from megatron_rl.convert.peft_adapter import read_peft

            _, tensors = read_peft(run_dir / "adapter")
            r["adapter_max_abs_B"] = max(float(t.abs().max()) for k, t in tensors.items() if "lora_B" in k)
        print(f"[verify_sync] {name}: {r}", flush=True)
    for c in clients.values():
        c.shutdown()
    (root / "results.json").write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
