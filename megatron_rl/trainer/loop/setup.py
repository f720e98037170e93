"""Composition root of a run: builds every component from the config once (configs stop here),
plus the stages that need the whole run: weight sync, greedy evaluation, checkpoint/resume."""
from __future__ import annotations

import dataclasses
import logging
import os
from pathlib import Path
from typing import TYPE_CHECKING

from megatron_rl import algorithms as A
from megatron_rl.agent.rows import AgentRunner
from megatron_rl.algorithms.sampling import SamplingSpec
from megatron_rl.config import validate
from megatron_rl.data.dataset import DeterministicSampler
from megatron_rl.data.tokenizer import load_tokenizer
from megatron_rl.eval.agent import run_agent_eval, write_records
from megatron_rl.eval.metrics import summarize
from megatron_rl.eval.training import table_metrics
from megatron_rl.models.lora import LoraSpec
from megatron_rl.models.provider import load_hf_config, recompute_overrides
from megatron_rl.rewards.factory import build_rewards
from megatron_rl.rollout.client import RolloutClient
from megatron_rl.rollout.placement import engine_eager, engine_gpus, engine_memory_utilization
from megatron_rl.rollout.registry import caps
from megatron_rl.runtime import determinism
from megatron_rl.runtime.console import attach_run_log
from megatron_rl.runtime.device import has_cuda
from megatron_rl.runtime.logging import RunLogger, truncate_metrics
from megatron_rl.runtime.parallel import init_parallel
from megatron_rl.runtime.usage import begin_run
from megatron_rl.trainer.loop.async_source import engine_env, local_plan, pin_local_trainer, restore_state, resume_refusal
from megatron_rl.trainer.loop.colocate import Colocation, build_colocation
from megatron_rl.trainer.loop.preflight import preflight
from megatron_rl.trainer.loop.preflight_inputs import prompt_datasets
from megatron_rl.rollout.rollouts import eval_sampling, generate, score
from megatron_rl.runtime.broadcast import broadcast_object
from megatron_rl.trainer.loop.sync_stage import startup_gate, sync
from megatron_rl.trainer.paths import build_path
from megatron_rl.agent.run_config import template_kwargs
from megatron_rl.trainer.contract import CollectContext, PathSetup, SampleDump, UpdateContext
from megatron_rl.trainer.pipeline.packing import micro_of
from megatron_rl.trainer.pipeline.update import OPTIMIZER_STEPS_FILE
from megatron_rl.trainer.policy.actor import AdapterOffReference, PolicyActor, ReferencePolicy
from megatron_rl.trainer.policy.optim import OptimSpec
from megatron_rl.trainer.state.run_config import save_run_config
from megatron_rl.trainer.state.run_dir import archive_run, config_inputs

if TYPE_CHECKING:   # annotations only: the components are imported where they are built (setup_run)
    from megatron_rl.agent.rows import AgentRunner
    from megatron_rl.config import Config
    from megatron_rl.data.dataset import DeterministicSampler, PromptDataset
    from megatron_rl.data.tokenizer import Tokenizer
    from megatron_rl.rewards.manager import RewardManager
    from megatron_rl.rollout.client import RolloutClient
    from megatron_rl.runtime.logging import RunLogger
    from megatron_rl.runtime.parallel import ParallelInfo
    from megatron_rl.trainer.loop.async_source import AsyncRollouts
    from megatron_rl.trainer.loop.rollout_source import SyncRollouts
    from megatron_rl.trainer.paths import DataPath
    from megatron_rl.trainer.pipeline.packing import TokenBudget
    from megatron_rl.trainer.policy.actor import PolicyActor, ReferencePolicy

log = logging.getLogger("megatron_rl.setup")


@dataclasses.dataclass
class RunState:
    """What changes while a run goes on (the rest of :class:`Run` is fixed once built)."""

    step: int = 0                      # the last finished step (the loop's; a resume's)
    last_checkpoint: str | None = None
    verified: int = 0                  # weight pushes verified in this process (rollout.verify_sync)
    gate: dict | None = None           # start-up gate numbers (sync_stage.startup_gate)
    source: SyncRollouts | AsyncRollouts | None = None   # opened by the loop (trainer/loop/rollout_source.py)
    async_pending: list = dataclasses.field(default_factory=list)   # finished batches restored from a checkpoint
    partial_resume: dict | None = None   # rollout.partial.enable: the pool's indices from a checkpoint (partial_source.py)


