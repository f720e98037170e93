"""Shared builders for the algorithm tests: a random, fully populated AlgoInputs (float64); ``t`` /
``close`` / ``gid`` (float64 tensor, atol-1e-6 comparison, one group of n); ``random_batch``: 1,000+
groups of sizes 1..9, binary or graded rewards, shuffled non-contiguous ids (for the loop checks)."""
from __future__ import annotations

import torch

from megatron_rl.algorithms import AlgoInputs, topk_tail_support

D = torch.float64


def random_inputs(seed: int = 0, n_groups: int = 3, g: int = 4, t: int = 5, k_neg: int = 2, vocab: int = 7,
                  k: int = 3, logp: torch.Tensor | None = None, student_logits: torch.Tensor | None = None) -> AlgoInputs:
    """Every optional field set; rewards mix correct/incorrect in each group."""
    gen = torch.Generator().manual_seed(seed)
    n = n_groups * g

    def rnd(*shape, scale=1.0):
        return torch.randn(*shape, generator=gen, dtype=D) * scale

    rewards = (torch.arange(n) % g < (torch.arange(n) // g) % (g - 1) + 1).to(D)  # 1..g-1 correct per group
    mask = torch.ones(n, t, dtype=D)
    mask[0, -2:] = 0
    mask[5, -1:] = 0
    base = -torch.rand(n, t, generator=gen, dtype=D) * 2 - 0.05
    logp = base.clone() if logp is None else logp
    s_logits = rnd(n, t, vocab) if student_logits is None else student_logits
    t_logits = rnd(n, t, vocab)
    w_logits = rnd(n, t, vocab)
    t_sup, s_sup, w_sup = topk_tail_support(t_logits, s_logits, w_logits, k=k)
    p = torch.softmax(t_logits, -1)
    return AlgoInputs(
        rewards=rewards, group_ids=torch.arange(n) // g, mask=mask, logp=logp,
        old_logp=base + rnd(n, t, scale=0.1), ref_logp=base + rnd(n, t, scale=0.3),
        tis_weights=torch.rand(n, t, generator=gen, dtype=D) + 0.5, token_rewards=None,
        greedy_rewards=torch.full((n,), 0.5, dtype=D), process=torch.rand(n, generator=gen, dtype=D) * rewards,
        correct=rewards > 0.5, delta=None, teacher_logp=base + rnd(n, t, scale=0.5),
        teacher_neg_logp=base[:, None] + rnd(n, k_neg, t, scale=0.5),
        teacher_neg_mask=torch.tensor([[True] * k_neg] * (n - 1) + [[True] + [False] * (k_neg - 1)]),
        student_topk=s_sup if student_logits is None else None, teacher_topk=t_sup, teacher_neg_topk=w_sup,
        teacher_entropy=-(p * p.log()).sum(-1), first_logp=base.flip(-1).clone(), first_ref_logp=base.flip(-1) + 0.1,
        first_mask=mask.flip(-1).clone(), first_rewards=rewards.flip(0).clone(), step=3)


def t(x):
    return torch.tensor(x, dtype=D)


def close(a, b, atol=1e-6):
    torch.testing.assert_close(a, t(b) if not isinstance(b, torch.Tensor) else b, atol=atol, rtol=0)


def gid(n):
    return torch.zeros(n, dtype=torch.long)


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
