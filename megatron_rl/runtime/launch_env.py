"""Start-up checks of the launch environment: each bounded in time, each failure one line naming the variable.

A trainer process joins two things it does not own, and both wait on an absent peer far longer than a
user waits for an answer:

* the torch.distributed rendezvous of ``RANK`` / ``WORLD_SIZE`` / ``MASTER_ADDR`` / ``MASTER_PORT``:
  ``init_process_group`` waits for the missing ranks until the collective timeout (30 min by default).
  Variables left over from an earlier shell (no launcher started the other ranks) are refused at once;
  a launched rank > 0 gets a bounded wait for ``MASTER_ADDR:MASTER_PORT`` to accept a connection.
  A launcher is recognised by what it sets and a user does not: torchrun's agent
  ``TORCHELASTIC_RUN_ID``, Slurm's ``SLURM_PROCID``, Open MPI's ``OMPI_COMM_WORLD_RANK``, MPICH /
  PMIx's ``PMI_RANK`` / ``PMIX_RANK``.
* the Ray cluster of ``rollout.ray_address`` or ``RAY_ADDRESS`` (rank 0 only, the Ray driver):
  ``ray.init`` retries an address nobody serves forever (``cluster.py``), and it runs after the model
  was built. The GCS port must accept a TCP connection within ``timeout`` seconds. ``auto`` and
  ``local`` are Ray's own words (join the cluster this machine runs / start a new one) and are left to Ray.

``preflight`` runs both before anything starts; ``parallel.init_distributed`` runs the first one too,
for the commands that start torch.distributed without a preflight (``convert``, ``demo``).
"""
from __future__ import annotations

import os
import socket
import time
from collections.abc import Mapping
from urllib.parse import urlparse

#: variables set by a launcher (never by hand): their presence means the other ranks were started too
LAUNCHER_VARS = ("TORCHELASTIC_RUN_ID", "SLURM_PROCID", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK")
TORCH_VARS = ("WORLD_SIZE", "RANK", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")
#: Ray's defaults: the GCS port of ``ray start --head``; the Ray Client server port of ``ray://``
RAY_GCS_PORT, RAY_CLIENT_PORT = 6379, 10001


def _connect_error(host: str, port: int, timeout: float) -> str | None:
    """None when ``host:port`` accepts a TCP connection within ``timeout`` s, else the reason."""
    try:
        socket.create_connection((host, port), timeout=timeout).close()
        return None
    except OSError as e:
        return f"no answer within {timeout:g} s" if isinstance(e, TimeoutError) else (e.strerror or str(e))


def check_torch_env(env: Mapping[str, str] | None = None, wait_s: float = 120.0) -> None:
    """``ValueError`` (one line naming the variables) when the torch.distributed environment cannot
    form a process group: leftover variables without a launcher, malformed values, or (rank > 0) a
    ``MASTER_ADDR:MASTER_PORT`` that accepts no connection within ``wait_s`` seconds (rank 0 or
    torchrun's agent may still be starting, so it is polled, not tried once)."""
    env = os.environ if env is None else env
    if "WORLD_SIZE" in env and "RANK" not in env and env["WORLD_SIZE"].strip() not in ("", "1"):
        # init_distributed would make a 1-process world: a WORLD_SIZE=2 by hand trained one process silently
        raise ValueError(f"WORLD_SIZE={env['WORLD_SIZE']} is set but RANK is not: no launcher started this process, "
                         "so it would train alone; launch with torchrun (--nproc-per-node N), or unset WORLD_SIZE "
                         "for one process")
    if "RANK" not in env or "WORLD_SIZE" not in env:   # init_distributed makes a 1-process world
        return
    try:
        rank, world = int(env["RANK"]), int(env["WORLD_SIZE"])
    except ValueError:
        raise ValueError(f"RANK={env['RANK']!r} WORLD_SIZE={env['WORLD_SIZE']!r}: expected integers "
                         "(torchrun sets them; unset both for a single process)") from None
    if world < 1 or not 0 <= rank < world:
        raise ValueError(f"RANK={rank} WORLD_SIZE={world}: need WORLD_SIZE >= 1 and 0 <= RANK < WORLD_SIZE")
    if world == 1:
        return
    if not any(v in env for v in LAUNCHER_VARS):
        shown = " ".join(f"{k}={env[k]}" for k in TORCH_VARS if k in env)
        raise ValueError(f"{shown} are set but no launcher started this process (no TORCHELASTIC_RUN_ID from "
                         f"torchrun, no SLURM_PROCID from srun), so the other {world - 1} rank(s) would never join: "
                         f"unset {' '.join(k for k in TORCH_VARS if k in env)} to run one process, or launch "
                         "with torchrun")
    addr, port = env.get("MASTER_ADDR"), env.get("MASTER_PORT")
    if not addr or not (port or "").isdigit():
        raise ValueError(f"WORLD_SIZE={world} needs MASTER_ADDR and an integer MASTER_PORT (the rendezvous of rank 0; "
                         f"torchrun sets both), got MASTER_ADDR={addr!r} MASTER_PORT={port!r}")
    if rank == 0:
        return   # rank 0 hosts the store (or torchrun's agent does)
    deadline = time.monotonic() + wait_s
    while (why := _connect_error(addr, int(port), min(5.0, wait_s))) is not None:
        if time.monotonic() + 0.5 > deadline:
            raise ValueError(f"MASTER_ADDR:MASTER_PORT={addr}:{port}: rank {rank} of {world} got no rendezvous there "
                             f"within {wait_s:.0f} s ({why}); is rank 0 running, and do MASTER_ADDR / MASTER_PORT name "
                             "its host and a port it can open?")
        time.sleep(0.5)


def ray_target(address: str) -> tuple[str, int] | None:
    """``(host, port)`` to probe for a Ray address, or None for Ray's own ``auto`` / ``local``."""
    if address.strip().lower() in ("auto", "local"):
        return None
    u = urlparse(address if "://" in address else f"gcs://{address}")
    try:
        port = u.port
    except ValueError:
        port = -1
    if not u.hostname or port == -1:
        raise ValueError("expected HOST:PORT of the Ray head (e.g. 10.0.0.1:6379), ray://HOST:PORT, auto or local")
    return u.hostname, port or (RAY_CLIENT_PORT if u.scheme == "ray" else RAY_GCS_PORT)


def check_ray_address(cfg_address: str | None, env: Mapping[str, str] | None = None, timeout: float = 10.0) -> None:
    """``ValueError`` naming ``rollout.ray_address`` or ``RAY_ADDRESS`` (the one the rollout client
    would use: the config's first) when its Ray head accepts no TCP connection within ``timeout`` s."""
    env = os.environ if env is None else env
    key, address = ("rollout.ray_address", cfg_address) if cfg_address else ("RAY_ADDRESS", env.get("RAY_ADDRESS"))
    if not address:
        return
    undo = "fix or unset it" if key == "rollout.ray_address" else "fix it, or `unset RAY_ADDRESS` to start a local Ray"
    try:
        target = ray_target(address)
    except ValueError as e:
        raise ValueError(f"{key}={address}: {e}") from None
    if target is None:
        return
    why = _connect_error(*target, timeout)
    if why is not None:
        raise ValueError(f"{key}={address}: no Ray cluster answers at {target[0]}:{target[1]} ({why}); start it "
                         f"(ray start --head --port={target[1]}) or {undo}")