@dataclasses.dataclass(frozen=True)
class Run:
    """Every component of a run, built once by :func:`setup_run`; the method's own state lives in
    ``path`` (``trainer/paths/``), what changes from step to step in ``state``. A data path never sees
    the whole run: its hooks get the contexts of ``trainer/contract.py``."""

    cfg: Config
    info: ParallelInfo
    tok: Tokenizer
    train_set: PromptDataset
    val_set: PromptDataset | None
    sampler: DeterministicSampler
    actor: PolicyActor
    ref: ReferencePolicy | AdapterOffReference | None     # when the method's loss needs reference log-probs
    client: RolloutClient | None    # the engine pool: the Ray driver (global rank 0) only
    rewards: RewardManager
    logger: RunLogger
    path: DataPath                  # the data path of cfg.algo.kind (trainer/paths/)
    colo: Colocation                # rollout.placement turn-taking (trainer/loop/colocate.py)
    samples: SampleDump             # logging.dump_samples
    #: how every policy pass cuts its micro-batches: a ``TokenBudget`` (packed,
    #: ``trainer.max_tokens_per_micro_batch``) or the padded rows per micro-batch (``packing.micro_of``)
    micro: TokenBudget | int
    state: RunState
    #: ``multi_turn.enable`` with a held-out set, on the driver: the evaluation's agent loops (``eval/agent.py``)
    eval_agent: AgentRunner | None = None

    def seq_len(self, prompts, responses) -> int:
        """Padded sequence length of a batch (multiple of 8 and of TP for sequence parallel)."""
        return self.update_context().seq_len(prompts, responses)

    def update_context(self) -> UpdateContext:
        """What the data path's update-time hooks see (``trainer/pipeline/update.py``)."""
        return UpdateContext(self.actor, self.info, self.micro, self.samples, self.cfg, self.tok)

    def collect_context(self) -> CollectContext:
        """What the data path's ``collect`` sees (driver; ``trainer/loop/rollout_source.py``)."""
        return CollectContext(self.client, self.train_set, self.sampler, self.rewards, self.samples)

    def checkpoint(self) -> None:
        from megatron_rl.trainer.state.checkpoint import save_checkpoint  # lazy: defers numpy to the call

        st = self.state
        extra = {"step": st.step, "sampler": self.sampler.state_dict() if self.sampler else None,
                 "teacher": self.path.state_dict() or None}   # the path's extras (teacher counters)
        src = st.source.state(st.step) if st.source is not None else None
        if src is not None:
            # async, driver: the producer runs ahead: the finished batches not trained on yet and the
            # sampler position that regenerates the one in flight (resume design: trainer/loop/async_source.py)
            extra["sampler"], extra["async"] = src["sampler"], src
        m = self.cfg.model
        with self.colo.trainer_loaded():   # colocated: the optimizer state is parked between steps
            path = save_checkpoint(self.cfg.trainer.run_dir, st.step, self.actor, extra,
                                   keep_last=self.cfg.trainer.keep_last, teacher=self.path.shadow_weights(),
                                   hf_dir=m.hf_path, tokenizer_dir=m.tokenizer_path or m.hf_path)
        st.last_checkpoint = str(path)

    def close(self, own_client: bool = True) -> None:
        self.path.close()
        if own_client and self.client is not None:
            self.client.shutdown()


def grad_clip(cfg) -> float:
    """The gradient-norm clip in force: ``optim.clip_grad`` when set, else the method's recipe value."""
    return float(cfg.optim.clip_grad if cfg.optim.clip_grad is not None else cfg.algo.hparams.grad_clip)


