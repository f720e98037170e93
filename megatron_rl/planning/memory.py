"""The memory model of ``megatron-rl plan``: per-GPU bytes of a model x TP x PP x DP x micro-batch x seq-len.

Pure arithmetic on an :class:`~megatron_rl.planning.arch.ArchSpec` and :class:`PlanInputs`: it imports
neither torch nor megatron. The flags named below are the ``megatron-rl plan`` options of each input
(``cli/plan.py``).

Notation: h hidden, L layers, a query heads, k KV heads, d head dim, q = a·d, kv = k·d, f FFN size,
V vocab padded to a multiple of 128·t (Megatron's ``make_vocab_size_divisible_by``), t TP, p PP,
r DP, s seq-len, e bytes per activation element (2 bf16/fp16, 4 fp32), σ = t with sequence
parallelism else 1, T the token slots of one micro-batch per DP rank: b·s for padded micro-batches
of b sequences (``trainer.micro_batch_size``), or the token budget B (``trainer.max_tokens_per_micro_batch``)
for packed ones: rows x row length <= B, whatever the sequence lengths (``trainer/pipeline/packing.py``).

Parameters per GPU (the heaviest pipeline stage)::

    layer  = (h·(q + 2kv) + q·h + 3·h·f + qkv_bias·(q + 2kv)) / t + 2h + qk_norm·2d
    stage0 = V·h/t + (L/p)·layer                       (embedding)
    stageN = (L/p)·layer + h + [untied or p > 1]·V·h/t (final norm, output layer / tied copy)

Training state per parameter (Megatron distributed-optimizer table; ``--no-dist-opt`` sets r' = 1)::

    bf16/fp16:  2 (param) + 4 (fp32 main grad) + 12/r' (fp32 master, Adam m, v)
    fp32:       4 (param) + 4 (grad)           +  8/r' (Adam m, v)

LoRA (``lora.enable``, ``--lora-rank`` ρ, ``--lora-targets``; ``models/lora.py``, docs/lora.md): the base is
frozen, so only the adapters have a main grad and optimizer state; the weights are the base's plus the
adapters'. Adapter parameters per layer and GPU, sharded as the base weight: a column-parallel projection
(q, k, v, gate, up: d_in -> d_out) splits B by its rows and replicates A, a row-parallel one (o, down) splits
A by its columns and replicates B::

    column  ρ·d_in + d_out·ρ/t         row  ρ·d_in/t + d_out·ρ
    (q: h -> q, k / v: h -> kv, o: q -> h, gate / up: h -> f, down: f -> h)
    adapters = (L/p)·Σ_targets ·   →   weights = (n + adapters)·e, grads = adapters·g, optimizer = adapters·o/r'

with g, o the per-parameter bytes above. Each adapter keeps its A x (ρ elements per token, model precision) for
B's gradient: activations add e·ρ·|targets| per token and layer. No reference copy: the KL reference is the
policy with its adapters off (``AdapterOffReference``).

Activations (rough; after Korthikanti et al. 2022, "Reducing Activation Recomputation in Large
Transformer Models", eq. 1-2, generalised to GQA + SwiGLU and no dropout), bytes per token per layer::

    norms   e·2h/σ                       (inputs of the two RMSNorms)
    attn    e·(h/σ + (q + 2kv)/t + q/t)  (QKV input, Q/K/V, out-proj input)
            + e·(1 + n_qk)·(q + kv)/t    (the RoPE'd q and k attention keeps beside the QKV output, which its v
                                         view keeps alive; n_qk = 1 with Qwen3's q/k norms, whose inputs are
                                         kept too)
            + c·a·R/t                    (the S x S scores, ``--attention``; see below)
    mlp     e·(h/σ + 3f/t)               (fc1 input, gate+up outputs, SwiGLU output), with the fused
                                         SwiGLU (``bias_activation_fusion``, on with CUDA); the unfused
                                         one also keeps silu(gate) and its input: e·(h/σ + 5f/t)

With 1F1B the first stage keeps p micro-batches of L/p layers in flight, i.e. L layers' worth
(Korthikanti §4.2.3): activations = T·L·per_layer; interleaved 1F1B with v virtual stages
(``parallel.vpp``) keeps 1 + (p − 1)/(p·v) times that (Megatron-LM's theoretical memory estimate). The stage
with the output layer also keeps the final norm's and the output layer's inputs, T·2e·h/σ, and a later stage
of a pipeline its received input, T·e·h/σ. Full recompute (Megatron's ``recompute_method``): uniform with k
layers per unit keeps each unit's input (ceil(n/k)·e·h/σ per token); block with k keeps only the inputs of
the first k layers and everything of the other n − k. While a unit is recomputed its activations and the
gradients through them are held, 2k layers' worth: a first stage holds them beside the inputs; on a stage
with the output layer the logits are freed before any unit is recomputed, so there the ``logits`` term is
max(logits, unit) (the dry run's "from the output layer on"), and the forward's one-layer attention working
set (below) counts only by what it exceeds that. Selective recompute (Megatron's default module: core attention) drops the score
term only, which flash attention never stores. The last stage also holds the logits::

    logits = T·(V/t)·(e + 4·[e < 4] + 8) + (V/t)·h·e

(the shard, its fp32 copy, ``z - max`` and its ``exp``, alive at once in ``vocab_parallel_logprobs``, and the
output layer's weight gradient in model precision before it is added to ``main_grad``; none with LoRA, whose
base is frozen). Buffers held across
steps (``buffers``): sequence parallelism's all-gather buffer, T·h·e, on the last of several stages
2·T·e·h/σ, and with local attention Megatron's persistent score buffer, e·T·a·R/t. These terms were measured by the dry run (``megatron-rl train --dry-run``, docs/dry-run.md) on the
example configs; the plan is within 10% of it per component there.

The sampling distribution μ (``algorithms/sampling.py``; ``--top-k`` / ``--top-p`` / ``--min-p``: ``rollout.*``;
``--ratio-space``: ``algo.ratio_space``). When the engines' sampling truncates (min-p > 0, top-p < 1 or 0 < top-k < V),
the last stage also scores every token under μ (``trainer/policy/vocab_parallel.py``
``vocab_parallel_sampled_logprobs``): in the log-prob passes, and with ``ratio_space=sampling`` in the training
forward and backward too. With ``ratio_space=full`` it runs after the full softmax has freed its two fp32
temporaries and adds max(0, μ − 8·T·V/t) to the peak; with ``sampling`` its whole working set. Its working set, with N = T/c tokens, W = V/t columns of a shard, ρ = min(N, ⌊CHUNK /
(4W)⌋) rows per chunk (CHUNK = ``CHUNK_BYTES``, 256 MiB of fp32 work space), C candidates per shard and row
(k + ``TIE_SLACK`` with top-k, else ``CANDIDATES``)::

    forward  = ρ·( 5·W·[top-p without top-k]     (the kept mass: exp of a chunk, fp32, + min-p's mask)
                 + 12·C + 32·t·C )               (the shard's top C (fp32 + int64 order), the t·C gathered
                                                  ones: their copy, sort and the rules' fp32/bool temporaries)
    backward = N·W·e + ρ·W·(9 + [e < 4]·4)       (the μ gradient of the shard, held until autograd adds the
                                                  full softmax's; per chunk: the fp32 upcast, exp, masks)
    μ        = 12·N + forward                    (ratio_space=full: log-prob passes only)
             = 12·N + max(forward, backward)     (ratio_space=sampling)

12·N: the kept set of each row (bound, tie weight, normaliser: 3 fp32). The μ forward's fp32 copy of a
bf16 logits shard (``vocab_parallel._shard``) is the logits term's fp32 copy: the full-softmax pass's is
freed by then.
Not counted: rows whose candidates do not settle the kept set are redone with 8× the candidates (top-p
without top-k on near-flat rows; at worst a chunk of whole shards: ~(16 + 48·t)·CHUNK/4), and the GPU
top-k's own workspace.

Attention (``--attention``, the layers the code builds: ``model.backend`` te -> ``flash``, local -> ``local``;
auto -> te where Transformer Engine imports on the GPU machine, which ``--config`` cannot know: it plans
``flash`` and says so, and a run whose auto falls back to local is refused at start-up when the scores would
not fit, ``models/provider.py`` ``check_local_attention``). ``flash`` (TE's fused / flash kernels) keeps no
S x S tensor: c = 0. ``local`` (megatron-core 0.16's ``DotProductAttention`` + ``FusedScaleMaskSoftmax``;
``masked_softmax_fusion`` is off in every build here, so its torch path runs) materialises every head's
R x R scores, R the row length (``--seq-len`` padded; packed rows are as long as the longest sequence,
``--max-model-len``): autograd keeps the fp32 softmax output and its cast back to the model dtype, c = 4 + e
bytes per element (6 in bf16; 4 in fp32, where the cast is a no-op). One layer at a time also holds its
working set, counted once: the raw scores and their fp32 copy, w = e + 4 per element (4 in fp32), times
T·a·R/t; megatron's persistent score buffer (the global memory buffer ``baddbmm`` is given, kept across steps)
is a buffer, e·T·a·R/t. Selective recompute stores no scores but recomputes one layer's: c = 0, w += 4 + e.

Context parallelism c (``parallel.cp``, Transformer Engine's p2p ring, ``trainer/policy/context_parallel.py``):
each GPU holds T/c of every micro-batch's tokens, so activations and logits above use T/c; the ring
adds, for the one layer whose attention runs, the KV chunk being sent plus the one being received
(double-buffered): ``cp_ring = 2·(T/c)·(2·kv/t)·e`` (forward, and again in backward, where TE
re-circulates KV rather than keep the other ranks' chunks). The gathered per-token log-probs (T·4
bytes) are negligible. The distributed optimizer shards over DP × CP (Megatron's
``get_data_parallel_group(with_context_parallel=True)``): r' = r·c; GPUs = t·p·c·r. A token budget
below the longest sequence a pass holds (``--max-model-len``, default ``--seq-len``) is refused, as
config validation refuses one below ``rollout.max_model_len``.

Colocated rollout engine (vLLM, TP t_r) on the same GPU::

    weights  = e_w · P_total / t_r
    KV cache = 2 · L · ceil(k / t_r) · d · e_kv · n_seqs · (prompt + response tokens)

With ``rollout.gpu_memory_utilization`` u (``--rollout-mem-util``; a run config always sets it: null =
0.5 colocated, 0.9 separate) the engine takes u × the device's memory (``--gpu-total-gib``, 80) whatever
it needs, as vLLM sizes its KV cache to fill that share, and its weights + KV + overhead must fit in
the share (else it holds fewer sequences than ``--rollout-seqs``: refused like a layout that does not fit).

Copies of the weights beside the policy's (``--config`` reads them from the method): the reference
policy (model precision) and the teacher's snapshot / EMA shadow (an fp32 copy of the local shard, plus
the live weights it saves in model precision while a teacher pass runs, ``trainer/paths/teacher/weights.py``);
``--extra-weight-copies`` adds copies in model precision on top.

Colocated placement (``rollout.placement: colocated``, the default) runs two phases on every GPU, in
the loop's order: generate -> engines sleep -> trainer onloads -> update -> trainer offloads ->
engines wake. Both engines release what they hold when slept (vLLM sleep level 1: weights to host,
KV cache freed; the HF engine drops weights and cache), so a slept engine keeps only its own
process's CUDA context (``--overhead-gib``). The trainer offloads per ``trainer.offload``
(``trainer/policy/offload.py``; ``offload()`` also empties the caching allocator, so freed activations
return to the driver)::

    resident   = overhead + extra copies + { none: weights + grads + optimizer | optimizer: weights | all: 0 }
    update     = train total + overhead                  (the slept engine)
    generation = resident + rollout engine total         (engine weights + KV cache + overhead)
    peak       = max(update, generation)

``--no-engine-sleep`` (engines keep weights and KV during the update) makes update = train total +
rollout weights + KV. Separate placement (``--separate``: the engines on GPUs of their own) checks
both kinds of GPU: peak = max(train total, rollout engine total). All figures exclude allocator
fragmentation; ``--overhead-gib`` (default 2) stands for the CUDA context, NCCL buffers and
workspaces of each process. The budget ``--gpu-mem-gib`` is 78 GiB: what an 80 GB H100 leaves usable.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import NamedTuple

from megatron_rl.planning.arch import ArchSpec
from megatron_rl.planning.mu import (  # noqa: F401  (the μ pass's sizes, re-exported for the plan's readers)
    MU_BACKWARD_BYTES,
    MU_CANDIDATES,
    MU_CHUNK_BYTES,
    MU_GATHERED_BYTES,
    MU_LOCAL_BYTES,
    MU_ROW_BYTES,
    MU_ROW_MASS_BYTES,
    MU_TIE_SLACK,
    sampling_bytes,
    sampling_peak_bytes,
    sampling_truncates,
)
from megatron_rl.planning.units import DTYPE_BYTES, GIB

OFFLOAD_MODES = ("none", "optimizer", "all")   # trainer.offload (trainer/policy/offload.py; no torch import here)
ATTENTION = ("flash", "local")                 # the attention the layers run: TE's fused kernels | megatron's local
RATIO_SPACES = ("full", "sampling")            # algo.ratio_space (config.py)
#: the HF projections LoRA may target (``config_features.LORA_TARGETS``; planning sits below config)
LORA_PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


@dataclass(frozen=True)
class PlanInputs:
    """Parallel layout, batch shape and precision of a planned job."""

    tp: int = 1
    pp: int = 1
    vpp: int = 1                     # virtual stages per rank (interleaved 1F1B, parallel.vpp)
    cp: int = 1                      # context parallelism (parallel.cp): each sequence split over cp GPUs
    dp: int = 1
    micro_batch: int | None = None   # padded sequences per micro-batch (trainer.micro_batch_size); None = 1
    seq_len: int = 4096              # one training sequence (prompt + response): a padded row, the longest packed one
    max_tokens_per_micro_batch: int = 0  # token budget of a packed micro-batch per DP rank; 0 = padded micro-batches
    max_model_len: int | None = None     # longest sequence a pass holds (rollout.max_model_len; default seq_len)
    dtype: str = "bf16"
    dist_opt: bool = True
    sequence_parallel: bool = False
    attention: str = "flash"         # flash (TE) | local (megatron's DotProductAttention: S x S scores stored)
    recompute: str = "none"          # none | selective | full
    recompute_method: str = "uniform"  # full recompute: uniform | block
    recompute_num_layers: int = 1    # full recompute: layers per unit (uniform) / recomputed layers (block)
    fused_swiglu: bool = True        # bias_activation_fusion (on with CUDA): 3f/t instead of 5f/t MLP activations
    reference: bool = False          # a frozen reference policy (model precision) on the GPU
    teacher_shadow: bool = False     # the teacher's snapshot / EMA weights (fp32 copy) + the live copy of a teacher pass
    extra_weight_copies: int = 0     # further weight copies (model precision) kept on the GPU
    colocated: bool = True
    engine_sleep: bool = True
    offload: str = "none"            # trainer.offload: none | optimizer | all
    rollout_engines: int = 1         # rollout.num_engines (GPUs of separate placement: engines x rollout_tp)
    rollout_tp: int = 1
    rollout_mem_util: float | None = None  # rollout.gpu_memory_utilization: the engine's share of the GPU
    rollout_seqs: int = 64           # concurrent sequences in the engine's KV cache
    rollout_len: int | None = None   # prompt + response tokens (default: seq_len)
    kv_dtype: str = "bf16"
    overhead_gib: float = 2.0
    gpu_mem_gib: float = 78.0        # usable of an 80 GB H100
    gpu_total_gib: float = 80.0      # what gpu_memory_utilization is a fraction of
    vocab_multiple: int = 128
    top_k: int = -1                  # rollout.top_k (-1 / 0 = off): the sampling distribution μ the trainer scores
    top_p: float = 1.0               # rollout.top_p (1 = off)
    min_p: float = 0.0               # rollout.min_p (0 = off)
    ratio_space: str = "full"        # algo.ratio_space: sampling = μ's forward and backward in the training step
    bucket_mb: int = 256             # rollout.bucket_mb: the weight push's buckets
    lora_rank: int = 0               # lora.rank (0: no LoRA, the whole policy trains)
    lora_targets: tuple[str, ...] = LORA_PROJECTIONS   # lora.target_modules (HF projections), with lora_rank > 0

    def __post_init__(self):
        for f in ("tp", "pp", "vpp", "cp", "dp", "micro_batch", "seq_len", "rollout_tp", "rollout_seqs", "rollout_engines",
                  "vocab_multiple", "max_model_len"):
            if getattr(self, f) is not None and getattr(self, f) < 1:
                raise ValueError(f"{f} must be >= 1, got {getattr(self, f)}")
        self._check_budget()
        if self.dtype not in DTYPE_BYTES or self.kv_dtype not in DTYPE_BYTES:
            raise ValueError(f"dtype/kv_dtype must be one of {sorted(DTYPE_BYTES)}, got {self.dtype!r}/{self.kv_dtype!r}")
        if self.offload not in OFFLOAD_MODES:
            raise ValueError(f"offload must be one of {'|'.join(OFFLOAD_MODES)}, got {self.offload!r}")
        if self.attention not in ATTENTION:
            raise ValueError(f"--attention must be one of {'|'.join(ATTENTION)}, got {self.attention!r}")
        if self.recompute not in ("none", "selective", "full"):
            raise ValueError(f"recompute must be none|selective|full, got {self.recompute!r}")
        if self.recompute_method not in ("uniform", "block") or self.recompute_num_layers < 1:
            raise ValueError(f"--recompute-method must be uniform|block and --recompute-num-layers >= 1, got "
                             f"{self.recompute_method!r} / {self.recompute_num_layers}")
        if self.rollout_mem_util is not None and not 0 < self.rollout_mem_util <= 1:
            raise ValueError(f"--rollout-mem-util must be in (0, 1], got {self.rollout_mem_util}")
        if self.ratio_space not in RATIO_SPACES:
            raise ValueError(f"--ratio-space must be one of {'|'.join(RATIO_SPACES)}, got {self.ratio_space!r}")
        if not (0.0 < self.top_p <= 1.0 and 0.0 <= self.min_p <= 1.0):
            raise ValueError(f"--top-p must be in (0, 1] and --min-p in [0, 1], got {self.top_p} / {self.min_p}")
        if self.lora_rank < 0 or (self.lora_rank and (not self.lora_targets
                                                      or set(self.lora_targets) - set(LORA_PROJECTIONS))):
            raise ValueError(f"--lora-rank must be >= 0 and --lora-targets among {','.join(LORA_PROJECTIONS)}, got "
                             f"{self.lora_rank} / {','.join(self.lora_targets) or '(none)'}")
        object.__setattr__(self, "lora_targets", tuple(self.lora_targets))
        if self.sequence_parallel and self.tp == 1:
            raise ValueError("sequence_parallel needs tp > 1")
        if not self.gpu_mem_gib > 0 or self.overhead_gib < 0:
            raise ValueError(f"--gpu-mem-gib must be > 0 and --overhead-gib >= 0, got {self.gpu_mem_gib} / "
                             f"{self.overhead_gib}")
        if self.extra_weight_copies < 0 or (self.rollout_len is not None and self.rollout_len < 1):
            raise ValueError(f"--extra-weight-copies must be >= 0 and --rollout-len >= 1, got "
                             f"{self.extra_weight_copies} / {self.rollout_len}")

    def _check_budget(self) -> None:
        """The token budget's rules, as config validation states them (one line naming the numbers)."""
        budget, longest = self.max_tokens_per_micro_batch, self.max_model_len or self.seq_len
        if budget < 0:
            raise ValueError(f"--max-tokens-per-micro-batch must be >= 0 (0 = padded micro-batches), got {budget}")
        if budget and self.micro_batch is not None:
            raise ValueError(f"--micro-batch={self.micro_batch} sets padded micro-batches, but "
                             f"--max-tokens-per-micro-batch={budget} packs them by tokens: drop one")
        if longest < self.seq_len:
            raise ValueError(f"--max-model-len={longest} is below --seq-len={self.seq_len} (one training sequence)")
        if budget and budget < longest:
            what = "--max-model-len" if self.max_model_len else "--seq-len"
            raise ValueError(f"--max-tokens-per-micro-batch={budget} is below {what}={longest}: a single sequence "
                             f"longer than the budget cannot be packed; raise it to >= {longest}")

    @property
    def row_len(self) -> int:
        """R: tokens of one row, the side of its S x S scores (packed rows: the longest sequence a pass holds)."""
        return (self.max_model_len or self.seq_len) if self.max_tokens_per_micro_batch else self.seq_len

    @property
    def micro_batch_tokens(self) -> int:
        """T: token slots of one micro-batch per DP rank (the budget, else rows x seq_len)."""
        return self.max_tokens_per_micro_batch or (self.micro_batch or 1) * self.seq_len

    def micro_batch_text(self) -> str:
        """How the report names the micro-batch: ``40960 tokens (packed)`` or ``4 x 18432 (padded)``."""
        if self.max_tokens_per_micro_batch:
            return f"{self.max_tokens_per_micro_batch} tokens (packed)"
        return f"{self.micro_batch or 1} x {self.seq_len} (padded)"


