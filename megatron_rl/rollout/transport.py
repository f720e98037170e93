"""The weight-transport interface: which transport a push takes, chosen by what the engine declares.

A transport moves one round of HF-named weights (a :class:`~megatron_rl.rollout.weight_sync.RoundSource`)
from the trainer's sender to every engine of the pool. Its trainer side is a *sender*: an object
with ``source`` (set to each round's stream), ``send_weights()`` (one full round: start, buckets,
finish, through the pool's control plane ``ActorSyncClient``), ``shutdown()`` and, after a round,
``last`` (stage seconds and bytes). Its engine side is the engine's ``weight_transfer`` call, built
for the receiving side the engine's ``CAPS.transports`` maps the transport to.

Transports (``rollout.sync_backend``):

* ``gloo`` — the CPU collective engine we register in vLLM's ``WeightTransferEngineFactory``
  (``rollout/trainer_engines.py`` / ``transfer_engines.py``);
* ``nccl`` / ``ipc`` — vLLM's own GPU engines (separate GPUs / a shared GPU);
* ``ray`` — packed buckets through Ray's object store (``rollout/ray_transport.py``): needs no
  engine library on the trainer, so it serves any engine whose receiving side unpacks a bucket
  (vLLM's worker engine, the HF engine's in-process copy, a plugin's).

Each :class:`Transport` names the module of its sender, imported only for the transport chosen
(:func:`sender_opener`), so a run whose engine takes only ``ray`` imports no engine library on the
trainer's driver.
"""
from __future__ import annotations

import dataclasses
import importlib

from .registry import caps


@dataclasses.dataclass(frozen=True)
class Transport:
    """A weight transport: where it runs and how its sender is opened.

    Attributes:
        name: the ``rollout.sync_backend`` value.
        cuda: needs CUDA GPUs.
        shares_gpu: works when the sender and an engine share a GPU (``placement=colocated``).
        separate_gpus: works between different GPUs (``placement=separate``).
        single_sender: needs exactly one trainer process (vLLM's IPC engine gathers handles over it).
        opener: ``module:function`` with ``fn(name, client, bucket_bytes, world_size, master_address)``
            returning the ready sender (rendezvous done).
    """

    name: str
    cuda: bool
    shares_gpu: bool
    separate_gpus: bool
    single_sender: bool
    opener: str


TRANSPORTS: dict[str, Transport] = {}


def register_transport(t: Transport) -> Transport:
    """Add a transport (a plugin may: its sender module named in ``opener``); a name registered twice raises."""
    if t.name in TRANSPORTS or t.name == "auto":
        raise ValueError(f"weight transport {t.name!r} is already registered")
    TRANSPORTS[t.name] = t
    return t


for _t in (Transport("ray", cuda=False, shares_gpu=True, separate_gpus=True, single_sender=False,
                     opener="megatron_rl.rollout.ray_transport:open_sender"),
           Transport("gloo", cuda=False, shares_gpu=True, separate_gpus=True, single_sender=False,
                     opener="megatron_rl.rollout.trainer_engines:trainer_init"),
           Transport("nccl", cuda=True, shares_gpu=False, separate_gpus=True, single_sender=False,
                     opener="megatron_rl.rollout.trainer_engines:trainer_init"),
           Transport("ipc", cuda=True, shares_gpu=True, separate_gpus=False, single_sender=True,
                     opener="megatron_rl.rollout.trainer_engines:trainer_init")):
    register_transport(_t)


def backend_names() -> tuple[str, ...]:
    """``rollout.sync_backend``'s values: auto and every registered transport."""
    return ("auto", *TRANSPORTS)


def _auto_order(cuda: bool, trainer_world: int, placement: str | None) -> tuple[str, ...]:
    """auto's preference: on CPU gloo; with CUDA nccl for separate (or unstated) placement, and for
    colocated ipc with one trainer process (NCCL refuses two ranks on one GPU; vLLM's IPC engine needs
    the single sender); ray last (it runs everywhere)."""
    if not cuda:
        return ("gloo", "ray")
    if placement == "colocated":
        return ("ipc", "ray") if trainer_world == 1 else ("ray",)
    return ("nccl", "ray")


def resolve_backend(requested: str, engine: str, cuda: bool, trainer_world: int = 1,
                    placement: str | None = None) -> str:
    """``rollout.sync_backend`` -> the transport used for ``engine``; ``ValueError`` (one line) when impossible.

    auto: the first of :func:`_auto_order` the engine accepts (vLLM: gloo on CPU, nccl / ipc / ray on
    GPU; an engine that accepts only ray: ray).
    """
    if requested not in backend_names():
        raise ValueError(f"rollout.sync_backend must be one of {'|'.join(backend_names())}, got {requested!r}")
    accepted = caps(engine).transports
    if requested == "auto":
        for name in _auto_order(cuda, trainer_world, placement):
            if name in accepted:
                return name
        raise ValueError(f"rollout.sync_backend=auto: the {engine} engine accepts {'|'.join(accepted)}, none of which "
                         f"runs here (cuda={cuda}, placement={placement}, trainer processes={trainer_world})")
    t = TRANSPORTS[requested]
    if placement == "colocated" and not t.shares_gpu:
        raise ValueError(f"rollout.sync_backend={requested} with rollout.placement=colocated: NCCL cannot put the sender "
                         "and an engine on one GPU; use ipc (one trainer process), ray or auto")
    if placement == "separate" and not t.separate_gpus:
        raise ValueError(f"rollout.sync_backend={requested} with rollout.placement=separate: CUDA IPC shares memory on "
                         "one GPU; use nccl or auto for engines on their own GPUs")
    if requested not in accepted:
        raise ValueError(f"rollout.sync_backend={requested}: the {engine} engine accepts only "
                         f"{'|'.join(accepted)} (or auto)")
    if t.cuda and not cuda:
        raise ValueError(f"rollout.sync_backend={requested} needs CUDA GPUs and none is visible; "
                         "use gloo (or ray) on CPU")
    if t.single_sender and trainer_world != 1:
        raise ValueError(f"rollout.sync_backend={requested} needs a single trainer process colocated with the engine "
                         f"(vLLM's IPC engine all-gathers handles over the trainer's group); got {trainer_world}")
    return requested


def sender_opener(name: str):
    """Transport ``name``'s opener, its module imported now: the pool calls this where it chooses the
    transport (start-up), so a missing library fails before the first push and its import is not part
    of one; ``opener(name, client, bucket_bytes, world_size, master_address)`` returns the ready sender."""
    mod, _, fn = TRANSPORTS[name].opener.partition(":")
    return getattr(importlib.import_module(mod), fn)
