"""Adding a method = one registration plus its config dataclass (docs/contributing.md, "Adding a method"), loaded from
outside the package: a toy REINFORCE with a group-mean baseline that ``megatron-rl train`` imports
through the config's ``plugins:`` key (this directory on ``PYTHONPATH``, as a user's own module)::

    PYTHONPATH=tests/unit/workers megatron-rl train --config ... plugins=[toy_method] algo.kind=toy

Each call of its advantage or loss rewrites ``$TOY_METHOD_RESULT`` (when set) with
{advantage_calls, loss_calls, hparams}: the counters of the training process, read by
``tests/unit/trainer/test_paths.py`` after the run.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

import torch

from megatron_rl import algorithms as A
from megatron_rl.algorithms.losses import LossOutput, masked_mean

CALLS = {"advantage": 0, "loss": 0}


def _count(what: str, hp) -> None:
    CALLS[what] += 1
    out = os.environ.get("TOY_METHOD_RESULT")
    if out:
        Path(out).write_text(json.dumps({**{f"{k}_calls": v for k, v in CALLS.items()}, "hparams": hp.to_dict()}))


@dataclass(frozen=True)
class ToyHParams(A.PPOHParams):
    """The method's config dataclass: ``algo.toy.*`` (PPOHParams brings the shared knobs)."""

    baseline_scale: float = 1.0      #: A = r − baseline_scale · mean_group(r)


@A.register_advantage("toy_mean_baseline")
def toy_advantage(x: A.AlgoInputs, hp: ToyHParams) -> torch.Tensor:
    _count("advantage", hp)
    g = x.group_ids
    mean = torch.zeros(int(g.max()) + 1, dtype=x.rewards.dtype).index_add_(0, g, x.rewards)
    mean = mean / torch.bincount(g).to(x.rewards.dtype)
    return x.rewards - hp.baseline_scale * mean[g]


@A.register_policy_loss("toy", needs=("logp",))
def toy_loss(x: A.AlgoInputs, adv: torch.Tensor, hp: ToyHParams) -> LossOutput:
    """REINFORCE: −A·logp per token (0 off the mask); metric ``toy_adv_mean`` is logged as ``toy/adv_mean``."""
    _count("loss", hp)
    a = adv.detach().to(x.logp.dtype)[:, None].expand_as(x.logp)
    loss = torch.where(x.mask.bool(), -a * x.logp, torch.zeros_like(x.logp))
    return LossOutput(loss, {"toy_adv_mean": masked_mean(a, x.mask).detach()})


A.register_algo_kind("toy", advantage="toy_mean_baseline", loss="toy", hparams=ToyHParams, path="plain")

