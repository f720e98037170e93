"""The self-distillation family, in one package: its data paths ``rlcsd_hints`` (rlcsd, opsd_ectr,
rlsd_ectr) and ``gt_teacher`` (opsd, sdpo, srpo, rlsd), entered from the update pipeline only through
the :class:`~megatron_rl.trainer.paths.DataPath` hooks.

    path.py      the two paths: teacher plan after the advantages (``train_rows``), the support passes
                 per mini-batch (``mini_batch_inputs``), the schedule tick (``after_optimizer_step``)
    weights.py   the teacher weights θ̄ and their schedule (fixed / snapshot / ema)
    inputs.py    teacher prompts (templates), hint plans, packing of the teacher sequences
    support.py   the support passes: packed teacher forwards under θ̄, the student's top-k pass

Its configuration is the top-level ``teacher:`` section (``config.TeacherConfig``: kept in the
config layer, which imports nothing of the trainer, so a config loads without this package) and the
methods' ``TeacherHParams`` (``algorithms/hparams.py``).
"""
from .path import GtTeacherPath, HintsPath, TeacherPath  # noqa: F401  (registers the paths on import)
