"""What ``megatron-rl eval --out DIR`` may write into: ``convert``'s rule (``convert/atomic.py``).

* ``DIR`` does not exist, or is an empty directory: written.
* ``DIR`` holds only :data:`MARKER` (and the log): an eval that failed before it wrote any output
  (e.g. the engine did not start); written again without ``--force``.
* ``DIR`` is an earlier eval output of this package (it holds :data:`MARKER`) and nothing but the
  files eval writes (:data:`OURS`): replaced only with ``--force`` (its old outputs are removed
  first, so no stale ``completions.jsonl`` sits beside a new summary; a ``--completions`` file
  inside ``DIR`` is kept, it is the input); without ``--force`` a ``FileExistsError`` says so.
* anything else (user files, another program's output, our output plus foreign files): refused,
  with or without ``--force``, naming what is there. Nothing is deleted that eval did not write.
"""
from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

from megatron_rl import __version__
from megatron_rl.runtime.out_dir import out_entries, refuse_foreign

#: written into every eval output directory: what makes a directory "ours" (replaceable with --force)
MARKER = "megatron_rl_eval.json"
#: the files eval writes (``eval/__init__.py``)
OURS = frozenset({MARKER, "samples.jsonl", "summary.json", "completions.jsonl", "eval.log", "table.md", "completions"})
#: the directory ``eval --benchmarks --model`` writes its completions into (``eval/bench_model.py``)
COMPLETIONS_DIR = "completions"
#: this command's own log (``console.quiet_command``, created on its first record): never counts as content
LOG = "eval.log"


def check_eval_out(out: str | os.PathLike, force: bool) -> None:
    """Raise ``FileExistsError`` (one line) unless ``out`` may be written; see the module docstring."""
    _, entries = out_entries(out, ignore=(LOG,))
    if not entries:
        return
    if MARKER not in entries:
        refuse_foreign(Path(out), entries, "an eval output of megatron-rl", "our own eval outputs")
    foreign = [e for e in entries if e not in OURS]
    if foreign:
        raise FileExistsError(f"--out {out} holds an eval output of megatron-rl plus other files "
                              f"({', '.join(foreign[:3])}); refusing to touch them: move them away or choose another --out")
    if not force and set(entries) - {MARKER}:   # marker only: an eval that failed before writing anything
        raise FileExistsError(f"--out {out} already holds an eval output of megatron-rl; pass --force to replace it")


def prepare_eval_out(out: str | os.PathLike, force: bool, keep: str | os.PathLike | None = None) -> Path:
    """Check ``out`` (:func:`check_eval_out`), create it, remove our earlier outputs there (all but
    ``keep``, the ``--completions`` input) and write :data:`MARKER`; returns the directory."""
    check_eval_out(out, force)
    p = Path(out)
    p.mkdir(parents=True, exist_ok=True)
    keep_path = Path(keep).resolve() if keep else None
    for name in sorted(OURS - {MARKER, LOG}):
        f = p / name
        if f.is_file() and f.resolve() != keep_path:
            f.unlink()
        elif f.is_dir() and name == COMPLETIONS_DIR and not (keep_path and keep_path.is_relative_to(f.resolve())):
            shutil.rmtree(f)
    (p / MARKER).write_text(json.dumps({"written_by": f"megatron-rl {__version__} eval",
                                        "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}) + "\n")
    return p
