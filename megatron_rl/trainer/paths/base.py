"""The data-path registry: the :class:`DataPath` hooks every family implements, ``register_path``, the
lookups (``get_path``, ``path_class``, ``build_path``); the package imports every built-in path so each
registers itself."""
from __future__ import annotations

import abc
from typing import TYPE_CHECKING, Any, ClassVar

from megatron_rl.algorithms import algo_kind, kind_required_inputs
from megatron_rl.algorithms.hparams import PPOHParams
from megatron_rl.algorithms.inputs import unknown_inputs
from megatron_rl.trainer.pipeline.sequences import rollout_sequences

from megatron_rl.trainer.contract import CollectContext, PathSetup, Sampled, UpdateContext

if TYPE_CHECKING:
    from megatron_rl.trainer.contract import LogProbs, Rows

BASE_INPUTS = frozenset({"rewards", "group_ids", "mask", "logp", "old_logp", "ref_logp", "correct"})
_PATHS: dict = {}


class DataPath(abc.ABC):
    """One method family's data path; owns its state (see the module docstring)."""

    name: ClassVar[str] = ""
    hparams: ClassVar[type] = PPOHParams      #: the hparams class a method on this path derives from
    #: the registered inputs (``algorithms.register_input``) this path fills: a path with an input of its
    #: own registers it (name, shape, dtype) beside the class and lists it here
    provides: ClassVar[frozenset] = BASE_INPUTS
    uses_grader: ClassVar[bool] = False       #: needs ``reward.grader_url`` (checked at start-up)
    #: why the path cannot run with ``rollout.max_staleness`` > 0 ("" = it can; ``trainer/loop/async_source.py``)
    async_unsupported: ClassVar[str] = ""
    #: applies the in-reward KL ``algo.<kind>.kl_reward_coef`` (``rows.kl_in_reward``); refused otherwise
    kl_in_reward: ClassVar[bool] = False
    #: what the path puts into a prompt beyond the task's own ("" = nothing): ``group_answers`` (other
    #: answers of the group after BOS, BiCC), ``hint`` (a reference answer after BOS, teacher prompts),
    #: ``corrector_turn`` (x1 ++ y1 ++ instruction, SCoRe); a policy that never read such prompts (the
    #: demo's tiny one) is warm-started on them (``demo.warm_start_phase``)
    prompt_context: ClassVar[str] = ""
    #: the pipeline attaches the decoupled-PPO / TIS weights of the batch (``algo.off_policy``); a path
    #: whose loss has no importance weight says False
    importance_weights: ClassVar[bool] = True
    #: metric key prefixes of the path's per-optimizer-step metrics that the step's row sums (counts),
    #: and keys it takes from the last optimizer step (counters) — the rest are means (``update.mean_metrics``)
    summed_metrics: ClassVar[tuple[str, ...]] = ()
    last_metrics: ClassVar[tuple[str, ...]] = ()
    #: with DP > 1 each replica receives the token rows of only its own passes (``trainer/pipeline/dispatch.py``):
    #: a path says True when its data is one ``Rollouts`` and no hook reads the tokens of rows other than
    #: those it trains (False: every rank receives the whole batch)
    shares_rows: ClassVar[bool] = False
    #: why the path cannot take multi-turn rollouts (``multi_turn.enable``, docs/multi-turn.md; "" = it can): the
    #: agent loop replaces the plain path's sampling rounds only
    multi_turn_unsupported: ClassVar[str] = "its collection is not the plain sampling rounds the agent loop replaces"

    def __init__(self, cfg, tok):
        self.cfg, self.hp, self.tok = cfg, cfg.algo.hparams, tok

    @classmethod
    def provides_for(cls, hp) -> set:
        """Inputs filled for a method with hyper-parameters ``hp``."""
        return set(cls.provides)

    @classmethod
    def partial_refusal(cls, hp) -> str:
        """Why ``rollout.partial`` (one sampled group per prompt from the pool, ``trainer/loop/partial_source.py``)
        cannot feed this path under ``hp`` ("" = it can); a path that takes it says so by overriding this."""
        return cls.async_unsupported or "its collection is not one sampled group per prompt"

    @classmethod
    def resident_weights(cls, actor, hp):
        """The copies of the weights this path keeps on the device beside the policy's under ``hp`` (None here;
        the teacher family's shadow in snapshot / EMA mode): what :meth:`setup` builds, for the dry run
        (``trainer/dryrun/build.py``), which measures it without running the path."""
        return None

    @classmethod
    def row_fields(cls, cfg) -> list[tuple[tuple[str, ...], str]]:
        """``extra_info`` fields every training row must carry under ``cfg``: ``[(keys (any one of them
        suffices), what reads it)]``; checked against ``data.train`` at start-up (``preflight``). None here."""
        return []

    @classmethod
    def validate(cls, cfg) -> None:
        """Start-up rules of the path for ``cfg`` (hparams class, inputs the method needs: each one
        the method's advantage or loss declared must be one this path provides)."""
        kind, hp = cfg.algo.kind, cfg.algo.hparams
        if not isinstance(hp, cls.hparams):   # a config error like the others (ValueError at load)
            raise ValueError(  # noqa: TRY004
                f"algo.kind={kind!r}: the {cls.name!r} data path needs hparams deriving from "
                f"{cls.hparams.__name__}, got {type(hp).__name__}")
        if hp.kl_reward_coef > 0 and not cls.kl_in_reward:
            raise ValueError(f"algo.{kind}.kl_reward_coef={hp.kl_reward_coef}: the {cls.name!r} data path has no "
                             "in-reward KL (the sampling paths do); set it to 0")
        have = cls.provides_for(hp)
        if unknown_inputs(have):
            raise ValueError(f"data path {cls.name!r} provides unregistered input(s) {unknown_inputs(have)}: "
                             "register each with algorithms.register_input(name, shape, dtype)")
        missing = sorted(kind_required_inputs(kind, hp) - have)
        if missing:
            raise ValueError(f"algo.kind={kind!r} needs input(s) {missing} that its data path {cls.name!r} "
                             f"does not produce (provides {sorted(have)})")

    def setup(self, ctx: PathSetup) -> None:
        """After the actor / reference exist (every rank): the path's own services and state."""

    @abc.abstractmethod
    def collect(self, ctx: CollectContext, step: int) -> Any:
        """Driver only: this step's data (picklable; the loop broadcasts it). No collectives."""

    def shape(self, ro):
        """Driver, during collection: the path's treatment of a scored batch of sampled groups (one group per
        prompt) before it trains — the hook the partial rollouts' source calls on what its pool finished
        (``trainer/loop/partial_source.py``). Unchanged here; the plain path applies DAPO's overlong shaping."""
        return ro

    def sampled(self, ctx: UpdateContext, data, step: int) -> Sampled:
        """Every rank: ``data`` as the pipeline's :class:`~megatron_rl.trainer.contract.Sampled`: the
        sampled sequences (``prompt ++ response`` here) and the hparams in force."""
        ro = data
        seqs = rollout_sequences(ctx, ro)
        ctx.samples(step, "policy", (ro.prompt(i) + ro.response(i) for i in range(len(ro))))
        return Sampled(ro, seqs, self.hp)

    def join_rewards(self, ctx: UpdateContext, s: Sampled, metrics: dict) -> None:
        """Hook (collective): right after the old / ref log-prob passes, before anything reads a reward:
        rewards scored beside the passes land in ``s.ro`` (``rollout/pending_rewards.py``); none here."""

    def after_logprobs(self, ctx: UpdateContext, s: Sampled, lp: LogProbs, metrics: dict) -> None:
        """Hook (collective): after the old / ref log-prob passes, before the advantages."""

    def train_rows(self, ctx: UpdateContext, s: Sampled, rows: Rows, lp: LogProbs, step: int, metrics: dict) -> Rows:
        """Hook (collective): the rows the loss trains on (``trainer/contract.Rows``); all sampled rows here."""
        return rows

    def mini_batch_inputs(self, ctx: UpdateContext, rows: Rows, hp, loss: str, step: int) -> tuple[dict, dict]:
        """Hook (collective), per mini-batch before its optimizer step: extra loss inputs of ``rows``
        computed under the weights of that moment (the teacher family's support passes) and their
        metrics; ``({}, {})`` here."""
        return {}, {}

    def after_optimizer_step(self) -> None:
        """Hook: after each successful optimizer step of the update (teacher schedules)."""

    def logged(self, data):
        """The rollouts whose rewards / lengths the step reports."""
        return data

    def trained(self, data):
        """The rollouts whose tokens the step trained on (throughput)."""
        return data

    def driver_stats(self, data) -> dict:
        """Rank 0, after the update: extra metrics of the path's services."""
        return {}

    def shadow_weights(self):
        """Teacher weights to checkpoint beside the model (``TeacherWeights``); None here."""

    def state_dict(self) -> dict:
        """Checkpoint extras of the path (saved under ``extra_state["teacher"]``; {} = none)."""
        return {}

    def load_state_dict(self, state: dict) -> None:
        """Restore :meth:`state_dict` on resume (nothing by default)."""

    def close(self) -> None:
        """Release the path's services (threads, connections) at the end of the run."""


