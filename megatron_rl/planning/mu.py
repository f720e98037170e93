"""The μ pass's memory in ``megatron-rl plan`` (formulas: ``planning/memory.py``'s docstring, "The sampling
distribution μ"): the working set of ``trainer/policy/vocab_parallel.py`` ``vocab_parallel_sampled_logprobs`` and
what it adds to a stage's peak. Pure arithmetic: no torch."""
from __future__ import annotations

import math

from megatron_rl.planning.units import DTYPE_BYTES

# ``arch`` is a ``planning.arch.ArchSpec`` and ``inp`` a ``planning.memory.PlanInputs`` below (not imported:
# memory.py imports this module)

#: the μ pass's sizes (``algorithms/sampling.py`` CHUNK_BYTES, CANDIDATES, TIE_SLACK: no torch import here;
#: ``tests/unit/test_plan.py`` pins them to the code's)
MU_CHUNK_BYTES = 256 * 2**20
MU_CANDIDATES = 512
MU_TIE_SLACK = 32
MU_ROW_MASS_BYTES = 5          # per element of a forward chunk (top-p without top-k): exp (fp32) + min-p's mask
MU_LOCAL_BYTES = 12            # per candidate of a shard: its value (fp32) + top-k's int64 position
MU_GATHERED_BYTES = 32         # per gathered candidate (t·C a row): all-gather copy, sort (fp32 + int64), rules' temps
MU_BACKWARD_BYTES = 9          # per element of a backward chunk: exp(z − log Z) + its temporary (fp32), the masks
MU_ROW_BYTES = 12              # per token: the kept set's bound, tie weight and normaliser (fp32)


def sampling_truncates(inp, vocab: int) -> bool:
    """Whether the engines' sampling drops tokens (``SamplingSpec.truncates``): the trainer then scores under μ."""
    return inp.min_p > 0.0 or inp.top_p < 1.0 or 0 < inp.top_k < vocab


def sampling_bytes(arch, inp, padded_v: int) -> int:
    """The μ pass's working set on the last stage (module docstring), 0 when the sampling does not truncate."""
    if not sampling_truncates(inp, arch.vocab):
        return 0
    e = DTYPE_BYTES[inp.dtype]
    n, w = math.ceil(inp.micro_batch_tokens / inp.cp), padded_v // inp.tp
    rows = min(n, max(1, MU_CHUNK_BYTES // (4 * w)))
    c = inp.top_k + MU_TIE_SLACK if inp.top_k > 0 else MU_CANDIDATES
    row_mass = inp.top_p < 1.0 and inp.top_k <= 0
    forward = rows * (MU_ROW_MASS_BYTES * w * row_mass + MU_LOCAL_BYTES * c + MU_GATHERED_BYTES * inp.tp * c)
    if inp.ratio_space != "sampling":
        return MU_ROW_BYTES * n + forward
    backward = n * w * e + rows * w * (MU_BACKWARD_BYTES + (4 if e < 4 else 0))
    return MU_ROW_BYTES * n + max(forward, backward)


def sampling_peak_bytes(arch, inp, padded_v: int, mu: int) -> int:
    """What the μ pass adds to the stage's peak. ``ratio_space=sampling``: its whole working set, in the training
    forward and backward. ``full``: it runs in the no-grad log-prob passes after the full softmax has freed its
    temporaries, beside the logits shard and its fp32 copy, so it adds only what exceeds the softmax's two fp32
    temporaries (``z - max``, ``exp``): max(0, μ − 8·T·V/t)."""
    if inp.ratio_space == "sampling":
        return mu
    tokens = math.ceil(inp.micro_batch_tokens / inp.cp)
    return max(0, mu - 8 * tokens * (padded_v // inp.tp))
