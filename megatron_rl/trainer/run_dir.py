"""Who owns ``trainer.run_dir``: a fresh run never mixes with an older run's files.

Before this rule a fresh run (no ``--resume``) in a used run directory kept the old run's
checkpoints, pruned its own ones by step number against them, and a later ``--resume auto`` could
continue the *other* run. Like verl's ``resume_mode`` (``disable`` refuses nothing but never reads
old state; here we refuse instead of guessing):

* ``--resume auto`` / ``--resume PATH``: continue; the directory is used as is.
* fresh run, directory unused (no ``checkpoints/step_*``, no non-empty ``metrics.jsonl``): start.
* fresh run, directory used: ``ValueError`` naming what is there and the two ways out, unless
  ``--overwrite``, which moves the old run's artifacts (:data:`RUN_ARTIFACTS`) into
  ``run_dir/archive/<UTC time>/`` (nothing is deleted) and then starts.

Only run artifacts are moved: other files the user keeps in the directory (the demo keeps its
data, tokenizer and warm-start policy there) stay where they are.
"""
from __future__ import annotations

import logging
import os
import time
from pathlib import Path

log = logging.getLogger("megatron_rl.run_dir")

#: what a training run writes into its run_dir (archived together by ``--overwrite``)
RUN_ARTIFACTS = ("checkpoints", "metrics.jsonl", "curve.png", "wandb", "wandb_id.txt", "hf", "train.log", "config.yaml",
                 "samples.jsonl")


def used_by(run_dir: str | os.PathLike) -> list[str]:
    """What marks ``run_dir`` as holding an earlier run (empty when unused)."""
    d = Path(run_dir)
    found = []
    ck = d / "checkpoints"
    if ck.is_dir():
        steps = sorted(p.name for p in ck.iterdir() if p.name.startswith("step_"))
        if steps:
            found.append(f"checkpoints/{steps[-1]}" + (f" (+{len(steps) - 1} more)" if len(steps) > 1 else ""))
    m = d / "metrics.jsonl"
    if m.is_file() and m.stat().st_size > 0:
        found.append("metrics.jsonl")
    return found


def check_run_dir(run_dir: str | os.PathLike, resume: str | None, overwrite: bool) -> None:
    """Raise ``ValueError`` for a fresh run in a used ``run_dir`` without ``overwrite`` (read only)."""
    if resume is not None and overwrite:
        raise ValueError("--overwrite starts a fresh run; it cannot be combined with --resume")
    if resume is not None or overwrite:
        return
    found = used_by(run_dir)
    if found:
        raise ValueError(f"trainer.run_dir={run_dir} already holds a run ({', '.join(found)}): pass --resume auto to "
                         "continue it, --overwrite to archive it and start fresh, or choose another trainer.run_dir")


def archive_run(run_dir: str | os.PathLike) -> Path | None:
    """Move the earlier run's artifacts into ``run_dir/archive/<UTC time>/``; returns that dir (None if
    there was nothing to move). Call on one rank only."""
    d = Path(run_dir)
    present = [n for n in RUN_ARTIFACTS if (d / n).exists()] + sorted(p.name for p in d.glob("metrics.*.jsonl"))
    present += sorted(p.name for p in d.glob("config.*.yaml"))   # the later starts' configs (trainer/run_config.py)
    if not present:
        return None
    dest = d / "archive" / time.strftime("%Y%m%d-%H%M%S", time.gmtime())
    n = 0
    while dest.exists():
        n += 1
        dest = dest.with_name(f"{dest.name.split('.')[0]}.{n}")
    dest.mkdir(parents=True)
    for name in present:
        os.rename(d / name, dest / name)
    log.warning("--overwrite: the earlier run in %s was moved to %s", d, dest)
    return dest
