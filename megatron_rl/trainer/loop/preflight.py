"""Everything checkable before the model and Ray start, each failure one line naming the key.

Two levels:

* :func:`check_config` — cross-component rules on the config alone (plus the model's ``config.json``
  when ``model.hf_path`` has one), asked of the registries: the method's data path (``trainer/paths``:
  hparams class, inputs it produces, its own rules), async rollouts with that path, registered reward
  names, lengths against ``rollout.max_model_len`` and the model's positions, top-k against the
  vocabulary, group size of group-relative methods, non-negative counters. ``config.py`` and
  ``config_sections.py`` (leaves: they import no trainer) check only types, ranges and enums; every entry point that starts a run loads
  through :func:`load_checked` (``train``, ``demo``, ``plan --config``), and :func:`preflight` runs it
  again first for a ``Config`` built in code.
* :func:`preflight` — what a run on *this* machine needs: the model, tokenizer and data files exist,
  the resume checkpoint exists, the run directory may be used (``trainer/state/run_dir.py``), the layer
  backend resolves here (``te`` / ``fp8`` need CUDA + Transformer Engine), the installed vLLM / TE /
  megatron-core are the supported versions (``stack.py``), the batch divides over
  ``WORLD_SIZE``, ``rollout.placement`` fits the GPUs here with its sync backend, and the LLM judge (PAPO's grader, ``papo_math``'s
  verifier) fits its served context and answers one real request of each prompt (``preflight_judge.check_grader``);
  first of all, the torchrun variables and the Ray address answer (``launch_env``, bounded in time).
  ``setup_run`` calls it first thing (before ``init_parallel``); ``megatron-rl train --check`` too.
"""
from __future__ import annotations

import json
import logging
import os
from pathlib import Path

from megatron_rl.config import load_config, validate
from megatron_rl.data.tokenizer import load_tokenizer
from megatron_rl.eval.training import benchmark_prompts, selected
from megatron_rl.rewards.sources import check_rows, warn_unmatched
from megatron_rl.runtime import determinism
from megatron_rl.runtime.diskspace import check_writable
from megatron_rl.runtime.launch_env import check_ray_address, check_torch_env
from megatron_rl.runtime.path_kind import HF, RUN, demo_hint, expect_checkpoint, kind
from megatron_rl.runtime.stack import check_stack as check
from megatron_rl.trainer.loop.preflight_judge import check_grader
from megatron_rl.trainer.loop.async_source import check_async
from megatron_rl.trainer.loop.preflight_resume import check_resume_state, check_resume_step
from megatron_rl.trainer.state.ckpt_manifest import find_damage
from megatron_rl.trainer.state.run_config import check_resume
from megatron_rl.trainer.state.run_dir import check_run_dir

log = logging.getLogger("megatron_rl.preflight")


def load_checked(path, overrides=()):
    """``config.load_config`` + :func:`check_config`: the config an entry point may start a run with."""
    cfg = load_config(path, list(overrides))
    check_config(cfg)
    return cfg


def check_ratio_space(cfg) -> None:
    """``algo.ratio_space=sampling`` puts the PPO ratio under μ; a loss that also reads the policy's
    full-vocabulary distribution (a declared top-k support, a teacher's token log-probs) would mix the
    two spaces, so it is refused there in one line."""
    from megatron_rl.algorithms import algo_kind, loss_support  # lazy: defers torch to the call

    loss = algo_kind(cfg.algo.kind).loss
    if cfg.algo.ratio_space == "sampling" and (loss_support(loss) is not None or hasattr(cfg.algo.hparams, "teacher_mode")):
        raise ValueError(f"algo.ratio_space=sampling with algo.kind={cfg.algo.kind}: its loss also reads the full-vocabulary "
                         "distribution (teacher / top-k support), which is not under the sampling distribution; use "
                         "algo.ratio_space=full")


