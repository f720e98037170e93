"""Multi-node launch helpers used by ``examples/slurm/train_multinode.sbatch``.

``python -m megatron_rl.runtime.cluster wait-ray --address HOST:PORT --nodes N --timeout S`` blocks until the
Ray cluster at ``HOST:PORT`` has ``N`` alive nodes, and exits 1 with a one-line message naming how
many joined when ``S`` seconds pass first (a job must not start training on half a cluster). One
driver connection is kept open while polling: a new ``ray.init`` every few seconds would cost ~3 s
each on a busy head. ``ray.init`` on an address nobody serves retries forever (measured with Ray 2.60),
so the GCS port is TCP-probed first, and a watchdog bounds the rest.
"""
from __future__ import annotations

import argparse
import os
import socket
import sys
import threading
import time


def alive_nodes(ray) -> list[dict]:
    return [n for n in ray.nodes() if n.get("Alive")]


def _gcs_reachable(address: str, deadline: float, poll: float) -> None:
    """TCP-probe the head's GCS port until it accepts a connection (``ray.init`` itself retries a dead
    address forever, so it is called only once the port answers)."""
    host, _, port = address.rpartition(":")
    while True:
        try:
            with socket.create_connection((host, int(port)), timeout=2):
                return
        except OSError as e:
            if time.monotonic() + poll > deadline:
                raise TimeoutError(f"Ray head at {address} did not answer ({e})") from None
            time.sleep(poll)


def wait_for_ray_nodes(address: str, nodes: int, timeout: float, poll: float = 1.0) -> int:
    """Seconds-bounded wait for ``nodes`` alive Ray nodes; returns the count, raises TimeoutError.
    A watchdog ends the process (exit 1) if a Ray call blocks past the deadline."""
    import ray

    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    deadline = time.monotonic() + timeout
    _gcs_reachable(address, deadline, poll)

    def _expired():
        print(f"error: Ray cluster at {address} still not ready after {timeout:.0f} s", file=sys.stderr, flush=True)
        os._exit(1)

    dog = threading.Timer(max(1.0, deadline - time.monotonic() + 5.0), _expired)
    dog.daemon = True
    dog.start()
    try:
        ray.init(address=address, logging_level="ERROR", log_to_driver=False)
        while True:
            n = len(alive_nodes(ray))
            if n >= nodes:
                return n
            if time.monotonic() > deadline:
                raise TimeoutError(f"only {n} of {nodes} Ray nodes joined {address} within {timeout:.0f} s")
            time.sleep(poll)
    finally:
        dog.cancel()
        ray.shutdown()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m megatron_rl.runtime.cluster", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    w = sub.add_parser("wait-ray", help="wait until a Ray cluster has N alive nodes")
    w.add_argument("--address", required=True, help="HOST:PORT of the Ray head (GCS)")
    w.add_argument("--nodes", type=int, required=True, help="alive nodes to wait for")
    w.add_argument("--timeout", type=float, default=300.0, help="seconds before giving up (exit 1)")
    a = p.parse_args(argv)
    if a.nodes < 1 or a.timeout <= 0:
        p.error("--nodes must be >= 1 and --timeout > 0")
    try:
        n = wait_for_ray_nodes(a.address, a.nodes, a.timeout)
    except TimeoutError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(f"ray cluster {a.address}: {n}/{a.nodes} nodes alive")
    return 0


if __name__ == "__main__":
    sys.exit(main())
