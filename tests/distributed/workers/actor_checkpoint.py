"""Worker: checkpoint save / resume of the policy actor.

Usage: actor_checkpoint.py HF_DIR OUT_DIR LABEL:PHASE:RUN_DIR:TP:PP [...]
Each case runs in turn in this process tree (megatron's groups destroyed and rebuilt between
cases; one launch instead of one per case saves the torch + megatron imports); rank 0 writes
``OUT_DIR/LABEL.json``.
  PHASE=full    4 training steps, checkpoint after steps 1 and 2 (keep_last=2); records every
                step's loss / grad norm and a post-step RNG draw.
  PHASE=resume  find_latest(RUN_DIR) -> load_checkpoint -> live HF export (OUT_DIR/LABEL_hf) -> steps 3
                and 4; records the same.
  PHASE=fresh   checkpoint BEFORE any optimizer step (a run whose updates were all skipped): the
                save must not change a weight, and steps 1, 2 must then equal the full run's.
  PHASE=crash   (rank 0) record the RUN_DIR/checkpoints listing, then simulate crashes: a
                half-written newer save (.tmp-step_3) and a renamed dir without its COMPLETE (step_5).
  PHASE=diskfull  RUN_DIR lies on a small tmpfs the test mounted: step 1 is saved; the step-2 save
                has its disk filled by a filler thread the moment its temp dir appears (a real ENOSPC
                mid-write); then, with the disk still full, a step-3 save and an HF export meet the
                free-space check.
  PHASE=stop    (no actor) a SIGTERM to rank 1 only: every rank's GracefulStop.agreed() returns it.
Each step uses its own batch (seed = step) with old log-probs from a forward pass.
"""
from __future__ import annotations

import sys
from pathlib import Path

import torch

from tests.helpers.actor_common import (
    build_actor,
    fixed_batch,
    loss_abs,
    rl_loss,
    write_json,
)


def one_step(actor, step: int) -> dict:
    from megatron_rl.trainer.pipeline.batch import TrainBatch

    b = fixed_batch(seed=100 + step)
    old = actor.forward_logprobs(b, micro_batch_size=2).logp
    b = TrainBatch(b.tokens, b.loss_mask, {**b.extras, "old_logp": old})
    mag = loss_abs(actor, b, 2, "token-mean")            # Σ|terms| of the loss (its condition number's numerator)
    r = actor.train_step(b, rl_loss("token-mean"), micro_batch_size=2)
    return {"step": step, "loss": r.loss, "grad_norm": r.grad_norm, "lr": r.lr,
            "rng": torch.rand(2).tolist(), "loss_abs": mag, "tokens": int(b.loss_mask.sum()),
            "params": sum(int(v.numel()) for _, v in actor.hf_weights())}


def simulate_crash(run_dir: str, out: str) -> None:
    import torch.distributed as dist

    ck = Path(run_dir) / "checkpoints"
    write_json(out, {"listing": sorted(p.name for p in ck.iterdir())})
    if dist.get_rank() == 0:
        (ck / ".tmp-step_3" / "dist").mkdir(parents=True)
        (ck / "step_5" / "dist").mkdir(parents=True)
    dist.barrier()


def _fill(path: Path) -> None:
    """Take every free byte of ``path``'s file system (fallocate, then writes until ENOSPC)."""
    import contextlib
    import os

    from megatron_rl.runtime.diskspace import free_bytes

    with contextlib.suppress(OSError), open(path, "wb", buffering=0) as f:
        with contextlib.suppress(OSError):
            os.posix_fallocate(f.fileno(), 0, free_bytes(path.parent))
        while True:
            f.write(b"\0" * 4096)


def disk_full(actor, run_dir: str) -> dict:
    """See the module docstring (PHASE=diskfull); returns what the test checks."""
    import threading
    import time

    from megatron_rl.runtime.diskspace import DiskSpaceError
    from megatron_rl.trainer.state.checkpoint import find_latest, save_checkpoint

    ck = Path(run_dir) / "checkpoints"
    one_step(actor, 1)
    save_checkpoint(run_dir, 1, actor, {"n": 1}, keep_last=3)
    manifest = (ck / "step_1" / "COMPLETE").read_text()
    ballast = Path(run_dir).parent / "ballast"

    def filler():
        t0 = time.time()
        while not (ck / ".tmp-step_2").exists() and time.time() - t0 < 60:
            time.sleep(0.0002)
        _fill(ballast)

    th = threading.Thread(target=filler, daemon=True)
    th.start()
    one_step(actor, 2)
    rec: dict = {}
    try:
        save_checkpoint(run_dir, 2, actor, {"n": 2}, keep_last=3)
        rec["mid_write"] = "no error: the save finished before the disk filled"
    except DiskSpaceError as e:
        rec["mid_write"] = str(e)
    th.join()
    rec["after_mid_write"] = sorted(p.name for p in ck.iterdir())
    latest = find_latest(run_dir)
    rec["latest"] = latest.name if latest else None
    rec["step1_manifest_same"] = (ck / "step_1" / "COMPLETE").read_text() == manifest
    try:
        save_checkpoint(run_dir, 3, actor, {"n": 3}, keep_last=3)
        rec["precheck"] = "no error"
    except DiskSpaceError as e:
        rec["precheck"] = str(e)
    rec["after_precheck"] = sorted(p.name for p in ck.iterdir())
    try:                                         # the loop's end-of-run HF export meets the same check
        actor.export_hf(str(Path(run_dir) / "hf"))
        rec["export"] = "no error"
    except DiskSpaceError as e:
        rec["export"] = str(e)
    rec["after_export"] = sorted(p.name for p in Path(run_dir).iterdir())
    return rec


