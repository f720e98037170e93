"""Start-up checks of what a run needs of *this* machine, each failure one line naming the key: the
launch environment (torchrun's variables, the Ray address), the batch over ``WORLD_SIZE``,
``rollout.placement`` against the GPUs here, host memory for vLLM-CPU's KV cache, reward workers per CPU,
the engine library's sampling limits, the layer backend (``te`` / ``fp8`` need CUDA + Transformer Engine;
local attention's memory on a GPU), the installed vLLM / TE / megatron-core versions (``stack.py``), and
the run directory and final export place being writable.
"""
from __future__ import annotations

import logging
import os
from pathlib import Path

from megatron_rl.config import validate
from megatron_rl.planning.arch import load_arch
from megatron_rl.planning.config import config_inputs
from megatron_rl.planning.memory import GIB, PlanInputs, estimate
from megatron_rl.planning.verdict import plan_components, refusal
from megatron_rl.runtime.diskspace import check_writable
from megatron_rl.runtime.launch_env import check_ray_address, check_torch_env
from megatron_rl.runtime.stack import check_stack as check

log = logging.getLogger("megatron_rl.preflight")


def check_launch(cfg) -> None:
    """The launch environment (``launch_env``), bounded in time: torchrun's variables form a process
    group (rank > 0 waits at most min(``parallel.timeout_s``, 120 s) for the rendezvous), and on rank 0
    the Ray head of ``rollout.ray_address`` / ``RAY_ADDRESS`` answers within 10 s."""
    check_torch_env(wait_s=min(cfg.parallel.timeout_s, 120.0))
    if os.environ.get("RANK", "0") == "0":   # the Ray driver
        check_ray_address(cfg.rollout.ray_address)


def check_world(cfg) -> None:
    """Batch / layout divisibility for ``WORLD_SIZE`` (torchrun's; 1 otherwise)."""
    validate(cfg, world_size=int(os.environ.get("WORLD_SIZE", "1")))


def check_rollout_placement(cfg) -> str:
    """``rollout.placement`` and ``rollout.sync_backend`` against the GPUs here (``rollout/placement.py``):
    torchrun's processes on this node and in all, the engines' GPUs; returns the sync backend."""
    from megatron_rl.rollout.placement import check_placement  # lazy: defers torch to the call
    from megatron_rl.runtime.device import gpu_count, has_cuda  # lazy: defers torch to the call

    return check_placement(cfg, has_cuda(), gpu_count(), int(os.environ.get("LOCAL_WORLD_SIZE", "1")),
                           int(os.environ.get("WORLD_SIZE", "1")),
                           cluster=bool(cfg.rollout.ray_address or os.environ.get("RAY_ADDRESS")))


#: reward workers per CPU the driver may use, at most: the verifiers are CPU-bound, more only queue (and each
#: is a process holding sympy and math-verify, ~150 MB)
WORKERS_PER_CPU = 4


def check_reward_workers(cfg) -> None:
    """``reward.workers`` against this machine: above :data:`WORKERS_PER_CPU` per CPU the driver may use
    (``rewards/pool.cpu_count``) it only adds processes and memory; refused in one line (0 = one per CPU)."""
    from megatron_rl.rewards.pool import cpu_count  # lazy: defers the pool to the call

    n, cpus = cfg.reward.workers, cpu_count()
    if n > WORKERS_PER_CPU * cpus:
        raise ValueError(f"reward.workers={n} is more than {WORKERS_PER_CPU} per CPU this process may use ({cpus}): the "
                         f"verifiers are CPU-bound, so the extra processes only wait; set reward.workers <= "
                         f"{WORKERS_PER_CPU * cpus}, or 0 for one per CPU")


