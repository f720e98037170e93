"""Shared builders for the algorithm tests: a random, fully populated AlgoInputs (float64)."""
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
