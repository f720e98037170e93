"""megatron_rl.eval"""
