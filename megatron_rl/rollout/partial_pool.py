"""Partial rollouts on the driver: more groups in flight than a step consumes, pushes while they run.

:class:`PartialPool` drives a client whose engine takes groups in flight (``RolloutClient.submit`` /
``harvest``, an engine with ``CAPS.inflight_updates``: ``vllm-async``). It keeps
``groups_per_step + extra`` groups submitted; a step takes the first ``groups_per_step`` groups
that FINISHED (lowest prompt index first among those, so the choice does not depend on harvest
timing beyond which groups are done) and leaves the others running into the next step — across the
weight push that ends the step, which the engine takes in flight (``rollout/vllm_async_engine.py``).
A long response no longer holds a step: it finishes in a later one, its tokens labelled with the
versions that sampled them.

Staleness, per token: a token sampled by weight version v and trained at a step whose trainer holds
version V has staleness s_t = V − v_t. With bound k (:class:`StalenessPolicy`), the two policies of
the peers (one switch):

* ``drop``: a response with max_t s_t > k is dropped with its whole group and counted (the group's
  prompt is consumed; slime/verl's partial-rollout rejection);
* ``mask``: tokens with s_t > k leave the loss mask — since versions never decrease along a response
  they are its old-version prefix (slime/vime's off-policy prefix mask); a group stays.

Either way the tokens that stay carry their behaviour log-prob and version, so the off-policy
correction weighs each token against the weights that sampled it (decoupled PPO with per-token
behaviour log-probs, ``algorithms/offpolicy.py``).

Exact resume (:meth:`PartialPool.state_dict`): the pool records the next fresh prompt index and the
indices submitted but not yet consumed (in flight or finished and waiting). Their tokens are NOT
saved: on resume they are REGENERATED from the start, deterministically seeded by their prompt
index, under the checkpoint's weights — the KV and the partial tokens of a killed engine are gone
with it and the old versions that sampled them exist nowhere. So across a kill no prompt index is
lost and none is consumed twice (``tests/e2e/test_partial_train.py`` counts them across a SIGKILL of
the training loop mid-step); the regenerated responses differ from the ones the kill interrupted
(other weights), which is the price of not storing a model copy per version in flight.
"""
from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable

import torch

from ..algorithms.staleness import StalenessPolicy, staleness, staleness_mask

@dataclasses.dataclass
class Group:
    """A consumed group: its prompt index, the completions and each one's loss mask (``[T]`` bool)."""

    index: int
    completions: list
    masks: list


class PartialPool:
    """Driver-side partial rollouts over ``client`` (module docstring).

    ``request(i)`` -> (prompt ids, :class:`~megatron_rl.rollout.engine.SamplingParams`) of prompt index
    ``i`` (its seed must derive from ``i``: regeneration on resume is deterministic). ``resume``: a
    :meth:`state_dict`."""

    def __init__(self, client, request: Callable[[int], tuple], *, groups_per_step: int, extra: int,
                 policy: StalenessPolicy, resume: dict | None = None):
        if groups_per_step < 1 or extra < 0:
            raise ValueError(f"groups_per_step must be >= 1 and extra >= 0, got {groups_per_step}, {extra}")
        self.client, self.request, self.policy = client, request, policy
        self.per_step, self.extra = groups_per_step, extra
        self.next_index = int(resume["next_index"]) if resume else 0
        self._ready: dict[int, list] = {}
        self._flight: set[int] = set()
        self.dropped = 0
        self.last_dropped: list[int] = []   # prompt indices the last take dropped (consumed, not trained)
        for i in (resume or {}).get("pending", []):   # regenerated from the start (module docstring)
            self._submit(int(i))
        self.top_up()

    def _submit(self, i: int) -> None:
        prompt, sampling = self.request(i)
        self.client.submit(i, prompt, sampling)
        self._flight.add(i)

    def top_up(self) -> None:
        """Submit fresh prompt indices until ``groups_per_step + extra`` groups are in flight or waiting."""
        while len(self._flight) + len(self._ready) < self.per_step + self.extra:
            self._submit(self.next_index)
            self.next_index += 1

    def take(self, trainer_version: int, wait_s: float = 3600.0) -> tuple[list[Group], dict]:
        """The step's ``groups_per_step`` groups (those the staleness policy keeps; a dropped group's
        place is refilled from the pool) and its metrics; the pool is topped up again."""
        self.last_dropped = []
        deadline, kept, m = time.monotonic() + wait_s, [], {"dropped": 0, "tokens": 0, "masked": 0, "spanning": 0,
                                                             "stale_sum": 0, "stale_max": 0, "responses": 0}
        while len(kept) < self.per_step:
            self._harvest(self.per_step - len(kept), deadline)
            for i in sorted(self._ready)[:self.per_step - len(kept)]:
                g = self._judge(i, self._ready.pop(i), trainer_version, m)
                if g is not None:
                    kept.append(g)
            self.top_up()
        self.dropped += m["dropped"]
        return sorted(kept, key=lambda g: g.index), _metrics(m)

    def _harvest(self, need: int, deadline: float) -> None:
        while len(self._ready) < need:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"partial rollouts: {len(self._ready)} of {need} groups finished in time")
            for i, comps in self.client.harvest(wait_s=min(left, 60.0), min_groups=need - len(self._ready)):
                self._flight.discard(i)
                self._ready[i] = comps

    def _judge(self, i: int, comps: list, trainer_version: int, m: dict) -> Group | None:
        masks = []
        for c in comps:
            v = torch.tensor(c.versions, dtype=torch.int64)
            if len(v) != len(c.response_ids):
                raise ValueError(f"prompt {i}: the engine reported {len(v)} token versions for {len(c.response_ids)} tokens")
            mask = staleness_mask(v, trainer_version, self.policy)
            if mask is None:
                m["dropped"] += 1
                self.last_dropped.append(i)
                return None
            masks.append(mask)
        for c, mask in zip(comps, masks):
            s = staleness(trainer_version, torch.tensor(c.versions, dtype=torch.int64))[mask]
            m["tokens"] += int(mask.sum())
            m["masked"] += int((~mask).sum())
            m["stale_sum"] += int(s.sum())
            m["stale_max"] = max(m["stale_max"], int(s.max()) if len(s) else 0)
            m["spanning"] += len(set(c.versions)) > 1
            m["responses"] += 1
        return Group(i, comps, masks)

    def state_dict(self) -> dict:
        """What a checkpoint records: the next fresh index and the indices submitted but not consumed."""
        return {"next_index": self.next_index, "pending": sorted(self._flight | set(self._ready))}


def _metrics(m: dict) -> dict:
    """Per-token staleness mean / max over the trained tokens, the fraction of responses spanning a
    push, groups dropped and tokens masked by the staleness policy."""
    return {"partial/staleness_mean": m["stale_sum"] / max(1, m["tokens"]), "partial/staleness_max": float(m["stale_max"]),
            "partial/span_frac": m["spanning"] / max(1, m["responses"]), "partial/dropped_groups": float(m["dropped"]),
            "partial/masked_token_frac": m["masked"] / max(1, m["tokens"] + m["masked"])}
