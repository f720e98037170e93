"""The rank roles of a run's layout: which ranks the dry run simulates, one process each.

A role is one pipeline stage (with all its virtual stages: a rank holds every chunk of its stage): TP ranks of
a stage hold shards of the same shapes (the vocabulary is padded to a multiple of 128 x TP, so even the
embedding shards are alike), CP ranks hold the same model and the same share of tokens, and DP replicas are
alike. Each role is simulated as the rank with TP, CP and DP rank 0 of its stage, at Megatron's global rank
(order tp-cp-dp-pp, ``megatron.core.parallel_state``: TP fastest)::

    rank = tp_rank + tp * (cp_rank + cp * (dp_rank + dp * pp_rank))

The world size is the launch's (``torchrun --nproc-per-node``), which a config does not state: ``WORLD_SIZE`` when
set; else, colocated, the GPUs the engines share (``rollout.num_engines x rollout.tensor_parallel_size``, when
TP x PP x CP divides it); else one replica (TP x PP x CP).
"""
from __future__ import annotations

import dataclasses
import os


@dataclasses.dataclass(frozen=True)
class Layout:
    """A run's parallel layout: sizes and the world."""

    tp: int
    pp: int
    cp: int
    vpp: int
    dp: int
    sequence_parallel: bool

    @property
    def world(self) -> int:
        return self.tp * self.pp * self.cp * self.dp

    def text(self) -> str:
        vpp = f" (x{self.vpp} virtual)" if self.vpp > 1 else ""
        cp = f" CP={self.cp}" if self.cp > 1 else ""
        return f"TP={self.tp} PP={self.pp}{vpp}{cp} DP={self.dp} ({self.world} GPUs)"


@dataclasses.dataclass(frozen=True)
class Role:
    """One simulated rank: its stage and its global rank in the layout."""

    pp_rank: int
    rank: int
    tp_rank: int = 0
    cp_rank: int = 0

    def name(self, layout: Layout) -> str:
        if layout.pp == 1:
            return "the only stage"
        return f"stage {self.pp_rank}/{layout.pp}" + (f" ({layout.vpp} chunks)" if layout.vpp > 1 else "")


def world_size(cfg, env: dict | None = None) -> int:
    """The launch's world size (module docstring)."""
    env = os.environ if env is None else env
    mp = cfg.parallel.tp * cfg.parallel.pp * cfg.parallel.cp
    if env.get("WORLD_SIZE"):
        world = int(env["WORLD_SIZE"])
        if world % mp:
            raise ValueError(f"dry run: WORLD_SIZE={world} is not a multiple of TP x PP x CP = {mp}")
        return world
    r = cfg.rollout
    shared = r.num_engines * r.tensor_parallel_size
    if r.placement == "colocated" and shared % mp == 0:
        return shared
    return mp


def layout_of(cfg, env: dict | None = None) -> Layout:
    """The :class:`Layout` of a loaded run config."""
    p = cfg.parallel
    return Layout(tp=p.tp, pp=p.pp, cp=p.cp, vpp=p.vpp, dp=world_size(cfg, env) // (p.tp * p.pp * p.cp),
                  sequence_parallel=bool(p.sequence_parallel and p.tp > 1))


def global_rank(layout: Layout, pp_rank: int, tp_rank: int = 0, cp_rank: int = 0, dp_rank: int = 0) -> int:
    """Megatron's global rank of a grid position (module docstring)."""
    return tp_rank + layout.tp * (cp_rank + layout.cp * (dp_rank + layout.dp * pp_rank))


def roles(layout: Layout) -> list[Role]:
    """One :class:`Role` per pipeline stage."""
    return [Role(pp_rank=s, rank=global_rank(layout, s)) for s in range(layout.pp)]
