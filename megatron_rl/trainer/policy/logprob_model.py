"""Forward-only passes of a Megatron policy: model chunks -> per-token log-probs / entropy / top-k supports.

``LogProbModel`` (the base of ``PolicyActor`` and ``ReferencePolicy``, ``trainer/policy/actor.py``) runs
the forward-only pipeline schedule over a batch and returns the last stage's per-token terms on every
rank. For response targets ``y_t = tokens[:, t+1]``

    logp[n, t] = log softmax(z[n, t] / T)[y_t],    H[n, t] = entropy of softmax(z[n, t] / T)

computed vocab-parallel on the last pipeline stage (``trainer/policy/vocab_parallel.py``). The temperature
``T`` must equal the rollout engine's sampling temperature so that old/rollout log-probs and
trainer log-probs describe the same distribution.

Micro-batches: every pass takes ``micro``, either an int (padded: that many right-padded rows per
micro-batch, the batch split evenly over DP) or a :class:`~megatron_rl.trainer.pipeline.packing.TokenBudget`
(packed: sequences balanced over DP by tokens and packed into rows, ``trainer/pipeline/packing.py``). Packed
results are unpacked into each sequence's own frame before they leave the model, so callers see the
same shapes in both layouts. The micro-batch helpers here (``_packed``, ``_local_batch``,
``_forward_step``, ``_logprobs``, ``_per_token``) are shared with ``PolicyActor.train_step``.
"""
from __future__ import annotations

import contextlib
import dataclasses
import math
from functools import partial
from typing import Any, Callable, Iterator, NamedTuple

import torch

from megatron_rl.algorithms.sampling import SamplingSpec
from megatron_rl.convert import export_hf, iter_hf_tensors, load_hf_into_model
from megatron_rl.runtime.device import default_device
from megatron_rl.trainer.pipeline.batch import TrainBatch
from megatron_rl.trainer.pipeline.packing import (RankMicroBatches, TokenBudget, seq_lengths, thd_layout,
                                                  unpacked_collection)
from megatron_rl.trainer.pipeline.packing import plan as pack_plan
from megatron_rl.trainer.policy import cp_batch
from megatron_rl.trainer.policy.chunks import unwrap
from megatron_rl.trainer.policy.schedule import Groups, gather_dp, run_schedule, tensor_from_last_stage
from megatron_rl.trainer.policy.vocab_parallel import (vocab_parallel_gather_logprobs, vocab_parallel_logprobs,
                                                       vocab_parallel_sampled_logprobs, vocab_parallel_topk)


class LogProbResult(NamedTuple):
    """``logp`` ``[N, S-1]`` fp32 on every rank; ``entropy`` likewise or None; ``sampling_logp`` log μ of
    the same targets under the engines' sampling distribution (:attr:`LogProbModel.sampling`) and
    ``sampling_kept`` (1 where the target is in μ's kept set) when asked, else None."""

    logp: torch.Tensor
    entropy: torch.Tensor | None
    sampling_logp: torch.Tensor | None = None
    sampling_kept: torch.Tensor | None = None



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