def check_engine_sampling(cfg) -> None:
    """The rollout and held-out sampling values against the engine library's own limits (the engine's declared
    ``EngineCaps.sampling_check``: vLLM's ``SamplingParams`` validation, e.g. temperature in [0, 2] in 0.32),
    one line naming the key, before anything starts (a bad value failed after a 51-s start-up)."""
    from megatron_rl.rollout.registry import caps  # lazy: defers torch to the call
    from megatron_rl.rollout.rollouts import eval_sampling, sampling_params  # lazy: defers torch to the call

    asks = {"rollout": (sampling_params(cfg, 0), cfg.rollout.logprobs), "trainer": (eval_sampling(cfg, 0), "processed")}
    for (section, (sp, _)), refusal in zip(asks.items(), caps(cfg.rollout.engine).sampling_refusals(list(asks.values()))):
        if refusal:
            field, words = refusal
            key = f"rollout.{field}" if section == "rollout" else f"trainer.eval_{field}"
            value = getattr(sp, field, None) if field else None
            raise ValueError(f"{key}={value:g}: rollout.engine={cfg.rollout.engine} refuses it ({words}); set {key} "
                             "within the engine's range" if isinstance(value, (int, float)) else
                             f"{section} sampling: rollout.engine={cfg.rollout.engine} refuses it ({words})")


def host_memory_bytes() -> tuple[int, int]:
    """(total, available) bytes of this host's memory (``/proc/meminfo``; sysconf where it is missing)."""
    try:
        info = dict(ln.split(":", 1) for ln in Path("/proc/meminfo").read_text().splitlines() if ":" in ln)
        total = int(info["MemTotal"].split()[0]) * 1024
        return total, int(info.get("MemAvailable", info["MemTotal"]).split()[0]) * 1024
    except (OSError, KeyError, ValueError):
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        return total, total


def check_kv_cache_memory(cfg) -> None:
    """An engine taking ``rollout.kv_cache_gib`` (vLLM-CPU) keeps each engine's KV cache in host memory:
    more than this host has available fails 20 s into the run inside Ray / vLLM; refused here (no CUDA
    only: on a GPU the cache lives in GPU memory)."""
    from megatron_rl.rollout.registry import caps  # lazy: defers torch to the call
    from megatron_rl.runtime.device import has_cuda  # lazy: defers torch to the call

    r = cfg.rollout
    if "kv_cache_gib" not in caps(r.engine).options or has_cuda():
        return
    total, avail = host_memory_bytes()
    cluster = r.ray_address or os.environ.get("RAY_ADDRESS", "local").lower() not in ("", "local")
    here = 1 if cluster else r.num_engines   # a local Ray puts every engine on this host; a cluster, at least one
    need = here * r.kv_cache_gib * 2**30
    if need > avail:
        raise ValueError(f"rollout.kv_cache_gib={r.kv_cache_gib:g} x {here} engine(s) on this host = "
                         f"{need / 2**30:.1f} GiB of KV cache in host memory (vLLM-CPU), but this host has "
                         f"{avail / 2**30:.1f} GiB available of {total / 2**30:.1f} GiB: lower rollout.kv_cache_gib")


def check_backend(cfg) -> str:
    """The layer backend this machine will build (``models.provider.resolve_model_backend``)."""
    from megatron_rl.models.provider import check_cp_backend, resolve_model_backend  # lazy: defers torch to the call

    backend = resolve_model_backend(cfg.model.backend, cfg.model.fp8, cfg.parallel.sequence_parallel and cfg.parallel.tp > 1)
    check_cp_backend(cfg.parallel.cp, backend)
    if cfg.lora.enable and backend != "local":
        raise ValueError(f"lora.enable=true needs the local layer spec (model.backend=local; here it resolves to {backend}): "
                         "the adapters wrap megatron's Column/RowParallelLinear (models/lora.py), and Transformer Engine's "
                         "fused norm+linear hides the normalised input they read")
    if backend == "local" and cfg.model.hf_path:
        check_attention_memory(cfg, backend)
    return backend


