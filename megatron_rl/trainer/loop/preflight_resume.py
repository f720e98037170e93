"""The start-up checks of a resume that read the checkpoint itself (``preflight.preflight`` runs them, so
``train --check`` refuses what the resume would): its step against ``trainer.steps``, and what it holds in
flight against this configuration. The saved ``config.yaml`` against this one: ``trainer/state/run_config.py``."""
from __future__ import annotations

import json
from pathlib import Path

from megatron_rl.trainer.loop.async_source import resume_refusal


def check_resume_step(cfg, resume: str | None) -> None:
    """The checkpoint a resume continues is not past ``trainer.steps`` (else the run would start Ray,
    train nothing and export the checkpoint's weights over ``hf/``)."""
    if resume is None:
        return
    from megatron_rl.trainer.state.checkpoint import find_latest  # lazy: defers numpy, torch to the call

    ck = find_latest(cfg.trainer.run_dir) if resume == "auto" else Path(resume)
    if ck is None:
        return
    try:
        step = int(json.loads((ck / "COMPLETE").read_text()).get("step"))
    except (OSError, ValueError, TypeError, AttributeError):
        step = int(ck.name[5:]) if ck.name.startswith("step_") and ck.name[5:].isdigit() else None
    if step is not None and step > cfg.trainer.steps:
        raise ValueError(f"--resume {resume}: the checkpoint {ck.name} is at step {step}, past trainer.steps="
                         f"{cfg.trainer.steps}: nothing to train; set trainer.steps above {step} to continue the run")


def check_resume_state(cfg, resume: str | None) -> None:
    """What the resumed checkpoint holds in flight against this run (``async_source.resume_refusal``: batches
    generated ahead at another ``rollout.max_staleness``, partial groups without ``rollout.partial``): refused
    here, so ``--check`` refuses what the resume would, before anything starts (it was exit 1 after start-up)."""
    if resume is None:
        return
    from megatron_rl.trainer.state.checkpoint import find_latest  # lazy: defers numpy, torch to the call

    ck = find_latest(cfg.trainer.run_dir) if resume == "auto" else Path(resume)
    if ck is None or not (ck / "extra_state.pt").is_file():
        return
    import torch  # lazy: the checkpoint's own pickle

    extra = torch.load(ck / "extra_state.pt", weights_only=False, map_location="cpu")
    why = resume_refusal(extra.get("async") if isinstance(extra, dict) else None, cfg.rollout.max_staleness,
                         cfg.rollout.partial.enable)
    if why:
        raise ValueError(f"--resume {resume} ({ck.name}): {why}")
