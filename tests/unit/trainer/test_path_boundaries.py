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


def _members(proto) -> dict:
    """The methods and attributes a Protocol declares (its own, no dunders)."""
    names = set(getattr(proto, "__annotations__", {})) | {k for k, v in vars(proto).items()
                                                          if callable(v) or isinstance(v, classmethod)}
    return {n: getattr(proto, n, None) for n in names if not n.startswith("_")}


def _implements(cls, proto) -> list[str]:
    """Members of ``proto`` that ``cls`` lacks, or whose parameters (after self / cls) it does not take by name."""
    bad = []
    for name, want in _members(proto).items():
        have = getattr(cls, name, None)
        if have is None:
            bad.append(f"{cls.__name__}.{name} missing")
        elif callable(want):
            need = list(inspect.signature(want).parameters)[1:] if not isinstance(inspect.getattr_static(proto, name), classmethod) \
                else list(inspect.signature(want).parameters)
            got = inspect.signature(have).parameters
            if any(p not in got for p in need):
                bad.append(f"{cls.__name__}.{name}{inspect.signature(have)} vs {proto.__name__}.{name}{inspect.signature(want)}")
    return bad


def test_sources_and_paths_implement_the_declared_protocols():
    """The three rollout sources are ``RolloutSource``s and every registered path is a ``CollectHooks`` and an
    ``UpdateHooks``: the loop and the partial source call a path only through what these declare (no probe)."""
    from megatron_rl.trainer.contract import CollectHooks, UpdateHooks
    from megatron_rl.trainer.loop.async_source import AsyncRollouts
    from megatron_rl.trainer.loop.partial_source import PartialRollouts
    from megatron_rl.trainer.loop.rollout_source import RolloutSource, SyncRollouts

    assert {"next", "before_push", "pushed", "state", "metrics", "close"} <= set(_members(RolloutSource))
    assert {"collect", "shape", "partial_refusal", "shares_rows"} <= set(_members(CollectHooks))
    bad = [b for c in (SyncRollouts, AsyncRollouts, PartialRollouts) for b in _implements(c, RolloutSource)]
    bad += [b for name in P.path_names() for proto in (CollectHooks, UpdateHooks) for b in _implements(P.get_path(name), proto)]
    assert not bad, bad
    src = (PKG / "trainer/loop/partial_source.py").read_text()
    assert "run.path." not in src and "100_003" not in src and "1_000_003" not in src   # calls, not copies