def check_bypass(cfg) -> None:
    """``algo.off_policy=bypass`` takes the engines' log-probs as π_old; with a truncating sampler and
    ``rollout.logprobs=processed`` those are log μ, so a ratio under the full softmax would start at the
    kept mass M, not 1: ``algo.ratio_space=sampling`` is required there (one line). Its other rules."""
    from megatron_rl.algorithms.sampling import SamplingSpec  # lazy: defers torch to the call

    r = cfg.rollout
    truncates = SamplingSpec(r.temperature, r.top_k, r.top_p, r.min_p).truncates()
    if truncates and r.logprobs == "processed" and cfg.algo.ratio_space == "full":
        raise ValueError(f"algo.off_policy=bypass with algo.ratio_space=full under a truncating sampler (top_p={r.top_p}, "
                         f"top_k={r.top_k}, min_p={r.min_p}): π_old is then the engines' log μ and the ratio would start at "
                         "the kept mass, not 1; set algo.ratio_space=sampling")
    if cfg.rollout.mismatch_limit and cfg.rollout.max_staleness > 0:
        raise ValueError(f"rollout.mismatch_limit={cfg.rollout.mismatch_limit} with algo.off_policy=bypass and "
                         f"rollout.max_staleness={cfg.rollout.max_staleness}: bypass measures the mismatch in the first "
                         "optimizer step, not split by staleness as the guard reads it; unset one of them")
    if getattr(cfg.algo.hparams, "old_logprob_context", "plain") == "conditioned":
        raise ValueError(f"algo.off_policy=bypass with algo.{cfg.algo.kind}.old_logprob_context=conditioned: bypass "
                         "takes the engine's log-probs (plain context) as old, conditioned recomputes them; pick one")


def check_partial(cfg, path_cls) -> None:
    """``rollout.partial``: the loop's partial source (``trainer/loop/partial_source.py``) replaces the
    data path's ``collect`` by one group per prompt from the pool, so only the plain sampling path runs
    with it (no dynamic sampling, no greedy baseline, not SCoRe's two attempts nor the other families,
    whose ``collect`` builds more than one round of prompts); refused in one line otherwise."""
    if not cfg.rollout.partial:
        return
    why = path_cls.partial_refusal(cfg.algo.hparams)   # the path's own answer (DataPath.partial_refusal)
    if why:
        raise ValueError(f"rollout.partial=true with algo.kind={cfg.algo.kind!r} (data path "
                         f"{getattr(path_cls, 'name', path_cls.__name__)!r}): {why}; the partial source drives the plain "
                         "sampling path only (no dynamic sampling, no greedy baseline); set rollout.partial=false")


