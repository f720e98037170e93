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
                            loss adds per-token terms only)

In the update, the bytes held when the last stage's output layer starts (a forward pre-hook: the layers'
activations of the micro-batches in flight) split its peak into activations and logits (the logits, their fp32
softmax and the loss's backward). On a rank that is not the last stage the step's result, a Python object the
last stage broadcasts, cannot come over the fake process group: the dry run's actor reports an empty one.
"""
from __future__ import annotations

import dataclasses
import math

import torch

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
    with phase(dev, phases, "update"):
        actor.train_step(batch, token_mean_loss, micro)
    phases["update"]["at_output_layer"] = max(held, default=phases["update"]["start"])
    return phases


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
