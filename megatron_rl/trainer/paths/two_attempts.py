"""The ``two_attempts`` data path (SCoRe, ``algo.kind=score``): two-attempt rollouts and the training
rows of the two-stage self-correction objective (spec Part 2, ``algorithms/score.py``).

Rollout (rank 0 drives the engines, the result is broadcast): ONE interaction on the agent loop
(``agent/loop.py``, no tools; the ``self_correct`` interaction of ``agent/interactions.py`` answers the first
attempt with ``turn`` and ends the trajectory after the second):

    x1 = prompt;                 y1 ~ π_θ(· | x1)        (turn 0: ``rollout.n`` samples per prompt)
    x2 = x1 ++ y1 ++ turn;       y2 ~ π_θ(· | x2)        (turn 1: one sample per attempt 1, seed of round 1)
    r1 = R(y1), r2 = R(y2)       (the run's reward manager, same row / ground truth)

The trajectory is ``x1 → y1 (mask 1) ++ turn (mask 0) ++ y2 (mask 1)``; each attempt has its own
``rollout.max_tokens`` (the loop's ``max_turn_tokens``, in a response budget of ``2·max_tokens + |turn|``), and a
truncated y1 gets its second attempt all the same. :func:`attempts_of` cuts it into the two sample-aligned
attempts at the mask (y1 = the first turn's tokens) and at the second turn's start (x2 = x1 ++ everything before).

On a chat-template model (docs/methods/score.md) x2 is the template over [system, user, assistant(y1),
user(instruction)] plus the generation prompt: ``turn`` is the template's own text after the
assistant content (ChatML: ``<|im_end|>\n<|im_start|>user\n{instruction}<|im_end|>\n<|im_start|>assistant\n``,
:class:`~megatron_rl.data.chat.NextUserTurn`), and y1's sampled ids are kept verbatim instead of
being decoded and re-encoded (no re-tokenisation drift; a y1 that ended with EOS shares it with the
closing ``<|im_end|>``, a truncated y1 is closed by it all the same). Departure, on purpose: Qwen3's
own template drops the ``<think>`` part of an earlier assistant turn when a history is re-rendered,
so the reference's corrector probably sees only y1's answer (docs/methods/score.md "decide explicitly"); here it
sees all of y1, which is what the reference's helper meant to do. An empty
``algo.score.instruction`` on a chat model is a start-up error, and so is a
``data.max_prompt_len + 2·rollout.max_tokens + |turn|`` over ``rollout.max_model_len`` (no x2 can
then be cut; the template-less instruction too).

The template-less CPU demo task (character-level tokenizer over ``R 0123456789=``) has no turns:
``turn`` is the short instruction :data:`DEMO_INSTRUCTION` = ``"R="`` ("redo:"), after y1 WITH its EOS.

Training batch: because x2 starts with x1 ++ y1, ONE causal forward over ``x2 ++ y2`` yields both
attempts' log-probs: attempt-1 token t sits at sequence position ``len(x1)+t`` (target frame
``len(x1)-1+t``), attempt-2 token t at ``len(x2)-1+t``. Gathering them gives ``[N, R]`` matrices
``lp1``/``lp2`` (and ``ref1``/``ref2`` from the reference policy), which are exactly the inputs of
the registered "score" advantage and loss:

    Stage I:  L_I  = mean_i [ −r2·N[lp2] + β2·N[K3(y1)] ]
    Stage II: L_II = mean_i [ −r1·N[lp1] − r̃2·N[lp2] + β1·(N[K3(y1)] + N[K3(y2)]) ],  r̃2 = r2 + α(r2 − r1)

The stage is a function of the loop step (``algo.score.stage1_steps``: stage I for steps
1..stage1_steps, stage II after; 0 keeps the fixed ``algo.score.stage``), so a run resumed from a
stage-I checkpoint (whose extra_state holds the step) continues in the right stage.

Departure from the reference (BY571/SCoRe): the reference trains a LoRA adapter (π_ref = adapter
disabled); here the policy is trained full-parameter on Megatron and π_ref is a frozen copy of the
initial weights (the trainer's ``ReferencePolicy``).
"""
from __future__ import annotations

import dataclasses

import torch

from megatron_rl.agent.loop import Budgets, agent_loop_class
from megatron_rl.algorithms.hparams import ScoreHParams
from megatron_rl.data import chat
from megatron_rl.rollout import rollouts as R
from megatron_rl.rollout.engine import Completion
from megatron_rl.trainer.contract import CollectContext, Sampled, UpdateContext
from megatron_rl.trainer.pipeline.logprobs import logprob_gap
from megatron_rl.trainer.pipeline.sequences import sequences

from .base import DataPath, register_path

DEMO_INSTRUCTION = "R="
"""Self-correction instruction of the CPU demo task ("redo:"; characters of its tokenizer)."""


