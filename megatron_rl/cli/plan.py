"""`megatron-rl plan`: per-GPU memory estimate for a model x TP x PP x DP x micro-batch (tokens) x seq-len.

Run it before sending a job. It imports neither torch nor megatron, so it works on a login node.
The model is a HF ``config.json`` (file or folder) or a built-in preset name (``--list-models``).

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

Activations (rough; after Korthikanti et al. 2022, "Reducing Activation Recomputation in Large
Transformer Models", eq. 1-2, generalised to GQA + SwiGLU and no dropout), bytes per token per layer::

    norms   e·2h/σ                       (inputs of the two RMSNorms)
    attn    e·(h/σ + (q + 2kv)/t + q/t)  (QKV input, Q/K/V, out-proj input)
            + e·a·s/t                    (softmax probs, rows of s tokens; 0 with flash attention /
                                          selective recompute)
    mlp     e·(h/σ + 3f/t)               (fc1 input, gate+up outputs, SwiGLU output), with the fused
                                         SwiGLU (``bias_activation_fusion``, on with CUDA); the unfused
                                         one also keeps silu(gate) and its input: e·(h/σ + 5f/t)

With 1F1B the first stage keeps p micro-batches of L/p layers in flight, i.e. L layers' worth
(Korthikanti §4.2.3): activations = T·L·per_layer; interleaved 1F1B with v virtual stages
(``parallel.vpp``) keeps 1 + (p − 1)/(p·v) times that (Megatron-LM's theoretical memory estimate). Full recompute (Megatron's ``recompute_method``):
uniform with k layers per unit keeps each unit's input (ceil(n/k)·e·h/σ per token) plus one unit's
activations (k layers) while it is recomputed; block with k keeps only the inputs of the first k layers
and everything of the other n − k, plus one recomputed layer. Selective recompute (Megatron's default
module: core attention) drops the softmax term only, which flash attention never stores. The last stage also holds the logits:
T·(V/t)·(e + 4 + 4) (logits, fp32 copy, fp32 softmax for log-prob/entropy backward).

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
both kinds of GPU: peak = max(train total, rollout engine total). ``--config run.yaml`` takes the
layout, precision, micro-batching (token budget or padded rows), sequence length, placement, offload
and engine count from a run config (``plan_config.py``). All figures exclude allocator
fragmentation; ``--overhead-gib`` (default 2) stands for the CUDA context, NCCL buffers and
workspaces of each process. The budget ``--gpu-mem-gib`` is 78 GiB: what an 80 GB H100 leaves usable.
"""
from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

from megatron_rl.cli.plan_config import merge_config
from megatron_rl.config import load_config
from megatron_rl.runtime.usage import EXIT_USAGE

GIB = 1024 ** 3
SUPPORTED_ARCHITECTURES = ("LlamaForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM")
DTYPE_BYTES = {"bf16": 2, "fp16": 2, "fp32": 4}
OFFLOAD_MODES = ("none", "optimizer", "all")   # trainer.offload (trainer/policy/offload.py; no torch import here)


