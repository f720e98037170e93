"""Loop stages that produce data: generate (rank 0 drives the engines), reward, dynamic sampling.

All functions run on every rank; only global rank 0 talks to Ray, and the resulting
:class:`Rollouts` is broadcast so every rank holds the same Python object.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any

import torch
import torch.distributed as dist

from megatron_rl.rollout.engine import SamplingParams


@dataclasses.dataclass
class Rollouts:
    """One step's trajectories, sample-major (group g = prompt, n samples each)."""

    rows: list                      # PromptRow per sample
    prompts: list[list[int]]
    responses: list[list[int]]
    rollout_logp: list[list[float]]
    finish: list[str]
    group_ids: torch.Tensor         # [N] long
    texts: list[str] = dataclasses.field(default_factory=list)
    rewards: torch.Tensor | None = None   # [N]
    correct: torch.Tensor | None = None   # [N] bool
    greedy_rewards: torch.Tensor | None = None  # [N] (ReMax)
    stats: dict = dataclasses.field(default_factory=dict)
    process: torch.Tensor | None = None   # [N] PAPO process scores (0 for incorrect)
    weight_version: int | None = None     # optimizer steps in the weights that sampled it (async); None = current

    def __len__(self) -> int:
        return len(self.prompts)

    def select(self, idx: list[int]) -> "Rollouts":
        """Samples ``idx`` (group ids are renumbered densely in order of appearance)."""
        gmap: dict[int, int] = {}
        gids = [gmap.setdefault(int(self.group_ids[i]), len(gmap)) for i in idx]
        pick = lambda xs: [xs[i] for i in idx]  # noqa: E731
        t = lambda x: None if x is None else x[idx]  # noqa: E731
        return Rollouts(pick(self.rows), pick(self.prompts), pick(self.responses), pick(self.rollout_logp),
                        pick(self.finish), torch.tensor(gids, dtype=torch.long), pick(self.texts) if self.texts else [],
                        t(self.rewards), t(self.correct), t(self.greedy_rewards), dict(self.stats), t(self.process),
                        self.weight_version)


def broadcast_object(obj: Any, src: int = 0) -> Any:
    """Rank ``src``'s object on every rank (pickled through torch.distributed). From rank 0 (the driver,
    whose rollouts / evaluation the others wait for) the others first wait in the c10d store
    (``megatron_rl/runtime/driver_wait.py``) and join the collective only once the object is ready, so a long
    rank-0 phase never sits in an NCCL collective against ``parallel.timeout_s`` and its watchdog."""
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return obj
    from megatron_rl.runtime import driver_wait

    waiter = driver_wait.current()
    if src == 0 and waiter is not None:
        waiter.sync()
    box = [obj if dist.get_rank() == src else None]
    dist.broadcast_object_list(box, src=src)
    return box[0]


def sampling_params(cfg, step: int, round_: int = 0, greedy: bool = False, n: int | None = None,
                    eos_id: int | None = None) -> SamplingParams:
    """Per-step sampling settings; seeds derive from (trainer seed, step, round) so a resumed run
    draws exactly the same samples as an uninterrupted one."""
    seed = (cfg.trainer.seed * 1_000_003 + step * 7919 + round_ * 104_729) % (2 ** 31)
    r = cfg.rollout
    return SamplingParams(n=1 if greedy else (n or r.n), temperature=r.temperature, top_p=r.top_p, top_k=r.top_k,
                          min_p=r.min_p, max_tokens=r.max_tokens, seed=seed, greedy=greedy,
                          stop_token_ids=() if eos_id is None else (eos_id,))


def generate(client, dataset, indices: list[int], sampling: SamplingParams, tokenizer) -> Rollouts:
    """Rank 0 only: sample ``sampling.n`` responses for each prompt row in ``indices``."""
    rows = [dataset[i] for i in indices]
    comps = client.generate([list(r.prompt_ids) for r in rows], sampling)
    out_rows, prompts, resps, lps, fin, gids, texts = [], [], [], [], [], [], []
    for c in comps:
        row = rows[c.prompt_index]
        out_rows.append(row)
        prompts.append(list(c.prompt_ids))
        resps.append(list(c.response_ids))
        lps.append(list(c.logprobs))
        fin.append(c.finish_reason)
        gids.append(c.prompt_index)
        texts.append(tokenizer.decode(c.response_ids))
    for i, r in enumerate(resps):
        if not r:
            raise RuntimeError(f"engine returned an empty response for sample {i}")
    return Rollouts(out_rows, prompts, resps, lps, fin, torch.tensor(gids, dtype=torch.long), texts)


def score(rollouts: Rollouts, reward_manager) -> Rollouts:
    """Fill ``rewards`` / ``correct``; a non-finite reward stops the run naming the sample."""
    rb = reward_manager.score(rollouts.rows, rollouts.texts)
    bad = [i for i, v in enumerate(rb.reward.tolist()) if not math.isfinite(v)]
    if bad:
        raise FloatingPointError(f"non-finite reward for sample(s) {bad[:5]}")
    rollouts.rewards, rollouts.correct = rb.reward, rb.correct
    rollouts.stats = {**rollouts.stats, **rb.stats}
    return rollouts


def overlong_shaping(rollouts: Rollouts, hp, max_tokens: int) -> Rollouts:
    """DAPO soft overlong punishment added to the reward (``correct`` stays the binary outcome)."""
    from megatron_rl.algorithms import dapo_overlong_penalty

    lens = torch.tensor([len(r) for r in rollouts.responses])
    pen = dapo_overlong_penalty(lens, max_tokens, hp.overlong_buffer_len, hp.overlong_penalty_factor).float()
    rollouts.rewards = rollouts.rewards + pen
    rollouts.stats = {**rollouts.stats, "reward/overlong_penalty": float(pen.mean())}
    return rollouts


def _cat_opt(a: torch.Tensor | None, b: torch.Tensor | None, name: str) -> torch.Tensor | None:
    """Concatenate an optional per-sample field; present in one part only is a bug, not a silent drop."""
    if a is None and b is None:
        return None
    if a is None or b is None:
        raise ValueError(f"concat: {name} is set in some generation rounds but not others")
    return torch.cat([a, b])


def concat(parts: list[Rollouts]) -> Rollouts:
    """Join rollouts of several generation rounds (group ids offset to stay distinct)."""
    out, off = None, 0
    for p in parts:
        g = p.group_ids + off
        off = int(g.max()) + 1 if len(p) else off
        if out is None:
            out = dataclasses.replace(p, group_ids=g)
            continue
        out = Rollouts(out.rows + p.rows, out.prompts + p.prompts, out.responses + p.responses,
                       out.rollout_logp + p.rollout_logp, out.finish + p.finish, torch.cat([out.group_ids, g]),
                       out.texts + p.texts, torch.cat([out.rewards, p.rewards]), torch.cat([out.correct, p.correct]),
                       _cat_opt(out.greedy_rewards, p.greedy_rewards, "greedy_rewards"), out.stats,
                       _cat_opt(out.process, p.process, "process"), out.weight_version)
    return out
