"""`megatron-rl plan`: per-GPU memory estimate for a model x TP x PP x DP x micro-batch (tokens) x seq-len.

Run it before sending a job. It imports neither torch nor megatron, so it works on a login node.
The model is a HF ``config.json`` (file or folder) or a built-in preset name (``--list-models``).

This module is the command: its options, the table it prints, the hint when a layout does not fit,
and the exit status (2 when it does not fit, with one line on stderr). The memory model and its
formulas are in ``megatron_rl/planning/memory.py``, the model shapes and presets in ``planning/arch.py``.
``--config run.yaml`` takes the layout, precision, micro-batching (token budget or padded rows),
sequence length, placement, offload and engine count from a run config (``planning/config.py``), which
this command loads and checks as ``train`` does.
"""
from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from megatron_rl.config import load_config
from megatron_rl.config_sections import ParallelConfig
from megatron_rl.planning.arch import PRESETS, ArchSpec, load_arch
from megatron_rl.planning.config import config_inputs, merge_config
from megatron_rl.planning.memory import (
    ATTENTION,
    DTYPE_BYTES,
    GIB,
    OFFLOAD_MODES,
    RATIO_SPACES,
    PlanInputs,
    PlanReport,
    engine_holds,
    estimate,
    fits,
    lora_params_per_layer,
    score_total,
)
from megatron_rl.runtime.usage import EXIT_USAGE
from megatron_rl.trainer.loop.preflight import load_checked


def format_report(rep: PlanReport) -> str:
    """Render the table printed by ``megatron-rl plan``."""
    i, a = rep.inputs, rep.arch
    micro = i.micro_batch_text() + (f", seq {i.seq_len}" if i.max_tokens_per_micro_batch else "")

    def g(b: float) -> str:
        return f"{b / GIB:9.2f}"

    lines = [
        f"model {a.name}: {a.total_params() / 1e9:.3f} B params, {a.layers} layers, hidden {a.hidden}, "
        f"heads {a.heads}/{a.kv_heads} (q/kv), ffn {a.ffn}, vocab {a.vocab} (padded {rep.params.padded_vocab})",
        f"layout TP={i.tp} PP={i.pp}{f' (x{i.vpp} virtual)' if i.vpp > 1 else ''}{f' CP={i.cp}' if i.cp > 1 else ''} DP={i.dp} "
        f"({i.tp * i.pp * i.cp * i.dp} GPUs), micro-batch {micro}, "
        f"{i.dtype}, dist-opt {'on' if i.dist_opt else 'off'}, SP {'on' if i.sequence_parallel else 'off'}, "
        f"recompute {_recompute_text(i)}, attention {i.attention}, "
        f"SwiGLU {'fused' if i.fused_swiglu else 'unfused'}",
        f"params per GPU: first stage {rep.params.first_stage / 1e6:.1f} M, last stage {rep.params.last_stage / 1e6:.1f} M",
        *([(f"LoRA rank {i.lora_rank} on {','.join(i.lora_targets)}: "
            f"{lora_params_per_layer(a, i) * (a.layers // i.pp) / 1e6:.2f} M adapter params per GPU, the base frozen "
            "(grads and optimizer: adapters only)")] if i.lora_rank else []),
        "",
        f"{'component (' + rep.stage + ' pipeline stage)':<44}{'GiB/GPU':>9}",
        f"{'-' * 53}",
        f"{'weights':<44}{g(rep.weights)}",
        f"{'gradients (fp32 main grads)':<44}{g(rep.grads)}",
        f"{'optimizer (Adam' + (' + fp32 master' if i.dtype != 'fp32' else '') + (', /DP' if i.dist_opt else '') + ')':<44}{g(rep.optimizer)}",
        f"{_copies_text(i):<44}{g(rep.extra_copies)}",
        f"{'activations (1F1B)':<44}{g(rep.activations)}",
        *([f"{'  of which S x S attention scores (local)':<44}{g(score_total(rep))}"] if i.attention == "local" else []),
        f"{'logits + fp32 softmax + output wgrad':<44}{g(rep.logits)}",
        *([f"{'sampling μ pass (' + _sampling_text(i) + ')':<44}{g(rep.sampling)}"
           f"   [working set {rep.sampling_working / GIB:.2f}{_mu_where(i)}]"] if rep.sampling_working else []),
        *([f"{'buffers (' + _buffers_text(i) + ')':<44}{g(rep.buffers)}"] if rep.buffers else []),
        f"{'overhead (CUDA context, NCCL, workspaces)':<44}{g(rep.overhead)}",
        f"{'= training total':<44}{g(rep.train_total)}",
        f"{'rollout engine weights (TP=' + str(i.rollout_tp) + ')':<44}{g(rep.rollout_weights)}",
        f"{'rollout KV cache (' + str(i.rollout_seqs) + ' seqs x ' + str(i.rollout_len or i.seq_len) + ' tok)':<44}{g(rep.rollout_kv)}",
        f"{'= rollout engine total' + (f' (gpu_memory_utilization {i.rollout_mem_util:g})' if i.rollout_mem_util else ''):<44}"
        f"{g(rep.rollout_total)}",
        f"{'-' * 53}",
    ]
    if i.colocated:
        slept = "slept engine" if i.engine_sleep else "resident engine weights + KV (--no-engine-sleep)"
        lines += [f"{'trainer resident (offload ' + i.offload + ')':<44}{g(rep.trainer_resident)}",
                  (f"{'update phase = training + ' + ('slept engine' if i.engine_sleep else 'engine'):<44}"
                   f"{g(rep.update_peak)}"),
                  f"{'generation phase = resident + rollout':<44}{g(rep.generation_peak)}",
                  f"{'PEAK per GPU':<44}{g(rep.peak)}   [colocated: max(update, generation); {slept}]"]
    else:
        gpus = f"{i.tp * i.pp * i.dp} training + {i.rollout_engines * i.rollout_tp} rollout GPUs"
        lines.append(f"{'PEAK per GPU':<44}{g(rep.peak)}   [separate, {gpus}: max(training, rollout)]")
    lines.append(f"{'fits' if fits(rep) else 'DOES NOT FIT'} in {i.gpu_mem_gib:g} GiB{_hint(rep)}")
    return "\n".join(lines)


