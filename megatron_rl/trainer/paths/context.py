"""What a data path's hooks may see of the run: one small frozen context per kind of hook, built by
the composition root (``trainer/loop/setup.py``) and the update pipeline (``trainer/pipeline/update.py``), so a
reader (or a type checker) follows a value from ``rl_step`` into a hook by its type.

    PathSetup        DataPath.setup            after the actor exists (every rank)
    CollectContext   DataPath.collect          driver only: engines, prompts, rewards
    UpdateContext    every update-time hook    the policy, parallel layout, micro-batching

A path keeps its own configuration (``cfg``, ``hp``, ``tok``, set at construction); what it writes
goes into the pipeline's containers it is handed (``Sampled``, ``Rows``, the metrics dict) or its
own state.
"""
from __future__ import annotations

import dataclasses
import itertools
import json
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from megatron_rl.config import Config
    from megatron_rl.data.dataset import DeterministicSampler, PromptDataset
    from megatron_rl.data.tokenizer import Tokenizer
    from megatron_rl.rewards.manager import RewardManager
    from megatron_rl.rollout.ray_bridge import RolloutClient
    from megatron_rl.runtime.parallel import ParallelInfo
    from megatron_rl.trainer.pipeline.packing import TokenBudget
    from megatron_rl.trainer.policy.actor import PolicyActor


@dataclasses.dataclass(frozen=True)
class SampleDump:
    """Rank 0, ``logging.dump_samples`` = ``n`` > 0: appends the first ``n`` id sequences of a named set
    with their raw decoding (special tokens kept) to ``run_dir/samples.jsonl``; a no-op otherwise."""

    n: int
    is_driver: bool
    tok: Tokenizer
    run_dir: str

    def __call__(self, step: int, name: str, seqs) -> None:
        if not self.n or not self.is_driver:
            return
        raw = getattr(getattr(self.tok, "tok", None), "decode", None)
        with open(Path(self.run_dir) / "samples.jsonl", "a") as f:
            for ids in itertools.islice(seqs, self.n):
                ids = [int(i) for i in ids]
                text = raw(ids, skip_special_tokens=False) if raw is not None else self.tok.decode(ids)
                f.write(json.dumps({"step": step, "name": name, "ids": ids, "text": text}) + "\n")


@dataclasses.dataclass(frozen=True)
class PathSetup:
    """``DataPath.setup``: the policy (a teacher's shadow weights copy its parameters) and whether this
    rank is the Ray driver (which alone talks to engines and graders)."""

    actor: PolicyActor
    is_driver: bool


@dataclasses.dataclass(frozen=True)
class CollectContext:
    """``DataPath.collect`` (driver only, no collectives): the engine pool, the prompts and their
    sampler, the reward manager, the sample dump."""

    client: RolloutClient
    train_set: PromptDataset
    sampler: DeterministicSampler
    rewards: RewardManager
    samples: SampleDump


@dataclasses.dataclass(frozen=True)
class UpdateContext:
    """Every update-time hook (collective): the policy (extra forwards under its current weights), the
    parallel layout, how policy passes cut micro-batches (``micro``: a ``TokenBudget`` or padded rows)
    and the sample dump; ``cfg`` and ``tok`` (the path's own) so that the pipeline's one sequence
    builder (``pipeline/update_stage.sequences``) takes the context as it takes the run."""

    actor: PolicyActor
    info: ParallelInfo
    micro: TokenBudget | int
    samples: SampleDump
    cfg: Config
    tok: Tokenizer

    def seq_len(self, prompts, responses) -> int:
        """Padded sequence length of a batch (multiple of 8 and of TP for sequence parallel)."""
        return self.padded_len(max(len(p) + len(r) for p, r in zip(prompts, responses)))

    def padded_len(self, longest: int) -> int:
        """``longest`` rounded up to a multiple of 8 x TP (:meth:`seq_len`)."""
        q = 8 * max(1, self.info.tp)
        return -(-longest // q) * q
