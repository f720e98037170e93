"""Weight sync stage: stream the trainer's HF-named weights to the engines, and the start-up gate.

``sync(run)`` is collective over the trainer: every rank drives ``convert.stream_hf_tensors`` (TP
shards gathered per tensor by the owning PP stage, sent point-to-point to rank 0); rank 0 (the Ray
driver) wraps it with its metadata (``convert.hf_tensor_meta``: known without gathering) in a
``RoundSource`` and hands it to ``RolloutClient.update_weights``, which packs it bucket by bucket
(``rollout.bucket_mb``) into vLLM's weight-transfer API. Nothing of the round outlives it.

``startup_gate(run)`` (after the first sync): the engines greedily complete a fixed probe batch
(the first prompts of the training set), then the engines (``score``) and the trainer
(``forward_logprobs``) both compute the log-probs of those completions at temperature 1; if the
mean |difference| exceeds ``rollout.logprob_gate`` the run stops with both numbers. The per-step
``rollout/logprob_gap`` metric keeps watching afterwards.
"""
from __future__ import annotations

import logging

import torch

log = logging.getLogger("megatron_rl.sync")

PROBE_PROMPTS = 8


class LogProbGateError(RuntimeError):
    """The trainer and the engines disagree on the log-probs right after a weight sync."""


def sync(run) -> None:
    """Collective: one full weight push from the trainer's shards to every engine."""
    push(run.actor, run.client if run.info.is_driver else None, run.cfg.rollout.bucket_mb << 20)


def push(actor, client, bucket_bytes: int) -> int | None:
    """Collective: stream ``actor``'s weights; ``client`` (a ``RolloutClient``, rank 0 only; None
    elsewhere) sends them. Returns the new weight version on rank 0."""
    from megatron_rl.convert import hf_tensor_meta, stream_hf_tensors

    models = actor.bare_models()
    stream = stream_hf_tensors(models, actor.hf_cfg, sender=0)
    if client is None:
        for _ in stream:
            pass
        return None
    from megatron_rl.rollout.weight_sync import RoundSource, param_meta

    dtype = next(models[0].parameters()).dtype
    meta = [param_meta(n, d, s) for n, d, s in hf_tensor_meta(actor.hf_cfg, dtype)]
    return client.update_weights(RoundSource(meta, stream), bucket_bytes=bucket_bytes)


#: rollout.logprob_gate=null: the gate of each trainer precision (config.py says why)
AUTO_GATE = {"fp32": 1e-2, "bf16": 5e-2}


def gate_threshold(cfg) -> float:
    """``rollout.logprob_gate`` in force: the value, or the precision's :data:`AUTO_GATE` (``model.bf16``)."""
    if cfg.rollout.logprob_gate is not None:
        return float(cfg.rollout.logprob_gate)
    return AUTO_GATE["bf16" if cfg.model.bf16 else "fp32"]


def startup_gate(run) -> dict:
    """Collective: compare engine vs trainer log-probs on the probe batch; raise above the gate."""
    from megatron_rl.rollout.engine import SamplingParams
    from megatron_rl.trainer.rollout_stage import broadcast_object
    from megatron_rl.trainer.update_stage import build_seq_batch, response_frame

    probe = None
    if run.info.is_driver:
        idx = list(range(min(PROBE_PROMPTS, len(run.train_set))))
        prompts = [list(run.train_set[i].prompt_ids) for i in idx]
        sp = SamplingParams(greedy=True, max_tokens=run.cfg.rollout.max_tokens, seed=run.cfg.trainer.seed)
        resps = [list(c.response_ids) for c in run.client.generate(prompts, sp)]
        eng = run.client.score([p + r for p, r in zip(prompts, resps)], [len(p) for p in prompts], 1.0)
        probe = (prompts, resps, eng)
    prompts, resps, eng = broadcast_object(probe)
    sb = build_seq_batch(prompts, resps, run.tok.pad_id, run.seq_len(prompts, resps), max(len(r) for r in resps))
    mine = response_frame(run.actor.forward_logprobs(sb.batch, run.micro, temperature=1.0).logp, sb)
    theirs = torch.zeros_like(mine)
    for i, lp in enumerate(eng):
        theirs[i, :len(lp)] = torch.tensor(lp, dtype=theirs.dtype)
    diff = (mine - theirs).abs() * sb.resp_mask
    gap = {"gate/logprob_gap_mean": float(diff.sum() / sb.resp_mask.sum().clamp_min(1)),
           "gate/logprob_gap_max": float(diff.max()), "gate/tokens": int(sb.resp_mask.sum())}
    thr = gate_threshold(run.cfg)
    if gap["gate/logprob_gap_mean"] > thr:
        raise LogProbGateError(
            f"start-up gate: trainer vs engine log-probs differ by {gap['gate/logprob_gap_mean']:.3g} on average "
            f"(max {gap['gate/logprob_gap_max']:.3g}) over {gap['gate/tokens']} probe tokens, above "
            f"rollout.logprob_gate={thr:g}; the weight sync or the engine's numerics are wrong")
    log.info("start-up gate passed: mean |trainer - engine| log-prob %.3g (max %.3g) <= %g",
             gap["gate/logprob_gap_mean"], gap["gate/logprob_gap_max"], thr)
    return gap
