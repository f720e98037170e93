"""Run state: checkpoints and their manifest, run directories, config snapshots."""
