"""Supervised warm start (SFT on prompt -> answer pairs) until held-out greedy accuracy reaches a
threshold. RL cannot learn from a policy whose groups are all wrong (every advantage is zero), and a
fixed step count is unreliable (notes/cpu_learnability.md), so the stop rule is adaptive."""
from __future__ import annotations

import dataclasses
import logging
import random


from megatron_rl.trainer.pipeline.batch import make_batch
from megatron_rl.trainer.pipeline.objective import partial_aggregate

log = logging.getLogger("megatron_rl.warmstart")


@dataclasses.dataclass(frozen=True)
class WarmStartResult:
    steps: int
    val_acc: float
    reached: bool


def nll_loss_fn(logp, entropy, mb):
    """Token-mean negative log-likelihood of the answer tokens."""
    s, d = partial_aggregate(-logp, mb.loss_mask, "token-mean")
    return s, d, {"sft/nll": (s.detach(), d)}


def warm_start(actor, pairs: list[tuple[list[int], list[int]]], evaluate, *, threshold: float = 0.3,
               batch_size: int = 64, check_every: int = 5, max_steps: int = 400, seed: int = 0,
               pad_id: int = 0, progress=None) -> WarmStartResult:
    """Train on ``(prompt_ids, answer_ids)`` pairs; every ``check_every`` steps call ``evaluate()``
    (greedy held-out accuracy) and stop once it is >= ``threshold``."""
    rng = random.Random(seed)
    acc, step = 0.0, 0
    while step < max_steps:
        idx = [rng.randrange(len(pairs)) for _ in range(batch_size)]
        batch = make_batch([pairs[i][0] for i in idx], [pairs[i][1] for i in idx], pad_id)
        res = actor.train_step(batch, nll_loss_fn, batch_size)
        step += 1
        if step % check_every == 0:
            acc = evaluate()
            if progress is not None:
                progress(step, res.loss, acc)
            if acc >= threshold:
                return WarmStartResult(step, acc, True)
    return WarmStartResult(step, acc, False)
