"""Write-to-temp-then-rename for output directories, and the rule for what may be replaced.

Never delete what this program did not create:

* ``--out`` that does not exist, or is an empty directory: written.
* ``--out`` that holds a checkpoint written by megatron-rl (a Megatron checkpoint whose ``COMPLETE``
  marker is ours, or an HF export carrying :data:`EXPORT_MARKER`) and nothing else: replaced only
  with ``force`` (``--force``); without it a ``FileExistsError`` says so.
* any other non-empty ``--out`` (user files, an HF download, a checkpoint plus foreign files):
  refused, with or without ``force``, naming what is there.

Outputs are written into a fresh temp dir beside the target (same file system, so the final
``rename`` is atomic). Replacing an old checkpoint renames it aside first, renames the new one into
place, then deletes the old one; an error before that deletes only the temp dir this call created.
"""
from __future__ import annotations

import json
import os
import re
from pathlib import Path

from megatron_rl.runtime import out_dir
from megatron_rl.runtime.out_dir import out_entries, refuse_foreign

MARKERS = ("config.json", "metadata.json", "model.safetensors", "model.safetensors.index.json", "COMPLETE")
#: written into every HF export of this package: what makes an HF dir "ours" (replaceable with --force)
EXPORT_MARKER = "megatron_rl_export.json"
_OURS_MCORE = {"dist", "hf", "COMPLETE", "teacher", "rng", "extra_state.pt"}
_OURS_HF = re.compile(r"^(config\.json|generation_config\.json|model(-\d+-of-\d+)?\.safetensors|"
                      r"model\.safetensors\.index\.json|tokenizer\.json|tokenizer_config\.json|"
                      r"special_tokens_map\.json|tokenizer\.model|vocab\.json|merges\.txt|chat_template\.jinja|"
                      r"sp\.model|" + re.escape(EXPORT_MARKER) + r")$")


def holds_checkpoint(path: Path) -> bool:
    """True when ``path`` already contains an HF or Megatron checkpoint (ours or not)."""
    return path.is_dir() and any((path / m).exists() for m in MARKERS)


def _ours_kind(path: Path) -> str | None:
    """``"mcore"`` / ``"hf"`` when ``path`` is a checkpoint written by megatron-rl, else None."""
    marker = path / "COMPLETE"
    if marker.is_file() and (path / "dist").is_dir():
        try:
            meta = json.loads(marker.read_text())
        except (OSError, ValueError):
            return None
        return "mcore" if isinstance(meta, dict) and "step" in meta else None
    return "hf" if (path / EXPORT_MARKER).is_file() else None


def check_out_dir(target: str | os.PathLike, force: bool) -> Path:
    """Raise ``FileExistsError`` unless ``target`` may be (over)written; see the module docstring."""
    target, entries = out_entries(target)
    if not entries:
        return target
    kind = _ours_kind(target)
    if kind is None:
        refuse_foreign(target, entries, "a checkpoint written by megatron-rl", "our own checkpoints")
    foreign = [e for e in entries if (e not in _OURS_MCORE if kind == "mcore" else not _OURS_HF.match(e))]
    if foreign:
        raise FileExistsError(f"--out {target} holds a megatron-rl checkpoint plus other files ({', '.join(foreign[:3])}); "
                              "refusing to delete them: move them away or choose another --out")
    if not force:
        raise FileExistsError(f"{target} already holds a checkpoint; pass --force to overwrite it")
    return target


def replace_dir(tmp: Path, target: Path, force: bool) -> None:
    """Move the finished ``tmp`` onto ``target`` under the checkpoint rule (:func:`check_out_dir`)."""
    out_dir.replace_dir(tmp, target, force, check_out_dir)


def atomic_dir(target: str | os.PathLike, force: bool = False, enabled: bool = True):
    """:func:`megatron_rl.runtime.out_dir.atomic_dir` under the checkpoint rule (:func:`check_out_dir`)."""
    return out_dir.atomic_dir(target, force, check_out_dir, enabled)
