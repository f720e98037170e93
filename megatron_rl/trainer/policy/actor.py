"""The Megatron policy: per-token log-probs / entropy and the training step.

``PolicyActor``     model chunks (provider) in megatron ``DistributedDataParallel``, megatron
                    optimizer + LR scheduler, ``forward_logprobs`` and ``train_step``.
``ReferencePolicy`` a frozen second model instance (no DDP, no optimizer) for KL reference log-probs.

Log-probs of a batch (both classes): for response targets ``y_t = tokens[:, t+1]``

    logp[n, t] = log softmax(z[n, t] / T)[y_t],    H[n, t] = entropy of softmax(z[n, t] / T)

computed vocab-parallel on the last pipeline stage (``trainer/policy/vocab_parallel.py``). The temperature
``T`` must equal the rollout engine's sampling temperature so that old/rollout log-probs and
trainer log-probs describe the same distribution.

Training objective (``train_step``): ``loss_fn(logp, entropy, mb) -> (loss_sum, normaliser, metrics)``
is called once per micro-batch ``mb``; the step minimises

    L = sum_{mb, DP ranks} loss_sum  /  sum_{mb, DP ranks} normaliser      (normaliser None: no division)

i.e. the normaliser is taken over the GLOBAL batch (see ``trainer/pipeline/objective.py``), so ``L`` and its
gradient do not depend on micro-batch size, DP or PP.

Micro-batches: every pass takes ``micro``, either an int (padded: that many right-padded rows per
micro-batch, the batch split evenly over DP) or a :class:`~megatron_rl.trainer.pipeline.packing.TokenBudget`
(packed: sequences balanced over DP by tokens and packed into rows, ``trainer/pipeline/packing.py``). Packed
results are unpacked into each sequence's own frame before they leave the actor, and ``loss_fn`` sees
the per-sequence view, so callers and losses are the same in both layouts. Mechanism: megatron's
``calculate_per_token_loss=True`` keeps each micro-batch loss un-normalised, DDP sums (not averages)
grads over DP, and ``finalize_model_grads`` divides all grads by the all-reduced normaliser.
"""
from __future__ import annotations

import contextlib
import dataclasses
import math
import time
from functools import partial
from typing import Any, Callable, Iterator, NamedTuple

import torch

from megatron_rl.runtime.device import default_device
from megatron_rl.trainer.policy import cp_batch
from megatron_rl.trainer.pipeline.batch import TrainBatch
from megatron_rl.trainer.pipeline.packing import PackedMicroBatch, RankMicroBatches, TokenBudget, seq_lengths, unpacked_collection
from megatron_rl.trainer.pipeline.packing import plan as pack_plan
from megatron_rl.trainer.policy.optim import OptimSpec, build_optimizer, current_lr
from megatron_rl.trainer.loop.schedule import (Groups, from_last_stage, gather_dp, run_schedule, sum_dp,
                                          tensor_from_last_stage)
from megatron_rl.trainer.policy.vocab_parallel import (LogProbs, vocab_parallel_gather_logprobs, vocab_parallel_logprobs,
                                                vocab_parallel_topk)

LossFn = Callable[[torch.Tensor, torch.Tensor, TrainBatch], tuple]
"""``(logp [n,S-1], entropy [n,S-1], mb) -> (loss_sum scalar, normaliser scalar | None, metrics dict)``.

A loss function that implements :class:`~megatron_rl.trainer.pipeline.objective.SupportObjective` with a
``support_key`` (the name of an ``mb.extras`` entry holding global vocab ids ``[n, S-1, k]``) is called as ``loss_fn(logp, entropy, mb, support)`` with ``support``
``[n, S-1, k]`` = the student's full-vocab log-probs at those ids (differentiable, vocab-parallel):
the distillation losses' top-k supports.

Metric values: a scalar tensor (reported as its mean over micro-batches and DP ranks) or a
``(numerator, denominator)`` pair (reported as sum of numerators / sum of denominators over the
global batch — use this for token means so they are invariant to micro-batching).
"""


class NonFiniteLossError(FloatingPointError):
    """The global loss of a step was NaN/inf; raised BEFORE the optimizer step (weights unchanged)."""


class LogProbResult(NamedTuple):
    """``logp`` ``[N, S-1]`` fp32 on every rank; ``entropy`` likewise or None."""

    logp: torch.Tensor
    entropy: torch.Tensor | None


@dataclasses.dataclass
class TrainStepResult:
    """What one optimizer step reports (identical on every rank)."""

    loss: float
    grad_norm: float
    lr: float
    update_successful: bool
    normaliser: float
    metrics: dict[str, float]
    timings: dict[str, float]

    def to_dict(self) -> dict[str, float]:
        return {"loss": self.loss, "grad_norm": self.grad_norm, "lr": self.lr, "update_successful": float(self.update_successful),
                "normaliser": self.normaliser, **self.metrics, **{f"time/{k}": v for k, v in self.timings.items()}}


