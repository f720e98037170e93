"""The RL loop: ``rl_step``, rollout sources (sync / async), colocation, weight sync, run setup and start-up checks, mismatch guard, stop."""
