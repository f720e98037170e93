"""Weight sync stage: stream the trainer's HF-named weights to the engines, the start-up gate, and
the verification of weight swaps (``rollout.verify_sync``).

``sync(run)`` is collective over the trainer: every rank drives ``convert.stream_hf_tensors`` (TP
shards gathered per tensor by the owning PP stage, sent point-to-point to rank 0); rank 0 (the Ray
driver) wraps it with its metadata (``convert.hf_tensor_meta``: known without gathering) in a
``RoundSource`` and hands it to ``RolloutClient.update_weights``, which packs it bucket by bucket
(``rollout.bucket_mb``) into vLLM's weight-transfer API. Nothing of the round outlives it.

``startup_gate(run)`` (after the first sync): the engines greedily complete a fixed probe batch
(:func:`probe_prompts`: the first prompts of the training set and two prompts sharing a prefix of
several KV blocks), the trainer (``forward_logprobs``) recomputes the log-probs of those
completions at temperature 1 and compares them with the ones the engines reported while
generating; if the mean |difference| exceeds ``rollout.logprob_gate`` the run stops with both
numbers. The per-step ``rollout/logprob_gap`` metric keeps watching afterwards.

``verify_push(run, step)`` (``rollout.verify_sync``: ``first`` | ``every:N`` | ``never``): after a
training push, the same probe (the gate's machinery, :func:`probe_gap`), held to the trainer
dtype's tolerance (:data:`TOLERANCE`), and every engine's parameters compared with the trainer's
HF export, tensor by tensor, bit for bit (:func:`weight_mismatches`). Right before a verified push
the engines run the probe once more (:func:`warm_probe`), so its shared prefix sits in their
prefix caches under the OLD weights: a push that left those KV blocks behind cannot pass. The
engine log-probs are the ones ``generate`` reported, never ``score``'s: vLLM skips the prefix cache
for prompt log-probs (``SamplingParams.skip_reading_prefix_cache``), so a score could not see a
stale cache. A failure is one line naming the step, the numbers and the first differing tensors;
the loop stops at the step boundary after checkpointing (``loop._train_steps``).

``lora.push: adapter``: :func:`push_adapter` sends only the LoRA adapters (``convert.peft_adapter.gather_adapters``:
full PEFT-named tensors on rank 0, collective) and PEFT's adapter config; the engines (built with vLLM's LoRA
support) install them as the next version (``RolloutClient.update_adapter``). Verification is the same
probe, and the parameter comparison becomes the adapters' (:func:`adapter_mismatches`: every engine's
loaded adapter against the trainer's, bit for bit); the base is never pushed (it is the model dir's, frozen).
"""
from __future__ import annotations

import logging

import torch

from megatron_rl.convert import hf_tensor_meta, stream_hf_tensors
from megatron_rl.rollout.engine import SamplingParams
from megatron_rl.rollout.weight_sync import RoundSource, param_meta
from megatron_rl.runtime.broadcast import broadcast_object
from megatron_rl.trainer.pipeline.sequences import response_frame, sequences

log = logging.getLogger("megatron_rl.sync")

PROBE_PROMPTS = 8
PROBE_PREFIX = 400   # tokens of the probe's shared prefix: 25 KV blocks of 16 (GPU), 3 of vLLM-CPU's 128

#: Sync verification tolerance on |trainer − engine| log-prob of the probe tokens, (mean, max), by the
#: trainer's dtype. fp32: both sides round at 2^-24; different kernels and summation orders give
#: ~1e-7 mean / <1e-5 max here (vLLM-CPU vs Megatron: tests/distributed/test_weight_transport.py,
#: tests/e2e/test_verify_sync.py), so 1e-3 / 1e-2 leaves 100x for GPU kernels and deeper models.
#: Measured faults on the tiny e2e policy: stale prefix-cache KV 8.7e-3 mean, q/k rows swapped 7e-2,
#: one skipped tensor 2.9e-3, a bf16 engine 1.5e-3 — the last two only just above the bound, which
#: is why the parameters are compared too (they name those tensors whatever the log-probs say).
#: bf16: 8 mantissa bits round each op at 2^-9 and the logits of trainer and engine differ by ~1e-2
#: (NeMo-RL reads a token_mult_prob_error of 1.01-1.02, i.e. mean |Δ| ~0.01-0.02, as healthy at
#: equal precision): 5e-2 mean / 1.0 max on greedy probe tokens, far below a mis-mapped weight (~1).
TOLERANCE = {"float32": (1e-3, 1e-2), "bfloat16": (5e-2, 1.0)}


class LogProbGateError(RuntimeError):
    """The trainer and the engines disagree on the log-probs right after a weight sync."""


def verify_due(spec: str, step: int, verified: int) -> bool:
    """Whether the push that ends ``step`` is verified under ``rollout.verify_sync`` = ``spec``, with
    ``verified`` pushes verified so far in this process: ``first`` (the first training push of the
    process, also after a resume), ``every:N`` (that one and every N-th step's), ``never``."""
    if spec == "never":
        return False
    if verified == 0:
        return True
    return spec.startswith("every:") and step % int(spec.split(":", 1)[1]) == 0


