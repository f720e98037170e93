"""Everything checkable before the model and Ray start, each failure one line naming the key: the entry
points of the start-up checks.

Two levels:

* :func:`load_checked` — ``config.load_config`` + the cross-component rules on the config alone
  (``preflight_rules.check_config``); every entry point that starts a run loads through it (``train``,
  ``demo``, ``plan --config``), and :func:`preflight` runs the rules again first for a ``Config`` built in code.
* :func:`preflight` — what a run on *this* machine needs, in order: first of all the torchrun variables and
  the Ray address answer (``launch_env``, bounded in time); the run's inputs (``preflight_inputs.py``:
  model, tokenizer, data and resume files, the model's weights, rows, rewards and prompts); the run
  directory may be used (``trainer/state/run_dir.py``) and a resume matches it (``preflight_resume.py``,
  ``run_config.check_resume``); this machine's resources (``preflight_resources.py``: the batch over
  ``WORLD_SIZE``, ``rollout.placement`` with its sync backend, KV-cache host memory, the engine's sampling
  limits, the layer backend and the installed vLLM / TE / megatron-core versions); and the LLM judge (PAPO's
  grader, ``papo_math``'s verifier) fits its served context and answers one real request of each prompt
  (``preflight_judge.check_grader``). ``setup_run`` calls it first thing (before ``init_parallel``);
  ``megatron-rl train --check`` too.
"""
from __future__ import annotations

import os

from megatron_rl.config import load_config
from megatron_rl.runtime import determinism
from megatron_rl.trainer.loop.preflight_inputs import (
    check_agent_rows,
    check_data,
    check_files,
    check_model_weights,
    check_prompts,
    check_reward_sources,
    check_row_fields,
)
from megatron_rl.trainer.loop.preflight_judge import check_grader
from megatron_rl.trainer.loop.preflight_resources import (
    check_backend,
    check_device_memory,
    check_engine_sampling,
    check_export_dir,
    check_kv_cache_memory,
    check_launch,
    check_reward_workers,
    check_rollout_placement,
    check_run_dir_writable,
    check_stack,
    check_world,
)
from megatron_rl.trainer.loop.preflight_resume import check_resume_state, check_resume_step
from megatron_rl.trainer.loop.preflight_rules import check_config, warn_inert_knobs
from megatron_rl.trainer.state.run_config import check_resume
from megatron_rl.trainer.state.run_dir import check_run_dir


def load_checked(path, overrides=()):
    """``config.load_config`` + :func:`check_config`: the config an entry point may start a run with."""
    cfg = load_config(path, list(overrides))
    check_config(cfg)
    return cfg


def preflight(cfg, resume: str | None = None, overwrite: bool = False, allow_config_change: bool = False) -> str:
    """All start-up checks of a run on this machine; returns the resolved layer backend."""
    check_config(cfg)   # already run by load_checked; again here for a Config built in code
    warn_inert_knobs(cfg)
    check_launch(cfg)
    check_files(cfg, resume)
    check_model_weights(cfg)
    check_data(cfg)
    check_reward_sources(cfg)
    check_row_fields(cfg)
    check_agent_rows(cfg)
    check_prompts(cfg)
    check_run_dir_writable(cfg)
    check_run_dir(cfg.trainer.run_dir, resume, overwrite)
    check_resume_step(cfg, resume)   # before check_resume's warning lines: a refusal is the only line
    check_resume_state(cfg, resume)
    check_resume(cfg, resume, allow_config_change)   # the saved run_dir/config.yaml against this one
    check_export_dir(cfg, overwrite)
    check_world(cfg)
    sync = check_rollout_placement(cfg)   # the resolved sync backend; below: deterministic + nccl on an old NCCL
    if why := determinism.nccl_refusal(cfg.trainer.deterministic, sync, determinism.nccl_version()):
        raise ValueError(why)
    check_kv_cache_memory(cfg)
    if os.environ.get("RANK", "0") == "0":   # the Ray driver, which alone talks to the engines (one child, not one a rank)
        check_engine_sampling(cfg)
    check_reward_workers(cfg)
    backend = check_backend(cfg)
    check_device_memory(cfg)
    check_stack(cfg, backend)
    check_grader(cfg)
    return backend
