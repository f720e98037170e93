"""Tools for multi-turn rollouts."""
