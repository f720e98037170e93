"""The Megatron policy: actor (log-probs, train step), optimizer, offload, vocab- and context-parallel math, warm start."""
