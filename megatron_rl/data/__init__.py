"""megatron_rl.data"""
