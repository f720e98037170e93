"""Stage 2 of the update (``pipeline/update.py``): the log-prob passes and what compares them with the engine.

    Sampled.seqs ──> old (proximal) and reference log-probs, whole batch, once (no grad)
                     (``algo.off_policy=bypass``: old := the engine's, no pass)
    + Behaviour  ──> ``rollout/logprob_gap`` and the mismatch metrics (``algorithms/mismatch.py``), both under
                     the distribution the engines report (μ with ``rollout.logprobs=processed``)
"""
from __future__ import annotations

import time

import torch

from megatron_rl.algorithms import correction as C
from megatron_rl.algorithms import mismatch as M
from megatron_rl.algorithms import offpolicy as O
from megatron_rl.trainer.contract import Behaviour, LogProbs, PipelineRun, Sampled
from megatron_rl.trainer.pipeline.sequences import response_frame


def logprob_passes(run: PipelineRun, s: Sampled, beh: Behaviour) -> tuple[LogProbs, dict]:
    """Old and reference log-probs of the sampled sequences (no grad), the trainer<->engine
    agreement ``rollout/logprob_gap`` (mean |old − engine log-prob| over response tokens) and the
    mismatch metrics beside it (:func:`mismatch_inputs`), both under the distribution the
    engines report (μ with ``rollout.logprobs=processed``: truncation is not mismatch);
    ``rollout/outside_support_frac``: the share of response tokens outside the trainer's own kept set.
    ``algo.off_policy=bypass``: no old pass at all — old := the engine's log-probs (:func:`bypass_old`); no
    gap then, and the mismatch's ``token_mult_prob_error`` / ``gen_kl`` come from the first optimizer
    step's forward (``Objective``)."""
    t0 = time.perf_counter()
    mbs, cfg = run.micro, run.cfg
    recompute = C.correction_recomputes(cfg.algo.off_policy)
    mu = run.actor.sampling is not None          # μ truncates (``algorithms/sampling.py``)
    in_mu = mu and cfg.algo.ratio_space == "sampling"
    mu = in_mu or (mu and cfg.rollout.logprobs == "processed")   # μ is needed: the ratio's or the engines' space
    res = run.actor.forward_logprobs(s.seqs.batch, mbs, sampling=mu) if recompute else None
    ref_res = run.ref.forward_logprobs(s.seqs.batch, mbs, sampling=in_mu) if run.ref is not None else None
    ref_full = None if ref_res is None else (ref_res.sampling_logp if in_mu else ref_res.logp)
    ref = response_frame(ref_full, s.seqs) if ref_full is not None else None
    if not recompute:
        old_full, old = bypass_old(s, beh.logp)
        return LogProbs(old_full, ref_full, old, ref), {"time/logprobs": time.perf_counter() - t0}
    old_full = res.sampling_logp if in_mu else res.logp
    old = response_frame(old_full, s.seqs)
    processed = res.sampling_logp is not None and cfg.rollout.logprobs == "processed"
    engine_full = res.sampling_logp if processed else res.logp
    other = engine_full is not old_full
    lp = LogProbs(old_full, ref_full, old, ref, response_frame(engine_full, s.seqs) if other else None,
                  engine_full if other else None)
    cmp, mask = lp.engine_space, s.seqs.resp_mask
    metrics = {"rollout/logprob_gap": logprob_gap(cmp, beh.logp, mask), **mismatch_inputs(cfg, cmp, mask, beh)}
    if mu:
        outside = (1.0 - response_frame(res.sampling_kept, s.seqs)) * mask
        metrics["rollout/outside_support_frac"] = float(outside.sum() / mask.sum().clamp_min(1))
    return lp, {**metrics, "time/logprobs": time.perf_counter() - t0}


def bypass_old(s: Sampled, gen: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """π_old := π_rollout: the engine's log-probs in the response frame ``[N, R]`` (0 off the mask)
    and scattered to the target frame ``[N, S-1]`` (0 at non-response positions); ``gen``: the engine
    frame (``Behaviour.logp``; None: built from the rollouts)."""
    m = s.seqs.resp_mask
    old = (O.behaviour_matrix(s.ro.rollout_logp, m) if gen is None else gen) * m
    n, s_len = s.seqs.batch.tokens.shape
    full = torch.zeros((n, s_len - 1), dtype=old.dtype).scatter_add_(1, s.seqs.resp_pos, old)
    return full, old


def logprob_gap(old: torch.Tensor, engine, mask: torch.Tensor) -> float:
    """Mean |trainer − engine| log-prob over valid response tokens (``rollout/logprob_gap``): the
    trainer's forward puts each token where the engine sampled it, and both agree on the model.
    ``engine``: the engines' log-probs as a frame like ``old`` (``Behaviour.logp``) or ragged lists."""
    roll = engine if isinstance(engine, torch.Tensor) else O.behaviour_matrix(engine, old)
    return float(((old - roll).abs() * mask).sum() / mask.sum().clamp_min(1))


def correction_band(cfg) -> tuple[float, float]:
    """The ratio band [L, U] the mismatch metrics count tokens beyond: the registered mode's own
    thresholds (``algo.correction``), else [1/C, C] with C = ``algo.tis_cap`` (verl's default lower)."""
    corr = cfg.algo.correction
    band = corr.band() if corr is not None else None
    return band if band is not None else (1.0 / cfg.algo.tis_cap, cfg.algo.tis_cap)


def mismatch_inputs(cfg, old: torch.Tensor, mask: torch.Tensor, beh: Behaviour) -> dict:
    """The train–inference mismatch metrics of the batch (``algorithms/mismatch.py``): trainer = ``old``
    (the recomputed log-probs), engine = ``beh.logp``; split by sample staleness when the run is
    asynchronous (``rollout.max_staleness`` > 0), and with per-token versions (partial rollouts) also
    ``_fresh`` / ``_stale`` over TOKENS by their own version."""
    band = correction_band(cfg)
    if beh.token_stale is None:
        return M.split_mismatch_metrics(old, beh.logp, mask, beh.stale, band, split=cfg.rollout.max_staleness > 0)
    res = M.split_mismatch_metrics(old, beh.logp, mask, beh.stale, band)
    for name, sel in (("fresh", beh.token_stale == 0), ("stale", beh.token_stale > 0)):
        part = mask * sel.to(mask.dtype)
        if bool(part.sum() > 0):
            res.update({f"rollout/{k}_{name}": float(v) for k, v in
                        M.mismatch_metrics(old.double(), beh.logp.double(), part, band).items()})
    return res
