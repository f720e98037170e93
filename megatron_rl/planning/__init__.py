"""The memory planning behind ``megatron-rl plan``: the model shapes it plans (``arch.py``), the per-GPU memory
model (``memory.py``: pure arithmetic, no torch) and the inputs a run config decides (``config.py``).

The command itself (options, table, exit status) is ``megatron_rl/cli/plan.py``; this package sits below the
trainer, so start-up checks and tools may ask the memory model too.
"""
