"""A reward value that carries why it was given (``Verdict``): a ``float``, so every caller that sums,
compares or tensors rewards keeps working; the reward manager reads ``reason`` for its counters."""
from __future__ import annotations

#: reasons a verifier gives; ``timeout`` is not a verdict (retried once, counted, never cached)
REASONS = ("matched", "mismatch", "no answer found", "timeout", "degenerate", "hedged", "contradiction", "")


class Verdict(float):
    """``Verdict(score, reason)``: the score as a float with its reason (one of :data:`REASONS`)."""

    __slots__ = ("reason",)

    def __new__(cls, score: float, reason: str = ""):
        v = super().__new__(cls, score)
        v.reason = reason
        return v

    def __reduce__(self):
        return (Verdict, (float(self), self.reason))

    def __repr__(self) -> str:
        return f"Verdict({float(self)!r}, {self.reason!r})"


def reason_of(v) -> str:
    """The reason of a reward value ("" for a plain float)."""
    return getattr(v, "reason", "")