def check_config(cfg) -> None:
    """Config-only rules (see module docstring); ``ValueError`` naming the key."""
    from megatron_rl.algorithms import algo_kind, single_sample_kinds  # lazy: defers torch to the call
    from megatron_rl.rewards.manager import get_reward  # lazy: defers torch to the call
    from megatron_rl.trainer.paths import path_class  # lazy: defers torch to the call

    if cfg.trainer.deterministic and (why := determinism.refusal(cfg.parallel.cp, cfg.model.backend, cfg.rollout.partial)):
        raise ValueError(why)
    if cfg.parallel.cp > 1:
        check_backend(cfg)             # context parallelism needs CUDA + TE: said before any layout arithmetic
    if cfg.model.hf_path:
        from megatron_rl.models.provider import check_model_layout  # lazy: defers torch to the call

        check_model_layout(cfg)        # TP / PP / VPP and recompute against the model's config.json
    path = path_class(cfg.algo.kind)   # an unknown path, wrong hparams class, missing inputs, the path's own rules
    path.validate(cfg)
    check_async(cfg.algo.kind, path, cfg.rollout.max_staleness, cfg.algo.off_policy)
    check_partial(cfg, path)
    check_ratio_space(cfg)
    if cfg.algo.off_policy == "bypass":
        check_bypass(cfg)

    for key, name in [*([("reward.default", cfg.reward.default)] if cfg.reward.default else []),
                      *((f"reward.by_source.{s}", n) for s, n in cfg.reward.by_source.items())]:
        try:
            get_reward(name)
        except (KeyError, TypeError) as e:
            raise ValueError(f"{key}: {e.args[0] if e.args else e}") from None
    r, d, t = cfg.rollout, cfg.data, cfg.trainer
    if d.max_prompt_len + r.max_tokens > r.max_model_len:
        raise ValueError(f"data.max_prompt_len={d.max_prompt_len} + rollout.max_tokens={r.max_tokens} exceeds "
                         f"rollout.max_model_len={r.max_model_len}: raise max_model_len or lower one of the two")
    if d.max_prompt_len + t.eval_max_tokens > r.max_model_len:
        raise ValueError(f"data.max_prompt_len={d.max_prompt_len} + trainer.eval_max_tokens={t.eval_max_tokens} exceeds "
                         f"rollout.max_model_len={r.max_model_len}: raise max_model_len or lower one of the two")
    if r.max_tokens < 1 or d.max_prompt_len < 1:
        raise ValueError("rollout.max_tokens and data.max_prompt_len must be >= 1")
    if r.n == 1 and algo_kind(cfg.algo.kind).needs_group:   # the kind's registration says (needs_group)
        raise ValueError(f"rollout.n=1 with algo.kind={cfg.algo.kind}: its advantage compares the samples of a "
                         "prompt's group, so with one sample every advantage is 0 and nothing is learned; set "
                         f"rollout.n >= 2 (n=1 suits {', '.join(single_sample_kinds())})")
    for key in ("eval_every", "ckpt_every", "keep_last"):
        if getattr(t, key) < 0:
            raise ValueError(f"trainer.{key} must be >= 0, got {getattr(t, key)}")
    if cfg.reward.grader_breaker_failures < 1 or not cfg.reward.grader_breaker_cooldown > 0:
        raise ValueError("reward.grader_breaker_failures must be >= 1 and reward.grader_breaker_cooldown > 0")
    rw = cfg.reward
    if rw.outcome_verifier and not rw.grader_url and "papo_math" in {rw.default, *rw.by_source.values()}:
        raise ValueError("reward papo_math asks PAPO's LLM outcome verifier at reward.grader_url when its rule check says "
                         "wrong: set reward.grader_url (an OpenAI-compatible endpoint), or reward.outcome_verifier=false "
                         "for the rule check alone")
    for key in ("eval_prompts",):
        if getattr(t, key) < 1:
            raise ValueError(f"trainer.{key} must be >= 1, got {getattr(t, key)}")
    check_offload_placement(cfg)
    if cfg.model.hf_path and (Path(cfg.model.hf_path) / "config.json").is_file():
        _check_against_model(cfg)


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


def warn_inert_knobs(cfg) -> list[str]:
    """Keys set away from their defaults that this run never reads, one warning line each (returned): the
    ``rollout.partial_*`` knobs without ``rollout.partial=true``; ``trainer.eval_every`` without a held-out set
    (``data.val`` or ``trainer.eval_benchmarks``)."""
    import dataclasses  # lazy: only here

    from megatron_rl.config import RolloutConfig  # lazy: the section's defaults

    r, base = cfg.rollout, RolloutConfig.__dataclass_fields__
    keys = [] if r.partial else [f.name for f in dataclasses.fields(r) if f.name.startswith("partial_")
                                 and getattr(r, f.name) != base[f.name].default]
    lines = [f"rollout.{k}={getattr(r, k)} does nothing without rollout.partial=true (in-flight partial rollouts); "
             "set rollout.partial=true, or drop the key" for k in keys]
    t = cfg.trainer
    if t.eval_every and not cfg.data.val and not t.eval_benchmarks:
        lines.append(f"trainer.eval_every={t.eval_every} does nothing without a held-out set: set data.val (or "
                     "trainer.eval_benchmarks), or trainer.eval_every=0")
    for line in lines:
        log.warning("%s", line)
    return lines


def check_offload_placement(cfg) -> None:
    """``trainer.offload`` acts only while colocated engines generate: with ``separate`` placement the
    trainer never gives its GPUs away, so a set value would silently do nothing."""
    if cfg.trainer.offload != "none" and cfg.rollout.placement != "colocated":
        raise ValueError(f"trainer.offload={cfg.trainer.offload} does nothing with rollout.placement="
                         f"{cfg.rollout.placement}: the trainer parks its state only while colocated engines use its "
                         "GPUs; set rollout.placement=colocated, or trainer.offload=none")


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


