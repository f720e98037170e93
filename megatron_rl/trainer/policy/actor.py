"""The trainable Megatron policy and its frozen reference copy.

``PolicyActor``     model chunks (provider, ``trainer/policy/chunks.py``) in megatron
                    ``DistributedDataParallel``, megatron optimizer + LR scheduler, ``train_step``, offload;
                    the log-prob / top-k passes (``forward_logprobs``, ``forward_support``) are
                    :class:`~megatron_rl.trainer.policy.logprob_model.LogProbModel`'s.
``ReferencePolicy`` a frozen second model instance (no DDP, no optimizer) for KL reference log-probs.
``AdapterOffReference`` the reference of a LoRA actor: the actor itself with its adapters off (no second model).

Training objective (``train_step``): ``loss_fn(logp, entropy, mb) -> (loss_sum, normaliser, metrics)``
is called once per micro-batch ``mb``; the step minimises

    L = sum_{mb, DP ranks} loss_sum  /  sum_{mb, DP ranks} normaliser      (normaliser None: no division)

i.e. the normaliser is taken over the GLOBAL batch (see ``trainer/pipeline/objective.py``), so ``L`` and its
gradient do not depend on micro-batch size, DP or PP.

Micro-batches: padded rows or a token budget, as in ``trainer/policy/logprob_model.py``; packed
results are unpacked into each sequence's own frame, and ``loss_fn`` sees the per-sequence view, so
callers and losses are the same in both layouts. Mechanism: megatron's
``calculate_per_token_loss=True`` keeps each micro-batch loss un-normalised, DDP sums (not averages)
grads over DP, and ``finalize_model_grads`` divides all grads by the all-reduced normaliser.
"""
from __future__ import annotations

import dataclasses
import math
import time
from functools import partial
from typing import Any, Callable

import torch

from megatron_rl.models.provider import resolve_model_backend
from megatron_rl.runtime.device import release_cached_memory
from megatron_rl.trainer.pipeline.batch import TrainBatch
from megatron_rl.trainer.pipeline.objective import SupportObjective
from megatron_rl.trainer.pipeline.packing import PackedMicroBatch, TokenBudget
from megatron_rl.trainer.policy.chunks import build_chunks, unwrap
from megatron_rl.trainer.policy.logprob_model import LogProbModel, LogProbResult
from megatron_rl.trainer.policy.offload import HostStash, check_offload_mode, drop_score_buffer, trainer_tensors
from megatron_rl.trainer.policy.optim import OptimSpec, build_optimizer, current_lr
from megatron_rl.trainer.policy.schedule import Groups, from_last_stage, run_schedule, sum_dp
from megatron_rl.trainer.policy.vocab_parallel import vocab_parallel_gather_logprobs

__all__ = ["AdapterOffReference", "LogProbResult", "LossFn", "NonFiniteLossError", "PolicyActor", "ReferencePolicy", "TrainStepResult",
           "unwrap"]

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
    return loss_fn.support_key if isinstance(loss_fn, SupportObjective) else None


