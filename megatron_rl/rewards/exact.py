"""Exact-match verifier for the synthetic tasks (``reverse``, ``addition``)."""
from __future__ import annotations


def exact_match(response: str, ground_truth: str) -> float:
    """1.0 iff the response (whitespace-stripped) equals the ground truth exactly."""
    return 1.0 if response.strip() == str(ground_truth).strip() else 0.0
