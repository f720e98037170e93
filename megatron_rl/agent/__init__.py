"""Multi-turn agent rollouts: tools and their calls (issue 53)."""
