"""Start-up checks of a run's inputs, each failure one line naming the key: the model, tokenizer, data and
resume paths exist (a resume checkpoint complete and undamaged), the model's safetensors hold the tensors
its ``config.json`` implies, the prompt files have rows (a step's worth, and the partial rollouts' groups
in flight), every row has a reward and the fields the method's data path reads, and every prompt passes
the dataset's checks with the run's tokenizer. The prompt datasets built here are kept per process
(:func:`prompt_datasets`): ``setup_run`` takes the same objects.
"""
from __future__ import annotations

import json
from pathlib import Path

from megatron_rl.data.tokenizer import load_tokenizer
from megatron_rl.eval.training import benchmark_prompts, selected
from megatron_rl.rewards.sources import check_rows, warn_unmatched
from megatron_rl.runtime.path_kind import HF, RUN, demo_hint, expect_checkpoint, kind
from megatron_rl.trainer.state.ckpt_manifest import find_damage


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


def _need_file(key: str, value: str, what: str, is_dir: bool = False) -> None:
    if not value:
        raise ValueError(f"{key} is required ({what})")
    p = Path(value)
    if not (p.is_dir() if is_dir else p.exists()):
        raise FileNotFoundError(f"{key}={value}: no such {'directory' if is_dir else 'file'} ({what}){demo_hint(value)}")


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
    p = cfg.rollout.partial
    if p.enable and d.prompts_per_step + p.extra_groups > n:   # more would hold one prompt twice at once
        raise ValueError(f"rollout.partial.extra_groups={p.extra_groups} + data.prompts_per_step="
                         f"{d.prompts_per_step} groups in flight exceed the {n} rows of data.train={d.train} (one epoch; "
                         f"more would sample a prompt again while it is in flight): set rollout.partial.extra_groups <= "
                         f"{n - d.prompts_per_step}")


def _parquet_rows(key: str, path: str) -> int:
    """Rows of a parquet file (or directory of them), from the metadata only."""
    import pyarrow.dataset as pds  # lazy: defers pyarrow to the call

    try:
        return pds.dataset(path, format="parquet").count_rows()
    except (OSError, ValueError) as e:   # pyarrow's ArrowInvalid is a ValueError
        raise ValueError(f"{key}={path}: not a readable parquet file ({str(e).splitlines()[0]})") from None


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


def check_agent_rows(cfg) -> None:
    """With ``multi_turn.enable``, verl's agentic columns of ``data.train`` and ``data.val`` name what this run has
    (``agent/rows.check_agent_rows``: a registered loop, tools of ``multi_turn.tools``, a registered interaction).
    One line naming the first offending row and the fix."""
    if not cfg.multi_turn.enable:
        return
    from megatron_rl.agent.rows import check_agent_rows as check  # lazy: the agent package on use

    for key, path in (("data.train", cfg.data.train), ("data.val", cfg.data.val)):
        if path:
            check(path, f"{key}={path}", cfg.multi_turn.tools)


_PROMPTS: dict = {}   # (file, its size and mtime, tokenizer, length, on_error) -> PromptDataset, built once


def _prompt_key(cfg, path: str) -> tuple:
    st = Path(path).stat()
    d = cfg.data
    return (str(Path(path).resolve()), st.st_size, st.st_mtime_ns, cfg.model.tokenizer_path or cfg.model.hf_path,
            json.dumps(_template_kwargs(cfg), sort_keys=True, default=str), d.max_prompt_len, d.on_error)


def _template_kwargs(cfg) -> dict:
    from megatron_rl.agent.run_config import template_kwargs  # lazy: defers the agent package

    return template_kwargs(cfg)


def _tokenizer(cfg):
    key, where = ("model.tokenizer_path", cfg.model.tokenizer_path) if cfg.model.tokenizer_path else \
        ("model.hf_path", cfg.model.hf_path)
    try:
        return load_tokenizer(where, _template_kwargs(cfg))
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