class PolicyActor(LogProbModel):
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
        lora: a ``models.lora.LoraSpec``: adapters on the targeted linears, every other weight frozen (DDP, the
            optimizer and its checkpoints then hold the adapters only); ``lora_seed`` seeds their initialisation.
    """

    def __init__(self, hf_cfg, parallel_info, optim: OptimSpec, temperature: float = 1.0,
                 sequence_parallel: bool = False, backend: str = "local", fp8: str | None = None,
                 offload: str = "none", recompute: dict | None = None, lora=None, lora_seed: int = 0):
        from megatron.core.distributed import (  # lazy: defers megatron to the call
            DistributedDataParallel,
            DistributedDataParallelConfig,
        )

        self.offload_mode = check_offload_mode(offload)
        self._stash = HostStash()
        self._weights_parked = False

        g = Groups.current()
        sp = bool(sequence_parallel and g.tp_size > 1)
        chunks, config = build_chunks(hf_cfg, optim.bf16, g, sp, backend, fp8, lora=lora, lora_seed=lora_seed,
                                      **(recompute or {}))
        self.lora = lora
        ddp_cfg = DistributedDataParallelConfig(
            grad_reduce_in_fp32=True, overlap_grad_reduce=False,
            use_distributed_optimizer=optim.use_distributed_optimizer)
        # later chunks of an interleaved pipeline in one bucket each (Megatron-LM's disable_bucketing rule)
        chunks = [DistributedDataParallel(config, ddp_cfg, c, disable_bucketing=i > 0) for i, c in enumerate(chunks)]
        for c in chunks:
            c.broadcast_params()
        super().__init__(hf_cfg, chunks, config, temperature, sp, parallel_info)

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

    def export_adapter(self, out_dir: str, base_model: str = "") -> None:
        """Collective: the LoRA adapters as a PEFT adapter dir (``convert/peft_adapter.py``); the merged HF
        checkpoint is :meth:`export_hf` (its tensors are W + s·B·A)."""
        from megatron_rl.convert.peft_adapter import export_peft  # lazy: defers safetensors to the call

        if self.lora is None:
            raise ValueError("export_adapter: this policy has no LoRA adapters (lora.enable=false)")
        export_peft(self.bare_models(), self.lora, out_dir, base_model=base_model)

    # ----- colocated rollouts: free the GPU while the engines generate --------------------------
    def offload(self, mode: str | None = None) -> int:
        """Park what ``mode`` (default ``offload_mode``) names in host memory, releasing the device
        copies, and hand the allocator's cached blocks (the update's freed activations) back to the
        driver, with ``none`` too; returns the bytes moved. A second call before :meth:`onload` parks
        what is left of a wider mode (``optimizer`` first, then ``all``: the weights, once the push has
        read them — ``trainer/loop/colocate.py``). Training before :meth:`onload` is an error, and so are
        log-probs while the weights are parked."""
        mode = mode or self.offload_mode
        moved, keep = trainer_tensors(mode, self.optimizer, self.chunks)
        drop_score_buffer()            # megatron's persistent attention-score scratch (offload.py)
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
        """As :meth:`LogProbModel.bare_models`; refused while the weights are offloaded (export,
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
        from megatron.core.distributed.finalize_model_grads import finalize_model_grads  # lazy: defers megatron to the call
        norm = self._step_state["norm"].clone()
        if self.groups.cp_rank > 0:   # every CP rank holds the whole normaliser; finalize sums over dp x cp
            norm.zero_()
        finalize_model_grads(model, norm, pg_collection=pg_collection, force_all_reduce=force_all_reduce)

    def _train_loss(self, loss_fn: LossFn, temperature: float, mb, logits: torch.Tensor):
        sampling = self.train_in_sampling_space and temperature == self.temperature
        lp = self._logprobs(logits, mb, temperature, sampling)
        lp_t = lp["sampling_logp"] if sampling else lp["logp"]    # algo.ratio_space: the loss's log-probs
        key = _support_key(loss_fn)
        packed = isinstance(mb, PackedMicroBatch)
        logp, ent, view = (mb.unpack(lp_t), mb.unpack(lp["entropy"]), mb.seqs) if packed else (lp_t, lp["entropy"], mb)
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
        for k, v in (metrics or {}).items():   # summed on the device: no host sync per micro-batch (the step's
            num, den = v if isinstance(v, tuple) else (torch.as_tensor(v).detach().float().mean(), 1.0)   # one: _reduce_step)
            pair = torch.stack([torch.as_tensor(x, dtype=torch.float64, device=self.device).detach().reshape(()) for x in (num, den)])
            st["metrics"][k] = st["metrics"][k] + pair if k in st["metrics"] else pair
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
            nd = sum_dp(g, torch.stack([st["metrics"][k] for k in keys]) if keys
                        else torch.zeros((0, 2), dtype=torch.float64, device=self.device))
            payload = (tot.tolist(), {k: n / d if d else float("nan") for k, (n, d) in zip(keys, nd.tolist())})
        (loss_sum, norm), metrics = from_last_stage(g, payload)
        loss = loss_sum / norm if norm > 0 else loss_sum
        return TrainStepResult(loss=loss, grad_norm=float("nan"), lr=float("nan"), update_successful=False,
                               normaliser=norm, metrics=metrics, timings={})


class ReferencePolicy(LogProbModel):
    """Frozen policy copy for reference (KL) log-probs: its own model instance, no DDP, no optimizer."""

    def __init__(self, hf_cfg, temperature: float = 1.0, sequence_parallel: bool = False, bf16: bool = False,
                 parallel_info=None, backend: str = "local", fp8: str | None = None):
        g = Groups.current()
        sp = bool(sequence_parallel and g.tp_size > 1)
        chunks, config = build_chunks(hf_cfg, bf16, g, sp, backend, fp8)
        for c in chunks:
            c.requires_grad_(False)
            c.eval()
        super().__init__(hf_cfg, chunks, config, temperature, sp, parallel_info)

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


class AdapterOffReference:
    """The KL reference of a LoRA actor: the base model is the actor with its adapters off
    (``models.lora.adapters_disabled``), so its log-probs come from the actor's own chunks and no second
    model is held. π_ref(y|x) = π_W(y|x) exactly, where the actor computes π_{W + s·BA}."""

    def __init__(self, actor: PolicyActor):
        self.actor = actor

    @property
    def chunks(self) -> list:
        return []       # no weights of its own (what the memory accounting counts)

    def forward_logprobs(self, *args, **kwargs):
        """``actor.forward_logprobs`` with the adapters off (same arguments and result)."""
        from megatron_rl.models.lora import adapters_disabled  # lazy: defers megatron to the call

        with adapters_disabled(self.actor.chunks):
            return self.actor.forward_logprobs(*args, **kwargs)

    def set_sampling(self, *args, **kwargs) -> None:
        """The actor's sampling spec is the one used (set on the actor)."""