def _optim_spec(cfg):
    o = cfg.optim
    decay = cfg.trainer.steps if o.decay_style != "constant" else None
    return OptimSpec(lr=o.lr, min_lr=o.min_lr, warmup_steps=o.warmup_steps, decay_steps=decay,
                     decay_style=o.decay_style, weight_decay=o.weight_decay, betas=(o.beta1, o.beta2),
                     clip_grad=grad_clip(cfg),
                     use_distributed_optimizer=o.use_distributed_optimizer, bf16=cfg.model.bf16)


def client_args(cfg, trainer_world: int = 1, cuda: bool | None = None) -> dict:
    """The rollout pool's arguments (what ``build_client`` passes to ``RolloutClient``; ``cuda``: this
    machine's, None = ask it — the auto engine keys depend on it, ``rollout/placement.py``)."""
    r = cfg.rollout
    cuda = has_cuda() if cuda is None else cuda
    kw = {"max_model_len": r.max_model_len, "seed": cfg.trainer.seed, "dtype": "bfloat16" if cfg.model.bf16 else "float32",
          "logprobs": r.logprobs}
    options = {"kv_cache_gib": r.kv_cache_gib,
               "enable_sleep_mode": r.placement == "colocated",   # vLLM: CUDA only, refused on CPU at start-up
               "gpu_memory_utilization": engine_memory_utilization(r.gpu_memory_utilization, r.placement),
               "enforce_eager": engine_eager(r.enforce_eager, cuda), "tensor_parallel_size": r.tensor_parallel_size}
    kw.update((k, v) for k, v in options.items() if k in caps(r.engine).options)   # those the engine class takes
    if cfg.lora.enable and cfg.lora.push == "adapter":   # engines serve the pushed adapters (vLLM LoRA, config.py)
        kw["lora_rank"] = int(cfg.lora.rank)
    return {"engine": r.engine, "model": cfg.model.hf_path, "num_engines": r.num_engines, "engine_kwargs": kw,
            "cpus_per_engine": r.cpus_per_engine, "ray_address": r.ray_address, "sync_backend": r.sync_backend,
            "bucket_bytes": r.bucket_mb << 20, "trainer_world": trainer_world, "placement": r.placement}


def build_client(cfg, trainer_world: int = 1, client_cls=RolloutClient):
    """The engine pool; with ``rollout.max_staleness`` > 0 its actors get their own CPU cores,
    disjoint from the trainer's, on CPU only (``async_source.local_plan``; the trainer is pinned in ``setup_run``).
    ``client_cls``: a :class:`RolloutClient` subclass naming another engine implementation (its
    ``engine_impl``; a test workload's engine) for the same configuration."""
    a = client_args(cfg, trainer_world)
    tp = cfg.rollout.tensor_parallel_size
    gpus = None   # on GPU: TP per engine, those of rollout.placement (the trainer's, or the ones after them)
    if has_cuda():
        gpus = engine_gpus(a["placement"], int(os.environ.get("LOCAL_WORLD_SIZE", "1")), a["num_engines"], tp)
    env = None
    if cfg.rollout.max_staleness > 0 or cfg.rollout.partial.enable:
        env = engine_env(local_plan())
    if cfg.trainer.deterministic:
        env = {**(env or {}), **determinism.engine_env(has_cuda())}
    return client_cls(a["engine"], a["model"], a["num_engines"], a["engine_kwargs"],
                         cpus_per_engine=a["cpus_per_engine"], ray_address=a["ray_address"],
                         sync_backend=a["sync_backend"], bucket_bytes=a["bucket_bytes"], trainer_world=a["trainer_world"],
                         actor_env=env, placement=a["placement"], engine_gpus=gpus, gpus_per_engine=float(tp) if gpus else 0.0)


