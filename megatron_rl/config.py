"""Typed run configuration: one frozen dataclass per component, loaded from YAML with dotted
command-line overrides (``algo.kind=grpo``, ``trainer.steps=50``, ``algo.bicc_rcc.base=drgrpo``).

The component sections (``model`` ... ``teacher``) are ``config_sections.py``'s, re-exported here;
this module holds the algorithm section, the whole ``Config`` tree, loading and the layout rules.
The algorithm section is ``algo.kind`` plus ``algo.<kind>.*`` (that kind's hyper-parameter
dataclass from ``megatron_rl.algorithms``; defaults are the specs'). ``load_config`` validates every
field (``__post_init__``) and what the config layer decides alone (``validate``). Rules that ask other
components (the method's data path, async rollouts, rewards, the model's sizes) are the setup layer's:
``preflight_rules.check_config`` / ``preflight.load_checked``, run by every entry point that starts a run.
This module imports nothing of the trainer package nor of ``preflight`` (a leaf of the setup layer).
"""
from __future__ import annotations

import dataclasses
import json
import typing
from pathlib import Path
from typing import Any

from megatron_rl.config_foreign import foreign_hint
from megatron_rl.config_parse import Override, build, read_yaml, section_mapping, set_dotted, typed
from megatron_rl.config_features import LoraConfig, MultiTurnConfig
from megatron_rl.config_sections import (
    DataConfig,
    LoggingConfig,
    ModelConfig,
    OptimConfig,
    ParallelConfig,
    PartialConfig,
    RewardConfig,
    RolloutConfig,
    TeacherConfig,
    TrainerConfig,
)
from megatron_rl.plugins import import_plugins, plugin_names
from megatron_rl.runtime.path_kind import check_model_path

__all__ = ["AlgoConfig", "Config", "DataConfig", "LoggingConfig", "LoraConfig", "ModelConfig", "MultiTurnConfig", "OptimConfig", "ParallelConfig",
           "PartialConfig", "RENAMED", "RewardConfig", "RolloutConfig", "TeacherConfig", "TrainerConfig", "check_renamed",
           "from_dict", "load_config", "validate"]

#: keys a release renamed -> their name now. Given in a config file or as an override, one is refused in one
#: line naming the new key; a run directory's saved ``config.yaml`` written with them is read under the new
#: names (``trainer/state/run_config.py``), so such a run still resumes.
RENAMED = {"rollout.partial": "rollout.partial.enable", "rollout.partial_extra_groups": "rollout.partial.extra_groups",
           "rollout.partial_max_staleness": "rollout.partial.max_staleness",
           "rollout.partial_policy": "rollout.partial.policy"}


def check_renamed(tree: dict) -> None:
    """Refuse the keys of :data:`RENAMED` in a config's mapping (overrides set in it) in one line naming each new
    key. An old key that is a section now (``rollout.partial``) is the old key when it holds a value, not a mapping."""
    found = []
    for old, new in RENAMED.items():
        sec, _, key = old.partition(".")
        node = tree.get(sec)
        if not isinstance(node, dict) or key not in node:
            continue
        if new.startswith(old + ".") and (node[key] is None or isinstance(section_mapping(node[key]), dict)):
            continue   # the new section
        found.append(f"{old} was renamed: use {new}")
    if found:
        raise ValueError("; ".join(found))


