"""A driver of partial rollouts, killed and resumed by ``tests/e2e/test_partial_pool.py``.

``partial_driver.py MODEL_DIR RUN_DIR STEPS [--resume]``: one ``vllm-async`` engine; a
:class:`~megatron_rl.rollout.partial.PartialPool` of 4 groups a step + 4 extra (every eighth prompt
answers 8x longer); per step: take the groups (trainer version = step − 1), a weight push in flight
(version = step), then the checkpoint ``RUN_DIR/ckpt.json`` written atomically: the step, every
prompt index consumed so far, the pool's state. ``--resume`` starts from that file. Prints
``STEP s`` after each checkpoint."""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path


def request(i: int):
    from megatron_rl.rollout.engine import SamplingParams

    prompt = [1] + [3 + (i * 7 + k) % 60 for k in range(6)]
    return prompt, SamplingParams(n=2, max_tokens=128 if i % 8 == 7 else 16, seed=1000 + i)


def main(model_dir: str, run_dir: str, steps: int, resume: bool) -> None:
    from safetensors.torch import load_file

    from megatron_rl.rollout.partial import PartialPool, StalenessPolicy
    from megatron_rl.rollout.ray_bridge import RolloutClient

    ckpt = Path(run_dir) / "ckpt.json"
    state = json.loads(ckpt.read_text()) if resume else {"step": 0, "consumed": [], "dropped": [], "pool": None}
    client = RolloutClient("vllm-async", model_dir, num_engines=1, sync_backend="gloo",
                           engine_kwargs={"max_model_len": 256, "kv_cache_gib": 0.125})
    weights = load_file(str(Path(model_dir) / "model.safetensors"))
    client.update_weights(weights.items())   # the checkpoint's weights (the same tensors every step here)
    pool = PartialPool(client, request, groups_per_step=4, extra=4, policy=StalenessPolicy(bound=2, mode="drop"),
                       resume=state["pool"])
    for step in range(state["step"] + 1, steps + 1):
        groups, m = pool.take(trainer_version=int(client.stats()["rollout/weight_version"]))
        state["consumed"] += [g.index for g in groups]
        state["dropped"] += pool.last_dropped
        client.update_weights(weights.items())
        state.update(step=step, pool=pool.state_dict())
        tmp = ckpt.with_suffix(".tmp")
        tmp.write_text(json.dumps(state))
        os.replace(tmp, ckpt)
        print(f"STEP {step} {json.dumps(m)}", flush=True)
    client.shutdown()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]), "--resume" in sys.argv)