def setup_run(cfg, resume: str | None = None, client=None, overwrite: bool = False,
              allow_config_change: bool = False, keep: tuple = ()) -> Run:
    """init_parallel -> tokenizer, data, reward manager, actor (+ reference), engines, logger: the
    :class:`Run`, built once. ``resume``: ``"auto"`` (newest complete checkpoint, if any), a checkpoint
    path, or None; ``overwrite``: a fresh run in a used ``run_dir`` archives the earlier one (else it is
    refused), all but the new run's inputs and ``keep`` (``trainer/state/run_dir.archive_run``);
    ``allow_config_change``: resume despite a changed method / group size / model (``trainer/state/run_config.py``)."""
    backend = preflight(cfg, resume, overwrite, allow_config_change)   # every user error before anything starts

    begin_run()                                       # from here an error is a runtime error (exit 1)
    _prepare_run_dir(cfg, overwrite, keep)
    if cfg.trainer.deterministic:                     # before CUDA / NCCL start (runtime/determinism.py)
        determinism.set_environment(has_cuda())
    info = init_parallel(cfg.parallel.tp, cfg.parallel.pp, seed=cfg.trainer.seed,
                         sequence_parallel=cfg.parallel.sequence_parallel, timeout_s=cfg.parallel.timeout_s,
                         vpp=cfg.parallel.vpp, cp=cfg.parallel.cp)
    validate(cfg, world_size=info.world)
    if cfg.trainer.deterministic:
        determinism.apply(cfg.trainer.seed)
    if not cfg.model.hf_path:
        raise ValueError("model.hf_path is required (HF model dir with config.json + safetensors)")
    tok = load_tokenizer(cfg.model.tokenizer_path or cfg.model.hf_path, template_kwargs(cfg))
    path = build_path(cfg, tok)     # template / layout errors surface here, before any model is built
    train, val = prompt_datasets(cfg, tok)   # read and checked by preflight (check_prompts): the same objects
    sampler = DeterministicSampler(len(train), cfg.data.prompts_per_step, cfg.data.seed)
    actor, ref = _build_policy(cfg, info, backend)
    rewards = build_rewards(cfg, info.is_driver)
    path.setup(PathSetup(actor, info.is_driver))
    state = _resume(cfg, actor, path, sampler, resume, info.is_driver)
    colo = build_colocation(cfg, actor)   # colocated: the trainer offloads before the engines start beside
    colo.start()                          # it and stays so through the first push (trainer/loop/colocate.py)
    client = _start_engines(cfg, info, client)
    if colo.active and info.is_driver:
        colo.engines = client
    samples = SampleDump(cfg.logging.dump_samples, info.is_driver, tok, cfg.trainer.run_dir)
    run = Run(cfg, info, tok, train, val, sampler, actor, ref, client, rewards, _open_logger(cfg, info, state), path,
              colo, samples, micro_of(cfg, info.tp), state, _eval_agent(cfg, tok, info.is_driver and val is not None))
    sync_weights(run)  # engines start from the HF dir; after a resume they must get the checkpoint's weights
    state.gate = startup_gate(run)  # stops the run if trainer and engines disagree after the first sync
    return run


def _eval_agent(cfg, tok, wanted: bool):
    """The held-out evaluation's agent loops (``multi_turn.enable``; ``wanted``: a held-out set, on the driver):
    the whole-response budget is the evaluation's ``max_tokens`` (``eval_sampling``)."""
    if not (wanted and cfg.multi_turn.enable):
        return None
    return AgentRunner(cfg, tok, eval_sampling(cfg, 0, tok.eos_id).max_tokens)   # its own tool set: tool/* counts training calls


def _prepare_run_dir(cfg, overwrite: bool, keep: tuple) -> None:
    """Rank 0: archive an earlier run (``overwrite``), save this start's config, drop a crashed save's
    leftovers; every rank: its log file in the run dir."""
    rank = int(os.environ.get("RANK", "0"))           # torchrun's; process groups start later
    if overwrite and rank == 0:
        archive_run(cfg.trainer.run_dir, keep=[*config_inputs(cfg, cfg.trainer.run_dir), *keep])
    if rank == 0:
        save_run_config(cfg)   # run_dir/config.yaml (or config.<n>.yaml): which configuration this start ran
    attach_run_log(cfg.trainer.run_dir, rank)   # INFO (patches, Megatron's dumps, stages) -> run_dir/train.log
    if rank == 0:
        from megatron_rl.trainer.state.checkpoint import remove_stale_tmp  # lazy: defers numpy to the call

        remove_stale_tmp(cfg.trainer.run_dir)    # .tmp-step_* of a save cut short by a crash or kill: one line


