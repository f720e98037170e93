"""The rollout-engine interface: token ids in, token ids + sampling log-probs out.

Engines never see text: prompts are token-id lists (the trainer owns tokenisation), so vLLM runs
with ``skip_tokenizer_init=True`` and any tokenizer (HF or sentencepiece) works.

Log-probs: ``Completion.logprobs[t]`` is log μ(y_t | prefix) of the sampled token, where μ is the
distribution actually sampled from: logits / ``temperature``, then ``min_p``, ``top_k``, ``top_p``
truncation, renormalized (vLLM ``logprobs_mode="processed_logprobs"``; the HF engine applies the
same steps in the same order, ``rollout/hf_sampler.py``). An engine built with ``logprobs="full"``
reports the untruncated temperature-scaled log-prob instead (what the trainer computes); see
``rollout/hf_sampler.py`` for which to use and what the gate and the off-policy weight compare.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence
from typing import Protocol, runtime_checkable

import torch

from ..config_parse import check_truncation


@dataclasses.dataclass(frozen=True)
class SamplingParams:
    """Sampling settings for one ``generate`` call.

    Attributes:
        n: samples per prompt (the GRPO group size).
        temperature: softmax temperature (> 0; use a tiny value for greedy-like decoding or ``greedy``).
        top_p, top_k, min_p: nucleus / top-k / min-p truncation (1.0 / -1 / 0.0: off), applied
            after the temperature in vLLM's order (``algorithms/sampling.py``).
        max_tokens: response length cap (finish_reason "length" when hit).
        seed: base seed; prompt i uses ``seed + i`` so results do not depend on batching.
        stop_token_ids: tokens that end a response (included in the response ids).
        greedy: argmax decoding (evaluation); log-probs are then those of temperature 1.
    """

    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    min_p: float = 0.0
    max_tokens: int = 64
    seed: int | None = None
    stop_token_ids: tuple[int, ...] = ()
    greedy: bool = False

    def __post_init__(self):
        if self.n < 1:
            raise ValueError(f"n must be >= 1, got {self.n}")
        if self.max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {self.max_tokens}")
        if not self.greedy and not self.temperature > 0:
            raise ValueError(f"temperature must be > 0 (or greedy=True), got {self.temperature}")

        check_truncation(self.top_p, self.top_k, self.min_p)


@dataclasses.dataclass(frozen=True)
class Completion:
    """One sampled response. ``logprobs`` has one entry per ``response_ids`` token: a float32 numpy array
    from the vLLM engines (their flat log-probs, ``rollout/vllm_requests.py``: no Python object per
    token, one buffer through Ray's pickle), a tuple of floats from the others (same values, read the same
    way: index, iterate, ``len``; compare with ``list(...)``). ``versions`` (the weight version that sampled
    each token) from an engine with in-flight updates, empty from the others (every token of theirs was
    sampled by the weights the engine held for the whole call). Ids stay tuples (``prompt_ids +
    response_ids`` is a sequence, never an element-wise sum)."""

    prompt_index: int
    sample_index: int
    prompt_ids: tuple[int, ...]
    response_ids: tuple[int, ...]
    logprobs: Sequence[float]   # tuple[float, ...] | np.ndarray (float32)
    finish_reason: str  # "stop" | "length"
    versions: tuple[int, ...] = ()


@runtime_checkable
class RolloutEngine(Protocol):
    """What the trainer needs from an inference engine."""

    def generate(self, prompts: list[list[int]], sampling: SamplingParams) -> list[Completion]:
        """All ``n`` samples of every prompt, ordered by (prompt_index, sample_index)."""

    def score(self, sequences: list[list[int]], prompt_lens: list[int], temperature: float = 1.0) -> list[list[float]]:
        """Log-probs of the given response tokens ``sequences[i][prompt_lens[i]:]``."""

    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> int:
        """Load HF-named tensors (any subset of the model); returns the number loaded."""

    def sleep(self, level: int = 1) -> None:
        """Release the engine's memory while the trainer runs (``rollout.placement=colocated``), vLLM's
        levels: 1 = weights offloaded to host memory, KV cache discarded; 2 = weights discarded too
        (the next push must send every weight before the engine generates again)."""

    def wake(self, tags: tuple[str, ...] | None = None) -> None:
        """Re-allocate what ``sleep`` released: ``("weights",)`` before a weight push, ``("kv_cache",)``
        after it (so the KV cache and the push never coexist), ``None`` = both."""

    def shutdown(self) -> None:
        """Free everything."""


def validate_prompts(prompts: list[list[int]], max_model_len: int, max_tokens: int, vocab_size: int | None = None) -> None:
    """Raise ``ValueError`` naming the first bad prompt (empty, too long, out-of-vocab ids)."""
    if not prompts:
        raise ValueError("generate() called with no prompts")
    for i, p in enumerate(prompts):
        if len(p) == 0:
            raise ValueError(f"prompt {i} is empty")
        if len(p) + max_tokens > max_model_len:
            raise ValueError(f"prompt {i} has {len(p)} tokens; with max_tokens={max_tokens} it exceeds "
                             f"the engine's max_model_len={max_model_len}")
        if vocab_size is not None and (min(p) < 0 or max(p) >= vocab_size):
            raise ValueError(f"prompt {i} has token ids outside [0, {vocab_size})")
