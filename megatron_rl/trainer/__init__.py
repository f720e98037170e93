"""megatron_rl.trainer — the Megatron policy side of the RL loop.

Interface the loop codes against (all calls are collective: every rank of the job calls them,
with the same arguments; results are identical on every rank unless stated):

Batch (``trainer/pipeline/batch.py``)
    ``TrainBatch(tokens [N,S] int64 right-padded, loss_mask [N,S-1] float (1 on response
    targets tokens[:,1:]), extras {name: tensor with leading dim N})`` — frozen.
    ``make_batch(prompts, responses, pad_id, extras, seq_len)`` builds one from id lists.
    ``broadcast_batch(batch_or_None, src=0)`` — rank ``src`` passes the batch, others ``None``.
    Always hand the actor the GLOBAL batch; it takes its data-parallel share itself: with ``micro`` an
    int, contiguous shards of padded rows (``N`` divisible by ``dp_size * micro``); with a
    ``packing.TokenBudget``, sequences balanced by tokens and packed (any ``N``).

Actor (``trainer/policy/actor.py``)
    ``actor = PolicyActor(hf_cfg, parallel_info, OptimSpec(...), temperature=T, sequence_parallel=False)``
    ``actor.load_hf(hf_dir)``                                   HF weights via the converter
    ``actor.forward_logprobs(batch, micro, temperature=None, with_entropy=False)``
        -> ``LogProbResult(logp [N,S-1], entropy [N,S-1] | None)`` (fp32, every rank; multiply by
        ``loss_mask`` — values at non-response positions are log-probs of whatever token is there)
    ``actor.train_step(batch, loss_fn, micro, lr_increment=1)`` -> ``TrainStepResult``
        (``loss, grad_norm, lr, update_successful, normaliser, metrics, timings``; ``.to_dict()``);
        raises ``NonFiniteLossError`` (naming the step) BEFORE the update when the loss is NaN/inf
        ``loss_fn(logp [n,S-1], entropy [n,S-1], mb: TrainBatch) -> (loss_sum, normaliser | None, metrics)``
        is called per micro-batch; the step minimises ``sum(loss_sum) / sum(normaliser)`` over the
        GLOBAL batch (``None``: plain sum). Build the pair with
        ``objective.partial_aggregate(loss_mat, mb.loss_mask, mode)`` so any aggregation mode of
        ``algorithms.losses.aggregate`` is invariant to micro-batching / DP / PP. Metric values:
        scalar tensor (averaged over micro-batches and DP) or ``(num, den)`` (global ratio).
    ``actor.hf_weights()`` -> iterator of ``(hf_name, full tensor)`` for weight sync;
    ``actor.export_hf(out_dir)``; ``actor.bare_models()``; ``actor.steps_done``.
    ``ReferencePolicy.from_actor(actor)`` (frozen copy; ``copy_from(actor)`` refreshes it) or
    ``ReferencePolicy(hf_cfg, temperature, sequence_parallel, bf16, parallel_info).load_hf(dir)``;
    same ``forward_logprobs`` (a second model instance; no DDP, no optimizer).

Optimizer (``trainer/policy/optim.py``)
    ``OptimSpec(lr, min_lr, warmup_steps, decay_steps, decay_style, weight_decay, betas, eps,
    clip_grad, use_distributed_optimizer, bf16)``; step n (1-based) uses the schedule's LR at n.

Checkpoints (``trainer/state/checkpoint.py``)
    ``save_checkpoint(run_dir, step, actor, extra_state: dict, keep_last=3) -> Path``
    ``find_latest(run_dir) -> Path | None`` (complete checkpoints only)
    ``load_checkpoint(path, actor) -> LoadedCheckpoint(step, extra_state, rng_restored, path)``
    ``load_model_weights(path, actor_or_reference) -> step`` (weights only, e.g. start RL from SFT)
    Scripts that save must guard their top level with ``if __name__ == "__main__":``.

Vocab-parallel math (``trainer/policy/vocab_parallel.py``)
    ``vocab_parallel_logprobs(logits_shard, targets, tp_group, vocab_size) -> LogProbs(logp, entropy)``
"""