@dataclasses.dataclass(frozen=True)
class AlgoConfig:
    kind: str = "grpo"
    """Method: a key of ``megatron_rl.algorithms.ALGO_KINDS``."""
    hparams: Any = None
    """The kind's hyper-parameter dataclass (YAML: ``algo.<kind>: {...}``)."""
    off_policy: str = "decoupled"
    """Importance weight of the proximal (trainer-recomputed) against the behaviour (engine) policy,
    truncated at ``tis_cap`` (``algorithms/offpolicy.py``): decoupled = on stale samples only (w = 1
    exactly at staleness 0: the synchronous path is unchanged) | tis = on every sample (the RLCSD
    recipes' rollout correction, docs/methods/self-distillation.md) | none (ablation)."""
    tis_cap: float = 2.0
    """Upper cap C of the truncated IS weight min(π_prox/π_behav, C) (>= 1) of decoupled / tis."""
    correction: Any = None
    """Thresholds of a rollout-correction mode (``algorithms/correction.py``; YAML ``algo.correction:
    {...}``): seq_tis ``cap``; seq_mis / geo_rs / icepop ``upper`` and ``lower`` (null: 1/upper); the
    mode's typed dataclass with its defaults when unset; refused with decoupled / tis / none."""
    ratio_space: str = "full"
    """Distribution of the PPO ratio π_θ/π_old (and of old / current log-probs in the loss): full = the
    temperature-scaled softmax, what verl and the seed recipes' references compute (default) |
    sampling = μ, the distribution the engines sampled from (``rollout.top_p`` / ``top_k`` / ``min_p``
    applied and renormalised, ``algorithms/sampling.py``), NeMo-RL's consistent mode: the ratio is 1 on
    the first mini-batch and the gradient never moves mass onto tokens the sampler drops. The same
    without truncation. Comparisons with the engine (mismatch metrics, guard, corrections) are under μ
    either way (``rollout.logprobs=processed``). ``off_policy=bypass`` with truncation needs sampling."""

    def __post_init__(self):
        from megatron_rl.algorithms import ALGO_KINDS  # lazy: defers torch to the call
        from megatron_rl.algorithms.offpolicy import check_mode  # lazy: defers torch to the call

        if self.kind not in ALGO_KINDS:
            raise ValueError(f"unknown algo.kind {self.kind!r}; valid: {sorted(ALGO_KINDS)}")
        check_mode(self.off_policy, self.tis_cap)
        if self.ratio_space not in ("full", "sampling"):
            raise ValueError(f"algo.ratio_space must be full|sampling, got {self.ratio_space!r}")
        from megatron_rl.algorithms.correction import CORRECTION_MODES  # lazy: defers torch to the call

        mode = CORRECTION_MODES.get(self.off_policy)
        if mode is None and self.correction is not None:
            raise ValueError(f"algo.correction sets the thresholds of {sorted(CORRECTION_MODES)}, not of "
                             f"algo.off_policy={self.off_policy} (its cap is algo.tis_cap)")
        if mode is not None and self.correction is None:
            object.__setattr__(self, "correction", mode.hparams())
        if mode is not None and not isinstance(self.correction, mode.hparams):
            raise ValueError(f"algo.correction: expected {mode.hparams.__name__} for algo.off_policy={self.off_policy}, "
                             f"got {type(self.correction).__name__}")
        if self.hparams is None:
            object.__setattr__(self, "hparams", ALGO_KINDS[self.kind].hparams())


@dataclasses.dataclass(frozen=True)
class Config:
    model: ModelConfig = dataclasses.field(default_factory=ModelConfig)
    parallel: ParallelConfig = dataclasses.field(default_factory=ParallelConfig)
    optim: OptimConfig = dataclasses.field(default_factory=OptimConfig)
    rollout: RolloutConfig = dataclasses.field(default_factory=RolloutConfig)
    data: DataConfig = dataclasses.field(default_factory=DataConfig)
    reward: RewardConfig = dataclasses.field(default_factory=RewardConfig)
    algo: AlgoConfig = dataclasses.field(default_factory=AlgoConfig)
    trainer: TrainerConfig = dataclasses.field(default_factory=TrainerConfig)
    teacher: TeacherConfig = dataclasses.field(default_factory=TeacherConfig)
    logging: LoggingConfig = dataclasses.field(default_factory=LoggingConfig)
    lora: LoraConfig = dataclasses.field(default_factory=LoraConfig)
    multi_turn: MultiTurnConfig = dataclasses.field(default_factory=MultiTurnConfig)
    plugins: tuple[str, ...] = ()
    """Modules imported before the ``algo`` section is read, so the methods they register (kinds,
    advantages, losses, hparams) can be named there: importable module names (``my_pkg.my_method``,
    found on ``PYTHONPATH``), not file paths (``megatron_rl/plugins.py``)."""

    def to_dict(self) -> dict:
        d = {"plugins": list(self.plugins)} if self.plugins else {}   # absent when unset (earlier dumps' shape)
        d.update({f.name: dataclasses.asdict(getattr(self, f.name)) for f in dataclasses.fields(self)
                  if f.name not in ("algo", "plugins", "lora", "multi_turn")})
        if self.lora != LoraConfig():   # absent when unset (earlier dumps' shape)
            d["lora"] = {**dataclasses.asdict(self.lora), "target_modules": list(self.lora.target_modules)}
        if self.multi_turn != MultiTurnConfig():   # absent when unset (earlier dumps' shape)
            d["multi_turn"] = dataclasses.asdict(self.multi_turn)
        d["algo"] = {"kind": self.algo.kind, self.algo.kind: dataclasses.asdict(self.algo.hparams)}
        # the off-policy and ratio knobs only when set (a synchronous run's dump keeps its earlier shape); the
        # correction's thresholds as a mapping, absent for a mode without any (bypass)
        d["algo"].update({k: getattr(self.algo, k) for k in _ALGO_TOP if k not in ("kind", "correction")
                          and getattr(self.algo, k) != _ALGO_DEFAULTS[k]})
        if self.algo.correction is not None and dataclasses.asdict(self.algo.correction):
            d["algo"]["correction"] = dataclasses.asdict(self.algo.correction)
        return d

    def dump(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.to_dict(), indent=1, default=str))



