"""The RL loop. Reads like DESIGN.md's diagram: one named call per stage.

    generate -> reward -> (dynamic sampling) -> old/ref log-probs -> contrastive inputs
             -> advantages -> update -> weight sync -> log -> checkpoint -> eval

Every rank runs this code (SPMD under torchrun); global rank 0 is the Ray driver that talks to the
rollout engines and broadcasts what it receives. ``main(cfg, resume=...)`` is the ``megatron-rl
train`` entry point; ``run(cfg, client=...)`` lets the demo reuse an already started engine pool.
"""
from __future__ import annotations

import dataclasses
import logging
import math
import time
from pathlib import Path

import torch
import torch.distributed as dist

from megatron_rl import algorithms as A
from megatron_rl.trainer import distill_stage as D
from megatron_rl.trainer import rollout_stage as R
from megatron_rl.trainer import score_stage as S
from megatron_rl.trainer import update_stage as U
from megatron_rl.trainer.setup import Run, eval_greedy, setup_run, sync_weights

log = logging.getLogger("megatron_rl.loop")


def collect(run: Run, step: int) -> R.Rollouts:
    """generate + reward (+ greedy baseline for ReMax) + DAPO dynamic sampling; rank 0 drives."""
    hp = run.cfg.algo.hparams
    ro = None
    if run.info.is_driver:
        ro = _collect_dynamic(run, step, hp) if getattr(hp, "filter_groups", False) else _round(run, step, 0)
        if run.grader is not None:      # PAPO: grade in the background; update() collects the scores
            run.pending_grades.start(ro, run.grader, every=getattr(hp, "reward_mode", "dual") == "prm_only")
    return R.broadcast_object(ro)


def _round(run: Run, step: int, round_: int) -> R.Rollouts:
    """One generation batch: sample ``rollout.n`` per prompt, score, DAPO overlong shaping, and the
    greedy baseline for ReMax-based methods (rank 0)."""
    cfg, hp = run.cfg, run.cfg.algo.hparams
    idx = run.sampler.next_batch()
    part = R.score(R.generate(run.client, run.train_set, idx, R.sampling_params(cfg, step, round_, eos_id=run.tok.eos_id),
                              run.tok), run.rewards)
    if getattr(hp, "overlong_enable", False):
        part = R.overlong_shaping(part, hp, cfg.rollout.max_tokens)
    if A.KIND_DATA_PATH.get(cfg.algo.kind) == "greedy" or getattr(hp, "base", None) == "remax":
        sp = R.sampling_params(cfg, step, round_ + 1, greedy=True, eos_id=run.tok.eos_id)
        g = R.score(R.generate(run.client, run.train_set, idx, sp, run.tok), run.rewards)
        part.greedy_rewards = g.rewards.repeat_interleave(cfg.rollout.n)
    return part


def _collect_dynamic(run: Run, step: int, hp) -> R.Rollouts:
    """DAPO dynamic sampling (spec §3 DAPO): keep groups whose metric is not uniform, over successive
    generation batches, until ``prompts_per_step`` groups are kept; then the first ``prompts_per_step``.
    ``max_num_gen_batches`` ≤ 0: unlimited (a warning every 10 batches); at the cap ``at_cap=raise``
    stops the run (the reference's behaviour), ``at_cap=fill`` completes the batch with uniform
    groups of this step's batches — each group at most once — counted as ``dynamic/padded_groups``."""
    need, n = run.cfg.data.prompts_per_step, run.cfg.rollout.n
    ds = A.DynamicSampler(need, max(0, hp.max_num_gen_batches))
    kept, spare = [], []
    while not ds.ready:
        if hp.max_num_gen_batches > 0 and ds.batches >= hp.max_num_gen_batches:
            if hp.at_cap == "raise":
                raise RuntimeError(f"dynamic sampling: {ds.kept_prompts}/{need} informative groups after "
                                   f"max_num_gen_batches={hp.max_num_gen_batches} generation batches at step {step}; "
                                   f"raise algo.{run.cfg.algo.kind}.max_num_gen_batches (<= 0: unlimited) or set at_cap=fill")
            break
        part = _round(run, step, ds.batches)
        metric = part.correct.float() if hp.filter_metric == "acc" else part.rewards
        keep = ds.add(metric, part.group_ids).tolist()
        kept.append(part.select(keep))
        drop = sorted(set(range(len(part))) - set(keep))
        spare.append(part.select(drop))
        if hp.max_num_gen_batches <= 0 and ds.batches % 10 == 0:
            log.warning("dynamic sampling: %d generation batches so far at step %d, %d/%d informative groups",
                        ds.batches, step, ds.kept_prompts, need)
    return _fill(kept, spare, need, n, ds)


