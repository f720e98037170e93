"""Keys of verl and NeMo-RL configs that users bring along, and ours for them: an unknown section that is one of
theirs is refused with a pointer to the mapping (``docs/reference/coming-from-verl.md``, whose table this map
follows: ``tests/unit/test_config.py`` checks each pair is a row there), and with our key where it is one key.
A leaf: imports nothing."""
from __future__ import annotations

#: their top-level sections (verl's Hydra config, NeMo-RL's YAML)
FOREIGN_SECTIONS = {"actor_rollout_ref": "verl", "algorithm": "verl", "critic": "verl", "reward_model": "verl",
                    "custom_reward_function": "verl", "policy": "NeMo-RL", "grpo": "NeMo-RL", "loss_fn": "NeMo-RL",
                    "cluster": "NeMo-RL"}

#: their key -> ours (one key each; the table has the notes and the many-to-one rows)
FOREIGN_KEYS = {
    "actor_rollout_ref.model.path": "model.hf_path",
    "actor_rollout_ref.rollout.n": "rollout.n",
    "actor_rollout_ref.rollout.max_model_len": "rollout.max_model_len",
    "actor_rollout_ref.rollout.temperature": "rollout.temperature",
    "actor_rollout_ref.actor.ppo_mini_batch_size": "trainer.mini_batch_prompts",
    "actor_rollout_ref.actor.ppo_epochs": "trainer.ppo_epochs",
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu": "trainer.micro_batch_size",
    "actor_rollout_ref.actor.optim.lr": "optim.lr",
    "actor_rollout_ref.actor.optim.lr_warmup_steps": "optim.warmup_steps",
    "actor_rollout_ref.actor.grad_clip": "optim.clip_grad",
    "actor_rollout_ref.actor.clip_ratio_c": "algo.<kind>.dual_clip",
    "actor_rollout_ref.actor.loss_agg_mode": "algo.<kind>.loss_agg_mode",
    "actor_rollout_ref.actor.kl_loss_type": "algo.<kind>.kl_loss_type",
    "actor_rollout_ref.rollout.tensor_model_parallel_size": "rollout.tensor_parallel_size",
    "algorithm.adv_estimator": "algo.kind",
    "algorithm.norm_adv_by_std_in_grpo": "algo.<kind>.scale",
    "algorithm.kl_penalty": "algo.<kind>.kl_reward_type",
    "grpo.num_prompts_per_step": "data.prompts_per_step",
    "grpo.num_generations_per_prompt": "rollout.n",
    "policy.model_name": "model.hf_path",
}

DOC = "docs/reference/coming-from-verl.md"


def foreign_hint(unknown: list[str], tree: dict) -> str:
    """The words to add to an unknown-section refusal when a section is verl's or NeMo-RL's: ours for each of
    its keys that has one, and the page with the whole mapping; "" otherwise."""
    theirs = [s for s in unknown if s in FOREIGN_SECTIONS]
    if not theirs:
        return ""
    keys = [k for s in theirs for k in _dotted(s, tree.get(s))]
    ours = [f"{k} -> {FOREIGN_KEYS[k]}" for k in keys if k in FOREIGN_KEYS]
    who = " / ".join(sorted({FOREIGN_SECTIONS[s] for s in theirs}))
    return (f"; {', '.join(theirs)} is {who}'s" + (f" ({'; '.join(ours)})" if ours else "")
            + f": every key's equivalent is in {DOC}")


def _dotted(prefix: str, node) -> list[str]:
    if not isinstance(node, dict):
        return [prefix]
    return [k for key, v in node.items() for k in _dotted(f"{prefix}.{key}", v)]