def _build_algo(sec: dict) -> AlgoConfig:
    from megatron_rl.algorithms import ALGO_KINDS  # lazy: defers torch to the call

    kind = sec.get("kind", "grpo")
    if not isinstance(kind, str):
        raise ValueError(f"algo.kind: expected a string, got {kind!r}; valid: {sorted(ALGO_KINDS)}")  # noqa: TRY004
    kind = str(kind)
    if kind not in ALGO_KINDS:
        raise ValueError(f"unknown algo.kind {kind!r}; valid: {sorted(ALGO_KINDS)}")
    extra = sorted(set(sec) - set(_ALGO_TOP) - set(ALGO_KINDS))
    if extra:
        raise ValueError(f"algo: unknown key(s) {extra}; valid: {sorted(_ALGO_TOP)} + [<kind name>]")
    hp = build(ALGO_KINDS[kind].hparams, dict(sec.get(kind) or {}), f"algo.{kind}")
    hints = typing.get_type_hints(AlgoConfig)
    top = {k: typed(f"algo.{k}", sec[k], hints[k]) for k in _ALGO_TOP if k not in ("kind", "correction") and k in sec}
    if sec.get("correction") is not None:
        from megatron_rl.algorithms.correction import CORRECTION_MODES  # lazy: defers torch to the call

        mode = CORRECTION_MODES.get(top.get("off_policy", _ALGO_DEFAULTS["off_policy"]))
        if mode is None:
            raise ValueError(f"algo.correction sets the thresholds of {sorted(CORRECTION_MODES)}, not of "
                             f"algo.off_policy={top.get('off_policy', _ALGO_DEFAULTS['off_policy'])} (its cap is algo.tis_cap)")
        top["correction"] = build(mode.hparams, dict(sec["correction"]) if isinstance(sec["correction"], dict)
                                  else sec["correction"], "algo.correction")
    return AlgoConfig(kind, hp, **top)


#: the algo section's own keys (besides ``algo.<kind>: {...}``)
_ALGO_TOP = ("kind", "off_policy", "tis_cap", "correction", "ratio_space")
_ALGO_DEFAULTS = {f.name: f.default for f in dataclasses.fields(AlgoConfig)}


def from_dict(tree: dict) -> Config:
    """Build and validate a :class:`Config` (fields + ``validate``; the cross-component rules are
    ``preflight_rules.check_config``'s, see the module docstring). A ``_meta`` section (what
    ``run_dir/config.yaml`` records beside the config: version, commit) is ignored. The ``plugins``
    modules are imported first (``megatron_rl/plugins.py``): they may register methods."""
    tree = {k: v for k, v in tree.items() if k != "_meta"}
    check_renamed(tree)
    sections = {f.name: f.type for f in dataclasses.fields(Config) if f.name != "plugins"}
    unknown = sorted(set(tree) - set(sections) - {"plugins"})
    if unknown:
        raise ValueError(f"config: unknown section(s) {unknown}; valid: {sorted(sections)} + plugins"
                         + foreign_hint(unknown, tree))

    raw = tree.get("plugins")
    kw = {"plugins": plugin_names(typed("plugins", raw, Any) if isinstance(raw, Override) else raw)}
    import_plugins(kw["plugins"])       # before algo: the methods they register are validated below
    hints = typing.get_type_hints(Config)
    for name in sections:
        sec = tree.get(name) or {}
        kw[name] = _build_algo(sec) if name == "algo" else build(hints[name], sec, name)
    cfg = Config(**kw)
    validate(cfg)
    return cfg


def load_config(path: str | Path | None, overrides: list[str] | tuple[str, ...] = ()) -> Config:
    """YAML file (or None for defaults) + ``a.b=c`` overrides -> validated :class:`Config`."""
    tree = {}
    if path is not None:
        p = Path(path)
        if not p.is_file():
            raise FileNotFoundError(f"config file {p} not found")
        tree = read_yaml(p)
    for o in overrides:
        if "=" not in o:
            raise ValueError(f"override {o!r} must look like section.key=value")
        k, v = o.split("=", 1)
        set_dotted(tree, k.strip(), Override(v))
    return from_dict(tree)