@dataclasses.dataclass
class TwoAttempts:
    """Sample-aligned attempts of one trajectory each: ``second.prompts[i] == first.prompts[i] + first.responses[i]
    + turn`` (y1's closing EOS shared with a turn that opens with it)."""

    first: R.Rollouts
    second: R.Rollouts

    def __len__(self) -> int:
        return len(self.first)


def stage_of(hp, step: int) -> int:
    """SCoRe stage at loop ``step`` (1-based): 1 for step <= stage1_steps, else 2; fixed if 0."""
    n = hp.stage1_steps
    return hp.stage if n <= 0 else (1 if step <= n else 2)


def second_turn(tok, hp, max_prompt_len: int | None = None, max_tokens: int = 0, max_model_len: int | None = None):
    """Start-up: the chat template's next-user-turn layout (None on a template-less tokenizer)."""
    if not chat.has_chat_template(tok):
        return None
    if not hp.instruction.strip():
        raise ValueError("algo.score.instruction is empty: on a chat-template model SCoRe's second attempt needs "
                         "the self-correction instruction text (docs/methods/score.md)")
    turn = chat.NextUserTurn.of(tok, hp.instruction)
    if max_prompt_len is not None and max_model_len is not None:
        frame_check(max_prompt_len, max_tokens, len(turn.suffix), max_model_len)
    return turn


def instruction_ids(tok, hp) -> list[int]:
    """Template-less tokenizers: ids of ``algo.score.instruction`` (empty -> the demo's)."""
    text = hp.instruction or DEMO_INSTRUCTION
    ids = list(tok.encode(text))
    if not ids:
        raise ValueError(f"algo.score.instruction {text!r} encodes to no tokens")
    return ids


def frame_check(max_prompt_len: int, max_tokens: int, n_turn: int, max_model_len: int) -> None:
    """Start-up: x1 ++ y1 ++ turn ++ y2 fits ``rollout.max_model_len`` for every prompt."""
    need = max_prompt_len + 2 * max_tokens + n_turn
    if need > max_model_len:
        raise ValueError(f"SCoRe: data.max_prompt_len + 2*rollout.max_tokens + {n_turn} instruction-turn "
                         f"tokens = {need} > rollout.max_model_len={max_model_len}; raise max_model_len")


def attempt_budgets(max_tokens: int, n_turn: int) -> Budgets:
    """The trajectory's limits: two assistant turns of ``max_tokens`` each around one ``n_turn``-token user turn."""
    return Budgets(max_response_tokens=2 * max_tokens + n_turn, max_assistant_turns=2, max_user_turns=1,
                   max_turn_tokens=max_tokens)


def attempts_of(trajs: list, rows: list, tok) -> TwoAttempts:
    """The two attempts of each trajectory (module docstring), as sample-aligned :class:`Rollouts`; a
    trajectory that ended before its second attempt is an error naming it."""
    firsts, seconds = [], []
    for t in trajs:
        if t.turns != 2 or 0 not in t.response_mask:
            raise RuntimeError(f"SCoRe trajectory {t.prompt_index}/{t.sample_index} ended after {t.turns} attempt(s) "
                               f"({t.finish_reason}), not 2")
        e, k = t.response_mask.index(0), t.turn_starts[1]       # end of y1, start of y2
        ids, lp, v, x1 = tuple(t.response_ids), tuple(t.logprobs), tuple(t.versions), tuple(t.prompt_ids)
        firsts.append(Completion(t.prompt_index, t.sample_index, x1, ids[:e], lp[:e], t.turn_finish[0], v[:e]))
        seconds.append(Completion(t.prompt_index, t.sample_index, x1 + ids[:k], ids[k:], lp[k:], t.turn_finish[1], v[k:]))
    return TwoAttempts(R.from_completions(rows, firsts, tok), R.from_completions(rows, seconds, tok))


def collect_two(ctx: CollectContext, cfg, tok, step: int, loop, interaction: dict) -> TwoAttempts:
    """Driver only: the trajectories of one batch of prompts (``rollout.n`` each) on the agent ``loop`` with the
    ``interaction`` (its kwargs), cut into the two attempts, both scored. No collective (the loop broadcasts)."""
    rows = [ctx.train_set[i] for i in ctx.sampler.next_batch()]
    trajs = loop.run(ctx.client, [list(r.prompt_ids) for r in rows], R.sampling_params(cfg, step, eos_id=tok.eos_id),
                     None, [interaction] * len(rows))
    two = attempts_of(trajs, rows, tok)
    R.score(two.first, ctx.rewards)
    R.score(two.second, ctx.rewards)
    ctx.samples(step, "score_second", [p + r for p, r in zip(two.second.prompts, two.second.responses)])
    return two


