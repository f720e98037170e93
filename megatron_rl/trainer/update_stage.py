"""Loop stages that consume rollouts: batch building, old/ref log-probs, advantages, BiCC
conditioned inputs (the objective itself is ``trainer/objective.py``).

Per-token quantities are kept in the RESPONSE frame ``[N, R]`` (token r of sample n's response),
because BiCC moves a sample's response to a different position when a context is inserted; each
row's ``resp_pos[n, r]`` indexes the actor's target frame ``[N, S-1]`` (``logp.gather``).
"""
from __future__ import annotations

import dataclasses

import torch

from megatron_rl import algorithms as A
from megatron_rl.trainer.batch import TrainBatch, make_batch


@dataclasses.dataclass
class SeqBatch:
    """A TrainBatch plus the response-frame index of each row."""

    batch: TrainBatch
    resp_pos: torch.Tensor    # [N, R] long (clamped to 0 where masked)
    resp_mask: torch.Tensor   # [N, R] float


def build_seq_batch(prompts: list[list[int]], responses: list[list[int]], pad_id: int, seq_len: int,
                    max_resp: int, extras: dict | None = None) -> SeqBatch:
    """Right-padded sequences ``prompt ++ response``; response-frame positions and mask."""
    n = len(prompts)
    pos = torch.zeros(n, max_resp, dtype=torch.long)
    mask = torch.zeros(n, max_resp)
    for i, (p, r) in enumerate(zip(prompts, responses)):
        k = min(len(r), max_resp)
        pos[i, :k] = torch.arange(len(p) - 1, len(p) - 1 + k)
        mask[i, :k] = 1.0
    ex = {"resp_pos": pos, "resp_mask": mask, **(extras or {})}
    return SeqBatch(make_batch(prompts, responses, pad_id, ex, seq_len), pos, mask)


def response_frame(x: torch.Tensor, sb: SeqBatch) -> torch.Tensor:
    """``[N, S-1]`` -> ``[N, R]`` (zeros off the mask)."""
    return x.gather(1, sb.resp_pos) * sb.resp_mask


@dataclasses.dataclass(frozen=True)
class BiccLayout:
    """Where BiCC contexts go inside a prompt, and their scaffolding ids (spec §1.3, consequence 2).

    * chat template (the real path): inside the LAST USER TURN, before its end-of-turn and the
      generation prompt, opened by :data:`~megatron_rl.data.chat.BICC_HEADER`, each trace followed by
      :data:`~megatron_rl.data.chat.BICC_DELIMITER`; the assistant turn then opens with o_i;
    * HF tokenizer without a template (a base model's pass-through prompt): after the prompt, with
      the same header and delimiter;
    * template-less SentencePiece demo task: right after BOS, traces separated by a space, so the
      short question stays adjacent to its answer.
    """

    header: tuple = ()
    sep: tuple = ()
    turn_end: object = None          # data.chat.UserTurnEnd (chat templates)
    at: int | None = None            # fixed insert index (template-less demo)

    def insert_points(self, prompts) -> list[int] | None:
        if self.turn_end is not None:
            return [self.turn_end.insert_point(p) for p in prompts]
        if self.at is not None:
            return [min(self.at, len(p)) for p in prompts]
        return None

    @classmethod
    def of(cls, tok) -> BiccLayout:
        from megatron_rl.data import chat

        if chat.has_chat_template(tok):
            return cls(tuple(tok.encode(chat.BICC_HEADER)), tuple(tok.encode(chat.BICC_DELIMITER)), chat.UserTurnEnd.of(tok))
        if hasattr(tok, "sp"):
            return cls((), tuple(tok.encode(" ")), None, 1 if tok.bos_id is not None and tok.bos_id >= 0 else 0)
        return cls(tuple(tok.encode(chat.BICC_HEADER)), tuple(tok.encode(chat.BICC_DELIMITER)))


def bicc_inputs(rollouts, hp, l_max: int, max_total_len: int, layout: BiccLayout = BiccLayout(),
                eos_id: int | None = None):
    """BiCC bilateral contexts: conditioned sequences for targets of mixed groups, plain otherwise.

    Budget ``floor(context_frac * L_max)`` with ``L_max = max_prompt_len + max_response_len`` (spec
    §1.3 item 3), header included. ``layout`` says where the context goes (:class:`BiccLayout`).
    Context traces are the opposite responses WITHOUT their final EOS (the spec serialises decoded
    text); the target keeps its exact token ids (asserted). Returns (prompts with contexts,
    #conditioned, #budget fallbacks).
    """
    def strip(r):
        return list(r[:-1]) if eos_id is not None and len(r) > 1 and r[-1] == eos_id else list(r)

    bb = A.build_bicc_contexts(rollouts.prompts, [strip(r) for r in rollouts.responses], rollouts.rewards.tolist(),
                               rollouts.group_ids.tolist(), budget_tokens=hp.context_budget(l_max),
                               header_ids=layout.header, sep_ids=layout.sep,
                               insert_at=layout.insert_points(rollouts.prompts), max_total_len=max_total_len,
                               threshold=hp.threshold)
    prompts = [list(p) for p in rollouts.prompts]
    for s in bb.samples:
        prompts[s.index] = list(s.input_ids[: s.response_start])
        target = list(s.input_ids[s.response_start:]) + list(rollouts.responses[s.index][len(strip(rollouts.responses[s.index])):])
        if target != list(rollouts.responses[s.index]):
            raise AssertionError(f"BiCC changed the target tokens of sample {s.index}")
    return prompts, len(bb.samples), bb.n_fallback


