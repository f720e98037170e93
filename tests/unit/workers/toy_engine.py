"""Adding a rollout engine = one module plus its registration, loaded from outside the package through
the config's ``plugins:`` key (its directory on ``PYTHONPATH``, as a user's own module)::

    PYTHONPATH=DIR megatron-rl train --config ... plugins=[toy_engine] rollout.engine=toy_torch

A small real engine: ``transformers``' model, ancestral sampling token by token (the whole sequence
re-run each token: no KV cache, so nothing derived from the weights outlives a call), the package's
sampling transform (temperature, min-p, top-k, top-p: ``megatron_rl.rollout.hf_sampler``), real token
ids and log-probs. It accepts the ``ray`` weight transport only (``CAPS``): each packed bucket is
unpacked and copied into the parameters, so the trainer's driver needs no engine library.

With ``$TOY_ENGINE_OUT`` set, every push it receives ends by writing ``push_<k>.safetensors`` there
(the parameters right after push ``k``), and every process that imports this module writes
``modules_<pid>.json`` at exit ({argv, vllm imported?}): read by ``tests/unit/rollout/test_engine_plugin.py``.
"""
from __future__ import annotations

import atexit
import json
import os
import sys
from pathlib import Path

import torch

from megatron_rl.rollout import Completion, EngineCaps, register_engine
from megatron_rl.rollout.engine import validate_prompts
from megatron_rl.rollout.hf_sampler import sample_step
from megatron_rl.rollout.weight_sync import unpack_update

OUT = os.environ.get("TOY_ENGINE_OUT")


def _report_modules() -> None:
    Path(OUT, f"modules_{os.getpid()}.json").write_text(json.dumps({"argv": sys.argv, "vllm": "vllm" in sys.modules}))


if OUT:
    atexit.register(_report_modules)


@register_engine("toy_torch")
class ToyTorchEngine:
    """``RolloutEngine`` on ``AutoModelForCausalLM``, one token per full forward (fp32, eager attention)."""

    CAPS = EngineCaps(transports={"ray": "bucket"})

    def __init__(self, model_dir: str, *, dtype: str = "float32", seed: int = 0, max_model_len: int = 512,
                 logprobs: str = "processed", weight_transfer: str = "bucket"):
        from transformers import AutoModelForCausalLM

        if weight_transfer != "bucket" or logprobs not in ("processed", "full"):
            raise ValueError(f"toy_torch: weight_transfer={weight_transfer!r}, logprobs={logprobs!r} not supported")
        self.model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=getattr(torch, dtype),
                                                          attn_implementation="eager").eval()
        self.seed, self.max_model_len, self.full = seed, max_model_len, logprobs == "full"
        eos = self.model.config.eos_token_id
        self.eos = set(eos if isinstance(eos, list) else [eos]) - {None}
        self.pushes = 0

    @torch.no_grad()
    def _sample(self, prompt: list[int], s, gen: torch.Generator) -> tuple[list[int], list[float], str]:
        ids, resp, lps = list(prompt), [], []
        for _ in range(s.max_tokens):
            logits = self.model(torch.tensor([ids])).logits[0, -1].float()
            if s.greedy:
                logp = torch.log_softmax(logits, -1)
                tok = int(logp.argmax())
                lp = float(logp[tok])
            else:
                tok, lp = sample_step(logits, s.temperature, s.top_k, s.top_p, s.min_p,
                                      "full" if self.full else "processed", gen)
            ids.append(tok)
            resp.append(tok)
            lps.append(lp)
            if tok in self.eos or tok in s.stop_token_ids:
                return resp, lps, "stop"
        return resp, lps, "length"

    def generate(self, prompts: list[list[int]], sampling) -> list[Completion]:
        validate_prompts(prompts, self.max_model_len, sampling.max_tokens, self.model.config.vocab_size)
        out = []
        for i, p in enumerate(prompts):
            gen = torch.Generator().manual_seed((self.seed if sampling.seed is None else sampling.seed) + i)
            for j in range(sampling.n):
                r, lp, fin = self._sample(p, sampling, gen)
                out.append(Completion(i, j, tuple(p), tuple(r), tuple(lp), fin))
        return out

    @torch.no_grad()
    def score(self, sequences: list[list[int]], prompt_lens: list[int], temperature: float = 1.0) -> list[list[float]]:
        res = []
        for s, n in zip(sequences, prompt_lens):
            logp = torch.log_softmax(self.model(torch.tensor([s])).logits[0].float() / temperature, -1)
            res.append([float(logp[t - 1, s[t]]) for t in range(n, len(s))])
        return res

    @torch.no_grad()
    def update_weights(self, named_tensors) -> int:
        params, n = dict(self.model.named_parameters()), 0
        for name, t in named_tensors:
            if name not in params and name == "lm_head.weight" and self.model.config.tie_word_embeddings:
                continue
            params[name].copy_(t)   # KeyError on a name this model does not have
            n += 1
        return n

    def weight_transfer(self, method: str, **kwargs):
        """The receiving side of the ``ray`` transport (vLLM's weight-transfer lifecycle, by name)."""
        if method == "update_weights":
            return self.update_weights(unpack_update(kwargs["update_info"]))
        if method == "finish_weight_update":
            self.pushes += 1
            if OUT:
                from safetensors.torch import save_file

                save_file(self.hf_named_parameters(), str(Path(OUT, f"push_{self.pushes}.safetensors")))
            return None
        if method in ("init_weight_transfer_engine", "start_weight_update", "shutdown_weight_transfer_engine"):
            return None
        if method == "stats":
            return {}
        raise ValueError(f"toy_torch: unknown weight-transfer method {method!r}")

    def hf_named_parameters(self) -> dict[str, torch.Tensor]:
        return {n: p.detach().clone().contiguous() for n, p in self.model.named_parameters()}

    def named_parameters(self) -> dict[str, torch.Tensor]:
        return self.hf_named_parameters()

    def sleep(self, level: int = 1) -> None:
        raise RuntimeError("toy_torch cannot sleep (CAPS.sleep=never: rollout.placement=colocated is refused at start-up)")

    def wake(self, tags=None) -> None:
        raise RuntimeError("toy_torch cannot sleep, so it has nothing to wake")

    def shutdown(self) -> None:
        del self.model
