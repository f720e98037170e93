"""The RL loop. One named call per stage, as docs/architecture.md's data flow lists them.

    collect (generate -> reward -> dynamic sampling …, on the driver) -> broadcast
           -> update (old/ref log-probs -> advantages -> [mini-batch -> optimizer step]*)
           -> weight sync -> log -> checkpoint -> eval

What a method collects and what it trains on is its registered data path (``run.path``,
``trainer/paths/``); every path feeds the one update pipeline (``trainer/pipeline/update.py``). Every rank runs this code (SPMD under torchrun); global rank 0 is the Ray driver
that talks to the rollout engines and broadcasts what it collected. ``main(cfg, resume=...)`` is the
``megatron-rl train`` entry point; ``run(cfg, client=...)`` lets the demo reuse an already started
engine pool.
"""
from __future__ import annotations

import contextlib
import math
import os
import signal
import time
from pathlib import Path

import torch.distributed as dist

from megatron_rl.rewards.judge_client import JudgeRejected
from megatron_rl.runtime.console import LOG_FILE, RESUME_TEMPLATE, format_summary, quiet_console
from megatron_rl.runtime import simulated_gpu
from megatron_rl.runtime.device import peak_memory
from megatron_rl.runtime.parallel import destroy_parallel
from megatron_rl.trainer.loop import guard
from megatron_rl.trainer.loop.rollout_source import open_source
from megatron_rl.trainer.loop.setup import Run, evaluate, setup_run, sync_weights
from megatron_rl.trainer.loop.stop import GracefulStop, Halted, StepWatchdog, Stopped
from megatron_rl.trainer.loop.sync_stage import SyncVerifyError, verify_due, verify_push, warm_probe
from megatron_rl.trainer.pipeline.update import update


def rl_step(run: Run, step: int) -> dict:
    """One RL step: the batch (``run.state.source``: collected now on the driver and broadcast, or by the
    asynchronous producer ahead, ``trainer/loop/rollout_source.py``) -> update -> push -> the metrics row."""
    t0 = time.perf_counter()
    sim = simulated_gpu.active()
    if sim is not None:
        sim.step_metrics()             # the simulated GPU counts this step's syncs and transfers only
    data, meta = run.state.source.next(step)
    t_gen = time.perf_counter() - t0
    run.colo.after_generate()          # colocated: engines sleep, trainer onloads (trainer/loop/colocate.py)
    metrics = update(run, data, step)   # the rollouts' reward / length metrics first (rows.rollout_metrics)
    run.state.source.before_push(step)       # async: the driver waits for the batches due before the push
    verify = verify_due(run.cfg.rollout.verify_sync, step, run.state.verified)
    t_warm = t_check = 0.0
    if verify and not run.colo.active:
        tv = time.perf_counter()
        warm_probe(run)                # the probe's prefix into the engines' caches under the old weights
        t_warm = time.perf_counter() - tv
    run.colo.before_push()             # trainer offloads, engines wake their weights
    t1 = time.perf_counter()
    sync_weights(run)
    run.colo.after_push()              # engines wake their KV cache
    if verify:                         # before the producer samples with the new weights
        tv = time.perf_counter()
        with run.colo.trainer_loaded():   # colocated: the probe's trainer pass needs the parked weights
            metrics.update(verify_push(run, step))
        run.state.verified += 1
        t_check = time.perf_counter() - tv
    run.state.source.pushed(step)
    t2 = time.perf_counter()
    ro = run.path.trained(data)
    if verify:
        metrics["time/verify"] = t_warm + t_check
    metrics.update({"time/sync": t2 - t1 - t_check, "time/generate": t_gen, "time/step": t2 - t0,
                    "perf/tokens_per_s": (int(ro.prompt_offsets[-1]) + int(ro.response_offsets[-1])) / (t2 - t0)})
    metrics.update(run.state.source.metrics(t0, t2, meta["gen_s"]))
    peak = peak_memory(reset=True)   # this rank's GPU peaks over the step (0 without CUDA): plan's figure to check
    metrics.update({"memory/gpu_peak_allocated_gib": peak["allocated"] / 2 ** 30,
                    "memory/gpu_peak_reserved_gib": peak["reserved"] / 2 ** 30})
    if sim is not None:
        metrics.update(sim.step_metrics())
    if run.info.is_driver:
        metrics.update(run.client.stats())
        metrics.update(run.path.driver_stats(data))
    for k in ("actor/loss", "reward/mean"):
        if k in metrics and not math.isfinite(metrics[k]):
            raise FloatingPointError(f"step {step}: {k} is {metrics[k]}")
    return metrics


