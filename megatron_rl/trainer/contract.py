"""The types the update pipeline and the data paths exchange, below both (neither imports the other for
them): slime's ``Sample``, verl's ``DataProto``, torchtune's ``rlhf/_types.py`` in this project's shape.

    SeqBatch        pipeline/sequences builds it      a TrainBatch plus each row's response frame
    Sampled         DataPath.sampled                  a path's view of one step's data (every rank)
    Behaviour       pipeline/sequences.behaviour      the engines' log-probs and staleness of Sampled.seqs
    LogProbs        pipeline/logprobs.logprob_passes  old / reference log-probs of Sampled.seqs
    Rows            DataPath.train_rows               the rows the loss trains on
    PathSetup       DataPath.setup                    after the actor exists (every rank)
    CollectContext  DataPath.collect                  driver only: engines, prompts, rewards
    UpdateContext   every update-time hook            the policy, parallel layout, micro-batching
    SampleDump      the contexts' sample dump         ``logging.dump_samples``
    CollectHooks    what the rollout sources call     ``trainer/paths/base.DataPath`` implements it
    UpdateHooks     what the update calls on a path   ``trainer/paths/base.DataPath`` implements it
    PipelineRun     what the update reads of the run  the loop's ``Run`` is one

A path keeps its own configuration (``cfg``, ``hp``, ``tok``, set at construction); what it writes goes
into the containers it is handed (``Sampled``, ``Rows``, the metrics dict) or its own state. The contexts are
built by the composition root (``trainer/loop/setup.py``) and handed to each hook by the pipeline, so a reader
(or a type checker) follows a value from ``rl_step`` into a hook by its type. Imports: torch and the batch
layout (``pipeline/batch.py``, a leaf).
"""
from __future__ import annotations

import dataclasses
import itertools
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

import torch

from megatron_rl.trainer.pipeline.batch import TrainBatch

if TYPE_CHECKING:
    from megatron_rl.config import Config
    from megatron_rl.data.dataset import DeterministicSampler, PromptDataset
    from megatron_rl.data.tokenizer import Tokenizer
    from megatron_rl.rewards.manager import RewardManager
    from megatron_rl.rollout.client import RolloutClient
    from megatron_rl.runtime.parallel import ParallelInfo
    from megatron_rl.trainer.pipeline.packing import TokenBudget
    from megatron_rl.trainer.policy.actor import PolicyActor, ReferencePolicy

#: the loss's keep mask [N, R] among the rows' extras — a rollout-correction mode's rejection times the
#: partial rollouts' per-token staleness mask (``pipeline/rows.staleness_keep``) — so a path's ``train_rows``
#: (subset, re-conditioned sequences) carries it; folded into ``resp_mask`` right after (``update.fold_keep``)
CORRECTION_KEEP = "correction_keep"


@dataclasses.dataclass
class SeqBatch:
    """A TrainBatch plus the response-frame index of each row."""

    batch: TrainBatch
    resp_pos: torch.Tensor    # [N, R] long (clamped to 0 where masked)
    resp_mask: torch.Tensor   # [N, R] float


@dataclasses.dataclass
class Sampled:
    """A path's view of one step's data (``DataPath.sampled``), every rank."""

    ro: Any                   # Rollouts: rewards, groups and engine log-probs of ``seqs``' rows
    seqs: SeqBatch          # the sampled sequences (the old / ref passes run on them)
    hp: Any                   # the method's hparams in force this step
    adv_fields: dict = dataclasses.field(default_factory=dict)   # the path's own advantage inputs, per row
    extras: dict = dataclasses.field(default_factory=dict)       # extra loss inputs, per row
    data: Any = None          # the path's own step data, for its later hooks (SCoRe: both attempts)


@dataclasses.dataclass(frozen=True)
class Behaviour:
    """The engines' side of ``Sampled.seqs``, built once a step (``pipeline/sequences.behaviour``) and read by
    every comparison with the engine (the log-prob gap, the mismatch metrics), the off-policy / rollout-
    correction weights and the staleness mask.

    Attributes:
        logp: ``[N, R]`` the log-prob the engine reported for each response token (its dtype: the response
            mask's; 0 past a response) — the behaviour policy; a data-parallel share's frame is assembled
            over the replicas.
        stale: ``[N]`` long, each sample's staleness in optimizer steps (``algorithms/staleness.py``: its
            oldest token's; 0 for a batch collected synchronously).
        token_stale: ``[N, R]`` long, each response token's staleness (0 past a response), or None when the
            batch has no per-token versions (every token of a sample is as old as the sample).
    """

    logp: torch.Tensor
    stale: torch.Tensor
    token_stale: torch.Tensor | None = None


