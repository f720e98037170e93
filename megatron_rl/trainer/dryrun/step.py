"""One RL step of the dry run on one rank, through the trainer's own passes, each measured as a phase.

The batch (:func:`step_shape`): per DP rank, as many micro-batches as the pipeline needs to fill (PP; one without
it), each at the recipe's micro-batch: packed (``trainer.max_tokens_per_micro_batch`` B) — rows of the longest
length the length limits allow (``data.max_prompt_len + rollout.max_tokens``, a multiple of the packing's
8 x TP) that fills the budget best (``rows x L <= B``, the most token slots; a longer row leaves more of the
budget empty, as the packer does) — or padded (``trainer.micro_batch_size`` rows of the longest sequence).
Token ids are random; each sequence is a prompt of ``data.max_prompt_len`` (at most half) and a response.

Phases, in the loop's order (``trainer/pipeline/update.py``), each its peak over what was held at its start:

    optimizer (first step)  the distributed optimizer's step, which makes Adam's state (steady state after it)
    old log-probs           ``forward_logprobs`` (forward only), and again with μ when the sampling truncates
    reference log-probs     the reference's pass, when the method has one
    teacher swap / pass     the teacher's shadow weights swapped in (``TeacherWeights.swapped``: the live weights
                            saved aside), alone and around a log-prob pass
    update                  ``PolicyActor.train_step``: forward and backward of every micro-batch, the
                            optimizer's step; the loss is a token mean of the log-probs (the method's own
                            loss adds per-token terms only); its FLOPs counted with torch's flop registry (:class:`MatmulFlops`)
    weight push             the trainer's side of a push (:func:`push_stream`): gathered HF tensors and the
                            two device buckets

In the update, the bytes held when the last stage's output layer starts (a forward pre-hook: the layers'
activations of the micro-batches in flight) split its peak into activations and logits (the logits, their fp32
softmax and the loss's backward). On a rank that is not the last stage the step's result, a Python object the
last stage broadcasts, cannot come over the fake process group: the dry run's actor reports an empty one.
"""
from __future__ import annotations

import dataclasses
import math

import torch
import torch.distributed as dist
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import flop_registry

from megatron_rl.convert.live import hf_tensor_meta, stream_hf_tensors
from megatron_rl.rollout.weight_sync import BucketPacker, RoundSource, param_meta
from megatron_rl.runtime.device import default_device
from megatron_rl.trainer.dryrun.measure import phase
from megatron_rl.trainer.pipeline.batch import TrainBatch
from megatron_rl.trainer.pipeline.packing import micro_of
from megatron_rl.trainer.policy.actor import TrainStepResult
from megatron_rl.trainer.policy.chunks import unwrap


@dataclasses.dataclass(frozen=True)
class StepShape:
    """The dry run's batch: ``sequences`` of ``row_len`` tokens; per DP rank ``micro_batches`` of ``rows`` rows."""

    rows: int
    row_len: int
    micro_batches: int
    sequences: int
    packed: bool

    @property
    def slots(self) -> int:
        """Token slots of one micro-batch (rows x row length)."""
        return self.rows * self.row_len

    def text(self) -> str:
        kind = "packed" if self.packed else "padded"
        return (f"{self.micro_batches} x {self.rows} rows of {self.row_len} tokens ({self.slots} slots, {kind}) "
                f"per DP rank")


