"""The one objective builder of the trainer: what ``PolicyActor.train_step`` calls per micro-batch.

    gather (response frame) -> AlgoInputs -> algorithms.objective_terms (registered loss ->
    ONE aggregation as sum / normaliser -> ONE KL rule) -> (S, D, metrics)

Every method trains through this class, RLCSD and SCoRe included; the aggregation and the KL rule
are documented once in :mod:`megatron_rl.algorithms.objective`. ``partial_aggregate`` (the formula
table) lives in :mod:`megatron_rl.algorithms.losses` and is re-exported here.

Inputs (``algorithms/inputs.py``'s registry; no method's input is named here): every extras entry
named like a registered input is passed through; an input registered with a ``policy`` source is
gathered from the actor's target frame ``[n, S-1]`` at the positions ``extras[spec.index]`` when the
micro-batch has them — ``"logp"`` from the log-probs (``logp`` at ``resp_pos``, the mask being
``resp_mask``), ``"support"`` from the log-probs at the top-k support, present when the loss declared
one (``register_policy_loss(..., support=...)``: the ids in ``extras["support_idx"]``,
:attr:`Objective.support_key`, the declared protocol the actor reads).

Metrics: the loss's own metrics are means over the micro-batch (``losses`` contract), logged as
``(value · w, w)`` with the aggregation's weight — rows with any mask token for the seq-mean modes,
mask tokens otherwise — so the step shows the global mean (zero-mask rows weigh nothing); names ``<loss>_x`` become
``<loss>/x``, names with a ``/`` stay, others get ``actor/``. ``actor/kl_loss`` is the KL term as it
enters the loss; ``rollout/token_mult_prob_error`` and ``rollout/gen_kl`` token means with ``mismatch``
(bypass: see :class:`Objective`); ``actor/entropy`` is a token mean; an input registered with a
``diagnostic`` adds its metrics whenever it is present.
"""
from __future__ import annotations

from typing import Protocol, runtime_checkable

import torch

from megatron_rl.algorithms import AlgoInputs, algo_kind, loss_support, objective_terms
from megatron_rl.algorithms.inputs import input_names, input_spec, is_input
from megatron_rl.algorithms.losses import PartialLoss, partial_aggregate
from megatron_rl.algorithms.mismatch import gen_kl, token_mult_prob_error

__all__ = ["Objective", "PartialLoss", "SupportObjective", "partial_aggregate"]

_OWN = ("mask", "step")      #: inputs the objective sets itself (``resp_mask``, the step)


def _rows(mask: torch.Tensor) -> torch.Tensor:
    """Rows with at least one mask token (float): the rows the seq-mean aggregations count; zero-mask
    rows (padding copies, packed fillers, filtered samples) weigh nothing in any metric."""
    return (mask.reshape(mask.shape[0], -1).sum(-1) > 0).sum().to(torch.float64)


@runtime_checkable
class SupportObjective(Protocol):
    """A loss function that needs the policy's log-probs at a top-k support: ``support_key`` names
    the ``mb.extras`` entry of vocabulary ids ``[n, S-1, k]`` (None: no support); the actor then
    calls ``fn(logp, entropy, mb, support)`` with ``support [n, S-1, k]`` gathered with gradient."""

    support_key: str | None

    def __call__(self, logp, entropy, mb, support=None): ...


class Objective:
    """Per-micro-batch objective of kind ``kind`` for one optimizer step on ``batch`` (the GLOBAL
    batch handed to ``train_step``: its response tokens and its rows with any response token are the
    whole-batch normalisers of the KL rule and of the KL metric; zero-mask padding rows count in neither)."""

    def __init__(self, kind: str, hp, batch, step: int | None = None, mismatch: bool = False):
        self.kind, self.hp, self.step = kind, hp, step
        #: ``algo.off_policy=bypass``, first optimizer step of the RL step: ``old_logp`` IS the engine's
        #: log-probs and ``logp`` the policy before any update, so the trainer-vs-engine mismatch metrics
        #: (``algorithms/mismatch.py``) come from this forward instead of the skipped old-log-prob pass
        self.mismatch = mismatch
        self.loss = algo_kind(kind).loss
        self.support_key = "support_idx" if loss_support(self.loss) else None
        self.batch_tokens = float(batch.extras["resp_mask"].sum())
        self.batch_rows = max(1, int(_rows(batch.extras["resp_mask"])))

    def inputs(self, logp, mb, support=None) -> AlgoInputs:
        """The micro-batch's AlgoInputs (gathers in the module docstring)."""
        from megatron_rl.trainer.policy.vocab_parallel import with_tail

        ex = mb.extras
        kw = {k: v for k, v in ex.items() if is_input(k) and k not in _OWN and input_spec(k).policy is None}
        for spec in map(input_spec, input_names()):
            idx = ex.get(spec.index) if spec.policy is not None else None
            if idx is None:
                continue
            if spec.policy == "logp":
                kw[spec.name] = logp.gather(1, idx)
            elif support is not None:       # "support": the loss declared one
                kw[spec.name] = with_tail(support.gather(1, idx[..., None].expand(-1, -1, support.shape[-1])))
        return AlgoInputs(mask=ex["resp_mask"], step=self.step, **kw)

    def __call__(self, logp, entropy, mb, support=None):
        x = self.inputs(logp, mb, support)
        t = objective_terms(self.kind, x, mb.extras["advantages"], self.hp, batch_tokens=self.batch_tokens)
        m = x.mask
        n_tok = m.sum()
        mode = self.hp.loss_agg_mode     # loss metrics averaged with the aggregation's weights
        w = _rows(t.mask) if mode in ("seq-mean-token-mean", "seq-mean-token-sum") else t.mask.sum()
        metrics = {self._name(k): (v.detach().double() * w, w) for k, v in t.metrics.items()}
        share = t.normaliser if t.normaliser is not None else _rows(m) / self.batch_rows
        metrics["actor/kl_loss"] = (t.kl_sum.detach(), share)
        if entropy is not None:
            metrics["actor/entropy"] = ((entropy.gather(1, mb.extras["resp_pos"]) * m).sum().detach(), n_tok)
        if self.mismatch and x.old_logp is not None:
            lp, gen = x.logp.detach().double(), x.old_logp.double()
            metrics["rollout/token_mult_prob_error"] = (token_mult_prob_error(lp, gen, m) * n_tok, n_tok)
            metrics["rollout/gen_kl"] = (gen_kl(lp, gen, m) * n_tok, n_tok)
        for name in sorted(x):
            diagnostic = input_spec(name).diagnostic
            if diagnostic is not None:
                metrics.update(diagnostic(x))
        return t.loss_sum, t.normaliser, metrics

    def _name(self, k: str) -> str:
        if "/" in k:
            return k
        if k.startswith(self.loss + "_"):
            return f"{self.loss}/{k[len(self.loss) + 1:]}"
        return f"actor/{k}"
