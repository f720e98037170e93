"""Teacher weights of the self-distillation methods: the SAME network run under shadow weights θ̄.

Modes (docs/methods/self-distillation.md; the counter counts OPTIMIZER steps — one per PPO mini-batch, ``trainer/pipeline/update.py``):

    fixed     θ̄ = θ (the current policy; no copy is kept)                       opsd, opsd_ectr
    snapshot  θ̄ = θ_0, then θ̄ <- θ after every ``sync_interval``-th optimizer step  rlcsd, rlsd, rlsd_ectr
    ema       θ̄ <- d θ̄ + (1 - d) θ after every optimizer step (d = ``ema_decay``)  sdpo, srpo

The shadow holds this rank's TP/PP shard of every parameter (fp32 copies of the model params), so
it costs one extra copy of the local weights and needs no communication. A teacher forward runs
inside :meth:`TeacherWeights.swapped`: the live params are saved to a scratch buffer, θ̄ copied in,
and the live values restored on exit (also on error). Checkpoints save θ̄ through the same swap
into ``teacher/`` (megatron dist_checkpointing, reshardable like the model) and the counter in
the extra state, so ``--resume`` continues with the exact teacher.
"""
from __future__ import annotations

import contextlib
import logging

import torch

log = logging.getLogger("megatron_rl.teacher")

TEACHER_MODES = ("fixed", "snapshot", "ema")


class TeacherWeights:
    """Shadow weights θ̄ for ``actor`` (its bare model chunks); see the module docstring."""

    def __init__(self, actor, mode: str, sync_interval: int = 10, ema_decay: float = 0.95):
        if mode not in TEACHER_MODES:
            raise ValueError(f"unknown teacher_mode {mode!r}; valid: {list(TEACHER_MODES)}")
        if mode == "snapshot" and sync_interval < 1:
            raise ValueError(f"teacher_sync_interval must be >= 1, got {sync_interval}")
        if mode == "ema" and not 0.0 <= ema_decay < 1.0:
            raise ValueError(f"ema_decay must be in [0, 1), got {ema_decay}")
        self.mode, self.sync_interval, self.ema_decay = mode, int(sync_interval), float(ema_decay)
        self._params = [p for m in actor.bare_models() for p in m.parameters()]
        self.shadow = None if mode == "fixed" else [p.detach().to(torch.float32, copy=True) for p in self._params]
        self.counter = 0          # optimizer steps since the last snapshot
        self.syncs = 0

    @property
    def has_shadow(self) -> bool:
        return self.shadow is not None

    def after_optimizer_step(self) -> None:
        """Advance the schedule after a successful optimizer step (not called for skipped updates)."""
        if self.mode == "ema":
            d = self.ema_decay
            with torch.no_grad():
                for s, p in zip(self.shadow, self._params):
                    s.mul_(d).add_(p.detach().to(s.dtype), alpha=1.0 - d)
            self.syncs += 1
        elif self.mode == "snapshot":
            self.counter += 1
            if self.counter >= self.sync_interval:
                with torch.no_grad():
                    for s, p in zip(self.shadow, self._params):
                        s.copy_(p.detach())
                self.counter = 0
                self.syncs += 1

    @contextlib.contextmanager
    def _live_restored(self):
        """Snapshot the live params; restore them when the body ends (also on error)."""
        with torch.no_grad():
            live = [p.detach().clone() for p in self._params]
        try:
            yield
        finally:
            with torch.no_grad():
                for v, p in zip(live, self._params):
                    p.data.copy_(v)

    @contextlib.contextmanager
    def swapped(self):
        """Run the body with θ̄ in the model params (no-op in ``fixed`` mode); live θ restored after."""
        if self.shadow is None:
            yield
            return
        with self._live_restored():
            with torch.no_grad():
                for s, p in zip(self.shadow, self._params):
                    p.data.copy_(s)
            yield

    @contextlib.contextmanager
    def loading(self):
        """Body loads weights INTO the model params; on exit they become θ̄ and θ is restored."""
        if self.shadow is None:
            yield
            return
        with self._live_restored():
            yield
            with torch.no_grad():
                for s, p in zip(self.shadow, self._params):
                    s.copy_(p.detach())

    def state_dict(self) -> dict:
        return {"mode": self.mode, "counter": self.counter, "syncs": self.syncs}

    def load_state_dict(self, st: dict) -> None:
        if st.get("mode") != self.mode:
            raise ValueError(f"checkpoint teacher_mode {st.get('mode')!r} != configured {self.mode!r}")
        self.counter, self.syncs = int(st["counter"]), int(st["syncs"])
