"""The update pipeline: batches, packing, the update stage and the objective (knows no method name)."""
