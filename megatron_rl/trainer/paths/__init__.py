"""Registered data paths: how a method gets its training data and what the update trains on.

Strict like the advantage / loss registries (``algorithms/registry.py``): ``@register_path(name)``
on a :class:`DataPath` subclass; a second registration of a name raises, so does a class that
leaves ``collect`` unimplemented (an incomplete path); an unknown name raises listing
the sorted valid names. Every method declares its path (``algorithms.register_algo_kind(...,
path=...)``) and :func:`path_class` / :meth:`DataPath.validate` check it at config load.

Built-in paths (one module each): ``plain`` and ``greedy`` (ReMax baseline) in ``plain.py`` —
with DAPO's overlong shaping and dynamic sampling as composable pieces for any hparams deriving
from ``SamplingHParams`` —, ``bicc_context`` (``bicc.py``), ``process_reward`` (PAPO's rubric
grader, ``process_reward.py``), ``rlcsd_hints`` / ``gt_teacher`` (self-distillation teacher,
the ``teacher/`` package), ``two_attempts`` (SCoRe, ``two_attempts.py``).

Life cycle (``trainer/loop/setup.py``, ``trainer/loop/rl_loop.py``); each hook is handed a small typed context
(``trainer/contract.py``) with what it may read, never the whole run:

    path = build_path(cfg, tok)          # start-up, before any model: templates / layouts fail here
    path.setup(PathSetup)                # after actor / reference: teacher weights, grader
    data = path.collect(CollectContext, step)   # DRIVER ONLY (global rank 0): engines, rewards, grader
                                         # start; no torch.distributed call — the loop broadcasts ``data``
    update(run, data, step)              # every rank: the ONE update pipeline (``trainer/pipeline/update.py``),
                                         # which asks the path's hooks (UpdateContext), in this order:
        path.sampled(ctx, data, step)              # the sampled sequences and per-row inputs
        path.after_logprobs(ctx, s, lp, metrics)   # after the old / ref passes (PAPO waits for its grader)
        path.train_rows(ctx, s, rows, lp, ...)     # the rows the loss trains on (BiCC's conditioned
                                                   # sequences, the teacher plan's kept subset)
        path.mini_batch_inputs(ctx, rows, ...)     # per mini-batch, under the weights of that moment
                                                   # (the teacher family's support passes)
        path.after_optimizer_step()                # after each optimizer step (teacher schedules)
    path.state_dict() / load_state_dict()   # per-path checkpoint extras (teacher counters)

With ``rollout.max_staleness`` > 0 ``collect`` runs on a producer thread of the driver for steps
ahead of the update (``trainer/loop/async_source.py``), so it must not touch state that ``update`` of
an earlier step still uses; a path that cannot run so names why in ``async_unsupported``.
"""
from __future__ import annotations

from .base import BASE_INPUTS, DataPath, build_path, get_path, path_class, path_names, register_path

from . import bicc, plain, process_reward, teacher, two_attempts  # noqa: F401  (each registers its path)

__all__ = ["BASE_INPUTS", "DataPath", "build_path", "get_path", "path_class", "path_names",
           "register_path"]
