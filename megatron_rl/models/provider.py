"""HF ``config.json`` -> Megatron ``TransformerConfig`` + layer spec + ``GPTModel``.

Supported: ``LlamaForCausalLM`` (incl. Llama-3 ``rope_type="llama3"`` scaling), ``Qwen2ForCausalLM``
(q/k/v bias), ``Qwen3ForCausalLM`` (q/k RMSNorm), tied and untied embeddings, GQA with any ratio
that divides the heads. Everything else fails at start-up with a message naming what is supported.

Flags that parity with HF depends on (measured; see notes/cpu_megatron_ray.md §3 probe 5):
``kv_channels=head_dim`` (HF's head_dim need not be hidden/heads), ``layernorm_epsilon=rms_norm_eps``
(megatron's default 1e-5 is off by ~6e-4 in the logits for Qwen), ``rotary_base=rope_theta``,
``gated_linear_unit`` + SiLU, no linear biases, dropout 0, ``rotary_interleaved=False`` (HF
rotate_half).

Vocabulary padding: megatron splits the embedding and output layer over TP ranks, so the vocab is
padded up to a multiple of ``VOCAB_DIVISIBLE_BY * tp`` (as Megatron-LM's
``make_vocab_size_divisible_by``). Padded rows are zero in converted checkpoints and are masked out
of every log-softmax (``trainer/policy/vocab_parallel.py``); HF exports drop them again.
"""
from __future__ import annotations

import dataclasses
import importlib.util
import json
import math
import os
import types
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from megatron_rl.runtime.device import has_cuda

SUPPORTED_ARCHITECTURES = ("LlamaForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM")
VOCAB_DIVISIBLE_BY = 128
_MODEL_TYPES = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM"}


def load_hf_config(src: Any):
    """Return a ``transformers.PretrainedConfig`` from a model dir, a ``config.json`` path, a dict,
    or a ``PretrainedConfig`` (returned as is). Raises ``ValueError`` for unsupported architectures."""
    from transformers import AutoConfig, PretrainedConfig  # lazy: defers transformers to the call

    if isinstance(src, PretrainedConfig):
        cfg = src
    elif isinstance(src, dict):
        d = dict(src)
        # the architecture first, from the dict: transformers' validation of an unsupported model's config
        # (e.g. GPT-2's token ids) would print its warnings before this one clear line
        architecture(types.SimpleNamespace(architectures=d.get("architectures"), model_type=d.get("model_type", "")))
        cfg = AutoConfig.for_model(d.pop("model_type"), **d) if "model_type" in d else None
        if cfg is None:
            raise ValueError("HF config dict has no 'model_type'")
    elif isinstance(src, (str, os.PathLike)):
        p = Path(src)
        if p.is_file():
            return load_hf_config(json.loads(p.read_text()))
        if not (p / "config.json").is_file():
            raise FileNotFoundError(f"no config.json in {p}")
        return load_hf_config(json.loads((p / "config.json").read_text()))
    else:
        raise TypeError(f"cannot read an HF config from {type(src).__name__}")
    architecture(cfg)  # validates
    return cfg


def architecture(cfg) -> str:
    """The HF architecture name (``architectures[0]`` or derived from ``model_type``), validated."""
    archs = getattr(cfg, "architectures", None) or []
    arch = archs[0] if archs else _MODEL_TYPES.get(getattr(cfg, "model_type", ""), getattr(cfg, "model_type", "?"))
    if arch not in SUPPORTED_ARCHITECTURES:
        raise ValueError(f"unsupported architecture {arch!r}; supported: {', '.join(SUPPORTED_ARCHITECTURES)}")
    return arch


@dataclasses.dataclass(frozen=True)
class ArchInfo:
    """Shape facts of a supported HF decoder, used by the provider, converter and weight sync."""

    architecture: str
    num_layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    ffn_hidden_size: int
    vocab_size: int
    tied_embeddings: bool
    qkv_bias: bool
    qk_norm: bool
    rms_norm_eps: float
    rope_theta: float
    rope_scaling: dict | None
    max_position_embeddings: int


