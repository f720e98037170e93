"""The in-flight engine (``rollout.engine=vllm-async``): vLLM's ``AsyncLLM``, weights pushed while requests run.

The synchronous ``vllm`` engine (``vllm.LLM``) serves one call at a time, so a push waits until no
request is in flight. This engine runs ``AsyncLLM`` on an event loop of its own (a daemon thread of
the engine's process) and takes calls from several threads at once (the Ray actor is threaded,
``EngineCaps.inflight_updates``): requests are submitted and harvested while a push runs.

A push (the weight-transfer lifecycle of every transport, :meth:`AsyncVLLMEngine.weight_transfer`):

1. ``start_weight_update`` -> ``pause_generation(mode="keep", clear_cache=True)``: the scheduler
   stops stepping with every request kept; in vLLM 0.32 the cache clear preempts the running
   requests (``reset_prefix_cache(reset_running_requests=True)``: their KV blocks freed, requests
   moved back to the waiting queue with their tokens so far) and empties the prefix cache. No
   request is aborted and no token already delivered is dropped.
2. the transport's rounds load the new weights (``update_weights``, one call per round or per bucket:
   a gloo or NCCL broadcast, a Ray bucket, a CUDA IPC handle, or a bucket carried in the call by the
   in-process :meth:`AsyncVLLMEngine.update_weights`) — all of them while generation stands paused;
3. ``finish_weight_update`` (with the new ``weight_version``): the layerwise reload is finalised,
   the prefix cache is reset AGAIN with running requests preempted and the call must succeed
   (raised otherwise) — the known trap is ``reset_prefix_cache()`` being a silent no-op while
   requests hold blocks (NeMo-RL #3929); nothing was scheduled since the pause, so this reset
   finds the cache empty, and it is what makes the guarantee independent of the pause's own
   clear — then vLLM's weight version label is set and generation resumes.

So every token sampled after the push is sampled from the whole new set of weights (every bucket is
loaded between the pause and the resume, whatever the transport) and from KV recomputed under them (the
preempted requests re-prefill prompt + tokens so far), which ``tests/e2e/test_inflight_push.py``
proves against HF transformers under the new weights, for requests running during the push that
share a long prefix with cached ones. The response keeps the tokens sampled before the push with
their log-probs (the behaviour policy of each token is the version that sampled it).

Transports (``CAPS.transports``, the sync engine's: :data:`~megatron_rl.rollout.vllm_engine.VLLM_TRANSPORTS`):
``gloo`` / ``ray`` (our CPU worker engine) and vLLM's own ``nccl`` / ``ipc`` (CUDA only: refused at
start-up without it, ``transport.resolve_backend``). The worker sits in ``AsyncLLM``'s engine-core process,
so every ``collective_rpc`` payload crosses vLLM's msgpack: a Ray bucket goes as bytes, and CUDA IPC handles
(tuples holding classes, which that msgpack refuses) go pickled to the worker extension
(:meth:`~megatron_rl.rollout.vllm_worker_ext.AsyncWorkerExtension.mrl_update_weights`), which hands them to
the worker's own ``update_weights`` — the same call the sync engine makes in-process
(:func:`core_payload`). NCCL's payloads are plain metadata and cross as they are.

Per-token versions: vLLM labels each output step with the engine's weight version and returns,
with a finished request, the spans of its output tokens per label (``CompletionOutput.weight_versions``);
:class:`~megatron_rl.rollout.engine.Completion` carries them expanded, one version per response
token, beside the per-token behaviour log-probs.

Two ways to ask for responses: ``generate`` (blocking, the ``RolloutEngine`` call: every request
submitted, all awaited) and ``submit`` / ``harvest`` (a driver keeping more groups in flight than a
step consumes: submit groups under keys, collect the finished ones as they end).
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import itertools
import logging
import os
import threading
import time
from collections.abc import Iterable

import torch

from .engine import Completion, SamplingParams, validate_prompts
from .registry import EngineCaps, register_engine
from .vllm_engine import _VLLM_LOGPROBS_MODE, SAMPLING_CHECK, VLLM_TRANSPORTS, cpu_engine_args
from .vllm_requests import prompt_logprobs, request_params, sampled_logprobs, score_params
from .weight_sync import DEFAULT_BUCKET_BYTES, RoundSource, push_inline
from ..config_parse import LOGPROB_MODES

log = logging.getLogger("megatron_rl.rollout.vllm_async")

#: a call into the engine's loop that takes longer than this is an error, not a hang
CALL_TIMEOUT_S = 3600.0


class _Loop:
    """An asyncio loop on a daemon thread; :meth:`run` executes a coroutine there from any thread."""

    def __init__(self):
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="vllm-async-loop", daemon=True)
        self.thread.start()

    def submit(self, coro) -> concurrent.futures.Future:
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    def run(self, coro, timeout: float = CALL_TIMEOUT_S):
        return self.submit(coro).result(timeout=timeout)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=10)


def token_versions(spans, n_tokens: int) -> tuple[int, ...]:
    """vLLM's ``weight_versions`` spans (``version``, ``[start, end)``) -> one int version per token.
    A response whose tokens carry no label (the engine set none) is an error, never a guess."""
    if n_tokens == 0:
        return ()
    if not spans:
        raise RuntimeError("vLLM returned no weight-version spans for a response (the engine's version was never set)")
    out = [int(s.version) for s in spans for _ in range(s.start, s.end)]
    if len(out) != n_tokens:
        raise RuntimeError(f"weight-version spans cover {len(out)} tokens of a {n_tokens}-token response")
    return tuple(out)


def core_payload(method: str, kwargs: dict) -> tuple[str, dict]:
    """A weight-transfer call as it crosses into ``AsyncLLM``'s engine-core process: ``(rpc method, kwargs)``.

    vLLM's msgpack turns a tensor in a utility call into a nested list and refuses what it cannot encode
    (``MsgpackEncoder.enc_hook``), so an ``update_weights`` payload is adapted, nothing else:

    * a packed bucket (``buffer``: the ``ray`` transport, the in-process push) goes as a byte view (no copy
      here; ``transfer_engines.PackedUpdateInfo`` rebuilds the tensor);
    * CUDA IPC handles (``ipc_handles``: vLLM's ``ipc`` engine; ``torch.multiprocessing`` rebuild arguments,
      which hold classes) go pickled to :meth:`AsyncWorkerExtension.mrl_update_weights`, which unpickles them
      in the worker and calls its ``update_weights`` — what vLLM's own HTTP client does with
      ``ipc_handles_pickled``, without turning on ``VLLM_ALLOW_INSECURE_SERIALIZATION`` (pickle for every
      message) in the engine; the payload comes from the trainer through Ray, which pickled it already.
    """
    info = kwargs.get("update_info") if method == "update_weights" else None
    if not isinstance(info, dict):
        return method, kwargs
    if info.get("ipc_handles") is not None:
        import pickle  # lazy: only the ipc transport's payload is pickled

        return "mrl_update_weights", {"payload": pickle.dumps(info, protocol=pickle.HIGHEST_PROTOCOL)}
    if isinstance(info.get("buffer"), torch.Tensor):
        return method, {**kwargs, "update_info": {**info, "buffer": memoryview(info["buffer"].contiguous().numpy())}}
    return method, kwargs


@register_engine("vllm-async")
class AsyncVLLMEngine:
    """``RolloutEngine`` on ``vllm.v1.engine.async_llm.AsyncLLM`` with in-flight weight pushes (module docstring).

    ``CAPS``: the sync engine's transports (:data:`~megatron_rl.rollout.vllm_engine.VLLM_TRANSPORTS`):
    ``gloo`` / ``ray`` (our worker engine, registered in the spawned worker by
    :mod:`~megatron_rl.rollout.vllm_worker_ext`) and vLLM's ``nccl`` / ``ipc`` (CUDA only; with the
    training loop's ``placement=separate``, which partial rollouts need, that is ``nccl``: ``ipc`` shares
    one GPU); no sleep mode (a sleeping engine has nothing in flight: colocated runs use ``vllm``); tensor
    parallel size 1; in-flight updates."""

    CAPS = EngineCaps(transports=VLLM_TRANSPORTS, sleep="never", tensor_parallel="never",
                      full_logprobs_any_temperature=False, options=frozenset({"kv_cache_gib", "enforce_eager",
                                                                              "gpu_memory_utilization"}),
                      requires=("vllm",), inflight_updates=True, sampling_check=SAMPLING_CHECK)

    def __init__(self, model_dir: str, *, dtype: str = "float32", seed: int = 0, max_model_len: int = 512,
                 kv_cache_gib: float = 1.0, max_num_seqs: int = 256, gpu_memory_utilization: float = 0.5,
                 weight_transfer: str = "gloo", logprobs: str = "processed", enforce_eager: bool = True):
        if logprobs not in LOGPROB_MODES:
            raise ValueError(f"logprobs must be one of {LOGPROB_MODES}, got {logprobs!r}")
        self.logprobs, self.max_model_len = logprobs, max_model_len
        cores = os.environ.get("MEGATRON_RL_CPU_CORES")   # asynchronous runs: the engines' own cores (engine_pool)
        if cores and "VLLM_CPU_OMP_THREADS_BIND" not in os.environ:
            os.environ["VLLM_CPU_OMP_THREADS_BIND"] = cores   # the spawned worker's OMP threads stay on them
        self._loop = _Loop()
        self._ids = itertools.count()
        self._lock = threading.Lock()           # one push at a time (a threaded actor may call concurrently)
        self._pending: dict = {}                # submit(): key -> future of its completions
        self._done = threading.Condition()
        self.version = 0
        self.pushes = 0
        self.pause_s = 0.0
        self.cache_resets = 0
        self.last_push: dict = {}               # the last in-process push (update_weights): buckets, bytes
        # generating = a request in flight and generation not paused for a push (:meth:`busy_seconds`);
        # the state changes and the clock run on the loop thread only (:meth:`_mark`)
        self._active, self._paused, self._busy_s, self._t_mark = 0, False, 0.0, time.perf_counter()
        self.llm = self._loop.run(self._build(model_dir, dtype=dtype, seed=seed, max_model_len=max_model_len,
                                              kv_cache_gib=kv_cache_gib, max_num_seqs=max_num_seqs,
                                              gpu_memory_utilization=gpu_memory_utilization,
                                              weight_transfer=weight_transfer, enforce_eager=enforce_eager))
        self.vocab_size = self.llm.model_config.get_vocab_size()

    async def _build(self, model_dir: str, *, kv_cache_gib: float, weight_transfer: str, **kw):
        from vllm.engine.arg_utils import AsyncEngineArgs  # lazy: defers vllm to the call
        from vllm.platforms import current_platform  # lazy: defers vllm to the call
        from vllm.v1.engine.async_llm import AsyncLLM  # lazy: defers vllm to the call

        from .vllm_worker_ext import prepare_worker_process  # lazy: imports vLLM

        prepare_worker_process()   # this process too: the factory validates the backend name here
        extra = {}
        if current_platform.is_cpu():
            extra = cpu_engine_args(kv_cache_gib, kw["max_model_len"])   # chunked prefill off (its docstring)
        args = AsyncEngineArgs(model=model_dir, skip_tokenizer_init=True, logprobs_mode=_VLLM_LOGPROBS_MODE[self.logprobs],
                               weight_transfer_config={"backend": weight_transfer},
                               worker_extension_cls="megatron_rl.rollout.vllm_worker_ext.AsyncWorkerExtension",
                               disable_log_stats=True, **extra, **kw)
        llm = AsyncLLM.from_engine_args(args)
        await llm.update_weight_version("0")
        return llm

    # ---- generation ---------------------------------------------------------------------------
    def _params(self, s: SamplingParams, i: int):
        from vllm.sampling_params import RequestOutputKind  # lazy: defers vllm to the call

        return request_params(s, i, self.logprobs, output_kind=RequestOutputKind.FINAL_ONLY)

    async def _final(self, prompt: list[int], params):
        """The request's last ``RequestOutput`` (all of it under ``FINAL_ONLY``)."""
        from vllm.inputs import TokensPrompt  # lazy: defers vllm to the call

        final = None
        async for out in self.llm.generate(TokensPrompt(prompt_token_ids=list(prompt)), params, str(next(self._ids))):
            final = out
        return final

    async def _outputs(self, prompt: list[int], params) -> list:
        """The request's final ``CompletionOutput`` per sample, in sample order."""
        return sorted((await self._final(prompt, params)).outputs, key=lambda c: c.index)

    async def _request(self, prompt: list[int], params) -> list[tuple]:
        self._begin()
        try:
            outputs = await self._outputs(prompt, params)
        finally:
            self._end()
        res = []
        for c in outputs:
            ids = list(c.token_ids)
            res.append((tuple(ids), sampled_logprobs(c, ids), token_versions(c.weight_versions, len(ids)),
                        "length" if c.finish_reason == "length" else "stop"))
        return res

    def _mark(self, active: int = 0, paused: bool | None = None) -> None:
        """Loop thread: close the interval since the last mark (generating or not), then change the state
        (``active`` requests more or fewer, ``paused`` for a push)."""
        now = time.perf_counter()
        if self._active and not self._paused:
            self._busy_s += now - self._t_mark
        self._t_mark = now
        self._active += active
        self._paused = self._paused if paused is None else paused

    def _begin(self) -> None:
        self._mark(+1)

    def _end(self) -> None:
        self._mark(-1)

    def busy_seconds(self) -> float:
        """Seconds the engine was generating since it started: at least one request in flight and
        generation not paused for a push (a push's pause is idle time, whatever is in flight);
        ``1 − Δbusy / Δwall`` is its idle fraction over a window (``perf/engine_idle_frac``)."""
        return self._loop.run(self._busy_now())

    async def _busy_now(self) -> float:
        self._mark()
        return self._busy_s

    async def _pause(self) -> None:
        self._mark(paused=True)
        await self.llm.pause_generation(mode="keep", clear_cache=True)

    async def _resume(self) -> None:
        await self.llm.resume_generation()
        self._mark(paused=False)

    def generate(self, prompts: list[list[int]], sampling: SamplingParams) -> list[Completion]:
        """All ``n`` samples of every prompt, ordered by (prompt_index, sample_index); a push may run
        meanwhile (each token's version says which weights sampled it)."""
        validate_prompts(prompts, self.max_model_len, sampling.max_tokens, self.vocab_size)
        futs = [self._loop.submit(self._request(p, self._params(sampling, i))) for i, p in enumerate(prompts)]
        out = []
        for i, (p, f) in enumerate(zip(prompts, futs)):
            for j, (ids, lps, vers, fin) in enumerate(f.result(timeout=CALL_TIMEOUT_S)):
                out.append(Completion(i, j, tuple(p), ids, lps, fin, vers))
        return out

    def submit(self, key, prompt: list[int], sampling: SamplingParams) -> None:
        """Start one group (``sampling.n`` samples of ``prompt``, seed ``sampling.seed`` as is) under
        ``key``; :meth:`harvest` returns it once every sample finished."""
        validate_prompts([prompt], self.max_model_len, sampling.max_tokens, self.vocab_size)
        if key in self._pending:
            raise ValueError(f"a group with key {key!r} is already in flight")
        fut = self._loop.submit(self._request(prompt, self._params(sampling, 0)))
        self._pending[key] = (tuple(prompt), fut)
        fut.add_done_callback(lambda _f: self._notify())

    def _notify(self) -> None:
        with self._done:
            self._done.notify_all()

    def harvest(self, wait_s: float = 0.0, min_groups: int = 1) -> list[tuple]:
        """The finished groups as ``(key, [Completion per sample])`` (prompt_index 0), waiting up to
        ``wait_s`` for at least ``min_groups`` of them (fewer when fewer are in flight)."""
        deadline = time.monotonic() + wait_s
        with self._done:
            while True:
                ready = [k for k, (_p, f) in self._pending.items() if f.done()]
                left = deadline - time.monotonic()
                if len(ready) >= min(min_groups, len(self._pending)) or left <= 0:
                    break
                self._done.wait(timeout=left)
        out = []
        for k in ready:
            prompt, fut = self._pending.pop(k)
            out.append((k, [Completion(0, j, prompt, ids, lps, fin, vers)
                            for j, (ids, lps, vers, fin) in enumerate(fut.result())]))
        return out

    def in_flight(self) -> list:
        """Keys of the submitted groups not harvested yet."""
        return list(self._pending)

    def score(self, sequences: list[list[int]], prompt_lens: list[int], temperature: float = 1.0) -> list[list[float]]:
        """Log-probs of ``sequences[i][prompt_lens[i]:]`` under the current weights (prompt log-probs;
        vLLM does not read the prefix cache for them)."""
        sp = score_params(temperature)
        outs = [self._loop.submit(self._final(s, sp)) for s in sequences]
        return [prompt_logprobs(o.result(), list(s), n) for s, n, o in zip(sequences, prompt_lens, outs)]

    # ---- weights --------------------------------------------------------------------------------
    def weight_transfer(self, method: str, **kwargs):
        """A step of a push (module docstring): ``start_weight_update`` pauses (keep) and clears the
        caches, ``update_weights`` loads, ``finish_weight_update(weight_version=)`` finalises, resets
        the caches again, labels the version and resumes; ``init_…`` / ``shutdown_weight_transfer_engine``
        and ``"stats"`` pass through."""
        if method == "stats":
            return self._rpc("mrl_transfer_stats")
        if method == "start_weight_update":
            self._lock.acquire()
            self._t_pause = time.perf_counter()
            try:
                self._loop.run(self._pause())
                return self._rpc(method)
            except BaseException:
                self._lock.release()
                raise
        if method == "finish_weight_update":
            return self._finish(kwargs.pop("weight_version", None))
        return self._rpc(*core_payload(method, kwargs))   # what crosses into the engine core (core_payload)

    def _finish(self, version: int | None) -> None:
        try:
            self._rpc("finish_weight_update")
            if not self._loop.run(self.llm.reset_prefix_cache(reset_running_requests=True)):
                raise RuntimeError("vLLM refused to reset its prefix cache after a weight push: the engine would "
                                   "serve KV computed under the old weights")
            self.cache_resets += 1
            self.version = self.version + 1 if version is None else int(version)
            self._loop.run(self.llm.update_weight_version(str(self.version)))
            self._loop.run(self._resume())
            self.pushes += 1
            self.pause_s += time.perf_counter() - self._t_pause
        finally:
            self._lock.release()

    def _rpc(self, method: str, kwargs: dict | None = None):
        return self._loop.run(self.llm.collective_rpc(method, kwargs=kwargs or {}))[0]

    def update_weights(self, named_tensors: RoundSource | Iterable[tuple[str, torch.Tensor]],
                       weight_version: int | None = None, bucket_bytes: int = DEFAULT_BUCKET_BYTES) -> int:
        """An in-process push (:func:`~megatron_rl.rollout.weight_sync.push_inline`, as the sync engine's):
        the pause of a push, then buckets of ``bucket_bytes`` carried in the calls (one bucket of host memory at
        a time, never the model), then the finish (cache reset, version, resume) — so no token is sampled
        between two buckets. Returns the number of tensors loaded; ``last_push`` is its record."""
        finish = {} if weight_version is None else {"weight_version": weight_version}
        self.last_push = push_inline(self.weight_transfer, named_tensors, bucket_bytes, **finish)
        return self.last_push["tensors"]

    def named_parameters(self) -> dict[str, torch.Tensor]:
        """Copies of the worker model's parameters under vLLM's names."""
        from .vllm_worker_ext import decode  # lazy: its module prepares a worker process when imported

        return decode(self._rpc("mrl_params"))

    def hf_named_parameters(self) -> dict[str, torch.Tensor]:
        """Copies of the worker model's parameters under the trainer's HF names (sync verification)."""
        from .vllm_worker_ext import decode  # lazy: its module prepares a worker process when imported

        return decode(self._rpc("mrl_hf_params"))

    def engine_config(self) -> dict:
        """The settings the engine was built with, as vLLM recorded them."""
        c = self.llm.vllm_config
        return {"enforce_eager": bool(c.model_config.enforce_eager),
                "gpu_memory_utilization": float(c.cache_config.gpu_memory_utilization),
                "tensor_parallel_size": int(c.parallel_config.tensor_parallel_size),
                "max_model_len": int(c.model_config.max_model_len), "dtype": str(c.model_config.dtype)}

    def push_stats(self) -> dict:
        """Pushes taken in flight, seconds generation stood paused for them, cache resets, the weight
        version, seconds generating (``busy_s``: :meth:`busy_seconds`)."""
        return {"pushes": self.pushes, "pause_s": self.pause_s, "cache_resets": self.cache_resets, "version": self.version,
                "busy_s": self.busy_seconds()}

    def sleep(self, level: int = 1) -> None:
        raise RuntimeError("the vllm-async engine has no sleep mode (rollout.placement=colocated uses rollout.engine=vllm)")

    def wake(self, tags: tuple[str, ...] | None = None) -> None:
        raise RuntimeError("the vllm-async engine has no sleep mode: nothing to wake")

    def shutdown(self) -> None:
        llm, self.llm = getattr(self, "llm", None), None
        if llm is not None:
            llm.shutdown()
        self._loop.close()
