"""The engine registry: ``rollout.engine`` names a registered engine class, strict at both ends.

An engine is one class satisfying :class:`~megatron_rl.rollout.engine.RolloutEngine` plus the
weight-transfer call of its transports (``weight_transfer(method, **kwargs)``: vLLM's worker
lifecycle ``init_weight_transfer_engine`` / ``start_weight_update`` / ``update_weights`` /
``finish_weight_update`` / ``shutdown_weight_transfer_engine``, and ``"stats"``), registered with
``@register_engine(name)`` and declaring what it can do in a class attribute ``CAPS``
(:class:`EngineCaps`). The trainer, the start-up checks and the Ray bridge ask the class, never the
name: which weight transports it accepts (and what its receiving side of each is called), whether
its sleep frees memory and where, tensor parallelism, which optional ``rollout.*`` arguments it
takes, which distributions its process imports.

* Registering a name twice raises; an unknown name raises listing the sorted valid names.
* The built-in engines (:data:`BUILTIN`) register when their module is first asked for (``engine_class``):
  importing this registry, or the config that names it, loads no engine module; an engine module imports
  its library (vLLM, transformers) only when an engine is built, so asking a class its capabilities
  imports neither.
* An engine from outside the package registers when its module is imported: name the module in
  the top-level ``plugins:`` key (``megatron_rl/plugins.py``). The engine actors (other processes,
  without the config) build it from its import path (:func:`engine_path`), so that module must be
  importable there too (``PYTHONPATH``).
"""
from __future__ import annotations

import dataclasses
import importlib
import json
import os
import subprocess
import sys
from collections.abc import Mapping
from typing import Any

#: optional constructor arguments an engine may take from ``rollout.*`` (``trainer/loop/setup.client_args``)
OPTIONS = frozenset({"kv_cache_gib", "enable_sleep_mode", "gpu_memory_utilization", "enforce_eager", "tensor_parallel_size"})
WHERE = ("always", "cuda", "never")
#: top-k / top-p rules the trainer's μ reproduces (``algorithms/sampling.py``): vLLM's sort path
SAMPLERS = ("sort",)
#: the vLLM version the sampler rule was checked against (``tests/unit/algorithms/test_sampling_vllm_oracle.py``)
SAMPLER_CHECKED_VLLM = "0.32.0"


@dataclasses.dataclass(frozen=True)
class EngineCaps:
    """What an engine class can do (the class attribute ``CAPS``).

    Attributes:
        transports: ``rollout.sync_backend`` value -> the engine's receiving side of that transport,
            passed to the constructor as ``weight_transfer=`` (vLLM: the ``weight_transfer_config``
            backend of its worker). The keys are the transports it accepts (``rollout/transport.py``).
        sleep: where ``sleep()`` / ``wake()`` free and restore its memory (``rollout.placement=colocated``
            needs it): always | cuda | never.
        tensor_parallel: where ``tensor_parallel_size`` > 1 works: always | cuda | never.
        full_logprobs_any_temperature: ``logprobs="full"`` at any temperature (False: only at 1).
        options: the optional ``rollout.*`` constructor arguments it takes (subset of :data:`OPTIONS`);
            every engine takes ``max_model_len``, ``seed``, ``dtype``, ``logprobs``, ``weight_transfer``.
        requires: distributions its process imports whose versions the stack check pins (``stack.py``).
        host_kv_cache_option: ``kv_cache_gib`` is host memory it allocates on a machine without CUDA
            (checked against the host's memory at start-up).
        inflight_updates: takes a weight push while requests are in flight (pause, load, cache reset,
            resume; ``rollout/vllm_async_engine.py``), reports each response token's weight version
            (``Completion.versions``) and serves several calls at once (its Ray actor is threaded).
        sampling_check: ``"module:function"`` of the engine library's own limits on sampling values,
            ``function(SamplingParams, logprobs_mode) -> (field, words) | None`` (vLLM:
            ``rollout/vllm_requests.sampling_refusal``), run by the start-up checks in a child process
            (:meth:`sampling_refusals`); "" = none beyond ``SamplingParams``'s own.
        sampler: the top-k / top-p rule its sampler applies, one of :data:`SAMPLERS` — the rule the
            trainer scores the engine's tokens under. ``sort``: vLLM's ``apply_top_k_top_p_pytorch`` (top-k
            keeps every tie at the k-th value, top-p exact by sort and cumsum); vLLM on CUDA is pinned to
            it by ``patches/vllm_gpu_sort_sampler.py``.
    """

    transports: Mapping[str, str]
    sleep: str = "never"
    tensor_parallel: str = "never"
    full_logprobs_any_temperature: bool = True
    options: frozenset = frozenset()
    requires: tuple[str, ...] = ()
    host_kv_cache_option: bool = False
    inflight_updates: bool = False
    sampling_check: str = ""
    sampler: str = "sort"

    def __post_init__(self):
        if not self.transports:
            raise ValueError("EngineCaps.transports: an engine accepts at least one weight transport")
        for field in ("sleep", "tensor_parallel"):
            if getattr(self, field) not in WHERE:
                raise ValueError(f"EngineCaps.{field} must be one of {'|'.join(WHERE)}, got {getattr(self, field)!r}")
        if self.sampler not in SAMPLERS:
            raise ValueError(f"EngineCaps.sampler must be one of {'|'.join(SAMPLERS)} (the rules the trainer's "
                             f"sampling distribution reproduces), got {self.sampler!r}")
        if unknown := sorted(set(self.options) - OPTIONS):
            raise ValueError(f"EngineCaps.options: unknown option(s) {unknown}; valid: {sorted(OPTIONS)}")

    def sampling_refusals(self, asks: list[tuple[Any, str]]) -> list[tuple[str, str] | None]:
        """For each ``(SamplingParams, logprobs mode)``: ``(field, words)`` when the engine's library refuses or
        changes it (:attr:`sampling_check`), else None. Asked in ONE child process: the library stays out of the
        caller's process (vLLM's import loads ~170 modules and sets environment variables --
        ``TORCHINDUCTOR_COMPILE_THREADS``, ``LD_LIBRARY_PATH`` -- that the trainer and every process it starts
        would inherit); answers are kept per process, so a question is asked once."""
        if not self.sampling_check:
            return [None] * len(asks)
        keys = [json.dumps({"check": self.sampling_check, "fields": dataclasses.asdict(sp), "mode": mode}, sort_keys=True)
                for sp, mode in asks]
        new = sorted({k for k in keys if k not in _ANSWERS})
        if new:
            _ANSWERS.update(zip(new, _ask_child([json.loads(k) for k in new])))
        return [_ANSWERS[k] for k in keys]

    def sleeps(self, cuda: bool) -> bool:
        """Whether ``sleep()`` frees memory on this machine."""
        return self.sleep == "always" or (self.sleep == "cuda" and cuda)

    def tp(self, cuda: bool) -> bool:
        """Whether tensor parallelism > 1 runs on this machine."""
        return self.tensor_parallel == "always" or (self.tensor_parallel == "cuda" and cuda)


