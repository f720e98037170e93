"""The policy objective of every registered method, defined once (pure; the trainer's per-micro-batch
builder ``trainer/pipeline/objective.py`` and the full-batch :func:`compute_policy_loss` both call it).

    registered loss  ->  one aggregation (sum / normaliser)  ->  + β · KL  ->  (S, D)

Aggregation: :func:`~.losses.partial_aggregate` with ``hp.loss_agg_mode`` (on the loss's own mask
for :class:`~.losses.MaskedLossOutput`). The step minimises ``Σ S / Σ D`` over all micro-batches and
DP ranks, so micro-batch and DP invariance holds by construction.

KL rule (one for every method; ``β = hp.kl_loss_coef``, ``k = kl_penalty(logp, ref_logp, hp.kl_loss_type)``
per response token, mask ``m`` = the response mask):

* ``loss_agg_mode`` other than ``token-sum``: the KL is aggregated with the SAME mode and shares the
  policy loss's normaliser D:  ``S = S_pg + β · S_kl``,  so L = pg + β · aggregate(k, m, mode);
* ``token-sum`` (losses that carry their own normalisers, RLCSD): the KL is a token mean over the
  WHOLE mini-batch, ``S = S_pg + β · Σ k m / N_tok`` with ``N_tok`` the mini-batch's response tokens
  (``batch_tokens``; the tensors' own count in a full-batch call).

``actor/kl_loss`` logs exactly the KL term that enters the loss (before β). This is the rule verl
applies to its KL loss (``agg_loss(kl, mask, loss_agg_mode)``, docs/methods/self-distillation.md) and the rule the RLCSD
family's launchers use with token-mean; it replaces the earlier teacher-path rule that added a
token-SUM KL under any mode (e.g. RLSD with ``seq-mean-token-mean`` divided it by rows while the
metric showed a token mean). Default recipes are unchanged by it: their KL is either off or paired
with ``token-mean``.
"""
from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor

from .builtin import algo_kind
from .inputs import AlgoInputs
from .kl import kl_penalty
from .losses import PartialLoss, finish_aggregate, partial_aggregate
from .registry import _LOSSES, _lookup, check_inputs, get_policy_loss


class ObjectiveTerms(NamedTuple):
    """One (micro-)batch's share: ``loss_sum`` S = pg_sum + β·kl_sum, ``normaliser`` D (None: no
    division), the two parts, the loss's raw metrics (0-d) and the mask they were aggregated on."""

    loss_sum: Tensor
    normaliser: Tensor | None
    pg_sum: Tensor
    kl_sum: Tensor
    metrics: dict
    mask: Tensor


def loss_needs(name: str, hp) -> set:
    """Registered inputs the kind's loss reads at update time (``logp``/``ref_logp`` with the KL on)."""
    need = _lookup(_LOSSES, "policy loss", algo_kind(name).loss).needs_for(hp)
    return need | ({"logp", "ref_logp"} if hp.kl_loss_coef > 0 else set())


def objective_terms(name: str, x: AlgoInputs, advantages: Tensor, hp, *,
                    batch_tokens: float | Tensor | None = None) -> ObjectiveTerms:
    """Registered loss of kind ``name`` -> aggregation -> KL rule (module docstring). ``batch_tokens``:
    the whole mini-batch's response-token count (only read with ``token-sum``)."""
    k = algo_kind(name)
    check_inputs(x, loss_needs(name, hp), f"policy loss {k.loss!r}")
    out = get_policy_loss(k.loss)(x, advantages, hp)
    mask = out.mask if len(out) > 2 else x.mask
    pg = partial_aggregate(out.loss_mat, mask, hp.loss_agg_mode, scale_factor=hp.loss_scale_factor)
    kl = pg.loss_sum.new_zeros(())
    if hp.kl_loss_coef > 0:
        kl_mat = kl_penalty(x.logp, x.ref_logp, hp.kl_loss_type)
        if hp.loss_agg_mode == "token-sum":
            n = x.mask.sum() if batch_tokens is None else torch.as_tensor(batch_tokens, dtype=kl_mat.dtype)
            kl = partial_aggregate(kl_mat, x.mask, "token-sum").loss_sum / n.clamp_min(1)
        else:
            kl = partial_aggregate(kl_mat, x.mask, hp.loss_agg_mode, scale_factor=hp.loss_scale_factor).loss_sum
    return ObjectiveTerms(pg.loss_sum + hp.kl_loss_coef * kl, pg.normaliser, pg.loss_sum, kl, out.metrics, mask)


class PolicyObjective(NamedTuple):
    """loss: scalar to backward; pg_loss / kl_loss: its parts; metrics: 0-d tensors."""

    loss: Tensor
    pg_loss: Tensor
    kl_loss: Tensor
    metrics: dict


def compute_policy_loss(name: str, inputs: AlgoInputs, advantages: Tensor, hp=None) -> PolicyObjective:
    """The objective of kind ``name`` on one whole batch: :func:`objective_terms` divided once."""
    hp = hp if hp is not None else algo_kind(name).hparams()
    t = objective_terms(name, inputs, advantages, hp)
    pg = finish_aggregate(PartialLoss(t.pg_sum, t.normaliser))
    kl = finish_aggregate(PartialLoss(t.kl_sum, t.normaliser))
    metrics = {**t.metrics, "pg_loss": pg.detach(), "kl_loss": kl.detach()}
    return PolicyObjective(pg + hp.kl_loss_coef * kl, pg, kl, metrics)
