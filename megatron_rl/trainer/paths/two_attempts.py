"""The ``two_attempts`` data path (SCoRe, ``trainer/score_stage.py``): attempt 1, attempt 2 on
``x1 ++ y1 ++ turn``, both scored; one forward over ``x2 ++ y2`` trains both. The second-turn layout
of the chat template (``score_stage.second_turn``) is built at start-up, so a template that cannot
host it fails before any model is built."""
from __future__ import annotations

from megatron_rl.algorithms.hparams import ScoreHParams

from . import DataPath, register_path


@register_path("two_attempts")
class TwoAttemptsPath(DataPath):
    hparams = ScoreHParams
    prompt_context = "corrector_turn"
    provides = frozenset({"rewards", "group_ids", "mask", "logp", "ref_logp", "first_logp", "first_ref_logp",
                          "first_mask", "first_rewards"})
    async_unsupported = ("SCoRe's objective is REINFORCE on two attempts with no proximal-policy ratio, and its "
                         "registered loss takes no importance weight, so attempts sampled by older weights would "
                         "enter the gradient uncorrected")

    def __init__(self, cfg, tok):
        from megatron_rl.trainer.score_stage import instruction_ids, second_turn

        super().__init__(cfg, tok)
        r = cfg.rollout
        self.turn = second_turn(tok, self.hp, cfg.data.max_prompt_len, r.max_tokens, r.max_model_len)
        if self.turn is None:          # template-less tokenizer: the instruction's own ids
            self.turn = instruction_ids(tok, self.hp)

    def collect(self, step: int):
        from megatron_rl.trainer.score_stage import collect_two

        return collect_two(self.run, step, self.turn)

    def update(self, two, step: int) -> dict:
        from megatron_rl.trainer.score_stage import update_two

        return update_two(self.run, two, step)

    def logged(self, two):
        return two.first

    def trained(self, two):
        return two.second