def _sampling_text(i: PlanInputs) -> str:
    """The truncation μ applies and where it runs: ``top-k 20, top-p 0.95; log-prob passes``."""
    rules = [f"top-k {i.top_k}"] * (i.top_k > 0) + [f"top-p {i.top_p:g}"] * (i.top_p < 1) + [f"min-p {i.min_p:g}"] * (i.min_p > 0)
    return ", ".join(rules) + ("; + backward" if i.ratio_space == "sampling" else "")


def _buffers_text(i: PlanInputs) -> str:
    """What the buffers line holds (``planning/memory.py`` ``buffer_bytes``)."""
    parts = ["SP gather"] * i.sequence_parallel + ["score buffer"] * (i.attention == "local") + ["pipeline"] * (i.pp > 1)
    return ", ".join(parts)


def _mu_where(i: PlanInputs) -> str:
    """Where the μ pass's working set lands: on top of the update, or in the log-prob passes after the softmax."""
    return "; in the update" if i.ratio_space == "sampling" else "; log-prob passes, after the softmax frees 8 B/logit"


def _copies_text(i: PlanInputs) -> str:
    parts = (["reference"] if i.reference else []) + (["teacher fp32"] if i.teacher_shadow else []) + \
        ([f"+{i.extra_weight_copies}"] if i.extra_weight_copies else [])
    return f"weight copies ({', '.join(parts) or 'none'})"


def _recompute_text(i: PlanInputs) -> str:
    return f"full {i.recompute_method}/{i.recompute_num_layers}" if i.recompute == "full" else i.recompute


def _hint(rep: PlanReport) -> str:
    """What to change when the layout does not fit, for the side that sets the peak."""
    i = rep.inputs
    if fits(rep):
        return ""
    if not engine_holds(rep):
        return (f" - the engine's share (gpu_memory_utilization {i.rollout_mem_util:g}) holds less than its weights + KV "
                f"cache ({rep.rollout_need / GIB:.1f} GiB): raise rollout.gpu_memory_utilization, --rollout-tp or "
                "lower --rollout-seqs")
    rollout_side = (rep.generation_peak >= rep.update_peak if i.colocated else rep.rollout_total > rep.train_total)
    if not rollout_side:
        lower = "--max-tokens-per-micro-batch" if i.max_tokens_per_micro_batch else "micro-batch"
        return f" - raise TP/PP/DP, lower {lower}, enable --recompute full or --sequence-parallel"
    more = {"none": "trainer.offload (--offload) optimizer|all, ", "optimizer": "trainer.offload (--offload) all, ",
            "all": ""}
    return (" - the generation phase dominates: " + (more[i.offload] if i.colocated else "")
            + "lower --rollout-seqs / --rollout-len or raise --rollout-tp")