def old_ref_logprobs(run, ro, plain: SeqBatch) -> tuple[torch.Tensor, torch.Tensor | None, dict]:
    """Behaviour (old) and reference log-probs of the plain batch in the response frame, and the
    trainer<->engine agreement metric ``rollout/logprob_gap`` (mean |old − engine log-prob|)."""
    import time

    t0 = time.perf_counter()
    mbs, R_max = run.cfg.trainer.micro_batch_size, run.cfg.rollout.max_tokens
    old = response_frame(run.actor.forward_logprobs(plain.batch, mbs).logp, plain)
    ref = response_frame(run.ref.forward_logprobs(plain.batch, mbs).logp, plain) if run.ref is not None else None
    roll = torch.zeros_like(old)
    for i, lp in enumerate(ro.rollout_logp):
        roll[i, : min(len(lp), R_max)] = torch.tensor(lp[:R_max])
    m = plain.resp_mask
    return old, ref, {"rollout/logprob_gap": float(((old - roll).abs() * m).sum() / m.sum().clamp_min(1)),
                      "time/logprobs": time.perf_counter() - t0}


def kl_in_reward(ro, old: torch.Tensor, ref: torch.Tensor, mask: torch.Tensor, beta: float, kind: str) -> dict:
    """In-reward KL (verl ``apply_kl_penalty`` with the fixed controller, ``algorithms.apply_kl_in_reward``):
    r_i ← r_i − β·Σ_t KL_t(old, ref)·m_t, the sequence sum of the token-level rewards that outcome
    advantages read (BiCC spec §1.1). ``ro.correct`` stays the binary outcome. Departure: the released
    BiCC recipe applies it before its old log-probs exist (spec §1.5: it cannot run so); here they do."""
    out = A.apply_kl_in_reward(torch.zeros_like(old), old, ref, mask, beta, kind)
    ro.rewards = ro.rewards + out.token_rewards.sum(-1).to(ro.rewards.dtype)
    return {"reward/kl_in_reward": float(out.mean_kl), "reward/kl_in_reward_mean_penalty": float(-out.token_rewards.sum(-1).mean())}


def off_policy_inputs(cfg, ro, old: torch.Tensor, mask: torch.Tensor, step: int) -> tuple[torch.Tensor | None, dict]:
    """Decoupled-PPO importance weights of the batch (``algorithms/offpolicy.py``) and their metrics.

    Proximal policy = ``old`` (the trainer's log-probs of the PLAIN batch under its current weights:
    the context the engines sampled in); behaviour = the engines' sampling log-probs
    (``ro.rollout_logp``); staleness = (step − 1) − ``ro.weight_version`` (the trainer holds the
    weights of step − 1; a batch collected synchronously has no version: staleness 0). Mode and
    cap: ``algo.off_policy`` / ``algo.tis_cap``. Returns (weights [N, T] or None, metrics)."""
    from megatron_rl.algorithms import offpolicy as O

    version = step - 1 if ro.weight_version is None else ro.weight_version
    stale = O.staleness(step - 1, torch.full((len(ro),), version, dtype=torch.long))
    out = O.off_policy_weights(old, O.behaviour_matrix(ro.rollout_logp, old), mask, stale,
                               mode=cfg.algo.off_policy, cap=cfg.algo.tis_cap)
    return out.weights, {k: float(v) for k, v in out.metrics.items()}


def advantage_inputs(rollouts, mask: torch.Tensor, old_logp=None, ref_logp=None) -> A.AlgoInputs:
    return A.AlgoInputs(rewards=rollouts.rewards.double(), group_ids=rollouts.group_ids, mask=mask,
                        old_logp=old_logp, ref_logp=ref_logp, correct=rollouts.correct,
                        process=None if rollouts.process is None else rollouts.process.double(),
                        greedy_rewards=None if rollouts.greedy_rewards is None else rollouts.greedy_rewards.double())
