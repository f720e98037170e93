"""megatron_rl.rollout"""
