"""Worker (2 ranks, gloo): ranks that wait for rank 0 survive a pause longer than the collective timeout.

    torchrun --nproc_per_node=2 driver_wait.py OUT_JSON TIMEOUT_S PAUSE_S

1. ``broadcast_object`` (``runtime/broadcast.py``) after rank 0 paused PAUSE_S > TIMEOUT_S: rank 1
   receives the object (it waited in the store, ``megatron_rl/runtime/driver_wait.py``);
2. control: the same pause before a plain ``broadcast_object_list`` on a gloo group with the same
   timeout fails on rank 1 (the premise: a collective does time out after TIMEOUT_S here);
3. rank 0 stops its heartbeat and never sends: rank 1 raises ``DriverSilentError`` after about
   TIMEOUT_S instead of hanging.
"""
from __future__ import annotations

import datetime
import json
import os
import sys
import time


def _tensor_object():
    """A batch as the loop sends it (flat buffers, per-sample tensors, a bool one, prompt rows) beside a
    non-contiguous view, an empty tensor, plain Python values and tensors of at least ``BIG_BYTES`` (sent
    from their own memory: a float one, a bool one, a non-contiguous view)."""
    import torch

    from megatron_rl.data.dataset import PromptRow
    from megatron_rl.rollout.rollouts import Rollouts
    from megatron_rl.runtime.broadcast import BIG_BYTES

    row = PromptRow(4, (1, 2, 70000), "gsm8k", "42", {"i": 4}, ({"role": "user", "content": "2+2?"},))
    ro = Rollouts.from_lists([row, row], [[1, 2], [3]], [[5, 6, 7], [8]], [[-0.5, -1.25, -3.0], [-0.125]],
                             ["stop", "length"], [0, 0], ["a", "b"], rewards=torch.tensor([1.0, 0.0]),
                             correct=torch.tensor([True, False]), stats={"k": 1.5})
    n = BIG_BYTES // 4 + 3
    big = {"f32": torch.linspace(-1, 1, n), "bool": torch.arange(BIG_BYTES + 1) % 3 == 0,
           "view": torch.arange(4 * n, dtype=torch.int32).reshape(n, 4)[:, 1]}
    return {"ro": ro, "view": torch.arange(12, dtype=torch.float64).reshape(3, 4)[:, 1], "empty": torch.zeros(0, 3),
            "n": 7, "big": big}


def _same(got, want) -> bool:
    import dataclasses

    import torch

    def eq(a, b):
        if isinstance(a, torch.Tensor):
            return isinstance(b, torch.Tensor) and a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)
        return a == b

    g, w = got["ro"], want["ro"]
    fields = all(eq(getattr(g, f.name), getattr(w, f.name)) for f in dataclasses.fields(w))
    return fields and all(eq(got[k], want[k]) for k in ("view", "empty", "n")) and \
        all(eq(got["big"][k], want["big"][k]) for k in want["big"])


def main(out: str, timeout_s: str, pause_s: str) -> None:
    import torch.distributed as dist

    from megatron_rl.runtime import driver_wait
    from megatron_rl.runtime.parallel import init_distributed
    from megatron_rl.runtime.broadcast import broadcast_object

    from torch.distributed.distributed_c10d import _set_pg_timeout

    timeout, pause = float(timeout_s), float(pause_s)
    # the rendezvous under a loaded machine may take longer than the short timeout: groups are built with a
    # long one, then their collectives get the short one (what parallel.timeout_s sets at init in a run)
    init_distributed(timeout_s=120)
    rank, rec = dist.get_rank(), {}
    control = dist.new_group(backend="gloo", timeout=datetime.timedelta(seconds=120))
    for group in (None, control):
        _set_pg_timeout(datetime.timedelta(seconds=timeout), group)
    driver_wait.stop()                    # the waiter of this timeout (a second start: a fresh key prefix)
    driver_wait.start(timeout)

    # 1. the rollout-style broadcast after a long rank-0 phase
    t0 = time.monotonic()
    if rank == 0:
        time.sleep(pause)
    got = broadcast_object({"rollouts": list(range(5))} if rank == 0 else None)
    rec["survived"] = got == {"rollouts": list(range(5))}
    rec["waited_s"] = round(time.monotonic() - t0, 2)
    got = broadcast_object("second" if rank == 0 else None)          # rounds stay in step
    rec["second"] = got == "second"
    want = _tensor_object()               # tensors out of the pickle, as one flat buffer (issue 41)
    got = broadcast_object(want if rank == 0 else None)
    rec["tensors"] = _same(got, want)

    # 2. control: a plain collective with the same timeout and pause times out
    if rank == 0:
        time.sleep(pause)
        rec["control_error"] = None
    else:
        box = [None]
        try:
            dist.broadcast_object_list(box, src=0, group=control)
            rec["control_error"] = None
        except Exception as e:   # gloo: "Timed out waiting ... for recv"
            rec["control_error"] = type(e).__name__ + ": " + str(e).splitlines()[0][:200]
    broadcast_object(None)                 # both sides past the control (a plain barrier would time out too)

    # 3. a silent rank 0: no heartbeat, no broadcast
    if rank == 0:
        driver_wait.current().stop()      # and returns: torchrun's agent keeps hosting the store
    else:
        t0 = time.monotonic()
        try:
            driver_wait.current().sync()
            rec["silent_error"] = None
        except driver_wait.DriverSilentError as e:
            rec["silent_error"] = str(e)
        rec["silent_after_s"] = round(time.monotonic() - t0, 2)
        with open(out, "w") as f:
            json.dump(rec, f)
    # no destroy: the default group's last collective would otherwise pair with nothing


if __name__ == "__main__":
    main(*sys.argv[1:4])
    sys.stdout.flush()
    sys.stderr.flush()
    # leave without tearing the gloo groups down: with one undestroyed (above), their destructor at interpreter
    # exit aborts now and then ("terminate called without an active exception", SIGABRT; a loaded CI host)
    os._exit(0)
