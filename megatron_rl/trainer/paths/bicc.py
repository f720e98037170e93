"""The ``bicc_context`` data path (bicc, bicc_rcc; spec §1.3): the sampling path, then each target of
a mixed group is trained conditioned on the opposite responses (``update_stage.bicc_inputs``),
placed by the tokenizer's :class:`~megatron_rl.trainer.update_stage.BiccLayout` (built at start-up).
The greedy baseline runs with ``base=remax``."""
from __future__ import annotations

from megatron_rl.algorithms.hparams import BiCCHParams

from . import register_path
from .sampling import PlainPath


@register_path("bicc_context")
class BiccPath(PlainPath):
    hparams = BiCCHParams
    prompt_context = "group_answers"

    def __init__(self, cfg, tok):
        from megatron_rl.trainer.update_stage import BiccLayout

        super().__init__(cfg, tok)
        self.layout = BiccLayout.of(tok)

    @classmethod
    def wants_greedy(cls, hp) -> bool:
        from megatron_rl.algorithms import bicc_base

        return "greedy_rewards" in bicc_base(hp.base).needs   # the base's registration says (e.g. remax)

    def train_inputs(self, ro, plain, old, step: int, metrics: dict):
        """Conditioned prompts; old log-probs of the plain (paper) or conditioned context."""
        from megatron_rl.trainer import update_stage as U

        run, cfg, hp = self.run, self.cfg, self.hp
        R_max = cfg.rollout.max_tokens
        prompts, n_cond, n_fb = U.bicc_inputs(ro, hp, cfg.data.max_prompt_len + R_max, cfg.rollout.max_model_len,
                                              self.layout, run.tok.eos_id)
        train_sb = U.build_seq_batch(prompts, ro.responses, run.tok.pad_id, run.seq_len(prompts, ro.responses), R_max)
        run.dump_samples(step, "bicc_conditioned", [p + r for p, q, r in zip(prompts, ro.prompts, ro.responses)
                                                     if list(p) != list(q)])
        if hp.old_logprob_context == "conditioned":
            old = U.response_frame(run.actor.forward_logprobs(train_sb.batch, cfg.trainer.micro_batch_size).logp, train_sb)
        metrics.update({"bicc/conditioned_frac": n_cond / len(ro), "bicc/budget_fallbacks": n_fb})
        return train_sb, old