def register_path(name: str):
    """Class decorator: register a :class:`DataPath` subclass under ``name`` (strict)."""

    def deco(cls):
        if name in _PATHS:
            raise ValueError(f"data path {name!r} is already registered (by {_PATHS[name].__qualname__})")
        if not (isinstance(cls, type) and issubclass(cls, DataPath)):
            raise TypeError(f"data path {name!r}: {cls!r} is not a DataPath subclass")
        missing = sorted(getattr(cls, "__abstractmethods__", ()))
        if missing:
            raise TypeError(f"data path {name!r} ({cls.__qualname__}) is incomplete: implement {missing}")
        cls.name = name
        _PATHS[name] = cls
        return cls
    return deco


def path_names() -> list:
    return sorted(_PATHS)


def get_path(name: str) -> type:
    """The registered path class ``name`` (ValueError listing the valid names otherwise)."""
    if name not in _PATHS:
        raise ValueError(f"unknown data path {name!r}; valid: {sorted(_PATHS)}")
    return _PATHS[name]


def path_class(kind: str) -> type:
    """The path class the method ``kind`` declared (ValueError naming both when it is unknown)."""
    path = algo_kind(kind).path
    if path not in _PATHS:
        raise ValueError(f"algo.kind={kind!r} declares data path {path!r}, which is not registered; "
                         f"valid: {sorted(_PATHS)}")
    return _PATHS[path]


def build_path(cfg, tok) -> DataPath:
    """Start-up: the validated path object of ``cfg.algo.kind``."""
    cls = path_class(cfg.algo.kind)
    cls.validate(cfg)
    return cls(cfg, tok)

