"""megatron_rl — RL post-training (GRPO family, BiCC/RCC, RLCSD, PAPO, SCoRe) on Megatron-core."""
__version__ = "0.1.0"