def check_adapter_push(r) -> None:
    """``lora.push=adapter`` against the ``rollout`` section ``r``: the adapters are served by vLLM's LoRA
    support (``rollout.engine=vllm``); the asynchronous, partial and colocated paths push full weights
    (in-flight updates, a sleep that discards the base) and are not built for adapters: one line each."""
    if r.max_staleness > 0 or r.partial.enable:
        raise ValueError("lora.push=adapter refused with asynchronous or partial rollouts (rollout.max_staleness > 0, "
                         "rollout.partial.enable): not built for adapters; use lora.push=merged")
    if r.engine != "vllm":
        raise ValueError(f"lora.push=adapter needs rollout.engine=vllm (vLLM's LoRA support serves the adapters), "
                         f"got {r.engine}; use lora.push=merged")
    if r.placement == "colocated":
        raise ValueError("lora.push=adapter refused with rollout.placement=colocated (the engines' sleep discards the "
                         "base weights, which an adapter push does not resend); use lora.push=merged")


def validate(cfg: Config, world_size: int | None = None) -> None:
    """Layout rules the config decides with the model's ``config.json`` (clear messages, at start-up):
    the batch over ``world_size`` ranks, the model directory, TP/PP against the model's sizes. The
    method's data path is asked in the setup layer (``preflight_rules.check_config``), not here."""
    n = cfg.data.prompts_per_step * cfg.rollout.n
    mbp = cfg.trainer.mini_batch_prompts
    if mbp and (mbp > cfg.data.prompts_per_step or cfg.data.prompts_per_step % mbp):
        raise ValueError(f"trainer.mini_batch_prompts={mbp} must divide data.prompts_per_step={cfg.data.prompts_per_step} "
                         "(the batch is cut into equal mini-batches; 0 = the whole batch)")
    if world_size is not None:
        mp = cfg.parallel.tp * cfg.parallel.pp * cfg.parallel.cp
        if world_size % mp:
            p = cfg.parallel
            prod = "tp*pp*cp" if p.cp > 1 else "tp*pp"
            fix = (f"launch {mp} processes (torchrun --nproc-per-node {mp}) or set parallel.tp=1 parallel.pp=1"
                   if world_size < mp else f"launch a multiple of {mp} processes, or set parallel.tp x parallel.pp to "
                   f"a divisor of {world_size}")
            raise ValueError(f"parallel.tp={p.tp} x parallel.pp={p.pp}" + (f" x parallel.cp={p.cp}" if p.cp > 1 else "")
                             + f" = {mp} processes per model replica, but the world size {world_size} is not divisible "
                             f"by {prod}={mp}: {fix}")
        dp, mbs = world_size // mp, cfg.trainer.rows_per_micro_batch
        if not cfg.trainer.max_tokens_per_micro_batch and n % (dp * mbs):   # packed micro-batches take any count
            raise ValueError(f"batch of {n} sequences (prompts_per_step x rollout.n) is not divisible by "
                             f"dp={dp} x micro_batch_size={mbs}")
        m = cfg.trainer.mini_batch_prompts * cfg.rollout.n
        if not cfg.trainer.max_tokens_per_micro_batch and m and m % (dp * mbs):
            raise ValueError(f"mini-batch of {m} sequences (trainer.mini_batch_prompts x rollout.n) is not divisible by "
                             f"dp={dp} x micro_batch_size={mbs}")
    budget, longest, q = cfg.trainer.max_tokens_per_micro_batch, cfg.rollout.max_model_len, 8 * cfg.parallel.tp
    if budget and budget < -(-longest // q) * q:     # packed rows are rounded up to a multiple of 8 x TP
        raise ValueError(f"trainer.max_tokens_per_micro_batch={budget} is below rollout.max_model_len={longest} (rounded up "
                         f"to {-(-longest // q) * q}, a multiple of 8 x parallel.tp), the longest sequence a pass can hold "
                         "(teacher and conditioned prompts included); raise the budget")
    if cfg.lora.enable and cfg.lora.push == "adapter":
        check_adapter_push(cfg.rollout)
    if cfg.model.hf_path:     # the layout against the model's config.json: preflight_rules.check_config (models/)
        check_model_path(cfg.model.hf_path)