def run(cfg, resume: str | None = None, client=None, overwrite: bool = False, allow_config_change: bool = False,
        resume_cmd: str | None = None, keep: tuple = ()) -> dict:
    """Train ``cfg`` (SPMD); returns the summary dict (held-out accuracy before/after etc.).
    ``overwrite``: archive an earlier run in ``trainer.run_dir`` (``trainer/state/run_dir.py``; ``keep``: entries
    that stay besides the config's inputs);
    ``allow_config_change``: resume despite a changed method / group size / model (``trainer/state/run_config.py``).
    SIGINT / SIGTERM stop it gracefully (``trainer/loop/stop.py``): the step in flight is finished and
    checkpointed, the line to continue it printed (``resume_cmd``, ``cli``'s; else a template), then :class:`~megatron_rl.trainer.loop.stop.Stopped` (exit status 130 / 143) is raised."""
    with GracefulStop() as stop, _simulated_gpu() as sim:
        rn = setup_run(cfg, resume=resume, client=client, overwrite=overwrite, allow_config_change=allow_config_change,
                       keep=keep)
        stop.reclaim()           # ray.init (in setup_run) installed its own SIGTERM handler
        summary, stopped = {"start_step": rn.state.step}, 0
        rn.state.source = open_source(rn)
        try:
            if rn.val_set is not None and rn.state.step == 0:
                _eval_summary(summary, evaluate(rn, 0), "before")
            stop.arm(lambda: rn.state.last_checkpoint)
            stopped = _train_steps(rn, stop)
            if stopped:
                rn.logger.finish()   # progress bar and wandb run closed before the stop line
            else:
                _finish(rn, summary)
        finally:
            rn.state.source.close()   # async: the producer thread ends after the collection in flight
            if sim is not None and rn.info.is_driver:
                sim.write_report(Path(cfg.trainer.run_dir) / simulated_gpu.REPORT)
            rn.close(own_client=client is None)
    if stopped:
        if rn.info.is_driver:
            by = signal.Signals(stopped).name if isinstance(stopped, int) else "rollout.mismatch_policy=stop"
            why = "" if isinstance(stopped, int) else f": {stopped}"
            print(f"[megatron-rl] stopped by {by} after step {rn.state.step} of {cfg.trainer.steps}{why}"
                  f" (checkpoint {rn.state.last_checkpoint}); resume with: {resume_cmd or RESUME_TEMPLATE}", flush=True)
        raise Stopped(stopped) if isinstance(stopped, int) else Stopped(0, stopped)
    return summary


@contextlib.contextmanager
def _simulated_gpu():
    """The simulated GPU around the run when ``--simulate-gpu`` asked for it (``runtime/simulated_gpu.py``); one
    already in force (a caller that runs several configs in one process) is used as it is."""
    if simulated_gpu.active() is not None:
        yield simulated_gpu.active()
        return
    if not simulated_gpu.requested():
        yield None
        return
    with simulated_gpu.SimulatedGPU() as sim:
        yield sim


def _train_steps(rn: Run, stop: GracefulStop) -> int | str:
    """Steps ``rn.state.step + 1 .. trainer.steps``, each bounded by ``trainer.step_timeout_s``
    (``stop.StepWatchdog``); after each one every rank asks whether to stop (a signal: checkpoint this step
    unless just done, return the signal number; the mismatch guard with ``rollout.mismatch_policy=stop``: the
    same, returning its line, ``trainer/loop/guard.py``); 0 when all ran."""
    dog = StepWatchdog(rn.cfg.trainer.step_timeout_s, lambda: rn.state.last_checkpoint)
    for step in range(rn.state.step + 1, rn.cfg.trainer.steps + 1):
        with dog.step(step):
            why = _train_step(rn, stop, step)
        if why:
            return why
    return 0


