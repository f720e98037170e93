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

from megatron_rl.rollout.client import RolloutClient
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
    """``vllm-async`` whose every fourth group (under ``submit``; ``generate`` is left alone) is held across
    the next push, so that the loop's in-flight path is exercised by the workload, on any host, not by
    timing luck.

    That request ignores EOS (it runs to ``max_tokens``; the tiny chat model otherwise stops after ~18 tokens)
    and streams its tokens. Once it has sampled two, if the trainer has not waited on the engine since the
    request was submitted (no ``harvest`` with ``wait_s > 0``: the trainer took its groups and is training)
    and no push came meanwhile, generation is paused (``keep``) until the next push resumes it. The trainer
    pushes next, so the response spans that push. A call the trainer waits on (``harvest`` with a wait,
    ``generate``, ``score``) resumes generation first, so the trainer never waits on a held engine. On a
    fast host the 48 tokens take less time than a training step, and without the hold no response would
    span a push (CI, stop 47)."""

    requests = 0
    waits = 0           # harvests that waited (the trainer blocked on the engine)
    held = False        # generation paused by the hold (not by a push)
    _group = False      # inside submit()

    def submit(self, key, prompt, sampling) -> None:
        self._group = True
        try:
            super().submit(key, prompt, sampling)
        finally:
            self._group = False

    def _params(self, s, i: int):
        from vllm.sampling_params import RequestOutputKind

        p = super()._params(s, i)
        if not self._group:
            return p
        self.requests += 1
        if self.requests % 4 == 1:
            p.ignore_eos = True
            p.output_kind = RequestOutputKind.CUMULATIVE   # each sample's tokens so far, as they come
        return p

    async def _outputs(self, prompt, params) -> list:
        if not params.ignore_eos:
            return await super()._outputs(prompt, params)
        from vllm.inputs import TokensPrompt

        version, waits, latest, tried = self.version, self.waits, {}, False
        async for out in self.llm.generate(TokensPrompt(prompt_token_ids=list(prompt)), params, str(next(self._ids))):
            for c in out.outputs:                  # streaming n > 1: each output carries one sample
                latest[c.index] = c
            if not tried and sum(len(c.token_ids) for c in latest.values()) >= 2:
                tried = True
                if self.version == version:
                    await self._hold(waits)
        return [latest[k] for k in sorted(latest)]

    async def _hold(self, waits: int) -> None:
        if not self._lock.acquire(blocking=False):   # a push is under way: it pauses generation itself
            return
        try:
            if self.waits != waits:                  # the trainer waited on the engine since the submit
                return
            self.held = True
            self._mark(paused=True)
            await self.llm.pause_generation(mode="keep", clear_cache=False)
        finally:
            self._lock.release()

    async def _resume(self) -> None:
        self.held = False
        await super()._resume()

    def _release(self) -> None:
        """The trainer is about to wait on the engine: count it, and end a hold (not in the middle of a push)."""
        self.waits += 1
        with self._lock:
            if self.held:
                self._loop.run(self._resume())

    def harvest(self, wait_s: float = 0.0, min_groups: int = 1) -> list[tuple]:
        if wait_s > 0:
            self._release()
        return super().harvest(wait_s, min_groups)

    def generate(self, prompts, sampling):
        self._release()
        return super().generate(prompts, sampling)

    def score(self, sequences, prompt_lens, temperature: float = 1.0):
        self._release()
        return super().score(sequences, prompt_lens, temperature)


class LongTailClient(RolloutClient):
    """A pool of :class:`LongTailAsyncEngine` (caps of ``vllm-async``)."""

    engine_impl = f"{__name__}:LongTailAsyncEngine"

