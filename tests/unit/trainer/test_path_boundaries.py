"""A method family lives in one room, entered through the DataPath hooks: no trainer module outside
``trainer/paths/`` imports a family's module (only the registry is shared; the contexts and containers live
below both in ``trainer/contract.py``), and the hooks the pipeline calls are declared on ``DataPath`` with
their typed contexts."""
from __future__ import annotations

import inspect
from pathlib import Path

import megatron_rl
from megatron_rl.trainer import paths as P
from megatron_rl.trainer.contract import CollectContext, PathSetup, UpdateContext
from tests.helpers.imports import module_imports

PKG = Path(megatron_rl.__file__).parent
PATHS = Path(P.__file__).parent


def _imports(f: Path) -> set[str]:
    """Absolute names of the modules ``f`` imports (relative imports resolved), at any level."""
    return module_imports(f, with_names=True)


def _family(name: str) -> str | None:
    """The family module ``name`` lies in (``two_attempts``, ``teacher`` …), None for the shared registry
    (``megatron_rl.trainer.paths`` itself) or a name that is no module under ``trainer/paths/``."""
    parts = name.split(".")
    if parts[:3] != ["megatron_rl", "trainer", "paths"] or len(parts) < 4:
        return None
    return parts[3] if (PATHS / parts[3]).is_dir() or (PATHS / f"{parts[3]}.py").is_file() else None


def test_no_trainer_module_outside_paths_imports_a_family():
    bad = []
    for f in (PKG / "trainer").rglob("*.py"):
        if PATHS in f.parents:
            continue
        fams = sorted({x for x in map(_family, _imports(f)) if x})
        if fams:
            bad.append((str(f.relative_to(PKG)), fams))
    assert not bad, f"shared trainer modules reach into a family's module: {bad}"
    # the check itself: an import of the teacher's support passes would be caught
    assert _family("megatron_rl.trainer.paths.teacher.support") == "teacher"
    assert _family("megatron_rl.trainer.paths.DataPath") is None and _family("megatron_rl.trainer.contract") is None


def test_teacher_family_is_one_package():
    fam = PATHS / "teacher"
    assert sorted(p.name for p in fam.glob("*.py")) == ["__init__.py", "inputs.py", "path.py", "support.py", "weights.py"]
    for gone in ("teacher.py", "teacher_inputs.py", "support.py"):
        assert not (PKG / "trainer" / gone).exists(), gone


def test_hooks_the_pipeline_calls_are_declared_with_their_contexts():
    hooks = {"setup": PathSetup, "collect": CollectContext, "sampled": UpdateContext, "join_rewards": UpdateContext, "after_logprobs": UpdateContext,
             "train_rows": UpdateContext, "mini_batch_inputs": UpdateContext}
    for name, ctx in hooks.items():
        sig = inspect.signature(getattr(P.DataPath, name))
        first = list(sig.parameters.values())[1]
        assert first.name == "ctx" and first.annotation == ctx.__name__, (name, first)
    for name in ("after_optimizer_step", "logged", "trained", "driver_stats", "shadow_weights", "state_dict",
                 "load_state_dict", "close"):
        assert callable(getattr(P.DataPath, name)), name