def _check_against_model(cfg) -> None:
    from megatron_rl.models.provider import model_arch_info  # lazy: defers torch to the call

    a = model_arch_info(cfg.model.hf_path)
    positions = json.loads((Path(cfg.model.hf_path) / "config.json").read_text()).get("max_position_embeddings")
    if positions is not None and cfg.rollout.max_model_len > positions:   # only when the file states it
        raise ValueError(f"rollout.max_model_len={cfg.rollout.max_model_len} exceeds the model's "
                         f"max_position_embeddings={positions} ({cfg.model.hf_path}/config.json)")
    etp = cfg.rollout.tensor_parallel_size
    if a.num_heads % etp:
        raise ValueError(f"rollout.tensor_parallel_size={etp} does not divide the model's num_attention_heads={a.num_heads} "
                         f"({cfg.model.hf_path}/config.json); vLLM shards the heads over the engine's GPUs")
    top_k = getattr(cfg.algo.hparams, "top_k", None)
    if top_k is not None and top_k > a.vocab_size:
        raise ValueError(f"algo.{cfg.algo.kind}.top_k={top_k} exceeds the model's vocab_size={a.vocab_size}")
    for key, k in (("rollout.top_k", cfg.rollout.top_k), ("trainer.eval_top_k", cfg.trainer.eval_top_k)):
        if k > a.vocab_size:   # -1 = off; above the vocabulary it would keep every token, silently
            raise ValueError(f"{key}={k} exceeds the model's vocab_size={a.vocab_size} (it would keep every token): "
                             f"lower it, or -1 for no top-k")


def _need_file(key: str, value: str, what: str, is_dir: bool = False) -> None:
    if not value:
        raise ValueError(f"{key} is required ({what})")
    p = Path(value)
    if not (p.is_dir() if is_dir else p.exists()):
        raise FileNotFoundError(f"{key}={value}: no such {'directory' if is_dir else 'file'} ({what}){demo_hint(value)}")


def check_files(cfg, resume: str | None = None) -> None:
    """Model, tokenizer, data and resume paths exist."""
    m = cfg.model
    _need_file("model.hf_path", m.hf_path, "HF model dir with config.json + safetensors", is_dir=True)
    if not (Path(m.hf_path) / "config.json").is_file():
        raise FileNotFoundError(f"model.hf_path={m.hf_path}: no config.json (not an HF model dir)")
    if m.tokenizer_path:
        _need_file("model.tokenizer_path", m.tokenizer_path, "tokenizer dir", is_dir=True)
    _need_file("data.train", cfg.data.train, "training prompts, parquet")
    if cfg.data.val:
        _need_file("data.val", cfg.data.val, "held-out prompts, parquet")
    if cfg.trainer.eval_benchmarks:
        selected(cfg)   # known names, every prepared file there, not beside data.val
    if resume not in (None, "auto") and Path(resume).is_dir() and not (Path(resume) / "COMPLETE").is_file():
        if kind(resume) in (RUN, HF):   # a run dir or an HF dir where a checkpoint is meant: say which fits
            expect_checkpoint(resume, "--resume")
    if resume not in (None, "auto") and not Path(resume).is_dir():
        raise FileNotFoundError(f"--resume {resume}: no such checkpoint directory; pass a checkpoint of "
                                f"{cfg.trainer.run_dir}/checkpoints/, or --resume auto for the newest one")
    if resume not in (None, "auto"):
        marker = Path(resume) / "COMPLETE"
        if not marker.is_file():
            raise FileNotFoundError(f"--resume {resume}: not a complete checkpoint (no COMPLETE marker); "
                                    "use --resume auto for the newest one of trainer.run_dir")

        try:
            meta = json.loads(marker.read_text())
        except ValueError:
            meta = {}
        problem = find_damage(resume, meta.get("files") if isinstance(meta, dict) else None)
        if problem:
            raise ValueError(f"--resume {resume}: the checkpoint is damaged: {problem}")


