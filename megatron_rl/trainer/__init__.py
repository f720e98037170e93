"""megatron_rl.trainer"""