def _build_policy(cfg, info, backend: str) -> tuple[PolicyActor, ReferencePolicy | AdapterOffReference | None]:
    """The actor from ``model.hf_path``, and the frozen reference when the method's loss needs
    reference log-probs (with ``lora.enable``: the actor with its adapters off, ``AdapterOffReference``)."""
    hf_cfg = load_hf_config(cfg.model.hf_path)
    recompute = {**recompute_overrides(cfg.model.recompute, cfg.model.recompute_method, cfg.model.recompute_num_layers),
                 **determinism.megatron_overrides(cfg.trainer.deterministic)}
    actor = PolicyActor(hf_cfg, info, _optim_spec(cfg), temperature=cfg.rollout.temperature,
                        sequence_parallel=info.sequence_parallel, backend=backend, fp8=cfg.model.fp8,
                        offload=cfg.trainer.offload,
                        recompute=recompute, lora=_lora_spec(cfg), lora_seed=cfg.lora.init_seed)
    actor.load_hf(cfg.model.hf_path)
    r = cfg.rollout
    mu = SamplingSpec(r.temperature, r.top_k, r.top_p, r.min_p)   # what the engines sample from
    actor.set_sampling(mu, train=cfg.algo.ratio_space == "sampling")
    ref = None
    if "ref_logp" in A.kind_required_inputs(cfg.algo.kind, cfg.algo.hparams) and cfg.lora.enable:
        ref = AdapterOffReference(actor)      # the base = the actor with its adapters off: no second model
    elif "ref_logp" in A.kind_required_inputs(cfg.algo.kind, cfg.algo.hparams):
        ref = ReferencePolicy(hf_cfg, cfg.rollout.temperature, info.sequence_parallel, cfg.model.bf16, parallel_info=info,
                              backend=backend, fp8=cfg.model.fp8)
        ref.load_hf(cfg.model.hf_path)
        ref.set_sampling(mu)
    return actor, ref


def _lora_spec(cfg) -> LoraSpec | None:
    """The adapters ``lora`` asks for (``models/lora.py``); None when ``lora.enable`` is off. ``lora.dropout`` has
    one accepted value (0), checked at config load; ``lora.push`` is the sync's (``sync_stage.sync``)."""
    if not cfg.lora.enable:
        return None
    return LoraSpec(int(cfg.lora.rank), float(cfg.lora.alpha), tuple(cfg.lora.target_modules))


def _start_engines(cfg, info, client):
    """The engine pool on the driver (``client`` when one was handed in; None on the other ranks,
    which wait out its start-up in the store); asynchronous rollouts: the trainer pinned to its cores."""
    if info.is_driver and client is None:
        client = build_client(cfg, trainer_world=info.world)
    broadcast_object(None)   # the others wait out the engines' start-up in the store (driver_wait), not in NCCL
    if cfg.rollout.max_staleness > 0 or cfg.rollout.partial.enable:
        # engines and trainer on disjoint cores (not with CUDA: async_source.core_split). After Ray started, so its
        # daemons (and the workers they fork) are not confined to the trainer's cores; the engine actors pin themselves.
        pin_local_trainer(local_plan(), int(os.environ.get("LOCAL_RANK", "0")))
    return client


def _open_logger(cfg, info, state: RunState) -> RunLogger:
    """The metrics logger (wandb offline, progress bar); on the driver the per-optimizer-step rows
    (``trainer/pipeline/update.py``) after the step resumed from are dropped."""
    logger = RunLogger(cfg.trainer.run_dir, cfg.to_dict(), wandb_mode=cfg.logging.wandb_mode,
                       project=cfg.logging.project, run_name=cfg.logging.run_name, total_steps=cfg.trainer.steps,
                       resume_step=state.step if state.last_checkpoint is not None else None,
                       progress=cfg.logging.progress, tensorboard=cfg.logging.tensorboard)
    if info.is_driver:
        truncate_metrics(Path(cfg.trainer.run_dir) / OPTIMIZER_STEPS_FILE, state.step)
    return logger


