"""Adding a method = one registration plus its config dataclass (README "Adding a method"), run end to
end: a toy REINFORCE with a group-mean baseline trains 2 real steps (HF engine through Ray, Megatron
actor, gloo) in this process, where it was registered — with ``rollout.placement=colocated``, so the
engine sleeps (level 2: weights freed) after each generate and wakes around each push.

    python tests/unit/workers/toy_method.py ASSETS_DIR RUN_DIR

Writes ``RUN_DIR/toy_result.json`` {advantage_calls, loss_calls, hparams}.
"""
from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path

import torch

from megatron_rl import algorithms as A
from megatron_rl.algorithms.losses import LossOutput, masked_mean

CALLS = {"advantage": 0, "loss": 0}


@dataclass(frozen=True)
class ToyHParams(A.PPOHParams):
    """The method's config dataclass: ``algo.toy.*`` (PPOHParams brings the shared knobs)."""

    baseline_scale: float = 1.0      #: A = r − baseline_scale · mean_group(r)


@A.register_advantage("toy_mean_baseline")
def toy_advantage(x: A.AlgoInputs, hp: ToyHParams) -> torch.Tensor:
    CALLS["advantage"] += 1
    g = x.group_ids
    mean = torch.zeros(int(g.max()) + 1, dtype=x.rewards.dtype).index_add_(0, g, x.rewards)
    mean = mean / torch.bincount(g).to(x.rewards.dtype)
    return x.rewards - hp.baseline_scale * mean[g]


@A.register_policy_loss("toy", needs=("logp",))
def toy_loss(x: A.AlgoInputs, adv: torch.Tensor, hp: ToyHParams) -> LossOutput:
    """REINFORCE: −A·logp per token (0 off the mask); metric ``toy_adv_mean`` is logged as ``toy/adv_mean``."""
    CALLS["loss"] += 1
    a = adv.detach().to(x.logp.dtype)[:, None].expand_as(x.logp)
    loss = torch.where(x.mask.bool(), -a * x.logp, torch.zeros_like(x.logp))
    return LossOutput(loss, {"toy_adv_mean": masked_mean(a, x.mask).detach()})


A.register_algo_kind("toy", advantage="toy_mean_baseline", loss="toy", hparams=ToyHParams, path="plain")


def main(assets: str, run_dir: str) -> int:
    from megatron_rl.demo import prepare
    from megatron_rl.preflight import load_checked
    from megatron_rl.trainer.loop import run

    paths, _, hf = prepare(Path(assets), seed=0)
    cfg = load_checked("examples/configs/tiny_cpu_grpo.yaml", [
        f"model.hf_path={hf}", f"data.train={paths['train']}", "data.val=", f"trainer.run_dir={run_dir}",
        "trainer.steps=2", "trainer.ckpt_every=0", "trainer.export_hf=false", "data.prompts_per_step=4",
        "rollout.n=4", "rollout.engine=hf", "trainer.micro_batch_size=8", "logging.progress=false",
        "logging.wandb_mode=disabled", "algo.kind=toy", "algo.toy.baseline_scale=0.5",
        "rollout.placement=colocated", "trainer.offload=all"])   # the loop's colocated turn-taking on CPU (the HF engine sleeps for real)
    run(cfg)
    Path(run_dir, "toy_result.json").write_text(json.dumps({**{f"{k}_calls": v for k, v in CALLS.items()},
                                                            "hparams": cfg.algo.hparams.to_dict()}))
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
