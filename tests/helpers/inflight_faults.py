"""A fault-injecting in-flight engine for tests: the known trap of in-flight pushes, done on purpose.

:class:`StaleKVAsyncEngine` is the ``vllm-async`` engine until its fault is switched on (the actor's
``weight_transfer("set_fault", {"on": True})``, :func:`set_fault`); then it pauses with ``clear_cache=False``
and ends the push with a plain ``reset_prefix_cache()`` — vLLM's call that is a silent no-op while
requests hold KV blocks (NeMo-RL #3929) — so the running requests keep KV computed under the old
weights and the prefix cache keeps serving it. One engine serves the proof and its negative control
(an engine start is most of either test's time). ``tests/e2e/test_inflight_push.py`` shows its post-push log-probs far from
the new weights', i.e. that the proof can fail. Built by import path in the engine actor
(``RolloutClient.engine_impl``)."""
from __future__ import annotations

import time

from megatron_rl.rollout.ray_bridge import RolloutClient
from megatron_rl.rollout.vllm_async_engine import AsyncVLLMEngine


class StaleKVAsyncEngine(AsyncVLLMEngine):
    """``AsyncVLLMEngine`` whose push leaves old-weight KV in place (module docstring)."""

    fault = False

    def weight_transfer(self, method: str, **kwargs):
        if method == "set_fault":
            self.fault = bool(kwargs["on"])
            return None
        if not self.fault:
            return super().weight_transfer(method, **kwargs)
        if method == "start_weight_update":
            self._lock.acquire()
            self._t_pause = time.perf_counter()
            self._loop.run(self.llm.pause_generation(mode="keep", clear_cache=False))
            return self._rpc(method)
        if method == "finish_weight_update":
            try:
                self._rpc("finish_weight_update")
                self.stale_reset_ok = self._loop.run(self.llm.reset_prefix_cache())   # False while requests run
                self.version = int(kwargs.get("weight_version", self.version + 1))
                self._loop.run(self.llm.update_weight_version(str(self.version)))
                self._loop.run(self.llm.resume_generation())
                self.pushes += 1
            finally:
                self._lock.release()
            return None
        return super().weight_transfer(method, **kwargs)


class StaleKVClient(RolloutClient):
    """A pool of :class:`StaleKVAsyncEngine` (caps of ``vllm-async``)."""

    engine_impl = f"{__name__}:StaleKVAsyncEngine"


def set_fault(client: StaleKVClient, on: bool) -> None:
    """Switch every engine's fault on or off (module docstring)."""
    client._ray.get([a.weight_transfer.remote("set_fault", {"on": on}) for a in client.actors])


class LongTailAsyncEngine(AsyncVLLMEngine):
    """``vllm-async`` with a long tail on purpose: every fourth request (a group under ``submit``) ignores EOS
    and runs to ``max_tokens`` (the tiny chat model otherwise stops after ~18 tokens), so some responses are
    still decoding when the trainer pushes — whatever the host's load — and the loop's in-flight path is
    exercised by the workload, not by timing luck."""

    requests = 0

    def _params(self, s, i: int):
        p = super()._params(s, i)
        self.requests += 1
        if self.requests % 4 == 1:
            p.ignore_eos = True
        return p


class LongTailClient(RolloutClient):
    """A pool of :class:`LongTailAsyncEngine` (caps of ``vllm-async``)."""

    engine_impl = f"{__name__}:LongTailAsyncEngine"