def _train_step(rn: Run, stop: GracefulStop, step: int) -> int | str:
    """One step of :func:`_train_steps` with its evaluation, log line and checkpoint; the reason to stop
    after it (0: go on)."""
    cfg = rn.cfg
    try:
        metrics = rl_step(rn, step)
    except (FloatingPointError, JudgeRejected) as e:   # a non-finite number; a grader refusing its requests
        last = rn.state.last_checkpoint
        raise SystemExit(f"stopping at step {step}: {e}. Last good checkpoint: {last or 'none'}") from e
    except SyncVerifyError as e:   # the trainer's step is sound, the engines are not: keep it, then stop
        rn.state.step = step
        rn.checkpoint()
        raise Halted(f"[megatron-rl] stopped after step {step} (checkpoint {rn.state.last_checkpoint}): {e}",
                     rn.info.is_driver) from None
    if (rn.val_set is not None and cfg.trainer.eval_every and step % cfg.trainer.eval_every == 0
            and step != cfg.trainer.steps):   # no held-out set: preflight warned that eval_every does nothing
        metrics.update(evaluate(rn, step))
    over = guard.agreed(guard.over_limit(cfg, metrics)) if cfg.rollout.mismatch_limit else None
    if cfg.rollout.mismatch_limit:
        metrics["rollout/mismatch_over_limit"] = float(over is not None)
    rn.logger.log(step, metrics)
    rn.state.step = step
    saved = bool(cfg.trainer.ckpt_every and step % cfg.trainer.ckpt_every == 0)
    if saved:
        rn.checkpoint()
    if over is not None and cfg.rollout.mismatch_policy == "warn" and rn.info.is_driver:
        rn.logger.write(f"[megatron-rl] warning: step {step}: {guard.message(cfg, over)}")
    signum = stop.agreed()
    if signum or (over is not None and cfg.rollout.mismatch_policy == "stop"):
        if not saved:
            rn.checkpoint()
        return signum or guard.message(cfg, over)
    return 0


def _eval_summary(summary: dict, metrics: dict, when: str) -> None:
    """``val_acc_<when>``; a multi-turn run's ``val_tool_call_rate_<when>`` / ``val_tool_success_rate_<when>`` too."""
    summary[f"val_acc_{when}"] = metrics["eval/acc"]
    for key in ("tool_call_rate", "tool_success_rate"):
        if f"eval/{key}" in metrics:
            summary[f"val_{key}_{when}"] = metrics[f"eval/{key}"]


def _finish(rn: Run, summary: dict) -> None:
    """After the last step: held-out accuracy, the final checkpoint and HF export, the curve."""
    cfg = rn.cfg
    if rn.val_set is not None:
        _eval_summary(summary, evaluate(rn, cfg.trainer.steps), "after")
    if rn.state.step > summary["start_step"] and (not cfg.trainer.ckpt_every or rn.state.step % cfg.trainer.ckpt_every):
        rn.checkpoint()
    if cfg.trainer.export_hf:
        with rn.colo.trainer_loaded():
            rn.actor.export_hf(str(Path(cfg.trainer.run_dir) / "hf"), tokenizer_dir=cfg.model.tokenizer_path or cfg.model.hf_path)
            if rn.actor.lora is not None:   # hf/ holds the merged weights (W + s·BA); adapter/ the PEFT adapter
                rn.actor.export_adapter(str(Path(cfg.trainer.run_dir) / "adapter"), base_model=cfg.model.hf_path)
                summary["adapter_export"] = str(Path(cfg.trainer.run_dir) / "adapter")
        summary["hf_export"] = str(Path(cfg.trainer.run_dir) / "hf")
    summary["curve"] = str(rn.logger.finish({k: v for k, v in summary.items() if isinstance(v, (int, float))}) or "")
    summary["metrics"] = str(Path(cfg.trainer.run_dir) / "metrics.jsonl")
    summary.update(end_step=rn.state.step, last_checkpoint=rn.state.last_checkpoint, log=str(Path(cfg.trainer.run_dir) / LOG_FILE))


def main(cfg, resume: str | None = None, overwrite: bool = False, resume_cmd: str | None = None,
         allow_config_change: bool = False) -> int:
    """``megatron-rl train`` entry point: console = progress bar, warnings, summary (INFO -> train.log).
    ``resume_cmd``: the command line that continues this run, printed last in the summary."""
    quiet_console(int(os.environ.get("RANK", "0")))
    try:
        summary = run(cfg, resume=resume, overwrite=overwrite, allow_config_change=allow_config_change, resume_cmd=resume_cmd)
    except Stopped:
        destroy_parallel(process_group=True)   # every rank agreed to stop: the groups go before the exit
        raise
    if not dist.is_initialized() or dist.get_rank() == 0:
        print(format_summary(summary, resume=resume_cmd), flush=True)
    destroy_parallel(process_group=True)       # gloo groups alive at interpreter exit may abort it (parallel.py)
    return 0
