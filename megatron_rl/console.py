"""What a training run prints: the console gets warnings, errors, the progress bar and the summary;
everything at INFO (Megatron's bucket / parameter-count / config dumps, our own stage logs) goes to
``<run_dir>/train.log`` (rank 0) instead.

``quiet_console(rank)`` is called by ``megatron-rl train`` before anything is imported that logs;
``attach_run_log(run_dir)`` by ``setup_run`` once the run directory is settled (after ``--overwrite``
archived an earlier run, so the new log is never written into the archive). Python warnings are
routed through logging; those raised inside third-party packages (``site-packages``: megatron-core's
CPU fallbacks and deprecations, torch.distributed's renamed collectives, ...) go to the file only:
they are facts about the libraries, not about the run, and repeat every step. Warnings logged by
any logger, and Python warnings raised by megatron_rl itself, stay on the console.
"""
from __future__ import annotations

import logging
import sys
from pathlib import Path

LOG_FILE = "train.log"
_FMT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
#: warnings that are expected facts of a CPU machine, not news: file only
FILE_ONLY_WARNINGS = ("are not installed. Falling back", "Apex is not installed")


class _ConsoleFilter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        if record.name != "py.warnings":
            return True
        msg = record.getMessage()
        first = msg.split(":", 1)[0]
        return not (any(s in msg for s in FILE_ONLY_WARNINGS) or "site-packages" in first or "dist-packages" in first)


def quiet_console(rank: int = 0) -> None:
    """Root logger at INFO; the console handler shows WARNING+ on rank 0 and ERROR+ elsewhere."""
    root = logging.getLogger()
    root.setLevel(logging.INFO)
    for h in list(root.handlers):
        if getattr(h, "_megatron_rl_console", False):
            root.removeHandler(h)
    h = logging.StreamHandler(sys.stderr)
    h.setLevel(logging.WARNING if rank == 0 else logging.ERROR)
    h.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
    h.addFilter(_ConsoleFilter())
    h._megatron_rl_console = True
    root.addHandler(h)
    logging.captureWarnings(True)


def attach_run_log(run_dir: str | Path, rank: int = 0) -> Path | None:
    """Append INFO+ records to ``<run_dir>/train.log`` (rank 0 only); returns its path."""
    if rank != 0:
        return None
    root = logging.getLogger()
    path = Path(run_dir) / LOG_FILE
    for h in list(root.handlers):
        if getattr(h, "_megatron_rl_file", False):
            root.removeHandler(h)
            h.close()
    path.parent.mkdir(parents=True, exist_ok=True)
    h = logging.FileHandler(path)
    h.setLevel(logging.INFO)
    h.setFormatter(logging.Formatter(_FMT))
    h._megatron_rl_file = True
    root.addHandler(h)
    return path
