"""What both vLLM engines (``vllm``, ``vllm-async``) send vLLM for one prompt and read back from a sample
(``generate``) or a scored sequence (``score``: the prompt log-probs, :func:`score_params` / :func:`prompt_logprobs`).

A request asks for the sampled token's log-prob only (``logprobs=0``) in vLLM's flat format
(``flat_logprobs=True``, ``vllm/logprobs.py`` ``FlatLogprobs``): per request a few flat Python lists
instead of a ``{token_id: Logprob}`` dict per position. vLLM's sampler puts the sampled token first at
each position (``Sampler.gather_logprobs``: the sampled token, then the top ``logprobs``) and its output
processor keeps ``1 + logprobs`` entries per position, so with ``logprobs=0`` the flat lists hold exactly
one entry per position, the sampled token: :func:`sampled_logprobs` checks that (the flat ``token_ids``
equal the response's ids) and returns them as one float32 array — the same fp32 values the dict path
reports (vLLM's fp32 log-probs through ``tolist``), ``tests/e2e/test_rollout_vllm.py``.
"""
from __future__ import annotations

import numpy as np

from .engine import SamplingParams


def request_params(s: SamplingParams, i: int, logprobs_mode: str, **extra):
    """vLLM ``SamplingParams`` for prompt ``i`` of a ``generate`` call (seed ``s.seed + i``; temperature 0
    when greedy); ``logprobs_mode`` is the engine's ``rollout.logprobs`` (``full`` needs temperature 1:
    vLLM takes raw log-probs before the temperature); ``extra``: further vLLM fields (``output_kind``)."""
    from vllm import SamplingParams as VSP  # lazy: defers vllm to the call

    if logprobs_mode == "full" and not s.greedy and s.temperature != 1.0:
        raise ValueError(f"logprobs='full' on vLLM needs temperature 1 (its raw log-probs are taken before "
                         f"temperature), got {s.temperature}")
    return VSP(n=s.n, temperature=0.0 if s.greedy else s.temperature, top_p=s.top_p, top_k=s.top_k,
               min_p=s.min_p, max_tokens=s.max_tokens, seed=None if s.seed is None else s.seed + i, logprobs=0,
               flat_logprobs=True, stop_token_ids=list(s.stop_token_ids), detokenize=False, ignore_eos=False,
               **extra)


def sampling_refusal(s: SamplingParams, logprobs_mode: str = "processed") -> tuple[str, str] | None:
    """What vLLM itself refuses or changes in ``s`` (its ``SamplingParams`` validation, the installed
    version's own limits: e.g. ``temperature must be in [0, 2]`` in 0.32), as ``(field, vLLM's words)``;
    None when vLLM takes ``s`` as given. A temperature below vLLM's floor (0.01 in 0.32) is not refused
    by vLLM but raised to the floor with a log line, so the engine would sample at another temperature
    than the trainer scores: reported too. The start-up checks call this through the engine's declared
    ``EngineCaps.sampling_check`` before anything starts (a bad value failed after a 51-s start-up)."""
    from vllm.exceptions import VLLMValidationError  # lazy: defers vllm to the call

    try:
        vp = request_params(s, 0, logprobs_mode)
    except VLLMValidationError as e:
        return e.parameter or "", str(e.args[0] if e.args else e).rstrip(".")
    except ValueError as e:
        return "", str(e)
    if not s.greedy and vp.temperature != s.temperature:
        return "temperature", (f"vLLM raises a temperature below {vp.temperature:g} to {vp.temperature:g} (it would "
                               f"sample at {vp.temperature:g} while the trainer scores at {s.temperature:g})")
    return None


def sampled_logprobs(c, ids: list[int]) -> np.ndarray:
    """float32 log-prob of each sampled token of vLLM's ``CompletionOutput`` ``c`` (response ``ids``),
    from its flat log-probs (module docstring); anything but one entry per position, the sampled
    token, is an error naming what came back."""
    flat = c.logprobs
    tok = getattr(flat, "token_ids", None)
    if tok is None:
        raise RuntimeError(f"vLLM returned log-probs as {type(flat).__name__}, not its flat format "
                           "(flat_logprobs=True was not honoured)")
    if len(flat.logprobs) != len(ids) or tok != ids:
        raise RuntimeError(f"vLLM's flat log-probs hold {len(flat.logprobs)} entries for a {len(ids)}-token response "
                           "or not the sampled tokens (expected one per position, logprobs=0)")
    return np.asarray(flat.logprobs, dtype=np.float32)


def score_params(temperature: float):
    """vLLM ``SamplingParams`` of ``score``: one token generated, each prompt token's own log-prob
    (``prompt_logprobs=0``) in the flat format, as :func:`request_params`."""
    from vllm import SamplingParams as VSP  # lazy: defers vllm to the call

    return VSP(max_tokens=1, prompt_logprobs=0, flat_logprobs=True, detokenize=False, temperature=temperature)


def prompt_logprobs(out, seq: list[int], start: int) -> list[float]:
    """The log-probs of ``seq[start:]`` from vLLM's ``RequestOutput`` ``out`` of ``seq`` scored with
    :func:`score_params`: one flat entry per prompt position (none at position 0), the prompt's own token;
    anything else is an error naming what came back."""
    flat = out.prompt_logprobs
    tok = getattr(flat, "token_ids", None)
    if tok is None:
        raise RuntimeError(f"vLLM returned prompt log-probs as {type(flat).__name__}, not its flat format "
                           "(flat_logprobs=True was not honoured)")
    a, b = flat.start_indices[start:len(seq)], flat.end_indices[start:len(seq)]
    if len(a) != len(seq) - start or any(e - s != 1 for s, e in zip(a, b)) or [tok[i] for i in a] != list(seq[start:]):
        raise RuntimeError(f"vLLM's flat prompt log-probs do not hold one entry per position, the prompt's own token "
                           f"(positions {start}..{len(seq) - 1} of a {len(seq)}-token sequence)")
    return [flat.logprobs[i] for i in a]