def first_positions(two: TwoAttempts, max_resp: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Attempt-1 target-frame positions inside ``x2 ++ y2`` and their mask, ``[N, R]`` each."""
    n = len(two)
    pos = torch.zeros(n, max_resp, dtype=torch.long)
    mask = torch.zeros(n, max_resp)
    for i, (p, r) in enumerate(zip(two.first.prompts, two.first.responses)):
        k = min(len(r), max_resp)
        pos[i, :k] = torch.arange(len(p) - 1, len(p) - 1 + k)
        mask[i, :k] = 1.0
    return pos, mask


def score_metrics(two: TwoAttempts, stage: int) -> dict:
    """score/r1, score/r2 (mean rewards), score/delta = mean(r2 − r1), accuracy flips, stage."""
    r1, r2 = two.first.rewards.float(), two.second.rewards.float()
    c1, c2 = two.first.correct.bool(), two.second.correct.bool()
    return {"score/r1": float(r1.mean()), "score/r2": float(r2.mean()), "score/delta": float((r2 - r1).mean()),
            "score/acc1": float(c1.float().mean()), "score/acc2": float(c2.float().mean()),
            "score/wrong_to_right": float((~c1 & c2).float().mean()),
            "score/right_to_wrong": float((c1 & ~c2).float().mean()), "score/stage": float(stage)}


@register_path("two_attempts")
class TwoAttemptsPath(DataPath):
    """Attempt 1, attempt 2 on ``x1 ++ y1 ++ turn`` (one agent-loop interaction), both scored; the pipeline's one
    old / ref pass over ``x2 ++ y2`` serves both attempts. The second-turn layout of the chat template
    (:func:`second_turn`) and the loop are built at start-up, so a template that cannot host the turn fails before
    any model is built."""

    hparams = ScoreHParams
    prompt_context = "corrector_turn"
    provides = frozenset({"rewards", "group_ids", "mask", "logp", "ref_logp", "first_logp", "first_ref_logp",
                          "first_mask", "first_rewards"})
    importance_weights = False    # REINFORCE on both attempts: no proximal ratio to weight
    multi_turn_unsupported = ("SCoRe's rollout is itself a two-turn interaction on the agent loop (attempt, "
                              "correction instruction, attempt); tool turns inside its attempts would leave r1 = "
                              "R(y1) and the lp1 / lp2 split without a meaning")
    async_unsupported = ("SCoRe's objective is REINFORCE on two attempts with no proximal-policy ratio, and its "
                         "registered loss takes no importance weight, so attempts sampled by older weights would "
                         "enter the gradient uncorrected")

    def __init__(self, cfg, tok):
        super().__init__(cfg, tok)
        r = cfg.rollout
        turn = second_turn(tok, self.hp, cfg.data.max_prompt_len, r.max_tokens, r.max_model_len)
        # the chat template's turn after y1's content, or (template-less tokenizer) the instruction's own ids
        ids = list(turn.suffix) if turn is not None else instruction_ids(tok, self.hp)
        frame_check(cfg.data.max_prompt_len, r.max_tokens, len(ids), r.max_model_len)
        self.loop = agent_loop_class("tool_agent")(tok, None, attempt_budgets(r.max_tokens, len(ids)))
        self.interaction = {"name": "self_correct", "instruction": self.hp.instruction or DEMO_INSTRUCTION,
                            "turn_ids": ids}

    def collect(self, ctx: CollectContext, step: int):
        return collect_two(ctx, self.cfg, self.tok, step, self.loop, self.interaction)

    def sampled(self, ctx: UpdateContext, data: TwoAttempts, step: int):
        """The sequences ``x2 ++ y2`` (their rollouts: attempt 2), attempt 1's rewards for the credit
        and its positions inside them; the stage's hparams (:func:`stage_of`)."""
        sec, R_max = data.second, self.cfg.rollout.max_tokens
        sb = sequences(ctx, sec.prompts, sec.responses, R_max)
        fpos, fmask = first_positions(data, R_max)
        hp = dataclasses.replace(self.hp, stage=stage_of(self.hp, step))
        return Sampled(sec, sb, hp, adv_fields={"first_rewards": data.first.rewards.double()},
                       extras={"first_rewards": data.first.rewards.float(), "first_pos": fpos, "first_mask": fmask},
                       data=data)

    def after_logprobs(self, ctx: UpdateContext, s, lp, metrics: dict) -> None:
        """Attempt 1's reference log-probs and trainer/engine gap, gathered from the same pass."""
        two = s.data
        if lp.ref_full is None:
            raise RuntimeError("algo.kind=score needs the reference policy (KL anchors), but none was built")
        fpos, fmask = s.extras["first_pos"], s.extras["first_mask"]
        s.extras["first_ref_logp"] = lp.ref_full.gather(1, fpos) * fmask
        metrics["score/logprob_gap1"] = logprob_gap(lp.engine_space_full.gather(1, fpos) * fmask, two.first.rollout_logp,
                                                     fmask)
        metrics.update(score_metrics(two, s.hp.stage))

    def logged(self, data):
        return data.first

    def trained(self, two):
        return two.second