@dataclasses.dataclass
class LogProbs:
    """Old (proximal) and reference log-probs of ``Sampled.seqs``: target frame ``[N, S-1]`` and
    response frame ``[N, R]``; ``ref*`` None without a reference policy. Their space is the PPO ratio's
    (``algo.ratio_space``: the full softmax at T, or μ, the engines' sampling distribution). ``compare``
    ``[N, R]``: the old log-probs in the space the engines report (``rollout.logprobs``: μ when processed),
    what every comparison with the engine reads; None = ``old``."""

    old_full: torch.Tensor
    ref_full: torch.Tensor | None
    old: torch.Tensor
    ref: torch.Tensor | None
    compare: torch.Tensor | None = None
    compare_full: torch.Tensor | None = None   # ``compare`` in the target frame [N, S-1]

    @property
    def engine_space(self) -> torch.Tensor:
        """``compare`` if set, else ``old``."""
        return self.old if self.compare is None else self.compare

    @property
    def engine_space_full(self) -> torch.Tensor:
        """``compare_full`` if set, else ``old_full``."""
        return self.old_full if self.compare_full is None else self.compare_full


@dataclasses.dataclass
class Rows:
    """The rows the loss trains on: their sequences, per-row loss inputs (``extras``, each ``[n, …]``),
    and what the path keeps per row for update time (``ro``: their rollouts, ``plan``: a per-row plan
    with ``select``, e.g. the teacher prompts)."""

    seqs: SeqBatch
    extras: dict
    ro: Any = None
    plan: Any = None

    def __len__(self) -> int:
        return self.seqs.batch.num_samples

    def select(self, idx: list[int]) -> Rows:
        """Rows ``idx`` in that order (sequence length kept)."""
        t = torch.tensor(idx, dtype=torch.long)
        b = self.seqs.batch
        batch = dataclasses.replace(b, tokens=b.tokens[t], loss_mask=b.loss_mask[t],
                                    extras={k: v[t] for k, v in b.extras.items()})
        return Rows(SeqBatch(batch, self.seqs.resp_pos[t], self.seqs.resp_mask[t]),
                    {k: v[t] for k, v in self.extras.items()},
                    None if self.ro is None else self.ro.select(idx),
                    None if self.plan is None else self.plan.select(idx))


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
    builder (``pipeline/sequences.sequences``) takes the context as it takes the run."""

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


class CollectHooks(Protocol):
    """What the loop's rollout sources (``trainer/loop/rollout_source.py``) call on the run's data path, driver
    side, no collectives. ``trainer/paths/base.DataPath`` implements it (its docstrings say what the base does)."""

    shares_rows: ClassVar[bool]   # each data-parallel replica may receive only its own rows (``pipeline/dispatch.py``)

    def collect(self, ctx: CollectContext, step: int) -> Any: ...

    def shape(self, ro) -> Any: ...

    @classmethod
    def partial_refusal(cls, hp) -> str: ...


class UpdateHooks(Protocol):
    """What the update pipeline (``pipeline/update.py``) calls on the run's data path, in that order; every
    hook collective. ``trainer/paths/base.DataPath`` implements it (its docstrings say what the base does)."""

    importance_weights: ClassVar[bool]          # the pipeline attaches the off-policy weights to the rows
    summed_metrics: ClassVar[tuple[str, ...]]   # per-optimizer-step metric prefixes the step row sums
    last_metrics: ClassVar[tuple[str, ...]]     # ... and those it takes from the last optimizer step

    def sampled(self, ctx: UpdateContext, data, step: int) -> Sampled: ...

    def join_rewards(self, ctx: UpdateContext, s: Sampled, metrics: dict) -> None: ...

    def logged(self, data): ...

    def after_logprobs(self, ctx: UpdateContext, s: Sampled, lp: LogProbs, metrics: dict) -> None: ...

    def train_rows(self, ctx: UpdateContext, s: Sampled, rows: Rows, lp: LogProbs, step: int, metrics: dict) -> Rows: ...

    def mini_batch_inputs(self, ctx: UpdateContext, rows: Rows, hp, loss: str, step: int) -> tuple[dict, dict]: ...

    def after_optimizer_step(self) -> None: ...


class PipelineRun(Protocol):
    """What the update pipeline (``pipeline/update.py`` and its stages) reads of the run it is handed (the
    loop's ``Run`` is one; the pipeline names no loop type, so the loop stays above it)."""

    cfg: Config
    path: UpdateHooks
    actor: PolicyActor
    ref: ReferencePolicy | None
    info: ParallelInfo
    micro: TokenBudget | int

    def update_context(self) -> UpdateContext: ...