@dataclass(frozen=True)
class ArchSpec:
    """The shape facts of a decoder-only model that memory depends on."""

    name: str
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    ffn: int
    vocab: int
    tied: bool
    qkv_bias: bool
    qk_norm: bool

    @classmethod
    def from_hf(cls, cfg: Mapping, name: str = "model") -> ArchSpec:
        """Build from a HF ``config.json`` dict (Llama / Qwen2 / Qwen3 families)."""
        arch = (cfg.get("architectures") or ["?"])[0]
        if arch not in SUPPORTED_ARCHITECTURES:
            raise ValueError(f"{name}: architecture {arch!r} is not supported; supported: {list(SUPPORTED_ARCHITECTURES)}")
        try:
            h, heads = int(cfg["hidden_size"]), int(cfg["num_attention_heads"])
            spec = cls(name=name, hidden=h, layers=int(cfg["num_hidden_layers"]), heads=heads,
                       kv_heads=int(cfg.get("num_key_value_heads") or heads),
                       head_dim=int(cfg.get("head_dim") or h // heads), ffn=int(cfg["intermediate_size"]),
                       vocab=int(cfg["vocab_size"]), tied=bool(cfg.get("tie_word_embeddings", False)),
                       qkv_bias=arch == "Qwen2ForCausalLM" or bool(cfg.get("attention_bias", False)),
                       qk_norm=arch == "Qwen3ForCausalLM")
        except KeyError as e:
            raise ValueError(f"{name}: config.json lacks the field {e.args[0]!r}") from None
        if spec.heads % spec.kv_heads:
            raise ValueError(f"{name}: num_attention_heads {spec.heads} is not a multiple of num_key_value_heads {spec.kv_heads}")
        return spec

    def total_params(self) -> int:
        """Unpadded parameter count, as HF reports it (sum of numel over the state dict)."""
        q, kv, h = self.heads * self.head_dim, self.kv_heads * self.head_dim, self.hidden
        layer = h * (q + 2 * kv) + q * h + 3 * h * self.ffn + 2 * h
        layer += self.qkv_bias * (q + 2 * kv) + self.qk_norm * 2 * self.head_dim
        return self.layers * layer + self.vocab * h * (1 if self.tied else 2) + h


def _preset(arch, h, L, a, k, f, v, tied, d=128, **kw) -> dict:
    model_type = {"LlamaForCausalLM": "llama", "Qwen2ForCausalLM": "qwen2", "Qwen3ForCausalLM": "qwen3"}[arch]
    return {"architectures": [arch], "model_type": model_type, "hidden_size": h, "num_hidden_layers": L, "num_attention_heads": a,
            "num_key_value_heads": k, "head_dim": d, "intermediate_size": f, "vocab_size": v,
            "tie_word_embeddings": tied, **kw}


#: Published shapes (config.json) of the models the example configs use.
PRESETS: dict[str, dict] = {
    "qwen3-1.7b": _preset("Qwen3ForCausalLM", 2048, 28, 16, 8, 6144, 151936, True),
    "qwen3-4b": _preset("Qwen3ForCausalLM", 2560, 36, 32, 8, 9728, 151936, True),
    "qwen3-8b": _preset("Qwen3ForCausalLM", 4096, 36, 32, 8, 12288, 151936, False),
    "qwen3-14b": _preset("Qwen3ForCausalLM", 5120, 40, 40, 8, 17408, 151936, False),
    "qwen2.5-3b": _preset("Qwen2ForCausalLM", 2048, 36, 16, 2, 11008, 151936, True),
    "qwen2.5-7b": _preset("Qwen2ForCausalLM", 3584, 28, 28, 4, 18944, 152064, False),
    "qwen2.5-14b": _preset("Qwen2ForCausalLM", 5120, 48, 40, 8, 13824, 152064, False),
    "llama3.1-8b": _preset("LlamaForCausalLM", 4096, 32, 32, 8, 14336, 128256, False),
}


def load_arch(model: str) -> ArchSpec:
    """``model`` is a preset name, a ``config.json`` path, or a folder holding one."""
    key = model.lower().replace("_", "-")
    if key in PRESETS:
        return ArchSpec.from_hf(PRESETS[key], name=key)
    p = Path(model)
    if p.is_dir():
        p = p / "config.json"
    if not p.is_file():
        raise ValueError(f"model {model!r}: not a preset ({', '.join(sorted(PRESETS))}) "
                         f"and no config.json found at {p}")
    try:
        cfg = json.loads(p.read_text())
    except json.JSONDecodeError as e:
        raise ValueError(f"{p}: not valid JSON ({e})") from None
    return ArchSpec.from_hf(cfg, name=str(model))


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
    flash_attn: bool = True
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
        if self.recompute not in ("none", "selective", "full"):
            raise ValueError(f"recompute must be none|selective|full, got {self.recompute!r}")
        if self.recompute_method not in ("uniform", "block") or self.recompute_num_layers < 1:
            raise ValueError(f"--recompute-method must be uniform|block and --recompute-num-layers >= 1, got "
                             f"{self.recompute_method!r} / {self.recompute_num_layers}")
        if self.rollout_mem_util is not None and not 0 < self.rollout_mem_util <= 1:
            raise ValueError(f"--rollout-mem-util must be in (0, 1], got {self.rollout_mem_util}")
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


def activation_bytes(arch: ArchSpec, inp: PlanInputs, padded_v: int) -> tuple[int, int, int]:
    """Activation bytes for one GPU: (first stage, last stage without logits, logits).

    First stage: 1F1B keeps p micro-batches of L/p layers in flight = L layers' worth. The last
    stage keeps one micro-batch of its L/p layers, plus the logits. With p = 1 both are L layers.
    """
    e = DTYPE_BYTES[inp.dtype]
    t, sig = inp.tp, (inp.tp if inp.sequence_parallel else 1)
    h, q, kv = arch.hidden, arch.heads * arch.head_dim, arch.kv_heads * arch.head_dim
    tokens = math.ceil(inp.micro_batch_tokens / inp.cp)    # this CP rank's share of the micro-batch
    mlp = 3 if inp.fused_swiglu else 5
    per_tok = e * (2 * h / sig + h / sig + (q + 2 * kv) / t + q / t + h / sig + mlp * arch.ffn / t)
    if not inp.flash_attn and inp.recompute == "none":
        per_tok += e * arch.heads * inp.seq_len / t

    def layers_worth(n: int) -> float:
        if inp.recompute != "full":
            return tokens * n * per_tok
        k, inputs = min(inp.recompute_num_layers, n), e * h / sig
        if inp.recompute_method == "uniform":   # each unit's input, plus one unit recomputed
            return tokens * (math.ceil(n / k) * inputs + k * per_tok)
        return tokens * (k * inputs + (n - k) * per_tok + per_tok)   # block: k layers recomputed, one at a time

    logits = tokens * (padded_v / t) * (e + 4 + 4)
    ring = 2 * tokens * (2 * kv / t) * e if inp.cp > 1 else 0   # TE's p2p ring: the KV chunk sent + the one received
    # interleaved 1F1B keeps more micro-batches in flight on the first stage: Megatron-LM's
    # theoretical_memory_usage.py penalty 1 + (p - 1) / (p * v)
    penalty = 1 + (inp.pp - 1) / (inp.pp * inp.vpp) if inp.vpp > 1 else 1.0
    return (int(layers_worth(arch.layers) * penalty + ring), int(layers_worth(arch.layers // inp.pp) + ring),
            int(logits))


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
    overhead: int
    rollout_weights: int
    rollout_kv: int

    @property
    def train_total(self) -> int:
        return (self.weights + self.grads + self.optimizer + self.extra_copies + self.activations
                + self.logits + self.overhead)

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
    counts = params_per_gpu(arch, inp)
    acts_first, acts_last, logits = activation_bytes(arch, inp, counts.padded_vocab)
    e = DTYPE_BYTES[inp.dtype]
    rl = inp.rollout_len or inp.seq_len
    kv_heads = math.ceil(arch.kv_heads / inp.rollout_tp)
    common = dict(arch=arch, inputs=inp, params=counts, overhead=int(inp.overhead_gib * GIB),
                  rollout_weights=arch.total_params() * e // inp.rollout_tp,
                  rollout_kv=2 * arch.layers * kv_heads * arch.head_dim * DTYPE_BYTES[inp.kv_dtype] * inp.rollout_seqs * rl)
    if inp.pp == 1:
        return _stage(common, "only", counts.first_stage, acts_first, logits)
    first = _stage(common, "first", counts.first_stage, acts_first, 0)
    last = _stage(common, "last", counts.last_stage, acts_last, logits)
    return first if first.train_total >= last.train_total else last


def _stage(common: dict, stage: str, n: int, acts: int, logits: int) -> PlanReport:
    inp: PlanInputs = common["inputs"]
    e = DTYPE_BYTES[inp.dtype]
    grad_b, opt_b = (4, 12) if e == 2 else (4, 8)
    r = inp.dp * inp.cp if inp.dist_opt else 1      # Megatron's distributed optimizer shards over DP x CP
    copies = (inp.extra_weight_copies + inp.reference) * n * e + inp.teacher_shadow * n * (4 + e)
    return PlanReport(**common, stage=stage, weights=n * e, grads=n * grad_b, optimizer=int(n * opt_b / r),
                      extra_copies=copies, activations=acts, logits=logits)


def format_report(rep: PlanReport) -> str:
    """Render the table printed by ``megatron-rl plan``."""
    i, a = rep.inputs, rep.arch
    micro = i.micro_batch_text() + (f", seq {i.seq_len}" if i.max_tokens_per_micro_batch else "")

    def g(b: float) -> str:
        return f"{b / GIB:9.2f}"

    lines = [
        f"model {a.name}: {a.total_params() / 1e9:.3f} B params, {a.layers} layers, hidden {a.hidden}, "
        f"heads {a.heads}/{a.kv_heads} (q/kv), ffn {a.ffn}, vocab {a.vocab} (padded {rep.params.padded_vocab})",
        f"layout TP={i.tp} PP={i.pp}{f' (x{i.vpp} virtual)' if i.vpp > 1 else ''}{f' CP={i.cp}' if i.cp > 1 else ''} DP={i.dp} "
        f"({i.tp * i.pp * i.cp * i.dp} GPUs), micro-batch {micro}, "
        f"{i.dtype}, dist-opt {'on' if i.dist_opt else 'off'}, SP {'on' if i.sequence_parallel else 'off'}, "
        f"recompute {_recompute_text(i)}, flash-attn {'on' if i.flash_attn else 'off'}, "
        f"SwiGLU {'fused' if i.fused_swiglu else 'unfused'}",
        f"params per GPU: first stage {rep.params.first_stage / 1e6:.1f} M, last stage {rep.params.last_stage / 1e6:.1f} M",
        "",
        f"{'component (' + rep.stage + ' pipeline stage)':<44}{'GiB/GPU':>9}",
        f"{'-' * 53}",
        f"{'weights':<44}{g(rep.weights)}",
        f"{'gradients (fp32 main grads)':<44}{g(rep.grads)}",
        f"{'optimizer (Adam' + (' + fp32 master' if i.dtype != 'fp32' else '') + (', /DP' if i.dist_opt else '') + ')':<44}{g(rep.optimizer)}",
        f"{_copies_text(i):<44}{g(rep.extra_copies)}",
        f"{'activations (1F1B)':<44}{g(rep.activations)}",
        f"{'logits + fp32 softmax':<44}{g(rep.logits)}",
        f"{'overhead (CUDA context, NCCL, workspaces)':<44}{g(rep.overhead)}",
        f"{'= training total':<44}{g(rep.train_total)}",
        f"{'rollout engine weights (TP=' + str(i.rollout_tp) + ')':<44}{g(rep.rollout_weights)}",
        f"{'rollout KV cache (' + str(i.rollout_seqs) + ' seqs x ' + str(i.rollout_len or i.seq_len) + ' tok)':<44}{g(rep.rollout_kv)}",
        f"{'= rollout engine total' + (f' (gpu_memory_utilization {i.rollout_mem_util:g})' if i.rollout_mem_util else ''):<44}"
        f"{g(rep.rollout_total)}",
        f"{'-' * 53}",
    ]
    if i.colocated:
        slept = "slept engine" if i.engine_sleep else "resident engine weights + KV (--no-engine-sleep)"
        lines += [f"{'trainer resident (offload ' + i.offload + ')':<44}{g(rep.trainer_resident)}",
                  (f"{'update phase = training + ' + ('slept engine' if i.engine_sleep else 'engine'):<44}"
                   f"{g(rep.update_peak)}"),
                  f"{'generation phase = resident + rollout':<44}{g(rep.generation_peak)}",
                  f"{'PEAK per GPU':<44}{g(rep.peak)}   [colocated: max(update, generation); {slept}]"]
    else:
        gpus = f"{i.tp * i.pp * i.dp} training + {i.rollout_engines * i.rollout_tp} rollout GPUs"
        lines.append(f"{'PEAK per GPU':<44}{g(rep.peak)}   [separate, {gpus}: max(training, rollout)]")
    lines.append(f"{'fits' if fits(rep) else 'DOES NOT FIT'} in {i.gpu_mem_gib:g} GiB{_hint(rep)}")
    return "\n".join(lines)


def _copies_text(i: PlanInputs) -> str:
    parts = (["reference"] if i.reference else []) + (["teacher fp32"] if i.teacher_shadow else []) + \
        ([f"+{i.extra_weight_copies}"] if i.extra_weight_copies else [])
    return f"weight copies ({', '.join(parts) or 'none'})"


def _recompute_text(i: PlanInputs) -> str:
    return f"full {i.recompute_method}/{i.recompute_num_layers}" if i.recompute == "full" else i.recompute


def _hint(rep: PlanReport) -> str:
    """What to change when the layout does not fit, for the side that sets the peak."""
    i = rep.inputs
    if fits(rep):
        return ""
    if not engine_holds(rep):
        return (f" - the engine's share (gpu_memory_utilization {i.rollout_mem_util:g}) holds less than its weights + KV "
                f"cache ({rep.rollout_need / GIB:.1f} GiB): raise rollout.gpu_memory_utilization, --rollout-tp or "
                "lower --rollout-seqs")
    rollout_side = (rep.generation_peak >= rep.update_peak if i.colocated else rep.rollout_total > rep.train_total)
    if not rollout_side:
        lower = "--max-tokens-per-micro-batch" if i.max_tokens_per_micro_batch else "micro-batch"
        return f" - raise TP/PP/DP, lower {lower}, enable --recompute full or --sequence-parallel"
    more = {"none": "trainer.offload (--offload) optimizer|all, ", "optimizer": "trainer.offload (--offload) all, ",
            "all": ""}
    return (" - the generation phase dominates: " + (more[i.offload] if i.colocated else "")
            + "lower --rollout-seqs / --rollout-len or raise --rollout-tp")


def add_arguments(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """The ``plan`` options (shared by ``megatron-rl plan`` and ``python -m megatron_rl.cli.plan``)."""
    d = PlanInputs()
    p.add_argument("--model", help="preset name or HF config.json (file or folder); see --list-models")
    p.add_argument("--list-models", action="store_true", help="print the preset names and exit")
    p.add_argument("--tp", type=int, default=d.tp, help="tensor-parallel size")
    p.add_argument("--pp", type=int, default=d.pp, help="pipeline-parallel size")
    p.add_argument("--vpp", type=int, default=d.vpp, help="virtual pipeline stages per rank (interleaved 1F1B)")
    p.add_argument("--cp", type=int, default=d.cp, help="context-parallel size (each sequence split over cp GPUs)")
    p.add_argument("--dp", type=int, default=d.dp, help="data-parallel size")
    p.add_argument("--micro-batch", type=int, default=d.micro_batch,
                   help="padded micro-batch: sequences of --seq-len tokens (default 1; trainer.micro_batch_size)")
    p.add_argument("--max-tokens-per-micro-batch", type=int, default=d.max_tokens_per_micro_batch,
                   help="packed micro-batch: token budget per DP rank (trainer.max_tokens_per_micro_batch); "
                   "activations for this many tokens instead of micro-batch x seq-len; 0 = padded")
    p.add_argument("--seq-len", type=int, default=d.seq_len, help="training sequence length (prompt + response)")
    p.add_argument("--max-model-len", type=int, default=d.max_model_len,
                   help="longest sequence a pass holds (rollout.max_model_len; default --seq-len): the budget's floor")
    p.add_argument("--dtype", choices=sorted(DTYPE_BYTES), default=d.dtype, help="parameter/activation precision")
    p.add_argument("--no-dist-opt", dest="dist_opt", action="store_false", help="optimizer state not sharded over DP")
    p.add_argument("--sequence-parallel", action="store_true", help="Megatron sequence parallelism (needs TP > 1)")
    p.add_argument("--no-flash-attn", dest="flash_attn", action="store_false", help="store the s x s softmax")
    p.add_argument("--recompute", choices=("none", "selective", "full"), default=d.recompute, help="activation recompute")
    p.add_argument("--recompute-method", choices=("uniform", "block"), default=d.recompute_method,
                   help="full recompute: uniform units or the first N layers of a stage (model.recompute_method)")
    p.add_argument("--recompute-num-layers", type=int, default=d.recompute_num_layers,
                   help="full recompute: layers per unit / recomputed layers (model.recompute_num_layers)")
    p.add_argument("--unfused-swiglu", dest="fused_swiglu", action="store_false",
                   help="SwiGLU without bias_activation_fusion (CPU builds): 5f/t MLP activations instead of 3f/t")
    p.add_argument("--reference", action="store_true", help="a frozen reference policy on the GPU (model precision)")
    p.add_argument("--teacher-shadow", action="store_true", help="the teacher's snapshot / EMA weights (fp32 copy)")
    p.add_argument("--extra-weight-copies", type=int, default=d.extra_weight_copies,
                   help="further weight copies (model precision) kept on the GPU")
    p.add_argument("--config", help="run config (YAML): layout, precision, micro-batching, seq-len, max-model-len, "
                   "placement, trainer.offload and engine count come from it (plan_config.py)")
    p.add_argument("--separate", dest="colocated", action="store_false", help="rollout engines on other GPUs")
    p.add_argument("--offload", choices=OFFLOAD_MODES, default=d.offload,
                   help="trainer.offload: what the trainer parks in host memory while colocated engines generate")
    p.add_argument("--rollout-engines", type=int, default=d.rollout_engines, help="rollout engines (rollout.num_engines)")
    p.add_argument("--no-engine-sleep", dest="engine_sleep", action="store_false",
                   help="colocated engines keep weights + KV cache during training")
    p.add_argument("--rollout-tp", type=int, default=d.rollout_tp, help="tensor-parallel size of each rollout engine")
    p.add_argument("--rollout-mem-util", type=float, default=d.rollout_mem_util,
                   help="the engine's gpu_memory_utilization share (vLLM fills it); default: its need")
    p.add_argument("--rollout-seqs", type=int, default=d.rollout_seqs, help="concurrent sequences in the KV cache")
    p.add_argument("--rollout-len", type=int, default=None, help="tokens per rollout sequence (default: --seq-len)")
    p.add_argument("--kv-dtype", choices=sorted(DTYPE_BYTES), default=d.kv_dtype, help="KV-cache precision")
    p.add_argument("--overhead-gib", type=float, default=d.overhead_gib, help="fixed per-GPU overhead")
    p.add_argument("--gpu-mem-gib", type=float, default=d.gpu_mem_gib, help="GPU memory to check the peak against (usable)")
    p.add_argument("--gpu-total-gib", type=float, default=d.gpu_total_gib,
                   help="the device's memory, of which gpu_memory_utilization is a fraction")
    return p


def run(args: argparse.Namespace) -> PlanReport | None:
    """Execute parsed ``plan`` arguments: print the table, return the report."""
    if args.list_models:
        for name in sorted(PRESETS):
            print(f"{name:<14}{ArchSpec.from_hf(PRESETS[name], name).total_params() / 1e9:7.3f} B")
        return None
    if not args.model and getattr(args, "config", None):   # the run config names its model: model.hf_path
        if not Path(args.config).is_file():
            raise FileNotFoundError(f"plan: --config {args.config}: no such file")
        try:
            args.model = load_config(args.config).model.hf_path or None
        except FileNotFoundError as e:   # the model is not downloaded here: a preset plans it all the same
            raise FileNotFoundError(f"{e}; or pass --model PRESET (megatron-rl plan --list-models)") from None
        if not args.model:
            raise ValueError(f"plan: --config {args.config} sets no model.hf_path; pass --model (a preset name or a "
                             "config.json path)")
    if not args.model:
        raise ValueError("plan: --model is required (a preset name or a config.json path)")
    rep = report_for(args)
    print(format_report(rep))
    return rep


def report_for(args: argparse.Namespace) -> PlanReport:
    """The estimate for parsed ``plan`` arguments (``--config`` merged in), without printing."""
    fields = set(PlanInputs.__dataclass_fields__)
    given = {k: v for k, v in vars(args).items() if k in fields}
    if getattr(args, "config", None):
        given = merge_config(args.config, given, PlanInputs())
    return estimate(load_arch(args.model), PlanInputs(**given))


def engine_holds(rep: PlanReport) -> bool:
    """Whether the engine's ``gpu_memory_utilization`` share holds its weights + KV cache (True when unset)."""
    u = rep.inputs.rollout_mem_util
    return u is None or rep.rollout_need <= u * rep.inputs.gpu_total_gib * GIB


def fits(rep: PlanReport | None) -> bool:
    """Whether the estimated peak fits ``--gpu-mem-gib`` and the engine's share holds what it needs
    (True for ``--list-models``)."""
    return rep is None or (rep.peak <= rep.inputs.gpu_mem_gib * GIB and engine_holds(rep))


def exit_status(rep: PlanReport | None) -> int:
    """0 when the layout fits, else 2 (the layout is refused, like any configuration error) with one
    line on stderr (scripts can gate a job on it)."""
    if fits(rep):
        return 0

    print(f"megatron-rl plan: error: the layout does not fit: peak {rep.peak / GIB:.2f} GiB per GPU > "
          f"--gpu-mem-gib {rep.inputs.gpu_mem_gib:g}", file=sys.stderr)

    return EXIT_USAGE


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m megatron_rl.cli.plan ...`` (same options as ``megatron-rl plan``)."""
    args = add_arguments(argparse.ArgumentParser(prog="megatron-rl plan", description=__doc__.splitlines()[0])).parse_args(argv)
    return exit_status(run(args))


if __name__ == "__main__":
    raise SystemExit(main())
