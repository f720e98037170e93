"""The vLLM worker extension of the asynchronous engine (``vllm-async``): what its worker process needs.

``AsyncLLM`` always runs its engine core (and, with one worker, the worker) in a process of its own,
spawned — inside a Ray actor vLLM forces ``spawn`` — so nothing the actor did before building the
engine (the ``vllm`` patch group, our CPU weight-transfer engine in vLLM's factory) exists there.
vLLM imports the class named by ``worker_extension_cls`` in that process in ``init_worker``, before
the device and the model are set up (``vllm/v1/worker/worker_base.py``), and mixes it into the
worker class; its methods become ``collective_rpc`` targets. :func:`prepare_worker_process` is that
process's start-up: the module calls it once when vLLM imports it there (the one hook vLLM gives a
spawned worker without package entry points; importing it elsewhere is harmless: both steps are
idempotent and touch only vLLM).

:class:`AsyncWorkerExtension` carries the calls the engine makes by name across the process
boundary (a function cannot be pickled into a spawned engine core, and a dict of tensors travels
in vLLM's own tensor serialisation): the worker model's parameters under HF names (sync
verification), the transfer engine's stage times, and an ``update_weights`` whose payload vLLM's msgpack
cannot carry (CUDA IPC handles: ``vllm_async_engine.core_payload``).
"""
from __future__ import annotations

import torch


def prepare_worker_process() -> None:
    """Apply the ``vllm`` patch group and register our CPU weight-transfer engine (idempotent)."""
    from .. import patches  # lazy: the worker process's start-up, not an import side effect elsewhere

    from .transfer_engines import register  # lazy: imports vLLM, which only a worker process has loaded

    patches.apply_all(("vllm",))
    register()


class AsyncWorkerExtension:
    """Mixed into vLLM's worker class (``worker_extension_cls``): ``collective_rpc`` targets by name."""

    def mrl_hf_params(self) -> dict[str, tuple]:
        """The worker model's parameters under the trainer's HF names (``vllm_engine._worker_hf_params``),
        :func:`encode`d."""
        from .vllm_engine import _worker_hf_params  # lazy: imports vLLM, loaded in this process already

        return encode(_worker_hf_params(self))

    def mrl_params(self) -> dict[str, tuple]:
        """The worker model's parameters under vLLM's names, :func:`encode`d."""
        return encode({n: p.detach() for n, p in self.get_model().named_parameters()})

    def mrl_update_weights(self, payload: bytes) -> None:
        """The worker's own ``update_weights`` with a pickled update info (``vllm_async_engine.core_payload``:
        CUDA IPC handles, whose ``torch.multiprocessing`` rebuild arguments hold classes vLLM's msgpack refuses);
        the worker's checks (an update session open) and its transfer engine run as for any other payload."""
        import pickle  # lazy: only this payload is pickled

        return self.update_weights(pickle.loads(payload))

    def mrl_transfer_stats(self) -> dict:
        """The transfer engine's stage times since the last call (then reset)."""
        from .transfer_engines import worker_stats  # lazy: imports vLLM, loaded in this process already

        return worker_stats(self)


def encode(tensors: dict[str, torch.Tensor]) -> dict[str, tuple]:
    """``name -> (dtype name, shape, raw bytes)``: what crosses the engine-core process boundary intact
    (vLLM's msgpack turns a tensor in a utility call into a nested list)."""
    return {n: (str(t.dtype).removeprefix("torch."), list(t.shape), t.detach().cpu().contiguous().view(-1).view(torch.uint8).numpy().tobytes())
            for n, t in tensors.items()}


def decode(encoded: dict[str, tuple]) -> dict[str, torch.Tensor]:
    """The tensors :func:`encode` packed (owned copies)."""
    return {n: torch.frombuffer(bytearray(b), dtype=torch.uint8).view(getattr(torch, d)).view(shape) if b
            else torch.empty(shape, dtype=getattr(torch, d)) for n, (d, shape, b) in encoded.items()}


prepare_worker_process()
