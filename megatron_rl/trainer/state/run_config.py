"""``run_dir/config.yaml``: the resolved configuration of every start, and what ``--resume`` compares.

Files (rank 0, each written atomically: temp file + ``os.replace``; nothing is ever overwritten):

* the first start in a run directory writes ``config.yaml``;
* a later start there (``--resume``, or a fresh start after one that left no checkpoint) whose
  resolved configuration or package (version, git commit) differs from the newest saved file writes
  ``config.<n>.yaml`` (n = 1, 2, ...); an identical restart (a preempted job resubmitted) writes nothing;
* ``--overwrite`` archives them with the rest of the run (``run_dir.RUN_ARTIFACTS``).

Each file is a loadable config (``megatron-rl train --config run_dir/config.yaml`` runs it again) plus
a ``_meta`` block that ``config.load_config`` ignores: package version, git commit of the package
checkout (``+dirty`` with uncommitted changes; absent outside a git checkout), start time (UTC), and
the model's architecture (the ``config.json`` fields that decide the weights' shapes).

Resume comparison (:func:`check_resume`, from ``preflight``: before any model is built, and by
``train --check``): the new resolved config against the newest saved file of the run being resumed.
A change of method, group size or model (:data:`REFUSED`) is refused in one line naming the keys and
``--allow-config-change``; any other change is allowed with one warning line listing each key
(old -> new). A run directory from before this file existed (no ``config.yaml``) resumes with a
warning. A saved file written before a key was renamed (``config.RENAMED``: ``rollout.partial`` is a
section now) is compared under the new names, so such a run resumes as any other (this start writes
its config in the new names). ``--resume auto`` with no complete checkpoint says that it starts fresh.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import yaml

from megatron_rl import __version__
from megatron_rl.config import RENAMED

FILE = "config.yaml"
_NUMBERED = re.compile(r"^config\.(\d+)\.yaml$")
#: keys whose change a resume refuses (``model.architecture.*``: the HF config.json shape fields)
REFUSED = ("algo.kind", "rollout.n", "model.hf_path", "model.architecture.")
#: HF ``config.json`` fields recorded as ``_meta.architecture`` (what the checkpoint's tensors depend on)
ARCH_KEYS = ("architectures", "model_type", "hidden_size", "num_hidden_layers", "num_attention_heads",
             "num_key_value_heads", "head_dim", "intermediate_size", "vocab_size", "tie_word_embeddings")
ALLOW_FLAG = "--allow-config-change"


def saved_configs(run_dir: str | os.PathLike) -> list[Path]:
    """The run's saved configs, oldest first (``config.yaml``, ``config.1.yaml``, ...)."""
    d = Path(run_dir)
    numbered = sorted((int(m.group(1)), p) for p in d.glob("config.*.yaml") if (m := _NUMBERED.match(p.name)))
    return ([d / FILE] if (d / FILE).is_file() else []) + [p for _, p in numbered]


def git_commit() -> str | None:
    """The git commit of the package checkout (``+dirty`` with uncommitted changes), None outside one."""
    pkg = Path(__file__).resolve().parents[2]
    try:
        head = subprocess.run(["git", "-C", str(pkg), "rev-parse", "HEAD"], capture_output=True, text=True,
                              timeout=5, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(pkg), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=5, check=True).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return head + ("+dirty" if dirty else "") if head else None


def architecture(hf_path: str) -> dict:
    """The shape-deciding fields of ``hf_path/config.json`` ({} when there is none)."""
    p = Path(hf_path) / "config.json" if hf_path else None
    if p is None or not p.is_file():
        return {}
    try:
        hf = json.loads(p.read_text())
    except (OSError, ValueError):
        return {}
    return {k: hf[k] for k in ARCH_KEYS if k in hf}


def _tree(cfg) -> dict:
    """What is saved and compared: the resolved config plus ``model.architecture``."""
    tree = json.loads(json.dumps(cfg.to_dict(), default=str))   # plain YAML/JSON values (tuples -> lists)
    tree["model"]["architecture"] = architecture(cfg.model.hf_path)
    return tree


def _flat(tree, prefix: str = "") -> dict:
    if isinstance(tree, dict) and (tree or not prefix):
        out = {}
        for k, v in tree.items():
            out.update(_flat(v, f"{prefix}{k}."))
        return out
    return {prefix[:-1]: tree}


def _read(path: Path) -> dict:
    try:
        tree = yaml.safe_load(path.read_text()) or {}
    except (OSError, yaml.YAMLError) as e:
        raise ValueError(f"{path}: the run's saved config is unreadable ({str(e).splitlines()[0]}); move it away "
                         "to resume without the comparison") from None
    if not isinstance(tree, dict):
        raise ValueError(f"{path}: the run's saved config is not a mapping; move it away to resume without "  # noqa: TRY004
                         "the comparison")
    meta = tree.pop("_meta", None) or {}
    if isinstance(meta, dict) and isinstance(meta.get("architecture"), dict):
        tree.setdefault("model", {})["architecture"] = meta["architecture"]
    return renamed_keys(tree)


def renamed_keys(tree: dict) -> dict:
    """A saved config written before a key was renamed (``config.RENAMED``), under the new names (in place):
    ``rollout: {partial: true, partial_policy: mask}`` reads as ``rollout: {partial: {enable: true, policy: mask}}``.
    An old key that is a section now goes first, so its section holds the other keys moved into it."""
    for old, new in sorted(RENAMED.items(), key=lambda kv: not kv[1].startswith(kv[0] + ".")):
        sec, _, key = old.partition(".")
        node = tree.get(sec)
        if not isinstance(node, dict) or key not in node or isinstance(node[key], dict):
            continue
        value = node.pop(key)
        *path, last = new.split(".")[1:]
        for part in path:
            node = node.setdefault(part, {})
        node.setdefault(last, value)
    return tree


