"""megatron_rl.models"""