_ENGINES: dict[str, type] = {}
_ANSWERS: dict[str, tuple[str, str] | None] = {}   # EngineCaps.sampling_refusals' answers, by question

_CHILD = """
import importlib, json, sys
SamplingParams = importlib.import_module("megatron_rl.rollout.engine").SamplingParams
out = []
for a in json.loads(sys.argv[1]):
    f = a["fields"]
    sp = SamplingParams(**{**f, "stop_token_ids": tuple(f["stop_token_ids"])})
    module, fn = a["check"].split(":")
    out.append(getattr(importlib.import_module(module), fn)(sp, a["mode"]))
print(json.dumps(out))
"""


def _ask_child(asks: list[dict]) -> list[tuple[str, str] | None]:
    """Run each ``ask["check"]`` on its sampling values in one child interpreter (the library's logging off
    there); a check that cannot run is one line naming it."""
    env = {**os.environ, "VLLM_CONFIGURE_LOGGING": "0", "VLLM_LOGGING_LEVEL": "ERROR"}
    r = subprocess.run([sys.executable, "-c", _CHILD, json.dumps(asks)], capture_output=True, text=True, env=env,
                       timeout=300, check=False)
    if r.returncode != 0:
        last = (r.stderr.strip().splitlines() or ["no output"])[-1]
        raise ValueError(f"the engine's sampling check {asks[0]['check']} could not run: {last}")
    return [None if a is None else (a[0], a[1]) for a in json.loads(r.stdout.strip().splitlines()[-1])]


#: the built-in engines: name -> the module whose import registers it (on first use, :func:`engine_class`)
BUILTIN = {"hf": "megatron_rl.rollout.hf_engine", "vllm": "megatron_rl.rollout.vllm_engine",
           "vllm-async": "megatron_rl.rollout.vllm_async_engine"}


def register_engine(name: str):
    """Class decorator: ``rollout.engine=<name>`` builds this class (which must carry ``CAPS``)."""
    def deco(cls: type) -> type:
        if name in BUILTIN and cls.__module__ != BUILTIN[name]:
            engine_class(name)    # a built-in name is taken: its class registers now, and the line names it
        if name in _ENGINES:
            raise ValueError(f"rollout engine {name!r} is already registered (by {_ENGINES[name].__qualname__})")
        if not isinstance(getattr(cls, "CAPS", None), EngineCaps):
            raise TypeError(f"rollout engine {name!r}: {cls.__qualname__}.CAPS must be an EngineCaps")
        _ENGINES[name] = cls
        return cls
    return deco


def engine_names() -> list[str]:
    """The registered engine names (the built-in ones included), sorted."""
    return sorted(set(_ENGINES) | set(BUILTIN))


def engine_class(name: str) -> type:
    """The class registered as ``name`` (a built-in one's module imported on first use); ``ValueError``
    naming the sorted valid names otherwise."""
    if name not in _ENGINES and name in BUILTIN:
        importlib.import_module(BUILTIN[name])
    try:
        return _ENGINES[name]
    except KeyError:
        raise ValueError(f"rollout.engine: unknown engine {name!r}; registered: {', '.join(engine_names())} "
                         "(an engine of your own registers from a module named in plugins:)") from None


def caps(name: str) -> EngineCaps:
    """``engine_class(name).CAPS``."""
    return engine_class(name).CAPS


def engine_path(name: str) -> str:
    """``module:Class`` of the engine registered as ``name``: how an engine actor imports it."""
    cls = engine_class(name)
    return f"{cls.__module__}:{cls.__qualname__}"


def make_engine(kind: str, model_dir: str, **kwargs):
    """Build an engine: a registered name, or ``package.module:Class`` (an engine class imported by
    path in the engine's own process — how an actor builds a plugin's engine, or the fault-injecting
    engines of ``tests/helpers/sync_faults.py``)."""
    if ":" in kind:
        mod, _, cls = kind.partition(":")
        obj = importlib.import_module(mod)
        for part in cls.split("."):
            obj = getattr(obj, part)
        return obj(model_dir, **kwargs)
    return engine_class(kind)(model_dir, **kwargs)