def check_attention_memory(cfg, backend: str) -> None:
    """On a GPU, local attention (``model.backend`` local, or auto without Transformer Engine) whose S x S scores
    would exceed the device is refused in one line; auto's fallback that fits is logged as a warning naming the
    import error (``models/provider.py`` ``check_local_attention``)."""
    from megatron_rl.models.provider import check_local_attention, local_attention_bytes, te_import_error  # lazy: torch
    from megatron_rl.runtime.device import total_memory  # lazy: defers torch to the call

    device_bytes = total_memory()
    if not device_bytes:
        return
    seq = cfg.data.max_prompt_len + cfg.rollout.max_tokens
    budget = cfg.trainer.max_tokens_per_micro_batch
    row = (cfg.rollout.max_model_len or seq) if budget else seq
    need = local_attention_bytes(cfg.model.hf_path, tp=cfg.parallel.tp, pp=cfg.parallel.pp, bf16=cfg.model.bf16,
                                 tokens=budget or cfg.trainer.rows_per_micro_batch * seq, row_len=row)
    line = check_local_attention(cfg.model.backend, backend, need, device_bytes, te_import_error())
    if line:
        log.warning("%s", line)


def check_stack(cfg, backend: str) -> None:
    """The installed vLLM / Transformer Engine / megatron-core against the versions the code is written
    for (``megatron_rl/runtime/stack.py``): one line naming installed vs supported when they differ."""
    from megatron_rl.rollout.registry import caps  # lazy: defers torch to the call

    check(caps(cfg.rollout.engine).requires, backend)   # the distributions the engine class imports


def check_run_dir_writable(cfg) -> None:
    """``trainer.run_dir`` (or the parent it will be created in) can be written: a read-only place is
    one line now, not a raw ``OSError`` (or "no free space") once the run has started."""
    d = cfg.trainer.run_dir
    if not str(d).strip():
        raise ValueError("trainer.run_dir is empty: set it to the run's own directory (e.g. runs/my_run); an empty "
                         "value would write the run into the working directory")
    if Path(d).exists() and not Path(d).is_dir():
        raise NotADirectoryError(f"trainer.run_dir={d} is an existing file, not a directory; choose another "
                                 "trainer.run_dir")
    check_writable(d, "trainer.run_dir")


def check_export_dir(cfg, overwrite: bool = False) -> None:
    """The final HF export (``run_dir/hf``) will be allowed to replace what is there (``convert.atomic``):
    found now rather than after the whole run (e.g. a folder of user files named ``hf``)."""
    from megatron_rl.convert.atomic import check_out_dir  # lazy: defers torch to the call

    out = Path(cfg.trainer.run_dir) / "hf"
    if cfg.trainer.export_hf and out.exists() and not overwrite:
        try:
            check_out_dir(out, force=True)
        except FileExistsError as e:
            raise ValueError(f"trainer.export_hf: {e}; or set trainer.export_hf=false") from None


def check_device_memory(cfg, device_bytes: int | None = None) -> None:
    """On a GPU, a config whose planned peak per GPU (``megatron-rl plan --config``'s estimate, which the dry run
    keeps within 10% per component: docs/dry-run.md) exceeds the device is refused in one line before anything is
    allocated, naming the largest component and the config keys that shrink it (``planning/verdict.py``). CPU
    (``device_bytes`` 0) passes; a model folder without ``config.json`` is left to the weights check."""
    from megatron_rl.runtime.device import total_memory  # lazy: defers torch to the call

    device_bytes = total_memory() if device_bytes is None else device_bytes
    if not device_bytes or not (Path(cfg.model.hf_path or "") / "config.json").is_file():
        return
    p = cfg.parallel
    dp = max(1, int(os.environ.get("WORLD_SIZE", p.tp * p.pp * p.cp)) // (p.tp * p.pp * p.cp))
    # the engines take their gpu_memory_utilization share of this device whatever their sequences need (vLLM
    # sizes its KV cache to it): one sequence leaves the share as the engine's total
    rep = estimate(load_arch(cfg.model.hf_path), PlanInputs(**config_inputs(cfg), dp=dp, rollout_seqs=1,
                                                            gpu_total_gib=device_bytes / GIB))
    phase, parts = plan_components(rep)
    if line := refusal(parts, device_bytes, f"plan of {phase}"):
        raise ValueError(line + " (megatron-rl plan --config / train --dry-run show every part)")