def _support_key(loss_fn) -> str | None:
    from megatron_rl.trainer.pipeline.objective import SupportObjective

    return loss_fn.support_key if isinstance(loss_fn, SupportObjective) else None


def unwrap(module: torch.nn.Module) -> torch.nn.Module:
    """The bare ``GPTModel`` inside DDP / Float16Module wrappers."""
    while hasattr(module, "module"):
        module = module.module
    return module


def _build_chunks(hf_cfg, bf16: bool, g: Groups, sequence_parallel: bool, backend: str = "local",
                  fp8: str | None = None, **overrides):
    """(list of model chunks, TransformerConfig) from the provider for this pipeline stage, with the
    layer spec of ``backend`` (``models.provider.resolve_model_backend``), TE ``fp8``, the CUDA fusions
    of that backend (``models.provider.cuda_fusions``) and ``overrides`` (``TransformerConfig`` fields:
    the recompute settings, ``models.provider.recompute_overrides``).

    Every chunk is on the trainer's device (``device.default_device``) when this returns, whatever
    wraps it later: the distributed optimizer re-points ``param.data`` into its own buffers, but the
    reference and a plain-optimizer actor have no such step, and megatron's local norms are built on
    the host even without ``use_cpu_initialization``."""
    from megatron.core import parallel_state as ps

    from megatron_rl.models.provider import (
        build_gpt_model,
        check_cp_backend,
        cuda_fusions,
        resolve_model_backend,
        transformer_config_from_hf,
    )

    backend = resolve_model_backend(backend, fp8, sequence_parallel)
    check_cp_backend(g.cp_size, backend)
    if g.cp_size > 1:   # TE's THD attention with its p2p ring (KV chunks passed round the CP group)
        overrides = {"context_parallel_size": g.cp_size, "cp_comm_type": "p2p", **overrides}
    dtype = torch.bfloat16 if bf16 else torch.float32
    vpp = ps.get_virtual_pipeline_model_parallel_world_size() or 1    # interleaved 1F1B: vpp chunks per rank
    if vpp > 1:   # Megatron-LM's interleaved defaults: overlapped, unbatched p2p. Batched p2p at PP=2 posts the
        # activation and the gradient to the same peer in different orders on the two ranks, and gloo pairs them
        # by order: they were swapped (measured: a 230x grad norm); the unbatched path uses two groups
        overrides = {"virtual_pipeline_model_parallel_size": vpp, "overlap_p2p_comm": True, "batch_p2p_comm": False,
                     **overrides}
    config = transformer_config_from_hf(
        hf_cfg, tp=g.tp_size, pp=g.pp_size, sequence_parallel=sequence_parallel, params_dtype=dtype,
        calculate_per_token_loss=True, bf16=bf16, pipeline_dtype=dtype, fp8=fp8,
        **{**cuda_fusions(backend), **overrides})
    chunks = []
    for v in range(vpp):
        vp = v if vpp > 1 else None
        model = build_gpt_model(hf_cfg, config, backend=backend, vp_stage=vp,
                                pre_process=ps.is_pipeline_first_stage(ignore_virtual=vpp == 1, vp_stage=vp),
                                post_process=ps.is_pipeline_last_stage(ignore_virtual=vpp == 1, vp_stage=vp))
        model.to(default_device())
        if bf16:
            from megatron.core.transformer.module import Float16Module
            model = Float16Module(config, model)
        chunks.append(model)
    return chunks, config


@contextlib.contextmanager
def _output_rows(model: torch.nn.Module, sel: torch.Tensor | None):
    """While active, the output layer of ``model`` (last stage) sees only the hidden states of the
    positions ``sel`` (``[b, S-1]`` bool, row-major) as one ``[n, 1, h]`` sequence, so the model returns
    logits ``[1, n, V]``: no vocab projection at positions nobody reads. Not with sequence parallelism
    (the output layer's input is then sharded over the sequence)."""
    layer = getattr(unwrap(model), "output_layer", None) if sel is not None else None
    if layer is None:
        yield
        return
    rows, cols = sel.nonzero(as_tuple=True)
    hook = layer.register_forward_pre_hook(
        lambda _m, args, kwargs: ((args[0][cols, rows].unsqueeze(1), *args[1:]), kwargs), with_kwargs=True)
    try:
        yield
    finally:
        hook.remove()


