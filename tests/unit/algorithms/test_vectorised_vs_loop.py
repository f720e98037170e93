"""The vectorised estimators equal a plain per-group loop (megatron_rl.algorithms.reference) on
random batches of 1,000+ groups with sizes 1..9, binary and graded rewards and shuffled ids."""
from __future__ import annotations

import pytest
import torch

from megatron_rl.algorithms import bicc_advantage, grpo_advantage, papo_advantage, rcc_advantage, rloo_advantage
from megatron_rl.algorithms.reference import bicc_loop, grpo_loop, papo_loop, rcc_loop, rloo_loop

D = torch.float64


def random_batch(seed: int, n_groups: int = 1200, binary: bool = True):
    gen = torch.Generator().manual_seed(seed)
    sizes = torch.randint(1, 10, (n_groups,), generator=gen)
    ids = torch.repeat_interleave(torch.randperm(10 * n_groups, generator=gen)[:n_groups] - 500, sizes)
    perm = torch.randperm(ids.numel(), generator=gen)
    ids = ids[perm]  # groups interleaved, ids not contiguous, some negative
    n = ids.numel()
    if binary:
        p = torch.rand(n_groups, generator=gen)[torch.unique(ids, return_inverse=True)[1]]
        r = (torch.rand(n, generator=gen) < p).to(D)
    else:
        r = torch.randint(0, 5, (n,), generator=gen).to(D) / 4  # graded, many ties
    delta = torch.randn(n, generator=gen, dtype=D) * 0.3
    process = torch.randint(0, 3, (n,), generator=gen).to(D) / 2
    return r, ids, delta, process


@pytest.mark.parametrize("binary", [True, False], ids=["binary", "graded"])
def test_grpo_family_matches_loop(binary):
    r, ids, _, _ = random_batch(1, binary=binary)
    assert torch.unique(ids).numel() >= 1000
    for scale in ("std", "none", "std_pop"):
        torch.testing.assert_close(grpo_advantage(r, ids, scale=scale), grpo_loop(r, ids, scale=scale),
                                   atol=1e-9, rtol=1e-9)
    torch.testing.assert_close(rloo_advantage(r, ids), rloo_loop(r, ids), atol=1e-9, rtol=1e-9)


def test_bicc_and_bicc_equals_population_grpo_on_binary():
    r, ids, _, _ = random_batch(2)
    a = bicc_advantage(r, ids)
    torch.testing.assert_close(a, bicc_loop(r, ids), atol=1e-12, rtol=0)
    torch.testing.assert_close(a, grpo_advantage(r, ids, scale="std_pop"), atol=1e-9, rtol=1e-9)


@pytest.mark.parametrize("binary", [True, False], ids=["binary", "graded"])
def test_rcc_matches_loop(binary):
    r, ids, delta, _ = random_batch(3, binary=binary)
    torch.testing.assert_close(rcc_advantage(r, delta, ids), rcc_loop(r, delta, ids), atol=1e-9, rtol=1e-9)


def test_papo_matches_loop():
    r, ids, _, process = random_batch(4)
    correct = r > 0.5
    torch.testing.assert_close(papo_advantage(r, process * r, correct, ids),
                               papo_loop(r, process * r, correct, ids), atol=1e-9, rtol=1e-9)


def test_float32_agrees_with_float64():
    r, ids, _, _ = random_batch(5)
    torch.testing.assert_close(grpo_advantage(r.float(), ids).double(), grpo_advantage(r, ids), atol=1e-5, rtol=1e-5)