def add_arguments(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """The ``plan`` options (shared by ``megatron-rl plan`` and ``python -m megatron_rl.cli.plan``)."""
    d = PlanInputs()
    p.add_argument("--model", help="preset name or HF config.json (file or folder); see --list-models")
    p.add_argument("--list-models", action="store_true", help="print the preset names and exit")
    p.add_argument("--tp", type=int, default=d.tp, help="tensor-parallel size")
    p.add_argument("--pp", type=int, default=d.pp, help="pipeline-parallel size")
    p.add_argument("--vpp", type=int, default=d.vpp, help="virtual pipeline stages per rank (interleaved 1F1B)")
    p.add_argument("--cp", type=int, default=d.cp, help="context-parallel size (each sequence split over cp GPUs)")
    p.add_argument("--dp", type=int, default=d.dp, help="data-parallel size")
    p.add_argument("--micro-batch", type=int, default=d.micro_batch,
                   help="padded micro-batch: sequences of --seq-len tokens (default 1; trainer.micro_batch_size)")
    p.add_argument("--max-tokens-per-micro-batch", type=int, default=d.max_tokens_per_micro_batch,
                   help="packed micro-batch: token budget per DP rank (trainer.max_tokens_per_micro_batch); "
                   "activations for this many tokens instead of micro-batch x seq-len; 0 = padded")
    p.add_argument("--seq-len", type=int, default=d.seq_len, help="training sequence length (prompt + response)")
    p.add_argument("--max-model-len", type=int, default=d.max_model_len,
                   help="longest sequence a pass holds (rollout.max_model_len; default --seq-len): the budget's floor")
    p.add_argument("--dtype", choices=sorted(DTYPE_BYTES), default=d.dtype, help="parameter/activation precision")
    p.add_argument("--no-dist-opt", dest="dist_opt", action="store_false", help="optimizer state not sharded over DP")
    p.add_argument("--sequence-parallel", action="store_true", help="Megatron sequence parallelism (needs TP > 1)")
    att = p.add_mutually_exclusive_group()   # one choice: given together, the last one won silently
    att.add_argument("--attention", choices=ATTENTION, default=None,
                     help=f"the attention the layers run (default {d.attention}, or the config's model.backend): flash "
                     "(Transformer Engine, model.backend te) keeps no S x S scores; local (megatron's own, model.backend "
                     "local, or auto without TE) keeps 6 bytes per score element in bf16 (fp32 softmax + its bf16 cast)")
    att.add_argument("--no-flash-attn", dest="attention", action="store_const", const="local",
                     help="the same as --attention local")
    p.add_argument("--recompute", choices=("none", "selective", "full"), default=d.recompute, help="activation recompute")
    p.add_argument("--recompute-method", choices=("uniform", "block"), default=d.recompute_method,
                   help="full recompute: uniform units or the first N layers of a stage (model.recompute_method)")
    p.add_argument("--recompute-num-layers", type=int, default=d.recompute_num_layers,
                   help="full recompute: layers per unit / recomputed layers (model.recompute_num_layers)")
    p.add_argument("--unfused-swiglu", dest="fused_swiglu", action="store_false",
                   help="SwiGLU without bias_activation_fusion (CPU builds): 5f/t MLP activations instead of 3f/t")
    p.add_argument("--reference", action="store_true", help="a frozen reference policy on the GPU (model precision)")
    p.add_argument("--teacher-shadow", action="store_true", help="the teacher's snapshot / EMA weights (fp32 copy)")
    p.add_argument("--extra-weight-copies", type=int, default=d.extra_weight_copies,
                   help="further weight copies (model precision) kept on the GPU")
    _add_sampling_arguments(p, d)
    _add_lora_arguments(p, d)
    p.add_argument("--config", help="run config (YAML): layout, precision, micro-batching, seq-len, max-model-len, "
                   "placement, trainer.offload and engine count come from it (planning/config.py)")
    p.add_argument("--separate", dest="colocated", action="store_false", help="rollout engines on other GPUs")
    p.add_argument("--offload", choices=OFFLOAD_MODES, default=d.offload,
                   help="trainer.offload: what the trainer parks in host memory while colocated engines generate")
    p.add_argument("--rollout-engines", type=int, default=d.rollout_engines, help="rollout engines (rollout.num_engines)")
    p.add_argument("--no-engine-sleep", dest="engine_sleep", action="store_false",
                   help="colocated engines keep weights + KV cache during training")
    p.add_argument("--rollout-tp", type=int, default=d.rollout_tp, help="tensor-parallel size of each rollout engine")
    p.add_argument("--rollout-mem-util", type=float, default=d.rollout_mem_util,
                   help="the engine's gpu_memory_utilization share (vLLM fills it); default: its need")
    p.add_argument("--rollout-seqs", type=int, default=d.rollout_seqs, help="concurrent sequences in the KV cache")
    p.add_argument("--rollout-len", type=int, default=None, help="tokens per rollout sequence (default: --seq-len)")
    p.add_argument("--kv-dtype", choices=sorted(DTYPE_BYTES), default=d.kv_dtype, help="KV-cache precision")
    p.add_argument("--overhead-gib", type=float, default=d.overhead_gib, help="fixed per-GPU overhead")
    p.add_argument("--gpu-mem-gib", type=float, default=d.gpu_mem_gib, help="GPU memory to check the peak against (usable)")
    p.add_argument("--gpu-total-gib", type=float, default=d.gpu_total_gib,
                   help="the device's memory, of which gpu_memory_utilization is a fraction")
    return p


def _add_lora_arguments(p: argparse.ArgumentParser, d: PlanInputs) -> None:
    p.add_argument("--lora-rank", type=int, default=d.lora_rank,
                   help="lora.rank: LoRA adapters of this rank on a frozen base (0 = full fine-tuning): main grads and "
                   "optimizer state for the adapters only")
    p.add_argument("--lora-targets", type=lambda v: tuple(x for x in v.split(",") if x), default=d.lora_targets,
                   help="lora.target_modules, comma-separated HF projections (default: all seven)")


def _add_sampling_arguments(p: argparse.ArgumentParser, d: PlanInputs) -> None:
    """The engines' sampling (μ, which the trainer also scores under when it truncates) and the ratio space."""
    p.add_argument("--top-k", type=int, default=d.top_k, help="rollout.top_k of the engines' sampling (-1 = off)")
    p.add_argument("--top-p", type=float, default=d.top_p, help="rollout.top_p (1 = off)")
    p.add_argument("--min-p", type=float, default=d.min_p, help="rollout.min_p (0 = off)")
    p.add_argument("--ratio-space", choices=RATIO_SPACES, default=d.ratio_space,
                   help="algo.ratio_space: sampling also runs the μ pass's backward in the training step")


def run(args: argparse.Namespace) -> PlanReport | None:
    """Execute parsed ``plan`` arguments: print the table, return the report."""
    if args.list_models:
        for name in sorted(PRESETS):
            print(f"{name:<14}{ArchSpec.from_hf(PRESETS[name], name).total_params() / 1e9:7.3f} B")
        return None
    if not args.model and getattr(args, "config", None):   # the run config names its model: model.hf_path
        if not Path(args.config).is_file():
            raise FileNotFoundError(f"plan: --config {args.config}: no such file")
        try:
            args.model = load_config(args.config).model.hf_path or None
        except FileNotFoundError as e:   # the model is not downloaded here: a preset plans it all the same
            raise FileNotFoundError(f"{e}; or pass --model PRESET (megatron-rl plan --list-models)") from None
        if not args.model:
            raise ValueError(f"plan: --config {args.config} sets no model.hf_path; pass --model (a preset name or a "
                             "config.json path)")
    if not args.model:
        raise ValueError("plan: --model is required (a preset name or a config.json path)")
    rep = report_for(args)
    print(format_report(rep))
    return rep


def report_for(args: argparse.Namespace) -> PlanReport:
    """The estimate for parsed ``plan`` arguments (``--config`` merged in), without printing."""
    fields = set(PlanInputs.__dataclass_fields__)
    given = {k: v for k, v in vars(args).items() if k in fields and not (k == "attention" and v is None)}
    if getattr(args, "config", None):   # an explicit --attention is a choice even when it is the default
        explicit = {"attention"} & set(given)
        given = merge_config(plan_config(args.config), args.config, given, PlanInputs(), explicit=explicit)
    check_layout(given)
    return estimate(load_arch(args.model), PlanInputs(**given))


def plan_config(path: str | Path) -> dict[str, Any]:
    """The plan inputs the run config at ``path`` decides, the config checked as ``train`` checks it
    (``planning/config.py`` :func:`config_inputs`); the weights need not be here."""
    return config_inputs(load_checked(path, ["model.hf_path="]))


def check_layout(given: dict) -> None:
    """The layout through the rules ``train`` applies (``config_sections.ParallelConfig``), in its words: a
    layout ``train`` refuses is not planned (``--vpp 2 --pp 1`` was)."""
    keys = ("tp", "pp", "vpp", "cp", "sequence_parallel")
    try:
        ParallelConfig(**{k: given[k] for k in keys if k in given})
    except ValueError as e:
        raise ValueError(f"plan: {e} (--{' / --'.join(k.replace('_', '-') for k in keys[:4])})") from None


def exit_status(rep: PlanReport | None) -> int:
    """0 when the layout fits, else 2 (the layout is refused, like any configuration error) with one
    line on stderr (scripts can gate a job on it)."""
    if fits(rep):
        return 0

    print(f"megatron-rl plan: error: the layout does not fit: peak {rep.peak / GIB:.2f} GiB per GPU > "
          f"--gpu-mem-gib {rep.inputs.gpu_mem_gib:g}", file=sys.stderr)

    return EXIT_USAGE


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m megatron_rl.cli.plan ...`` (same options as ``megatron-rl plan``)."""
    args = add_arguments(argparse.ArgumentParser(prog="megatron-rl plan", description=__doc__.splitlines()[0])).parse_args(argv)
    return exit_status(run(args))


if __name__ == "__main__":
    raise SystemExit(main())
