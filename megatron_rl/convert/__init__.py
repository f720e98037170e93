"""megatron_rl.convert"""