def _parquet_rows(key: str, path: str) -> int:
    """Rows of a parquet file (or directory of them), from the metadata only."""
    import pyarrow.dataset as pds  # lazy: defers pyarrow to the call

    try:
        return pds.dataset(path, format="parquet").count_rows()
    except (OSError, ValueError) as e:   # pyarrow's ArrowInvalid is a ValueError
        raise ValueError(f"{key}={path}: not a readable parquet file ({str(e).splitlines()[0]})") from None


def check_data(cfg) -> None:
    """The prompt files have rows, and ``data.train`` at least one step's worth (``data.prompts_per_step``)."""
    d = cfg.data
    rows = {key: _parquet_rows(key, path) for key, path in (("data.train", d.train), ("data.val", d.val)) if path}
    for key, n in rows.items():
        if n == 0:
            path = d.train if key == "data.train" else d.val
            raise ValueError(f"{key}={path}: the parquet file has no rows; point {key} at a prompt file "
                             "(verl columns: prompt, data_source, reward_model)")
    n = rows["data.train"]
    if n < d.prompts_per_step:
        raise ValueError(f"data.train={d.train} has {n} row(s), fewer than data.prompts_per_step={d.prompts_per_step} "
                         f"(one step's prompts): set data.prompts_per_step <= {n} or use a larger prompt file")
    r = cfg.rollout
    if r.partial and d.prompts_per_step + r.partial_extra_groups > n:   # more would hold one prompt twice at once
        raise ValueError(f"rollout.partial_extra_groups={r.partial_extra_groups} + data.prompts_per_step="
                         f"{d.prompts_per_step} groups in flight exceed the {n} rows of data.train={d.train} (one epoch; "
                         f"more would sample a prompt again while it is in flight): set rollout.partial_extra_groups <= "
                         f"{n - d.prompts_per_step}")


def check_reward_sources(cfg) -> None:
    """Every row of ``data.train``, ``data.val`` and the ``trainer.eval_benchmarks`` files has a reward
    (``rewards/sources.check_rows``: the config's map, the row's own, the built-in table, or the
    ``reward.default`` you wrote, logged once per source), no file is multimodal and none is an older
    prepared file whose rows would now read as verl's -- each a one-line refusal before anything starts."""
    r = cfg.reward
    files = [(key, path) for key, path in (("data.train", cfg.data.train), ("data.val", cfg.data.val)) if path]
    benchmarks, _ = selected(cfg)
    files += [(f"trainer.eval_benchmarks {b.name}", str(b.path(cfg.trainer.eval_data_dir))) for b in benchmarks]
    seen: set[str] = set()
    for key, path in files:
        seen |= set(check_rows(f"{key}={path}" if key.startswith("data.") else f"{key} ({path})", path, r.by_source,
                               r.default or None))
    warn_unmatched("reward.by_source", r.by_source, seen, " or ".join(path for _, path in files))


def check_row_fields(cfg) -> None:
    """Every ``data.train`` row carries the ``extra_info`` fields the method's data path reads
    (``DataPath.row_fields``: e.g. the reference solution of a chat teacher prompt), counted."""
    from megatron_rl.trainer.paths import path_class  # lazy: defers torch to the call

    need = path_class(cfg.algo.kind).row_fields(cfg)
    if not need:
        return
    import pyarrow.parquet as pq  # lazy: defers pyarrow to the call

    f = pq.ParquetFile(cfg.data.train)
    rows = f.read(columns=["extra_info"]).column("extra_info").to_pylist() if "extra_info" in f.schema_arrow.names \
        else [None] * f.metadata.num_rows
    for keys, why in need:
        missing = sum(1 for e in rows if not (isinstance(e, dict) and any(e.get(k) for k in keys)))
        if missing:
            alt = "".join(f" (or extra_info.{k})" for k in keys[1:])
            raise ValueError(f"data.train={cfg.data.train}: {missing} of {len(rows)} rows have no extra_info.{keys[0]}"
                             f"{alt}, {why}: add it to every row, or use a method or template that does not need it")


_PROMPTS: dict = {}   # (file, its size and mtime, tokenizer, length, on_error) -> PromptDataset, built once


