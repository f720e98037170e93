"""HF ``transformers`` rollout engine: the no-vLLM fallback and the independent reference in tests.

Sampling is plain ancestral sampling with a KV cache from the processed distribution (temperature,
min-p, top-k, top-p in vLLM's order: ``rollout/sampling.py``); log-probs are those of that
distribution (``logprobs="processed"``) or of the untruncated temperature-scaled one (``"full"``), like
:class:`~megatron_rl.rollout.vllm_engine.VLLMEngine`. Eager attention for exact parity.
"""
from __future__ import annotations

from collections.abc import Iterable

import torch

from .engine import Completion, SamplingParams, validate_prompts
from .sampling import LOGPROB_MODES, processed_logits


class HFEngine:
    """``RolloutEngine`` on ``AutoModelForCausalLM`` (CPU or one GPU)."""

    def __init__(self, model_dir: str, *, dtype: str = "float32", seed: int = 0, max_model_len: int = 512,
                 logprobs: str = "processed", **_):
        from transformers import AutoModelForCausalLM

        if logprobs not in LOGPROB_MODES:
            raise ValueError(f"logprobs must be one of {LOGPROB_MODES}, got {logprobs!r}")
        self.logprobs = logprobs

        self.model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=getattr(torch, dtype),
                                                          attn_implementation="eager").eval()
        self.max_model_len = max_model_len
        self.seed = seed
        cfg = self.model.config
        self.vocab_size = cfg.vocab_size
        self.eos = cfg.eos_token_id if isinstance(cfg.eos_token_id, list) else [cfg.eos_token_id]
        self.pad = cfg.pad_token_id if cfg.pad_token_id is not None else self.eos[0]

    @torch.no_grad()
    def _one(self, prompt: list[int], s: SamplingParams, gen: torch.Generator) -> tuple[list[int], list[float], str]:
        stops = set(s.stop_token_ids) | {e for e in self.eos if e is not None}
        ids = torch.tensor([prompt])
        out = self.model(ids, use_cache=True)
        past, logits = out.past_key_values, out.logits[0, -1]
        resp, lps = [], []
        for _ in range(s.max_tokens):
            if s.greedy:
                logp = torch.log_softmax(logits.float(), -1)
                tok = int(logp.argmax())
            else:
                logp = torch.log_softmax(processed_logits(logits, s.temperature, s.top_k, s.top_p, s.min_p), -1)
                tok = int(torch.multinomial(logp.exp(), 1, generator=gen))
                if self.logprobs == "full":
                    logp = torch.log_softmax(logits.float() / s.temperature, -1)
            resp.append(tok)
            lps.append(float(logp[tok]))
            if tok in stops:
                return resp, lps, "stop"
            out = self.model(torch.tensor([[tok]]), past_key_values=past, use_cache=True)
            past, logits = out.past_key_values, out.logits[0, -1]
        return resp, lps, "length"

    def generate(self, prompts: list[list[int]], sampling: SamplingParams) -> list[Completion]:
        validate_prompts(prompts, self.max_model_len, sampling.max_tokens, self.vocab_size)
        res = []
        for i, p in enumerate(prompts):
            gen = torch.Generator().manual_seed((sampling.seed if sampling.seed is not None else self.seed) + i)
            for j in range(sampling.n):
                r, lp, fin = self._one(list(p), sampling, gen)
                res.append(Completion(i, j, tuple(p), tuple(r), tuple(lp), fin))
        return res

    @torch.no_grad()
    def score(self, sequences: list[list[int]], prompt_lens: list[int], temperature: float = 1.0) -> list[list[float]]:
        res = []
        for s, n in zip(sequences, prompt_lens):
            logits = self.model(torch.tensor([s])).logits[0].float() / temperature
            logp = torch.log_softmax(logits, -1)
            res.append([float(logp[t - 1, s[t]]) for t in range(n, len(s))])
        return res

    @torch.no_grad()
    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> int:
        params = dict(self.model.named_parameters())
        n = 0
        for name, t in named_tensors:
            if name not in params:
                if name == "lm_head.weight" and self.model.config.tie_word_embeddings:
                    continue
                raise KeyError(f"HF engine: unknown weight {name!r}")
            params[name].copy_(t.to(params[name].dtype))
            n += 1
        return n

    def named_parameters(self) -> dict[str, torch.Tensor]:
        return {n: p.detach().clone() for n, p in self.model.named_parameters()}

    def weight_transfer(self, method: str, **kwargs):
        """The object-store (``ray`` backend) side of vLLM's weight-transfer lifecycle (the ``ray`` backend), so the
        HF fallback is driven exactly like a vLLM engine; other backends are refused at start-up."""
        if method == "update_weights":
            from .weight_sync import unpack_update

            return self.update_weights(unpack_update(kwargs["update_info"]))
        if method in ("init_weight_transfer_engine", "start_weight_update", "finish_weight_update",
                      "shutdown_weight_transfer_engine"):
            return None
        if method == "stats":
            return {}
        raise ValueError(f"HF engine: unknown weight-transfer method {method!r}")

    def sleep(self) -> None:
        return None

    def wake(self) -> None:
        return None

    def shutdown(self) -> None:
        del self.model


def make_engine(kind: str, model_dir: str, **kwargs):
    """``"vllm"`` (default) or ``"hf"``."""
    if kind == "vllm":
        from .vllm_engine import VLLMEngine

        return VLLMEngine(model_dir, **kwargs)
    if kind == "hf":
        return HFEngine(model_dir, **kwargs)
    raise ValueError(f"unknown rollout engine {kind!r}; supported: vllm, hf")