def to_host(out: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A forward-only pass's results on the host (the update's boundary: :class:`LogProbModel`); a host
    tensor stays as it is."""
    return {k: v.cpu() for k, v in out.items()}


class LogProbModel:
    """Shared forward machinery: model chunks -> per-token log-probs / entropy on every rank.

    The update's host/device boundary is here, once: the forward-only passes (:meth:`_forward_only`) hand
    their results to the host (one D2H copy per key, :func:`to_host`), because the update's stages
    (``trainer/pipeline/``: frames, advantages, weights, metrics) are host code; the train step moves each
    micro-batch to the device (``_forward_step``). On a GPU the old forward handed device tensors to host
    frames and the first gather failed (review B1; ``runtime/simulated_gpu.py`` reproduces it)."""

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
        #: the engines' sampling distribution μ (``algorithms/sampling.py``) when it truncates, else None:
        #: the log-prob pass then also scores each target under μ (``forward_logprobs(sampling=True)``)
        self.sampling: SamplingSpec | None = None
        #: ``algo.ratio_space=sampling``: the training forward hands the loss log μ instead of log q
        self.train_in_sampling_space = False

    def set_sampling(self, spec: SamplingSpec | None, train: bool = False) -> None:
        """Score under μ = ``spec`` (None or non-truncating: μ = q, nothing extra) and, with ``train``,
        take the PPO ratio under it (``algo.ratio_space``). ``spec.temperature`` must be this model's."""
        if spec is not None and not spec.truncates(self.vocab_size):
            spec = None
        if spec is not None and spec.temperature != self.temperature:
            raise ValueError(f"sampling temperature {spec.temperature} differs from the model's {self.temperature}")
        self.sampling = spec
        self.train_in_sampling_space = bool(train and spec is not None)

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

    def _logprobs(self, logits: torch.Tensor, mb: TrainBatch, temperature: float, sampling: bool = False) -> dict:
        """``{"logp", "entropy"}`` (full softmax at T) per target, and with ``sampling`` (and a truncating
        :attr:`sampling`) ``"sampling_logp"`` (log μ) and ``"sampling_kept"`` (float 0/1), vocab-parallel."""
        tp, nv, spec = self.groups.tp, self.vocab_size, self.sampling if sampling else None

        def terms(z, t):
            d = vocab_parallel_logprobs(z, t, tp, vocab_size=nv)._asdict()
            if spec is not None:
                s = vocab_parallel_sampled_logprobs(z, t, spec, tp, vocab_size=nv)
                d.update(sampling_logp=s.logp, sampling_kept=s.kept.float())
            return d

        return self._per_token(mb, logits, temperature, terms, mb.targets)

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
        from megatron.core.packed_seq_params import PackedSeqParams  # lazy: defers megatron to the call

        if self.groups.cp_size > 1:   # this CP rank's two chunks of every sequence; logits stay [1, n_local, V]
            tokens, pos, psp = cp_batch.model_inputs(cp_batch.rank_frame(mb, self.groups, self.sequence_parallel))
            return model(tokens, pos, None, packed_seq_params=psp)
        tokens, pos, cu, longest = thd_layout(mb)
        psp = PackedSeqParams(qkv_format="thd", cu_seqlens_q=cu, cu_seqlens_kv=cu, max_seqlen_q=longest,
                              max_seqlen_kv=longest)
        out = model(tokens, pos, None, packed_seq_params=psp)
        last = getattr(unwrap(model), "post_process", self.groups.is_last_stage)   # this chunk's (interleaved 1F1B:
        return out.reshape(mb.num_samples, mb.seq_len, *out.shape[2:]) if last else out   # a last rank's first isn't)

    def _collect_logprobs(self, temperature: float, with_entropy: bool, sampling: bool, mb: TrainBatch,
                          logits: torch.Tensor):
        with torch.no_grad():
            lp = self._logprobs(logits, mb, temperature, sampling)
        data = {k: v for k, v in lp.items() if k != "entropy" or with_entropy}
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
        return to_host(out)

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
        return to_host(out)

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
                         with_entropy: bool = False, sampling: bool = False) -> LogProbResult:
        """Log-probs (and entropy) of ``batch`` (the GLOBAL batch, same on all ranks) on every rank;
        with ``sampling`` also under the engines' sampling distribution μ (:meth:`set_sampling`; only at
        the model's temperature, and only when μ truncates: else the fields stay None, μ = q).

        Each DP rank computes its contiguous shard through the forward-only schedule; the last
        stage's results are broadcast over PP and all-gathered over DP. Shapes ``[N, S-1]``.
        ``N`` need not divide by ``dp_size * micro_batch_size``: the batch is padded with copies
        of its last row (results dropped).
        """
        t = self.temperature if temperature is None else float(temperature)
        specs = {"logp": ((), torch.float32)}
        if with_entropy:
            specs["entropy"] = ((), torch.float32)
        sampling = bool(sampling and self.sampling is not None and t == self.temperature)
        if sampling:
            specs.update(sampling_logp=((), torch.float32), sampling_kept=((), torch.float32))
        out = self._forward_only(batch, micro_batch_size, partial(self._collect_logprobs, t, with_entropy, sampling),
                                 specs)
        return LogProbResult(out["logp"], out.get("entropy"), out.get("sampling_logp"), out.get("sampling_kept"))

    def load_hf(self, hf_dir: str) -> None:
        """Load an HF checkpoint directory into the model (converter maps, TP/PP slicing)."""
        load_hf_into_model(self.bare_models(), hf_dir, self.parallel_info)

    def bare_models(self) -> list[torch.nn.Module]:
        """The unwrapped ``GPTModel`` chunks (for conversion / weight sync)."""
        return [unwrap(c) for c in self.chunks]

    def hf_weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        """Full HF-named tensors gathered over TP/PP (``convert.iter_hf_tensors``), for weight sync."""
        return iter_hf_tensors(self.bare_models(), self.hf_cfg)

    def export_hf(self, out_dir: str, tokenizer_dir: str | None = None) -> None:
        """Write an HF checkpoint (safetensors + config [+ the tokenizer files of ``tokenizer_dir``])
        of the current weights to ``out_dir`` (replacing only an earlier export of ours)."""
        export_hf(self.bare_models(), self.hf_cfg, out_dir, tokenizer_dir=tokenizer_dir)