def stop_agreement(out: str) -> None:
    """Graceful stop under SPMD: only rank 1 gets a SIGTERM, yet every rank's ``agreed()`` at the next
    step boundary returns it (and 0 at the boundary before)."""
    import os
    import signal

    import torch.distributed as dist

    from megatron_rl.trainer.loop.stop import GracefulStop

    with GracefulStop() as st:
        st.arm()
        before = st.agreed()
        if dist.get_rank() == 1:
            os.kill(os.getpid(), signal.SIGTERM)
        after = st.agreed()
    got = [None] * dist.get_world_size()
    dist.all_gather_object(got, [before, after, int(st.signum)])
    write_json(out, {"ranks": got})


def run_case(hf_dir: str, run_dir: str, out: str, tp: int, pp: int, phase: str) -> None:
    from megatron_rl.trainer.state.checkpoint import (
        find_latest,
        load_checkpoint,
        save_checkpoint,
    )

    # warm-up + cosine decay so the scheduler state matters on resume
    actor = build_actor(hf_dir, tp, pp, lr=1e-3, warmup_steps=1, decay_steps=6, decay_style="cosine", min_lr=1e-5)
    rec: dict = {"steps": []}
    if phase == "full":
        for step in (1, 2, 3, 4):
            rec["steps"].append(one_step(actor, step))
            if step in (1, 2):
                save_checkpoint(run_dir, step, actor, {"sampler_pos": 10 * step, "counters": {"step": step}},
                                keep_last=2)
    elif phase == "diskfull":
        rec = disk_full(actor, run_dir)
    elif phase == "fresh":
        probe = fixed_batch(seed=3)
        before = actor.forward_logprobs(probe, 2).logp
        save_checkpoint(run_dir, 0, actor, {}, keep_last=2)
        assert torch.equal(actor.forward_logprobs(probe, 2).logp, before), "saving changed the weights"
        for step in (1, 2):
            rec["steps"].append(one_step(actor, step))
    else:
        latest = find_latest(run_dir)
        assert latest is not None and latest.name == "step_2", latest
        loaded = load_checkpoint(latest, actor)
        assert loaded.step == 2 and loaded.extra_state == {"sampler_pos": 20, "counters": {"step": 2}}, loaded
        assert actor.steps_done == 2
        rec["rng_restored"] = loaded.rng_restored
        actor.export_hf(str(Path(out).with_suffix("")) + "_hf")   # the loop's live export of the restored weights
        probe = fixed_batch(seed=3)
        at_load = actor.forward_logprobs(probe, 2).logp          # consumes no RNG
        for step in (3, 4):
            rec["steps"].append(one_step(actor, step))
        # model-only load into a frozen reference reproduces the restored actor's log-probs
        from megatron_rl.trainer.policy.actor import ReferencePolicy
        from megatron_rl.trainer.state.checkpoint import load_model_weights
        ref = ReferencePolicy(actor.hf_cfg, actor.temperature, parallel_info=actor.parallel_info)
        assert load_model_weights(latest, ref) == 2
        assert torch.equal(ref.forward_logprobs(probe, 2).logp, at_load)
    write_json(out, rec)
    print("OK", rec, flush=True)


def main() -> None:
    from megatron_rl.runtime.parallel import destroy_parallel, init_distributed

    hf_dir, out_dir = sys.argv[1], sys.argv[2]
    init_distributed()
    for case in sys.argv[3:]:
        label, phase, run_dir, tp, pp = case.split(":")
        if phase == "crash":
            simulate_crash(run_dir, f"{out_dir}/{label}.json")
            continue
        if phase == "stop":
            stop_agreement(f"{out_dir}/{label}.json")
            continue
        run_case(hf_dir, run_dir, f"{out_dir}/{label}.json", int(tp), int(pp), phase)
        destroy_parallel()


if __name__ == "__main__":
    main()