def _prompt_key(cfg, path: str) -> tuple:
    st = Path(path).stat()
    d = cfg.data
    return (str(Path(path).resolve()), st.st_size, st.st_mtime_ns, cfg.model.tokenizer_path or cfg.model.hf_path,
            json.dumps(d.chat_template_kwargs, sort_keys=True, default=str), d.max_prompt_len, d.on_error)


def _tokenizer(cfg):
    key, where = ("model.tokenizer_path", cfg.model.tokenizer_path) if cfg.model.tokenizer_path else \
        ("model.hf_path", cfg.model.hf_path)
    try:
        return load_tokenizer(where, cfg.data.chat_template_kwargs)
    except FileNotFoundError:
        raise FileNotFoundError(f"{key}={where}: no tokenizer there (sp.model, or tokenizer.json / tokenizer_config.json)"
                                + ("; set model.tokenizer_path to the directory that holds it" if key == "model.hf_path"
                                   else "")) from None


def prompt_datasets(cfg, tok=None):
    """``(train, val)`` :class:`~megatron_rl.data.dataset.PromptDataset` of ``cfg`` (val None when unset),
    each file read, templated and tokenised once per process: :func:`check_prompts` builds them among the
    start-up checks and ``setup_run`` takes the same objects."""
    from megatron_rl.data.dataset import PromptDataset  # lazy: defers torch to the call

    out = []
    for key, path in (("data.train", cfg.data.train), ("data.val", cfg.data.val)):
        if not path:
            out.append(None)
            continue
        k = _prompt_key(cfg, path)
        if k not in _PROMPTS:
            if tok is None:
                tok = _tokenizer(cfg)
            try:
                _PROMPTS[k] = PromptDataset.from_parquet(path, tok, cfg.data.max_prompt_len, cfg.data.on_error)
            except ValueError as e:
                raise ValueError(f"{key}={e}" if str(e).startswith(str(path)) else f"{key}={path}: {e}") from None
        out.append(_PROMPTS[k])
    if out[1] is None and cfg.trainer.eval_benchmarks:   # the named benchmarks as the held-out set
        k = ("benchmarks", cfg.trainer.eval_benchmarks, str(Path(cfg.trainer.eval_data_dir).resolve()),
             cfg.trainer.eval_prompts, *_prompt_key(cfg, cfg.trainer.eval_data_dir)[3:])
        if k not in _PROMPTS:
            _PROMPTS[k] = benchmark_prompts(cfg, tok if tok is not None else _tokenizer(cfg))
        out[1] = _PROMPTS[k]
    return tuple(out)


def check_prompts(cfg) -> None:
    """Every row of ``data.train`` / ``data.val`` passes the dataset's own checks with the run's tokenizer
    (the verl columns, ``prompt`` a list of chat messages, a ground truth, the prompt within
    ``data.max_prompt_len``; ``data.on_error=skip`` drops such rows, counted), and the usable rows
    still fill a step -- before anything is written (a bad row once failed after ``config.yaml``)."""
    train, _ = prompt_datasets(cfg)
    if len(train) < cfg.data.prompts_per_step:   # rows skipped (data.on_error=skip) below one step's worth
        raise ValueError(f"data.train={cfg.data.train}: {len(train)} usable row(s) ({train.skipped} skipped), fewer than "
                         f"data.prompts_per_step={cfg.data.prompts_per_step}: lower it or fix the skipped rows")


def check_model_weights(cfg) -> None:
    """The safetensors headers of ``model.hf_path`` (no tensor is read) hold every tensor the model's
    ``config.json`` implies, each with its shape, named as the HF files name them (a wrong-shape tensor
    once failed after ``config.yaml`` was written, naming the Megatron parameter)."""
    hf = Path(cfg.model.hf_path)
    if not any(hf.glob("*.safetensors")):
        return   # no weights to compare (a stand-in config); the load names what is missing
    from megatron_rl.convert.live import check_hf_names  # lazy: defers torch to the call
    from megatron_rl.convert.safetensors_index import SafetensorsIndex  # lazy: defers torch to the call
    from megatron_rl.convert.stream import check_shapes  # lazy: defers torch to the call
    from megatron_rl.models.provider import model_arch_info  # lazy: defers torch to the call

    try:
        index = SafetensorsIndex(hf)
        arch = model_arch_info(cfg.model.hf_path)
        check_hf_names(index.names(), arch)
        check_shapes(index, arch)
    except (KeyError, ValueError) as e:
        raise ValueError(f"model.hf_path={hf}: {e.args[0] if isinstance(e, KeyError) else e}") from None


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