def step_shape(cfg, layout) -> StepShape:
    """The batch of the dry run's step (module docstring)."""
    longest = cfg.data.max_prompt_len + cfg.rollout.max_tokens
    m = layout.pp if layout.pp > 1 else 1
    budget = cfg.trainer.max_tokens_per_micro_batch
    if not budget:
        rows = cfg.trainer.rows_per_micro_batch
        return StepShape(rows, longest, m, layout.dp * m * rows, packed=False)
    mult = micro_of(cfg, layout.tp).multiple
    best = (0, 0)
    for rows in range(1, budget // mult + 1):
        length = min(longest, budget // rows) // mult * mult
        if length >= 2 and rows * length > best[0] * best[1]:
            best = (rows, length)
        if length * rows == budget or length < mult:
            break
    rows, length = best
    return StepShape(rows, length, m, layout.dp * m * rows, packed=True)


def synthetic_batch(shape: StepShape, vocab: int, prompt_len: int, seed: int = 0) -> TrainBatch:
    """``shape.sequences`` sequences of ``shape.row_len`` tokens: a prompt (at most half) and a response."""
    g = torch.Generator().manual_seed(seed)
    n, length = shape.sequences, shape.row_len
    tokens = torch.randint(0, vocab, (n, length), generator=g)
    mask = torch.zeros(n, length - 1)
    mask[:, min(prompt_len, length // 2) - 1:] = 1.0
    return TrainBatch(tokens, mask)


def token_mean_loss(logp, entropy, mb):
    """The update's loss: minus the token mean of the response log-probs."""
    m = mb.loss_mask
    return -(logp * m).sum(), m.sum(), {}


def run_step(cfg, models, dev, shape: StepShape) -> dict:
    """The phases of one RL step (module docstring) on this rank; returns ``{phase: {...}}`` and the update's
    split (``"update_split"``: bytes held at the output layer)."""
    actor, phases = models.actor, {}
    micro = micro_of(cfg, models.info.tp) if shape.packed else shape.rows
    batch = synthetic_batch(shape, actor.vocab_size, cfg.data.max_prompt_len, cfg.trainer.seed)
    with phase(dev, phases, "optimizer (first step)"):
        actor.optimizer.step()
    with phase(dev, phases, "old log-probs"):
        actor.forward_logprobs(batch, micro)
    if actor.sampling is not None:
        with phase(dev, phases, "old log-probs + μ"):
            actor.forward_logprobs(batch, micro, sampling=True)
    if models.ref is not None:
        with phase(dev, phases, "reference log-probs"):
            models.ref.forward_logprobs(batch, micro)
    if models.teacher is not None:
        with phase(dev, phases, "teacher swap"), models.teacher.swapped():
            pass                                       # the live weights' scratch copy alone
        with phase(dev, phases, "teacher pass"), models.teacher.swapped():
            actor.forward_logprobs(batch, micro)
    if not models.info.is_last_stage:
        actor._reduce_step = _empty_result           # the last stage's broadcast result (module docstring)
    held = _output_layer_probe(actor, dev)
    flops = MatmulFlops()
    with phase(dev, phases, "update"), flops:
        actor.train_step(batch, token_mean_loss, micro)
    phases["update"]["at_output_layer"] = max(held, default=phases["update"]["start"])
    phases["update"]["flops"] = flops.total
    with phase(dev, phases, "weight push"):
        push_stream(actor, cfg.rollout.bucket_mb << 20)
    return phases


class MatmulFlops(TorchDispatchMode):
    """The FLOPs of the ops torch's flop counter knows (``torch.utils.flop_counter.flop_registry``: matmuls,
    convolutions, SDPA), summed over what runs under it. Not ``FlopCounterMode`` itself: its module tracker's
    hooks keep the outputs of recomputed (checkpointed) layers alive, which the dry run saw as +65% activations
    under full recompute."""

    def __init__(self):
        super().__init__()
        self.total = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        count = flop_registry.get(func._overloadpacket)
        if count is not None:
            self.total += count(*args, **kwargs, out_val=out)
        return out


def push_stream(actor, bucket_bytes: int) -> None:
    """The weight push as the trainer runs it (``trainer/loop/sync_stage.push``): every rank streams its shards
    (``convert/live.stream_hf_tensors``: the owning stage all-gathers a tensor's TP shards, a later stage sends
    it to global rank 0), and rank 0 packs the HF tensors into two reused buckets of ``rollout.bucket_mb``
    (``rollout/weight_sync.BucketPacker``) — on the device here, as a GPU transport packs them; the engines'
    side is not simulated (the dry run starts none)."""
    models = actor.bare_models()
    stream = stream_hf_tensors(models, actor.hf_cfg, sender=0)
    if dist.get_rank() != 0:
        for _ in stream:
            pass
        return
    dtype = next(models[0].parameters()).dtype
    meta = [param_meta(n, d, s) for n, d, s in hf_tensor_meta(actor.hf_cfg, dtype)]
    device = default_device()
    packer = BucketPacker(RoundSource(meta, stream), bucket_bytes,
                          alloc=lambda n: torch.empty(n, dtype=torch.uint8, device=device))
    for _k, _lo, _hi, view in packer.buckets():
        del view
    packer.close()


def _empty_result() -> TrainStepResult:
    return TrainStepResult(loss=0.0, grad_norm=math.nan, lr=math.nan, update_successful=False, normaliser=0.0,
                           metrics={}, timings={})


def _output_layer_probe(actor, dev) -> list[int]:
    """Bytes held each time the last stage's output layer starts (filled while the hooks live, this step)."""
    held: list[int] = []
    for chunk in actor.chunks:
        layer = getattr(unwrap(chunk), "output_layer", None)
        if layer is not None and getattr(unwrap(chunk), "post_process", False):
            layer.register_forward_pre_hook(lambda *_: held.append(dev.bytes))
    return held
