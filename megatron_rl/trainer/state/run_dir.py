"""Who owns ``trainer.run_dir``: a fresh run never mixes with an older run's files.

Before this rule a fresh run (no ``--resume``) in a used run directory kept the old run's
checkpoints, pruned its own ones by step number against them, and a later ``--resume auto`` could
continue the *other* run. Like verl's ``resume_mode`` (``disable`` refuses nothing but never reads
old state; here we refuse instead of guessing):

* ``--resume auto`` / ``--resume PATH``: continue; the directory is used as is.
* fresh run, directory unused (no ``checkpoints/step_*``, no non-empty row log :data:`RUN_LOGS`): start.
* fresh run, directory used: ``ValueError`` naming what is there and the two ways out, unless
  ``--overwrite``, which moves the earlier run into ``run_dir/archive/<UTC time>/`` (nothing is
  deleted) and then starts.

What ``--overwrite`` moves is decided by what stays, not by a list of what a run writes (a list
missed ``optimizer_steps.jsonl`` once): every entry of the directory moves except ``archive/`` and
the *inputs* of the new run -- each entry that holds a path the new configuration reads (any config
value naming an existing file or directory inside the run dir: the demo keeps its data and
warm-start policy there) or that the caller names in ``keep`` (the demo's tokenizer and initial
policy). A file the user left there is archived with the run, never deleted or overwritten.
"""
from __future__ import annotations

import logging
import os
import time
from collections.abc import Iterable
from pathlib import Path

log = logging.getLogger("megatron_rl.run_dir")

#: what a training run writes into its run_dir (``--overwrite`` moves every entry but the inputs; this list
#: is what the demo's directory check and the docs name)
RUN_ARTIFACTS = ("checkpoints", "metrics.jsonl", "curve.png", "wandb", "wandb_id.txt", "hf", "train.log", "config.yaml",
                 "samples.jsonl", "optimizer_steps.jsonl", "eval")   # eval/: the held-out tables and trajectories
#: row logs a run appends to: a non-empty one marks the directory as used
RUN_LOGS = ("metrics.jsonl", "optimizer_steps.jsonl", "samples.jsonl")
ARCHIVE = "archive"


def used_by(run_dir: str | os.PathLike) -> list[str]:
    """What marks ``run_dir`` as holding an earlier run (empty when unused)."""
    d = Path(run_dir)
    found = []
    ck = d / "checkpoints"
    if ck.is_dir():
        steps = sorted(p.name for p in ck.iterdir() if p.name.startswith("step_"))
        if steps:
            found.append(f"checkpoints/{steps[-1]}" + (f" (+{len(steps) - 1} more)" if len(steps) > 1 else ""))
    for name in RUN_LOGS:
        m = d / name
        if m.is_file() and m.stat().st_size > 0:
            found.append(name)
    return found


def check_run_dir(run_dir: str | os.PathLike, resume: str | None, overwrite: bool) -> None:
    """Raise ``ValueError`` for a fresh run in a used ``run_dir`` without ``overwrite`` (read only)."""
    if resume is not None and overwrite:
        raise ValueError("--overwrite starts a fresh run; it cannot be combined with --resume")
    if overwrite:   # everything but the inputs moves: never the working directory, home or an ancestor
        here = Path(run_dir).resolve()
        for shared, what in ((Path.cwd().resolve(), "the working directory"), (Path.home().resolve(), "the home "
                                                                                                   "directory")):
            if here == shared or here in shared.parents:
                raise ValueError(f"--overwrite would move everything in trainer.run_dir={run_dir} ({what} or one "
                                 "of its parents) into an archive: give the run a directory of its own")
    if resume is not None or overwrite:
        return
    found = used_by(run_dir)
    if found:
        raise ValueError(f"trainer.run_dir={run_dir} already holds a run ({', '.join(found)}): pass --resume auto to "
                         "continue it, --overwrite to archive it and start fresh, or choose another trainer.run_dir")


def config_inputs(cfg, run_dir: str | os.PathLike) -> list[Path]:
    """Every path the configuration names that exists inside ``run_dir`` (generic: any string value
    of ``cfg.to_dict()``, relative ones taken from the working directory as the run takes them)."""
    root = Path(run_dir).resolve()
    found: list[Path] = []

    def walk(v) -> None:
        if isinstance(v, dict):
            for x in v.values():
                walk(x)
        elif isinstance(v, (list, tuple)):
            for x in v:
                walk(x)
        elif isinstance(v, str) and v and len(v) < 4096:
            try:
                p = Path(v).resolve()
                if p != root and p.is_relative_to(root) and p.exists():
                    found.append(p)
            except (OSError, ValueError):
                pass

    walk(cfg.to_dict() if hasattr(cfg, "to_dict") else cfg)
    return found


def archive_run(run_dir: str | os.PathLike, keep: Iterable[str | os.PathLike] = ()) -> Path | None:
    """Move the earlier run into ``run_dir/archive/<UTC time>/``: every entry except ``archive/`` and
    the top-level entries holding a path of ``keep`` (the new run's inputs, :func:`config_inputs`);
    returns that dir (None if there was nothing to move). Call on one rank only."""
    d = Path(run_dir)
    if not d.is_dir():
        return None
    root = d.resolve()
    kept = set()
    for k in keep:
        p = Path(k).resolve()
        if p.is_relative_to(root) and p != root:
            kept.add(p.relative_to(root).parts[0])
    present = sorted(e.name for e in d.iterdir() if e.name not in (ARCHIVE, *kept))
    if not present:
        return None
    dest = d / ARCHIVE / time.strftime("%Y%m%d-%H%M%S", time.gmtime())
    n = 0
    while dest.exists():
        n += 1
        dest = dest.with_name(f"{dest.name.split('.')[0]}.{n}")
    dest.mkdir(parents=True)
    for name in present:
        os.rename(d / name, dest / name)
    log.warning("--overwrite: the earlier run in %s was moved to %s (%d entr%s%s)", d, dest, len(present),
                "y" if len(present) == 1 else "ies", f"; kept as inputs: {', '.join(sorted(kept))}" if kept else "")
    return dest