def _fill(kept: list, spare: list, need: int, n: int, ds) -> R.Rollouts:
    """The first ``need`` kept groups, completed (fill mode) by whole uniform groups never used before."""
    parts = [p for p in kept if len(p)]
    have = sum(len(p) for p in parts) // n
    padded = 0
    for p in spare:
        if have + padded >= need:
            break
        take = min(len(p) // n, need - have - padded)
        if take:
            parts.append(p.select(list(range(take * n))))
            padded += take
    ro = R.concat(parts)
    ro = ro.select(list(range(min(len(ro), need * n))))
    ro.stats = {**ro.stats, "dynamic/gen_rounds": ds.batches, "dynamic/padded_groups": padded,
                "dynamic/filtered_groups": ds.filtered_prompts}
    return ro


def update(run: Run, ro: R.Rollouts, step: int) -> dict:
    """old/ref log-probs -> contrastive inputs -> advantages -> one optimizer step."""
    cfg, hp, kind = run.cfg, run.cfg.algo.hparams, run.cfg.algo.kind
    mbs, R_max, pad = cfg.trainer.micro_batch_size, cfg.rollout.max_tokens, run.tok.pad_id
    plain = U.build_seq_batch(ro.prompts, ro.responses, pad, run.seq_len(ro.prompts, ro.responses), R_max)
    run.dump_samples(step, "policy", [p + r for p, r in zip(ro.prompts, ro.responses)])
    old, ref, metrics = U.old_ref_logprobs(run, ro, plain)
    m = plain.resp_mask
    if A.KIND_DATA_PATH.get(kind) == "process_reward":
        # the rubric grader ran while the log-probs above were computed; wait for what is left
        metrics["time/grader_wait"] = run.pending_grades.finish(ro, run.info.is_driver)
        metrics["time/grader_overlap"] = metrics["time/logprobs"]
    train_sb, old_train = plain, old
    if A.KIND_DATA_PATH.get(kind) == "bicc_context":
        prompts, n_cond, n_fb = U.bicc_inputs(ro, hp, cfg.data.max_prompt_len + R_max, cfg.rollout.max_model_len,
                                              run.bicc_layout, run.tok.eos_id)
        train_sb = U.build_seq_batch(prompts, ro.responses, pad, run.seq_len(prompts, ro.responses), R_max)
        run.dump_samples(step, "bicc_conditioned", [p + r for p, q, r in zip(prompts, ro.prompts, ro.responses)
                                                     if list(p) != list(q)])
        if hp.old_logprob_context == "conditioned":
            old_train = U.response_frame(run.actor.forward_logprobs(train_sb.batch, mbs).logp, train_sb)
        metrics.update({"bicc/conditioned_frac": n_cond / len(ro), "bicc/budget_fallbacks": n_fb})
    adv = A.compute_advantages(kind, U.advantage_inputs(ro, m, old_logp=old, ref_logp=ref), hp).float()
    extras = {"rewards": ro.rewards.float(), "group_ids": ro.group_ids, "advantages": adv, "old_logp": old_train,
              "resp_pos": train_sb.resp_pos, "resp_mask": train_sb.resp_mask}
    if ref is not None:
        extras["ref_logp"] = ref
    batch = dataclasses.replace(train_sb.batch, extras=extras)
    res = run.actor.train_step(batch, U.make_loss_fn(kind, hp), mbs)
    metrics.update({f"actor/{k}" if "/" not in k else k: v for k, v in res.to_dict().items()})
    metrics["adv/mean_abs"] = float(adv.abs().mean())
    return metrics


def step_metrics(ro: R.Rollouts, cfg) -> dict:
    n = cfg.rollout.n
    r = ro.rewards.view(-1, n) if len(ro) % n == 0 else ro.rewards.view(1, -1)
    lens = torch.tensor([len(x) for x in ro.responses], dtype=torch.float32)
    return {"reward/mean": float(ro.rewards.mean()), "reward/acc": float(ro.correct.float().mean()),
            "reward/all_correct_groups": float((r.min(1).values > 0.5).float().mean()),
            "reward/all_wrong_groups": float((r.max(1).values <= 0.5).float().mean()),
            "response/len_mean": float(lens.mean()),
            "response/clip_frac": sum(f == "length" for f in ro.finish) / len(ro), **ro.stats}


def rl_step(run: Run, step: int) -> dict:
    """One RL step; returns the metrics row."""
    t0 = time.perf_counter()
    two = A.KIND_DATA_PATH.get(run.cfg.algo.kind) == "two_attempts"   # SCoRe: trainer/score_stage.py
    pair = S.collect_two(run, step) if two else None
    ro = pair.second if two else collect(run, step)
    t_gen = time.perf_counter() - t0
    metrics = step_metrics(pair.first if two else ro, run.cfg)
    if two:
        metrics.update(S.update_two(run, pair, step))
    elif A.KIND_DATA_PATH.get(run.cfg.algo.kind) in ("rlcsd_hints", "gt_teacher"):
        metrics.update(D.update_teacher(run, ro, step))
    else:
        metrics.update(update(run, ro, step))
    t1 = time.perf_counter()
    sync_weights(run)
    metrics["time/sync"] = time.perf_counter() - t1
    metrics["time/generate"] = t_gen
    metrics["time/step"] = time.perf_counter() - t0
    tokens = sum(len(p) + len(r) for p, r in zip(ro.prompts, ro.responses))
    metrics["perf/tokens_per_s"] = tokens / metrics["time/step"]
    if run.info.is_driver:
        metrics.update(run.client.stats())
        if run.grader is not None:
            metrics.update(run.grader.stats())
            metrics["reward/process_mean"] = float(ro.process[ro.correct].mean()) if bool(ro.correct.any()) else 0.0
    for k in ("actor/loss", "reward/mean"):
        if k in metrics and not math.isfinite(metrics[k]):
            raise FloatingPointError(f"step {step}: {k} is {metrics[k]}")
    return metrics


def run(cfg, resume: str | None = None, client=None, overwrite: bool = False) -> dict:
    """Train ``cfg`` (SPMD); returns the summary dict (held-out accuracy before/after etc.).
    ``overwrite``: archive an earlier run in ``trainer.run_dir`` (``trainer/run_dir.py``)."""
    rn = setup_run(cfg, resume=resume, client=client, overwrite=overwrite)
    summary = {"start_step": rn.step}
    try:
        if rn.val_set is not None and rn.step == 0:
            summary["val_acc_before"] = eval_greedy(rn, 0)
        for step in range(rn.step + 1, cfg.trainer.steps + 1):
            try:
                metrics = rl_step(rn, step)
            except FloatingPointError as e:
                last = rn.last_checkpoint
                raise SystemExit(f"stopping at step {step}: {e}. Last good checkpoint: {last or 'none'}") from e
            if cfg.trainer.eval_every and step % cfg.trainer.eval_every == 0 and step != cfg.trainer.steps:
                metrics["eval/acc"] = eval_greedy(rn, step)
            rn.logger.log(step, metrics)
            rn.step = step
            if cfg.trainer.ckpt_every and step % cfg.trainer.ckpt_every == 0:
                rn.checkpoint()
        if rn.val_set is not None:
            summary["val_acc_after"] = eval_greedy(rn, cfg.trainer.steps)
        if rn.step > summary["start_step"] and (not cfg.trainer.ckpt_every or rn.step % cfg.trainer.ckpt_every):
            rn.checkpoint()
        if cfg.trainer.export_hf:
            rn.actor.export_hf(str(Path(cfg.trainer.run_dir) / "hf"), tokenizer_dir=cfg.model.tokenizer_path or cfg.model.hf_path)
            summary["hf_export"] = str(Path(cfg.trainer.run_dir) / "hf")
        summary["curve"] = str(rn.logger.finish({k: v for k, v in summary.items() if isinstance(v, (int, float))}) or "")
        summary["metrics"] = str(Path(cfg.trainer.run_dir) / "metrics.jsonl")
    finally:
        rn.close(own_client=client is None)
    return summary


def main(cfg, resume: str | None = None, overwrite: bool = False) -> int:
    """``megatron-rl train`` entry point: console = progress bar, warnings, summary (INFO -> train.log)."""
    import os

    from megatron_rl.console import quiet_console

    quiet_console(int(os.environ.get("RANK", "0")))
    summary = run(cfg, resume=resume, overwrite=overwrite)
    if not dist.is_initialized() or dist.get_rank() == 0:
        print({k: v for k, v in summary.items()})
    return 0
