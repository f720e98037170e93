"""``argparse`` parsers whose usage errors are one line (the project rule for every user error).

argparse's own ``error`` prints the whole usage block and then the message; with many options the
message ends up below a dozen lines of usage. Here it is one line naming the command, the problem and
where the options are listed: ``megatron-rl train: error: ... (see 'megatron-rl train --help')``.
Exit status stays argparse's 2.
"""
from __future__ import annotations

import argparse
import sys


class OneLineParser(argparse.ArgumentParser):
    """An ``ArgumentParser`` whose usage errors print one line (subparsers inherit the class)."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (see '{self.prog} --help')\n")

    def exit(self, status: int = 0, message: str | None = None):
        if message:
            sys.stderr.write(message)
        raise SystemExit(status)


#: exit status of every ``megatron-rl`` command (docs/troubleshooting.md, "Exit codes"): 2 = usage or configuration error,
#: refused before the run starts (bad arguments, config, input files); 1 = runtime error after start-up.
#: Other non-zero codes are left free for distinct outcomes (e.g. a graceful stop).
EXIT_RUNTIME, EXIT_USAGE = 1, 2
_PHASE = {"started": False}


def begin_run() -> None:
    """The command's start-up checks passed and its work begins: from here an error is a runtime
    error (exit 1). Called once per command, where its start-up ends (``setup_run`` after the
    preflight, ``eval`` after its inputs are read, ``convert`` / ``demo`` after their arguments)."""
    _PHASE["started"] = True


def reset_phase() -> None:
    """Back to start-up (``cli.main`` calls it first, so in-process calls do not inherit a phase)."""
    _PHASE["started"] = False


def error_status() -> int:
    """Exit status of an error reported now: 1 once the run has started, 2 before."""
    return EXIT_RUNTIME if _PHASE["started"] else EXIT_USAGE
