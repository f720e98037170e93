"""The ``bicc_context`` data path (bicc, bicc_rcc; docs/methods/bicc-rcc.md): the sampling path, then each target of
a mixed group is trained conditioned on the opposite responses (:func:`bicc_inputs`), placed by the
tokenizer's :class:`BiccLayout` (built at start-up). The greedy baseline runs with ``base=remax``.
The update pipeline (``trainer/pipeline/update.py``) takes the old / ref log-probs on the plain sequences the
engines sampled; this path swaps in the conditioned sequences the loss trains on (``train_rows``),
with old log-probs of the plain (the paper's) or the conditioned context (``old_logprob_context``)."""
from __future__ import annotations

import dataclasses

from megatron_rl import algorithms as A
from megatron_rl.algorithms.hparams import BiCCHParams
from megatron_rl.data import chat
from megatron_rl.trainer.pipeline.sequences import response_frame, sequences

from .base import register_path
from megatron_rl.trainer.contract import UpdateContext
from .plain import PlainPath


@dataclasses.dataclass(frozen=True)
class BiccLayout:
    """Where BiCC contexts go inside a prompt, and their scaffolding ids (docs/methods/bicc-rcc.md, consequence 2).

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

    plain, resps = rollouts.prompts, rollouts.responses   # lists, built once from the flat buffers
    bb = A.build_bicc_contexts(plain, [strip(r) for r in resps], rollouts.rewards.tolist(),
                               rollouts.group_ids.tolist(), budget_tokens=hp.context_budget(l_max),
                               header_ids=layout.header, sep_ids=layout.sep,
                               insert_at=layout.insert_points(plain), max_total_len=max_total_len,
                               threshold=hp.threshold)
    prompts = [list(p) for p in plain]
    for s in bb.samples:
        prompts[s.index] = list(s.input_ids[: s.response_start])
        target = list(s.input_ids[s.response_start:]) + list(resps[s.index][len(strip(resps[s.index])):])
        if target != list(resps[s.index]):
            raise AssertionError(f"BiCC changed the target tokens of sample {s.index}")
    return prompts, len(bb.samples), bb.n_fallback


@register_path("bicc_context")
class BiccPath(PlainPath):
    multi_turn_unsupported = ("BiCC inserts the group's other answers before each response, which with tool "
                              "responses inside a response is not defined")
    hparams = BiCCHParams
    prompt_context = "group_answers"
    shares_rows = False      # a row's context is its group's opposite-correctness responses: the whole batch

    def __init__(self, cfg, tok):
        super().__init__(cfg, tok)
        self.layout = BiccLayout.of(tok)

    @classmethod
    def wants_greedy(cls, hp) -> bool:
        return "greedy_rewards" in A.bicc_base(hp.base).needs   # the base's registration says (e.g. remax)

    def train_rows(self, ctx: UpdateContext, s, rows, lp, step: int, metrics: dict):
        """Conditioned prompts; old log-probs of the plain (paper) or conditioned context."""
        cfg, hp, ro = self.cfg, self.hp, s.ro
        R_max = cfg.rollout.max_tokens
        prompts, n_cond, n_fb = bicc_inputs(ro, hp, cfg.data.max_prompt_len + R_max, cfg.rollout.max_model_len,
                                            self.layout, self.tok.eos_id)
        train_sb = sequences(ctx, prompts, ro.responses, R_max)
        ctx.samples(step, "bicc_conditioned", [p + r for p, q, r in zip(prompts, ro.prompts, ro.responses)
                                                     if list(p) != list(q)])
        ex = {**rows.extras, "resp_pos": train_sb.resp_pos, "resp_mask": train_sb.resp_mask}
        if hp.old_logprob_context == "conditioned":
            mu = ctx.actor.train_in_sampling_space     # algo.ratio_space=sampling: old log-probs under μ too
            res = ctx.actor.forward_logprobs(train_sb.batch, ctx.micro, sampling=mu)
            ex["old_logp"] = response_frame(res.sampling_logp if mu else res.logp, train_sb)
        metrics.update({"bicc/conditioned_frac": n_cond / len(ro), "bicc/budget_fallbacks": n_fb})
        return dataclasses.replace(rows, seqs=train_sb, extras=ex)