def _resume(cfg, actor, path, sampler, resume: str | None, is_driver: bool) -> RunState:
    """``resume``: ``"auto"`` (newest complete checkpoint, if any), a path, or None: model, optimizer,
    sampler and the data path's state (teacher weights and counters) as saved; the run's state."""
    from megatron_rl.trainer.state.checkpoint import find_latest, load_checkpoint  # lazy: defers numpy to the call

    state = RunState()
    ckpt = (find_latest(cfg.trainer.run_dir) if resume == "auto" else Path(resume)) if resume else None
    if ckpt is None:
        return state
    loaded = load_checkpoint(ckpt, actor, teacher=path.shadow_weights())
    if loaded.extra_state.get("teacher"):
        path.load_state_dict(loaded.extra_state["teacher"])
    state.step, state.last_checkpoint = loaded.step, str(ckpt)
    if loaded.extra_state.get("sampler"):
        sampler.load_state_dict(loaded.extra_state["sampler"])

    why = resume_refusal(loaded.extra_state.get("async"), cfg.rollout.max_staleness, cfg.rollout.partial.enable)
    if why:   # preflight_resume.check_resume_state refused it already, for the runs that start through setup_run
        raise ValueError(f"checkpoint {ckpt}: {why}")
    state.async_pending, _ = restore_state(loaded.extra_state.get("async"), cfg.rollout.max_staleness)
    state.partial_resume = (loaded.extra_state.get("async") or {}).get("partial")
    log.info("resumed from %s at step %d", ckpt, state.step)
    if is_driver:   # a console line too (INFO goes to train.log only): users and job logs must see it
        print(f"[megatron-rl] resumed from {ckpt} at step {state.step}", flush=True)
    return state


def sync_weights(run: Run) -> None:
    """Collective: stream HF-named weights from the TP/PP shards to every engine (``sync_stage.sync``)."""
    sync(run)


def evaluate(run: Run, step: int) -> dict:
    """Held-out accuracy of the current engine weights (rank 0 runs it; broadcast): ``eval/acc`` =
    mean@n over ``trainer.eval_n`` samples per prompt, and with n > 1 ``eval/mean@n``, ``eval/pass@n``; with
    ``trainer.eval_benchmarks`` the papers' table instead (``eval/training.py``: ``eval/<bench>/<metric>``,
    ``eval/avg`` = ``eval/acc``). ``multi_turn.enable``: the rows run through the agent loops (``eval/agent.py``),
    with ``eval/tool_call_rate``, ``eval/tool_success_rate``, ``eval/tool_calls_mean``, ``eval/turns_mean`` and the
    trajectories in ``run_dir/eval/step_<step>.jsonl``."""
    out = None
    if run.info.is_driver:
        n = min(run.cfg.trainer.eval_prompts, len(run.val_set))
        sp = eval_sampling(run.cfg, step, run.tok.eos_id)
        blocks = getattr(run.val_set, "blocks", None)   # trainer.eval_benchmarks: the papers' table
        n = len(run.val_set) if blocks else n
        extra = {}
        if run.eval_agent is not None:
            ro, records, m = run_agent_eval(run.eval_agent, run.client, [run.val_set[i] for i in range(n)], sp, run.tok)
            write_records(Path(run.cfg.trainer.run_dir) / "eval" / f"step_{step}.jsonl", records)
            extra = {f"eval/{k}": v for k, v in m.items()}
        else:
            ro = generate(run.client, run.val_set, list(range(n)), sp, run.tok)
        corr = score(ro, run.rewards).correct.view(n, sp.n).tolist()
        if blocks:
            out = table_metrics(run.cfg, run.val_set, corr, sp.n, step)
        else:
            s = summarize([(run.val_set[i].data_source, corr[i]) for i in range(n)], (sp.n,))
            out = {"eval/acc": s[f"mean@{sp.n}"]}
            if sp.n > 1:
                out.update({f"eval/mean@{sp.n}": s[f"mean@{sp.n}"], f"eval/pass@{sp.n}": s[f"pass@{sp.n}"]})
        out.update(extra)
    return broadcast_object(out)