def adapter_push(cfg) -> bool:
    """Whether the run pushes adapters only (``lora.enable`` and ``lora.push: adapter``)."""
    return bool(cfg.lora.enable) and cfg.lora.push == "adapter"


def sync(run) -> None:
    """Collective: one weight push from the trainer's shards to every engine (the adapters only with
    ``lora.push: adapter``; else the full merged weights)."""
    client = run.client if run.info.is_driver else None
    if adapter_push(run.cfg):
        push_adapter(run.actor, client, base_model=run.cfg.model.hf_path)
    else:
        push(run.actor, client, run.cfg.rollout.bucket_mb << 20)


def push_adapter(actor, client, base_model: str = "") -> int | None:
    """Collective: gather ``actor``'s LoRA adapters (PEFT names, fp32, full tensors) to rank 0, whose
    ``client`` sends them with PEFT's adapter config. Returns the new weight version on rank 0."""
    from megatron_rl.convert.peft_adapter import (  # lazy: LoRA runs only
        adapter_config,
        gather_adapters,
    )

    tensors = gather_adapters(actor.bare_models())
    if client is None:
        return None
    return client.update_adapter(tensors, adapter_config(actor.lora, base_model))


def push(actor, client, bucket_bytes: int) -> int | None:
    """Collective: stream ``actor``'s weights; ``client`` (a ``RolloutClient``, rank 0 only; None
    elsewhere) sends them. Returns the new weight version on rank 0."""
    models = actor.bare_models()
    stream = stream_hf_tensors(models, actor.hf_cfg, sender=0)
    if client is None:
        for _ in stream:
            pass
        return None

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


