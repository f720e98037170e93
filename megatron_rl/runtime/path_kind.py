"""What a directory a user passed *is*, and which command or subpath fits it (a leaf: stdlib only).

The commands take three kinds of directories, easily confused: an HF model dir (``config.json`` +
``*.safetensors``: ``train`` ``model.hf_path``, ``eval --model``, ``convert hf-to-mcore --hf``), a
Megatron checkpoint (``COMPLETE`` + ``dist/``: ``convert mcore-to-hf --ckpt``, ``train --resume``),
and a training run directory (``checkpoints/``, ``metrics.jsonl``, ``hf/``), which is neither but
holds both. Each ``expect_*`` raises one line that says what the path is instead and what to pass.
"""
from __future__ import annotations

import os
import re
from pathlib import Path

MISSING, FILE, HF, MCORE, RUN, OTHER = "missing", "file", "hf", "mcore", "run", "other"


def kind(path: str | os.PathLike) -> str:
    """One of ``missing | file | hf | mcore | run | other`` (an incomplete checkpoint is ``mcore``)."""
    p = Path(path)
    if not p.exists():
        return MISSING
    if not p.is_dir():
        return FILE
    if (p / "COMPLETE").is_file() or (p / "dist").is_dir():
        return MCORE
    if (p / "checkpoints").is_dir() or (p / "metrics.jsonl").is_file():
        return RUN
    if (p / "config.json").is_file():
        return HF
    return OTHER


def newest_checkpoint(run_dir: str | os.PathLike) -> Path | None:
    """The newest ``checkpoints/step_N`` of a run directory (None when it has none)."""
    steps = [(int(c.name[5:]), c) for c in (Path(run_dir) / "checkpoints").glob("step_*") if c.name[5:].isdigit()]
    return max(steps)[1] if steps else None


def _run_hint(p: Path) -> str:
    if (p / "hf" / "config.json").is_file():
        return f"its HF export is {p / 'hf'}"
    ck = newest_checkpoint(p)
    return ("it has no HF export (hf/) yet: export a checkpoint with `megatron-rl convert mcore-to-hf --ckpt "
            f"{ck or p / 'checkpoints' / 'step_N'} --out DIR` and pass DIR")


def expect_hf(path: str | os.PathLike, flag: str, sep: str = " ") -> None:
    """``FileNotFoundError`` / ``NotADirectoryError`` (one line naming ``flag``) unless ``path`` is an HF
    model dir (``config.json`` present). ``sep``: between flag and path (``=`` for a config key)."""
    p, k = Path(path), kind(path)
    if k == HF:
        return
    if k == MISSING:
        raise FileNotFoundError(f"{flag}{sep}{path}: no such directory (an HF model dir: config.json + *.safetensors)")
    if k == FILE:
        raise NotADirectoryError(f"{flag}{sep}{path} is a file; pass the HF model directory that holds config.json and "
                                 f"the *.safetensors (here: {p.parent})")
    if k == MCORE:
        raise FileNotFoundError(f"{flag}{sep}{path} is a Megatron checkpoint, not an HF model dir: export it with "
                                f"`megatron-rl convert mcore-to-hf --ckpt {path} --out DIR` and pass DIR")
    if k == RUN:
        raise FileNotFoundError(f"{flag}{sep}{path} is a training run directory, not an HF model dir: {_run_hint(p)}")
    raise FileNotFoundError(f"{flag}{sep}{path}: no config.json (not an HF model dir: config.json + *.safetensors)")


def expect_checkpoint(path: str | os.PathLike, flag: str, sep: str = " ") -> None:
    """``FileNotFoundError`` (one line naming ``flag``) unless ``path`` is a complete Megatron checkpoint."""
    p, k = Path(path), kind(path)
    if k == MCORE and (p / "COMPLETE").is_file():
        return
    if k == MISSING:
        raise FileNotFoundError(f"{flag}{sep}{path}: no such directory (a Megatron checkpoint: COMPLETE + dist/)")
    if k == FILE:
        raise NotADirectoryError(f"{flag}{sep}{path} is a file; pass a Megatron checkpoint directory (COMPLETE + dist/)")
    if k == MCORE:
        raise FileNotFoundError(f"{path} is not a complete Megatron checkpoint (no COMPLETE marker): a save cut short; "
                                "pass a complete one")
    if k == HF:
        raise FileNotFoundError(f"{flag}{sep}{path} is an HF model dir, not a Megatron checkpoint: it is in HF format "
                                f"already (`megatron-rl convert hf-to-mcore --hf {path} --out DIR` goes the other way)")
    if k == RUN:
        ck = newest_checkpoint(p)
        extra = f"; or use its HF export {p / 'hf'}" if (p / "hf" / "config.json").is_file() else ""
        raise FileNotFoundError(f"{flag}{sep}{path} is a training run directory: pass one of its checkpoints, e.g. "
                                f"{ck or p / 'checkpoints' / 'step_N'}{extra}")
    raise FileNotFoundError(f"{flag}{sep}{path} is not a Megatron checkpoint (no COMPLETE marker, no dist/)")


def demo_hint(path: str) -> str:
    """What to do about a missing file under ``runs/demo_<algo>/``: the tiny example configs read the
    model and data that ``megatron-rl demo --algo <algo>`` writes there (``make demo``: bicc_rcc)."""
    m = re.search(r"(?:^|/)runs/demo_(\w+)/", f"{path}/")
    if not m:
        return ""
    how = "--task tools" if m.group(1) == "tools" else f"--algo {m.group(1)}"     # the tool-use demo: demo_tools.py
    return (f"; `megatron-rl demo {how}` creates it" + (" (so does `make demo`)" if m.group(1) == "bicc_rcc"
            else "") + ", or point model.hf_path and data.* at your own model and prompts")


def check_model_path(path: str) -> None:
    """``model.hf_path`` names an HF model directory with ``config.json`` (or that file itself)."""
    p = Path(path)
    if kind(p) in (MCORE, RUN):   # a checkpoint or a run dir where an HF dir is meant: say which to pass
        expect_hf(p, "model.hf_path", sep="=")
    if p.is_file() and p.suffix != ".json":
        raise ValueError(f"model.hf_path={path} is a file; set it to the HF model directory that holds config.json "
                         f"and the *.safetensors (here: {p.parent})")
    if not p.is_file() and not (p / "config.json").is_file():
        raise FileNotFoundError(f"model.hf_path={path}: no config.json in {path}"
                                + (demo_hint(path) or " (set it to an HF model dir: config.json + *.safetensors)"))