class _LogProbModel:
    """Shared forward machinery: model chunks -> per-token log-probs / entropy on every rank."""

    def __init__(self, hf_cfg, chunks, config, temperature: float, sequence_parallel: bool, parallel_info=None):
        if not temperature > 0:
            raise ValueError(f"temperature must be > 0, got {temperature}")
        self.hf_cfg = hf_cfg
        self.chunks = chunks
        self.config = config
        self.temperature = float(temperature)
        self.sequence_parallel = sequence_parallel
        self.groups = Groups.current()
        self.vocab_size = int(hf_cfg.vocab_size)
        self.parallel_info = parallel_info
        self.device = default_device()
        self.backend = "local"     # the layer spec built (subclasses: local | te)
        # interleaved 1F1B (several chunks per rank) needs at least PP micro-batches: zero-mask fillers make up the rest
        self.min_micro_batches = self.groups.pp_size if len(chunks) > 1 else 1

    # ----- helpers -------------------------------------------------------------------------
    def _budget(self, budget: TokenBudget) -> TokenBudget:
        """Row lengths also a multiple of TP under sequence parallelism."""
        if self.sequence_parallel and budget.multiple % self.groups.tp_size:
            return dataclasses.replace(budget, multiple=math.lcm(budget.multiple, self.groups.tp_size))
        return budget

    def _packed(self, batch: TrainBatch, budget: TokenBudget, pack_keys=()) -> tuple[Any, RankMicroBatches]:
        """This DP rank's packed micro-batches of the global ``batch`` and the plan (every rank computes
        the same plan from the same batch, so no communication is needed)."""
        plan = pack_plan(seq_lengths(batch), self._budget(budget), self.groups.dp_size, self.min_micro_batches)
        mbs = RankMicroBatches(batch, plan, self.groups.dp_rank, pack_keys=pack_keys, same_shape=self.groups.pp_size > 1,
                               thd=self.backend == "te")      # TE's kernels take packed rows as THD, not a dense mask
        return plan, mbs

    def _local_batch(self, batch: TrainBatch, micro_batch_size: int) -> tuple[TrainBatch, list[TrainBatch]]:
        g = self.groups
        if batch.num_samples % (g.dp_size * micro_batch_size):
            raise ValueError(f"batch of {batch.num_samples} samples is not divisible by data-parallel size "
                             f"{g.dp_size} x micro_batch_size {micro_batch_size}")
        local = batch.shard(g.dp_rank, g.dp_size)
        if self.sequence_parallel:
            local = local.pad_to_multiple(g.tp_size)
        mbs = local.micro_batches(micro_batch_size)
        # interleaved 1F1B: zero-mask copies up to PP micro-batches (no loss, normaliser or metric; dropped after)
        return local, mbs + [mbs[0].zero_masked() for _ in range(self.min_micro_batches - len(mbs))]

    def _logprobs(self, logits: torch.Tensor, mb: TrainBatch, temperature: float):
        return LogProbs(**self._per_token(mb, logits, temperature, lambda z, t: vocab_parallel_logprobs(
            z, t, self.groups.tp, vocab_size=self.vocab_size)._asdict(), mb.targets))

    def _per_token(self, mb, logits: torch.Tensor, temperature: float, fn: Callable, *inputs: torch.Tensor) -> dict:
        """``fn(z, *inputs) -> {key: [b, n, ...]}`` per-token terms in the target frame ``[rows, L-1, ...]``:
        on ``logits[:, :-1] / temperature``, or, under context parallelism, on this CP rank's slice and
        gathered back (``cp_batch.per_token``: every micro-batch then runs as THD, a padded row as one sequence)."""
        g = self.groups
        if g.cp_size > 1:
            fr = cp_batch.rank_frame(mb, g, self.sequence_parallel)
            return cp_batch.per_token(mb, fr, logits, temperature, fn, inputs, g.cp, g.cp_rank, g.cp_size)
        z = logits[:, :-1]
        return fn(z / temperature if temperature != 1.0 else z, *inputs)

    def _forward_step(self, loss_func: Callable, data_iterator: Iterator, model, masked: bool = False):
        mb = next(data_iterator).to(self.device)
        if getattr(mb, "thd", False) or self.groups.cp_size > 1:
            return self._thd_forward(mb, model), partial(loss_func, mb)
        with _output_rows(model, mb.loss_mask > 0 if masked else None):
            out = model(mb.tokens, mb.position_ids(), mb.attention_mask())
        return out, partial(loss_func, mb)

    def _thd_forward(self, mb, model):
        """Packed rows on Transformer Engine: THD with ``cu_seqlens`` (``packing.thd_layout``) instead of
        the dense block-diagonal mask its kernels would ignore; on the last stage the logits are reshaped
        back to ``[rows, L, V]`` (earlier stages pass ``[T, 1, h]`` hidden states on, the shape
        ``PackedMicroBatch.schedule_shape`` gives the pipeline). GPU only (CUDA + TE): not run on the CPU
        development machine; ``tests/gpu/test_packing_thd.py``."""
        from megatron.core.packed_seq_params import PackedSeqParams

        from megatron_rl.trainer.pipeline.packing import thd_layout

        if self.groups.cp_size > 1:   # this CP rank's two chunks of every sequence; logits stay [1, n_local, V]
            tokens, pos, psp = cp_batch.model_inputs(cp_batch.rank_frame(mb, self.groups, self.sequence_parallel))
            return model(tokens, pos, None, packed_seq_params=psp)
        tokens, pos, cu, longest = thd_layout(mb)
        psp = PackedSeqParams(qkv_format="thd", cu_seqlens_q=cu, cu_seqlens_kv=cu, max_seqlen_q=longest,
                              max_seqlen_kv=longest)
        out = model(tokens, pos, None, packed_seq_params=psp)
        return out.reshape(mb.num_samples, mb.seq_len, *out.shape[2:]) if self.groups.is_last_stage else out

    def _collect_logprobs(self, temperature: float, with_entropy: bool, mb: TrainBatch, logits: torch.Tensor):
        with torch.no_grad():
            lp = self._logprobs(logits, mb, temperature)
        data = {"logp": lp.logp}
        if with_entropy:
            data["entropy"] = lp.entropy
        return torch.zeros((), device=logits.device), torch.zeros((), dtype=torch.int, device=logits.device), data

    def _collect_support(self, temperature: float, k: int | None, index_key: str | None, masked: bool,
                         mb: TrainBatch, logits: torch.Tensor):
        tp, nv = self.groups.tp, self.vocab_size

        def terms(z, targets, *index):
            tok = vocab_parallel_logprobs(z, targets, tp, vocab_size=nv)
            d = {"token_logp": tok.logp, "entropy": tok.entropy}
            if k is not None:
                tk = vocab_parallel_topk(z, k, tp, vocab_size=nv)
                d.update({"idx": tk.idx, "logp": tk.logp})
            elif index:
                d["logp"] = vocab_parallel_gather_logprobs(z, index[0], tp, vocab_size=nv)
            return d

        inputs = (mb.targets, *((mb.extras[index_key],) if k is None and index_key is not None else ()))
        sel = mb.loss_mask > 0 if masked and self.groups.cp_size == 1 else None   # masked: logits [1, n, V] at sel
        with torch.no_grad():
            if sel is None:
                data = self._per_token(mb, logits, temperature, terms, *inputs)
            else:                                        # _output_rows: logits at the loss-mask positions only
                data = terms(logits / temperature if temperature != 1.0 else logits, *(x[sel][None] for x in inputs))
                for key, v in data.items():              # back to [b, S-1, ...], 0 off the mask
                    full = v.new_zeros((*sel.shape, *v.shape[2:]))
                    full[sel] = v[0]
                    data[key] = full
        return torch.zeros((), device=logits.device), torch.zeros((), dtype=torch.int, device=logits.device), data

    def _forward_only(self, batch: TrainBatch, micro_batch_size, collect: Callable,
                      specs: dict[str, tuple[tuple[int, ...], torch.dtype]], pack_keys=(),
                      masked: bool = False) -> dict[str, torch.Tensor]:
        """Run ``collect`` over ``batch`` (forward-only schedule, padded rows dropped) and return each
        ``specs`` key as a GLOBAL tensor on every rank. ``specs``: key -> (trailing shape, dtype).
        ``micro_batch_size``: rows (padded) or a :class:`TokenBudget` (packed; ``pack_keys``: extras in the
        target frame the collection reads, moved into the packed frame). ``masked`` (padded rows only):
        logits only at the loss-mask positions (:func:`_output_rows`)."""
        if isinstance(micro_batch_size, TokenBudget):
            return self._forward_only_packed(batch, micro_batch_size, collect, specs, pack_keys)
        g = self.groups
        n = batch.num_samples
        batch = batch.pad_rows_to_multiple(g.dp_size * micro_batch_size)
        local, mbs = self._local_batch(batch, micro_batch_size)
        for c in self.chunks:
            c.eval()
        with torch.no_grad():
            store = run_schedule(self.chunks, mbs, partial(self._forward_step, collect, masked=masked),
                                 forward_only=True)
        store = store[: local.num_samples // micro_batch_size]     # the fillers' collections are dropped
        out = {}
        for key, (trail, dtype) in specs.items():
            shape = (local.num_samples, local.seq_len - 1, *trail)
            x = torch.cat([d[key] for d in store], dim=0).to(dtype) if g.is_last_stage else None
            x = tensor_from_last_stage(g, x, shape, dtype=dtype)
            out[key] = gather_dp(g, x)[:n, : batch.seq_len - 1]
        return out

    def _forward_only_packed(self, batch: TrainBatch, budget: TokenBudget, collect: Callable, specs: dict,
                             pack_keys=()) -> dict[str, torch.Tensor]:
        """:meth:`_forward_only` on packed micro-batches: each collection is unpacked into its sequences'
        frame on the last stage, then the ranks' sequences are gathered back into the global order."""
        g = self.groups
        plan, mbs = self._packed(batch, budget, pack_keys)
        for c in self.chunks:
            c.eval()
        with torch.no_grad():
            store = run_schedule(self.chunks, mbs, partial(self._forward_step, partial(unpacked_collection, collect)),
                                 forward_only=True)
        owners = [[i for mb in rk for row in mb for i in row] for rk in plan.ranks]   # global rows per rank, in order
        most = max(len(o) for o in owners)
        s1 = batch.seq_len - 1
        out = {}
        for key, (trail, dtype) in specs.items():
            shape = (most, s1, *trail)
            x = None
            if g.is_last_stage:
                real = [d[key][: len(d["_owner"])] for d in store if d["_owner"] != [-1]]
                x = torch.cat(real, 0).to(dtype) if real else torch.zeros((0, s1, *trail), dtype=dtype)
                x = torch.cat([x, x.new_zeros((most - x.shape[0], s1, *trail))], 0)
            x = tensor_from_last_stage(g, x, shape, dtype=dtype)
            parts = gather_dp(g, x).reshape(g.dp_size, most, s1, *trail)
            full = torch.zeros((batch.num_samples, s1, *trail), dtype=dtype, device=parts.device)
            for r, rows in enumerate(owners):
                if rows:
                    full[torch.tensor(rows, device=parts.device)] = parts[r, : len(rows)]
            out[key] = full
        return out

    # ----- public --------------------------------------------------------------------------
    def forward_support(self, batch: TrainBatch, micro_batch_size: int, *, k: int | None = None,
                        index_key: str | None = None, temperature: float | None = None,
                        masked: bool = False) -> dict[str, torch.Tensor]:
        """Per-position teacher/student quantities of ``batch`` (no grad), vocab-parallel, last stage.

        Always ``{"token_logp" [N,S-1], "entropy" [N,S-1]}`` (log-prob of ``tokens[:, 1:]`` and the
        full-vocab entropy). ``k`` given: also ``"idx" [N,S-1,k]`` long — the k most likely ids
        (ties -> lowest id) — and ``"logp" [N,S-1,k]`` their full-vocab log-probs. ``index_key``
        given instead: ``"logp" [N,S-1,k]`` at the ids in ``batch.extras[index_key]``.
        Padding rows as in :meth:`forward_logprobs`. ``masked``: computed only where ``loss_mask > 0``
        (0 elsewhere; the output layer and the vocab passes skip the other positions); padded rows
        without sequence parallelism only (else ignored).
        """
        if k is not None and index_key is not None:
            raise ValueError("forward_support: pass at most one of k (choose the top-k) or index_key (gather)")
        t = self.temperature if temperature is None else float(temperature)
        specs = {"token_logp": ((), torch.float32), "entropy": ((), torch.float32)}
        if k is not None or index_key is not None:
            kk = k if k is not None else int(batch.extras[index_key].shape[-1])
            specs["logp"] = ((kk,), torch.float32)
            if k is not None:
                specs["idx"] = ((kk,), torch.long)
        masked = masked and not self.sequence_parallel and not isinstance(micro_batch_size, TokenBudget)
        return self._forward_only(batch, micro_batch_size, partial(self._collect_support, t, k, index_key, masked),
                                  specs, pack_keys=(index_key,) if index_key else (), masked=masked)

    def forward_logprobs(self, batch: TrainBatch, micro_batch_size: int, temperature: float | None = None,
                         with_entropy: bool = False) -> LogProbResult:
        """Log-probs (and entropy) of ``batch`` (the GLOBAL batch, same on all ranks) on every rank.

        Each DP rank computes its contiguous shard through the forward-only schedule; the last
        stage's results are broadcast over PP and all-gathered over DP. Shapes ``[N, S-1]``.
        ``N`` need not divide by ``dp_size * micro_batch_size``: the batch is padded with copies
        of its last row (results dropped).
        """
        t = self.temperature if temperature is None else float(temperature)
        specs = {"logp": ((), torch.float32)}
        if with_entropy:
            specs["entropy"] = ((), torch.float32)
        out = self._forward_only(batch, micro_batch_size, partial(self._collect_logprobs, t, with_entropy), specs)
        return LogProbResult(out["logp"], out.get("entropy"))

    def load_hf(self, hf_dir: str) -> None:
        """Load an HF checkpoint directory into the model (converter maps, TP/PP slicing)."""
        from megatron_rl.convert import load_hf_into_model
        load_hf_into_model(self.bare_models(), hf_dir, self.parallel_info)

    def bare_models(self) -> list[torch.nn.Module]:
        """The unwrapped ``GPTModel`` chunks (for conversion / weight sync)."""
        return [unwrap(c) for c in self.chunks]

    def hf_weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        """Full HF-named tensors gathered over TP/PP (``convert.iter_hf_tensors``), for weight sync."""
        from megatron_rl.convert import iter_hf_tensors
        return iter_hf_tensors(self.bare_models(), self.hf_cfg)

    def export_hf(self, out_dir: str, tokenizer_dir: str | None = None) -> None:
        """Write an HF checkpoint (safetensors + config [+ the tokenizer files of ``tokenizer_dir``])
        of the current weights to ``out_dir`` (replacing only an earlier export of ours)."""
        from megatron_rl.convert import export_hf
        export_hf(self.bare_models(), self.hf_cfg, out_dir, tokenizer_dir=tokenizer_dir)


class PolicyActor(_LogProbModel):
    """Trainable Megatron policy (DDP + distributed optimizer + LR schedule).

    Args:
        hf_cfg: HF ``PretrainedConfig`` (``models.provider.load_hf_config``) describing the model.
        parallel_info: the ``ParallelInfo`` from ``init_parallel`` (kept for the converter).
        optim: :class:`OptimSpec`.
        temperature: sampling temperature of the rollout engine (default for log-prob passes).
        sequence_parallel: use Megatron sequence parallelism (TP > 1 only).
        offload: what :meth:`offload` parks in host memory: none | optimizer | all
            (``trainer/policy/offload.py``).
        recompute: Megatron activation-recompute fields (``models.provider.recompute_overrides``).
    """

    def __init__(self, hf_cfg, parallel_info, optim: OptimSpec, temperature: float = 1.0,
                 sequence_parallel: bool = False, backend: str = "local", fp8: str | None = None,
                 offload: str = "none", recompute: dict | None = None):
        from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig

        from megatron_rl.trainer.policy.offload import HostStash, check_offload_mode

        self.offload_mode = check_offload_mode(offload)
        self._stash = HostStash()
        self._weights_parked = False

        g = Groups.current()
        sp = bool(sequence_parallel and g.tp_size > 1)
        chunks, config = _build_chunks(hf_cfg, optim.bf16, g, sp, backend, fp8, **(recompute or {}))
        ddp_cfg = DistributedDataParallelConfig(
            grad_reduce_in_fp32=True, overlap_grad_reduce=False,
            use_distributed_optimizer=optim.use_distributed_optimizer)
        # later chunks of an interleaved pipeline in one bucket each (Megatron-LM's disable_bucketing rule)
        chunks = [DistributedDataParallel(config, ddp_cfg, c, disable_bucketing=i > 0) for i, c in enumerate(chunks)]
        for c in chunks:
            c.broadcast_params()
        super().__init__(hf_cfg, chunks, config, temperature, sp, parallel_info)
        from megatron_rl.models.provider import resolve_model_backend

        self.backend, self.fp8 = resolve_model_backend(backend, fp8, sp), fp8   # what was built: local | te
        self.optim_spec = optim
        self.optimizer, self.scheduler = build_optimizer(optim, chunks)
        config.no_sync_func = chunks[0].no_sync if len(chunks) == 1 else [c.no_sync for c in chunks]
        config.finalize_model_grads_func = self._finalize_grads
        config.grad_scale_func = self.optimizer.scale_loss
        self._step_state: dict[str, Any] = {}
        self.steps_done = 0

    # ----- loading -------------------------------------------------------------------------
    def load_hf(self, hf_dir: str) -> None:
        """Load HF weights, then refresh the optimizer's fp32 main copies from them."""
        super().load_hf(hf_dir)
        self.optimizer.reload_model_params()

    # ----- colocated rollouts: free the GPU while the engines generate --------------------------
    def offload(self, mode: str | None = None) -> int:
        """Park what ``mode`` (default ``offload_mode``) names in host memory, releasing the device
        copies, and hand the allocator's cached blocks (the update's freed activations) back to the
        driver, with ``none`` too; returns the bytes moved. A second call before :meth:`onload` parks
        what is left of a wider mode (``optimizer`` first, then ``all``: the weights, once the push has
        read them — ``trainer/loop/colocate.py``). Training before :meth:`onload` is an error, and so are
        log-probs while the weights are parked."""
        from megatron_rl.runtime.device import release_cached_memory
        from megatron_rl.trainer.policy.offload import trainer_tensors

        mode = mode or self.offload_mode
        moved, keep = trainer_tensors(mode, self.optimizer, self.chunks)
        if not moved:
            release_cached_memory()
            return 0
        self._weights_parked = self._weights_parked or mode == "all"
        return self._stash.offload(moved, keep)

    def onload(self) -> int:
        """Bring back, bit for bit, what :meth:`offload` parked; returns the bytes moved."""
        self._weights_parked = False
        return self._stash.restore()

    @property
    def offloaded(self) -> bool:
        return self._stash.offloaded

    def _require_weights(self, what: str) -> None:
        if self._weights_parked:
            raise RuntimeError(f"{what}: the weights are offloaded (trainer.offload=all); call onload() first")

    def bare_models(self) -> list[torch.nn.Module]:
        """As :meth:`_LogProbModel.bare_models`; refused while the weights are offloaded (export,
        weight sync and checkpoints read them)."""
        self._require_weights("bare_models")
        return super().bare_models()

    def _forward_only(self, batch, micro_batch_size, collect, specs, pack_keys=(), masked=False):
        self._require_weights("forward")
        return super()._forward_only(batch, micro_batch_size, collect, specs, pack_keys, masked=masked)

    # ----- training ------------------------------------------------------------------------
    def _finalize_grads(self, model, num_tokens=None, pg_collection=None, force_all_reduce=False):
        """megatron ``finalize_model_grads`` with OUR float normaliser instead of its int token count.

        The normaliser lives on the last stage (0 elsewhere; broadcast inside finalize). A global
        value of 0 — every ``loss_fn`` returned None — means no division.
        """
        from megatron.core.distributed.finalize_model_grads import finalize_model_grads
        norm = self._step_state["norm"].clone()
        if self.groups.cp_rank > 0:   # every CP rank holds the whole normaliser; finalize sums over dp x cp
            norm.zero_()
        finalize_model_grads(model, norm, pg_collection=pg_collection, force_all_reduce=force_all_reduce)

    def _train_loss(self, loss_fn: LossFn, temperature: float, mb, logits: torch.Tensor):
        lp = self._logprobs(logits, mb, temperature)
        key = _support_key(loss_fn)
        packed = isinstance(mb, PackedMicroBatch)
        logp, ent, view = (mb.unpack(lp.logp), mb.unpack(lp.entropy), mb.seqs) if packed else (lp.logp, lp.entropy, mb)
        if key is None:
            out = loss_fn(logp, ent, view)
        else:
            support = self._per_token(mb, logits, temperature, lambda z, ix: {"s": vocab_parallel_gather_logprobs(
                z, ix, self.groups.tp, vocab_size=self.vocab_size)}, mb.extras[key])["s"]
            out = loss_fn(logp, ent, view, mb.unpack(support) if packed else support)
        if not (isinstance(out, tuple) and len(out) == 3):
            raise TypeError("loss_fn must return (loss_sum, normaliser_or_None, metrics)")
        loss_sum, norm, metrics = out
        st = self._step_state
        kind = norm is None
        if st.setdefault("norm_is_none", kind) != kind:
            raise ValueError("loss_fn returned a normaliser for some micro-batches and None for others")
        if norm is not None:
            st["norm"] += torch.as_tensor(norm, dtype=torch.float64, device=self.device).detach().reshape(())
        st["loss_sum"] += loss_sum.detach().double()
        for k, v in (metrics or {}).items():
            num, den = v if isinstance(v, tuple) else (torch.as_tensor(v).detach().float().mean(), 1.0)
            acc = st["metrics"].setdefault(k, [0.0, 0.0])
            acc[0] += float(num)
            acc[1] += float(den)
        return loss_sum, torch.zeros((), dtype=torch.int, device=loss_sum.device), {}

    def train_step(self, batch: TrainBatch, loss_fn: LossFn, micro_batch_size: int,
                   temperature: float | None = None, lr_increment: int = 1) -> TrainStepResult:
        """One optimizer step on the GLOBAL ``batch`` (same on every rank); see the module docstring.
        ``lr_increment``: how far the LR schedule advances before this step (the update pipeline
        passes 0 for the second and later mini-batches of an RL step: the schedule counts RL steps)."""
        if self.offloaded:
            raise RuntimeError("train_step: the trainer is offloaded (trainer.offload); call onload() first")
        t = self.temperature if temperature is None else float(temperature)
        t0 = time.perf_counter()
        if isinstance(micro_batch_size, TokenBudget):
            key = _support_key(loss_fn)
            _, mbs = self._packed(batch, micro_batch_size, pack_keys=(key,) if key else ())
        else:
            _, mbs = self._local_batch(batch, micro_batch_size)
        for c in self.chunks:
            c.train()
            c.zero_grad_buffer()
        self.optimizer.zero_grad()
        z = torch.zeros((), dtype=torch.float64, device=self.device)
        self._step_state = {"norm": z.clone(), "loss_sum": z.clone(), "metrics": {}}
        t1 = time.perf_counter()
        run_schedule(self.chunks, mbs, partial(self._forward_step, partial(self._train_loss, loss_fn, t)),
                     forward_only=False)
        t2 = time.perf_counter()
        result = self._reduce_step()
        if not math.isfinite(result.loss):
            for c in self.chunks:
                c.zero_grad_buffer()
            raise NonFiniteLossError(
                f"train_step: non-finite loss {result.loss} at optimizer step {self.steps_done + 1} "
                f"(normaliser {result.normaliser}); the update was skipped, weights are unchanged")
        t3 = time.perf_counter()
        self.scheduler.step(increment=lr_increment)   # LR of RL step n is the schedule at n (1-based)
        result.lr = current_lr(self.optimizer)
        ok, grad_norm, _ = self.optimizer.step()
        result.update_successful = bool(ok)
        result.grad_norm = float(grad_norm) if grad_norm is not None else float("nan")
        result.timings = {"prepare": t1 - t0, "forward_backward": t2 - t1, "reduce": t3 - t2,
                          "optimizer": time.perf_counter() - t3, "step": time.perf_counter() - t0}
        self.steps_done += 1
        return result

    def _reduce_step(self) -> TrainStepResult:
        """Global loss / normaliser / metrics from the last stage, summed over DP, on every rank
        (grad norm, lr and success are filled in after the optimizer step)."""
        g = self.groups
        st = self._step_state
        payload = None
        if g.is_last_stage:
            tot = sum_dp(g, torch.stack([st["loss_sum"], st["norm"]]))
            keys = sorted(st["metrics"])
            nd = sum_dp(g, torch.tensor([st["metrics"][k] for k in keys], dtype=torch.float64,
                                        device=self.device).reshape(-1, 2))
            payload = (tot.tolist(), {k: n / d if d else float("nan") for k, (n, d) in zip(keys, nd.tolist())})
        (loss_sum, norm), metrics = from_last_stage(g, payload)
        loss = loss_sum / norm if norm > 0 else loss_sum
        return TrainStepResult(loss=loss, grad_norm=float("nan"), lr=float("nan"), update_successful=False,
                               normaliser=norm, metrics=metrics, timings={})


class ReferencePolicy(_LogProbModel):
    """Frozen policy copy for reference (KL) log-probs: its own model instance, no DDP, no optimizer."""

    def __init__(self, hf_cfg, temperature: float = 1.0, sequence_parallel: bool = False, bf16: bool = False,
                 parallel_info=None, backend: str = "local", fp8: str | None = None):
        g = Groups.current()
        sp = bool(sequence_parallel and g.tp_size > 1)
        chunks, config = _build_chunks(hf_cfg, bf16, g, sp, backend, fp8)
        for c in chunks:
            c.requires_grad_(False)
            c.eval()
        super().__init__(hf_cfg, chunks, config, temperature, sp, parallel_info)
        from megatron_rl.models.provider import resolve_model_backend

        self.backend = resolve_model_backend(backend, fp8, sp)    # te: packed rows run as THD

    @classmethod
    def from_actor(cls, actor: PolicyActor) -> "ReferencePolicy":
        """A frozen copy of ``actor``'s current weights (same parallel layout)."""
        ref = cls(actor.hf_cfg, actor.temperature, actor.sequence_parallel, actor.optim_spec.bf16, actor.parallel_info,
                  backend=actor.backend, fp8=actor.fp8)
        ref.copy_from(actor)
        return ref

    def copy_from(self, actor: PolicyActor) -> None:
        """Overwrite the weights with ``actor``'s (e.g. to refresh the reference)."""
        for mine, theirs in zip(self.bare_models(), actor.bare_models()):
            sd = {k: v for k, v in theirs.state_dict().items() if not k.endswith("_extra_state")}
            missing, unexpected = mine.load_state_dict(sd, strict=False)
            bad = [k for k in missing if not k.endswith("_extra_state")]
            if bad or unexpected:
                raise RuntimeError(f"ReferencePolicy.copy_from: missing {bad}, unexpected {unexpected}")