def check_backend(cfg) -> str:
    """The layer backend this machine will build (``models.provider.resolve_model_backend``)."""
    from megatron_rl.models.provider import check_cp_backend, resolve_model_backend  # lazy: defers torch to the call

    backend = resolve_model_backend(cfg.model.backend, cfg.model.fp8, cfg.parallel.sequence_parallel and cfg.parallel.tp > 1)
    check_cp_backend(cfg.parallel.cp, backend)
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


def check_world(cfg) -> None:
    """Batch / layout divisibility for ``WORLD_SIZE`` (torchrun's; 1 otherwise)."""
    validate(cfg, world_size=int(os.environ.get("WORLD_SIZE", "1")))


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


def check_launch(cfg) -> None:
    """The launch environment (``launch_env``), bounded in time: torchrun's variables form a process
    group (rank > 0 waits at most min(``parallel.timeout_s``, 120 s) for the rendezvous), and on rank 0
    the Ray head of ``rollout.ray_address`` / ``RAY_ADDRESS`` answers within 10 s."""
    check_torch_env(wait_s=min(cfg.parallel.timeout_s, 120.0))
    if os.environ.get("RANK", "0") == "0":   # the Ray driver
        check_ray_address(cfg.rollout.ray_address)


def check_rollout_placement(cfg) -> str:
    """``rollout.placement`` and ``rollout.sync_backend`` against the GPUs here (``rollout/placement.py``):
    torchrun's processes on this node and in all, the engines' GPUs; returns the sync backend."""
    from megatron_rl.rollout.placement import check_placement  # lazy: defers torch to the call
    from megatron_rl.runtime.device import gpu_count, has_cuda  # lazy: defers torch to the call

    return check_placement(cfg, has_cuda(), gpu_count(), int(os.environ.get("LOCAL_WORLD_SIZE", "1")),
                           int(os.environ.get("WORLD_SIZE", "1")),
                           cluster=bool(cfg.rollout.ray_address or os.environ.get("RAY_ADDRESS")))


def preflight(cfg, resume: str | None = None, overwrite: bool = False, allow_config_change: bool = False) -> str:
    """All start-up checks of a run on this machine; returns the resolved layer backend."""
    check_config(cfg)   # already run by load_checked; again here for a Config built in code
    warn_inert_knobs(cfg)
    check_launch(cfg)
    check_files(cfg, resume)
    check_model_weights(cfg)
    check_data(cfg)
    check_reward_sources(cfg)
    check_row_fields(cfg)
    check_prompts(cfg)
    check_run_dir_writable(cfg)
    check_run_dir(cfg.trainer.run_dir, resume, overwrite)
    check_resume_step(cfg, resume)   # before check_resume's warning lines: a refusal is the only line
    check_resume_state(cfg, resume)
    check_resume(cfg, resume, allow_config_change)   # the saved run_dir/config.yaml against this one
    check_export_dir(cfg, overwrite)
    check_world(cfg)
    sync = check_rollout_placement(cfg)   # the resolved sync backend; below: deterministic + nccl on an old NCCL
    if why := determinism.nccl_refusal(cfg.trainer.deterministic, sync, determinism.nccl_version()):
        raise ValueError(why)
    check_kv_cache_memory(cfg)
    if os.environ.get("RANK", "0") == "0":   # the Ray driver, which alone talks to the engines (one child, not one a rank)
        check_engine_sampling(cfg)
    check_reward_workers(cfg)
    backend = check_backend(cfg)
    check_stack(cfg, backend)
    check_grader(cfg)
    return backend