def changes(old: dict, new: dict) -> dict[str, tuple]:
    """``{dotted key: (old, new)}`` for every leaf that differs (absent -> ``None``)."""
    a, b = _flat(old), _flat(new)
    return {k: (a.get(k), b.get(k)) for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)}


def _refused(key: str) -> bool:
    return any(key == r or (r.endswith(".") and key.startswith(r)) for r in REFUSED)


def resumed_run_dir(cfg, resume: str) -> Path:
    """The run directory whose config a resume continues: ``trainer.run_dir`` for ``auto``; for a
    checkpoint path ``<dir>/checkpoints/step_N``, that ``<dir>``."""
    p = Path(resume)
    if resume != "auto" and p.resolve().parent.name == "checkpoints":
        return p.resolve().parent.parent
    return Path(cfg.trainer.run_dir)


def _say(text: str, err: bool = False) -> None:
    if int(os.environ.get("RANK", "0")) == 0:
        print(f"[megatron-rl] {text}", file=sys.stderr if err else sys.stdout, flush=True)


def check_resume(cfg, resume: str | None, allow_change: bool = False) -> None:
    """Start-up rule of ``--resume`` (module docstring): refuse a changed method / group size / model,
    warn about any other change, say so when ``--resume auto`` finds nothing and starts fresh."""
    if resume is None:
        return
    if resume == "auto":
        from megatron_rl.trainer.state.checkpoint import find_latest  # lazy: defers numpy, torch to the call

        if find_latest(cfg.trainer.run_dir) is None:
            _say(f"--resume auto: no complete checkpoint in {Path(cfg.trainer.run_dir) / 'checkpoints'}; "
                 "starting a fresh run")
            return
    run_dir = resumed_run_dir(cfg, resume)
    saved = saved_configs(run_dir)
    if not saved:
        _say(f"warning: {run_dir} has no {FILE} (a run from before it was written): resuming without comparing "
             "the configuration", err=True)
        return
    old = _read(saved[-1])
    diff = changes(old, _tree(cfg))
    if not (old.get("model") or {}).get("architecture"):   # not recorded (no config.json then): nothing to compare
        diff = {k: v for k, v in diff.items() if not k.startswith("model.architecture")}
    if "parallel.vpp" in diff:   # not a choice --allow-config-change can make: the checkpoint cannot load
        was, now = diff["parallel.vpp"]
        raise ValueError(f"--resume: the run in {run_dir} was saved at parallel.vpp={was} (saved in {saved[-1]}), this "
                         f"run asks for parallel.vpp={now}: a checkpoint holds one set of model chunks per virtual "
                         f"stage and loads at the vpp it was written with only; set parallel.vpp={was}")
    hard = [k for k in diff if _refused(k)]
    if hard and not allow_change:
        shown = ", ".join(f"{k}: {_v(diff[k][0])} -> {_v(diff[k][1])}" for k in hard)
        raise ValueError(f"--resume: the run in {run_dir} was started with another method, group size or model "
                         f"({shown}; saved in {saved[-1]}): start a new trainer.run_dir, or pass {ALLOW_FLAG} to "
                         "resume anyway")
    if diff:
        shown = ", ".join(f"{k}: {_v(o)} -> {_v(n)}" for k, (o, n) in diff.items())
        _say(f"warning: resuming with a changed configuration ({shown}; saved in {saved[-1]})", err=True)


def _v(x) -> str:
    return "(unset)" if x is None else repr(x) if isinstance(x, str) else str(x)


def save_run_config(cfg, run_dir: str | os.PathLike | None = None) -> Path | None:
    """Rank 0 at every start: write ``config.yaml`` or the next ``config.<n>.yaml`` (module docstring);
    returns the file written, None when the newest saved one already holds this config and package."""
    d = Path(run_dir or cfg.trainer.run_dir)
    tree = _tree(cfg)
    meta = {"version": __version__, "git_commit": git_commit(), "architecture": tree["model"].pop("architecture")}
    saved = saved_configs(d)
    if saved:
        try:
            last = yaml.safe_load(saved[-1].read_text()) or {}
        except (OSError, yaml.YAMLError):
            last = {}
        old_meta = last.pop("_meta", None) or {} if isinstance(last, dict) else {}
        same_pkg = all(old_meta.get(k) == meta[k] for k in ("version", "git_commit", "architecture"))
        if last == tree and same_pkg:
            return None
    meta["started"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    n = max((int(m.group(1)) for p in saved if (m := _NUMBERED.match(p.name))), default=0) + 1
    out = d / (FILE if not saved else f"config.{n}.yaml")
    header = ("# The resolved configuration of a start of `megatron-rl train` (megatron_rl/trainer/state/run_config.py);\n"
              "# `megatron-rl train --config <this file>` runs it again (the loader ignores _meta).\n")
    text = header + yaml.safe_dump({**tree, "_meta": meta}, sort_keys=False, default_flow_style=False)
    d.mkdir(parents=True, exist_ok=True)
    tmp = d / f".tmp-{out.name}-{os.getpid()}"
    tmp.write_text(text)
    os.replace(tmp, out)
    return out