def probe_prompts(prompts: list[list[int]], max_model_len: int, max_tokens: int) -> list[list[int]]:
    """The fixed probe batch: the first :data:`PROBE_PROMPTS` ``prompts`` and two prompts that share a
    prefix of up to :data:`PROBE_PREFIX` tokens (the training prompts' own ids, repeated) followed by
    the first two prompts; the prefix shrinks to what ``max_model_len`` leaves after the response."""
    rows = [list(p) for p in prompts[:PROBE_PROMPTS]]
    tails = rows[:2] if len(rows) > 1 else rows * 2
    room = min(PROBE_PREFIX, max_model_len - max_tokens - max(len(t) for t in tails))
    pool = [t for r in rows for t in r]
    if room < 1 or not pool:
        return rows
    prefix = (pool * (room // len(pool) + 1))[:room]
    return rows + [prefix + t for t in tails]


def _probe_set(run) -> tuple[list[list[int]], object]:
    r = run.cfg.rollout
    idx = list(range(min(PROBE_PROMPTS, len(run.train_set))))
    prompts = probe_prompts([list(run.train_set[i].prompt_ids) for i in idx], r.max_model_len, r.max_tokens)
    return prompts, SamplingParams(greedy=True, max_tokens=r.max_tokens, seed=run.cfg.trainer.seed)


def warm_probe(run) -> None:
    """Driver: the engines generate the probe once (before a verified push), so its shared prefix is
    in their prefix caches under the weights about to be replaced."""
    if run.info.is_driver:
        prompts, sp = _probe_set(run)
        run.client.generate(prompts, sp)


def probe_gap(run) -> dict:
    """Collective: the engines greedily complete the probe (driver), the trainer recomputes the
    log-probs of those tokens at temperature 1; mean / max |trainer − engine| and the token count."""
    probe = None
    if run.info.is_driver:
        prompts, sp = _probe_set(run)
        comps = run.client.generate(prompts, sp)
        probe = (prompts, [list(c.response_ids) for c in comps], [list(c.logprobs) for c in comps])
    prompts, resps, eng = broadcast_object(probe)
    sb = sequences(run, prompts, resps, max(len(r) for r in resps))
    mine = response_frame(run.actor.forward_logprobs(sb.batch, run.micro, temperature=1.0).logp, sb)
    theirs = torch.zeros_like(mine)
    for i, lp in enumerate(eng):
        theirs[i, :len(lp)] = torch.tensor(lp, dtype=theirs.dtype)
    diff = (mine - theirs).abs() * sb.resp_mask
    return {"gap_mean": float(diff.sum() / sb.resp_mask.sum().clamp_min(1)), "gap_max": float(diff.max()),
            "tokens": int(sb.resp_mask.sum())}


def startup_gate(run) -> dict:
    """Collective: compare engine vs trainer log-probs on the probe batch; raise above the gate."""
    g = probe_gap(run)
    gap = {"gate/logprob_gap_mean": g["gap_mean"], "gate/logprob_gap_max": g["gap_max"], "gate/tokens": g["tokens"]}
    thr = gate_threshold(run.cfg)
    if gap["gate/logprob_gap_mean"] > thr:
        raise LogProbGateError(
            f"start-up gate: trainer vs engine log-probs differ by {gap['gate/logprob_gap_mean']:.3g} on average "
            f"(max {gap['gate/logprob_gap_max']:.3g}) over {gap['gate/tokens']} probe tokens, above "
            f"rollout.logprob_gate={thr:g}; the weight sync or the engine's numerics are wrong")
    log.info("start-up gate passed: mean |trainer - engine| log-prob %.3g (max %.3g) <= %g",
             gap["gate/logprob_gap_mean"], gap["gate/logprob_gap_max"], thr)
    return gap


def weight_mismatches(actor, client, limit: int = 3) -> list[str]:
    """Collective: the first ``limit`` tensors whose copy in some engine differs from the trainer's HF
    export (streamed to rank 0 as a push is; compared bit for bit, dtype and shape first), each as
    ``name (engine i: why)``; the same list on every rank. ``client`` None off the driver."""
    stream = stream_hf_tensors(actor.bare_models(), actor.hf_cfg, sender=0)
    if client is None:
        for _ in stream:
            pass
        return broadcast_object(None)
    engines, bad, seen = client.engine_hf_parameters(), [], set()
    for name, t in stream:
        seen.add(name)
        t = t.detach().cpu()   # the engines' copies are host tensors
        for i, eng in enumerate(engines):
            e = eng.get(name)
            if e is None:
                why = None if name == "lm_head.weight" else "missing"   # tied: the embedding's copy serves it
            elif e.dtype != t.dtype:
                why = f"{str(e.dtype).removeprefix('torch.')}, trainer {str(t.dtype).removeprefix('torch.')}"
            elif e.shape != t.shape:
                why = f"shape {tuple(e.shape)}, trainer {tuple(t.shape)}"
            elif not torch.equal(e, t):
                why = f"max |diff| {float((e.float() - t.float()).abs().max()):.3g}"
            else:
                why = None
            if why is not None and len(bad) < limit:
                bad.append(f"{name} (engine {i}: {why})")
    extra = sorted({n for eng in engines for n in eng} - seen)
    bad += [f"{n} (engine only)" for n in extra[:max(0, limit - len(bad))]]
    return broadcast_object(bad)


def adapter_mismatches(actor, client, limit: int = 3) -> list[str]:
    """Collective (``lora.push: adapter``): the first ``limit`` adapter tensors whose copy loaded by some engine
    differs from the trainer's (:func:`~megatron_rl.convert.peft_adapter.gather_adapters`, compared bit for bit,
    dtype and shape first), as :func:`weight_mismatches` words them; the same list on every rank."""
    from megatron_rl.convert.peft_adapter import gather_adapters  # lazy: LoRA runs only

    mine = gather_adapters(actor.bare_models())
    if client is None:
        return broadcast_object(None)
    bad = []
    for i, eng in enumerate(client.engine_adapter_tensors()):
        for name in sorted(set(mine) | set(eng)):
            t, e = mine.get(name), eng.get(name)
            if e is None or t is None:
                why = "missing" if e is None else "engine only"
            elif e.dtype != t.dtype or e.shape != t.shape:
                why = f"{str(e.dtype).removeprefix('torch.')} {tuple(e.shape)}, trainer {str(t.dtype).removeprefix('torch.')} {tuple(t.shape)}"
            elif not torch.equal(e, t):
                why = f"max |diff| {float((e.float() - t.float()).abs().max()):.3g}"
            else:
                continue
            if len(bad) < limit:
                bad.append(f"{name} (engine {i}: {why})")
    return broadcast_object(bad)


class SyncVerifyError(RuntimeError):
    """A verified weight push left the engines disagreeing with the trainer (``rollout.verify_sync``)."""


def verify_push(run, step: int) -> dict:
    """Collective, after the push that ends ``step``: the probe against the dtype's tolerance and the
    engines' parameters against the export. Returns ``sync/verify_*`` metrics; raises
    :class:`SyncVerifyError` (one line) on a failure."""
    dtype = "bfloat16" if run.cfg.model.bf16 else "float32"
    tol_mean, tol_max = TOLERANCE[dtype]
    g = probe_gap(run)
    client = run.client if run.info.is_driver else None
    bad = (adapter_mismatches if adapter_push(run.cfg) else weight_mismatches)(run.actor, client)
    out = {"sync/verify_gap_mean": g["gap_mean"], "sync/verify_gap_max": g["gap_max"], "sync/verify_tensors_bad": len(bad)}
    if g["gap_mean"] > tol_mean or g["gap_max"] > tol_max or bad:
        raise SyncVerifyError(
            f"weight sync verification failed after the push of step {step}: engine vs trainer log-probs differ by "
            f"{g['gap_mean']:.3g} on average (max {g['gap_max']:.3g}) over {g['tokens']} probe tokens, {dtype} "
            f"tolerance {tol_mean:g} (max {tol_max:g}); differing tensors: {', '.join(bad) or 'none'}"
            + ("" if bad else " (the weights arrived: stale engine state, e.g. prefix-cache KV, or the engine's numerics)"))
    log.info("weight sync verified after step %d: mean |trainer - engine| log-prob %.3g (max %.3g), every tensor equal",
             step, g["gap_mean"], g["gap_max"])
    return out