def _rope(cfg) -> tuple[float, dict | None]:
    params = dict(getattr(cfg, "rope_parameters", None) or {})
    legacy = getattr(cfg, "rope_scaling", None)
    if legacy and not params.get("rope_type"):
        params.update(legacy)
    theta = params.get("rope_theta", getattr(cfg, "rope_theta", None) or 10000.0)
    kind = params.get("rope_type", params.get("type", "default")) or "default"
    if kind == "default":
        return float(theta), None
    if kind != "llama3":
        raise ValueError(f"unsupported rope scaling {kind!r}; supported: default, llama3")
    return float(theta), {k: params[k] for k in ("factor", "low_freq_factor", "high_freq_factor",
                                                  "original_max_position_embeddings")}


def model_arch_info(cfg) -> ArchInfo:
    """Validated :class:`ArchInfo` of an HF config (any form :func:`load_hf_config` accepts)."""
    if isinstance(cfg, ArchInfo):
        return cfg
    cfg = load_hf_config(cfg)
    arch = architecture(cfg)
    heads = int(cfg.num_attention_heads)
    kv = int(getattr(cfg, "num_key_value_heads", None) or heads)
    if heads % kv:
        raise ValueError(f"num_attention_heads={heads} is not a multiple of num_key_value_heads={kv}")
    head_dim = int(getattr(cfg, "head_dim", None) or cfg.hidden_size // heads)
    if arch == "LlamaForCausalLM" and (getattr(cfg, "attention_bias", False) or getattr(cfg, "mlp_bias", False)):
        raise ValueError("Llama with attention_bias/mlp_bias is not supported")
    theta, scaling = _rope(cfg)
    return ArchInfo(
        architecture=arch, num_layers=int(cfg.num_hidden_layers), hidden_size=int(cfg.hidden_size),
        num_heads=heads, num_kv_heads=kv, head_dim=head_dim, ffn_hidden_size=int(cfg.intermediate_size),
        vocab_size=int(cfg.vocab_size), tied_embeddings=bool(getattr(cfg, "tie_word_embeddings", False)),
        qkv_bias=arch == "Qwen2ForCausalLM" or bool(getattr(cfg, "attention_bias", False)),
        qk_norm=arch == "Qwen3ForCausalLM", rms_norm_eps=float(cfg.rms_norm_eps), rope_theta=theta,
        rope_scaling=scaling, max_position_embeddings=int(getattr(cfg, "max_position_embeddings", 4096)))


def padded_vocab_size(cfg, tp: int = 1, divisible_by: int = VOCAB_DIVISIBLE_BY) -> int:
    """Vocab rounded up to a multiple of ``divisible_by * tp`` (Megatron-LM's rule)."""
    v, m = model_arch_info(cfg).vocab_size, divisible_by * tp
    return -(-v // m) * m


def validate_layout(cfg, tp: int = 1, pp: int = 1) -> None:
    """Raise ``ValueError`` when TP / PP do not divide the model's heads / KV heads / layers."""
    a = model_arch_info(cfg)
    if tp < 1 or pp < 1:
        raise ValueError(f"tp and pp must be >= 1, got tp={tp}, pp={pp}")
    for what, n in (("num_attention_heads", a.num_heads), ("num_key_value_heads", a.num_kv_heads),
                    ("intermediate_size", a.ffn_hidden_size)):
        if n % tp:
            raise ValueError(f"{what}={n} is not divisible by tensor parallel size {tp}")
    if a.num_layers % pp:
        raise ValueError(f"num_hidden_layers={a.num_layers} is not divisible by pipeline parallel size {pp}")


def check_model_layout(cfg) -> None:
    """The run config's ``parallel`` layout and ``model.recompute_num_layers`` against the model of
    ``model.hf_path`` (its ``config.json``): ``ValueError`` naming the key (``preflight_rules.check_config``)."""
    validate_layout(cfg.model.hf_path, cfg.parallel.tp, cfg.parallel.pp)
    layers = model_arch_info(cfg.model.hf_path).num_layers
    if layers % (cfg.parallel.pp * cfg.parallel.vpp):
        raise ValueError(f"num_hidden_layers={layers} is not divisible by parallel.pp x parallel.vpp = "
                         f"{cfg.parallel.pp} x {cfg.parallel.vpp} (each virtual stage holds the same number of layers)")
    per_stage = layers // cfg.parallel.pp
    if cfg.model.recompute == "full" and cfg.model.recompute_num_layers > per_stage:
        raise ValueError(f"model.recompute_num_layers={cfg.model.recompute_num_layers} exceeds the {per_stage} layers of a "
                         f"pipeline stage (num_hidden_layers / parallel.pp)")


def cuda_fusions(backend: str, cuda: bool | None = None, wgrad_ext: bool | None = None) -> dict[str, bool]:
    """The CUDA fusions a build turns on (all off on CPU, where the fused kernels do not exist):

    * ``bias_activation_fusion`` (SwiGLU in one kernel, megatron's ``bias_swiglu_impl``; with it the MLP
      keeps ~3f/t activations per token instead of ~5f/t, ``planning/memory.py activation_bytes``): on with CUDA;
    * ``apply_rope_fusion`` (Transformer Engine's fused RoPE): on with CUDA and ``backend="te"``;
    * ``gradient_accumulation_fusion`` (wgrad accumulated into ``main_grad`` inside the GEMM): on with
      CUDA, ``te`` and apex's ``fused_weight_gradient_mlp_cuda`` extension (``wgrad_ext``; None: look
      for it) — megatron's own output layer (a ``ColumnParallelLinear`` under the TE spec too) raises
      without it, and the pinned GPU stack does not install apex.
    """
    cuda = has_cuda() if cuda is None else cuda
    te = cuda and backend == "te"
    if wgrad_ext is None:
        wgrad_ext = importlib.util.find_spec("fused_weight_gradient_mlp_cuda") is not None
    return {"bias_activation_fusion": cuda, "apply_rope_fusion": te, "gradient_accumulation_fusion": te and wgrad_ext}


def recompute_overrides(recompute: str = "none", method: str = "uniform", num_layers: int = 1) -> dict:
    """``model.recompute*`` as Megatron ``TransformerConfig`` fields: none -> {}; selective ->
    ``recompute_granularity="selective"`` (Megatron's default module set: core attention); full ->
    ``recompute_granularity="full"`` with ``recompute_method`` (uniform | block) and ``recompute_num_layers``."""
    if recompute == "none":
        return {}
    if recompute == "selective":
        return {"recompute_granularity": "selective"}
    if recompute == "full":
        if method not in ("uniform", "block") or num_layers < 1:
            raise ValueError(f"full recompute needs method uniform|block and num_layers >= 1, got {method!r} / {num_layers}")
        return {"recompute_granularity": "full", "recompute_method": method, "recompute_num_layers": int(num_layers)}
    raise ValueError(f"model.recompute must be none|selective|full, got {recompute!r}")


def transformer_config_from_hf(cfg, *, tp: int = 1, pp: int = 1, sequence_parallel: bool = False,
                               params_dtype: torch.dtype = torch.float32, fp8: str | None = None,
                               **overrides):
    """Megatron ``TransformerConfig`` equivalent to the HF config, for a TP x PP layout.

    ``fp8``: ``None`` or a Transformer Engine fp8 format (``"e4m3"`` / ``"hybrid"``); GPU + TE only.
    ``overrides`` are passed through to ``TransformerConfig`` last (e.g. ``recompute_granularity``,
    the fusions of :func:`cuda_fusions`).

    ``use_cpu_initialization`` only without CUDA: on a GPU megatron creates each rank's shard on the
    device directly, with no full fp32 master copy of every weight in host memory at build time (the
    weights are overwritten by ``load_hf`` anyway).
    """
    from megatron.core.transformer import TransformerConfig  # lazy: defers megatron to the call

    a = model_arch_info(cfg)
    validate_layout(cfg, tp, pp)
    if fp8 is not None:
        if not has_cuda():
            raise ValueError("fp8 needs a CUDA GPU with Transformer Engine; set model.fp8=null on CPU")
    kw: dict[str, Any] = dict(
        num_layers=a.num_layers, hidden_size=a.hidden_size, num_attention_heads=a.num_heads,
        num_query_groups=a.num_kv_heads, kv_channels=a.head_dim, ffn_hidden_size=a.ffn_hidden_size,
        normalization="RMSNorm", layernorm_epsilon=a.rms_norm_eps, gated_linear_unit=True,
        activation_func=F.silu, add_bias_linear=False, add_qkv_bias=a.qkv_bias, qk_layernorm=a.qk_norm,
        hidden_dropout=0.0, attention_dropout=0.0, tensor_model_parallel_size=tp,
        pipeline_model_parallel_size=pp, sequence_parallel=sequence_parallel and tp > 1,
        params_dtype=params_dtype, pipeline_dtype=params_dtype, bf16=params_dtype == torch.bfloat16,
        fp16=params_dtype == torch.float16, batch_p2p_sync=False, use_cpu_initialization=not has_cuda(),
        apply_rope_fusion=False, bias_activation_fusion=False, masked_softmax_fusion=False,
        persist_layer_norm=False, gradient_accumulation_fusion=False)
    if fp8 is not None:
        kw.update(fp8=fp8, fp8_recipe="delayed")
    kw.update(overrides)
    return TransformerConfig(**kw)


def layer_spec(cfg, backend: str = "local"):
    """Layer spec: ``"local"`` (torch ops; CPU and GPU) or ``"te"`` (Transformer Engine; GPU only)."""
    a = model_arch_info(cfg)
    if backend == "local":
        from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec  # lazy: defers megatron to the call

        return get_gpt_layer_local_spec(qk_layernorm=a.qk_norm, normalization="RMSNorm")
    if backend == "te":
        err = te_import_error()
        if err is not None:
            raise ValueError(f"model.backend='te' needs Transformer Engine (requirements/gpu.txt) on a CUDA machine "
                             f"({err}); use backend='local' on CPU")
        from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_with_transformer_engine_spec  # lazy: defers megatron to the call

        return get_gpt_layer_with_transformer_engine_spec(qk_layernorm=a.qk_norm)
    raise ValueError(f"unknown layer backend {backend!r}; supported: local, te, auto")


def te_import_error() -> str | None:
    """Why Transformer Engine's PyTorch extension cannot be used here (None: it imports). Strict: the
    top-level ``transformer_engine`` package imports without its compiled torch extension (a wheel
    built for another torch, a CPU-only install), so the check imports ``transformer_engine.pytorch``."""
    try:
        import transformer_engine.pytorch  # noqa: F401  (lazy: the probe is the import itself)
    except Exception as e:   # ImportError, or an OSError / RuntimeError of a mismatched extension
        return f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}".rstrip(": ")
    return None


def _has_te() -> bool:
    return te_import_error() is None


def resolve_backend(backend: str = "auto", cuda: bool | None = None, te: bool | None = None) -> str:
    """``auto`` -> ``te`` when CUDA and Transformer Engine (``transformer_engine.pytorch``) are present,
    else ``local``. ``cuda`` / ``te``: what this machine has (None: ask it)."""
    if backend != "auto":
        return backend

    cuda = has_cuda() if cuda is None else cuda
    return "te" if cuda and (_has_te() if te is None else te) else "local"


def check_cp_backend(cp: int, backend: str, cuda: bool | None = None) -> None:
    """``parallel.cp`` > 1 runs only through Transformer Engine's THD context-parallel attention on CUDA
    (megatron's local attention has no CP path): one-line ``ValueError`` naming the key otherwise."""
    if cp <= 1:
        return
    cuda = has_cuda() if cuda is None else cuda
    if not cuda or backend != "te":
        why = "no CUDA device" if not cuda else f"model.backend resolves to {backend}"
        raise ValueError(f"parallel.cp={cp} needs CUDA + Transformer Engine (model.backend=te: TE's THD context-parallel "
                         f"attention; here: {why}); set parallel.cp=1")


def resolve_model_backend(backend: str = "auto", fp8: str | None = None, sequence_parallel: bool = False,
                          cuda: bool | None = None, te: bool | None = None) -> str:
    """The one layer backend a run builds (``local`` | ``te``), from ``model.backend`` and ``model.fp8``.

    Every consumer reads the value this returns (the actor and reference builders, the teacher's
    ``pack=auto`` rule), so the layers built and the decisions made about them cannot disagree.
    ``te`` needs CUDA and Transformer Engine; ``fp8`` needs ``te``. On CUDA the local spec cannot run
    sequence parallelism (megatron's ``WrappedTorchNorm`` asserts; the CPU patch
    ``cpu_megatron_norm_sp`` is a CPU-only fix), so ``auto`` falling back to ``local`` there is refused
    rather than left to assert in the first forward. A ``ValueError`` names the key. ``cuda`` / ``te``:
    what this machine has (None: ask it).
    """
    if backend not in ("auto", "local", "te"):
        raise ValueError(f"model.backend must be auto|local|te, got {backend!r}")
    cuda = has_cuda() if cuda is None else cuda
    te_err = (te_import_error() if te is None else None if te else "not installed")
    te = te_err is None
    resolved = resolve_backend(backend, cuda, te)
    if resolved == "te" and not (cuda and te):
        missing = "no CUDA device" if not cuda else f"transformer_engine.pytorch does not import: {te_err}"
        raise ValueError(f"model.backend=te needs a CUDA GPU with Transformer Engine ({missing} here); "
                         "use model.backend=local (or auto)")
    if fp8 is not None and resolved != "te":
        why = "no CUDA device" if not cuda else "Transformer Engine is not installed" if not te \
            else "model.backend=local"
        raise ValueError(f"model.fp8={fp8} needs the Transformer Engine backend on a CUDA GPU ({why}); "
                         "set model.fp8=null or model.backend=te on a GPU machine")
    if cuda and resolved == "local" and sequence_parallel:
        why = "model.backend=local" if backend == "local" else \
            f"model.backend=auto found no Transformer Engine ({te_err})"
        raise ValueError(f"parallel.sequence_parallel=true on CUDA needs the Transformer Engine layer spec, but {why}: "
                         "megatron's local norms assert under sequence parallelism on GPU; install the GPU stack "
                         "(requirements/gpu.txt) or set parallel.sequence_parallel=false")
    return resolved


#: bytes per S x S score element that megatron's local attention keeps per layer (the fp32 softmax output + its
#: cast to the model dtype) and one layer's (raw scores and their fp32 copy: ``attention_bytes``) with the persistent
#: score buffer (``buffer_bytes``): ``planning/memory.py`` derives them from megatron-core 0.16's ``DotProductAttention``
LOCAL_SCORE_BYTES = {"bf16": (6, 8), "fp32": (4, 8)}


def local_attention_bytes(cfg, *, tp: int, pp: int, tokens: int, row_len: int, bf16: bool) -> int:
    """Device bytes of the S x S scores megatron's local attention holds in one micro-batch of ``tokens`` token
    slots in rows of ``row_len`` (one pipeline stage of ``layers / pp`` layers, ``heads / tp`` heads per GPU)."""
    a = model_arch_info(cfg)
    keep, working = LOCAL_SCORE_BYTES["bf16" if bf16 else "fp32"]
    elements = tokens * row_len * (a.num_heads // tp)      # one layer's scores of the micro-batch
    return elements * (keep * (a.num_layers // pp) + working)


def check_local_attention(requested: str, resolved: str, need: int, device_bytes: int, te_err: str | None) -> str | None:
    """On a GPU, the layers building megatron's local attention (``resolved`` local) where its S x S scores
    (``need`` bytes, :func:`local_attention_bytes`) exceed the device (``device_bytes``) is refused in one line
    naming both numbers and, when ``model.backend=auto`` fell back, why Transformer Engine did not import. A
    fallback that fits returns the warning line to log (None otherwise); CPU (``device_bytes`` 0) passes."""
    if resolved != "local" or not device_bytes:
        return None
    why = (f"model.backend=auto found no Transformer Engine ({te_err}), so the layers use megatron's local attention"
           if requested == "auto" else "model.backend=local builds megatron's local attention")
    gib = f"{need / 2 ** 30:.1f} GiB of S x S attention scores per GPU"
    if need > device_bytes:
        raise ValueError(f"{why}: {gib} (6 B per element per layer, megatron-rl plan --attention local) exceed the "
                         f"device's {device_bytes / 2 ** 30:.1f} GiB; install Transformer Engine (requirements/gpu.txt) "
                         "or lower trainer.max_tokens_per_micro_batch / the sequence length, or raise parallel.tp / pp")
    return f"{why}: it holds {gib} (megatron-rl plan --attention local)" if requested == "auto" else None


def llama3_inv_freq(inv_freq: torch.Tensor, factor: float, low_freq_factor: float,
                    high_freq_factor: float, original_max_position_embeddings: int) -> torch.Tensor:
    """Llama-3 frequency scaling of RoPE inverse frequencies (Meta's Llama 3.1 formula).

    wavelength λ = 2π / f.  λ < L/hi: keep f;  λ > L/lo: f / factor;  otherwise blend with
    s = (L/λ − lo) / (hi − lo):  (1 − s)·f/factor + s·f, where L = original_max_position_embeddings.
    """
    wavelen = 2 * math.pi / inv_freq
    lo_wl, hi_wl = original_max_position_embeddings / low_freq_factor, original_max_position_embeddings / high_freq_factor
    s = (original_max_position_embeddings / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
    blended = (1 - s) * inv_freq / factor + s * inv_freq
    out = torch.where(wavelen > lo_wl, inv_freq / factor, inv_freq)
    medium = (wavelen >= hi_wl) & (wavelen <= lo_wl)
    return torch.where(medium, blended, out)


def build_gpt_model(cfg, config=None, *, pre_process: bool | None = None, post_process: bool | None = None,
                    backend: str = "auto", vp_stage: int | None = None, lora=None):
    """Build this rank's ``GPTModel`` chunk. ``pre_process``/``post_process`` default to whether
    this rank is the first / last pipeline stage. ``config`` defaults to
    :func:`transformer_config_from_hf` at the current TP/PP sizes. ``lora``: a ``models.lora.LoraSpec``
    whose adapters the layer spec builds into the targeted linears (None: none)."""
    from megatron.core import parallel_state as ps  # lazy: defers megatron to the call
    from megatron.core.models.gpt import GPTModel  # lazy: defers megatron to the call

    cfg = load_hf_config(cfg)
    a = model_arch_info(cfg)
    tp = ps.get_tensor_model_parallel_world_size() if ps.model_parallel_is_initialized() else 1
    if config is None:
        pp = ps.get_pipeline_model_parallel_world_size() if ps.model_parallel_is_initialized() else 1
        config = transformer_config_from_hf(cfg, tp=tp, pp=pp)
    if pre_process is None:
        pre_process = ps.is_pipeline_first_stage() if ps.model_parallel_is_initialized() else True
    if post_process is None:
        post_process = ps.is_pipeline_last_stage() if ps.model_parallel_is_initialized() else True
    spec = layer_spec(cfg, resolve_backend(backend))
    if lora is not None:
        from megatron_rl.models.lora import lora_layer_spec  # lazy: defers megatron to the call

        spec = lora_layer_spec(spec, lora)
    model = GPTModel(
        config, spec, vocab_size=padded_vocab_size(cfg, tp),
        max_sequence_length=a.max_position_embeddings, pre_process=pre_process, post_process=post_process,
        share_embeddings_and_output_weights=a.tied_embeddings, position_embedding_type="rope",
        rotary_percent=1.0, rotary_base=int(a.rope_theta), vp_stage=vp_stage)
    if a.rope_scaling is not None:
        rope = model.rotary_pos_emb
        rope.inv_freq = llama3_inv_freq(rope.inv_freq, **a.rope_scaling)
    return model