class ParamCounts(NamedTuple):
    """Parameters held by one GPU of the first and of the last pipeline stage."""

    first_stage: int
    last_stage: int
    padded_vocab: int

    @property
    def max(self) -> int:
        return max(self.first_stage, self.last_stage)


def check_layout(arch: ArchSpec, inp: PlanInputs) -> None:
    """Megatron's divisibility rules; the message names the offending sizes."""
    for what, n, by, byname in (("num_attention_heads", arch.heads, inp.tp, "tp"),
                                ("num_key_value_heads", arch.kv_heads, inp.tp, "tp"),
                                ("num_hidden_layers", arch.layers, inp.pp, "pp"),
                                ("num_attention_heads", arch.heads, inp.rollout_tp, "--rollout-tp")):
        if n % by:
            raise ValueError(f"{arch.name}: {what}={n} is not divisible by {byname}={by}")


def padded_vocab(vocab: int, tp: int, multiple: int = 128) -> int:
    """Megatron pads the vocabulary to a multiple of ``multiple * tp``."""
    m = multiple * tp
    return int(math.ceil(vocab / m) * m)


def params_per_gpu(arch: ArchSpec, inp: PlanInputs) -> ParamCounts:
    """Parameters on one GPU of the first and last pipeline stage (module docstring formula)."""
    check_layout(arch, inp)
    t, h, d = inp.tp, arch.hidden, arch.head_dim
    q, kv = arch.heads * d, arch.kv_heads * d
    sharded = h * (q + 2 * kv) + q * h + 3 * h * arch.ffn + arch.qkv_bias * (q + 2 * kv)
    layer = sharded // t + 2 * h + arch.qk_norm * 2 * d
    v = padded_vocab(arch.vocab, t, inp.vocab_multiple)
    emb = v * h // t
    body = (arch.layers // inp.pp) * layer
    if inp.pp == 1:
        n = body + emb + h + (0 if arch.tied else emb)
        return ParamCounts(n, n, v)
    return ParamCounts(body + emb, body + h + emb, v)  # last stage: output layer or tied copy


def lora_params_per_layer(arch: ArchSpec, inp: PlanInputs) -> int:
    """Adapter parameters of one layer on one GPU (module docstring): column-parallel ρ·d_in + d_out·ρ/t,
    row-parallel ρ·d_in/t + d_out·ρ, summed over ``inp.lora_targets``; 0 without LoRA."""
    if not inp.lora_rank:
        return 0
    r, t, h, f = inp.lora_rank, inp.tp, arch.hidden, arch.ffn
    q, kv = arch.heads * arch.head_dim, arch.kv_heads * arch.head_dim
    shape = {"q_proj": (h, q, "col"), "k_proj": (h, kv, "col"), "v_proj": (h, kv, "col"), "o_proj": (q, h, "row"),
             "gate_proj": (h, f, "col"), "up_proj": (h, f, "col"), "down_proj": (f, h, "row")}
    n = 0
    for name in inp.lora_targets:
        d_in, d_out, kind = shape[name]
        n += r * d_in + d_out * r // t if kind == "col" else r * d_in // t + d_out * r
    return n


def activation_bytes(arch: ArchSpec, inp: PlanInputs, padded_v: int) -> tuple[int, int, int]:
    """Activation bytes for one GPU: (first stage, last stage without logits, logits), module docstring.

    First stage: 1F1B keeps p micro-batches of L/p layers in flight = L layers' worth. The last
    stage keeps one micro-batch of its L/p layers, the final norm's and the output layer's inputs, plus
    the logits. With p = 1 both are L layers and the only stage is the last.
    """
    e = DTYPE_BYTES[inp.dtype]
    t, sig = inp.tp, (inp.tp if inp.sequence_parallel else 1)
    h, q, kv = arch.hidden, arch.heads * arch.head_dim, arch.kv_heads * arch.head_dim
    tokens = math.ceil(inp.micro_batch_tokens / inp.cp)    # this CP rank's share of the micro-batch
    mlp = 3 if inp.fused_swiglu else 5
    stored, working = attention_bytes(inp)
    scores = tokens * arch.heads * inp.row_len / t        # S x S elements of one layer of this micro-batch
    rope = (1 + arch.qk_norm) * (q + kv) / t              # RoPE'd q and k (+ the q/k norms' inputs)
    per_tok = e * (2 * h / sig + h / sig + (q + 2 * kv) / t + q / t + rope + h / sig + mlp * arch.ffn / t) \
        + stored * arch.heads * inp.row_len / t + e * inp.lora_rank * len(inp.lora_targets) * bool(inp.lora_rank)
    # + the output layer's wgrad (none with LoRA: the base, the output layer included, is frozen)
    logits = tokens * (padded_v / t) * logit_bytes(e) + (padded_v / t) * h * e * (not inp.lora_rank)

    def stored_and_unit(n: int) -> tuple[float, float]:
        """(what n layers keep, the recomputed unit held while its backward runs: 0 without full recompute)."""
        if inp.recompute != "full":
            return tokens * n * per_tok, 0.0
        k, inputs = min(inp.recompute_num_layers, n), e * h / sig
        kept = math.ceil(n / k) * inputs if inp.recompute_method == "uniform" else k * inputs + (n - k) * per_tok
        return tokens * kept, tokens * 2 * k * per_tok   # a unit's activations and the gradients through them

    def with_output_layer(n: int) -> tuple[float, float]:
        """A stage with the output layer: (activations, what it holds above them from the output layer on). Its
        forward's attention working set comes before the logits, a recomputed unit after them (the logits are
        freed by then): each counts only by what it exceeds the other."""
        stored, unit = stored_and_unit(n)
        after = max(logits, unit)
        return stored + max(0.0, working * scores - after), after

    ring = 2 * tokens * (2 * kv / t) * e if inp.cp > 1 else 0   # TE's p2p ring: the KV chunk sent + the one received
    head = tokens * 2 * e * h / sig                             # the final norm's and the output layer's inputs
    recv = tokens * e * h / sig if inp.pp > 1 else 0            # a later stage's received input
    # interleaved 1F1B keeps more micro-batches in flight on the first stage: Megatron-LM's
    # theoretical_memory_usage.py penalty 1 + (p - 1) / (p * v)
    penalty = 1 + (inp.pp - 1) / (inp.pp * inp.vpp) if inp.vpp > 1 else 1.0
    if inp.pp == 1:
        acts, after = with_output_layer(arch.layers)
        return int(acts + head + ring), int(acts + head + ring), int(after)
    stored, unit = stored_and_unit(arch.layers)
    acts, after = with_output_layer(arch.layers // inp.pp)
    return int(stored * penalty + unit + ring + working * scores), int(acts + head + recv + ring), int(after)


def logit_bytes(e: int) -> int:
    """Bytes per logits element of the last stage's peak: the shard (e), its fp32 copy (none in fp32), ``z - max``
    and its ``exp`` (fp32), all alive at once in ``vocab_parallel_logprobs`` (the backward's ``_probs`` likewise)."""
    return e + (4 if e < 4 else 0) + 8


def buffer_bytes(arch: ArchSpec, inp: PlanInputs, last: bool) -> int:
    """Buffers held across steps: sequence parallelism's all-gather buffer of a micro-batch (T x h in model
    precision, Megatron's ``get_global_memory_buffer``), and on the last of several pipeline stages two tensors of a
    micro-batch's hidden states (2·T·h/σ, what the dry run finds held after the step there); with local attention,
    Megatron's persistent score buffer, one layer's S x S scores in model precision (e·T·a·R/t, the global memory
    buffer ``baddbmm`` writes into)."""
    e, tokens = DTYPE_BYTES[inp.dtype], math.ceil(inp.micro_batch_tokens / inp.cp)
    sig = inp.tp if inp.sequence_parallel else 1
    scores = tokens * arch.heads * inp.row_len // inp.tp if inp.attention == "local" else 0
    return (tokens * arch.hidden * e if inp.sequence_parallel else 0) + e * scores + \
        (2 * tokens * e * arch.hidden // sig if last and inp.pp > 1 else 0)


def attention_bytes(inp: PlanInputs) -> tuple[int, int]:
    """Bytes per S x S element: (kept by autograd per layer, one layer's working set), module docstring.
    ``flash``: (0, 0). ``local``: (4 + e, e + 4) in bf16 / fp16, (4, 4) in fp32 (the raw scores and their fp32
    copy; Megatron's persistent score buffer is in :func:`buffer_bytes`); selective recompute keeps none and adds
    the recomputed layer's (4 + e) to the working set; full recompute keeps them in the layers it holds."""
    if inp.attention == "flash":
        return 0, 0
    e = DTYPE_BYTES[inp.dtype]
    keep, working = (4 + e, e + 4) if e < 4 else (4, 4)
    if inp.recompute == "selective":
        return 0, working + keep
    return keep, working        # full recompute: the layers held (a recomputed unit, block's others) keep theirs


@dataclass(frozen=True)
class PlanReport:
    """Per-GPU memory estimate; every field in bytes except the counts."""

    arch: ArchSpec
    inputs: PlanInputs
    params: ParamCounts
    stage: str                       # the heaviest pipeline stage: "only" | "first" | "last"
    weights: int
    grads: int
    optimizer: int
    extra_copies: int
    activations: int
    logits: int
    sampling: int                    # what the μ pass adds to the peak (0 when the sampling does not truncate)
    sampling_working: int            # the μ pass's working set (``sampling_bytes``)
    buffers: int                     # Megatron's buffers kept across steps (``buffer_bytes``)
    push: int                        # the weight push's working set, a phase of its own (``push_bytes``)
    overhead: int
    rollout_weights: int
    rollout_kv: int

    @property
    def train_total(self) -> int:
        return (self.weights + self.grads + self.optimizer + self.extra_copies + self.buffers + self.overhead
                + max(self.activations + self.logits + self.sampling, self.push))

    @property
    def rollout_need(self) -> int:
        """What the engine needs: its weights, the KV cache of ``rollout_seqs`` sequences, its overhead."""
        return self.rollout_weights + self.rollout_kv + self.overhead

    @property
    def rollout_total(self) -> int:
        """What the engine takes: its ``gpu_memory_utilization`` share when set (vLLM fills it), else its need."""
        u = self.inputs.rollout_mem_util
        return max(self.rollout_need, int(u * self.inputs.gpu_total_gib * GIB)) if u is not None else self.rollout_need

    @property
    def trainer_resident(self) -> int:
        """What the trainer keeps on the GPU while colocated engines generate (``trainer.offload``)."""
        kept = {"none": self.weights + self.grads + self.optimizer, "optimizer": self.weights, "all": 0}
        return self.overhead + self.extra_copies + kept[self.inputs.offload]

    @property
    def update_peak(self) -> int:
        """Colocated update phase: training plus the engine, slept (its CUDA context) or resident."""
        engine = self.overhead if self.inputs.engine_sleep else self.rollout_weights + self.rollout_kv
        return self.train_total + engine

    @property
    def generation_peak(self) -> int:
        """Colocated generation phase: the trainer's resident part plus the awake engine."""
        return self.trainer_resident + self.rollout_total

    @property
    def peak(self) -> int:
        """Per-GPU peak: colocated, the larger phase; separate, the larger kind of GPU."""
        if not self.inputs.colocated:
            return max(self.train_total, self.rollout_total)
        return max(self.update_peak, self.generation_peak)


def estimate(arch: ArchSpec, inp: PlanInputs) -> PlanReport:
    """Per-GPU estimate of the heaviest pipeline stage (formulas in the module docstring)."""
    stages = estimate_stages(arch, inp)
    return max(stages.values(), key=lambda r: r.train_total) if inp.pp > 1 else stages[0]


def estimate_stages(arch: ArchSpec, inp: PlanInputs) -> dict[int, PlanReport]:
    """The estimates of the first and the last pipeline stage, by stage index (one entry without PP)."""
    counts = params_per_gpu(arch, inp)
    acts_first, acts_last, logits = activation_bytes(arch, inp, counts.padded_vocab)
    e = DTYPE_BYTES[inp.dtype]
    rl = inp.rollout_len or inp.seq_len
    kv_heads = math.ceil(arch.kv_heads / inp.rollout_tp)
    common = dict(arch=arch, inputs=inp, params=counts, overhead=int(inp.overhead_gib * GIB), rollout_weights=arch.total_params() * e // inp.rollout_tp,
                  rollout_kv=2 * arch.layers * kv_heads * arch.head_dim * DTYPE_BYTES[inp.kv_dtype] * inp.rollout_seqs * rl)
    mu = sampling_bytes(arch, inp, counts.padded_vocab)     # the last stage's, like the logits
    mu_peak = sampling_peak_bytes(arch, inp, counts.padded_vocab, mu)
    if inp.pp == 1:
        return {0: _stage(common, "only", counts.first_stage, acts_first, logits, mu_peak, mu,
                          buffer_bytes(arch, inp, True), push_bytes(arch, inp, 0))}
    return {0: _stage(common, "first", counts.first_stage, acts_first, 0, 0, 0, buffer_bytes(arch, inp, False),
                      push_bytes(arch, inp, 0)),
            inp.pp - 1: _stage(common, "last", counts.last_stage, acts_last, logits, mu_peak, mu,
                               buffer_bytes(arch, inp, True), push_bytes(arch, inp, inp.pp - 1))}


def push_bytes(arch: ArchSpec, inp: PlanInputs, stage: int) -> int:
    """The trainer's side of a weight push on pipeline stage ``stage`` (``convert/live.stream_hf_tensors`` into
    ``rollout/weight_sync.BucketPacker``), set by the largest HF tensor, E = V·h·e (the embedding / output
    layer, V padded): its owner gathers the TP shards (E) and joins them (E); rank 0 packs every tensor into
    one of two reused buckets of max(E, B) bytes, B = ``rollout.bucket_mb``. Without PP rank 0 does all of it,
    2E + 2·max(E, B); with PP the first stage (rank 0) holds E + 2·max(E, B) (the later stages' tensors arrive
    joined), a later stage 2E (measured by the dry run on every example: 2E, 3E, 4E)."""
    big = padded_vocab(arch.vocab, inp.tp, inp.vocab_multiple) * arch.hidden * DTYPE_BYTES[inp.dtype]
    bucket = max(big, inp.bucket_mb << 20)
    if inp.pp == 1:
        return 2 * big + 2 * bucket
    return big + 2 * bucket if stage == 0 else 2 * big


def _stage(common: dict, stage: str, n: int, acts: int, logits: int, mu: int, mu_working: int,
           buffers: int, push: int) -> PlanReport:
    inp: PlanInputs = common["inputs"]
    e = DTYPE_BYTES[inp.dtype]
    grad_b, opt_b = (4, 12) if e == 2 else (4, 8)
    r = inp.dp * inp.cp if inp.dist_opt else 1      # Megatron's distributed optimizer shards over DP x CP
    copies = (inp.extra_weight_copies + inp.reference) * n * e + inp.teacher_shadow * n * (4 + e)
    adapters = common["arch"].layers // inp.pp * lora_params_per_layer(common["arch"], inp)
    trained = adapters if inp.lora_rank else n      # LoRA: the base is frozen (no main grad, no optimizer state)
    return PlanReport(**common, stage=stage, weights=(n + adapters) * e, grads=trained * grad_b,
                      optimizer=int(trained * opt_b / r),
                      extra_copies=copies, activations=acts, logits=logits, sampling=mu, sampling_working=mu_working,
                      buffers=buffers, push=push)


def score_total(rep: PlanReport) -> int:
    """The part of ``rep.activations`` that local attention's S x S scores take (0 with flash)."""
    flash = estimate(rep.arch, replace(rep.inputs, attention="flash"))
    return rep.activations - (flash.activations if flash.stage == rep.stage else rep.activations)


def engine_holds(rep: PlanReport) -> bool:
    """Whether the engine's ``gpu_memory_utilization`` share holds its weights + KV cache (True when unset)."""
    u = rep.inputs.rollout_mem_util
    return u is None or rep.rollout_need <= u * rep.inputs.gpu_total_gib * GIB


def fits(rep: PlanReport | None) -> bool:
    """Whether the estimated peak fits ``--gpu-mem-gib`` and the engine's share holds what it needs
    (True for ``--list-models``)."""
    return rep is None or (rep.peak <= rep.inputs.gpu_mem_gib * GIB and engine_holds(rep))
