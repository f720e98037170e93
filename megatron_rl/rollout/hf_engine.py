"""HF ``transformers`` rollout engine: the no-vLLM fallback and the independent reference in tests.

Sampling is plain ancestral sampling with a KV cache from the processed distribution (temperature,
min-p, top-k, top-p in vLLM's order: ``rollout/hf_sampler.py``); log-probs are those of that
distribution (``logprobs="processed"``) or of the untruncated temperature-scaled one (``"full"``), like
:class:`~megatron_rl.rollout.vllm_engine.VLLMEngine`. Eager attention for exact parity.
"""
from __future__ import annotations

import ctypes
import gc
from collections.abc import Iterable

import torch

from .weight_sync import unpack_update
from ..runtime.device import empty_cache

from .engine import Completion, SamplingParams, validate_prompts
from .registry import EngineCaps, register_engine
from ..config_parse import LOGPROB_MODES
from .hf_sampler import sample_step

INPROC = "inproc"   # this engine's receiving side: a packed bucket unpacked and copied into the parameters


@register_engine("hf")
class HFEngine:
    """``RolloutEngine`` on ``AutoModelForCausalLM`` (CPU or one GPU).

    ``CAPS``: the ``ray`` transport only (buckets from the object store, copied in-process by
    :meth:`weight_transfer`; no vLLM anywhere); its sleep frees the weights on any machine; no tensor
    parallelism; none of the vLLM-only ``rollout.*`` arguments."""

    CAPS = EngineCaps(transports={"ray": INPROC}, sleep="always")

    def __init__(self, model_dir: str, *, dtype: str = "float32", seed: int = 0, max_model_len: int = 512,
                 logprobs: str = "processed", device: str = "cpu", weight_transfer: str = INPROC):
        from transformers import AutoModelForCausalLM  # lazy: defers transformers to the call

        if weight_transfer != INPROC:
            raise ValueError(f"HF engine: weight_transfer must be {INPROC!r} (CAPS.transports), got {weight_transfer!r}")
        if logprobs not in LOGPROB_MODES:
            raise ValueError(f"logprobs must be one of {LOGPROB_MODES}, got {logprobs!r}")
        self.logprobs = logprobs

        self.model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=getattr(torch, dtype),
                                                          attn_implementation="eager").eval().to(device)
        self.device = torch.device(device)
        self.max_model_len = max_model_len
        self.seed = seed
        cfg = self.model.config
        self.vocab_size = cfg.vocab_size
        self.eos = cfg.eos_token_id if isinstance(cfg.eos_token_id, list) else [cfg.eos_token_id]
        self.pad = cfg.pad_token_id if cfg.pad_token_id is not None else self.eos[0]
        self._asleep: set[str] = set()      # "weights" / "kv_cache" while released (sleep / wake)
        self._unloaded: set[str] = set()    # weights still to push after a level-2 sleep
        self._level, self._shapes, self._host = 0, {}, {}

    @torch.no_grad()
    def _one(self, prompt: list[int], s: SamplingParams, gen: torch.Generator) -> tuple[list[int], list[float], str]:
        stops = set(s.stop_token_ids) | {e for e in self.eos if e is not None}
        ids = torch.tensor([prompt], device=self.device)
        out = self.model(ids, use_cache=True)
        past, logits = out.past_key_values, out.logits[0, -1]
        resp, lps = [], []
        for _ in range(s.max_tokens):
            if s.greedy:
                logp = torch.log_softmax(logits.float(), -1)
                tok = int(logp.argmax())
                lp = float(logp[tok])
            else:
                tok, lp = sample_step(logits, s.temperature, s.top_k, s.top_p, s.min_p, self.logprobs, gen)
            resp.append(tok)
            lps.append(lp)
            if tok in stops:
                return resp, lps, "stop"
            out = self.model(torch.tensor([[tok]], device=self.device), past_key_values=past, use_cache=True)
            past, logits = out.past_key_values, out.logits[0, -1]
        return resp, lps, "length"

    def generate(self, prompts: list[list[int]], sampling: SamplingParams) -> list[Completion]:
        validate_prompts(prompts, self.max_model_len, sampling.max_tokens, self.vocab_size)
        self._check_awake()
        res = []
        for i, p in enumerate(prompts):
            gen = torch.Generator().manual_seed((sampling.seed if sampling.seed is not None else self.seed) + i)
            for j in range(sampling.n):
                r, lp, fin = self._one(list(p), sampling, gen)
                res.append(Completion(i, j, tuple(p), tuple(r), tuple(lp), fin))
        return res

    @torch.no_grad()
    def score(self, sequences: list[list[int]], prompt_lens: list[int], temperature: float = 1.0) -> list[list[float]]:
        self._check_awake()
        res = []
        for s, n in zip(sequences, prompt_lens):
            logits = self.model(torch.tensor([s], device=self.device)).logits[0].float() / temperature
            logp = torch.log_softmax(logits, -1)
            res.append([float(logp[t - 1, s[t]]) for t in range(n, len(s))])
        return res

    @torch.no_grad()
    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> int:
        if "weights" in self._asleep:
            raise RuntimeError("HF engine: weights pushed while asleep; wake(('weights',)) first")
        params = dict(self.model.named_parameters())
        n = 0
        for name, t in named_tensors:
            if name not in params:
                if name == "lm_head.weight" and self.model.config.tie_word_embeddings:
                    continue
                raise KeyError(f"HF engine: unknown weight {name!r}")
            params[name].copy_(t.to(params[name].dtype))
            self._unloaded.discard(name)
            n += 1
        return n

    def named_parameters(self) -> dict[str, torch.Tensor]:
        """Host copies of the parameters (a GPU engine's leave the device: no second copy on it, no CUDA
        tensors through Ray)."""
        return {n: p.detach().to("cpu", copy=True) for n, p in self.model.named_parameters()}

    def hf_named_parameters(self) -> dict[str, torch.Tensor]:
        """Host copies of the parameters (this engine's names are the HF names)."""
        return {n: p.detach().to("cpu", copy=True) for n, p in self.model.named_parameters()}

    def reset_caches(self) -> None:
        """Nothing derived from the weights outlives a call here: the KV cache is built per prompt inside
        ``generate`` and dropped with it, so a push leaves no stale state (the end of every push calls this,
        as on :class:`~megatron_rl.rollout.vllm_engine.VLLMEngine`)."""
        return None

    def weight_transfer(self, method: str, **kwargs):
        """The receiving side of the ``ray`` transport (``INPROC``), with vLLM's weight-transfer lifecycle so
        the HF fallback is driven exactly like a vLLM engine: each bucket is unpacked and copied into the
        parameters; other transports are refused at start-up (``CAPS``)."""
        if method == "update_weights":
            return self.update_weights(unpack_update(kwargs["update_info"]))
        if method == "finish_weight_update":
            return self.reset_caches()
        if method in ("init_weight_transfer_engine", "start_weight_update", "shutdown_weight_transfer_engine"):
            return None
        if method == "stats":
            return {}
        raise ValueError(f"HF engine: unknown weight-transfer method {method!r}")

    # -- colocation (rollout.placement=colocated, trainer/loop/colocate.py) ---------------------------------
    # The engine's cache is per call (nothing survives a generate), so sleep is about the weights. Each
    # parameter's storage is swapped for an empty tensor (shape, dtype and device kept to restore it);
    # tied parameters are one Parameter, so they are freed and restored once. Buffers (rotary tables)
    # are small and stay. Level 1 keeps a host copy (a CUDA engine's weights move to pinned CPU memory;
    # a CPU engine's already are host memory, so there it releases nothing); level 2 keeps nothing and
    # the next push restores the weights — the colocated loop re-sends every weight each step anyway.

    def _check_awake(self) -> None:
        if self._unloaded:
            raise RuntimeError(f"HF engine: {len(self._unloaded)} weight(s) not pushed since a level-2 sleep "
                               f"(e.g. {min(self._unloaded)}): push every weight before generating")
        if self._asleep:
            raise RuntimeError(f"HF engine is asleep ({', '.join(sorted(self._asleep))}): wake it before generating")

    def sleep(self, level: int = 1) -> None:
        if level not in (1, 2):
            raise ValueError(f"sleep level must be 1 or 2, got {level}")
        if self._asleep:
            return
        self._level, self._shapes, self._host = level, {}, {}
        with torch.no_grad():
            for name, p in self.model.named_parameters():
                self._shapes[name] = (p.shape, p.dtype, p.device)
                if level == 1:
                    host = p.data if p.device.type == "cpu" else p.data.to("cpu").pin_memory()
                    self._host[name] = host
                p.data = torch.empty(0, dtype=p.dtype, device=p.device)
        self._asleep = {"weights", "kv_cache"}
        _release_freed_memory()

    def wake(self, tags: tuple[str, ...] | None = None) -> None:
        tags = ("weights", "kv_cache") if tags is None else tuple(tags)
        if unknown := set(tags) - {"weights", "kv_cache"}:
            raise ValueError(f"wake tags must be weights and/or kv_cache, got {sorted(unknown)}")
        if "weights" in tags and "weights" in self._asleep:
            with torch.no_grad():
                for name, p in self.model.named_parameters():
                    shape, dtype, device = self._shapes[name]
                    p.data = self._host[name].to(device) if self._level == 1 else torch.empty(shape, dtype=dtype, device=device)
            if self._level == 2:
                self._unloaded = set(self._shapes)
            self._host, self._shapes = {}, {}
            self._asleep.discard("weights")
        if "kv_cache" in tags:   # per-call cache: nothing to re-allocate, only the state to clear
            self._asleep.discard("kv_cache")

    def shutdown(self) -> None:
        del self.model


def _release_freed_memory() -> None:
    """Hand freed host memory back to the OS: glibc keeps freed heap chunks for reuse (and raises its
    mmap threshold after large frees, so weight-sized blocks end up on the heap), which would hide the
    release from the process's RSS — the memory the other tenants of the machine see."""
    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):   # not glibc: nothing to trim
        pass

    empty_cache()
