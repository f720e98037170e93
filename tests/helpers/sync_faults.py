"""Test-only fault injection for weight-sync verification (``rollout.verify_sync``), through the
project's own seams — never by patching a function:

* :class:`FaultyClient` is a ``RolloutClient`` (the engine pool a caller hands to ``loop.run(cfg,
  client=...)``, as the demo does) whose ``update_weights`` alters the round it is given, so the
  real transport carries the fault: ``skip:<hf name>`` leaves that tensor out of the push (metadata
  and stream), ``swap_qk`` swaps the first rows of layer 0's q and k projections (the q/k halves of
  the fused QKV exchanged, as a wrong split would). Its actors build :class:`FaultyVLLMEngine`,
  named by import path (``hf_engine.make_engine``'s ``module:Class`` form).
* :class:`FaultyVLLMEngine` is a ``VLLMEngine`` that, once told ``stale_cache`` (a weight-transfer
  call of its own, ``inject_fault``), skips the cache reset that ends a push.

A different engine dtype needs no helper: an engine pool built with ``engine_kwargs["dtype"]`` other
than the trainer's.
"""
from __future__ import annotations

from megatron_rl.rollout.client import RolloutClient
from megatron_rl.rollout.vllm_engine import VLLMEngine
from megatron_rl.rollout.weight_sync import RoundSource


class FaultyVLLMEngine(VLLMEngine):
    """``VLLMEngine`` whose post-push cache reset can be switched off (``inject_fault``)."""

    stale_cache = False

    def weight_transfer(self, method: str, **kwargs):
        if method == "inject_fault":   # starts from an empty cache either way
            self.stale_cache = kwargs["fault"] == "stale_cache"
            VLLMEngine.reset_caches(self)
            return None
        return super().weight_transfer(method, **kwargs)

    def reset_caches(self) -> None:
        if not self.stale_cache:
            super().reset_caches()


def _swap_qk(items):
    """Yield ``items`` with the first ``k_rows`` rows of layer 0's q_proj and its k_proj exchanged
    (order kept: tensors are held back from q_proj until k_proj arrives)."""
    held = None
    for name, t in items:
        if held is None and name.endswith("layers.0.self_attn.q_proj.weight"):
            held = [(name, t.clone())]
            continue
        if held is not None:
            held.append((name, t))
            if name.endswith("layers.0.self_attn.k_proj.weight"):
                q, k = held[0][1], t.clone()
                n = k.shape[0]
                q_top = q[:n].clone()
                q[:n], k[:] = k, q_top
                held[0], held[-1] = (held[0][0], q), (name, k)
                yield from held
                held = None
            continue
        yield name, t
    if held is not None:
        yield from held


class FaultyClient(RolloutClient):
    """``RolloutClient`` whose pushes carry :attr:`fault` (``None``, ``skip:<name>``, ``swap_qk``), from
    the push after the first ``clean`` ones (:meth:`arm`: a run's start-up push can stay sound)."""

    engine_impl = f"{__name__}:FaultyVLLMEngine"
    fault: str | None = None
    clean = 0

    def arm(self, fault: str | None, clean: int = 0) -> None:
        self.fault, self.clean = fault, clean

    def update_weights(self, named_tensors, bucket_bytes: int | None = None) -> int:
        src = named_tensors if isinstance(named_tensors, RoundSource) else RoundSource.from_tensors(named_tensors)
        if self.clean > 0:
            self.clean -= 1
        elif self.fault and self.fault.startswith("skip:"):
            gone = self.fault[5:]
            src = RoundSource([m for m in src.metadata() if m.name != gone], ((n, t) for n, t in src if n != gone))
        elif self.fault == "swap_qk":
            src = RoundSource(src.metadata(), _swap_qk(src))
        return super().update_weights(src, bucket_bytes=bucket_bytes)

    def set_engine_fault(self, fault: str | None) -> None:
        """``"stale_cache"``: the engines skip the cache reset at the end of every push; None: they reset."""
        self._ray.get([a.weight_transfer.remote("inject_fault", {"fault": fault}) for a in self.actors])
